"""`make bench-sweep`: how much of a batch-size sweep's wall time is the work it measures.

Runs `va-bench run --batch-sizes 1 2 4 8 --subset sample` (the timed pass at its defaults: warm-up, one pass over
the images; no layer or profiler pass) in a fresh process, `--repeats` times, and prints per run: the process's
wall time, the sum of its timed passes (every timed batch and the short last batch of every cell, from the
submissions' own samples), their difference in seconds, their ratio, and where the rest went (the run's plain
progress lines: loading, warm-up, timing, COCO eval, ...).

The harness's bytecode is compiled first, as an installed package's is: in a shell with PYTHONDONTWRITEBYTECODE
set (this box's) every run would otherwise compile its ~80 modules again (~0.15 s).

    python -m harness.bench.sweep [--repeats 3] [--json] [-- more va-bench run options]
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import harness
from harness.results.reader import read_json_object, submission_files

SWEEP = ["run", "--batch-sizes", "1", "2", "4", "8", "--subset", "sample", "--no-layers", "--no-profile",
         "--draw-images", "0"]
PHASE_LINE = re.compile(r"^\[[\d:]+\] (?P<what>[a-zA-Z0-9 -]+?)(?: [^:]*)?: .*done in (?P<s>[\d.]+) s$")


def timed_seconds(run_dir: Path) -> float:
    """The run's timed passes: every timed batch of every cell (timing.batch_samples_ms) and its short batch."""
    total_ms = 0.0
    for path in submission_files(run_dir):
        timing = read_json_object(path)["timing"]
        total_ms += sum(timing["batch_samples_ms"])
        short = timing.get("short_batch") or {}
        total_ms += short.get("total_ms") or 0.0
    return total_ms / 1000.0


def one_sweep(output_dir: Path, tag: str, extra: list[str]) -> dict:
    run_id = f"bench-sweep-{tag}"
    argv = [sys.executable, "-m", "harness", *SWEEP, *extra, "--output-dir", str(output_dir), "--run-id", run_id]
    load = os.getloadavg()[0]
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env={**os.environ, "COLUMNS": "160"})
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"the sweep failed (exit {done.returncode}): {done.stderr.strip()[-500:]}")
    timed = timed_seconds(output_dir / run_id)
    phases: dict[str, float] = {}
    for line in done.stderr.splitlines():
        m = PHASE_LINE.match(line.strip())
        if m:
            what = m["what"].split(" b")[0].strip()
            phases[what] = round(phases.get(what, 0.0) + float(m["s"]), 2)
    return {"wall_s": round(wall, 2), "timed_s": round(timed, 2), "other_s": round(wall - timed, 2),
            "ratio": round(wall / timed, 3), "phases_s": phases, "load_average": [round(load, 2),
                                                                                  round(os.getloadavg()[0], 2)]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--target", type=float, default=1.4, help="wall / timed passes at most (median)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("extra", nargs="*", help="more `va-bench run` options (after --)")
    args = parser.parse_args(argv)
    compileall.compile_dir(Path(harness.__file__).parent, quiet=1)
    with tempfile.TemporaryDirectory(prefix="va-bench-sweep-") as tmp:
        runs = [one_sweep(Path(tmp), str(i), args.extra) for i in range(args.repeats)]
    ratio = statistics.median(r["ratio"] for r in runs)
    result = {"command": "va-bench " + " ".join(SWEEP + args.extra), "runs": runs, "ratio_median": ratio,
              "wall_s_median": statistics.median(r["wall_s"] for r in runs),
              "timed_s_median": statistics.median(r["timed_s"] for r in runs), "target": args.target}
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(result["command"])
        for r in runs:
            print(f"  wall {r['wall_s']:.1f} s, timed passes {r['timed_s']:.1f} s, the rest {r['other_s']:.1f} s, "
                  f"ratio {r['ratio']:.2f} (load {r['load_average'][0]}-{r['load_average'][1]})")
            print("    " + ", ".join(f"{k} {v:.1f} s" for k, v in r["phases_s"].items()))
        print(f"median ratio {ratio:.2f} (target <= {args.target})")
    return 0 if ratio <= args.target else 1


if __name__ == "__main__":
    raise SystemExit(main())
