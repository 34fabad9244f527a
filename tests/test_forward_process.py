"""The forward in a process of its own (`--forward-process`): the in-process core's detections, the forward stage as
that process's own clock, its errors as the run's (a load that cannot be, out of memory, a process killed), a new
process for the group's next cell, its memory in the record, and the options it cannot serve refused in one line."""

import json
import os
import re
import signal
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import COCO_DIR, load_core_of, requires_coco, requires_yolox, run_in_process

from harness.backends import BackendOptions
from harness.config import RunConfig
from harness.data.coco import CocoDataset
from harness.errors import UsageError
from harness.measure.device import parse_device
from harness.measure.hygiene import run_process_tree
from harness.models.registry import get_detector
from harness.pipeline.forward_process import CoreLoad, ForwardProcessCore, ForwardProcessError, _forward
from harness.pipeline.pipeline import DetectorPipeline, Thresholds
from harness.pipeline.stage_timer import StageTimer

PLUGINS = Path(__file__).with_name("plugins")


def _load(backend: str, model: str = "yolox-nano", batch: int = 4) -> CoreLoad:
    detector = get_detector(model)
    options = BackendOptions.from_config(RunConfig(backends=[backend], device="cpu", batch_sizes=[batch]))
    return CoreLoad(model, None, backend, parse_device("cpu"), "fp32", detector.preprocess.input_size, options, 1)


@requires_coco
@requires_yolox
@pytest.mark.parametrize("backend", ["onnxruntime", "pytorch"])
def test_the_forward_process_gives_the_in_process_cores_detections(backend):
    detector, device = get_detector("yolox-nano"), parse_device("cpu")
    load = _load(backend)
    ours = load_core_of(detector, backend, device, "fp32", load.input_size, threads=1)
    elsewhere = ForwardProcessCore(load)
    clocks, collect = [], elsewhere.collect

    def collect_and_keep_its_clock(ticket):
        outputs, forward_ns = collect(ticket)
        clocks.append(forward_ns)
        return outputs, forward_ns

    elsewhere.collect = collect_and_keep_its_clock
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as a run of --threads 1 sets it, here and in the forward's process
    try:
        assert elsewhere.backend == ours.backend and elsewhere.precision == "fp32"
        assert len(run_process_tree()) >= 2  # the process is the run's own, not a busy stranger
        d = detector.defaults
        dataset = CocoDataset(str(COCO_DIR))
        records = dataset.records(dataset.variant("sample"))[:12]
        batches = [records[i:i + 4] for i in range(0, len(records), 4)]
        found = {}
        for name, core in (("ours", ours), ("elsewhere", elsewhere)):
            pipeline = DetectorPipeline(detector, core, device, detector.preprocess, Thresholds(d.conf, d.iou,
                                                                                               d.max_det),
                                        stream_workers=2)
            latency, overlapped = StageTimer(device), StageTimer(device)
            with torch.inference_mode():
                found[name] = ([x for b in batches for x in pipeline.run_batch(b, latency)],
                               [x for out in pipeline.run_stream(batches, overlapped, overlap=True) for x in out])
            if core is elsewhere:
                assert pipeline.async_slots == 2 and all("forward" in pipeline.host_info(o) for o in (True, False))
                # latency mode too: the forward stage is the other process's clock, the hand-over is transfer
                assert [t.stages["forward"] for t in latency.batches] == clocks[:len(batches)]
                assert all(t.stages["transfer"] > 0 for t in latency.batches)
                for timing in overlapped.batches:  # the forward stage is the other process's own clock
                    assert 0 < timing.stages["forward"] and "forward_gpu" not in timing.stages
        for mode in (0, 1):
            a, b = found["ours"][mode], found["elsewhere"][mode]
            assert [x.image_id for x in b] == [r.image_id for r in records]
            assert sum(len(x.scores) for x in b) > 50
            for x, y in zip(a, b, strict=True):
                assert np.array_equal(x.boxes, y.boxes) and np.array_equal(x.scores, y.scores), x.image_id
                assert np.array_equal(x.labels, y.labels)
    finally:
        torch.set_num_threads(threads)
        elsewhere.close()


def test_a_load_that_cannot_be_done_there_is_the_runs_one_line_error():
    load = _load("onnxruntime")
    with pytest.raises(UsageError, match="unknown backend 'nosuch'"):
        ForwardProcessCore(CoreLoad(**{**load.__dict__, "backend": "nosuch"}))


def test_outputs_without_the_batch_first_are_refused_not_misread():
    """A core whose outputs do not lead with the batch (a flat list of detections) cannot be sliced by batch rows:
    refused with the way out, never copied in part."""
    load = _load("onnxruntime")
    inputs, outputs = [torch.zeros(4, 3, 8, 8)], [None]

    def flat(batch):
        return [torch.zeros(7, 6)]

    with pytest.raises(ValueError, match="first dimension is the batch \\(4\\).*without --forward-process"):
        _forward(flat, load, inputs, outputs, 0, 4, None)
    assert outputs == [None]


@requires_coco
def test_a_killed_forward_process_fails_its_cell_and_the_next_cell_gets_a_new_one(tmp_path):
    """The plugin's forward SIGKILLs the process it runs in (the forward's own) at batch 2: that cell fails naming
    the signal, the run goes on, and batch 4 runs in a new process."""
    marker = tmp_path / "kill"
    marker.touch()
    done = run_in_process(
        "run", "--model", f"{PLUGINS / 'killed_detector.py'}:make_detector", "--backend", "pytorch", "--batch-sizes",
        "2", "4", "--limit", "16", "--overlap", "--forward-process", "--coco-dir", str(COCO_DIR), "--output-dir",
        str(tmp_path / "out"), "--warmup-batches", "1", "--min-timed-batches", "2", "--no-energy",
        env={"VA_BENCH_TEST_KILL_MARKER": str(marker), "VA_BENCH_TEST_KILL_AFTER_S": "0",
             "VA_BENCH_TEST_FORWARD_MS": "1"})
    assert done.returncode == 1, done.stderr
    state = json.loads(next((tmp_path / "out").glob("*/run.json")).read_text())
    cells = {c["batch_size"]: c for c in state["cells"]}
    assert cells[2]["status"] == "failed"
    # two forwards in flight: the run may be handing the next batch over (sending) when it learns of the end
    assert re.search(rf"forward's process ended while (running the forward|taking a batch) \(killed by "
                     rf"{signal.Signals.SIGKILL.name}\)", cells[2]["reason"]), cells[2]["reason"]
    assert cells[4]["status"] == "ok"
    assert not marker.exists()


@requires_coco
def test_out_of_memory_in_the_forward_process_is_the_cells_oom(tmp_path):
    done = run_in_process(
        "run", "--model", f"{PLUGINS / 'synthetic_detector.py'}:make_failing_detector", "--backend", "pytorch",
        "--batch-sizes", "1", "4",
        "8", "--limit", "16", "--overlap", "--forward-process", "--coco-dir", str(COCO_DIR), "--output-dir",
        str(tmp_path / "out"), "--warmup-batches", "1", "--min-timed-batches", "2", "--no-energy",
        env={"VA_BENCH_TEST_FAIL": "4:oom", "VA_BENCH_TEST_FORWARD_MS": "1"})
    state = json.loads(next((tmp_path / "out").glob("*/run.json")).read_text())
    cells = {c["batch_size"]: c["status"] for c in state["cells"]}
    assert cells == {1: "ok", 4: "oom", 8: "skipped"}, done.stderr


@requires_coco
@requires_yolox
def test_a_run_with_a_forward_process_scores_as_without_and_records_both_processes(tmp_path):
    runs = {}
    for name, extra in (("in_process", ()), ("forward_process", ("--forward-process",))):
        done = run_in_process(
            "run", "--model", "yolox-nano", "--backend", "onnxruntime", "--batch-sizes", "4", "--limit", "16",
            "--overlap", *extra, "--coco-dir", str(COCO_DIR), "--output-dir", str(tmp_path / name),
            "--warmup-batches", "1", "--min-timed-batches", "3", "--no-energy")
        assert done.returncode == 0, done.stderr
        (path,) = (tmp_path / name).glob("*/submissions/*.json")
        runs[name] = json.loads(path.read_text())
    ours, elsewhere = runs["in_process"], runs["forward_process"]
    assert elsewhere["accuracy"] == ours["accuracy"]
    assert "forward" not in ours["runtime"]["host"]
    assert elsewhere["runtime"]["host"]["forward"].startswith("in a process of its own")
    memory = elsewhere["memory"]
    own = memory["forward_process"]["peak_ram_mb"]
    assert own > 100 and memory["peak_ram_mb"] > own  # the two processes' peaks, added
    # two forwards in flight, one running at a time: the site's inference_ms is the forward stage per image (it was
    # halved as if the two ran at once), and the three shares still add up to the interval
    host = elsewhere["runtime"]["host"]
    assert (host["forwards_in_flight"], host["forwards_concurrent"]) == (2, 1)
    total, stages = elsewhere["timing"]["total_ms"], elsewhere["timing"]["stages_ms"]
    forward = (stages["forward"]["mean"] + stages.get("transfer", {}).get("mean", 0.0)) / 4
    assert total["inference_ms"] == pytest.approx(min(forward, total["mean"]), abs=1e-3)
    assert total["preprocess_ms"] + total["inference_ms"] + total["postprocess_ms"] == pytest.approx(total["mean"],
                                                                                                       abs=2e-3)


INT8 = "--forward-process runs the core in a process of its own and --precision int8 calibrates it in this one"


@pytest.mark.parametrize(("extra", "expected"), [
    (("--backend", "openvino", "--overlap", "--precision", "int8"), INT8),
    ((), "--forward-process"),
])
def test_what_a_forward_process_cannot_serve_is_refused_in_one_line(tmp_path, extra, expected):
    done = run_in_process("run", "--model", "yolox-nano", "--forward-process", *extra, "--output-dir",
                          str(tmp_path / "out"))
    err = done.stderr
    assert done.returncode == 2 and expected in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()


def test_the_forward_process_ends_with_its_pipe():
    load = _load("onnxruntime")
    core = ForwardProcessCore(load)
    process = core._process
    core.close()
    assert not process.is_alive() and process.exitcode is not None
    with pytest.raises(ForwardProcessError, match="closed"):
        core.collect(0)
    assert os.getpid() in run_process_tree()


def test_an_answer_interrupted_mid_read_ends_the_process_and_the_next_forward_gets_a_new_one():
    """Ctrl-C while the run reads an answer: the rest of that answer would be read as the next forward's, so the
    process is ended; the next forward loads the core in a new one and answers as before."""
    core = ForwardProcessCore(_load("onnxruntime"))
    try:
        batch = torch.rand(2, 3, *core.load.input_size)
        expected = core(batch)
        first = core._process
        connection = core._connection

        class Interrupted:
            def __getattr__(self, name):
                return getattr(connection, name)

            def recv(self):
                raise KeyboardInterrupt

        ticket = core.start(batch)
        core._connection = Interrupted()
        with pytest.raises(KeyboardInterrupt):
            core.collect(ticket)
        assert core._process is None and not first.is_alive()
        again = core(batch)
        assert core._process is not None and core._process.pid != first.pid
        assert all(torch.equal(a, b) for a, b in zip(expected, again, strict=True))
    finally:
        core.close()


class _FailsToLoad:
    """Pickles as a call that raises where it is read (a CUDA slot whose handle cannot be opened there does too)."""

    def __reduce__(self):
        return int, ("not a slot",)


class _FailsToSend:
    def __reduce__(self):
        raise RuntimeError("pidfd_getfd: Operation not permitted")


def test_a_request_the_forward_process_cannot_read_is_the_cells_error_with_its_reason():
    """A request that cannot be read there (an input slot whose CUDA handle does not open) is answered with its
    reason, not an exit code; the process ends (its slots are no longer the run's) and the next forward gets a new
    one."""
    core = ForwardProcessCore(_load("onnxruntime"))
    try:
        batch = torch.rand(2, 3, *core.load.input_size)
        expected = core(batch)
        first = core._process
        core._send(("forward", 0, 2, _FailsToLoad()))
        core._started += 1
        with pytest.raises(ValueError, match="not a slot"):
            core.collect(core._started - 1)
        assert core._process is None and not first.is_alive()  # told it was ending: closed, not raced
        again = core(batch)
        assert core._process.pid != first.pid and all(torch.equal(a, b) for a, b in zip(expected, again, strict=True))
    finally:
        core.close()


def test_an_answer_that_cannot_be_sent_gives_the_run_its_reason_and_says_whether_the_pipe_is_in_step():
    from multiprocessing import Pipe

    from harness.pipeline.forward_process import _reply

    ours, theirs = Pipe()
    # a forward's answer with new output slots that could not be shared: the run never gets them
    assert _reply(theirs, ("ok", (0, 5, [_FailsToSend()]), "")) is False
    status, error, where = ours.recv()  # the process ends after it: the run is told so
    assert status == "ended" and "could not be sent (RuntimeError: pidfd_getfd" in str(error) and where
    # an error that does not pickle: its text crosses, and nothing else changed
    assert _reply(theirs, ("error", _FailsToSend(), "Traceback ...")) is True
    status, error, where = ours.recv()
    assert (status, where) == ("error", "Traceback ...") and str(error).startswith("_FailsToSend")
    assert _reply(theirs, ("ok", None, "")) is True and ours.recv() == ("ok", None, "")


def test_closing_on_a_gpu_hands_back_the_slots_the_other_process_let_go_of(monkeypatch):
    """A CUDA block shared with another process stays allocated after both let go of it until it is collected: a
    closed forward process's input slots would count in the next cell's memory."""
    import types

    collected = []
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "ipc_collect", lambda: collected.append(True))
    core = object.__new__(ForwardProcessCore)
    process = types.SimpleNamespace(join=lambda timeout=None: None, is_alive=lambda: False)
    core.device, core._connection, core._process, core._started, core._collected = (
        types.SimpleNamespace(is_cuda=True), None, process, 3, 3)
    core.close()
    assert collected == [True] and core._process is None


def test_the_forward_process_runs_with_the_runs_threads_and_slots_the_size_of_the_batch():
    """The run sets torch's threads process-wide: the forward's process sets the same (it ran with torch's default,
    2 here, under a run of --threads 1). Its slots are the batch's own size, made anew when it changes: a slot sized
    for the run's largest batch counted in every smaller cell's memory."""
    load = _load("pytorch", batch=64)
    core = ForwardProcessCore(load)
    try:
        assert core.info()["torch_threads"] == 1
        for size in (4, 1):
            core(torch.rand(size, 3, *load.input_size))
            assert core._inputs[(core._started - 1) % 2].shape[0] == size
            assert all(t.shape[0] == size for t in core._outputs[(core._started - 1) % 2])
    finally:
        core.close()


def test_a_forward_process_killed_while_idle_is_started_again_for_the_next_forward():
    """The out-of-memory killer can end it between cells (during the scoring): the next forward starts a new one,
    not a failed cell, and info() counts the restart."""
    core = ForwardProcessCore(_load("onnxruntime"))
    try:
        batch = torch.rand(2, 3, *core.load.input_size)
        expected = core(batch)
        first = core._process
        os.kill(first.pid, signal.SIGKILL)
        first.join(timeout=30)
        again = core(batch)
        assert core._process.pid != first.pid and core.info()["forward_process"]["restarts"] == 1
        assert all(torch.equal(a, b) for a, b in zip(expected, again, strict=True))
    finally:
        core.close()


def test_openvino_in_a_forward_process_is_compiled_for_one_forward_at_a_time():
    """Overlapped mode compiles OpenVINO for requests in flight (THROUGHPUT), which the forward's one thread never
    starts: there it is compiled for latency, and the record says so."""
    pytest.importorskip("openvino")
    load = _load("openvino")
    core = ForwardProcessCore(CoreLoad(**{**load.__dict__, "options": replace(load.options, overlap=True)}))
    try:
        assert core.info()["properties"]["PERFORMANCE_HINT"] == "LATENCY"
    finally:
        core.close()


def test_a_machine_without_cuda_ipc_refuses_a_forward_process_on_cuda(tmp_path, monkeypatch):
    from harness.run import plan

    monkeypatch.setattr(plan, "no_cuda_ipc", lambda: "a Jetson")
    done = run_in_process("run", "--model", "yolox-nano", "--device", "cuda", "--overlap", "--forward-process",
                          "--output-dir", str(tmp_path / "out"))
    assert done.returncode == 2 and "CUDA IPC), which a Jetson does not support; drop --forward-process" in \
        done.stderr, done.stderr
    assert not (tmp_path / "out").exists()


@requires_coco
def test_a_group_whose_set_up_fails_after_its_load_ends_its_forward_process(tmp_path):
    import psutil

    plugin = tmp_path / "stats_fail.py"
    plugin.write_text(
        "from harness.models.registry import load_plugin\n"
        f"SYNTHETIC = {str(PLUGINS / 'synthetic_detector.py')!r}\n"
        "def make_detector():\n"
        "    detector = load_plugin(SYNTHETIC, 'make_detector')\n"
        "    def model_stats(input_size):\n"
        "        raise RuntimeError('no stats here')\n"
        "    detector.model_stats = model_stats\n"
        "    return detector\n")
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    done = run_in_process("run", "--model", f"{plugin}:make_detector", "--backend", "pytorch", "--batch-sizes", "2",
                          "--limit", "4", "--overlap", "--forward-process", "--coco-dir", str(COCO_DIR),
                          "--output-dir", str(tmp_path / "out"), "--no-energy")
    assert done.returncode == 1 and "no stats here" in done.stdout + done.stderr
    left = [p for p in psutil.Process().children(recursive=True) if p.pid not in before and p.is_running()
            and p.status() != psutil.STATUS_ZOMBIE and "spawn_main" in " ".join(p.cmdline())]
    assert left == []
