"""The `va-bench` command line (Typer). Thin: parse, call, print."""

from __future__ import annotations

import importlib
import inspect
import math
import os
import sys
import typing
from pathlib import Path

import typer

from harness.collector import imports_done, quiet_start
from harness.errors import RunInterrupted, UsageError, VaBenchError, path_problem
from harness.report import EXAMPLE_GATES
from harness.views.output import (
    StdoutGone,
    document_console,
    make_consoles,
    print_json,
    progress_for,
    stdout_kept_for_the_document,
    tolerant_streams,
    write_stdout,
)
from harness.views.text import escape

# torch.profiler's C++ backend (kineto) logs every start/stop and a CUDA probe failure on CPU boxes
os.environ.setdefault("KINETO_LOG_LEVEL", "99")

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=None,
                  help="Benchmark object detectors: latency, throughput, memory, energy and COCO mAP.")
models_app = typer.Typer(no_args_is_help=True, help="List and fetch model weights.")
app.add_typer(models_app, name="models")
data_app = typer.Typer(no_args_is_help=True, help="Fetch datasets (COCO val2017, RF100-VL) and check your own.")
app.add_typer(data_app, name="data")


console, err_console = make_consoles()


def _version(value: bool) -> None:
    if value:
        from harness import __version__

        console.print(f"va-bench {__version__}")
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


def _progress():
    """Live bars on a terminal, plain progress lines when stderr is piped (with --json too: stdout is its
    document, progress stays on stderr)."""
    return progress_for(err_console)


def deprecated(old: str, new: str):
    """A hidden option `old` that still works as `new`, with one deprecation line on stderr when given."""
    def warn(value):
        if value is not None:
            err_console.print(f"[yellow]deprecated[/]: {old} is now {new}; the old spelling will be removed",
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


# Commands whose list options take several values after one flag, like `run --batch-sizes 1 2 4`; commands with
# positional arguments (compare, aggregate) repeat the flag instead, so a value is never taken for a path.
EXTRA_MULTI_VALUE_FLAGS = {("fleet", "run"): {"--hardware"}, ("parity", "preprocess"): {"--impls"}}


def multi_value_flags() -> set[str]:
    """Flags of list-typed run options: they take several values after one flag (`--batch-sizes 1 2 4`)."""
    from harness.config import run_option_fields

    return {flag for f in run_option_fields().values() if typing.get_origin(f.annotation) is list
            for flag in f.json_schema_extra["flags"]}


def renamed_file_options(argv: list[str]) -> list[str]:
    """`parity preprocess --json PATH` (its old file output) is `--json-out PATH` now; `--json` alone prints JSON."""
    if argv[:2] != ["parity", "preprocess"]:
        return list(argv)
    out = []
    for i, token in enumerate(argv):
        if token.startswith("--json="):
            token = "--json-out=" + token.split("=", 1)[1]
        elif token == "--json" and i + 1 < len(argv) and not argv[i + 1].startswith("-"):
            token = "--json-out"
        else:
            out.append(token)
            continue
        err_console.print("[yellow]deprecated[/]: parity preprocess --json PATH is now --json-out PATH (--json "
                          "prints the report as JSON)", highlight=False)
        out.append(token)
    return out


def expand_multi_value_options(argv: list[str]) -> list[str]:
    """['--batch-sizes', '1', '2'] -> ['--batch-sizes', '1', '--batch-sizes', '2'] (Click has no nargs=-1
    for options, so main() rewrites them into repeated flags before Typer parses argv)."""
    command = tuple(argv[:1]) if argv[:1] == ["run"] else tuple(argv[:2])
    if command not in (("run",), ("fleet", "run"), ("parity", "preprocess")):  # options of one value each
        return list(argv)
    multi = EXTRA_MULTI_VALUE_FLAGS.get(command, set()) | (multi_value_flags() if command != ("parity", "preprocess")
                                                           else set())
    out: list[str] = []
    current = None
    for token in argv:
        if token.startswith("-"):
            current = token if token in multi else None
            out.append(token)
        elif current is not None and out[-1] != current:
            out += [current, token]
        else:
            out.append(token)
    return out


def repeated_options(command, argv: list[str]) -> list[str]:
    """A warning for each option of one value given more than once (`--dataset A --dataset B`): Click keeps the last
    one without a word, and a user who gave two datasets (as `--model` takes two models) would see one scored, not
    knowing which; a script's later flag overriding an earlier one (`$COMMON --limit 4`) still works."""
    leaf, tokens = command, list(argv)
    while tokens and tokens[0] in getattr(leaf, "commands", {}):
        leaf, tokens = leaf.commands[tokens[0]], tokens[1:]
    params = getattr(leaf, "params", ())
    single = {opt: param for param in params if getattr(param, "is_flag", True) is False
              and not param.multiple for opt in param.opts}
    switches = {opt: param for param in params if getattr(param, "is_flag", False) and param.secondary_opts
                for opt in (*param.opts, *param.secondary_opts)}  # --x/--no-x
    given: dict[str, list[str]] = {}
    flags: dict[str, str] = {}
    turned: dict[str, list[str]] = {}
    tokens = iter(tokens)
    for token in tokens:
        flag, equals, value = token.partition("=")
        param = single.get(flag)
        if param is not None:
            given.setdefault(param.name, []).append(value if equals else next(tokens, ""))
            flags[param.name] = flag
        elif token in switches:
            turned.setdefault(switches[token].name, []).append(token)
    warnings = [f"{flags[name]} is given {len(values)} times ({', '.join(values)}): it takes one value, and the "
                f"last, {values[-1]}, is the one used" for name, values in given.items() if len(set(values)) > 1]
    return warnings + [f"{' and '.join(dict.fromkeys(used))} are both given: the last, {used[-1]}, is the one used"
                       for used in turned.values() if len(set(used)) > 1]


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


def _run_options() -> list[inspect.Parameter]:
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
        print_json(console, (described)) if as_json else print_plan(console, described)
        return
    if not as_json:
        run_header(console, plan.run_id, plan, bool(plan.resume), str(plan.device))
    try:
        outcome = run_with_interrupts(plan, typed_argv(), _progress())
    except RunInterrupted as exc:  # --json: a script still gets the cells' statuses, the finished ones' figures
        if as_json and exc.outcome is not None:
            try:
                print_json(console, summary_json(plan.run_dir, exc.outcome) | {"interrupted": str(exc)})
            except StdoutGone:  # Ctrl-C reached `| jq` too: the resume line and the signal's exit code still come
                pass
        raise
    if as_json:
        print_json(console, (summary_json(plan.run_dir, outcome)))
    else:
        print_summary(console, outcome)
    # a cell that failed, an extra process of --repeats that failed, or an int8 row that failed its accuracy rule
    # (validate calls that row an error)
    raise typer.Exit(1 if outcome.problems or outcome.repeat_failures or any(int8_failing(r) for r in outcome.records)
                     else 0)


def _register_run() -> None:
    params = RUN_FLAGS + [DRY_RUN_FLAG] + _run_options()
    fixed = {p.name for p in RUN_FLAGS} | {DRY_RUN_FLAG.name}

    def run(**kwargs) -> None:
        run_command(**{k: v for k, v in kwargs.items() if k in fixed},
                    **{k: v for k, v in kwargs.items() if k not in fixed})

    run.__signature__ = inspect.Signature(params)
    run.__annotations__ = {p.name: p.annotation for p in params} | {"return": None}
    run.__doc__ = run_command.__doc__
    app.command("run")(run)


_register_run()


@app.command()
def validate(
    paths: list[Path] = typer.Argument(..., help="submission files or folders of them"),
    support_matrix: Path | None = typer.Option(None, "--support-matrix",
                                                  help="the site's support-matrix.json (allow-lists)"),
    warnings: bool = typer.Option(True, "--warnings/--no-warnings", help="list warnings too"),
    as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
) -> None:
    """Check submissions: site schema and rules, numeric types, commit guard, coordinates, dataset
    fingerprint, degenerate statistics, protocol, random weights, the run's detections (a run folder:
    its submissions/ only). Exit 0 clean, 1 errors found, 2 bad usage."""
    from harness.catalogue import pending_site_ids
    from harness.results.validate import load_support_matrix, validate_paths
    from harness.views.commands import print_validation, validation_json

    support = load_support_matrix(support_matrix)
    validation = validate_paths(paths, support, _progress(), pending_site_ids())
    if as_json:
        print_json(console, validation_json(validation))
    else:
        print_validation(console, validation, warnings)
    n_errors = sum(len(r.errors) for r in validation.reports)
    raise typer.Exit(1 if n_errors else 0)


@app.command()
def aggregate(
    paths: list[Path] = typer.Argument(..., help="folders or files of submissions"),
    output: Path | None = typer.Option(None, "-o", "--output", help="write the leaderboard JSON here"),
    reference_hardware: str = typer.Option("a100", "--reference-hardware",
                                           help="hardware whose full-val runs give the canonical accuracy"),
    fallback_hardware: list[str] | None = typer.Option(None, "--fallback-hardware",
                                                          help="order to try when the reference has no run"),
    tolerance: float = typer.Option(0.3, "--tolerance", help="agreement gate, in mAP points"),
    support_matrix: Path | None = typer.Option(None, "--support-matrix",
                                                  help="the site's support-matrix.json the files are checked "
                                                       "against (allow-lists)"),
    strict: bool = typer.Option(False, "--strict", help="exit 1 when the agreement gate finds drift"),
    leaderboard_variant: str = typer.Option("full", "--leaderboard-variant",
                                            help="the leaderboard shows this variant's canonical accuracy only"),
    as_json: bool = typer.Option(False, "--json", help="print the leaderboard JSON on stdout"),
    plot: Path | None = typer.Option(None, "--plot", help="draw the speed-accuracy fronts of the detection board "
                                                          "into this PNG (one panel per hardware id)"),
) -> None:
    """Many submissions -> one leaderboard: full-coordinate identity, canonical accuracy, agreement gate."""
    from harness.catalogue import pending_site_ids, size_ranks
    from harness.files import atomic_write_bytes, atomic_write_json
    from harness.results.aggregate import aggregate as build
    from harness.results.validate import load_support_matrix, validate_paths
    from harness.views.commands import print_leaderboard

    if not math.isfinite(tolerance) or tolerance < 0:  # NaN compares false with everything: no gate at all
        raise UsageError(f"--tolerance {tolerance}: must be a number >= 0 (mAP points)")
    _check_output("--output", output)
    _check_output("--plot", plot)
    if plot is not None and plot.suffix.lower() != ".png":  # one format: a name that says another would lie
        raise UsageError(f"--plot {plot}: the figure is a PNG; give a file name ending in .png")
    support = load_support_matrix(support_matrix)
    validation = validate_paths(paths, support, _progress(), pending_site_ids())
    board = build(validation.reports, reference_hardware, tolerance, fallback_hardware, leaderboard_variant,
                  size_ranks())
    board["notes"] = list(validation.notes)  # what was read and what skipped, as the text says it
    if board["counts"]["files"] and board["counts"]["not_submissions"] == board["counts"]["files"]:
        first = board["excluded"][0]
        raise UsageError(f"none of the {board['counts']['files']} files is a va.submission.v1 (first: {first['file']}: "
                         f"{(first['errors'] or ['unreadable'])[0]}); give submission files or run folders")
    figure = _speed_accuracy_figure(board, plot) if plot is not None else None  # refused before any file is written
    if output is not None:
        atomic_write_json(output, board)
    if figure is not None:
        atomic_write_bytes(plot, figure.png)
    if as_json:
        print_json(console, board)
    else:
        print_leaderboard(console, board, board["notes"], output)
    if figure is not None:
        err_console.print(f"speed-accuracy fronts: {plot}" + "".join(f"; {n}" for n in figure.notes[1:]),
                          highlight=False, soft_wrap=True)
    raise typer.Exit(1 if strict and board["agreement_gate"] else 0)


def _speed_accuracy_figure(board: dict, path: Path):
    """The detection board's speed-accuracy fronts (report.plots.Plot); a UsageError where there is nothing to
    draw, since the figure asked for cannot be made."""
    from harness.report.plots import speed_accuracy

    drawn = speed_accuracy(board)
    if drawn.png is None:
        raise UsageError(f"--plot {path}: nothing to draw: {drawn.unavailable}; aggregate runs that have it, or "
                         "pick another --leaderboard-variant")
    return drawn


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
            runner = _fleet_module("campaign").prepare_campaign_fleet(address, hardware)
        path, results = run_campaign(plan, output_dir, campaign_id, typed_argv(), _progress(),
                                     runner)
    finally:  # before the document: Ray's late error messages would follow it on stdout
        if on_fleet:
            _fleet_module().disconnect()
    doc = read_json_object(path)
    if as_json:
        print_json(console, campaign_json(path, doc, results))
    else:
        print_campaign(console, path, doc, results)
    raise typer.Exit(0 if scored_as_listed(doc["rf100vl"], plan.expected) else 1)


@app.command()
def schema() -> None:
    """Print the extended va.submission.v1 JSON Schema (a superset of the site's)."""
    from harness.results.validate import EXTENDED_SCHEMA

    write_stdout(EXTENDED_SCHEMA.read_text(encoding="utf-8"))


@app.command()
def hw(as_json: bool = typer.Option(False, "--json", help="print the report as JSON")) -> None:
    """What this machine is (hardware id, CPU, GPU, RAM) and which probes work here, or why not."""
    from harness.measure.machine import machine_report
    from harness.views.commands import print_hw

    report = machine_report()
    print_json(console, report) if as_json else print_hw(console, report)


@data_app.command("fetch")
def data_fetch(
    dataset: str = typer.Argument(..., help="coco (val2017 images + annotations) or rf100vl (the 100 RF100-VL "
                                             "datasets; needs ROBOFLOW_API_KEY and `pip install rf100vl`)"),
    dest: Path | None = typer.Option(None, "--dest", help="where the dataset goes (default: datasets/coco or "
                                                           "datasets/rf100vl here, where runs look first)"),
    base_url: str | None = typer.Option(None, "--base-url",
                                        help="coco: a mirror of the COCO site (same paths), or file:// for a local "
                                             "copy (default http://images.cocodataset.org)"),
    keep_archives: bool = typer.Option(False, "--keep-archives", help="coco: keep the verified zip files"),
) -> None:
    """Download COCO val2017 (SHA-1 verified, resumable) into the layout the harness reads, or the RF100-VL datasets
    (Roboflow's client, each at its latest version, resumable)."""
    from harness.data.fetch import COCO_BASE_URL, fetch_archives
    from harness.views.progress import download_progress

    if dataset == "rf100vl":
        from harness.data.fetch import fetch_rf100vl

        given = [flag for flag, value in (("--base-url", base_url), ("--keep-archives", keep_archives)) if value]
        if given:  # Roboflow's client downloads them: neither applies
            verb = "applies" if len(given) == 1 else "apply"
            raise UsageError(f"{' and '.join(given)} {verb} to `data fetch coco`; RF100-VL comes through Roboflow's "
                             "client: drop them")

        target = dest or Path("datasets") / "rf100vl"
        lines = fetch_rf100vl(target, progress=lambda line: err_console.print(escape(line), highlight=False))
        console.print(f"{len(lines)} RF100-VL datasets in {target} (versions in {target / 'rf100vl_versions.json'})")
        return
    if dataset != "coco":
        raise UsageError(f"unknown dataset {dataset!r}; use `va-bench data fetch coco` or `... rf100vl`")
    if dest is None:
        dest = Path("datasets") / "coco"
    with download_progress(err_console) as progress:
        lines = fetch_archives(dest, base_url=COCO_BASE_URL if base_url is None else base_url, progress=progress,
                               keep_archives=keep_archives)
    for line in lines:
        console.print(escape(line), highlight=False)


@data_app.command("check")
def data_check(
    dataset: str | None = typer.Option(None, "--dataset", help="your own dataset, as `run --dataset` takes it (COCO "
                                                               "JSON, Roboflow export, YOLO data.yaml)"),
    split: str | None = typer.Option(None, "--split", help="--dataset: the split, as `run --split`"),
    coco_dir: str | None = typer.Option(None, "--coco-dir", help="COCO val2017 root (default: as `run` finds it)"),
    subset: str = typer.Option("sample", "--subset", help="dataset variant: full, mini500 or sample"),
    limit: int | None = typer.Option(None, "--limit", help="first N images of the variant"),
    model: str | None = typer.Option(None, "--model", help="also match this model's classes to the categories, as "
                                                           "a run would (refused the same way)"),
    weights: str | None = typer.Option(None, "--weights", help="the model's weights (its class names: a fine-tuned "
                                                               "checkpoint's own)"),
    class_map: str | None = typer.Option(None, "--class-map", help="as `run --class-map`"),
    masks: bool = typer.Option(True, "--masks/--no-masks", help="a segmentation model's masks are scored (its "
                                                                  "ground truth needs masks), as `run --no-masks`"),
    as_json: bool = typer.Option(False, "--json", help="the whole summary as JSON on stdout"),
) -> None:
    """Read a dataset as a run would (every check a run makes before it starts) and say what it holds: images,
    objects per category by COCO's area ranges, crowd regions, masks; with --model, which of its classes each
    category scores as. Exit 2, one line, where a run would be refused."""
    from harness.config import build_config
    from harness.data.classes import ClassMap, model_class_names
    from harness.data.summary import summarize
    from harness.run.plan import open_dataset, scoring_checks
    from harness.views.commands import print_dataset_summary

    if weights is not None and model is None:
        raise UsageError("--weights goes with --model (the weights' class names are matched); add --model NAME")
    fields = {"dataset": dataset, "split": split, "coco_dir": coco_dir, "subset": subset, "limit": limit,
              "class_map": class_map, "weights": weights, "masks": masks}
    config = build_config({k: v for k, v in fields.items() if v is not None})
    data = open_dataset(config)  # the run's own checks, in its order: the dataset, its variant, then the model
    variant = data.variant(config.subset, config.limit)
    detectors = {}
    if model is not None:  # its classes, whatever runtime would run it (no runtime is loaded)
        from harness.models.registry import get_detector

        detector = get_detector(model, weights, fetch=False)  # its classes: no download
        detectors[detector.model_id] = detector
    matched = scoring_checks(config, data, variant, detectors, ClassMap.read(class_map) if class_map else None)
    if model is None:
        summary = summarize(data, variant)
    else:
        summary = summarize(data, variant, detector.model_id, model_class_names(detector), matched[detector.model_id])
    if as_json:
        print_json(console, summary.to_dict())
    else:
        print_dataset_summary(console, summary)


@models_app.command("list")
def models_list(
    family: str | None = typer.Option(None, "--family", help="only this family (e.g. rtmdet)"),
    task: str | None = typer.Option(None, "--task", help="only this task: detect or segment"),
    as_json: bool = typer.Option(False, "--json", help="print the registry as JSON"),
) -> None:
    """Registered models, their task and whether their weights are present locally; the families the
    leaderboard names that cannot be built here are listed as not available, with why."""
    from harness.catalogue import unavailable_families
    from harness.models.registry import REGISTRY
    from harness.views.commands import models_table

    if task is not None and task not in ("detect", "segment"):
        raise UsageError(f"--task {task!r}: use detect or segment")
    families = {e.family for e in REGISTRY.values()} | {u.family for u in unavailable_families()}
    if family is not None and family not in families:
        raise UsageError(f"--family {family!r} is not a family here; families: {', '.join(sorted(families))}")
    rows = []
    libreyolo_ids = _libreyolo_ids()  # fetched through libreyolo's own download
    for entry in REGISTRY.values():
        if family in (None, entry.family) and task in (None, entry.task):
            found = entry.local_weights()
            rows.append({"id": entry.model_id, "family": entry.family, "task": entry.task, "available": True,
                         "weights": str(found) if found else None, "url": entry.weights_url, "note": entry.note,
                         "fetch": bool(entry.weights_url) or entry.model_id in libreyolo_ids})
    for missing in unavailable_families():
        if family in (None, missing.family) and task in (None, "detect"):
            rows += [{"id": model_id, "family": missing.family, "task": "detect", "available": False, "weights": None,
                      "url": None, "note": f"not available: {missing.why}", "fetch": False} for model_id in missing.ids]
    if not rows and not as_json:  # a family and a task that do not meet: say so, not an empty table
        console.print(f"no {task} model in the {family} family; `va-bench models list --task {task}` lists them",
                      highlight=False)
        return
    print_json(console, rows) if as_json else console.print(models_table(rows, console.width))


def _libreyolo_ids() -> set[str]:
    from harness.models.libreyolo import catalogue

    return set(catalogue())


@models_app.command("fetch")
def models_fetch(
    model_id: str = typer.Argument(..., help="registry id, e.g. yolox-s"),
    force: bool = typer.Option(False, "--force", help="download again even when the weights are found locally"),
    base_url: str | None = typer.Option(None, "--base-url", help="a mirror holding the release's files under their "
                                                                  "own names (http(s):// or file://)"),
) -> None:
    """Download a model's official weights into the weights cache (nothing to do when they are found locally); a
    release file whose SHA-256 is pinned is checked against it."""
    from harness.catalogue import check_model_id
    from harness.detector.graph import onnx_problem
    from harness.detector.weights import ENV_WEIGHTS_DIR, weights_dir
    from harness.files import check_base_url, download, file_sha256, output_file_problem
    from harness.models.registry import REGISTRY

    entry = REGISTRY.get(model_id)
    if entry is None:
        check_model_id(model_id)  # why, for an id the leaderboard names that cannot be built here; else the closest
        raise UsageError(f"{model_id}: not in the model registry; see `va-bench models list`")
    found = None if force else entry.local_weights()
    if found is not None:
        try:
            entry.check_weights(found)
        except UsageError as exc:
            # a file in the cache is replaced by --force; one found elsewhere (an environment variable, an offline
            # folder) is looked up before the cache, so only its owner can change it
            cached = found.resolve().parent == weights_dir().resolve()
            fix = ("--force downloads them again" if cached else
                   "it is looked up before the weights cache: replace or remove that file (or its environment "
                   "variable)")
            raise UsageError(f"{model_id}: {found} is there but is not its weights ({exc}); {fix}") from exc
        console.print(f"{model_id}: already present, {found} (sha256 {file_sha256(found)}); "
                      "--force downloads it again")
        return
    if base_url is not None and not entry.weights_url:
        raise UsageError(f"--base-url applies to a model whose release file va-bench downloads itself; {model_id}'s "
                         "weights come through its library: drop it")
    if base_url is not None:
        check_base_url(base_url, "the release's own")
    if not entry.weights_url and model_id in _libreyolo_ids():
        from harness.models.libreyolo import fetch_weights

        path, sha256 = fetch_weights(model_id, force=force)  # libreyolo's own resolution and download (its pins)
        console.print(f"{model_id}: {path} (sha256 {sha256})")
        return
    if not entry.weights_url:
        raise UsageError(f"{model_id} has no download of its own here ({entry.note}): {entry.weights_hint}")
    target = weights_dir() / entry.weights_file
    problem = output_file_problem(target)
    if problem:  # before the download: a cache that cannot be written is not the network's fault
        raise UsageError(f"the weights cache {target} {problem}; set ${ENV_WEIGHTS_DIR} to a writable folder")

    def weights_problem(path: Path) -> str | None:
        if entry.weights_sha256 is not None and (digest := file_sha256(path)) != entry.weights_sha256:
            return (f"is not {model_id}'s release file (SHA-256 {digest[:16]}..., the release's "
                    f"{entry.weights_sha256[:16]}...)")
        problem = onnx_problem(path) if entry.weights_file.endswith(".onnx") else None
        if problem is None:
            try:
                entry.check_weights(path)
            except UsageError as exc:  # a run's refusal of the file: its facts, not the temp file's name or advice
                return f"is not {model_id}'s weights ({str(exc).replace(str(path), 'the file').split('; ')[0]})"
        return problem

    url = entry.weights_url if base_url is None else f"{base_url.rstrip('/')}/{entry.weights_url.rsplit('/', 1)[1]}"
    for stale in target.parent.glob(f".{target.name}.*.part"):  # a download killed before it could tidy up
        stale.unlink(missing_ok=True)
    dest = download(url, target, check=weights_problem)
    pinned = "checked against the release's" if entry.weights_sha256 else "not pinned here: checked for its shape only"
    console.print(f"{model_id}: {dest} (sha256 {file_sha256(dest)}; {pinned})")



@app.command()
def compare(
    runs: list[Path] = typer.Argument(..., help="run folders (outputs/<run_id>/), submission files or COCO "
                                                 "detection files: A B, or with --baseline one or more"),
    baseline: Path | None = typer.Option(None, "--baseline", help="compare each RUN against this one (A)"),
    pair_iou: float = typer.Option(0.5, "--pair-iou", help="IoU for pairing detections (same image and class)"),
    diff_conf: float = typer.Option(0.4, "--diff-conf", help="score cut of the detection diff"),
    old_iou: float | None = deprecated("--iou", "--pair-iou"),
    old_conf: float | None = deprecated("--conf", "--diff-conf"),
    alpha: float = typer.Option(0.05, "--alpha", help="significance level of the latency verdict"),
    fail_on: list[str] | None = typer.Option(None, "--fail-on", help="METRIC:THRESHOLD gate, e.g. map:-0.005, "
                                                  "latency:+10%, throughput:-5% (see above)"),
    as_json: bool = typer.Option(False, "--json", help="print the comparison as JSON"),
    map_ci: int = typer.Option(0, "--map-ci", help="a 95 % paired bootstrap interval of each mAP delta over the "
                                                   "images both cells scored, from this many resamples (1000 is "
                                                   "usual; 0: none); needs the dataset the run used"),
    coco_dir: Path | None = typer.Option(None, "--coco-dir", help="with --map-ci: COCO val2017's folder (as run "
                                                                  "takes it; default: the run's default)"),
    dataset: str | None = typer.Option(None, "--dataset", help="with --map-ci: the annotation file of another "
                                                               "dataset (as run --dataset takes it)"),
) -> None:
    """Compare runs: mAP deltas, detection diff, latency deltas with a significance verdict.

    B is compared with A (B - A, B/A). Exit 0; 1 when a --fail-on gate fails; 2 on bad usage; 141 when stdout's
    reader went away (| head).

    --fail-on METRIC:THRESHOLD (repeatable) fails when B - A crosses THRESHOLD in any paired cell. \
METRIC: map (mAP_50_95), map50, map75, f1 (the operating point's), any accuracy name (AR100, mAP_small, op_recall, \
...), latency (p50 per image), latency_p95, throughput (images/s). THRESHOLD is signed: '-' fails on a fall \
larger than it, '+' on a rise larger than it; a trailing % makes it relative to A. Latency and throughput \
gates skip changes the significance test calls noise; a gate with nothing to check fails.
    """
    from harness.config import MIN_RESAMPLES
    from harness.results.compare import ImageSets, compare_paths
    from harness.results.compare_gates import check_gate, parse_gate
    from harness.views.compare_view import comparisons_json, print_comparisons

    gates = [parse_gate(spec) for spec in fail_on or []]
    if map_ci < 0 or 0 < map_ci < MIN_RESAMPLES:
        raise UsageError(f"--map-ci {map_ci}: give at least {MIN_RESAMPLES} resamples (1000 is usual), or 0 for none")
    if (coco_dir is not None or dataset is not None) and not map_ci:
        raise UsageError("--coco-dir and --dataset say where the images are for --map-ci; add --map-ci N")
    if coco_dir is not None and dataset is not None:
        raise UsageError("--coco-dir (COCO val2017) and --dataset (another dataset) name two datasets; give one")
    for flag, where in (("--coco-dir", coco_dir), ("--dataset", dataset)):
        if where is not None and not Path(where).expanduser().exists():
            raise UsageError(path_problem(flag, where, "no such file or folder") + "; give the dataset the runs used")
    if baseline is None and len(runs) != 2:
        raise UsageError(f"compare takes two runs A B (got {len(runs)}), or --baseline A and one or more runs")
    base, others = (baseline, runs) if baseline is not None else (runs[0], runs[1:])
    pair_iou, diff_conf = _diff_thresholds(pair_iou, diff_conf, old_iou, old_conf)
    intervals = ImageSets(map_ci, coco_dir, dataset) if map_ci else None
    comparisons = compare_paths(base, others, iou=pair_iou, conf=diff_conf, alpha=alpha, intervals=intervals)
    results = [[check_gate(g, c) for g in gates] for c in comparisons]
    failed = any(r.status != "ok" for rs in results for r in rs)
    if as_json:
        print_json(console, comparisons_json(comparisons, results, failed))
    else:
        print_comparisons(console, comparisons, results)
    raise typer.Exit(1 if failed else 0)


def _check_output(flag: str, path: Path | None) -> None:
    """One UsageError line when the file an option names cannot be written (before the command's work)."""
    from harness.files import output_file_problem

    problem = None if path is None else output_file_problem(path)
    if problem:
        raise UsageError(path_problem(flag, path, problem) + "; give a file path in a writable folder")


def _diff_thresholds(pair_iou: float, diff_conf: float, old_iou: float | None,
                     old_conf: float | None) -> tuple[float, float]:
    """The detection diff's pairing IoU and score cut (the deprecated spellings win when given), range-checked."""
    pair_iou = old_iou if old_iou is not None else pair_iou
    diff_conf = old_conf if old_conf is not None else diff_conf
    if not 0 < pair_iou <= 1:
        raise UsageError(f"--pair-iou {pair_iou}: must be in (0, 1]")
    if not 0 <= diff_conf <= 1:
        raise UsageError(f"--diff-conf {diff_conf}: must be in [0, 1]")
    return pair_iou, diff_conf


@app.command("inspect")
def inspect_command(
    model: str | None = typer.Argument(None, help="registry id (yolox-nano) or path/to/file.py:factory"),
    weights: Path | None = typer.Option(None, "--weights", help="an ONNX file (alone, or the weights of MODEL)"),
    input_size: list[int] | None = typer.Option(None, "--input-size", help="square input size (default: native)"),
    top: int = typer.Option(15, "--top", min=0, help="rows of the per-layer table, by FLOPs (0: all)"),
    csv_path: Path | None = typer.Option(None, "--csv", help="write the full per-layer table here"),
    as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
) -> None:
    """Parameters, FLOPs (FLOP = 2 x MAC), per-layer table, weight sparsity and ONNX graph metrics."""
    from harness.files import atomic_write_csv
    from harness.models.inspect import inspect_model
    from harness.views.inspect_view import render_inspect

    _check_output("--csv", csv_path)

    if input_size and len(input_size) > 1:
        raise UsageError(f"--input-size: give one size (got {' '.join(map(str, input_size))})")
    report = inspect_model(model, weights, input_size[0] if input_size else None)
    if csv_path is not None:
        atomic_write_csv(csv_path, *report.csv_rows())
    if as_json:
        print_json(console, (report.to_dict()))
    else:
        console.print(render_inspect(report.to_dict(), top), highlight=False)
        if csv_path is not None:
            console.print(f"per-layer table: {csv_path}")


@app.command()
def report(
    run_dir: Path = typer.Argument(..., help="a run folder, outputs/<run_id>/"),
    log: Path | None = typer.Option(None, "--log", help="append this run's dated section to a Markdown benchmark "
                                                       "log, e.g. BENCHMARKS.md (never rewrites earlier sections)"),
    gates: Path | None = typer.Option(None, "--gates", help="YAML file of targets (none by default; an example to "
                                                            f"copy: {EXAMPLE_GATES})"),
    fail_on_gates: bool = typer.Option(False, "--fail-on-gates", help="exit 1 when a gate is NOT MET or selects no "
                                                                      "cell of the run"),
) -> None:
    """Plots and a self-contained report.html of a run, from its records (nothing is re-run); --log appends
    the run to the benchmark log with its gates. Exit 0; 1 with --fail-on-gates when a gate is NOT MET or selects no
    cell of the run; 2 on bad input."""
    from harness.report.run_report import make_report
    from harness.views.commands import print_report_outcome

    _check_output("--log", log)
    outcome = make_report(run_dir, gates, log, require_gates=fail_on_gates)
    print_report_outcome(console, outcome, log)
    raise typer.Exit(1 if fail_on_gates and outcome.gates_failing else 0)


# ------------------------------------------------------------------------------------------ fleet (Ray)

fleet_app = typer.Typer(no_args_is_help=True, help="One plan over a Ray cluster: each device benchmarks its own "
                                                     "cells, accuracy sharded over any nodes, results gathered here.")
app.add_typer(fleet_app, name="fleet")

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
                                           help="also split each group's accuracy pass into N shards over any nodes "
                                                "and evaluate their merged detections once (<run_id>/accuracy/)")),
]


def _fleet_module(name: str = "driver"):
    """harness.fleet.<name>, or one line saying how to install Ray."""
    import importlib

    try:
        return importlib.import_module(f"harness.fleet.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != "ray":
            raise
        raise UsageError("va-bench fleet needs Ray, which is not installed: pip install 'va-bench[fleet]'") from None


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
    fleet = _fleet_module()
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
            run_header(console, fplan.run_id, fplan.plan, bool(fplan.fleet_doc), ", ".join(fplan.targets),
                       prefix="fleet ")
        outcome = fleet.run_fleet(fplan, typed_argv(), _progress())
    finally:  # before the document: Ray's late error messages would follow it on stdout
        fleet.disconnect()
    if as_json:
        print_json(console, (fleet_summary_json(outcome)))
    else:
        print_fleet_summary(console, outcome)
    raise typer.Exit(1 if outcome.problems else 0)


def _register_fleet_run() -> None:
    params = RUN_FLAGS + FLEET_FLAGS + _run_options()

    def fleet_run(**kwargs) -> None:
        fleet_run_command(**kwargs)

    fleet_run.__signature__ = inspect.Signature(params)
    fleet_run.__annotations__ = {p.name: p.annotation for p in params} | {"return": None}
    fleet_run.__doc__ = fleet_run_command.__doc__
    fleet_app.command("run")(fleet_run)


_register_fleet_run()


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
    console.print(f"hardware id [bold]{escape(command.hardware_id)}[/]: {escape((env + ' ') if env else '')}"
                  f"{escape(shell.join(command.argv))}", highlight=False, soft_wrap=True)
    if dry_run:
        return
    status = start(command)
    if status:
        raise typer.Exit(status)


parity_app = typer.Typer(no_args_is_help=True, help="Correctness studies: is an implementation choice a real change?")
app.add_typer(parity_app, name="parity")


@parity_app.command("preprocess")
def parity_preprocess(
    model: str = run_field("models", "--model", "yolox-nano"),
    weights: str | None = run_field("weights"),
    backend: str = run_field("backends", "--backend", "onnxruntime"),
    device: str = run_field("device"),
    impls: list[str] = typer.Option(["cv2", "torch", "pil"], "--impls", metavar="NAME...",
                                    help="implementations, the reference first (e.g. --impls cv2 torch pil)"),
    subset: str = run_field("subset"),
    limit: int | None = run_field("limit", min=1),
    coco_dir: str | None = run_field("coco_dir"),
    batch_size: int = run_field("batch_sizes", "--batch-size", 8, min=1, help="batch size of every run"),
    noise_batch_size: int | None = typer.Option(None, "--noise-batch-size", min=1,
                                                help="the noise floor's other batch size (default 1, or 2 at batch 1)"),
    diff_conf: float = typer.Option(0.4, "--diff-conf", help="score cut of the detection diff"),
    pair_iou: float = typer.Option(0.5, "--pair-iou", help="pairing IoU of the detection diff"),
    tolerance: float = typer.Option(0.002, "--tolerance", min=0, help="largest |Δ AP| (mAP 50:95, 50, 75) allowed"),
    threads: int | None = run_field("threads", min=1),
    as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
    json_out: Path | None = typer.Option(None, "--json-out", metavar="PATH", help="also write the report here (JSON)"),
    old_conf: float | None = deprecated("--conf", "--diff-conf"),
    old_iou: float | None = deprecated("--iou", "--pair-iou"),
) -> None:
    """Each preprocessing implementation vs the reference (cv2) on real images: input pixels, detection diff,
    the 12 COCO metrics with deltas and the noise floor; exit 1 when a gated delta exceeds --tolerance."""
    import torch

    from harness.backends import BackendOptions, load_detector_core
    from harness.backends.support import check_batch_sizes
    from harness.config import RunConfig
    from harness.data.coco import CocoDataset
    from harness.detector.protocol import RANDOM_WEIGHTS
    from harness.files import atomic_write_json
    from harness.measure.device import parse_device
    from harness.models.registry import get_detector
    from harness.pipeline.parity_run import ParitySetup, run_parity
    from harness.pipeline.preprocess import IMPLEMENTATIONS
    from harness.views.parity_view import render_parity

    _check_output("--json-out", json_out)
    if any("," in n for n in impls):
        err_console.print("[yellow]deprecated[/]: --impls a,b is now --impls a b", highlight=False)
    given = [n.strip() for item in impls for n in item.split(",") if n.strip()]
    names = tuple(dict.fromkeys(given))
    unknown = [n for n in names if n not in IMPLEMENTATIONS]
    if unknown or len(names) < 2:  # one implementation alone compares nothing, and would pass every gate
        why = (f"{unknown[0]!r} is not an implementation" if unknown
               else f"{next(n for n in given if given.count(n) > 1)} given twice" if len(given) > len(names)
               else "one implementation compares nothing")
        raise UsageError(f"--impls {' '.join(impls)}: {why}; give the reference and at least one other implementation "
                         f"from {', '.join(IMPLEMENTATIONS)}, the reference first (e.g. --impls cv2 torch pil)")
    if weights == RANDOM_WEIGHTS:  # its gate is on COCO accuracy, which random weights do not have (0 = 0 passes)
        raise UsageError("parity preprocess compares implementations by their COCO accuracy; random weights have "
                         "none: pass trained weights (--weights PATH, or the model's default)")
    pair_iou, diff_conf = _diff_thresholds(pair_iou, diff_conf, old_iou, old_conf)
    noise_batch_size = noise_batch_size or (2 if batch_size == 1 else 1)
    # before any pass, in parity's own flags
    check_batch_sizes(backend, [batch_size, noise_batch_size], f"so not parity's batch "
                                                               f"{max(batch_size, noise_batch_size)}: use "
                                                               "--batch-size 1 --noise-batch-size 1")
    dev = parse_device(device)
    dataset = CocoDataset(coco_dir)
    records = dataset.records(dataset.variant(subset, limit))
    detector = get_detector(model, weights)
    spec = detector.preprocess
    options = BackendOptions.from_config(RunConfig(backends=[backend], device=device, batch_sizes=[batch_size]))
    core = load_detector_core(detector, backend, dev, "fp32", spec.input_size, options=options,
                              threads=threads or torch.get_num_threads())
    setup = ParitySetup(names, batch_size, noise_batch_size, diff_conf, pair_iou, tolerance)
    report = run_parity(detector, core, dev, dataset, records, setup, progress=_progress())
    if json_out is not None:
        atomic_write_json(json_out, report.to_dict())
    print_json(console, report.to_dict()) if as_json else console.print(render_parity(report), highlight=False)
    raise typer.Exit(report.exit_code)


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
        err_console.print(f"[yellow]warning[/]: {escape(line)}", highlight=False, soft_wrap=True)
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
        err_console.print("aborted", highlight=False)
        return 1
    return code if isinstance(code, int) else 0


def main() -> None:
    """The command line: one clear line per error, exit 2 for bad input, traceback only with --debug."""
    from harness.run.signals import Interrupted, interrupt_handling

    global console, err_console
    tolerant_streams()  # a terminal that cannot show Δ or · gets a stand-in, not an error
    console, err_console = make_consoles()
    typed = [a for a in sys.argv[1:] if a != "--debug"]  # the command as typed, for the record
    debug = "--debug" in sys.argv[1:]
    argv = expand_multi_value_options(renamed_file_options(typed))
    sys.argv = [sys.argv[0], *argv]
    try:
        with interrupt_handling(), stdout_kept_for_the_document("--json" in argv) as document:
            if document is not None:
                console = document_console(document)
            try:
                sys.exit(_run_app(argv, typed))
            finally:  # the document's stream is closed when the block ends: the next call (a test's) gets stdout's
                console = make_consoles()[0]
    except VaBenchError as exc:
        if debug:
            raise
        prefix = getattr(exc, "prefix", None) or "[red]error[/]"
        err_console.print(f"{prefix}: " + escape(str(exc)), highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except StdoutGone:  # `| head`: what was asked is done or moot; the shell's status for a reader gone
        _stdout_to_devnull()
        sys.exit(STDOUT_GONE_EXIT)
    except Interrupted as exc:  # outside a run's cells (a run stopped mid-sweep says more: RunInterrupted)
        err_console.print(f"interrupted ({exc}); run the same command again to continue (a dataset download "
                          "resumes where it stopped)", highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except Exception as exc:  # anything unexpected: still one line unless --debug
        if debug:
            raise
        message = escape(f"{type(exc).__name__}: {exc}")
        err_console.print(f"[red]error[/]: {message} (rerun with --debug for the traceback)",
                          highlight=False, soft_wrap=True)
        sys.exit(1)
