"""The process's entry point: argv made ready, the Typer app run, and every error one line with its exit code."""

from __future__ import annotations

import os
import sys

import typer

from harness.cli.app import app, terminal
from harness.cli.argv import expand_multi_value_options, renamed_file_options, repeated_options
from harness.errors import UsageError, VaBenchError
from harness.views.output import (
    StdoutGone,
    document_console,
    make_consoles,
    stdout_kept_for_the_document,
    tolerant_streams,
)
from harness.views.text import escape

STDOUT_GONE_EXIT = 128 + 13  # 128 + SIGPIPE, what a shell reports for a writer its reader left (POSIX numbering)


def _stdout_to_devnull() -> None:
    """Point fd 1 at /dev/null, so that the flushes at exit find somewhere to write (no 'Exception ignored')."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (AttributeError, OSError, ValueError):
        pass


def entry() -> None:
    """The process's entry point (`va-bench`, `python -m harness`): `main`, then the process ends without the
    interpreter's teardown of torch (harness.process_exit)."""
    from harness.process_exit import leave

    try:
        main()
    except SystemExit as exc:
        leave(exc.code)
    leave(0)


def _run_app(argv: list[str], typed: list[str]) -> int:
    """The typer app on `argv` (`typed`: as the user typed it, for the commands that record it), its exit code.
    Click's own usage errors (an unknown option, a value out of range) become one UsageError line like every
    other refusal, instead of click's usage block."""
    # click's exceptions where this typer keeps them (typer vendors its own click since 0.26)
    clicks = sys.modules[typer.BadParameter.__module__]
    no_args = getattr(clicks, "NoArgsIsHelpError", ())
    command = typer.main.get_command(app)
    for line in repeated_options(command, argv):
        terminal.err.print(f"[yellow]warning[/]: {escape(line)}", highlight=False, soft_wrap=True)
    try:
        code = command.main(args=argv, prog_name="va-bench", standalone_mode=False, obj={"typed_argv": typed})
    except no_args as exc:  # `va-bench fleet`: its help, as click shows it
        exc.show()
        return exc.exit_code
    except clicks.UsageError as exc:
        where = exc.ctx.command_path if exc.ctx is not None else "va-bench"
        raise UsageError(f"{exc.format_message().rstrip('.')}; see `{where} --help`") from exc
    except clicks.ClickException as exc:
        raise VaBenchError(exc.format_message()) from exc
    except typer.Abort:
        terminal.err.print("aborted", highlight=False)
        return 1
    return code if isinstance(code, int) else 0


def main() -> None:
    """The command line: one clear line per error, exit 2 for bad input, traceback only with --debug."""
    from harness.run.signals import Interrupted, interrupt_handling

    tolerant_streams()  # a terminal that cannot show Δ or · gets a stand-in, not an error
    terminal.out, terminal.err = make_consoles()
    typed = [a for a in sys.argv[1:] if a != "--debug"]  # the command as typed, for the record
    debug = "--debug" in sys.argv[1:]
    argv = expand_multi_value_options(renamed_file_options(typed))
    sys.argv = [sys.argv[0], *argv]
    try:
        with interrupt_handling(), stdout_kept_for_the_document("--json" in argv) as document:
            if document is not None:
                terminal.out = document_console(document)
            try:
                sys.exit(_run_app(argv, typed))
            finally:  # the document's stream is closed when the block ends: the next call (a test's) gets stdout's
                terminal.out = make_consoles()[0]
    except VaBenchError as exc:
        if debug:
            raise
        prefix = getattr(exc, "prefix", None) or "[red]error[/]"
        terminal.err.print(f"{prefix}: " + escape(str(exc)), highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except StdoutGone:  # `| head`: what was asked is done or moot; the shell's status for a reader gone
        _stdout_to_devnull()
        sys.exit(STDOUT_GONE_EXIT)
    except Interrupted as exc:  # outside a run's cells (a run stopped mid-sweep says more: RunInterrupted)
        again = ("run the same command again to continue (a download resumes where it stopped)"
                 if argv[:2] in (["data", "fetch"], ["models", "fetch"]) else "run the same command again")
        terminal.err.print(f"interrupted ({exc}); {again}", highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except Exception as exc:  # anything unexpected: still one line unless --debug
        if debug:
            raise
        message = escape(f"{type(exc).__name__}: {exc}")
        terminal.err.print(f"[red]error[/]: {message} (rerun with --debug for the traceback)",
                           highlight=False, soft_wrap=True)
        sys.exit(1)
