"""Text from files, made safe for the terminal."""

from __future__ import annotations

from rich.markup import escape as escape_markup

# Characters a terminal acts on instead of showing (C0/C1 controls: ESC starts a sequence that can clear the screen
# or forge a line; bidirectional overrides reorder what follows). Files from others may carry them in any name.
_UNPRINTABLE = {c: f"\\x{c:02x}" for c in (*range(0x20), 0x7F, *range(0x80, 0xA0))}
_UNPRINTABLE.update({c: f"\\u{c:04x}" for c in (0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))})


def escape(text: object) -> str:
    """`text` for the terminal: rich markup escaped, and each control character shown as its escape (\\x1b), never
    sent as itself. Every view prints names read from files through this."""
    return escape_markup(printable(text))


def printable(text: object) -> str:
    """`text` with each control character shown as its escape (\\x1b): for rich `Text`, which shows markup as it
    is (escaping it there would show the backslashes)."""
    return str(text).translate(_UNPRINTABLE)
