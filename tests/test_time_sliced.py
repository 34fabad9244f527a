"""The time-sliced runner of `make bench-runtimes`: two real processes, each stopped while the other runs."""

from __future__ import annotations

import sys

import pytest

from harness.bench.time_sliced import SlicedProcess, run_time_sliced

# a CPU-bound loop that stamps the system-wide monotonic clock, after a ready line (and a start-up that must not
# be sliced: the ready line comes only after it)
WORKER = """
import sys, time
print("ready", flush=True)
stamps, end = [], int(sys.argv[1])
while len(stamps) < end:
    t = time.monotonic()
    stamps.append(t)
    while time.monotonic() - t < 0.0005:
        pass
print("stamps", *stamps, flush=True)
"""


def _worker(iterations: int) -> SlicedProcess:
    return SlicedProcess([sys.executable, "-c", WORKER, str(iterations)], ready=lambda line: line.startswith("ready"))


def _stamps(lines: list[str]) -> list[float]:
    return [float(v) for v in next(line for line in lines if line.startswith("stamps")).split()[1:]]


def test_the_two_processes_run_in_turns_not_together():
    """Merged by time, the two processes' loop stamps form runs of one process at a time, about one run per slice
    (run side by side on two cores they would interleave at nearly every stamp); the one with less work ends
    first and the other finishes alone."""
    outcome = run_time_sliced(_worker(600), _worker(1200), slice_s=0.05)
    assert outcome.returncodes == (0, 0)
    a, b = _stamps(outcome.lines[0]), _stamps(outcome.lines[1])
    merged = sorted([(t, 0) for t in a] + [(t, 1) for t in b])
    switches = sum(1 for (_, x), (_, y) in zip(merged, merged[1:], strict=False) if x != y)
    assert outcome.slices >= 2
    # a switch only where a slice ended (and the first process's stamps before the second started): running side by
    # side they would switch every few stamps, hundreds of times
    assert switches <= 2 * outcome.slices + 4
    assert outcome.ended_first == 0
    assert b[-1] > a[-1]  # the survivor's last stamps come after the other ended


def test_a_process_that_fails_before_its_timed_loop_is_an_error_with_its_output():
    failing = SlicedProcess([sys.executable, "-c", "import sys; print('no model here'); sys.exit(3)"],
                            ready=lambda line: line.startswith("ready"))
    with pytest.raises(RuntimeError, match="exited 3 before its timed loop:\nno model here"):
        run_time_sliced(_worker(10), failing, slice_s=0.05)


def test_a_process_that_never_gets_ready_is_killed_and_reported():
    silent = SlicedProcess([sys.executable, "-c", "import time; time.sleep(60)"], ready=lambda line: False)
    with pytest.raises(TimeoutError, match="did not reach its timed loop"):
        run_time_sliced(silent, _worker(10), slice_s=0.05, ready_timeout_s=0.5)
