"""Batch post-processing, latency mode's host thread and throughput (overlapped) mode with N host workers,
on the real detector and real images."""

import json
import threading
import time

import numpy as np
import pytest
import torch
from conftest import COCO_DIR, CORPUS, SUBSET_ANNOTATIONS, YOLOX_NANO, load_core_of, requires_corpus, run_benchmark
from torchvision.ops import batched_nms, clip_boxes_to_image

from harness.config import build_config
from harness.data.coco import CocoDataset
from harness.errors import UsageError
from harness.measure.device import parse_device
from harness.models.registry import get_detector
from harness.pipeline.pipeline import MAX_AUTO_WORKERS, DetectorPipeline, Thresholds, resolve_workers
from harness.pipeline.postprocess import BatchCandidates, nms_batch, to_original
from harness.pipeline.preprocess import decode_image, preprocess_batch
from harness.pipeline.stage_timer import StageTimer
from harness.results.site_rules import schema_findings, site_findings


@pytest.fixture(scope="module")
def _needs_assets():
    """Tests on real images skip without the offline assets (the config tests below run anyway)."""
    if not (SUBSET_ANNOTATIONS.is_file() and YOLOX_NANO.is_file()):
        pytest.skip("offline assets missing (../shared/assets): set VA_BENCH_COCO and VA_BENCH_YOLOX_NANO")


@pytest.fixture(scope="module")
def pipeline(_needs_assets):
    device = parse_device("cpu")
    detector = get_detector("yolox-nano")
    spec = detector.preprocess
    core = load_core_of(detector, "onnxruntime", device, "fp32", spec.input_size, threads=torch.get_num_threads())
    d = detector.defaults
    return DetectorPipeline(detector, core, device, spec, Thresholds(d.conf, d.iou, d.max_det))


@pytest.fixture(scope="module")
def records(_needs_assets):
    dataset = CocoDataset(str(COCO_DIR))
    return dataset.records(dataset.variant("sample"))[:40]


def test_batch_nms_equals_torchvision_batched_nms_per_image(pipeline, records):
    """The batch form (one coordinate shift for all images, one kernel call per image) keeps exactly
    what batched_nms keeps on each image alone, also on crowded images (> 1000 candidates, where
    batched_nms takes its per-class loop)."""
    t = pipeline.thresholds
    crowded = 0
    for start in range(0, len(records), 8):
        images = [decode_image(r.path) for r in records[start:start + 8]]
        batch, _ = preprocess_batch(images, pipeline.spec)
        per_image = pipeline.detector.decode(pipeline.core(batch), pipeline.spec.input_size, t.conf)
        kept = nms_batch(BatchCandidates.from_images(per_image, t.conf), t.iou, t.max_det, pipeline.host_executor)
        offset = 0
        for i, c in enumerate(per_image):
            mask = c.scores >= t.conf
            boxes, scores, labels = c.boxes[mask], c.scores[mask], c.labels[mask]
            crowded += boxes.shape[0] > 1000
            order = batched_nms(boxes, scores, labels, t.iou)[:t.max_det]
            n = kept.counts[i]
            assert n == order.numel()
            assert torch.equal(kept.boxes[offset:offset + n], boxes[order])
            assert torch.equal(kept.scores[offset:offset + n], scores[order])
            assert torch.equal(kept.labels[offset:offset + n], labels[order])
            assert bool((kept.image[offset:offset + n] == i).all())
            offset += n
    assert crowded >= 3  # the sample's crowded scenes are in the first 40 images


@pytest.mark.parametrize("overlap", [False, True])
def test_a_stream_ends_at_the_first_batch_it_is_told_not_to_start(pipeline, records, overlap):
    """run_stream's goes_on: over the variant's batches cycled a thousand times (made as asked for), the stream runs
    exactly the batches before the first one refused, each prepared once, and gives their detections in order."""
    from harness.run.executor import CycledBatches

    batches = [records[i:i + 4] for i in range(0, 16, 4)]
    asked: list[int] = []

    def goes_on(k: int) -> bool:
        asked.append(k)
        return k < 6

    timer = StageTimer(pipeline.device)
    out = list(pipeline.run_stream(CycledBatches(batches, 4000), timer, overlap, goes_on))
    assert [[d.image_id for d in dets] for dets in out] == [[r.image_id for r in batches[k % 4]] for k in range(6)]
    assert len(timer.batches) == 6 and max(asked) == 6 and sorted(set(asked)) == asked


def test_batch_rescale_equals_clip_boxes_to_image_per_image(pipeline, records):
    images = [decode_image(r.path) for r in records[:8]]
    batch, transforms = preprocess_batch(images, pipeline.spec)
    t = pipeline.thresholds
    per_image = pipeline.detector.decode(pipeline.core(batch), pipeline.spec.input_size, t.conf)
    cands = BatchCandidates.from_images(per_image, t.conf)
    ours = to_original(cands, transforms)
    for i, tr in enumerate(transforms):
        rows = cands.image == i
        pad = torch.tensor([tr.pad[0], tr.pad[1]] * 2)
        ratio = torch.tensor([tr.ratio[0], tr.ratio[1]] * 2)
        assert torch.equal(ours[rows], clip_boxes_to_image((cands.boxes[rows] - pad) / ratio, tr.orig_size))


def test_overlapped_mode_gives_the_latency_mode_detections(pipeline, records):
    batches = [records[i:i + 8] for i in range(0, len(records), 8)]
    latency = [d for b in batches for d in pipeline.run_batch(b, StageTimer(pipeline.device))]
    timer = StageTimer(pipeline.device)
    overlapped = [d for out in pipeline.run_stream(batches, timer, overlap=True) for d in out]
    assert [d.image_id for d in overlapped] == [r.image_id for r in records]
    for a, b in zip(latency, overlapped, strict=True):
        assert np.array_equal(a.boxes, b.boxes) and np.array_equal(a.scores, b.scores)
        assert np.array_equal(a.labels, b.labels)
    assert len(timer.batches) == len(batches)
    for timing in timer.batches:  # each batch: every stage timed, end-to-end latency covers its stages
        assert {"preprocess", "preprocess.decode", "forward", "postprocess", "postprocess.nms"} <= set(timing.stages)
        assert timing.total_ns >= timing.stages["preprocess"] + timing.stages["forward"] + timing.stages["postprocess"]


@pytest.fixture(scope="module")
def overlap_run(tmp_path_factory, _needs_assets):
    return run_benchmark(tmp_path_factory, "overlap", backends=["onnxruntime"], batch_sizes=[8], limit=48,
                         overlap=True, workers="2", energy=False)


def test_overlap_run_reports_stream_throughput(overlap_run):
    (record,) = overlap_run[1]
    t = record.timing
    assert t.mode == "overlapped"
    # batches are in flight together: images over the stream's wall time beat one batch's latency
    assert t.images_per_s > t.batch_size * 1000 / t.batch_ms.mean
    assert record.invariance is None  # one batch size: nothing to compare (detections equal latency mode: above)
    assert record.accuracy.num_images == 48  # overlapped batches are scored too
    assert record.environment["threads"]["overlapped_host_worker"]["threads"] == 1
    assert record.environment["threads"]["overlapped_host_worker"]["workers"] == 2  # --workers 2
    assert record.runtime["host"]["mode"] == "overlapped" and record.runtime["host"]["workers"] == 2
    # warmed up in the timed mode: one overlapped stream of workers + 1 = 3 batches (2 asked for)
    assert t.warmup_batches == 3
    # each batch's per-image interval since the previous completion: what total_ms (image_ms) summarises
    assert len(t.interval_samples_ms) == t.timed_batches
    assert np.mean(t.interval_samples_ms) == pytest.approx(t.image_ms.mean, abs=1e-3)
    assert np.median(t.interval_samples_ms) == pytest.approx(t.image_ms.p50, abs=1e-3)
    assert t.images_per_s == pytest.approx(1000 / t.image_ms.mean, rel=1e-4)  # one stream, one throughput
    assert t.warmup_ended.startswith("stable: the last 3 warm-up streams'") or t.warmup_ended.startswith("cap")


@requires_corpus
def test_overlap_run_submission_is_site_valid(overlap_run):
    plan, _ = overlap_run
    schema = json.loads((CORPUS / "schemas" / "submission.v1.json").read_text())
    support = json.loads((CORPUS / "support-matrix.json").read_text())
    (path,) = (plan.run_dir / "submissions").glob("*.json")
    doc = json.loads(path.read_text())
    assert doc["timing"]["mode"] == "overlapped"
    assert doc["runtime"]["host"]["workers"] == 2 and doc["repro"]["workers"] == 2
    spent = doc["runtime"]["host"]["forward_thread"]  # where the forward's thread spent the timed stream
    assert spent["batches"] == doc["timing"]["timed_batches"] and spent["ms_per_batch"]["forward"] > 0
    run_info = json.loads((plan.run_dir / "run.json").read_text())
    assert run_info["environment"]["threads"]["overlapped_host_worker"]["workers"] == 2
    assert schema_findings(doc, schema) == []
    assert site_findings(doc, support) == []


# ------------------------------------------------------------------ host threads: latency mode, N workers


class _Spy:
    """Records, per call, the thread it ran on and that thread's torch thread count."""

    def __init__(self):
        self.lock = threading.Lock()
        self.calls: list[tuple[str, int]] = []

    def note(self) -> None:
        with self.lock:
            self.calls.append((threading.current_thread().name, torch.get_num_threads()))


class _SpyDetector:
    """The detector with its head decode spied on (the rest is delegated)."""

    def __init__(self, detector, spy: _Spy):
        self._detector, self._spy = detector, spy

    def __getattr__(self, name):
        return getattr(self._detector, name)

    def decode(self, *args, **kwargs):
        self._spy.note()
        return self._detector.decode(*args, **kwargs)


def _spied_pipeline(pipeline, core, read_image, spy: _Spy, **kwargs) -> DetectorPipeline:
    spied = DetectorPipeline(pipeline.detector, core, pipeline.device, pipeline.spec, pipeline.thresholds,
                             read_image=read_image, **kwargs)
    spied.detector = _SpyDetector(pipeline.detector, spy)
    return spied


def test_latency_mode_host_ops_run_on_one_thread_and_the_forward_keeps_its_team(pipeline, records):
    """The harness's tensor ops (decode + collate, head decode, NMS, boxes) run on a host thread
    whose torch uses one thread, not through the forward's intra-op team; the forward keeps the configured count.
    Stage times are still taken on the calling thread, so they still add up to the batch time."""
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # a team of two, also on a one-core box
    try:
        reads, decodes, forwards = _Spy(), _Spy(), _Spy()

        def read(record):
            reads.note()
            return open(record.path, "rb").read()

        def core(batch):
            forwards.note()
            return pipeline.core(batch)

        spied = _spied_pipeline(pipeline, core, read, decodes)
        timer = StageTimer(pipeline.device)
        detections = spied.run_batch(records[:8], timer)
        nms_pool_threads = spied.host_executor.submit(torch.get_num_threads).result()
    finally:
        torch.set_num_threads(threads)
    main = threading.current_thread().name
    assert forwards.calls == [(main, 2)]
    assert len(reads.calls) == 8 and decodes.calls
    for name, count in reads.calls + decodes.calls:
        assert name != main and name.startswith("va-host-ops") and count == 1
    assert nms_pool_threads == 1  # per-image NMS runs on the host pool, single-threaded too
    reference = pipeline.run_batch(records[:8], StageTimer(pipeline.device))
    for a, b in zip(reference, detections, strict=True):
        assert a.image_id == b.image_id and np.array_equal(a.boxes, b.boxes) and np.array_equal(a.scores, b.scores)
    (timing,) = timer.batches
    parts = sum(timing.stages[s] for s in ("preprocess", "transfer", "forward", "postprocess"))
    assert parts <= timing.total_ns and {"preprocess.decode", "postprocess.nms"} <= set(timing.stages)
    assert spied.host_info(overlap=False) == {"mode": "latency", "host_thread": True, "torch_intra_op": 1,
                                              "opencv_threads": 1, "nms_threads": 2, "selection_on": "cpu",
                                              "nms": "torchvision.ops.nms, one call per image"}


def test_overlapped_mode_with_three_workers(pipeline, records):
    """--workers 3: three workers prepare batches in parallel (a barrier they must all reach together), never more
    than 3 batches ahead of the forward (counted from the outside: images read vs forwards started), each worker
    running torch on one thread; batches come out in order with the latency-mode detections."""
    n, size = 3, 4
    batches = [records[i:i + size] for i in range(0, len(records), size)]  # 10 batches
    batch_of = {r.image_id: k for k, batch in enumerate(batches) for r in batch}
    latency = [d for b in batches for d in pipeline.run_batch(b, StageTimer(pipeline.device))]

    lock = threading.Condition()
    started_reads: set[int] = set()  # batches whose decode has begun
    forwards = [0]  # forwards started
    ahead: list[int] = []  # per image read: its batch - forwards started
    together = threading.Barrier(n, timeout=60)
    reads, decodes = _Spy(), _Spy()

    def read(record):
        k = batch_of[record.image_id]
        with lock:
            first = k not in started_reads
            started_reads.add(k)
            ahead.append(k - forwards[0])
            lock.notify_all()
        if first and k < n:
            together.wait()  # BrokenBarrierError unless n batches are being prepared at once
        reads.note()
        return open(record.path, "rb").read()

    def core(batch):
        with lock:
            k = forwards[0]
            forwards[0] += 1
            # hold the forward until the queue is full: the bound is then reached, not just never exceeded
            assert lock.wait_for(lambda: min(k + n, len(batches) - 1) in started_reads, timeout=60)
        return pipeline.core(batch)

    spied = _spied_pipeline(pipeline, core, read, decodes, stream_workers=n)
    out = list(spied.run_overlapped(batches))
    assert [[d.image_id for d in dets] for dets, _ in out] == [[r.image_id for r in b] for b in batches]
    overlapped = [d for dets, _ in out for d in dets]
    for a, b in zip(latency, overlapped, strict=True):
        assert np.array_equal(a.boxes, b.boxes) and np.array_equal(a.scores, b.scores)
        assert np.array_equal(a.labels, b.labels)
    # Batch k + n is submitted once batch k leaves the queue, just before its forward starts: from the outside,
    # batch j is read only after the forward of batch j - n - 1 has started; the pipeline's own counter is exact.
    assert max(ahead) <= n
    assert spied.max_ahead == n  # the queue filled up to n batches ahead of the forward, and never beyond
    names = {name for name, _ in reads.calls}
    assert len(names) >= n and all(name.startswith("va-stream") for name in names)
    assert all(count == 1 for _, count in reads.calls + decodes.calls)
    assert all(name.startswith("va-stream") for name, _ in decodes.calls)
    assert spied.host_info(overlap=True)["workers"] == n and spied.host_info(overlap=True)["max_batches_ahead"] == n


def test_a_stream_that_fails_leaves_no_preparation_running(pipeline, records):
    """A forward that fails mid-stream: the preparations queued ahead are cancelled or waited for before the error
    reaches the caller, so none decodes (or, on a GPU, allocates) while the next cell starts."""
    batches = [records[i:i + 2] for i in range(0, 20, 2)]
    state = {"reads": 0, "forwards": 0}
    lock = threading.Lock()

    def read(record):
        time.sleep(0.05)
        with lock:
            state["reads"] += 1
        return open(record.path, "rb").read()

    def core(batch):
        state["forwards"] += 1
        if state["forwards"] == 2:
            raise RuntimeError("the forward failed")
        return pipeline.core(batch)

    spied = _spied_pipeline(pipeline, core, read, _Spy(), stream_workers=3)
    with pytest.raises(RuntimeError, match="the forward failed"):
        list(spied.run_overlapped(batches))
    with lock:
        reads = state["reads"]
    time.sleep(0.5)  # a preparation left running would read on
    assert state["reads"] == reads < 2 * len(batches)


def test_overlapped_mode_says_where_the_forwards_thread_spent_the_stream(pipeline, records):
    """Known costs, from sleeps much longer than the real work around them (batches of 2 images). A slow
    preparation (2 reads of 300 ms per batch, one worker): every batch after the first waits for most of it. A
    slow finishing (500 ms per batch, one at a time): the forward's thread waits for it before handing on the
    next. Each stream also has a forward of at least 30 ms and 20 ms in the caller per batch. The parts add up
    to no more than the stream's wall time measured from the outside."""
    import time

    def core(batch):
        time.sleep(0.03)
        return pipeline.core(batch)

    def slow_read(record):
        time.sleep(0.3)
        return open(record.path, "rb").read()

    class SlowFinish(_SpyDetector):
        def decode(self, *args, **kwargs):
            time.sleep(0.5)
            return self._detector.decode(*args, **kwargs)

    batches = [records[i:i + 2] for i in range(0, 12, 2)]
    slow_preparation = _spied_pipeline(pipeline, core, slow_read, _Spy(), stream_workers=1)
    slow_finishing = _spied_pipeline(pipeline, core, None, _Spy(), stream_workers=2)
    slow_finishing.detector = SlowFinish(pipeline.detector, _Spy())
    accounts = {}
    for name, spied in (("preparation", slow_preparation), ("finishing", slow_finishing)):
        start = time.perf_counter_ns()
        for _ in spied.run_overlapped(batches):
            time.sleep(0.02)
        wall = time.perf_counter_ns() - start
        account = accounts[name] = spied.forward_thread
        assert account.batches == 6 and account.wall_ns <= wall
        assert account.forward_ns >= 6 * 30e6 and account.caller_ns >= 6 * 20e6
        spent = (account.forward_ns + account.waiting_for_preparation_ns + account.waiting_for_finishing_ns
                 + account.filling_ns + account.draining_ns)
        assert spent + account.caller_ns <= account.wall_ns
        record = spied.host_info(overlap=True)["forward_thread"]
        assert record["batches"] == 6 and set(record["ms_per_batch"]) == {
            "forward", "waiting_for_preparation", "waiting_for_finishing", "caller", "filling", "draining", "rest"}
        assert abs(sum(record["ms_per_batch"].values()) - record["wall_ms_per_batch"]) < 0.01
    # 600 ms of reads per batch against a forward of 2 images (~20 ms alone; up to 280 ms leaves this true); the
    # first batch's preparation is the stream filling, not a wait the forward could have hidden
    assert accounts["preparation"].waiting_for_preparation_ns >= 5 * 300e6
    assert accounts["preparation"].filling_ns >= 500e6
    assert accounts["preparation"].waiting_for_finishing_ns < accounts["preparation"].waiting_for_preparation_ns / 4
    # each batch's 500 ms finishing against the next batch's forward and caller (up to ~330 ms leaves this true)
    assert accounts["finishing"].waiting_for_finishing_ns >= 5 * 150e6
    assert accounts["finishing"].draining_ns >= 300e6  # the last batch's finishing, with nothing left to overlap
    assert accounts["finishing"].waiting_for_preparation_ns < accounts["finishing"].waiting_for_finishing_ns / 4
    slow_preparation.reset_forward_thread()
    assert slow_preparation.host_info(overlap=True)["forward_thread"] == {}


def test_a_stream_that_waits_for_host_work_is_flagged():
    """The run's warning: at least 10 % of the stream spent waiting for host work, with the figures; below, none."""
    from harness.pipeline.stage_timer import ForwardThreadTime

    waiting = ForwardThreadTime(batches=10, forward_ns=600_000_000, waiting_for_preparation_ns=300_000_000,
                                waiting_for_finishing_ns=100_000_000, caller_ns=0, wall_ns=1_000_000_000)
    warning = waiting.host_bound_warning()
    assert warning.startswith("overlapped: the forward waited 40.0 ms per batch (40 % of the stream)")
    assert "preparation 30.0, finishing 10.0" in warning and "--workers" in warning
    finishing = ForwardThreadTime(batches=10, forward_ns=600_000_000, waiting_for_preparation_ns=100_000_000,
                                  waiting_for_finishing_ns=300_000_000, wall_ns=1_000_000_000)
    assert "--nms-on" in finishing.host_bound_warning()  # the advice follows the longer wait
    assert "--nms-on" not in finishing.host_bound_warning(on_gpu=False)  # and the device: one place on a CPU
    hidden = ForwardThreadTime(batches=10, forward_ns=950_000_000, waiting_for_preparation_ns=50_000_000,
                               waiting_for_finishing_ns=49_000_000, wall_ns=1_000_000_000)
    assert hidden.host_bound_warning() is None and ForwardThreadTime().host_bound_warning() is None
    # filling and draining every stream has: out of the share (10 % of the 800 ms between them is 80 ms)
    short = ForwardThreadTime(batches=10, forward_ns=700_000_000, waiting_for_preparation_ns=70_000_000,
                              filling_ns=100_000_000, draining_ns=100_000_000, wall_ns=1_000_000_000)
    assert short.host_bound_warning() is None
    short.waiting_for_preparation_ns = 90_000_000
    assert "(11 % of the stream)" in short.host_bound_warning()


def test_a_run_whose_forward_waits_for_its_preparation_says_so(tmp_path_factory, monkeypatch, _needs_assets):
    """A real overlapped run whose decode is made slow (200 ms an image, 800 ms a batch of 4 against a forward of
    ~40 ms on one worker: a margin that a loaded box, slowing the forward several times, does not close): the
    cell's timing carries the warning, with the record's own figures."""
    import time

    from harness.pipeline import pipeline as pipeline_module

    decode = pipeline_module.decode_bytes

    def slow_decode(data, path):
        time.sleep(0.2)
        return decode(data, path)

    monkeypatch.setattr(pipeline_module, "decode_bytes", slow_decode)
    _, (record,) = run_benchmark(tmp_path_factory, "host-bound", backends=["onnxruntime"], batch_sizes=[4], limit=16,
                                 overlap=True, workers="1", energy=False, layers=False, profile=False,
                                 draw_images=0, min_timed_batches=6)
    (warning,) = [w for w in record.timing.warnings if w.startswith("overlapped: the forward waited")]
    spent = record.runtime["host"]["forward_thread"]["ms_per_batch"]
    assert spent["waiting_for_preparation"] > spent["forward"]  # 800 ms of decoding against a ~40 ms forward
    assert f"preparation {spent['waiting_for_preparation']:.1f}" in warning


@pytest.mark.parametrize("finishes", [1, 2])
def test_finishes_in_flight_bounds_the_batches_finishing_at_once(pipeline, records, finishes):
    """The first two batches' finishing meet at a barrier: they finish at once with finishes_in_flight 2 (and the
    batches still come out in order with the latency-mode detections); with 1 the second cannot start while the
    first waits, and the barrier breaks."""
    batches = [records[i:i + 4] for i in range(0, 16, 4)]
    latency = [d for b in batches for d in pipeline.run_batch(b, StageTimer(pipeline.device))]
    together = threading.Barrier(2, timeout=60 if finishes == 2 else 3)
    decodes = [0]

    class MeetingDetector(_SpyDetector):
        def decode(self, *args, **kwargs):
            with together._cond:  # the barrier's own lock: a counter shared by the finishing threads
                decodes[0] += 1
                first_two = decodes[0] <= 2
            if first_two:
                together.wait()
            return self._detector.decode(*args, **kwargs)

    spied = _spied_pipeline(pipeline, pipeline.core, None, _Spy(), stream_workers=2, finishes_in_flight=finishes)
    spied.detector = MeetingDetector(pipeline.detector, _Spy())
    if finishes == 1:
        with pytest.raises(threading.BrokenBarrierError):
            list(spied.run_overlapped(batches))
        return
    overlapped = [d for dets, _ in spied.run_overlapped(batches) for d in dets]
    assert [d.image_id for d in overlapped] == [r.image_id for b in batches for r in b]
    for a, b in zip(latency, overlapped, strict=True):
        assert np.array_equal(a.boxes, b.boxes) and np.array_equal(a.scores, b.scores)
    assert spied.host_info(overlap=True)["finishes_in_flight"] == 2


def test_workers_option_and_auto(monkeypatch):
    assert build_config({}).workers == "auto"
    overlapped = {"overlap": True}
    assert build_config({"workers": 3, **overlapped}).workers == "3"
    assert build_config({"workers": "2", **overlapped}).workers == "2"
    for bad in (0, "0", "x", "-1", True, 1.5):
        with pytest.raises(UsageError, match="--workers"):
            build_config({"workers": bad, **overlapped})
    assert resolve_workers("4", cuda=False) == 4 and resolve_workers("auto", cuda=False) == 1
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)), raising=False)
    assert resolve_workers("auto", cuda=True) == MAX_AUTO_WORKERS == 8
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    assert resolve_workers("auto", cuda=True) == 2
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0}, raising=False)
    assert resolve_workers("auto", cuda=True) == 1
