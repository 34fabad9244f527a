"""The terminal itself: the two consoles, JSON on stdout, progress for a command."""

from __future__ import annotations

import codecs
import contextlib
import io
import os
import sys
from collections.abc import Iterator
from typing import Any, TextIO

from rich.console import Console

from harness.files import json_text

MIN_COLUMNS = 20  # a $COLUMNS below this (0 from a broken terminal) would blank every line: not taken
PIPED_COLUMNS = 160  # stdout that is no terminal (a pipe, a CI log, a --json document)


# What a terminal that cannot show the symbols the tables use gets instead: the width rich laid a table out for is
# kept where the symbol is one column (Δ, ·, −, ×), and the rest are readable; anything else is an escape (\xe9)
ASCII_SYMBOLS = {"Δ": "d", "·": ".", "−": "-", "×": "x", "≥": ">=", "≤": "<=", "±": "+/-", "→": "->", "…": "...",
                 "—": "-", "°": "o", "μ": "u"}
TERMINAL_ERRORS = "va-bench-symbols"


def _symbols_or_escapes(error: UnicodeError) -> tuple[str, int]:
    if not isinstance(error, UnicodeEncodeError):
        raise error
    text = error.object[error.start:error.end]
    return "".join(ASCII_SYMBOLS.get(ch) or ch.encode("ascii", "backslashreplace").decode("ascii")
                   for ch in text), error.end


codecs.register_error(TERMINAL_ERRORS, _symbols_or_escapes)


def tolerant_streams() -> None:
    """stdout and stderr write what their encoding cannot (an ASCII or Latin-1 terminal) as ASCII stand-ins or
    escapes instead of raising UnicodeEncodeError."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(errors=TERMINAL_ERRORS)
        except (AttributeError, ValueError, OSError):  # replaced by a non-text stream, or closed
            pass


class StdoutGone(BaseException):
    """stdout's reader went away (`va-bench ... | head -1`). A BaseException: click turns an EPIPE OSError into exit
    1, which here means a problem found (a failed cell, validation errors, a gate); `main` exits with the shell's
    SIGPIPE status instead."""


class _Stdout(Console):
    def on_broken_pipe(self) -> None:  # rich's own sends stdout to /dev/null and exits 1
        raise StdoutGone


class _Stderr(Console):
    def on_broken_pipe(self) -> None:
        # nobody reads the messages any more; stdout (a --json document) and the exit code stay what they are
        self.quiet = True


def make_consoles() -> tuple[Console, Console]:
    """(stdout, stderr) consoles for this process's streams and $COLUMNS, read when a command starts."""
    columns = os.environ.get("COLUMNS", "")
    given = int(columns) if columns.isdigit() and int(columns) >= MIN_COLUMNS else None
    # rich reads $COLUMNS itself: an unusable one is replaced by the terminal's width, else a default
    unusable = bool(columns) and given is None
    out = _Stdout(emoji=False, width=_terminal_width(sys.stdout, 80) if unusable else None)  # "cuda:x:" is text
    if not out.is_terminal:  # piped/CI output: PIPED_COLUMNS unless $COLUMNS says otherwise
        out = _Stdout(width=given or PIPED_COLUMNS, emoji=False)
    err = _Stderr(stderr=True, emoji=False, width=_terminal_width(sys.stderr, 80) if unusable else None)
    return out, err


def document_console(stream: TextIO) -> Console:
    """The stdout console of a `--json` command: it writes to `stream` (see stdout_kept_for_the_document)."""
    return _Stdout(file=stream, width=PIPED_COLUMNS, emoji=False)


class _ToStderr(io.TextIOBase):
    """sys.stdout while a `--json` command runs: what a library prints there goes to stderr, as its messages do
    (and is dropped, not raised in the library, where stderr's reader has gone)."""

    def write(self, text: str) -> int:
        with contextlib.suppress(OSError, ValueError, AttributeError):  # AttributeError: stderr closed (None)
            sys.stderr.write(text)
        return len(text)

    def flush(self) -> None:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            sys.stderr.flush()

    def isatty(self) -> bool:
        return sys.stderr.isatty()

    def fileno(self) -> int:
        return sys.stderr.fileno()

    @property
    def encoding(self) -> str:
        return getattr(sys.stderr, "encoding", None) or "utf-8"


@contextlib.contextmanager
def stdout_kept_for_the_document(document: bool) -> Iterator[TextIO | None]:
    """`--json` (`document`): stdout holds the JSON document alone, whatever else runs meanwhile. A library's
    progress bars and lines (NNCF's calibration, a converter's log), printed from Python or written to the file
    descriptor from C, go to stderr until the command ends; yields the stream the document is written to (None:
    no document, or no stdout)."""
    original = sys.stdout
    if not document or original is None or not _open_descriptor(2) or sys.stderr is None:
        yield None  # no stderr to send the rest to (`2>&-`): stdout stays as it is
        return
    try:
        descriptor = original.fileno() == 1
    except (AttributeError, OSError, ValueError):  # a stream of Python's own (a test's StringIO): no descriptor
        descriptor = False
    stream = original
    if descriptor:
        original.flush()
        stream = os.fdopen(os.dup(1), "w", encoding=original.encoding, errors=original.errors)
        os.dup2(2, 1)
    sys.stdout = _ToStderr()
    try:
        yield stream
    finally:
        sys.stdout = original
        if descriptor:
            with contextlib.suppress(OSError, AttributeError):
                sys.stderr.flush()
            with contextlib.suppress(OSError):
                stream.flush()
            os.dup2(stream.fileno(), 1)
            with contextlib.suppress(OSError):
                stream.close()


def _open_descriptor(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


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
    try:
        _write_all(console.file, text)
    except BrokenPipeError:
        raise StdoutGone from None


def write_stdout(text: str) -> None:
    """Plain text on stdout as it is (`schema`): nothing where stdout is closed, StdoutGone where its reader left."""
    if sys.stdout is None:  # started with stdout closed (`>&-`)
        return
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        raise StdoutGone from None


def _write_all(stream: Any, text: str) -> None:
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

    # a dumb terminal (TERM=dumb: an editor's shell, some CI ptys) draws no live bars: plain lines there too
    return RichProgress(err_console) if err_console.is_interactive else PlainProgress(sys.stderr)
