"""The terminal itself: the two consoles, JSON on stdout, progress for a command."""

from __future__ import annotations

import os
import sys
from typing import Any

from rich.console import Console

from harness.files import json_text


def make_consoles() -> tuple[Console, Console]:
    """(stdout, stderr) consoles for this process's streams and $COLUMNS, read when a command starts."""
    out = Console(emoji=False)  # "cuda:x:" in a message is text, not an emoji code
    if not out.is_terminal:  # piped/CI output: 160 columns unless $COLUMNS says otherwise
        columns = os.environ.get("COLUMNS", "")
        out = Console(width=int(columns) if columns.isdigit() else 160, emoji=False)
    return out, Console(stderr=True, emoji=False)


def print_json(console: Console, data: Any) -> None:
    """`--json`: the document on stdout, and nothing else there (one meaning in every command)."""
    console.print_json(json_text(data, "stdout", indent=None))


def progress_for(err_console: Console):
    """Live bars on a terminal, plain progress lines when stderr is piped."""
    from harness.views.progress import PlainProgress, RichProgress

    return RichProgress(err_console) if err_console.is_terminal else PlainProgress(sys.stderr)
