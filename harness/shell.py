"""Command lines va-bench prints or records for a user to paste: quoted for the shell of the platform it runs on
(POSIX sh, or cmd.exe on Windows, whose quoting is not sh's)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

CMD_SPECIAL = set('&|<>^()%!')  # cmd.exe acts on these outside double quotes; list2cmdline quotes only spaces


def quote(arg: str) -> str:
    """One argument, quoted for this platform's shell where it needs it."""
    return _cmd_quote(arg) if sys.platform == "win32" else shlex.quote(arg)


def join(args: list[str]) -> str:
    """Arguments as one command line for this platform's shell."""
    return " ".join(map(_cmd_quote, args)) if sys.platform == "win32" else shlex.join(args)


def recordable(arg: str) -> str:
    """An argument as a record can hold it: the bytes of a name that is not UTF-8 (Python's surrogate escapes, which
    no UTF-8 file can store) as backslash escapes (`r\\xe9sultats`); every other text as it is."""
    try:
        arg.encode("utf-8")
        return arg
    except UnicodeEncodeError:
        return os.fsencode(arg).decode("utf-8", "backslashreplace")


def _cmd_quote(arg: str) -> str:
    """An argument for cmd.exe: the C runtime's quoting (list2cmdline), in double quotes also where cmd.exe would
    act on a character (`&`, `|`, ...; `%VAR%` is still expanded inside them: va-bench's paths seldom hold one)."""
    text = subprocess.list2cmdline([arg])
    if text.startswith('"') or '"' in arg or not CMD_SPECIAL & set(arg):
        return text
    trailing = len(arg) - len(arg.rstrip("\\"))  # backslashes before the closing quote are doubled
    return f'"{arg}{chr(92) * trailing}"'


def harness_command(*args: str) -> list[str]:
    """`python -m harness ARGS` that imports this very harness package: `-m` alone would import whatever
    `harness` folder the working directory holds (another checkout), whose defaults find other data and weights."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    start = f"import runpy, sys; sys.path.insert(0, {root!r}); runpy.run_module('harness', run_name='__main__')"
    return [sys.executable, "-c", start, *args]
