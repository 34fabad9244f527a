"""`make bench-runtimes`: the converting runtimes side by side, and OpenVINO against its own benchmark tool.

1. OpenVINO fp32, batch 1: the harness's forward p50 against `benchmark_app -hint none -api sync -nstreams 1
   -nthreads N -infer_precision f32` on the same IR (the one the harness converted and cached), the same thread
   count and as many timed inferences, the two processes time-sliced (harness/bench/time_sliced.py: each stopped
   while the other runs, a quarter second for the harness and the matching share for benchmark_app, so that
   both complete as many inferences per slice), so both sample the same seconds of a shared host;
   `--repeats` rounds, the median of the rounds' ratios (goal: within 5 %). Each round also slices a plain
   `infer()` loop against benchmark_app (harness/bench/openvino_loop.py): the control, whose ratio is what the
   comparison itself adds.
2. Forward p50 per runtime x precision x batch size with the mAP of each cell, yolox-nano on the first
   `--limit` sample images (int8 calibrated on the others). OpenVINO's forward is its own clock (the binding's
   hand-over is in transfer); the other runtimes' is the wall time of their call, binding included.

    python -m harness.bench.runtimes [--threads 2] [--repeats 3] [--batches 800] [--limit 106] [--json]
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

from harness.bench.openvino_loop import LOOP_STARTS
from harness.bench.time_sliced import SlicedProcess, run_time_sliced
from harness.config import add_run_argument

MATRIX = (("onnxruntime", ("fp32",), (1, 4)), ("openvino", ("fp32", "fp16", "int8"), (1, 4)),
          ("ncnn", ("fp32", "fp16"), (1,)), ("tflite", ("fp32", "fp16", "int8"), (1, 4)),
          ("torchscript", ("fp32",), (1, 4)))
MEDIAN_LINE = re.compile(r"Median:\s+([\d.]+) ms")
WARMUP_DONE = re.compile(r"\bwarm-up .*: .*done in ")  # the run's progress line at the end of its warm-up
SLICE_S = 0.25
GOAL = (0.95, 1.05)  # the harness's forward p50 over benchmark_app's median


def _va_bench_command(out: Path, *args: str) -> list[str]:
    return [str(Path(sys.executable).with_name("va-bench")), "run", "--model", "yolox-nano", "--no-energy",
            "--draw-images", "0", "--output-dir", str(out), *args]


def _va_bench(out: Path, *args: str) -> list[dict]:
    """`va-bench run ARGS` in a fresh process; its submissions."""
    command = _va_bench_command(out, *args)
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} exited {done.returncode}:\n{done.stderr[-2000:]}")
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(out.glob("*/submissions/*.json"))]


def _harness_timing_only(out: Path, threads: int, batches: int) -> list[str]:
    """The harness's OpenVINO fp32 batch-1 run timing `batches` forwards, nothing after its timed pass."""
    return _va_bench_command(out, "--backend", "openvino", "--batch-sizes", "1", "--threads", str(threads),
                             "--limit", "32", "--no-accuracy", "--no-layers", "--no-profile",
                             "--min-timed-batches", str(batches), "--max-timed-batches", str(batches),
                             "--warmup-seconds", "2")


def benchmark_app_command(ir: str, threads: int, iterations: int, size: int) -> list[str]:
    """OpenVINO's own benchmark_app, synchronous, one stream, f32, on the harness's IR, `iterations` inferences."""
    return [str(Path(sys.executable).with_name("benchmark_app")), "-m", ir, "-d", "CPU", "-shape",
            f"[1,3,{size},{size}]", "-hint", "none", "-api", "sync", "-nstreams", "1", "-nthreads", str(threads),
            "-infer_precision", "f32", "-niter", str(iterations)]


def _median(lines: list[str], who: str) -> float:
    for line in lines:
        if match := MEDIAN_LINE.search(line):
            return float(match.group(1))
    raise SystemExit(f"{who} printed no median latency:\n" + "\n".join(lines[-20:]))


def _sliced_round(subject: SlicedProcess, ir: str, threads: int, iterations: int, share: float) -> dict:
    """`subject` and benchmark_app (`iterations` inferences) time-sliced; benchmark_app's median and the slices."""
    tool = SlicedProcess(benchmark_app_command(ir, threads, iterations, 416), ready=lambda line: "Step 10/11" in line)
    outcome = run_time_sliced(subject, tool, SLICE_S, share)
    for lines, code, who in zip(outcome.lines, outcome.returncodes, ("subject", "benchmark_app"), strict=True):
        if code != 0:
            raise SystemExit(f"{who} exited {code} while time-sliced:\n" + "\n".join(lines[-20:]))
    return {"tool_ms": _median(outcome.lines[1], "benchmark_app"), "lines": outcome.lines[0],
            "slices": outcome.slices, "alone_s": outcome.alone_s,
            "ended_first": ("the subject", "benchmark_app")[outcome.ended_first]}


def compare_with_benchmark_app(threads: int, rounds: int, batches: int = 800) -> dict:
    """The harness's OpenVINO fp32 batch-1 forward p50 against benchmark_app's median on the same IR and threads,
    time-sliced in each round (harness/bench/time_sliced.py), and the same for a plain `infer()` loop timed as
    benchmark_app times (harness/bench/openvino_loop.py): the control, whose ratio is the comparison's own bias."""
    with tempfile.TemporaryDirectory(prefix="va-bench-runtimes-") as tmp:
        converted = _va_bench(Path(tmp) / "convert", "--backend", "openvino", "--batch-sizes", "1", "--threads",
                              str(threads), "--limit", "4", "--no-accuracy", "--no-layers", "--no-profile",
                              "--min-timed-batches", "4")[0]
        ir, properties = converted["runtime"]["conversion"]["ir_file"], converted["runtime"]["properties"]
        share = 1 / 1.5  # benchmark_app's slice over the harness's: a batch takes ~1.5 forwards; then measured
        harness_rounds, control_rounds = [], []
        for k in range(rounds):
            out = Path(tmp) / f"h{k}"
            subject = SlicedProcess(_harness_timing_only(out, threads, batches), ready=WARMUP_DONE.search)
            measured = _sliced_round(subject, ir, threads, batches, share)
            written = sorted(out.glob("*/submissions/*.json"))
            if not written:
                raise SystemExit(f"the harness's run wrote no submission under {out}:\n"
                                 + "\n".join(measured["lines"][-20:]))
            doc = json.loads(written[0].read_text(encoding="utf-8"))
            measured["subject_ms"] = doc["timing"]["stages_ms"]["forward"]["p50"]
            # the next round's slices: both end together when each completes as many iterations per slice
            share = measured["tool_ms"] / doc["timing"]["batch_ms"]["p50"]
            harness_rounds.append(measured)
            control = SlicedProcess([sys.executable, "-m", "harness.bench.openvino_loop", ir, "--properties",
                                     json.dumps(properties), "--shape", "1", "3", "416", "416", "--iterations",
                                     str(batches)], ready=lambda line: LOOP_STARTS in line)
            measured_control = _sliced_round(control, ir, threads, batches, 1.0)
            measured_control["subject_ms"] = _median(measured_control["lines"], "the control loop")
            control_rounds.append(measured_control)
            for name, r in (("harness", measured), ("control", measured_control)):
                print(f"round {k + 1} {name:<8} {r['subject_ms']:6.2f} ms vs benchmark_app {r['tool_ms']:6.2f} ms: "
                      f"{r['subject_ms'] / r['tool_ms']:.3f} ({r['slices']} slices; {r['ended_first']} ended first, "
                      f"the other ran {r['alone_s']:.1f} s alone)", flush=True)

    def ratios(rs: list[dict]) -> list[float]:
        return [round(r["subject_ms"] / r["tool_ms"], 4) for r in rs]

    return {"threads": threads, "batches": batches, "slice_s": SLICE_S,
            "harness_forward_p50_ms": [r["subject_ms"] for r in harness_rounds],
            "benchmark_app_median_ms": [r["tool_ms"] for r in harness_rounds],
            "round_ratios": ratios(harness_rounds), "ratio": round(statistics.median(ratios(harness_rounds)), 4),
            "control_ratios": ratios(control_rounds),
            "control_ratio": round(statistics.median(ratios(control_rounds)), 4),
            "alone_s": [r["alone_s"] for r in harness_rounds],
            "goal": f"{GOAL[0]}-{GOAL[1]}", "load_average": [round(v, 2) for v in os.getloadavg()]}


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


def main(argv: list[str] | None = None) -> int:
    """The comparison, then the matrix; exit status 1 when the comparison misses its goal."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_run_argument(parser, "threads", default=2)
    parser.add_argument("--repeats", type=int, default=3, help="time-sliced rounds against benchmark_app")
    parser.add_argument("--batches", type=int, default=800, help="timed forwards per process in each round")
    add_run_argument(parser, "limit", default=106)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    comparison = compare_with_benchmark_app(args.threads, args.repeats, args.batches)
    print(f"OpenVINO fp32 b1 forward p50, {args.threads} threads, time-sliced with benchmark_app: median of "
          f"{args.repeats} rounds' ratios {comparison['ratio']:.3f} (goal {GOAL[0]}-{GOAL[1]}; rounds "
          f"{', '.join(f'{r:.3f}' for r in comparison['round_ratios'])}); the control, a plain infer() loop timed as "
          f"benchmark_app times: {comparison['control_ratio']:.3f}")
    matrix = runtime_matrix(args.threads, args.limit)
    if args.json:
        print(json.dumps({"openvino_vs_benchmark_app": comparison, "matrix": matrix}, indent=2))
    met = GOAL[0] <= comparison["ratio"] <= GOAL[1]
    print(f"OpenVINO against benchmark_app: {comparison['ratio']:.3f}, goal {'met' if met else 'NOT met'}")
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
