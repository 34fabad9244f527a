"""Command lines va-bench prints or records for a user to paste: quoted for the shell of the platform it runs on
(POSIX sh, or cmd.exe on Windows, whose quoting is not sh's)."""

from __future__ import annotations

import shlex
import subprocess
import sys


def quote(arg: str) -> str:
    """One argument, quoted for this platform's shell where it needs it."""
    return subprocess.list2cmdline([arg]) if sys.platform == "win32" else shlex.quote(arg)


def join(args: list[str]) -> str:
    """Arguments as one command line for this platform's shell."""
    return subprocess.list2cmdline(args) if sys.platform == "win32" else shlex.join(args)
