"""`va-bench run` (the benchmark sweep) and `va-bench campaign` (one model fine-tuned per dataset)."""

from __future__ import annotations

from pathlib import Path

import typer

from harness.cli.app import app, fleet_module, progress, terminal, typed_argv
from harness.cli.options import DRY_RUN_FLAG, RUN_FLAGS, as_command, run_options
from harness.collector import imports_done, quiet_start
from harness.errors import RunInterrupted, RunStopped, UsageError, path_problem
from harness.views.output import StdoutGone, print_json


@quiet_start
def run_command(config: Path | None = None, resume: str | None = None, retry_failed: bool = False,
                force: bool = False, as_json: bool = False, dry_run: bool = False, **options) -> None:
    """Run the benchmark sweep; writes outputs/<run_id>/ (one va.submission.v1 per cell).

    Exit 0 when every cell is ok, 1 when a cell failed (the others still run) or an int8 row kept < 99 % of its
    fp32 mAP, 2 for bad input,
    130/143/129 when interrupted (SIGINT/SIGTERM/SIGHUP) (finished cells are kept: continue with --resume RUN_ID),
    141 when stdout's reader went away (| head)."""
    from harness.config import given, load_config
    from harness.run.plan import prepare  # light: its checks refuse bad options before torch is imported

    if resume is not None:
        from harness.run.resume import prepare_resume

        if config is not None:
            raise UsageError("--resume continues a run with its own configuration; drop --config")
        plan = prepare_resume(resume, options.get("output_dir"), given(options), force, retry_failed)
    else:
        if retry_failed or force:
            raise UsageError("--retry-failed and --force go with --resume RUN_ID")
        plan = prepare(load_config(config, options), dry_run=dry_run)
    from harness.run.scheduler import run_with_interrupts
    from harness.views.commands import run_header
    from harness.views.tables import int8_failing, print_plan, print_summary, summary_json

    imports_done()

    if dry_run:
        if resume is not None:
            raise UsageError("--dry-run plans a new run; drop --resume")
        described = plan.describe()
        print_json(terminal.out, (described)) if as_json else print_plan(terminal.out, described)
        return
    if not as_json:
        run_header(terminal.out, plan.run_id, plan, bool(plan.resume), str(plan.device))
    try:
        outcome = run_with_interrupts(plan, typed_argv(), progress())
    except (RunInterrupted, RunStopped) as exc:  # --json: a script still gets the cells' statuses, the finished
        if as_json and exc.outcome is not None:  # ones' figures, and what stopped the run (a signal, the storage)
            why = "interrupted" if isinstance(exc, RunInterrupted) else "stopped"
            try:
                print_json(terminal.out, summary_json(plan.run_dir, exc.outcome) | {why: str(exc)})
            except StdoutGone:  # Ctrl-C reached `| jq` too: the resume line and the signal's exit code still come
                pass
        raise
    if as_json:
        print_json(terminal.out, (summary_json(plan.run_dir, outcome)))
    else:
        print_summary(terminal.out, outcome)
    # a cell that failed, an extra process of --repeats that failed, or an int8 row that failed its accuracy rule
    # (validate calls that row an error)
    raise typer.Exit(1 if outcome.problems or outcome.repeat_failures or any(int8_failing(r) for r in outcome.records)
                     else 0)


app.command("run")(as_command(run_command, RUN_FLAGS + [DRY_RUN_FLAG] + run_options()))


@app.command()
def campaign(
    file: Path | None = typer.Argument(None, help="campaign YAML: model, split, datasets [{name, dataset, weights}]"),
    rf100vl: Path | None = typer.Option(None, "--rf100vl", help="an RF100-VL download (va-bench data fetch rf100vl)"),
    weights_root: Path | None = typer.Option(None, "--weights-root",
                                             help="with --rf100vl: one folder of fine-tuned weights per dataset"),
    model: str | None = typer.Option(None, "--model", help="with --rf100vl: the model id the weights are for"),
    split: str | None = typer.Option(None, "--split", help="with --rf100vl: the split every dataset is scored on "
                                                          "(test)"),
    backend: str | None = typer.Option(None, "--backend", help="the runtime of every dataset's run (over the "
                                                                "file's options; default pytorch)"),
    device: str | None = typer.Option(None, "--device", help="cpu, cuda or cuda:N (over the file's options; "
                                                             "default cpu)"),
    output_dir: Path = typer.Option(Path("outputs"), "--output-dir", help="where the campaign folder goes"),
    campaign_id: str | None = typer.Option(None, "--campaign-id",
                                           help="the campaign folder's name; the same id again resumes it"),
    as_json: bool = typer.Option(False, "--json", help="print the campaign's row and datasets as JSON"),
    on_fleet: bool = typer.Option(False, "--fleet", help="run each dataset as a task on the Ray cluster's nodes "
                                                         "of one hardware id (see docs/fleet.md)"),
    address: str | None = typer.Option(None, "--address", metavar="HOST:PORT",
                                       help="with --fleet: the Ray head (default: $RAY_ADDRESS or this machine's)"),
    hardware: str | None = typer.Option(None, "--hardware", metavar="ID",
                                        help="with --fleet: the hardware id to run on (default: the only one)"),
) -> None:
    """One model fine-tuned per dataset: a run per dataset (isolated, resumable) and one row in the site's
    RF100-VL shape (unweighted mean over datasets; partial{n} when some are missing), here or with --fleet on
    a Ray cluster (one task per dataset). Exit 0 when every dataset it lists was scored under the protocol, 1
    otherwise (some skipped, other options, several machines), 2 for bad input."""
    import re as _re

    from harness.results.campaign import scored_as_listed
    from harness.results.reader import read_json_object
    from harness.run.campaign import read_campaign_file, rf100vl_campaign, run_campaign, run_here
    from harness.views.commands import campaign_json, print_campaign

    options = {**({"backends": [backend]} if backend else {}), **({"device": device} if device else {})}
    if not on_fleet and (address is not None or hardware is not None):
        raise UsageError("--address and --hardware choose the cluster of --fleet; add --fleet or drop them")
    if (file is None) == (rf100vl is None):
        raise UsageError("give a campaign FILE or --rf100vl ROOT (with --weights-root and --model), one of them")
    if rf100vl is not None:
        if weights_root is None or model is None:
            raise UsageError("--rf100vl needs --weights-root DIR and --model ID (the family the weights are for)")
        plan = rf100vl_campaign(rf100vl, weights_root, model, split or "test", options)
    else:
        given = [flag for flag, value in (("--model", model), ("--weights-root", weights_root), ("--split", split))
                 if value is not None]
        if given:  # a campaign file names its model, weights and splits itself
            raise UsageError(f"{given[0]} applies to --rf100vl; a campaign FILE names its model, weights and split "
                             "itself: drop it")
        if not file.is_file():
            raise UsageError(path_problem("campaign file", file, "no such file") + "; give a campaign YAML")
        plan = read_campaign_file(file, options)
    campaign_id = campaign_id or f"{plan.model}-{rf100vl.name if rf100vl else file.stem}"
    from harness.config import SAFE_ID, reserved_name

    if not _re.fullmatch(SAFE_ID, campaign_id):
        raise UsageError(f"--campaign-id {campaign_id!r} is not a plain name: use letters, digits, '_', '.' and '-'")
    if not (output_dir / campaign_id).exists() and (problem := reserved_name(campaign_id)):  # a new campaign's
        raise UsageError(f"--campaign-id {campaign_id} {problem}; pick another")
    runner = run_here
    try:
        if on_fleet:
            from harness.fleet.join import loopback_driver

            loopback_driver(address)  # before ray is imported
            runner = fleet_module("campaign").prepare_campaign_fleet(address, hardware)
        path, results = run_campaign(plan, output_dir, campaign_id, typed_argv(), progress(),
                                     runner)
    finally:  # before the document: Ray's late error messages would follow it on stdout
        if on_fleet:
            fleet_module().disconnect()
    doc = read_json_object(path)
    if as_json:
        print_json(terminal.out, campaign_json(path, doc, results))
    else:
        print_campaign(terminal.out, path, doc, results)
    raise typer.Exit(0 if scored_as_listed(doc["rf100vl"], plan.expected) else 1)
