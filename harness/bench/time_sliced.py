"""Two benchmark processes measured over the same seconds: each is stopped (SIGSTOP) while the other runs, in
alternating slices of a fraction of a second, until one of them ends.

Two processes timed one after the other on a shared host land in different modes of the machine: on the 2-core
box the same bare OpenVINO loop gave 9.6 ms in one process and 17.8 ms in the next, more than any gap worth
looking for between a harness and a runtime's own tool. Sliced this finely, both sample the same seconds. Each
process runs alone on the cores during its slices, as when it runs alone. A stop that lands inside a timed call
lengthens that call: at most one call per slice, which moves a median up by about one percentile (800 calls over
~50 slices). A process that is all timed calls (benchmark_app, the control loop) takes that on nearly every slice,
the harness on the share of its batch that is the forward (two thirds at batch 1): a difference of a fraction of a
percentile, a few hundredths of a millisecond on a 10 ms forward, in the harness's favour.

Slicing evens out the seconds, not the processes: now and then one process of a pair runs slower than its twin
for its whole life (two identical OpenVINO loops sliced against each other, 6 pairs: one at 1.40, the others
0.998-1.018). A caller judges on the median of several pairs of fresh processes.

Each process is started, brought up to where its timed loop begins (a line it prints) and stopped; then the
slices alternate. The process left running once the other has ended finishes alone: the seconds it ran alone
(its timed loop's rest and whatever it does after it, such as writing its results) are returned, so a caller can
size the two so that both end together (`share`: the second's slice over the first's).

POSIX only (signals); Linux is what the bench runs on.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class SlicedProcess:
    """A process to run in slices: its command and the test on one line of its output (stdout and stderr
    together) that says its timed loop starts now."""

    command: list[str]
    ready: Callable[[str], bool]


@dataclass
class SlicedOutcome:
    """Both processes' outputs (lines), return codes, the slices run and the seconds the survivor ran alone."""

    lines: tuple[list[str], list[str]]
    returncodes: tuple[int, int]
    slices: int
    alone_s: float
    ended_first: int  # 0 or 1: which process ended first (the other was still running)


class _Running:
    """A started process whose output lines are gathered by a reader thread."""

    def __init__(self, spec: SlicedProcess):
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}  # its lines as it prints them, not when a buffer fills
        # undecodable bytes replaced: a reader that died on one would leave the process blocked on a full pipe
        self.proc = subprocess.Popen(spec.command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     errors="replace", env=env)
        self.lines: list[str] = []
        self.reached_loop = False
        self.is_ready = threading.Event()
        self._reader = threading.Thread(target=self._read, args=(spec.ready,), daemon=True)
        self._reader.start()

    def _read(self, ready: Callable[[str], bool]) -> None:
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if not self.reached_loop and ready(line):
                self.reached_loop = True
                self.is_ready.set()
        self.is_ready.set()  # its output ended: a process that never reached its loop is done waiting for

    def wait_ready(self, timeout_s: float) -> None:
        if not self.is_ready.wait(timeout_s):
            raise TimeoutError(f"{self.proc.args[0]} did not reach its timed loop in {timeout_s:.0f} s")
        if not self.reached_loop:
            code = self.finish()
            raise RuntimeError(f"{' '.join(self.proc.args)} exited {code} before its timed loop:\n"
                               + "\n".join(self.lines[-20:]))

    def alive(self) -> bool:
        return self.proc.poll() is None

    def signal(self, sig: int) -> None:
        if self.alive():
            try:
                self.proc.send_signal(sig)
            except ProcessLookupError:  # it ended between the check and the signal
                pass

    def finish(self, timeout_s: float | None = None) -> int:
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise TimeoutError(f"{self.proc.args[0]} did not end in {timeout_s:.0f} s") from None
        self._reader.join(5.0)  # a child of its own may hold the pipe open: its lines so far are enough
        return code

    def kill(self) -> None:
        self.signal(signal.SIGCONT)
        if self.alive():
            self.proc.kill()
        self.finish()


def run_time_sliced(first: SlicedProcess, second: SlicedProcess, slice_s: float = 0.25, share: float = 1.0,
                    ready_timeout_s: float = 300.0, finish_timeout_s: float = 900.0) -> SlicedOutcome:
    """Run `first` and `second` in alternating slices (`slice_s` seconds for `first`, `share` x that for
    `second`) from the moment both reached their timed loops until one ends; the other then finishes alone.
    A process that does not reach its loop, or does not end, is killed (with its partner) and reported."""
    procs: list[_Running] = []
    try:
        for spec in (first, second):  # one at a time: the first's start-up is not shared with the second's
            running = _Running(spec)
            procs.append(running)
            running.wait_ready(ready_timeout_s)
            running.signal(signal.SIGSTOP)
        slices, turn = 0, 0
        while all(p.alive() for p in procs):
            procs[turn].signal(signal.SIGCONT)
            time.sleep(slice_s * (share if turn else 1.0))
            procs[turn].signal(signal.SIGSTOP)
            slices += 1
            turn = 1 - turn
        ended_first = 0 if not procs[0].alive() else 1
        survivor = procs[1 - ended_first]
        start = time.perf_counter()
        survivor.signal(signal.SIGCONT)
        codes = tuple(p.finish(finish_timeout_s) for p in procs)
        return SlicedOutcome((procs[0].lines, procs[1].lines), codes, slices,  # type: ignore[arg-type]
                             round(time.perf_counter() - start, 2), ended_first)
    finally:
        for p in procs:
            if p.alive():
                p.kill()
