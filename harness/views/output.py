"""The terminal itself: the two consoles, JSON on stdout, progress for a command."""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from rich.console import Console
from rich.markup import escape as escape_markup

# Characters a terminal acts on instead of showing (C0/C1 controls: ESC starts a sequence that can clear the screen
# or forge a line; bidirectional overrides reorder what follows). Files from others may carry them in any name.
_UNPRINTABLE = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))}
_UNPRINTABLE.update({c: f"\\u{c:04x}" for c in (0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))})


def escape(text: object) -> str:
    """`text` for the terminal: rich markup escaped, and each control character shown as its escape (\\x1b), never
    sent as itself. Every view prints names read from files through this."""
    return escape_markup(str(text).translate(_UNPRINTABLE))


def make_consoles() -> tuple[Console, Console]:
    """(stdout, stderr) consoles for this process's streams and $COLUMNS, read when a command starts."""
    out = Console(emoji=False)  # "cuda:x:" in a message is text, not an emoji code
    if not out.is_terminal:  # piped/CI output: 160 columns unless $COLUMNS says otherwise
        columns = os.environ.get("COLUMNS", "")
        out = Console(width=int(columns) if columns.isdigit() else 160, emoji=False)
    return out, Console(stderr=True, emoji=False)


def print_json(console: Console, data: Any) -> None:
    """`--json`: the document on stdout, and nothing else there (one meaning in every command)."""
    console.print_json(json.dumps(data))


def progress_for(err_console: Console, quiet: bool):
    """Live bars on a terminal, plain progress lines when stderr is piped, nothing when `quiet`."""
    from harness.run.progress import SilentProgress
    from harness.views.progress import PlainProgress, RichProgress

    if quiet:
        return SilentProgress()
    return RichProgress(err_console) if err_console.is_terminal else PlainProgress(sys.stderr)
