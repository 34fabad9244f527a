"""The `va-bench` command line (Typer). Thin: parse, call, hand the result to views/.

`app` holds the Typer app, its groups and what every command shares; each module of COMMAND_MODULES registers a group
of commands; `main` is the entry point."""

import importlib

from harness.cli.app import app
from harness.cli.argv import expand_multi_value_options, renamed_file_options
from harness.cli.launch import entry, main

# imported in this order, `va-bench --help` lists their commands in it
COMMAND_MODULES = ("run", "results", "studies", "models", "data", "fleet")
for _name in COMMAND_MODULES:
    importlib.import_module(f"{__name__}.{_name}")

__all__ = ["app", "entry", "expand_multi_value_options", "main", "renamed_file_options"]
