"""`--cpu-affinity`: a run pinned to given CPU cores, every thread of the process (those already started, by
imports and model loading, and the ones started later, which inherit the mask), restored afterwards. Linux's
sched_setaffinity per thread id (/proc/self/task): psutil's cpu_affinity sets one task, not the process."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from harness.errors import UsageError

TASKS = Path("/proc/self/task")


def check_cores(cores: list[int]) -> None:
    """The cores exist and this process may run on them; one line saying which it may use otherwise."""
    if not cores:
        return
    if not hasattr(os, "sched_setaffinity") or not TASKS.is_dir():
        raise UsageError("--cpu-affinity pins threads with Linux's sched_setaffinity, which this system has not; "
                         "drop it (use the OS's own tool, e.g. start /affinity on Windows)")
    allowed = sorted(os.sched_getaffinity(0))
    outside = sorted(set(cores) - set(allowed))
    if outside:
        raise UsageError(f"--cpu-affinity {' '.join(map(str, outside))}: not a core this process may use; "
                         f"use some of {' '.join(map(str, allowed))}")


def _threads() -> list[int]:
    return sorted(int(p.name) for p in TASKS.iterdir() if p.name.isdigit())


def _set(tid: int, cores: set[int]) -> None:
    try:
        os.sched_setaffinity(tid, cores)
    except (ProcessLookupError, PermissionError):  # a thread that ended meanwhile, or one the OS guards
        pass


@contextmanager
def pinned(cores: list[int]) -> Iterator[None]:
    """Every thread of this process on `cores` inside the block (nothing when empty); each thread's own mask
    back afterwards, and the process's mask on the threads started inside that outlive it."""
    if not cores:
        yield
        return
    before = {tid: mask for tid in _threads() if (mask := _mask(tid)) is not None}
    process_mask = os.sched_getaffinity(0)
    for tid in before:
        _set(tid, set(cores))
    try:
        yield
    finally:
        for tid, mask in before.items():
            _set(tid, mask)
        # threads started inside that outlive the run (the pipeline's @cache'd pools, torch's OpenMP team) are the
        # process's from now on: pinned, they would hold the process's later runs to these cores
        for tid in _threads():
            if tid not in before:
                _set(tid, process_mask)


def affinity_record(cores: list[int]) -> dict:
    """The run's pinning as the environment records it: the cores, and how many of the process's threads are
    on exactly them now (all of them, unless the OS refused one)."""
    tasks = _threads()
    on = sum(1 for tid in tasks if _mask(tid) == set(cores))
    return {"cores": sorted(cores), "threads_pinned": on, "threads": len(tasks), "source": "--cpu-affinity"}


def inherited_affinity(cpu_count: int | None = None) -> dict | None:
    """The cores this process may use when they are fewer than the machine's (taskset, a cgroup cpuset, a
    container's limit): a run on 1 of 2 cores is another measurement, recorded even without --cpu-affinity."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    total = cpu_count or os.cpu_count() or len(allowed)
    if len(allowed) >= total:
        return None
    return {"cores": allowed, "of": total, "source": "inherited (taskset, a cgroup cpuset or the parent's mask)"}


def _mask(tid: int) -> set[int] | None:
    try:
        return os.sched_getaffinity(tid)
    except ProcessLookupError:
        return None
