"""Progress display: rich bars for the CLI, a silent sink for library use and tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class SilentProgress:
    """Accepts progress calls and shows nothing."""

    @contextmanager
    def task(self, description: str, total: int | None) -> Iterator:
        yield lambda advance=1: None

    def log(self, message: str) -> None:
        pass


class RichProgress(SilentProgress):
    """One rich bar per pass (accuracy, warm-up, timing); labels escaped (rich eats [brackets])."""

    def __init__(self, console: Console):
        self.console = console

    @contextmanager
    def task(self, description: str, total: int | None) -> Iterator:
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=self.console, transient=True) as progress:
            task_id = progress.add_task(escape(description), total=total)
            yield lambda advance=1: progress.advance(task_id, advance)

    def log(self, message: str) -> None:
        self.console.print(escape(message))
