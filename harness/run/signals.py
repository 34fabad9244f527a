"""SIGINT / SIGTERM / SIGHUP (the terminal closed) during a run: stop cleanly, never mid-write.

The handlers raise `Interrupted` (a BaseException, so no `except Exception` in a cell swallows it) in
the main thread. Inside `protected()` sections (writing a cell's submission and run.json together)
the signal is only remembered and raised when the section ends, so those files stay consistent.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from harness.process_exit import STOP_SIGNALS


class Interrupted(BaseException):
    """The run was asked to stop by a signal."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum  # the shell's convention: 130 for SIGINT, 143 for SIGTERM, 129 for SIGHUP


class _State:
    depth = 0  # nesting of protected() sections
    pending: int | None = None  # signal received inside a protected section


def _handler(signum, frame) -> None:
    if _State.depth:
        _State.pending = _State.pending or signum
        return
    raise Interrupted(signum)


@contextmanager
def interrupt_handling() -> Iterator[None]:
    """Install the handlers for the duration (main thread only; elsewhere a no-op)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _handler) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        _State.pending = None


@contextmanager
def protected() -> Iterator[None]:
    """A section that a signal does not cut: the signal is raised when it ends."""
    _State.depth += 1
    try:
        yield
    finally:
        _State.depth -= 1
        if not _State.depth and _State.pending is not None:
            signum, _State.pending = _State.pending, None
            raise Interrupted(signum)


@contextmanager
def signals_ignored() -> Iterator[None]:
    """The stop signals ignored inside (the last bookkeeping of a stop that is already under way)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, signal.SIG_IGN) for s in STOP_SIGNALS}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
