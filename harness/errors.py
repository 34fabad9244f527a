"""Errors the CLI turns into one clear line and an exit code (DESIGN: 1 = problem found, 2 = bad input)."""


class VaBenchError(Exception):
    """Base class: the message is the whole user-facing line (what is wrong, how to fix it)."""

    exit_code = 1


class UsageError(VaBenchError):
    """Bad usage or bad input (missing files, unknown model, inconsistent options): exit 2."""

    exit_code = 2


class RunInterrupted(VaBenchError):
    """A run stopped by SIGINT/SIGTERM: the message says what was kept and how to resume."""

    prefix = "interrupted"

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code
