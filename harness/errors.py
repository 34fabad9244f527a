"""Errors the CLI turns into one clear line and an exit code (1 = a problem found, 2 = bad input)."""

import os
import reprlib


class VaBenchError(Exception):
    """Base class: the message is the whole user-facing line (what is wrong, how to fix it)."""

    exit_code = 1


class UsageError(VaBenchError):
    """Bad usage or bad input (missing files, unknown model, inconsistent options): exit 2."""

    exit_code = 2


class RunInterrupted(VaBenchError):
    """A run stopped by SIGINT/SIGTERM: the message says what was kept and how to resume."""

    prefix = "interrupted"

    def __init__(self, message: str, exit_code: int, outcome: object = None):
        super().__init__(message)
        self.exit_code = exit_code
        self.outcome = outcome  # a local run's RunOutcome so far: what `run --json` still prints


class RunStopped(VaBenchError):
    """A run its storage stopped (a full disk, a run folder gone): exit 1, the message says what was kept and how to
    resume."""

    def __init__(self, message: str, outcome: object = None):
        super().__init__(message)
        self.outcome = outcome  # a local run's RunOutcome so far: what `run --json` still prints


_BRIEF = reprlib.Repr()  # its limits set one by one: Repr's keyword arguments are Python 3.12's
_BRIEF.maxstring, _BRIEF.maxother, _BRIEF.maxlist, _BRIEF.maxdict, _BRIEF.maxlevel = 60, 60, 6, 6, 2


def brief(value: object) -> str:
    """A value a user gave, as repr() writes it but cut short: an error message stays one line whatever the
    file held."""
    return _BRIEF.repr(value)


def json_problem(exc: ValueError | RecursionError) -> str:
    """Why a text is not JSON, whole and in one line: json's message with where it stopped (line, column), which a
    message cut at a length would lose; other decoding errors as exception_line gives them."""
    import json

    if isinstance(exc, json.JSONDecodeError):
        return f"{exc.msg} at line {exc.lineno} column {exc.colno}"
    return exception_line(exc, 100)


def path_problem(flag: str, given: object, problem: str) -> str:
    """`FLAG GIVEN: PROBLEM (ABSOLUTE)`: a path named as the user typed it, then the absolute path it stands
    for from this working directory (left out when the same), so a relative path is never a guess. An empty
    FLAG: a positional argument (`GIVEN: PROBLEM (ABSOLUTE)`)."""
    absolute = os.path.abspath(os.path.expanduser(str(given)))
    where = "" if absolute == str(given) else f" ({absolute})"
    return f"{flag + ' ' if flag else ''}{given}: {problem}{where}"


class NonFiniteNumberError(VaBenchError, ValueError):
    """A NaN or infinity where a number belongs: a bug upstream (exit 1), never written as null."""


def exception_line(exc: BaseException, limit: int = 300) -> str:
    """An exception as one line, its type first and its message's whitespace collapsed, cut at a word past `limit`
    characters (cell reasons, progress lines, a task's failure)."""
    text = " ".join(str(exc).split()) or "(no message)"
    if len(text) > limit:
        text = text[:limit].rsplit(" ", 1)[0] + " ..."
    return f"{type(exc).__name__}: {text}"
