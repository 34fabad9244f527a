"""The terminal itself: the two consoles, JSON on stdout, progress for a command."""

from __future__ import annotations

import os
import sys
from typing import Any

from rich.console import Console

from harness.files import json_text

MIN_COLUMNS = 20  # a $COLUMNS below this (0 from a broken terminal) would blank every line: not taken


def make_consoles() -> tuple[Console, Console]:
    """(stdout, stderr) consoles for this process's streams and $COLUMNS, read when a command starts."""
    columns = os.environ.get("COLUMNS", "")
    given = int(columns) if columns.isdigit() and int(columns) >= MIN_COLUMNS else None
    # rich reads $COLUMNS itself: an unusable one is replaced by the terminal's width, else a default
    unusable = bool(columns) and given is None
    out = Console(emoji=False, width=_terminal_width(sys.stdout, 80) if unusable else None)  # "cuda:x:" is text
    if not out.is_terminal:  # piped/CI output: 160 columns unless $COLUMNS says otherwise
        out = Console(width=given or 160, emoji=False)
    err = Console(stderr=True, emoji=False, width=_terminal_width(sys.stderr, 80) if unusable else None)
    return out, err


def _terminal_width(stream: Any, default: int) -> int:
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (AttributeError, OSError, ValueError):
        return default
    return columns if columns >= MIN_COLUMNS else default  # a terminal that says 0 (docker run -t at first)


def print_json(console: Console, data: Any) -> None:
    """`--json`: the document on stdout, and nothing else there (one meaning in every command): written as it is,
    never through rich (which would colour it on a terminal or with FORCE_COLOR, and re-encode its text)."""
    text = json_text(data, "stdout", indent=2) + "\n"  # ASCII: json escapes the rest
    stream = console.file
    binary = getattr(stream, "buffer", None)
    if binary is None:
        stream.write(text)
        stream.flush()
        return
    # Through the binary layer, every byte accounted for: unbuffered (PYTHONUNBUFFERED, -u), it is the raw file,
    # whose write may take part of the bytes, and the text layer above it drops the rest without a word
    stream.flush()
    rest = memoryview(text.encode("ascii"))
    while rest:
        written = binary.write(rest)
        if not written:
            raise OSError(f"stdout took none of the last {len(rest)} bytes of the JSON document")
        rest = rest[written:]
    binary.flush()


def progress_for(err_console: Console):
    """Live bars on a terminal, plain progress lines when stderr is piped."""
    from harness.views.progress import PlainProgress, RichProgress

    return RichProgress(err_console) if err_console.is_terminal else PlainProgress(sys.stderr)
