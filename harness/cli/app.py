"""What every command of `va-bench` shares: the Typer app and its groups, the two consoles, the command as typed,
progress, and the small checks several commands make on their options."""

from __future__ import annotations

import importlib
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import typer
from rich.console import Console

from harness.errors import UsageError, path_problem
from harness.views.output import make_consoles, progress_for

# torch.profiler's C++ backend (kineto) logs every start/stop and a CUDA probe failure on CPU boxes
os.environ.setdefault("KINETO_LOG_LEVEL", "99")

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                  help="Benchmark object detectors: latency, throughput, memory, energy and COCO mAP.")
models_app = typer.Typer(no_args_is_help=True, help="List and fetch model weights.")
app.add_typer(models_app, name="models")
data_app = typer.Typer(no_args_is_help=True, help="Fetch datasets (COCO val2017, RF100-VL) and check your own.")
app.add_typer(data_app, name="data")
fleet_app = typer.Typer(no_args_is_help=True, help="One plan over a Ray cluster: each device benchmarks its own "
                                                     "cells, accuracy sharded over its nodes, results gathered here.")
app.add_typer(fleet_app, name="fleet")
parity_app = typer.Typer(no_args_is_help=True, help="Correctness studies: is an implementation choice a real change?")
app.add_typer(parity_app, name="parity")


@dataclass
class Terminal:
    """The commands' two consoles: `out` is stdout's (main() makes a --json call's the document's) and `err`
    stderr's, for progress, warnings and errors."""

    out: Console
    err: Console


terminal = Terminal(*make_consoles())


def _version(value: bool) -> None:
    if value:
        from harness import __version__

        terminal.out.print(f"va-bench {__version__}")
        raise typer.Exit()


@app.callback()
def _options(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                          help="print the version and exit"),
             debug: bool = typer.Option(False, "--debug", help="show tracebacks of errors")) -> None:
    """Benchmark object detectors: latency, throughput, memory, energy and COCO mAP."""


def click_context():
    """click's current context (None outside a command), from the click typer runs on: typer vendors its own from
    0.26 on."""
    package = typer.BadParameter.__module__.rpartition(".")[0]  # "click", or "typer._click"
    return importlib.import_module(f"{package}.globals").get_current_context(silent=True)


def typed_argv() -> list[str]:
    """The command as the user typed it (before multi-value expansion; for the record and the resume line): what
    main() hands the command in click's context object, else this process's argv (a command invoked otherwise)."""
    ctx = click_context()
    obj = ctx.find_root().obj if ctx is not None else None
    return list(obj["typed_argv"]) if isinstance(obj, dict) and "typed_argv" in obj else sys.argv[1:]


def progress():
    """Live bars on a terminal, plain progress lines when stderr is piped (with --json too: stdout is its
    document, progress stays on stderr)."""
    return progress_for(terminal.err)


def deprecated(old: str, new: str):
    """A hidden option `old` that still works as `new`, with one deprecation line on stderr when given."""
    def warn(value):
        if value is not None:
            terminal.err.print(f"[yellow]deprecated[/]: {old} is now {new}; the old spelling will be removed",
                               highlight=False)
        return value

    return typer.Option(None, old, hidden=True, callback=warn)


def run_field(name: str, flag: str | None = None, default=..., **constraints):
    """A command's option declared by a RunConfig field: the same help (and flag and default unless given)."""
    from harness.config import RunConfig

    field = RunConfig.model_fields[name]
    flags = field.json_schema_extra["flags"]
    value = field.get_default(call_default_factory=True) if default is ... else default
    return typer.Option(value, flag or flags[0], help=constraints.pop("help", field.description), **constraints)


def check_output(flag: str, path: Path | None) -> None:
    """One UsageError line when the file an option names cannot be written (before the command's work)."""
    from harness.files import output_file_problem

    problem = None if path is None else output_file_problem(path)
    if problem:
        raise UsageError(path_problem(flag, path, problem) + "; give a file path in a writable folder")


def diff_thresholds(pair_iou: float, diff_conf: float, old_iou: float | None,
                    old_conf: float | None) -> tuple[float, float]:
    """The detection diff's pairing IoU and score cut (the deprecated spellings win when given), range-checked."""
    pair_iou = old_iou if old_iou is not None else pair_iou
    diff_conf = old_conf if old_conf is not None else diff_conf
    if not 0 < pair_iou <= 1:
        raise UsageError(f"--pair-iou {pair_iou}: must be in (0, 1]")
    if not 0 <= diff_conf <= 1:
        raise UsageError(f"--diff-conf {diff_conf}: must be in [0, 1]")
    return pair_iou, diff_conf


def fleet_module(name: str = "driver"):
    """harness.fleet.<name>, or one line saying how to install Ray."""
    try:
        return importlib.import_module(f"harness.fleet.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != "ray":
            raise
        raise UsageError("va-bench fleet needs Ray, which is not installed: pip install 'va-bench[fleet]'") from None
