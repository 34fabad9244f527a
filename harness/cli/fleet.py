"""`va-bench fleet run` (one plan over a Ray cluster) and `va-bench fleet join` (a device joins it)."""

from __future__ import annotations

import inspect
from pathlib import Path

import typer

from harness.cli.app import fleet_app, fleet_module, progress, terminal, typed_argv
from harness.cli.options import RUN_FLAGS, as_command, run_options
from harness.errors import UsageError
from harness.views.output import print_json
from harness.views.text import escape

FLEET_FLAGS = [
    inspect.Parameter("address", inspect.Parameter.KEYWORD_ONLY, annotation=str | None,
                      default=typer.Option(None, "--address", metavar="HOST:PORT",
                                           help="the Ray head (default: $RAY_ADDRESS or the cluster on this machine)")),
    inspect.Parameter("hardware", inspect.Parameter.KEYWORD_ONLY, annotation=list[str] | None,
                      default=typer.Option(None, "--hardware", metavar="ID",
                                           help="run on these hardware ids (--hardware a b; default: every hardware "
                                                "id of the cluster's accepted nodes)")),
    inspect.Parameter("accuracy_shards", inspect.Parameter.KEYWORD_ONLY, annotation=int | None,
                      default=typer.Option(None, "--accuracy-shards", metavar="N", min=1,
                                           help="also split each group's accuracy pass into N shards over the "
                                                "accepted nodes of its hardware and evaluate their merged detections "
                                                "once (<run_id>/accuracy/)")),
]


def fleet_run_command(config: Path | None = None, resume: str | None = None, retry_failed: bool = False,
                      force: bool = False, as_json: bool = False, address: str | None = None,
                      hardware: list[str] | None = None, accuracy_shards: int | None = None, **options) -> None:
    """Run the benchmark sweep on every device of a Ray cluster; gathers outputs/<run_id>/<hardware id>/.

    The same options as `va-bench run`; each cell runs on a node of its hardware, one benchmark per node at a
    time. Exit 0 when every cell is ok, 1 when a cell or shard failed or was interrupted (the rest still runs;
    continue with --resume RUN_ID), 2 for bad input, 130/143/129 when interrupted (SIGINT/SIGTERM/SIGHUP). See
    docs/fleet.md."""
    from harness.config import given, load_config
    from harness.fleet.join import loopback_driver
    from harness.views.commands import run_header
    from harness.views.fleet_view import fleet_summary_json, print_fleet_summary

    loopback_driver(address)  # before ray is imported
    fleet = fleet_module()
    try:
        if resume is not None:
            if config is not None:
                raise UsageError("--resume continues a fleet run with its own configuration; drop --config")
            fplan = fleet.prepare_fleet_resume(resume, options.get("output_dir"), given(options), address, hardware,
                                               accuracy_shards, force, retry_failed)
        else:
            if retry_failed or force:
                raise UsageError("--retry-failed and --force go with --resume RUN_ID")
            fplan = fleet.prepare_fleet(load_config(config, options), address, hardware, accuracy_shards or 0)
        if not as_json:
            run_header(terminal.out, fplan.run_id, fplan.plan, bool(fplan.fleet_doc), ", ".join(fplan.targets),
                       prefix="fleet ")
        outcome = fleet.run_fleet(fplan, typed_argv(), progress())
    finally:  # before the document: Ray's late error messages would follow it on stdout
        fleet.disconnect()
    if as_json:
        print_json(terminal.out, (fleet_summary_json(outcome)))
    else:
        print_fleet_summary(terminal.out, outcome)
    raise typer.Exit(1 if outcome.problems else 0)


fleet_app.command("run")(as_command(fleet_run_command, RUN_FLAGS + FLEET_FLAGS + run_options()))


@fleet_app.command("join")
def fleet_join(
    address: str | None = typer.Option(None, "--address", metavar="HOST:PORT", help="the head to join"),
    head: bool = typer.Option(False, "--head", help="start the cluster's head here (it is a device of the fleet too)"),
    port: int = typer.Option(6379, "--port", help="with --head: the port the head listens on"),
    node_ip_address: str | None = typer.Option(None, "--node-ip-address", metavar="IP",
                                               help="this node's address on the private network (see docs/fleet.md)"),
    hardware_id: str | None = typer.Option(None, "--hardware-id", metavar="ID",
                                           help="advertise this hardware id instead of `va-bench hw`'s"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the `ray start` command and exit"),
    extra: list[str] | None = typer.Argument(None, metavar="[-- RAY_START_OPTIONS...]",
                                             help="more `ray start` options (TLS, ports), after --"),
) -> None:
    """Start Ray on this device with its hardware id as a resource (`ray start`, wrapped); stop with `ray stop`."""
    from harness import shell
    from harness.fleet.join import check_reachable, join_command, start

    command = join_command(address, head, port, node_ip_address, hardware_id, extra or [])
    if address is not None and not dry_run:  # `ray start` retries an unreachable head for minutes, line by line
        check_reachable(address)
    env = " ".join(f"{k}={v}" for k, v in command.env_added.items())
    terminal.out.print(f"hardware id [bold]{escape(command.hardware_id)}[/]: {escape((env + ' ') if env else '')}"
                       f"{escape(shell.join(command.argv))}", highlight=False, soft_wrap=True)
    if dry_run:
        return
    status = start(command)
    if status:
        raise typer.Exit(status)
