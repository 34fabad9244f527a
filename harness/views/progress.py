"""Progress display: rich bars on a terminal, plain lines when piped."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TextIO

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from harness.run.progress import SilentProgress
from harness.views.text import escape


class RichProgress(SilentProgress):
    """One rich bar per pass (warm-up, timing, ...); labels escaped (rich eats [brackets])."""

    def __init__(self, console: Console):
        self.console = console

    @contextmanager
    def task(self, description: str, total: int | None) -> Iterator:
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=self.console, transient=True) as progress:
            task_id = progress.add_task(escape(description), total=total)
            yield lambda advance=1: progress.advance(task_id, advance)

    def log(self, message: str) -> None:
        """One line, best effort (a terminal closed under the run never fails a cell); soft-wrapped: a long line
        (a command to copy) is folded by the terminal, not broken by rich."""
        try:
            self.console.print(escape(message), soft_wrap=True, highlight=False)
        except (OSError, ValueError):
            pass


class PlainProgress(SilentProgress):
    """One line per finished pass, for logs and CI (no terminal): what ran, how many steps, how long."""

    def __init__(self, stream: TextIO | None):
        self.stream = stream

    @contextmanager
    def task(self, description: str, total: int | None) -> Iterator:
        done = [0]
        start = time.perf_counter()

        def advance(n: int = 1) -> None:
            done[0] += n

        yield advance
        steps = f" {done[0]}/{total}" if total else (f" {done[0]} steps" if done[0] else "")
        self.log(f"{description}:{steps} done in {time.perf_counter() - start:.1f} s")

    def log(self, message: str) -> None:
        """One line, best effort: a closed or broken stderr (`2>&-`, `| head`) never fails a cell."""
        if self.stream is None:
            return
        try:
            self.stream.write(f"[{time.strftime('%H:%M:%S')}] {message}\n")
            self.stream.flush()
        except (OSError, ValueError):
            pass


@contextmanager
def download_progress(console: Console):
    """A byte bar per file on a terminal (`update(name, done, total)`); None when stderr is piped."""
    from rich.progress import DownloadColumn, TransferSpeedColumn

    if not console.is_interactive:
        yield None
        return
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn())
    with Progress(*columns, console=console, transient=True) as bar:
        tasks: dict[str, int] = {}

        def update(name: str, done: int, total: int | None) -> None:
            if name not in tasks:
                tasks[name] = bar.add_task(escape(name), total=total)
            bar.update(tasks[name], completed=done, total=total)

        yield update
