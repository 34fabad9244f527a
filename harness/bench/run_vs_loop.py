"""`make bench-run`: the whole `va-bench run` against a plain batch-1 loop doing the same accuracy work
(harness/bench/plain_loop.py), each a fresh process, alternating which goes first, median of the repeats.

Prints the wall-time ratio (run / loop, target <= 0.6), the peak-RSS ratio (target <= 1.1), both mAPs
(they must agree), the load average around each measurement, and where the run's time went (its
progress lines: JPEG check, model load, warm-up, timed pass, COCO eval; the rest is start-up and writing).

    python -m harness.bench.run_vs_loop [--repeats 3] [--json] [-- extra va-bench run options]
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
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from harness.results.reader import read_json_object, submission_files

RUN = ["run", "--model", "yolox-nano", "--backend", "onnxruntime", "--batch-sizes", "8", "--subset", "sample",
       "--no-layers", "--no-profile"]
# PlainProgress lines: "[12:00:01] timing yolox-nano onnxruntime fp32 416 b8: 25/25 done in 2.3 s"
PHASE_LINE = re.compile(r"^\[[\d:]+\] (?P<what>checking JPEG integrity|loading|warm-up|timing|COCO eval)\b.*: "
                        r".*done in (?P<s>[\d.]+) s$")


@dataclass
class Measurement:
    """One process: wall seconds (spawn to exit), CPU seconds (user + system: less sensitive to other
    processes' load than wall time), peak RSS (the kernel's ru_maxrss), mAP, load around it."""

    wall_s: float
    cpu_s: float
    peak_rss_mb: float
    map_50_95: float
    load_before: float
    load_after: float
    phases_s: dict[str, float] = field(default_factory=dict)


def _measure(argv: list[str], env: dict) -> tuple[float, float, float, str, str]:
    """Run `argv`; wall time, CPU time and peak RSS of that process (os.wait4's rusage is the child's own)."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        proc = subprocess.Popen(argv, stdout=out, stderr=err, env=env)
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} exited {proc.returncode}:\n{stderr[-2000:]}")
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, stdout, stderr


def measure_run(output_dir: Path, tag: str, extra: list[str], env: dict) -> Measurement:
    """One `va-bench run` (python -m harness run, as the installed script does) in a fresh process."""
    load = os.getloadavg()[0]
    run_id = f"bench-run-{tag}"
    argv = [sys.executable, "-m", "harness", *RUN, *extra, "--output-dir", str(output_dir), "--run-id", run_id]
    wall, cpu, rss, _, stderr = _measure(argv, env)
    acc = read_json_object(submission_files(output_dir / run_id)[0])["accuracy"]
    phases: dict[str, float] = {}
    for line in stderr.splitlines():
        m = PHASE_LINE.match(line.strip())
        if m:
            phases[m["what"]] = phases.get(m["what"], 0.0) + float(m["s"])
    phases["other (start-up, prepare, writing)"] = round(wall - sum(phases.values()), 2)
    return Measurement(wall, cpu, rss, acc["mAP_50_95"], load, os.getloadavg()[0], phases)


def measure_loop(env: dict) -> Measurement:
    load = os.getloadavg()[0]
    wall, cpu, rss, stdout, _ = _measure([sys.executable, "-m", "harness.bench.plain_loop"], env)
    result = json.loads(stdout.strip().splitlines()[-1])
    return Measurement(wall, cpu, rss, result["mAP_50_95"], load, os.getloadavg()[0])


def compare(repeats: int, extra: list[str]) -> dict:
    """Alternating repeats (run first on even repeats, loop first on odd); medians and ratios."""
    env = dict(os.environ)
    runs, loops = [], []
    with tempfile.TemporaryDirectory(prefix="va-bench-run-") as tmp:
        for i in range(repeats):
            order = ("run", "loop") if i % 2 == 0 else ("loop", "run")
            for which in order:
                if which == "run":
                    runs.append(measure_run(Path(tmp), str(i), extra, env))
                else:
                    loops.append(measure_loop(env))
                m = (runs if which == "run" else loops)[-1]
                print(f"repeat {i + 1}/{repeats} {which:4s}: {m.wall_s:6.2f} s (CPU {m.cpu_s:6.2f} s), "
                      f"peak RSS {m.peak_rss_mb:7.1f} MB, "
                      f"mAP {m.map_50_95:.4f}, load {m.load_before:.2f} -> {m.load_after:.2f}", file=sys.stderr)
    run_wall = statistics.median(m.wall_s for m in runs)
    loop_wall = statistics.median(m.wall_s for m in loops)
    run_cpu = statistics.median(m.cpu_s for m in runs)
    loop_cpu = statistics.median(m.cpu_s for m in loops)
    run_rss = statistics.median(m.peak_rss_mb for m in runs)
    loop_rss = statistics.median(m.peak_rss_mb for m in loops)
    phases = {k: round(statistics.median(m.phases_s.get(k, 0.0) for m in runs), 2) for k in runs[0].phases_s}
    return {"repeats": repeats, "command": "va-bench " + " ".join(RUN + extra),
            "run_wall_s": round(run_wall, 2), "loop_wall_s": round(loop_wall, 2),
            "wall_ratio": round(run_wall / loop_wall, 3),
            "run_cpu_s": round(run_cpu, 2), "loop_cpu_s": round(loop_cpu, 2), "cpu_ratio": round(run_cpu / loop_cpu, 3),
            "run_peak_rss_mb": round(run_rss, 1), "loop_peak_rss_mb": round(loop_rss, 1),
            "rss_ratio": round(run_rss / loop_rss, 3),
            "run_map": runs[0].map_50_95, "loop_map": loops[0].map_50_95,
            "load_average": [round(v, 2) for m in runs + loops for v in (m.load_before, m.load_after)],
            "run_phases_s": phases, "runs": [asdict(m) for m in runs], "loops": [asdict(m) for m in loops]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--target", type=float, default=0.6, help="wall ratio run / loop at most")
    parser.add_argument("--rss-target", type=float, default=1.1, help="peak RSS ratio run / loop at most")
    parser.add_argument("--map-tolerance", type=float, default=0.001, help="|mAP run - mAP loop| at most")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("extra", nargs="*", help="more `va-bench run` options (after --)")
    args = parser.parse_args(argv)
    r = compare(args.repeats, args.extra)
    map_delta = abs(r["run_map"] - r["loop_map"])
    ok = {"wall": r["wall_ratio"] <= args.target, "rss": r["rss_ratio"] <= args.rss_target,
          "map": map_delta <= args.map_tolerance}
    if args.json:
        print(json.dumps({**r, "met": ok}, indent=2))
    else:
        def mark(met: bool) -> str:
            return "met" if met else "NOT MET"

        loads = r["load_average"]
        print(f"{r['command']}\nvs python -m harness.bench.plain_loop, median of {r['repeats']} alternating repeats "
              f"(1-min load average {min(loads):.2f}-{max(loads):.2f} on {os.cpu_count()} cores)")
        print(f"  wall      run {r['run_wall_s']:7.2f} s   loop {r['loop_wall_s']:7.2f} s   "
              f"ratio {r['wall_ratio']:.3f} (target <= {args.target}: {mark(ok['wall'])})")
        print(f"  CPU       run {r['run_cpu_s']:7.2f} s   loop {r['loop_cpu_s']:7.2f} s   "
              f"ratio {r['cpu_ratio']:.3f} (user + system; for reference)")
        print(f"  peak RSS  run {r['run_peak_rss_mb']:7.1f} MB  loop {r['loop_peak_rss_mb']:7.1f} MB  "
              f"ratio {r['rss_ratio']:.3f} (target <= {args.rss_target}: {mark(ok['rss'])})")
        print(f"  mAP       run {r['run_map']:.4f}     loop {r['loop_map']:.4f}     |delta| {map_delta:.4f} "
              f"(<= {args.map_tolerance}: {mark(ok['map'])})")
        print("  run's time: " + ", ".join(f"{k} {v:.2f} s" for k, v in r["run_phases_s"].items()))
    return 0 if all(ok.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
