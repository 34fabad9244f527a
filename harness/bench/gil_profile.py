"""Who holds the interpreter lock while a command runs.

The harness's forward thread and its host workers share one interpreter lock: on a GPU, where an eager forward is
a stream of Python-launched kernels, every moment a worker holds the lock the forward waits. py-spy samples the
command's threads and keeps only the samples in which a thread holds the lock (`py-spy record --gil --threads`);
this summary gives the seconds each thread group held the lock, its share of the samples, and the functions the holders
were in. py-spy is a sampling profiler that reads the process from outside (no change to the code measured); it
needs the permission to read another process's memory (ptrace), which a container may withhold: the summary then
says unavailable, with py-spy's reason.

    python -m harness.bench.gil_profile [--rate 200] [--out gil.txt] [--within run_overlapped] [--threads va-stream]
        [--json] \\
        -- python -m harness.bench.overhead ...
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

# py-spy's raw line with --threads: "thread (TID): NAME;frame;frame;... COUNT" (NAME absent for unnamed threads)
RAW_LINE = re.compile(r"^thread \((?P<tid>\w+)\)(?:: (?P<name>[^;]*))?;(?P<stack>.*) (?P<count>\d+)$")
# ThreadPoolExecutor numbers its threads (va-stream_3): one group per pool
POOL_SUFFIX = re.compile(r"_\d+$")


def summarize(raw: str, rate: float, within: tuple[str, ...] = (), threads: tuple[str, ...] = (),
              top: int = 12) -> dict:
    """The summary of py-spy's raw output: per thread group the seconds it held the lock (samples / `rate`) and its
    share of the holding samples, and the `top` innermost functions holding it. With `within` or `threads`, only
    samples whose stack passes through a function whose name contains one of the `within` strings, or whose thread
    group is one of `threads`, count (the timed region, not the imports and model loading before it)."""
    groups: Counter[str] = Counter()
    functions: Counter[str] = Counter()
    for line in raw.splitlines():
        match = RAW_LINE.match(line.strip())
        if match is None:
            continue
        group = POOL_SUFFIX.sub("", match["name"] or f"thread {match['tid']}")
        frames = match["stack"].split(";")
        if (within or threads) and group not in threads and not any(
                w in frame.split(" (", 1)[0] for frame in frames for w in within):
            continue
        count = int(match["count"])
        groups[group] += count
        functions[re.sub(r":\d+\)$", ")", frames[-1])] += count  # one entry per function, not per line
    held = sum(groups.values())
    if not held:
        region = " or ".join([*(f"within {w}" for w in within), *(f"on {t}" for t in threads)])
        return {"status": "unavailable",
                "reason": "py-spy recorded no sample holding the interpreter lock" + (f" {region}" if region else "")}
    return {"samples_holding": held, "within": list(within), "threads": list(threads),
            "by_thread": {name: {"held_s": round(n / rate, 2), "share": round(n / held, 3)}
                          for name, n in groups.most_common()},
            "top_functions": {name: round(n / held, 3) for name, n in functions.most_common(top)}}


def profile(command: list[str], rate: float, out: Path, timeout: float, within: tuple[str, ...] = (),
            threads: tuple[str, ...] = ()) -> tuple[subprocess.CompletedProcess | None, dict]:
    """Run `command` under py-spy (lock-holding samples only, by thread; its raw output goes to `out`) and
    summarize them (`within`, `threads`: see summarize). Past `timeout` seconds py-spy and the command are
    interrupted (SIGINT: py-spy writes what it has) and, if still there after 10 s, killed."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy).exists():
        return None, {"status": "unavailable", "reason": "py-spy is not installed here (pip install py-spy)"}
    args = [spy, "record", "--gil", "--threads", "--nonblocking", "--format", "raw", "--rate", str(int(rate)),
            "-o", str(out), "--", *command]
    start = time.monotonic()
    # a session of its own: on a timeout the signal reaches py-spy and the command it started, nothing else
    process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                               start_new_session=True)
    timed_out = False
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(process.pid, signal.SIGINT)
        try:
            stdout, stderr = process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
    done = subprocess.CompletedProcess(args, process.returncode, stdout, stderr)
    seconds = time.monotonic() - start
    why = f"exit {done.returncode}" + (f" after the {timeout:.0f} s limit" if timed_out else "")
    last = (stderr.strip().splitlines() or [""])[-1][:200]
    if not out.exists():
        return done, {"status": "unavailable", "reason": f"py-spy recorded nothing ({why}): {last}"}
    summary = summarize(out.read_text(encoding="utf-8"), rate, within, threads)
    if (done.returncode != 0 or timed_out) and "reason" in summary:
        summary["reason"] += f" ({why}: {last})"
    return done, {**summary, "seconds": round(seconds, 1), "rate_hz": rate, "timed_out": timed_out}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=200, help="samples per second")
    parser.add_argument("--out", type=Path, default=Path("gil-profile.txt"), help="py-spy's raw samples")
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument("--within", nargs="*", default=[], help="count only stacks through functions whose name "
                        "contains one of these (e.g. run_overlapped: the forward's thread in overlapped streams)")
    parser.add_argument("--threads", nargs="*", default=[], help="and every sample of these thread groups (e.g. "
                        "va-stream: the overlapped workers)")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the command to profile")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to profile after --")
    done, summary = profile(command, args.rate, args.out, args.timeout, tuple(args.within), tuple(args.threads))
    if args.json:
        print(json.dumps(summary, indent=2))
    elif "by_thread" in summary:
        region = [*summary["within"], *summary["threads"]]
        within = f" within {', '.join(region)}" if region else ""
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
