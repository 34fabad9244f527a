"""What a run reports its progress to: `task(description, total)` (a context giving `advance(n)`) and
`log(message)`. The terminal's renderings are in harness/views/progress.py; a run without one reports here."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


class SilentProgress:
    """Accepts progress calls and shows nothing."""

    @contextmanager
    def task(self, description: str, total: int | None) -> Iterator:
        yield lambda advance=1: None

    def log(self, message: str) -> None:
        pass
