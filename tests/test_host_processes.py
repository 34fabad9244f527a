"""Host processes (`--host-processes`): the host's reads, decode, letterbox and the selection of host candidates in
processes of their own give the detections the workers' threads give, name a bad image as the threads do, survive a
process that dies, and are recorded; the options they cannot serve are refused in one line."""

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import COCO_DIR, load_core_of, requires_coco, requires_yolox, run_benchmark, run_in_process

from harness.data.coco import CocoDataset
from harness.errors import UsageError
from harness.measure.device import parse_device
from harness.models.registry import get_detector
from harness.pipeline.host_processes import HostProcessError, HostProcesses, shared_host_processes
from harness.pipeline.pipeline import DetectorPipeline, Thresholds, resolve_workers
from harness.pipeline.preprocess import decode_image, letterbox_canvas
from harness.pipeline.stage_timer import StageTimer


@pytest.fixture(scope="module")
def yolox():
    device = parse_device("cpu")
    detector = get_detector("yolox-nano")
    core = load_core_of(detector, "onnxruntime", device, "fp32", detector.preprocess.input_size,
                        threads=torch.get_num_threads())
    dataset = CocoDataset(str(COCO_DIR))
    return detector, core, device, dataset.records(dataset.variant("sample"))[:24]


def _pipeline(yolox, library="cv2", **kwargs):
    from dataclasses import replace

    detector, core, device, _ = yolox
    d = detector.defaults
    return DetectorPipeline(detector, core, device, replace(detector.preprocess, library=library),
                            Thresholds(d.conf, d.iou, d.max_det), **kwargs)


@requires_coco
@requires_yolox
@pytest.mark.parametrize("library", ["cv2", "pil"])
def test_host_processes_give_the_threads_detections(yolox, library):
    records = yolox[3]
    batches = [records[i:i + 8] for i in range(0, len(records), 8)]
    runs = {}
    for processes in (0, 1):
        pipeline = _pipeline(yolox, library, stream_workers=2, host_processes=processes)
        timer = StageTimer(pipeline.device)
        runs[processes] = ([d for out in pipeline.run_stream(batches, timer, overlap=True) for d in out], timer)
    (threads, _), (processes, timer) = runs[0], runs[1]
    assert [d.image_id for d in processes] == [r.image_id for r in records]
    assert sum(len(d.scores) for d in processes) > 100
    for a, b in zip(threads, processes, strict=True):
        assert np.array_equal(a.boxes, b.boxes) and np.array_equal(a.scores, b.scores), a.image_id
        assert np.array_equal(a.labels, b.labels) and a.boxes.dtype == b.boxes.dtype
    for timing in timer.batches:  # the child's own clocks land as the stages' substeps
        assert {"preprocess.decode", "preprocess.letterbox", "postprocess.nms", "postprocess.boxes"} <= \
            set(timing.stages)
        assert 0 < timing.stages["preprocess.decode"] < timing.stages["preprocess"]
        assert 0 < timing.stages["postprocess.nms"] < timing.stages["postprocess"]


@requires_coco
@pytest.mark.parametrize("model", ["picodet-s", pytest.param("rtdetr-r18", marks=pytest.mark.heavy),
                                   pytest.param("rfdetr-n", marks=pytest.mark.heavy)])
def test_host_processes_decode_each_head_kind_as_the_run_does(model):
    # the family's host decoder, pickled into the process, on the raw outputs copied to shared memory: the same
    # detections as the run's own decode, for per-level dense heads (NMS), DETR logits and RF-DETR's query rows (top-k)
    import pickle

    from harness.detector.protocol import RANDOM_WEIGHTS

    detector = get_detector(model, RANDOM_WEIGHTS)
    assert len(pickle.dumps(detector.host_decoder)) < 1000  # settings only: no model, no device tensors
    device = parse_device("cpu")
    core = load_core_of(detector, "pytorch", device, "fp32", detector.preprocess.input_size, threads=1)
    dataset = CocoDataset(str(COCO_DIR))
    records = dataset.records(dataset.variant("sample"))[:4]
    runs = {}
    for processes in (0, 1):
        d = detector.defaults  # a threshold that random weights' scores pass
        pipeline = DetectorPipeline(detector, core, device, replace(detector.preprocess, library="cv2"),
                                    Thresholds(1e-4, d.iou, d.max_det), stream_workers=1, host_processes=processes)
        assert pipeline.decode_runs_in_host_processes == bool(processes)
        runs[processes] = [d for out in pipeline.run_stream([records[:2], records[2:]], StageTimer(device),
                                                            overlap=True) for d in out]
    assert sum(len(d.scores) for d in runs[1]) > 0
    for a, b in zip(runs[0], runs[1], strict=True):
        assert a.image_id == b.image_id and np.array_equal(a.boxes, b.boxes), (model, a.image_id)
        assert np.array_equal(a.scores, b.scores) and np.array_equal(a.labels, b.labels), (model, a.image_id)


@requires_coco
def test_a_plugin_without_a_host_decoder_decodes_in_the_run_and_selects_in_a_process():
    from harness.models.registry import load_plugin

    detector = load_plugin("tests/plugins/synthetic_detector.py", "make_detector")
    assert getattr(detector, "host_decoder", None) is None
    detector.host_decoder = detector.decode  # a plugin's own, which the processes could not import: not used
    device = parse_device("cpu")
    dataset = CocoDataset(str(COCO_DIR))
    records = dataset.records(dataset.variant("sample"))[:4]
    d = detector.defaults
    runs = []
    for processes in (0, 1):
        pipeline = DetectorPipeline(detector, detector.load_core("pytorch", device, "fp32", (64, 64), 1), device,
                                    detector.preprocess, Thresholds(d.conf, d.iou, d.max_det), host_processes=processes)
        assert not pipeline.decode_runs_in_host_processes
        runs.append([d for out in pipeline.run_stream([records[:2], records[2:]], StageTimer(device), overlap=True)
                     for d in out])
    assert sum(len(d.scores) for d in runs[1]) > 0
    runs_there = pipeline.host_info(True)["host_processes"]["runs"]
    assert runs_there.endswith("selection, boxes and split by image of host candidates")
    for a, b in zip(*runs, strict=True):
        assert a.boxes.tobytes() == b.boxes.tobytes() and a.scores.tobytes() == b.scores.tobytes()


@requires_coco
@pytest.mark.parametrize("processes", [1, 3])
def test_host_processes_letterbox_as_the_host_does_and_name_a_bad_image(tmp_path, processes):
    # with 3 idle processes the batch is split: 7 images in parts of 2, 2 and 3, each writing its own rows
    detector = get_detector("yolox-nano")
    dataset = CocoDataset(str(COCO_DIR))
    paths = [r.path for r in dataset.records(dataset.variant("sample"))[:7]]
    pool = shared_host_processes(processes)
    prepared = pool.prepare(paths, detector.preprocess)
    canvas, transforms = letterbox_canvas([decode_image(p) for p in paths], detector.preprocess)
    assert torch.equal(prepared.canvas, canvas)
    # the thread's own shared canvas, mapped by both sides: the same memory batch after batch, written by the child
    again = pool.prepare(paths[::-1], detector.preprocess)
    assert again.canvas.data_ptr() == prepared.canvas.data_ptr()
    assert torch.equal(again.canvas, letterbox_canvas([decode_image(p) for p in paths[::-1]], detector.preprocess)[0])
    assert prepared.transforms == transforms and prepared.decode_ns > 0 and prepared.letterbox_ns > 0
    bad = tmp_path / "broken.jpg"
    bad.write_bytes(b"\xff\xd8\xff not a jpeg")
    with pytest.raises(UsageError, match="broken.jpg could not be decoded by cv2"):  # split: a part's error
        pool.prepare([*paths[:3], bad], detector.preprocess)
    assert len(set(pool._call_split(2 * processes, lambda start, stop: (os.getpid, ())))) == processes  # all back


def test_a_batch_is_split_over_the_processes_idle_at_two_images_a_part_at_least():
    pool = shared_host_processes(3)
    assert pool._call_split(7, lambda start, stop: (slice, (start, stop))) == [slice(0, 2), slice(2, 4), slice(4, 7)]
    assert len(set(pool._call_split(6, lambda start, stop: (os.getpid, ())))) == 3  # each part its own process
    assert pool._call_split(3, lambda start, stop: (slice, (start, stop))) == [slice(0, 3)]
    assert pool._call_split(1, lambda start, stop: (slice, (start, stop))) == [slice(0, 1)]


def test_a_host_process_that_dies_fails_the_batch_and_the_next_batch_gets_a_new_one():
    pool = shared_host_processes(1)
    # the process ends without an answer, as one killed does; the message says how, and never "out of memory" (which
    # the scheduler would take for the batch size's and skip the larger ones)
    with pytest.raises(HostProcessError, match=r"a host process ended while preparing or finishing a batch "
                                               r"\(exit code 3\)") as err:
        pool._call(os._exit, 3)
    assert "out of memory" not in str(err.value)
    assert pool._call(os.getpid) > 0  # started again


def test_a_full_shared_memory_is_an_error_that_says_so_and_leaves_no_segment(monkeypatch):
    # and a file system that cannot reserve pages at all (no fallocate) is no error: its pages are found when written
    import errno

    from harness.pipeline import host_processes

    made = []
    real = host_processes.shared_memory.SharedMemory

    def segment(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    def full(fd, offset, size):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(host_processes.shared_memory, "SharedMemory", segment)
    monkeypatch.setattr(host_processes.os, "posix_fallocate", full)
    with pytest.raises(HostProcessError, match=r"no room for a 3\.0 MiB segment in shared memory .*--shm-size"):
        host_processes._make_segment(3 * 2**20, "va-test-0")
    assert made and not Path(f"/dev/shm/{made[0].name}").exists()

    def unsupported(fd, offset, size):  # a sandbox's tmpfs without fallocate: no reservation, as on macOS
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

    monkeypatch.setattr(host_processes.os, "posix_fallocate", unsupported)
    kept = host_processes._make_segment(2**20, "va-test-1")
    try:
        assert kept.size >= 2**20 and Path(f"/dev/shm/{kept.name}").exists()
    finally:
        host_processes._release(kept)


def test_a_gpu_runs_segments_are_page_locked_off_the_calling_thread_and_unlocked_when_they_go(monkeypatch):
    # faked CUDA runtime: what is registered, from which thread, and what a refusal is recorded as
    import threading
    from types import SimpleNamespace

    calls = []

    def register(address, size, flags):
        calls.append(("register", address, size, flags, threading.current_thread().name))
        return 0

    def unregister(address):
        calls.append(("unregister", address, threading.current_thread().name))
        return 0

    monkeypatch.setattr(torch.cuda, "cudart", lambda: SimpleNamespace(cudaHostRegister=register,
                                                                       cudaHostUnregister=unregister))
    # the run's GPU made current first, so that no context is made on another
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: calls.append(("set_device", index)))
    pool = HostProcesses(1)
    try:
        gpu = torch.device("cuda", 0)
        assert pool._segment(1000).name and not calls and pool.page_locking is None  # a CPU run's: pageable
        first = pool._segment(1000, gpu)
        pool._segment(800, gpu)  # the same segment: registered once
        assert calls[0] == ("set_device", 0) and [c[0] for c in calls[1:]] == ["register"]
        assert calls[1][2:4] == (first.size, 1)
        assert calls[1][4] == "va-cuda-register" and pool.page_locking == "page-locked (cudaHostRegister)"
        grown = pool._segment(5000, gpu)  # made anew: the old one unregistered first
        calls[:] = [c for c in calls if c[0] != "set_device"]
        assert grown.name != first.name and [c[0] for c in calls] == ["register", "unregister", "register"]
        assert calls[1][1] == calls[0][1]
        # a driver that refuses: the segments stay pageable (slower copies, the same bytes), and the record says why
        monkeypatch.setattr(torch.cuda, "cudart", lambda: SimpleNamespace(cudaHostRegister=lambda *a: 712,
                                                                           cudaHostUnregister=unregister))
        pool.page_locking = None
        other = threading.Thread(target=lambda: pool._segment(1000, gpu))  # another worker's segment
        other.start()
        other.join()
        assert pool.page_locking == "pageable: cudaHostRegister failed (CUDA error 712)" and len(pool._pinned) == 1
    finally:
        pool.close()
    calls[:] = [c for c in calls if c[0] != "set_device"]
    assert [c[0] for c in calls][-1] == "unregister" and calls[-1][1] == calls[2][1] and not pool._pinned


def test_an_error_in_a_host_process_keeps_its_type_and_says_where():
    pool = shared_host_processes(1)
    with pytest.raises(ValueError, match="invalid literal") as err:
        pool._call(int, "not a number")
    assert "Traceback" in str(err.value.__cause__)


def test_a_call_interrupted_on_its_thread_leaves_no_answer_for_the_next_caller():
    # Ctrl-C lands in the calling thread while the process works: its late answer must not be read as the next call's
    import signal
    import threading
    import time

    pool = shared_host_processes(1)
    first = pool._call(os.getpid)
    armed = threading.Event()

    def interrupt(signum, frame):
        if armed.is_set():  # a signal that arrives once the call is over is dropped, not raised into another test
            raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, interrupt)  # an earlier test's run may have set its own
    timer = threading.Timer(0.3, lambda: signal.pthread_kill(threading.main_thread().ident, signal.SIGINT))
    try:
        armed.set()
        timer.start()
        with pytest.raises(KeyboardInterrupt):
            pool._call(time.sleep, 30)  # ended by the interrupt, however late the timer fires
    finally:
        armed.clear()
        timer.cancel()
        timer.join()
        signal.signal(signal.SIGINT, previous)
    assert pool._call(abs, -5) == 5  # not the sleep's None
    assert pool._call(os.getpid) != first  # a new process serves


def test_a_call_interrupted_while_its_process_starts_again_leaves_no_answer_for_the_next_caller():
    import signal
    import threading

    pool = HostProcesses(1)
    try:
        with pytest.raises(HostProcessError):
            pool._call(os._exit, 3)  # the next call starts a new process (imports: seconds)
        armed = threading.Event()

        def interrupt(signum, frame):
            if armed.is_set():
                raise KeyboardInterrupt

        previous = signal.signal(signal.SIGINT, interrupt)
        timer = threading.Timer(0.3, lambda: signal.pthread_kill(threading.main_thread().ident, signal.SIGINT))
        try:
            armed.set()
            timer.start()
            with pytest.raises(KeyboardInterrupt):
                pool._call(os.getpid)
        finally:
            armed.clear()
            timer.cancel()
            timer.join()
            signal.signal(signal.SIGINT, previous)
        # neither the new process's "ready" nor the interrupted call's answer is read as a later call's
        assert [pool._call(abs, -i) for i in range(3)] == [0, 1, 2]
    finally:
        pool.close()


def test_two_processes_that_end_in_one_split_batch_are_both_started_again():
    pool = HostProcesses(2)
    try:
        with pytest.raises(HostProcessError, match=r"exit code 3"):
            pool._call_split(4, lambda start, stop: (os._exit, (3,)))
        assert all(member.process is None for member in pool._members)
        assert len(set(pool._call_split(4, lambda start, stop: (os.getpid, ())))) == 2
    finally:
        pool.close()


def test_what_cannot_cross_is_the_callers_error_and_the_process_serves_on(tmp_path):
    import importlib.util

    pool = shared_host_processes(1)
    pid = pool._call(os.getpid)
    with pytest.raises((AttributeError, TypeError, Exception), match="pickle|lambda"):
        pool._call(lambda: 1)  # not picklable here: no process involved
    # a class from a file the process cannot import (a plugin's): its own error, not "a host process ended"
    (tmp_path / "only_here.py").write_text("class Decoder:\n    def __call__(self):\n        return 1\n")
    spec = importlib.util.spec_from_file_location("va_bench_plugin_only_here", tmp_path / "only_here.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        with pytest.raises(ModuleNotFoundError, match="va_bench_plugin_only_here"):
            pool._call(module.Decoder())
    finally:
        del sys.modules[spec.name]
    assert pool._call(os.getpid) == pid


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and /dev/shm are Linux's")
def test_a_segment_replaced_by_a_larger_one_is_freed_in_both_processes():
    detector = get_detector("yolox-nano")
    dataset = CocoDataset(str(COCO_DIR))
    paths = [r.path for r in dataset.records(dataset.variant("sample"))[:2]]
    pool = HostProcesses(1)
    try:
        child = pool._call(os.getpid)
        pool.prepare(paths[:1], detector.preprocess)
        first = pool._own.segment.name
        prepared = pool.prepare(paths, detector.preprocess)  # twice the canvas: a new segment
        second = pool._own.segment.name
        assert second != first and prepared.canvas.shape[0] == 2
        owner = pool._own.owner + "-"
        assert sorted(p.name for p in Path("/dev/shm").iterdir() if p.name.startswith(owner)) == [second]
        for pid in (os.getpid(), child):  # neither maps the old one any more
            assert first not in Path(f"/proc/{pid}/maps").read_text(), pid
    finally:
        pool.close()
    assert not [p for p in Path("/dev/shm").iterdir() if p.name.startswith(owner)]


def test_host_processes_ignore_a_terminals_ctrl_c():
    # Ctrl-C in a terminal reaches the whole process group: the run stops itself (and records it), its host
    # processes must not answer a batch with their own KeyboardInterrupt
    import signal
    import time

    pool = shared_host_processes(1)
    pid = pool._call(os.getpid)
    os.kill(pid, signal.SIGINT)
    time.sleep(0.2)
    assert pool._call(os.getpid) == pid  # the same process, still serving


def test_host_processes_need_a_host_letterbox_and_give_a_worker_each():
    detector = get_detector("yolox-nano")
    for library, generated in (("torch", None), ("cv2", lambda record: None)):
        from dataclasses import replace

        with pytest.raises(ValueError, match="host processes read and letterbox"):
            DetectorPipeline(detector, None, parse_device("cpu"), replace(detector.preprocess, library=library),
                             Thresholds(0.1, 0.6, 100), host_processes=1, generated=generated)
    assert resolve_workers("auto", cuda=True, host_processes=5) == 5
    assert resolve_workers("auto", cuda=False, host_processes=3) == 3 and resolve_workers("2", False, 3) == 2


@requires_coco
@requires_yolox
def test_a_run_with_host_processes_scores_as_the_threads_and_records_them(tmp_path_factory):
    common = dict(backends=["onnxruntime"], batch_sizes=[8], limit=32, overlap=True, energy=False,
                  memory=False, min_timed_batches=4)
    _, (threads,) = run_benchmark(tmp_path_factory, "threads", **common)
    _, (processes,) = run_benchmark(tmp_path_factory, "processes", host_processes=2, **{**common, "memory": True})
    # the same detections, to the byte, scored the same
    assert processes.accuracy.detections_sha256 == threads.accuracy.detections_sha256 is not None
    assert processes.accuracy.stats == threads.accuracy.stats and processes.accuracy.num_images == 32
    host = processes.runtime["host"]
    assert host["workers"] == 2 and host["finishes_in_flight"] == 2  # --workers auto: one a process
    assert host["host_processes"]["processes"] == 2 and "the head decode" in host["host_processes"]["runs"]
    assert host["host_processes"]["shared_segments"] == "pageable (no copies to or from a GPU)"
    assert host["selection_on"] == "cpu" and "postprocess.copy" in processes.timing.stages_ms  # the raw outputs
    assert processes.runtime["preprocess"]["host_processes"] == 2
    assert processes.environment["threads"]["overlapped_host_worker"]["host_processes"] == 2
    assert "preprocess.letterbox" in processes.timing.stages_ms
    # the processes read the files: the run keeps no copy of them in memory, and says so
    images = processes.environment["images"]
    assert images["decode_from"] == "disk" and images["reason"].startswith("--host-processes")
    assert threads.environment["images"]["decode_from"] == "memory"
    # their memory counts: each process's own peak over the timed pass, added to the run's
    memory = processes.memory
    assert memory["host_processes"]["processes"] == 2 and memory["host_processes"]["peak_ram_mb"] > 200
    assert memory["peak_ram_mb"] == round(memory["run_process"]["peak_ram_mb"] +
                                          memory["host_processes"]["peak_ram_mb"], 2)


@pytest.mark.parametrize("args, expect", [
    (["--host-processes", "2"], "--host-processes applies to --overlap only"),
    (["--overlap", "--host-processes", "2", "--preprocess", "torch"], "--preprocess torch letterboxes with torch"),
    (["--overlap", "--host-processes", "2", "--device", "cuda"], "--preprocess auto (torch on CUDA)"),
    (["--overlap", "--host-processes", "2", "--input", "synthetic"], "--input synthetic has none"),
    (["--overlap", "--host-processes", "2", "--model", "ssdlite320_mobilenet_v3_large", "--weights", "random"],
     "ssdlite320_mobilenet_v3_large's own preprocessing is torch's"),
])
@requires_coco
def test_what_host_processes_cannot_serve_is_refused_in_one_line(tmp_path, args, expect):
    out = tmp_path / "o"
    dataset = [] if "synthetic" in args else ["--coco-dir", str(COCO_DIR)]
    result = run_in_process("run", *dataset, "--output-dir", str(out), *args)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and expect in lines[0], result.stderr
    assert not out.exists()


@requires_coco
@requires_yolox
@pytest.mark.heavy
def test_the_lock_convoy_bench_measures_every_way():
    # its plumbing (no timed assertion: the figures are in docs/benchmarks.md): every way beside the stand-in
    # forward measured, with the work it did
    from harness.bench.lock_convoy import handover, measure

    result = measure("yolox-nano", 2, "cv2", rounds=1, calls=5, stand_in_size=32)
    assert result["forward_ms_alone_p50"] > 0 and result["preprocess"] == "cv2"
    for way in ("calls_thread", "calls_process", "thread", "process"):
        assert result[way]["forward_vs_alone"] > 0 and result[way]["work_per_s"] > 0, (way, result[way])
    assert "process" not in measure("yolox-nano", 2, "torch", rounds=1, calls=5, stand_in_size=32)
    handed = handover("yolox-nano", 2, "cv2", calls=2)
    assert handed["prepare_wall_ms"] > 0 and handed["prepare_cpu_ms"] >= 0 and "handover_cpu_ms" in handed
    calls = handed["torch_calls_per_batch"]  # the finishing moved out of the run: far fewer calls left in it
    assert 0 < calls["processes"]["postprocess"] < calls["threads"]["postprocess"]


@requires_coco
@pytest.mark.heavy
def test_a_segmentation_run_with_host_processes_writes_the_threads_masks(tmp_path_factory):
    # the kept candidates come back from the process with their mask rows: the masks made from them are the same
    pytest.importorskip("transformers", reason="RF-DETR needs `transformers`")
    from harness.detector.protocol import RANDOM_WEIGHTS

    files = []
    for processes in (0, 1):
        plan, (record,) = run_benchmark(tmp_path_factory, f"seg{processes}", models=["rfdetr-seg-n"],
                                        weights=RANDOM_WEIGHTS, backends=["pytorch"], batch_sizes=[2], limit=4,
                                        overlap=True, host_processes=processes, preprocess="cv2", energy=False,
                                        min_timed_batches=2)
        assert "postprocess.masks" in record.timing.stages_ms
        (detections,) = (plan.run_dir / "detections").glob("*.json")
        files.append(detections.read_bytes())
    assert files[0] == files[1] and b'"segmentation"' in files[0]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="prctl(PR_SET_PDEATHSIG) is Linux's")
def test_host_processes_end_when_their_parent_is_killed(tmp_path):
    # a run killed outright (SIGKILL, the OOM killer) closes nothing: its host processes must not wait for work forever
    import signal
    import subprocess
    import time

    script = ("from harness.pipeline.host_processes import HostProcesses\n"
              "import time\n"
              "if __name__ == '__main__':\n"
              "    pool = HostProcesses(1)\n"
              "    print(pool._members[0].process.pid, flush=True)\n"
              "    time.sleep(120)\n")
    (tmp_path / "parent.py").write_text(script)
    parent = subprocess.Popen([sys.executable, str(tmp_path / "parent.py")], stdout=subprocess.PIPE, text=True,
                              cwd=os.getcwd(), env={**os.environ, "PYTHONPATH": os.getcwd()})
    child = int(parent.stdout.readline())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    def alive() -> bool:  # a zombie that nobody reaps (a container's init may not) has ended all the same
        try:
            return open(f"/proc/{child}/stat").read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
        except FileNotFoundError:
            return False

    deadline = time.monotonic() + 30  # a liveness bound, not a measurement
    while time.monotonic() < deadline and alive():
        time.sleep(0.05)
    assert not alive()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc and /dev/shm are Linux's")
def test_segments_of_a_run_that_ended_without_closing_are_removed_by_the_next(tmp_path):
    """A run killed with its resource tracker (SIGKILL to its process group) leaves its segments in /dev/shm; the
    next pool removes those of this pid namespace whose pid is gone, and nothing of a live process, another
    namespace or another program."""
    from harness.pipeline.host_processes import remove_stale_segments, segment_prefix

    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(ended.stdout)
    assert not Path(f"/proc/{dead}").exists()
    prefix = segment_prefix()
    names = {"dead": f"{prefix}{dead}-3-0-0123abcd", "alive": f"{prefix}{os.getpid()}-3-0-0123abcd",
             "other namespace": f"va1.{dead}-3-0-0123abcd", "older name": f"va{dead}-3-0-0123abcd",
             "another program": f"{prefix}{dead}-notours"}
    for name in names.values():
        (tmp_path / name).write_bytes(b"x")
    assert remove_stale_segments(tmp_path) == [names["dead"]]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(n for k, n in names.items() if k != "dead")


def test_a_process_starting_holds_a_terminals_stop_signals_back_until_it_ignores_them():
    """Ctrl-C while a host or forward process imports torch printed its traceback: the run holds SIGINT and SIGHUP
    back from the starting thread (the child inherits the mask, and clears it once it ignores them), and gives its
    own mask back after."""
    import signal

    from harness.pipeline.host_processes import stop_signals_blocked

    before = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    with stop_signals_blocked():
        held = signal.pthread_sigmask(signal.SIG_BLOCK, [])
        assert {signal.SIGINT, signal.SIGHUP} <= held and signal.SIGTERM not in held - before
    assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == before
