"""Who holds the interpreter lock while a command runs.

The harness's forward thread and its host workers share one interpreter lock: on a GPU, where an eager forward is
a stream of Python-launched kernels, every moment a worker holds the lock the forward waits. py-spy samples the
command's threads and keeps only the samples in which a thread holds the lock (`py-spy record --gil --threads`);
this summary gives the seconds each thread group held the lock, its share of the samples, and the functions the holders
were in. py-spy is a sampling profiler that reads the process from outside (no change to the code measured); it
needs the permission to read another process's memory (ptrace), which a container may withhold: the summary then
says unavailable, with py-spy's reason.

    python -m harness.bench.gil_profile [--rate 200] [--out gil.txt] [--within run_overlapped] [--json] \\
        -- python -m harness.bench.overhead ...
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

# py-spy's raw line with --threads: "thread (TID): NAME;frame;frame;... COUNT" (NAME absent for unnamed threads)
RAW_LINE = re.compile(r"^thread \((?P<tid>\w+)\)(?:: (?P<name>[^;]*))?;(?P<stack>.*) (?P<count>\d+)$")
# ThreadPoolExecutor numbers its threads (va-stream_3): one group per pool
POOL_SUFFIX = re.compile(r"_\d+$")


def summarize(raw: str, rate: float, within: tuple[str, ...] = (), top: int = 12) -> dict:
    """The summary of py-spy's raw output: per thread group the seconds it held the lock (samples / `rate`) and its
    share of the holding samples, and the `top` innermost functions holding it. With `within`, only samples whose
    stack passes through a function whose name contains one of those strings count (the timed region, not the
    imports and model loading before it)."""
    groups: Counter[str] = Counter()
    functions: Counter[str] = Counter()
    for line in raw.splitlines():
        match = RAW_LINE.match(line.strip())
        if match is None:
            continue
        frames = match["stack"].split(";")
        if within and not any(w in frame.split(" (", 1)[0] for frame in frames for w in within):
            continue
        count = int(match["count"])
        groups[POOL_SUFFIX.sub("", match["name"] or f"thread {match['tid']}")] += count
        functions[re.sub(r":\d+\)$", ")", frames[-1])] += count  # one entry per function, not per line
    held = sum(groups.values())
    if not held:
        return {"status": "unavailable", "reason": "py-spy recorded no sample holding the interpreter lock"
                + (f" within {', '.join(within)}" if within else "")}
    return {"samples_holding": held, "within": list(within),
            "by_thread": {name: {"held_s": round(n / rate, 2), "share": round(n / held, 3)}
                          for name, n in groups.most_common()},
            "top_functions": {name: round(n / held, 3) for name, n in functions.most_common(top)}}


def profile(command: list[str], rate: float, out: Path, timeout: float,
            within: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess | None, dict]:
    """Run `command` under py-spy (lock-holding samples only, by thread; its raw output goes to `out`) and
    summarize them (`within`: see summarize)."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        return None, {"status": "unavailable", "reason": "py-spy is not installed here (pip install py-spy)"}
    start = time.monotonic()
    done = subprocess.run([spy, "record", "--gil", "--threads", "--nonblocking", "--format", "raw", "--rate",
                           str(int(rate)), "-o", str(out), "--", *command],
                          capture_output=True, text=True, errors="replace", timeout=timeout)
    seconds = time.monotonic() - start
    if not out.exists():
        why = (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[-1]
        return done, {"status": "unavailable", "reason": f"py-spy recorded nothing: {why[:200]}"}
    return done, {**summarize(out.read_text(), rate, within), "seconds": round(seconds, 1), "rate_hz": rate}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=200, help="samples per second")
    parser.add_argument("--out", type=Path, default=Path("gil-profile.txt"), help="py-spy's raw samples")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--within", nargs="*", default=[], help="count only stacks through functions whose name "
                        "contains one of these (e.g. run_overlapped: the overlapped streams and their workers)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the command to profile")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to profile after --")
    done, summary = profile(command, args.rate, args.out, args.timeout, tuple(args.within))
    if args.json:
        print(json.dumps(summary, indent=2))
    elif "by_thread" in summary:
        within = f" within {', '.join(summary['within'])}" if summary["within"] else ""
        print(f"interpreter lock holders{within} ({summary['samples_holding']} samples at {summary['rate_hz']:.0f} Hz "
              f"over {summary['seconds']} s):")
        for name, held in summary["by_thread"].items():
            print(f"  {held['held_s']:7.2f} s  {100 * held['share']:5.1f} %  {name}")
        print("innermost functions holding it:")
        for name, share in summary["top_functions"].items():
            print(f"  {100 * share:5.1f} %  {name}")
    else:
        print(f"unavailable: {summary['reason']}")
    return 0 if done is not None and done.returncode == 0 and "by_thread" in summary else 1


if __name__ == "__main__":
    raise SystemExit(main())
