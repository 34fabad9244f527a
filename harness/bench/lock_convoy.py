"""The interpreter-lock convoy, reproduced on a CPU: what the harness's host stages on a thread do to an eager
forward beside them, against the same stages in a host process (`--host-processes`).

On a GPU the eager forward of a small model is launch-bound: some hundreds of Python calls, each giving the
interpreter lock up while its kernel is queued (microseconds) and taking it back for the next call. A host thread
beside it takes the lock in each of those gaps, and the forward then waits for the thread's next release at every
call: the forward slows by more than the host work's own share of the lock. A CPU forward of the same module at a
tiny input is the same sequence of calls with microseconds of compute in each, so it shows the same convoy without
a GPU: the stand-in here is the model's eager torch module at `--stand-in-size` (default 64) on one thread.

Beside it, in rounds, interleaved:
- alone: nothing;
- calls, thread: a thread making tiny tensor calls back to back (what a GPU's host stages are: launches with no
  compute on the host, each taking the lock back), and the same calls in a process of their own (calls, process);
- thread: the harness's host stages over and over on real batches, on a thread, as the overlapped workers run them:
  the pipeline's preparation (read, decode, letterbox: `--preprocess`) and finishing (the family's decode, the
  selection and boxes of the model's real outputs at its input size, computed once);
- process: the same thread handing those stages to a host process (`--host-processes 1`), waiting without the lock
  (cv2 and PIL only: torch's letterbox is not a host process's).
On a CPU the real stages' calls compute for milliseconds with the lock released, so they show what the cores'
sharing costs more than the convoy; the tiny calls show the convoy itself. The bench reports the forward's time per
call beside each way against alone (its slowdown) and the work each way did per second. Two cores at least.

With `--handover`, instead: what handing a batch to a host process costs the run's own process, the processor time
it spends per call (all its threads: time.process_time) for a call that does nothing, for preparing a batch, and for
a call that only waits in the child as long as that preparation took (what waiting itself is charged on this
machine): the difference of the last two is the hand-over's own. That time is spent under the interpreter lock the
forward needs.

    python -m harness.bench.lock_convoy [--model yolox-nano] [--batch-size 8] [--preprocess cv2] [--rounds 5]
                                        [--calls 200] [--stand-in-size 64] [--handover] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time

import torch
import torch.multiprocessing
from torch.overrides import TorchFunctionMode

from harness.backends import BackendOptions, load_detector_core
from harness.config import RunConfig, add_run_argument
from harness.data.coco import CocoDataset
from harness.measure.device import parse_device
from harness.models.registry import get_detector
from harness.pipeline.host_processes import HostProcesses
from harness.pipeline.pipeline import DetectorPipeline, Thresholds
from harness.pipeline.preprocess import resolve_implementation
from harness.pipeline.stage_timer import StageTimer

CALLS_PER_ROUND = 64  # tiny calls per count of the calls ways' work


def tiny_calls(stop) -> int:
    """Tiny tensor calls back to back until `stop` is set (a threading or multiprocessing Event); returns the rounds
    of CALLS_PER_ROUND done."""
    torch.set_num_threads(1)
    values, rounds = torch.zeros(CALLS_PER_ROUND), 0
    while not stop.is_set():
        for i in range(CALLS_PER_ROUND):
            (values[i] * 2 + 1).clamp_(0, 1)
        rounds += 1
    return rounds


class CallsLoop:
    """tiny_calls on a thread, or in a process of its own (spawned: started before the rounds), while in the block;
    `rate()` gives its rounds of calls per second over the last block."""

    def __init__(self, in_process: bool):
        self.in_process = in_process
        if in_process:
            context = torch.multiprocessing.get_context("spawn")
            self._go, self._stop, self._done = context.Event(), context.Event(), context.Queue()
            self._process = context.Process(target=_serve_calls, args=(self._go, self._stop, self._done), daemon=True)
            self._process.start()
            self._done.get(timeout=120)  # imported and waiting

    def __enter__(self) -> CallsLoop:
        self._clock = time.perf_counter()
        if self.in_process:
            self._stop.clear()
            self._go.set()
        else:
            self._stop, self._result = threading.Event(), []
            self._thread = threading.Thread(target=lambda: self._result.append(tiny_calls(self._stop)),
                                            name="va-convoy-calls", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self.in_process:
            self._go.clear()
            self.rounds = self._done.get(timeout=60)
        else:
            self._thread.join()
            self.rounds = self._result[0]
        self.seconds = time.perf_counter() - self._clock

    def rate(self) -> float:
        return self.rounds / self.seconds

    def close(self) -> None:
        if self.in_process:
            self._process.terminate()
            self._process.join()


def _serve_calls(go, stop, done) -> None:
    """The calls way's process: ready, then for each block tiny calls from `go` until `stop`, the count on `done`."""
    done.put(0)
    while True:
        go.wait()
        done.put(tiny_calls(stop))
        while go.is_set():  # the parent clears `go` before it reads the count
            time.sleep(0.001)


class HostLoop:
    """The host stages of one batch over and over on a thread of their own, until stopped; counts the batches."""

    def __init__(self, pipeline: DetectorPipeline, records, raw, transforms):
        self.pipeline, self.records, self.raw, self.transforms = pipeline, records, raw, transforms
        self.batches = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="va-convoy-host", daemon=True)
        self._clock = 0.0
        self.seconds = 0.0

    def _loop(self) -> None:
        torch.set_num_threads(1)
        device = self.pipeline.device
        while not self._stop.is_set():
            timer = StageTimer(device, stage_sync=False, batch_sync=False)
            timer.begin_batch(len(self.records))
            with timer.stage("preprocess"):
                self.pipeline._collate(self.records, timer, None)
            with timer.stage("postprocess"):
                self.pipeline._finish(self.records, self.raw, self.transforms, timer, None)
            self.batches += 1

    def __enter__(self) -> HostLoop:
        self._clock = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.seconds = time.perf_counter() - self._clock

    def rate(self) -> float:
        """Host batches per second over the block."""
        return self.batches / self.seconds


def _one_thread_setup(model: str, batch_size: int, preprocess: str, backend: str) -> tuple:
    """The model's core on `backend` on one CPU thread, its preprocessing, thresholds and a batch of sample records."""
    device = parse_device("cpu")
    detector = get_detector(model)
    spec = resolve_implementation(detector.preprocess, preprocess, False)
    options = BackendOptions.from_config(RunConfig(backends=[backend], device="cpu", batch_sizes=[batch_size]))
    core = load_detector_core(detector, backend, device, "fp32", spec.input_size, options=options, threads=1)
    d = detector.defaults
    dataset = CocoDataset()
    records = dataset.records(dataset.variant("sample"))[:batch_size]
    return device, detector, spec, core, Thresholds(d.conf, d.iou, d.max_det), records


def measure(model: str, batch_size: int, preprocess: str, rounds: int, calls: int, stand_in_size: int) -> dict:
    """The stand-in forward's ms per call alone and beside each way, and the work each way did per second."""
    device, detector, spec, core, thresholds, records = _one_thread_setup(model, batch_size, preprocess, "pytorch")
    module = core.torch_module
    pipelines = {"thread": DetectorPipeline(detector, core, device, spec, thresholds, host_thread=False),
                 "process": DetectorPipeline(detector, core, device, spec, thresholds, host_thread=False,
                                             host_processes=1) if spec.library != "torch" else None}
    timer = StageTimer(device)
    timer.begin_batch(batch_size)
    batch, transforms = pipelines["thread"]._collate(records, timer, None)
    with torch.inference_mode():
        raw = core(batch)  # the model's real outputs for the batch, which the finishing selects from each time
    stand_in = torch.rand(1, 3, stand_in_size, stand_in_size)

    def forward_ms() -> float:
        clock = time.perf_counter()
        with torch.inference_mode():
            for _ in range(calls):
                module(stand_in)
        return (time.perf_counter() - clock) / calls * 1e3

    call_loops = {"calls_thread": CallsLoop(in_process=False), "calls_process": CallsLoop(in_process=True)}
    ways = [*call_loops, *(w for w in ("thread", "process") if pipelines[w] is not None)]

    def beside(way: str):
        if way in call_loops:
            return call_loops[way]
        return HostLoop(pipelines[way], records, raw, transforms)

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        forward_ms()  # warm-up: the module's first calls, and each way once
        for way in ways:
            with beside(way):
                forward_ms()
        per_call: dict[str, list[float]] = {w: [] for w in ["alone", *ways]}
        host_rate: dict[str, list[float]] = {w: [] for w in ways}
        for _ in range(rounds):
            per_call["alone"].append(forward_ms())
            for way in ways:
                with beside(way) as loop:
                    per_call[way].append(forward_ms())
                host_rate[way].append(loop.rate())
    finally:
        torch.set_num_threads(previous)
        call_loops["calls_process"].close()
    alone = per_call["alone"]
    result = {"model": model, "batch_size": batch_size, "preprocess": spec.library, "stand_in_input": stand_in_size,
              "calls_per_round": calls, "rounds": rounds,
              "forward_ms_alone_p50": round(statistics.median(alone), 4)}
    for way in ways:
        slowdown = [b / a for a, b in zip(alone, per_call[way], strict=True)]
        result[way] = {"forward_ms_p50": round(statistics.median(per_call[way]), 4),
                       "forward_vs_alone": round(statistics.median(slowdown), 3),
                       "forward_vs_alone_range": [round(min(slowdown), 3), round(max(slowdown), 3)],
                       "work_per_s": round(statistics.median(host_rate[way]), 2),
                       "work": f"rounds of {CALLS_PER_ROUND} tiny calls" if way in call_loops
                       else f"host batches of {batch_size}"}
    return result


class CountTorchCalls(TorchFunctionMode):
    """Counts the torch functions and tensor methods called from Python on this thread while active: each takes
    the interpreter lock, and on a GPU each tensor operation among them queues a kernel."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


def torch_calls_per_batch(model: str, batch_size: int, preprocess: str) -> dict:
    """The torch calls the run's own process makes for one batch's preparation and finishing (CPU, ONNX Runtime
    core), with the host stages on threads and with them in a host process."""
    device, detector, spec, core, thresholds, records = _one_thread_setup(model, batch_size, preprocess, "onnxruntime")
    counts = {}
    for way, processes in (("threads", 0), ("processes", 1)):
        pipeline = DetectorPipeline(detector, core, device, spec, thresholds, host_thread=False,
                                    host_processes=processes)
        timer = StageTimer(device)
        timer.begin_batch(batch_size)
        for _ in range(2):  # the second batch: a decoder's caches are made on the first
            with CountTorchCalls() as preparing:
                batch, transforms = pipeline._collate(records, timer, None)
            raw = core(batch)
            with CountTorchCalls() as finishing:
                pipeline._finish(records, raw, transforms, timer, None)
        counts[way] = {"preprocess": preparing.calls, "postprocess": finishing.calls}
    return counts


def handover(model: str, batch_size: int, preprocess: str, calls: int) -> dict:
    """The run's processor time per call handed to one host process (ms, p50 of `calls`): an empty call, preparing
    a batch of real images, and waiting in the child as long as the preparation took; and the torch calls the run
    makes per batch with the host stages on threads and in host processes."""
    detector = get_detector(model)
    spec = resolve_implementation(detector.preprocess, preprocess, False)
    dataset = CocoDataset()
    paths = [r.path for r in dataset.records(dataset.variant("sample"))[:batch_size]]
    torch_calls = torch_calls_per_batch(model, batch_size, preprocess)
    processes = HostProcesses(1)
    try:
        def per_call(fn) -> tuple[float, float]:
            for _ in range(3):
                fn()
            cpu, wall = [], []
            for _ in range(calls):
                c, w = time.process_time(), time.perf_counter()
                fn()
                cpu.append(time.process_time() - c)
                wall.append(time.perf_counter() - w)
            return statistics.median(cpu) * 1e3, statistics.median(wall) * 1e3

        empty, _ = per_call(lambda: processes._call(os.getpid))
        prepare, prepare_wall = per_call(lambda: processes.prepare(paths, spec))
        waiting, _ = per_call(lambda: processes._call(time.sleep, prepare_wall / 1e3))
    finally:
        processes.close()
    return {"model": model, "batch_size": batch_size, "preprocess": spec.library, "calls": calls,
            "empty_call_cpu_ms": round(empty, 4), "prepare_cpu_ms": round(prepare, 4),
            "prepare_wall_ms": round(prepare_wall, 3), "waiting_cpu_ms": round(waiting, 4),
            "handover_cpu_ms": round(prepare - waiting, 4), "torch_calls_per_batch": torch_calls}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_argument(parser, "models", "--model", "yolox-nano")
    add_run_argument(parser, "batch_sizes", "--batch-size", 8)
    add_run_argument(parser, "preprocess", default="cv2")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200, help="stand-in forward calls per way and round")
    parser.add_argument("--stand-in-size", type=int, default=64, help="the stand-in forward's input side (pixels)")
    parser.add_argument("--handover", action="store_true",
                        help="measure what handing a batch to a host process costs the run's process instead")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if min(args.rounds, args.calls, args.stand_in_size) < 1:
        parser.error("--rounds, --calls and --stand-in-size must be positive")
    if args.handover:
        result = handover(args.model, args.batch_size, args.preprocess, args.calls // 5 or 1)
        print(json.dumps(result, indent=2) if args.json else
              f"handing a batch of {args.batch_size} to a host process ({result['preprocess']}), the run's processor "
              f"time a call: empty {result['empty_call_cpu_ms']:.3f} ms; preparing {result['prepare_cpu_ms']:.3f} ms "
              f"({result['prepare_wall_ms']:.1f} ms wall); waiting as long {result['waiting_cpu_ms']:.3f} ms; the "
              f"hand-over's own {result['handover_cpu_ms']:.3f} ms\n"
              + "torch calls in the run's process a batch (preparation + finishing): " + "; ".join(
                  f"{way} {c['preprocess']} + {c['postprocess']}"
                  for way, c in result["torch_calls_per_batch"].items()))
        return 0
    result = measure(args.model, args.batch_size, args.preprocess, args.rounds, args.calls, args.stand_in_size)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"{result['model']} stand-in forward ({args.stand_in_size}x{args.stand_in_size}, one thread): "
          f"{result['forward_ms_alone_p50']:.3f} ms a call alone")
    for way, what in (("calls_thread", "tiny tensor calls on a thread beside it"),
                      ("calls_process", "the same calls in a process"),
                      ("thread", f"{result['preprocess']} host stages on a thread beside it"),
                      ("process", "the same stages in a host process")):
        if way not in result:
            continue
        r = result[way]
        low, high = r["forward_vs_alone_range"]
        print(f"  {what}: {r['forward_ms_p50']:.3f} ms a call = {r['forward_vs_alone']:.2f}x alone "
              f"({low:.2f}-{high:.2f}); {r['work']}: {r['work_per_s']:.1f}/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
