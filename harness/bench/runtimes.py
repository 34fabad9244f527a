"""`make bench-runtimes`: the converting runtimes side by side, and OpenVINO against its own benchmark tool.

1. OpenVINO fp32, batch 1: the harness's forward p50 against `benchmark_app -hint none -api sync -nstreams 1
   -nthreads N -infer_precision f32` on the same IR (the one the harness converted and cached) and the same
   thread count, each in a fresh process, alternating which goes first, `--repeats` rounds; the ratio of the
   medians (goal: within 5 %), and beside it the ratio of each side's fastest round and the median of the
   rounds' own ratios (each round's two processes ran back to back).
2. Forward p50 per runtime x precision x batch size with the mAP of each cell, yolox-nano on the first
   `--limit` sample images (int8 calibrated on the others).

    python -m harness.bench.runtimes [--threads 2] [--repeats 3] [--limit 106] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from harness.config import add_run_argument

MATRIX = (("onnxruntime", ("fp32",), (1, 4)), ("openvino", ("fp32", "fp16", "int8"), (1, 4)),
          ("ncnn", ("fp32", "fp16"), (1,)), ("tflite", ("fp32", "fp16", "int8"), (1, 4)),
          ("torchscript", ("fp32",), (1, 4)))
MEDIAN_LINE = re.compile(r"Median:\s+([\d.]+) ms")


def _va_bench(out: Path, *args: str) -> list[dict]:
    """`va-bench run ARGS` in a fresh process; its submissions."""
    command = [str(Path(sys.executable).with_name("va-bench")), "run", "--model", "yolox-nano", "--no-energy",
               "--draw-images", "0", "--output-dir", str(out), *args]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return [json.loads(p.read_text()) for p in sorted(out.glob("*/submissions/*.json"))]


def harness_forward_p50(out: Path, threads: int, batches: int) -> tuple[float, str]:
    """The harness's OpenVINO fp32 batch-1 forward p50 (ms) and the IR it ran."""
    doc = _va_bench(out, "--backend", "openvino", "--batch-sizes", "1", "--threads", str(threads), "--limit", "32",
                    "--no-accuracy", "--min-timed-batches", str(batches), "--warmup-seconds", "2")[0]
    return doc["timing"]["stages_ms"]["forward"]["p50"], doc["runtime"]["conversion"]["ir_file"]


def benchmark_app_p50(ir: str, threads: int, seconds: int, size: int) -> float:
    """OpenVINO's own benchmark_app, synchronous, one stream, f32, on the same IR: its median latency (ms)."""
    tool = Path(sys.executable).with_name("benchmark_app")
    command = [str(tool), "-m", ir, "-d", "CPU", "-shape", f"[1,3,{size},{size}]", "-hint", "none", "-api", "sync",
               "-nstreams", "1", "-nthreads", str(threads), "-infer_precision", "f32", "-t", str(seconds)]
    done = subprocess.run(command, capture_output=True, text=True)
    match = MEDIAN_LINE.search(done.stdout)
    if done.returncode != 0 or match is None:
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}:\n{(done.stdout + done.stderr)[-2000:]}")
    return float(match.group(1))


def compare_with_benchmark_app(threads: int, repeats: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="va-bench-runtimes-") as tmp:
        ours, theirs = [], []
        for k in range(repeats):
            order = ("harness", "tool") if k % 2 == 0 else ("tool", "harness")
            for which in order:
                if which == "harness":
                    p50, ir = harness_forward_p50(Path(tmp) / f"h{k}", threads, batches=300)
                    ours.append(p50)
                else:
                    if not ours:  # the IR exists once the harness converted it: convert first
                        p50, ir = harness_forward_p50(Path(tmp) / "convert", threads, batches=10)
                    theirs.append(benchmark_app_p50(ir, threads, seconds=5, size=416))
            print(f"round {k + 1}: harness {ours[-1]:.2f} ms, benchmark_app {theirs[-1]:.2f} ms", flush=True)
    harness, tool = statistics.median(ours), statistics.median(theirs)
    # On a shared host a process lands in a fast or a slow mode (benchmark_app alone: 11.2 or 16.5 ms here), so
    # the fastest round of each, where neither met a neighbour, is printed beside the judged ratio of medians
    return {"threads": threads, "harness_forward_p50_ms": ours, "benchmark_app_median_ms": theirs,
            "ratio_of_medians": round(harness / tool, 4), "ratio_of_fastest_rounds": round(min(ours) / min(theirs), 4),
            "median_of_round_ratios": round(statistics.median(o / t for o, t in zip(ours, theirs, strict=True)), 4),
            "goal": "within 5 % (0.95-1.05)",
            "load_average": [round(v, 2) for v in os.getloadavg()]}


def runtime_matrix(threads: int, limit: int) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="va-bench-runtimes-") as tmp:
        for backend, precisions, batches in MATRIX:
            for precision in precisions:
                docs = _va_bench(Path(tmp) / f"{backend}-{precision}", "--backend", backend, "--precision", precision,
                                 "--batch-sizes", *map(str, batches), "--threads", str(threads), "--limit", str(limit))
                for doc in docs:
                    stages = doc["timing"]["stages_ms"]
                    verdict = (doc.get("eval") or {}).get("int8_vs_fp32")
                    rows.append({"backend": backend, "precision": precision, "batch": doc["config"]["batch_size"],
                                 "compute": doc["runtime"].get("compute_precision"),
                                 "forward_p50_ms": stages["forward"]["p50"],
                                 "forward_per_image_ms": round(stages["forward"]["p50"] / doc["config"]["batch_size"],
                                                               3),
                                 "mAP_50_95": doc["accuracy"].get("mAP_50_95"),
                                 "int8_kept": verdict.get("kept") if verdict else None})
                    print(_row(rows[-1]), flush=True)
    return rows


def _row(r: dict) -> str:
    kept = f"  int8 keeps {r['int8_kept']:.3f}" if r["int8_kept"] is not None else ""
    return (f"{r['backend']:<12} {r['precision']:<5} b{r['batch']:<2} compute {str(r['compute']):<28} forward p50 "
            f"{r['forward_p50_ms']:8.2f} ms ({r['forward_per_image_ms']:.2f}/image)  mAP {r['mAP_50_95']:.4f}{kept}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_run_argument(parser, "threads", default=2)
    parser.add_argument("--repeats", type=int, default=3)
    add_run_argument(parser, "limit", default=106)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    comparison = compare_with_benchmark_app(args.threads, args.repeats)
    ours, theirs = comparison["harness_forward_p50_ms"], comparison["benchmark_app_median_ms"]
    print(f"OpenVINO fp32 b1 forward p50, {args.threads} threads: harness {statistics.median(ours):.2f} ms vs "
          f"benchmark_app {statistics.median(theirs):.2f} ms: ratio {comparison['ratio_of_medians']:.3f} "
          f"(goal 0.95-1.05; fastest rounds {min(ours):.2f} vs {min(theirs):.2f} ms: "
          f"{comparison['ratio_of_fastest_rounds']:.3f}; median of the rounds' ratios "
          f"{comparison['median_of_round_ratios']:.3f})")
    matrix = runtime_matrix(args.threads, args.limit)
    if args.json:
        print(json.dumps({"openvino_vs_benchmark_app": comparison, "matrix": matrix}, indent=2))


if __name__ == "__main__":
    main()
