"""Leaving the process without the interpreter's teardown of torch.

Once a command is done, Python tears every module down before the process ends; with torch imported that alone
takes 0.6-0.9 s on the reference box (measured: `import torch` then exit, against the same with `os._exit`), more
than a cell's COCO evaluation, on every command that touched a model. Everything the program itself registered
still runs (atexit handlers, which include weakref finalizers, logging's flush and Ray's shutdown); then the
standard streams are flushed and the process ends with its exit code. Where another non-daemon thread is still
alive, or torch was never imported, the normal exit. Idle worker pools kept for the whole process (non-daemon
threads) are closed first by the hooks their owners gave `before_leave`.
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
import threading
from collections.abc import Callable

# the signals that stop a command: SIGHUP (the terminal closed) does not exist on Windows, where SIGBREAK
# (Ctrl-Break) does
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGBREAK")
                     if hasattr(signal, name))

_BEFORE_LEAVE: list[Callable[[], None]] = []


def before_leave(hook: Callable[[], None]) -> None:
    """Run `hook` when the process leaves through `leave`, before it looks for live threads (e.g. closing an idle
    thread pool that lives as long as the process)."""
    _BEFORE_LEAVE.append(hook)


def leave(code: int | str | None) -> None:
    """End the process with `code` as `sys.exit(code)` would (None: 0; a string: printed to stderr, 1). On the fast
    path a signal is ignored: the command is over, and a second Ctrl-C would only cut the exit handlers short (with a
    live thread, the normal exit, which a signal can still stop)."""
    for hook in _BEFORE_LEAVE:
        hook()
    others = [t for t in threading.enumerate() if t is not threading.main_thread() and not t.daemon]
    if "torch" not in sys.modules or others:
        sys.exit(code)
    if isinstance(code, str):
        print(code, file=sys.stderr)
        code = 1
    if threading.current_thread() is threading.main_thread():
        for number in STOP_SIGNALS:
            signal.signal(number, signal.SIG_IGN)
    atexit._run_exitfuncs()  # the handlers the interpreter would run; only its module teardown is skipped
    for stream in (sys.stdout, sys.stderr):
        if stream is None:  # started with the stream closed (`>&-`)
            continue
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken pipe: nothing more can be written anyway
            pass
    os._exit(code or 0)
