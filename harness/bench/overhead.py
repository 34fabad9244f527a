"""Pipeline overhead: images/s of the whole pipeline (images already decoded) / images/s of the core
forward alone, at one batch size, per backend, in both execution modes: latency mode (stages one
after another, `run_batch`) and overlapped mode (host work overlapped with the forward,
`run_overlapped`). Rounds alternate the three in one process, because timings of small models drift
between processes; the reported ratios are medians over rounds. The target applies to each backend's
throughput mode, the better of the two: overlapping only pays where the forward leaves cores idle (ONNX
Runtime, whose threads do not spin; a GPU), not where its threads never yield them (PyTorch's OpenMP on
every core), so the harness offers both and this bench reports both.

    python -m harness.bench.overhead --batch-size 8 [--model yolox-nano] [--rounds 7] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from harness.data.coco import CocoDataset
from harness.measure.device import parse_device
from harness.models.registry import get_detector
from harness.pipeline.pipeline import DetectorPipeline, Thresholds
from harness.pipeline.preprocess import decode_image, preprocess_batch
from harness.pipeline.stage_timer import StageTimer


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


def measure(model: str, backend: str, batch_size: int, rounds: int, iterations: int, device_spec: str) -> dict:
    device = parse_device(device_spec)
    detector = get_detector(model)
    spec = detector.preprocess
    core = detector.load_core(backend, device, "fp32", spec.input_size, threads=torch.get_num_threads())
    d = detector.defaults
    pipeline = DetectorPipeline(detector, core, device, spec, Thresholds(d.conf, d.iou, d.max_det))
    dataset = CocoDataset()
    records = dataset.records(dataset.variant("sample"))[:batch_size]
    images = [decode_image(r.path) for r in records]
    batch, _ = preprocess_batch(images, spec)
    if pipeline.input_device is not None:
        batch = batch.to(pipeline.input_device)
    timer = StageTimer(device)

    def forward_only():
        core(batch)
        device.synchronize()

    def latency_mode():
        pipeline.run_batch(records, timer, images=images)

    def overlapped_mode():  # one call streams `iterations` batches
        for _ in pipeline.run_overlapped([records] * iterations, images=[images] * iterations):
            pass

    for _ in range(3):  # warm-up every path
        forward_only()
        latency_mode()
    overlapped_mode()
    forward_ips, latency_ips, stream_ips = [], [], []
    for _ in range(rounds):
        forward_ips.append(_images_per_s(forward_only, batch_size, iterations))
        latency_ips.append(_images_per_s(latency_mode, batch_size, iterations))
        stream_ips.append(_images_per_s(overlapped_mode, batch_size * iterations, 1))
    latency, overlapped = _mode_summary(latency_ips, forward_ips), _mode_summary(stream_ips, forward_ips)
    return {
        "model": model, "backend": backend, "batch_size": batch_size, "device": str(device),
        "forward_images_per_s": round(statistics.median(forward_ips), 2),
        "latency_mode": latency, "overlapped_mode": overlapped, "rounds": rounds,
        "throughput_mode": "overlapped_mode" if overlapped["ratio_median"] > latency["ratio_median"]
        else "latency_mode",
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="yolox-nano")
    parser.add_argument("--backend", action="append", help="repeatable; default: all the model's backends")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--iterations", type=int, default=20, help="batches per round (and per stream)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--target", type=float, default=0.90)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    backends = args.backend or list(get_detector(args.model).backends)
    results = [measure(args.model, b, args.batch_size, args.rounds, args.iterations, args.device) for b in backends]
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=f"pipeline overhead, batch {args.batch_size} (target ratio >= {args.target})")
        for col in ("backend", "mode", "forward img/s", "pipeline img/s", "ratio p50", "ratio range"):
            table.add_column(col, justify="right", no_wrap=True)
        for r in results:
            for mode in ("latency_mode", "overlapped_mode"):
                m = r[mode]
                name = mode.replace("_mode", "") + (" *" if mode == r["throughput_mode"] else "")
                table.add_row(r["backend"], name, f"{r['forward_images_per_s']:.1f}",
                              f"{m['images_per_s']:.1f}", f"{m['ratio_median']:.3f}",
                              f"{m['ratio_min']:.3f}-{m['ratio_max']:.3f}")
        console = Console(width=max(100, Console().width))  # the table's rows stay whole in a log too
        console.print(table)
        console.print("* the backend's throughput mode (the better one), judged against the target")
    return 0 if all(r[r["throughput_mode"]]["ratio_median"] >= args.target for r in results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
