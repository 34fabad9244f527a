"""Does the layer probe leak into timing? In one process, on one loaded model: timing pass, layer pass
(hooks added, then removed), timing pass again, repeated; compares the forward-stage p50 before and
after each layer pass. Prints the figures; exit 1 if the median change exceeds the threshold.

    python -m harness.bench.hook_leak [--backend pytorch] [--batch-size 8] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

import torch

from harness.backends import BackendOptions, load_detector_core
from harness.config import RunConfig, add_run_argument
from harness.data.coco import CocoDataset
from harness.measure.device import Device
from harness.models.registry import get_detector
from harness.pipeline.pipeline import DetectorPipeline, Thresholds
from harness.pipeline.stage_timer import StageTimer
from harness.run.executor import layer_pass


def forward_p50(pipeline: DetectorPipeline, batches, device: Device) -> float:
    timer = StageTimer(device)
    for batch in batches:
        pipeline.run_batch(batch, timer)
    return statistics.median(b.ms("forward") for b in timer.batches)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_run_argument(parser, "models", "--model", "yolox-nano")
    add_run_argument(parser, "backends", "--backend", "pytorch")
    add_run_argument(parser, "batch_sizes", "--batch-size", 8)
    parser.add_argument("--batches", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threshold", type=float, default=0.03)
    args = parser.parse_args(argv)
    device = Device("cpu")
    detector = get_detector(args.model)
    options = BackendOptions.from_config(RunConfig(backends=[args.backend], batch_sizes=[args.batch_size]))
    core = load_detector_core(detector, args.backend, device, "fp32", detector.preprocess.input_size, options=options,
                              threads=torch.get_num_threads())
    d = detector.defaults
    pipeline = DetectorPipeline(detector, core, device, detector.preprocess, Thresholds(d.conf, d.iou, d.max_det))
    dataset = CocoDataset()
    records = dataset.records(dataset.variant("sample"))
    batches = [records[i:i + args.batch_size] for i in range(0, args.batch_size * args.batches, args.batch_size)]
    forward_p50(pipeline, batches[:3], device)  # warm-up
    before, after = [], []
    with tempfile.TemporaryDirectory(prefix="va-bench-hook-leak-") as work:
        for _ in range(args.rounds):
            before.append(forward_p50(pipeline, batches, device))
            layer_pass(pipeline, batches[:3], Path(work), Path(work) / "ort_profile.json")
            after.append(forward_p50(pipeline, batches, device))
    changes = [a / b - 1 for a, b in zip(after, before, strict=True)]
    result = {"backend": args.backend, "batch_size": args.batch_size, "forward_p50_ms_before": before,
              "forward_p50_ms_after_layer_pass": after, "relative_change": [round(c, 4) for c in changes],
              "median_change": round(statistics.median(changes), 4), "threshold": args.threshold}
    print(json.dumps(result, indent=2))
    return 0 if abs(result["median_change"]) <= args.threshold else 1


if __name__ == "__main__":
    raise SystemExit(main())
