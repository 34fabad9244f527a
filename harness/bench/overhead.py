"""Pipeline overhead: images/s of the whole pipeline / images/s of the core forward alone, at one batch
size, per backend, in both execution modes: latency mode (stages one
after another, `run_batch`) and overlapped mode (host work overlapped with the forward,
`run_overlapped`, with each `--workers` count asked for). Rounds alternate the modes in one process,
because timings of small models drift between processes; the reported ratios are medians over rounds.
The target applies to each backend's throughput mode, the better of latency mode and overlapped mode
at the first `--workers` value (default auto, what a run uses): overlapping only pays where the forward
leaves cores idle (ONNX Runtime, whose threads do not spin; a GPU), not where its threads never yield
them (PyTorch's OpenMP on every core), so the harness offers both and this bench reports both.

`--busy N` runs N CPU-bound processes beside the measurement (a loaded machine);
the latency-mode stage medians show what the load does to the harness's own host work. `--calling-thread`
adds latency mode with the host stages on the calling thread, through the forward's torch thread team (the
design before the host thread; what the profiler pass still does), to the same alternating rounds.

For each overlapped stream the bench also says where the forward's thread spent it (its forward calls, waiting
for a prepared batch, waiting for a batch's finishing, the rest) and how much slower its forward calls were there
than the forward alone: the overhead split into contention and host work the forward could not hide.
`--finishes-in-flight N` lets N batches finish at once (handed out in order; default 1). `--per-image` letterboxes
(torch) and runs the NMS one image at a time, as a GPU run did before both were done for the whole batch at once.
`--host-processes N` (as `va-bench run --host-processes`) runs the reads, decode and letterbox (cv2 or PIL) and the
selection of host candidates in N processes, outside the interpreter lock (decode in the timed path; --workers auto
gives a worker a process). `--forward-process` (as `va-bench run --forward-process`) runs the pipelines' core in a
process of its own; the forward alone stays this process's core. Each overlapped stream also gives its forward stage
against the forward alone (with a forward process, that process's own clock).

`--decode`: `pre-decoded` hands the pipeline decoded images (the CPU figures in README), `in-path` decodes
inside the timed path from the JPEG bytes in memory, as a run does (`auto`: in-path on CUDA, where the
decode is what the device waits for, pre-decoded on CPU). `--preprocess` as `va-bench run --preprocess`
(auto: torch on CUDA, the family's own library on CPU).

    python -m harness.bench.overhead --batch-size 8 [--model yolox-nano [--weights random]] [--rounds 7]
                                     [--workers auto 2]
                                     [--device cuda] [--decode auto|in-path|pre-decoded]
                                     [--preprocess auto|cv2|torch|pil] [--busy 2] [--calling-thread]
                                     [--finishes-in-flight 2] [--per-image] [--host-processes N]
                                     [--forward-process] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace

import torch

from harness.backends import BackendOptions, detector_backends, load_detector_core
from harness.config import RunConfig, add_run_argument
from harness.data.cache import ImageBytes
from harness.data.coco import CocoDataset
from harness.measure.device import parse_device
from harness.measure.env import apply_tf32, tf32_state
from harness.models.registry import get_detector
from harness.pipeline.forward_process import CoreLoad, ForwardProcessCore
from harness.pipeline.pipeline import DetectorPipeline, Thresholds, resolve_workers
from harness.pipeline.preprocess import decode_image, preprocess_batch, resolve_implementation
from harness.pipeline.stage_timer import StageTimer

# Latency-mode stages whose per-batch medians are reported (the host stages and the forward beside them).
REPORTED_STAGES = ("preprocess", "preprocess.decode", "preprocess.upload", "transfer", "forward", "forward_gpu",
                   "postprocess", "postprocess.copy", "postprocess.nms", "postprocess.boxes")


def _images_per_s(fn, batch_size: int, iterations: int) -> float:
    start = time.perf_counter()
    for _ in range(iterations):
        fn()
    return batch_size * iterations / (time.perf_counter() - start)


def _mode_summary(pipeline_ips: list[float], forward_ips: list[float]) -> dict:
    ratios = [p / f for p, f in zip(pipeline_ips, forward_ips, strict=True)]  # each round against its own forward
    return {"images_per_s": round(statistics.median(pipeline_ips), 2),
            "ratio_median": round(statistics.median(ratios), 4),
            "ratio_min": round(min(ratios), 4), "ratio_max": round(max(ratios), 4)}


def _stage_medians(timer: StageTimer) -> dict:
    return {name: round(statistics.median(b.ms(name) for b in timer.batches), 3)
            for name in REPORTED_STAGES if all(name in b.stages for b in timer.batches)}


def _forward_thread_summary(rounds: list[dict], forward_ips: list[float], batch_size: int) -> dict:
    """Where the forward's thread spent the overlapped streams, ms per batch (median over rounds), and how much
    slower its forward calls were there than the forward alone (each round against its own forward-alone rate):
    above 1, the forward contends with the host work; waits are host work the forward could not hide."""
    parts = {name: round(statistics.median(r["ms_per_batch"][name] for r in rounds), 3)
             for name in rounds[0]["ms_per_batch"]}
    slowdown = [r["ms_per_batch"]["forward"] / (1000 * batch_size / f) for r, f in zip(rounds, forward_ips,
                                                                                       strict=True)]
    return {"ms_per_batch_p50": parts, "forward_vs_alone": round(statistics.median(slowdown), 3)}


def measure(model: str, backend: str, batch_size: int, rounds: int, iterations: int, device_spec: str,
            workers: list[int] | None = None, calling_thread: bool = False, decode: str = "auto",
            preprocess: str = "auto", nms_on: str = "device", cuda_graphs: bool = False,
            finishes_in_flight: int = 1, per_image: bool = False, host_processes: int = 0,
            forward_process: bool = False, weights: str | None = None) -> dict:
    """One backend's ratios; `workers`: the overlapped-mode worker counts to measure (default [1]);
    `calling_thread`: also latency mode with the host stages on the calling thread; `decode`: in-path,
    pre-decoded or auto (see the module docstring); `preprocess`: the resize implementation; `nms_on`: where a
    GPU run's selection runs (`va-bench run --nms-on`); `cuda_graphs`: the PyTorch forward replayed from a CUDA graph
    captured for the batch size (`--cuda-graphs`), in the pipeline and in the forward alone; `finishes_in_flight`:
    overlapped mode's bound on batches finishing at once; `per_image`: the torch letterbox and the NMS one image at a
    time (default: as a run does, the whole batch at once where the tensors are on a GPU); `host_processes`: the host
    stages in that many processes (`va-bench run --host-processes`; the decode then runs in the timed path);
    `forward_process`: the pipelines' core loaded and run in a process of its own (`va-bench run --forward-process`),
    the forward alone still this process's own core (the baseline); `weights`: as `va-bench run --weights` (a file,
    or `random` for a family's seeded random weights: a larger model's forward without its trained weights)."""
    workers = workers or [1]
    device = parse_device(device_spec)
    if host_processes and decode == "pre-decoded":
        raise SystemExit("--host-processes read and decode the files in the timed path; drop --decode pre-decoded")
    in_path = decode == "in-path" or (decode == "auto" and (device.is_cuda or bool(host_processes)))
    detector = get_detector(model, weights)
    spec = resolve_implementation(detector.preprocess, preprocess, device.is_cuda)
    if host_processes and spec.library == "torch":
        raise SystemExit("--host-processes letterbox on the host: add --preprocess cv2 (or pil)")
    options = BackendOptions.from_config(RunConfig(backends=[backend], device=device_spec, batch_sizes=[batch_size],
                                                   cuda_graphs=cuda_graphs))
    # TF32 as a run sets it process-wide, before its cores load: a forward process sets the same in its own, so the
    # pipeline's forward and the forward alone run the same kernels
    apply_tf32(options.tf32)
    core = load_detector_core(detector, backend, device, "fp32", spec.input_size, options=options,
                              threads=torch.get_num_threads())
    pipeline_core = ForwardProcessCore(CoreLoad(model, weights, backend, device, "fp32", spec.input_size, options,
                                                torch.get_num_threads())) if forward_process else core
    d = detector.defaults
    thresholds = Thresholds(d.conf, d.iou, d.max_det)
    dataset = CocoDataset()
    records = dataset.records(dataset.variant("sample"))[:batch_size]
    read = ImageBytes(records).read if in_path else None  # the JPEG bytes in memory, as a run's image cache
    whole_batch = False if per_image else None
    pipelines = {w: DetectorPipeline(detector, pipeline_core, device, spec, thresholds, stream_workers=w,
                                     read_image=read,
                                     nms_on=nms_on, finishes_in_flight=finishes_in_flight, whole_batch=whole_batch,
                                     host_processes=host_processes)
                 for w in workers}
    pipeline = pipelines[workers[0]]
    on_caller = (DetectorPipeline(detector, pipeline_core, device, spec, thresholds, host_thread=False,
                                  read_image=read,
                                  nms_on=nms_on, whole_batch=whole_batch)
                 if calling_thread else None)
    decoded = [decode_image(r.path) for r in records]
    images = None if in_path else decoded  # None: the pipeline decodes inside the timed path
    batch, _ = preprocess_batch(decoded, replace(spec, library="cv2"))  # the forward-only input: any letterbox
    if pipeline.input_device is not None:
        batch = batch.to(pipeline.input_device)
    timer, caller_timer = StageTimer(device), StageTimer(device)

    # the runtime's call as the pipeline makes it (OpenVINO: its borrowed-output call), timed here on the wall clock,
    # as the runtime's own loop is: for OpenVINO the pipeline's forward stage is the narrower OpenVINO clock
    forward = getattr(core, "forward_borrowed", core)

    def forward_only():
        forward(batch)
        device.synchronize()

    own_loop = runtime_own_loop(core, batch, device)

    def latency_mode():
        pipeline.run_batch(records, timer, images=images)

    def latency_on_caller():
        on_caller.run_batch(records, caller_timer, images=images)

    forward_thread: dict[int, list[dict]] = {w: [] for w in workers}  # per round: where the forward's thread went
    forward_stage: dict[int, list[float]] = {w: [] for w in workers}  # per round: the forward stage's median, ms

    def overlapped_mode(w: int):  # one call streams `iterations` batches
        pipelines[w].reset_forward_thread()
        stage = [timing.ms("forward") for _, timing in pipelines[w].run_overlapped(
            [records] * iterations, images=None if images is None else [images] * iterations)]
        forward_thread[w].append(pipelines[w].forward_thread.record())
        forward_stage[w].append(statistics.median(stage))

    for _ in range(3):  # warm-up every path
        forward_only()
        if own_loop is not None:
            own_loop()
        latency_mode()
        if on_caller is not None:
            latency_on_caller()
    for w in workers:
        overlapped_mode(w)
    timer.batches.clear()
    caller_timer.batches.clear()
    for w in workers:
        forward_thread[w].clear()
        forward_stage[w].clear()
    forward_ips, latency_ips, caller_ips, own_ips = [], [], [], []
    stream_ips: dict[int, list[float]] = {w: [] for w in workers}
    for k in range(rounds):
        # the forward and the runtime's own loop back to back, which one first alternating: the first of the
        # two runs right after the pipeline modes' host work (colder caches), the second does not
        if own_loop is not None and k % 2:
            own_ips.append(_images_per_s(own_loop, batch_size, iterations))
        forward_ips.append(_images_per_s(forward_only, batch_size, iterations))
        if own_loop is not None and not k % 2:
            own_ips.append(_images_per_s(own_loop, batch_size, iterations))
        latency_ips.append(_images_per_s(latency_mode, batch_size, iterations))
        if on_caller is not None:
            caller_ips.append(_images_per_s(latency_on_caller, batch_size, iterations))
        for w in workers:
            stream_ips[w].append(_images_per_s(lambda w=w: overlapped_mode(w), batch_size * iterations, 1))
    if pipeline_core is not core:  # the forward process ends with its measurement
        pipeline_core.close()
    latency = _mode_summary(latency_ips, forward_ips)
    latency["stages_ms_p50"] = _stage_medians(timer)
    # the forward stage inside the stream against the forward alone, each round against its own: with a forward
    # process that process's own clock (the forward thread's calls are then the hand-over and the waits)
    by_workers = {str(w): {**_mode_summary(stream_ips[w], forward_ips),
                           "forward_thread": _forward_thread_summary(forward_thread[w], forward_ips, batch_size),
                           "forward_stage_vs_alone": round(statistics.median(
                               ms / (1000 * batch_size / f) for ms, f in zip(forward_stage[w], forward_ips,
                                                                             strict=True)), 3)}
                  for w in workers}
    overlapped = by_workers[str(workers[0])]
    extra = {}
    if on_caller is not None:
        extra["latency_mode_calling_thread"] = {**_mode_summary(caller_ips, forward_ips),
                                                "stages_ms_p50": _stage_medians(caller_timer)}
    return {
        "model": model, "weights": weights or "the model's own", "backend": backend, "batch_size": batch_size,
        "device": str(device), **extra,
        "decode": "in the timed path (JPEG bytes in memory)" if in_path else "pre-decoded (not timed)",
        "preprocess": pipeline.preprocess_info(), "selection_on": pipeline.selection_on, "nms": pipeline.nms_calls,
        "cuda_graphs": cuda_graphs, "host_processes": host_processes, "forward_process": forward_process,
        "tf32": tf32_state(options.tf32),
        "forward_images_per_s": round(statistics.median(forward_ips), 2),
        "runtime_own_loop": {"images_per_s": round(statistics.median(own_ips), 2),
                             "forward_time_vs_own": round(statistics.median(
                                 o / f for o, f in zip(own_ips, forward_ips, strict=True)), 3),  # per round
                             "what": own_loop.what} if own_loop is not None else
        {"status": "unavailable", "reason": f"no plain loop of the {core.backend} API here"},
        "latency_mode": latency, "overlapped_mode": overlapped, "workers": workers[0],
        "finishes_in_flight": pipeline.finishes_in_flight,
        "overlapped_by_workers": by_workers, "rounds": rounds,
        "throughput_mode": "overlapped_mode" if overlapped["ratio_median"] > latency["ratio_median"]
        else "latency_mode",
    }


def runtime_own_loop(core, batch: torch.Tensor, device):
    """The runtime's own API in a plain loop on the same model, threads and input (the figure a user checks the
    harness's forward against), or None for a runtime without one here. ONNX Runtime: a session with its default
    options but the core's thread count; OpenVINO: a request of the same model and properties; PyTorch: the module
    under inference mode."""
    if core.backend == "onnxruntime" and getattr(core, "_model", None) is not None and not device.is_cuda:
        import onnxruntime as ort

        options = ort.SessionOptions()
        if core.threads:
            options.intra_op_num_threads = core.threads
        session = ort.InferenceSession(core._model.SerializeToString(), options, providers=["CPUExecutionProvider"])
        feed = {session.get_inputs()[0].name: batch.numpy()}

        def loop():
            session.run(None, feed)

        loop.what = "onnxruntime.InferenceSession defaults (spinning on), same threads, same input"
        return loop
    if core.backend == "openvino" and getattr(core, "_model", None) is not None:
        import openvino as ov

        from harness.backends.openvino import openvino_runtime

        model = core._model.clone()
        model.reshape({0: list(batch.shape)})
        request = openvino_runtime().compile_model(model, "CPU", core.properties).create_infer_request()
        request.set_input_tensor(ov.Tensor(batch.numpy().copy()))

        def loop():
            request.infer()

        loop.what = ("an OpenVINO infer request of the same model and properties, its input set once, synchronous "
                     "infer() (benchmark_app's sync API)")
        return loop
    module = getattr(core, "torch_module", None)
    if core.backend == "pytorch" and module is not None and getattr(core, "dtype", None) is None:
        def loop():
            with torch.inference_mode():
                module(batch)
            device.synchronize()

        loop.what = "the torch module under torch.inference_mode(), same threads, same input"
        return loop
    return None


@contextmanager
def busy_processes(count: int) -> Iterator[None]:
    """`count` CPU-bound processes (a Python busy loop each) for the duration of the block."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait()


def _worker_counts(values: list[str], cuda: bool, host_processes: int = 0) -> list[int]:
    counts = []
    for value in values:
        if value != "auto" and not (value.isdigit() and int(value) >= 1):
            raise SystemExit(f"--workers {value!r}: use positive integers or auto")
        counts.append(resolve_workers(value, cuda, host_processes))
    return list(dict.fromkeys(counts))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_argument(parser, "models", "--model", "yolox-nano")
    add_run_argument(parser, "weights")
    add_run_argument(parser, "backends", None, None, nargs="+", help="default: all the model's backends")
    add_run_argument(parser, "batch_sizes", "--batch-size", 8)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--iterations", type=int, default=20, help="batches per round (and per stream)")
    add_run_argument(parser, "device")
    parser.add_argument("--workers", nargs="+", default=["auto"],
                        help="overlapped-mode host worker counts (N or auto); the first is judged")
    parser.add_argument("--busy", type=int, default=0, help="CPU-bound processes to run beside the measurement")
    parser.add_argument("--calling-thread", action="store_true",
                        help="also latency mode with the host stages on the calling thread (not judged)")
    parser.add_argument("--decode", choices=("auto", "in-path", "pre-decoded"), default="auto",
                        help="decode inside the timed path or hand the pipeline decoded images (auto: in-path on "
                             "CUDA, pre-decoded on CPU)")
    add_run_argument(parser, "preprocess")
    add_run_argument(parser, "nms_on")
    parser.add_argument("--cuda-graphs", action="store_true", help="PyTorch on CUDA: replay the forward from a CUDA "
                        "graph (as `va-bench run --cuda-graphs`), in the pipeline and the forward alone")
    parser.add_argument("--finishes-in-flight", type=int, default=1,
                        help="overlapped mode: batches finishing (post-processing) at once, handed out in order")
    parser.add_argument("--per-image", action="store_true",
                        help="the torch letterbox and the NMS one image at a time (a GPU run's way before)")
    add_run_argument(parser, "host_processes")
    add_run_argument(parser, "forward_process")
    parser.add_argument("--target", type=float, default=0.90)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    if args.finishes_in_flight < 1:
        parser.error(f"--finishes-in-flight {args.finishes_in_flight}: use a positive number of batches")
    backends = args.backend or [b for b in detector_backends(get_detector(args.model, args.weights, fetch=False))
                                if args.batch_size == 1 or b != "ncnn"]  # ncnn runs one image per call
    workers = _worker_counts(args.workers, parse_device(args.device).is_cuda, args.host_processes)
    with busy_processes(args.busy):
        results = [measure(args.model, b, args.batch_size, args.rounds, args.iterations, args.device, workers,
                           args.calling_thread, args.decode, args.preprocess, args.nms_on, args.cuda_graphs,
                           args.finishes_in_flight, args.per_image, args.host_processes, args.forward_process,
                           args.weights)
                   for b in backends]
    for r in results:
        r["busy_processes"] = args.busy
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        from rich.console import Console
        from rich.table import Table

        busy = f", {args.busy} busy processes beside" if args.busy else ""
        decoding = "decode timed" if results[0]["decode"].startswith("in the timed path") else "images pre-decoded"
        table = Table(title=f"pipeline overhead, batch {args.batch_size}, {results[0]['device']}, {decoding}{busy} "
                            f"(target ratio >= {args.target})")
        for col in ("backend", "mode", "forward img/s", "pipeline img/s", "ratio p50", "ratio range"):
            table.add_column(col, justify="right", no_wrap=True)
        for r in results:
            rows = [("latency", r["latency_mode"], r["throughput_mode"] == "latency_mode")]
            if "latency_mode_calling_thread" in r:
                rows.append(("latency, host on calling thread", r["latency_mode_calling_thread"], False))
            rows += [(f"overlapped, {w} worker{'s' * (w != '1')}", m,
                      r["throughput_mode"] == "overlapped_mode" and w == str(r["workers"]))
                     for w, m in r["overlapped_by_workers"].items()]
            for name, m, judged in rows:
                table.add_row(r["backend"], name + (" *" if judged else ""), f"{r['forward_images_per_s']:.1f}",
                              f"{m['images_per_s']:.1f}", f"{m['ratio_median']:.3f}",
                              f"{m['ratio_min']:.3f}-{m['ratio_max']:.3f}")
        console = Console(width=max(100, Console().width))  # the table's rows stay whole in a log too
        console.print(table)
        console.print("* the backend's throughput mode (the better one), judged against the target")
        for r in results:
            own = r["runtime_own_loop"]
            console.print(f"{r['backend']} runtime's own loop: " + (
                f"{own['images_per_s']:.1f} img/s; the harness's forward takes {own['forward_time_vs_own']:.3f}x its "
                f"time ({own['what']})" if "images_per_s" in own else f"unavailable: {own['reason']}"))
        for r in results:
            for w, m in r["overlapped_by_workers"].items():
                spent = m["forward_thread"]
                parts = ", ".join(f"{k.replace('_', ' ')} {v:.2f}" for k, v in spent["ms_per_batch_p50"].items())
                console.print(f"{r['backend']} overlapped, {w} worker(s): the forward's thread, ms per batch (p50): "
                              f"{parts}; its forward calls took {spent['forward_vs_alone']:.3f}x the forward alone, "
                              f"the forward stage {m['forward_stage_vs_alone']:.3f}x")
        for r in results:
            for mode, where in (("latency_mode", "host thread"), ("latency_mode_calling_thread", "calling thread")):
                if mode in r:
                    stages = ", ".join(f"{k} {v:.2f}" for k, v in r[mode]["stages_ms_p50"].items())
                    console.print(f"{r['backend']} latency mode, host stages on the {where}, ms per batch (p50): "
                                  f"{stages}")
    return 0 if all(r[r["throughput_mode"]]["ratio_median"] >= args.target for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
