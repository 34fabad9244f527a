"""`va-bench run`'s options (and `fleet run`'s), built from RunConfig's field declarations so that each option is
declared once (harness/config.py): their Typer types, metavars and defaults, and the flags only a command has."""

from __future__ import annotations

import inspect
import typing
from collections.abc import Callable
from pathlib import Path

import typer


def _cli_type(annotation):
    """The Typer type of a RunConfig field: Optional of it (None = "not given"); Literals as str."""
    origin = typing.get_origin(annotation)
    if origin is list:
        return list[typing.get_args(annotation)[0]] | None
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if origin is typing.Literal or any(typing.get_origin(a) is typing.Literal for a in args):
        return str | None  # a Literal, or an optional one
    return (args[0] if args else annotation) | None


def _default_text(field) -> str | None:
    value = field.get_default(call_default_factory=True)
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, list):
        return " ".join(map(str, value)) or None
    return None if value is None else str(value)


def _metavar(annotation) -> str | None:
    """What a value looks like in --help (N..., X, TEXT, a|b|c); None for flags."""
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return "|".join(typing.get_args(annotation))
    if origin is list:
        return {int: "N", str: "NAME"}[typing.get_args(annotation)[0]] + "..."
    args = [a for a in typing.get_args(annotation) if a is not type(None)] or [annotation]
    if typing.get_origin(args[0]) is typing.Literal:  # an optional Literal
        return _metavar(args[0])
    return {bool: None, int: "N", float: "X", str: "TEXT"}[args[0]]


def run_options() -> list[inspect.Parameter]:
    """`va-bench run`'s options, built from RunConfig's field declarations (each option is declared once)."""
    from harness.config import run_option_fields

    params = []
    for name, field in run_option_fields().items():
        flags = field.json_schema_extra["flags"]
        default = _default_text(field)
        option = typer.Option(None, *flags, help=field.description + (f"  [default: {default}]" if default else ""),
                              show_default=False, metavar=_metavar(field.annotation))
        params.append(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option,
                                        annotation=_cli_type(field.annotation)))
    return params


RUN_FLAGS = [
    inspect.Parameter("config", inspect.Parameter.KEYWORD_ONLY, annotation=Path | None,
                      default=typer.Option(None, "--config", metavar="PATH|NAME",
                                           help="YAML preset: a file, or a built-in preset's name (`default` is "
                                                "what `make bench` runs; without --config, no preset); flags "
                                                "override it")),
    inspect.Parameter("resume", inspect.Parameter.KEYWORD_ONLY, annotation=str | None,
                      default=typer.Option(None, "--resume", metavar="RUN_ID",
                                           help="continue the run folder --output-dir/RUN_ID: run its pending and "
                                                "interrupted cells")),
    inspect.Parameter("retry_failed", inspect.Parameter.KEYWORD_ONLY, annotation=bool,
                      default=typer.Option(False, "--retry-failed",
                                           help="with --resume: also re-run failed, oom and skipped cells")),
    inspect.Parameter("force", inspect.Parameter.KEYWORD_ONLY, annotation=bool,
                      default=typer.Option(False, "--force", help="with --resume: accept other options, another "
                                                                  "harness commit or another machine")),
    inspect.Parameter("as_json", inspect.Parameter.KEYWORD_ONLY, annotation=bool,
                      default=typer.Option(False, "--json", help="print the run summary as JSON")),
]
# `va-bench run` only (a fleet plans over its cluster's nodes)
DRY_RUN_FLAG = inspect.Parameter("dry_run", inspect.Parameter.KEYWORD_ONLY, annotation=bool,
                                 default=typer.Option(False, "--dry-run",
                                                      help="print the plan (cells, batches, timed batches, what each "
                                                           "group loads) and exit; writes nothing"))


def as_command(function: Callable[..., None], params: list[inspect.Parameter]) -> Callable[..., None]:
    """`function` (keyword arguments) under the signature `params`: Typer reads a command's options from it."""
    def command(**kwargs) -> None:
        function(**kwargs)

    command.__signature__ = inspect.Signature(params)
    command.__annotations__ = {p.name: p.annotation for p in params} | {"return": None}
    command.__doc__ = function.__doc__
    return command
