"""A plugin whose process dies mid-run (`--model tests/plugins/killed_detector.py:make_detector`): the
synthetic detector of synthetic_detector.py, whose forward SIGKILLs its own process once batches of
$VA_BENCH_TEST_KILL_AT images (default 2) have run for $VA_BENCH_TEST_KILL_AFTER_S seconds (default 1), if
the file $VA_BENCH_TEST_KILL_MARKER exists. The process that removes the marker dies; the others, and the
next run (a resume), complete."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

from harness.models.registry import load_plugin

SYNTHETIC = Path(__file__).with_name("synthetic_detector.py")


class KilledCore:
    """The synthetic core, with a kill switch."""

    def __init__(self, core, kill_at: int, after_s: float, marker: Path | None):
        self.core, self.kill_at, self.after_s, self.marker = core, kill_at, after_s, marker
        self.first_call: float | None = None

    def __getattr__(self, name):
        return getattr(self.core, name)

    def __call__(self, batch):
        if batch.shape[0] == self.kill_at and self.marker is not None:
            now = time.monotonic()
            self.first_call = self.first_call or now
            if now - self.first_call >= self.after_s:
                try:
                    self.marker.unlink()  # whoever removes it dies: one process, even with several racing
                except FileNotFoundError:
                    return self.core(batch)
                os.kill(os.getpid(), signal.SIGKILL)
        return self.core(batch)


def make_detector():
    detector = load_plugin(str(SYNTHETIC), "make_detector")
    load_core = detector.load_core
    marker = os.environ.get("VA_BENCH_TEST_KILL_MARKER")
    kill_at = int(os.environ.get("VA_BENCH_TEST_KILL_AT", "2"))
    after_s = float(os.environ.get("VA_BENCH_TEST_KILL_AFTER_S", "1"))

    def killing_core(*args, **kwargs):
        return KilledCore(load_core(*args, **kwargs), kill_at, after_s, Path(marker) if marker else None)

    detector.load_core = killing_core
    return detector
