"""Python's cyclic garbage collector around a run's start.

Importing torch, the runtimes and the models' libraries leaves ~220k objects that the collector's full passes
scan again and again: on the reference box 4 such passes ran during a run's imports (30-105 ms each, ~0.26 s in
all) and one more (124 ms) later, in the first COCO evaluation; one could as well land inside a timed batch.
`quiet_start` holds collections while a command plans (imports, dataset, models); `imports_done` then freezes
what exists (moved out of the collector's sight: it lives as long as the run) and lets collections resume, so
they scan only what the run itself creates. When the command ends the frozen objects go back to the collector,
so a process that runs commands in turn (the tests) still collects their garbage.
"""

from __future__ import annotations

import functools
import gc
from collections.abc import Callable


def quiet_start(command: Callable) -> Callable:
    """Decorate a command: no collections until it calls `imports_done` (or ends); the collector as it was after."""
    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        enabled = gc.isenabled()
        gc.disable()
        try:
            return command(*args, **kwargs)
        finally:
            gc.unfreeze()
            (gc.enable if enabled else gc.disable)()
    return wrapper


def imports_done() -> None:
    """What exists now stays for the run: out of the collector's sight; collections resume for what comes next."""
    gc.freeze()
    gc.enable()
