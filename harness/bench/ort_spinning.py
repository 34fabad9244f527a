"""ONNX Runtime's thread spinning: the harness's forward in each spinning mode against a plain ONNX Runtime loop
(the runtime's defaults), interleaved in one process on the same graph, threads and input; then the latency-mode
pipeline's images/s in each mode (the host stages must not pay for the forward's speed).

    python -m harness.bench.ort_spinning [--rounds 7] [--iterations 30] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import onnxruntime as ort
import torch

from harness.backends import BackendOptions
from harness.backends.onnxruntime import SPINNING, OnnxRuntimeCore
from harness.config import RunConfig, add_run_argument
from harness.data.coco import CocoDataset
from harness.measure.device import Device
from harness.models.registry import get_detector
from harness.pipeline.pipeline import DetectorPipeline, Thresholds
from harness.pipeline.stage_timer import StageTimer


def _median_ms(call, iterations: int) -> float:
    times = []
    for _ in range(iterations):
        start = time.perf_counter_ns()
        call()
        times.append((time.perf_counter_ns() - start) / 1e6)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--iterations", type=int, default=30)
    add_run_argument(parser, "threads", default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    detector = get_detector("yolox-nano")
    graph = detector.onnx_model  # its batch, height and width symbolic
    options = BackendOptions.from_config(RunConfig())
    cpu = Device("cpu")
    cores = {mode: OnnxRuntimeCore(graph, cpu, args.threads, spinning=mode, options=options) for mode in SPINNING}
    session_options = ort.SessionOptions()
    session_options.intra_op_num_threads = args.threads
    plain = ort.InferenceSession(graph.SerializeToString(), session_options, providers=["CPUExecutionProvider"])
    name = plain.get_inputs()[0].name
    result: dict = {"threads": args.threads, "rounds": args.rounds, "modes": SPINNING}
    for batch in (1, 8):
        x = torch.rand(batch, 3, *detector.preprocess.input_size) * 255
        feed = {name: x.numpy()}
        calls = {mode: (lambda c=core, x=x: c(x)) for mode, core in cores.items()}
        calls["plain"] = lambda feed=feed: plain.run(None, feed)
        for call in calls.values():
            _median_ms(call, 5)
        per_round: dict[str, list[float]] = {k: [] for k in calls}
        for _ in range(args.rounds):  # interleaved: the box's drift reaches every variant alike
            for k in calls:
                per_round[k].append(_median_ms(calls[k], args.iterations))
        p50 = {k: statistics.median(v) for k, v in per_round.items()}
        result[f"forward_p50_ms_b{batch}"] = {k: round(v, 3) for k, v in p50.items()}
        result[f"forward_vs_plain_b{batch}"] = {k: round(v / p50["plain"], 3) for k, v in p50.items()}
    coco = CocoDataset()
    records = coco.records(coco.variant("sample"))[:32]
    d = detector.defaults
    pipelines = {mode: DetectorPipeline(detector, core, cpu, detector.preprocess, Thresholds(d.conf, d.iou, d.max_det))
                 for mode, core in cores.items()}
    for batch in (1, 8):
        batches = [records[i:i + batch] for i in range(0, len(records), batch)]
        for pipeline in pipelines.values():
            pipeline.run_batch(batches[0], StageTimer(cpu))
        rates: dict[str, list[float]] = {mode: [] for mode in pipelines}
        for _ in range(args.rounds):
            for mode, pipeline in pipelines.items():
                timer = StageTimer(cpu)
                for b in batches:
                    pipeline.run_batch(b, timer)
                rates[mode].append(len(records) / (sum(t.ms("total") for t in timer.batches) / 1000))
        result[f"pipeline_images_per_s_b{batch}"] = {m: round(statistics.median(v), 1) for m, v in rates.items()}
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
