"""The commands that read results: validate, aggregate, compare, report, and the submission schema."""

from __future__ import annotations

import math
from pathlib import Path

import typer

from harness.cli.app import app, check_output, deprecated, diff_thresholds, progress, terminal
from harness.errors import UsageError, path_problem
from harness.report import EXAMPLE_GATES
from harness.views.output import print_json, write_stdout


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
    validation = validate_paths(paths, support, progress(), pending_site_ids())
    if as_json:
        print_json(terminal.out, validation_json(validation))
    else:
        print_validation(terminal.out, validation, warnings)
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
    check_output("--output", output)
    check_output("--plot", plot)
    if plot is not None and plot.suffix.lower() != ".png":  # one format: a name that says another would lie
        raise UsageError(f"--plot {plot}: the figure is a PNG; give a file name ending in .png")
    support = load_support_matrix(support_matrix)
    validation = validate_paths(paths, support, progress(), pending_site_ids())
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
        print_json(terminal.out, board)
    else:
        print_leaderboard(terminal.out, board, board["notes"], output)
    if figure is not None:
        terminal.err.print(f"speed-accuracy fronts: {plot}" + "".join(f"; {n}" for n in figure.notes[1:]),
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
gates skip changes the significance test calls noise; a cell of A that B lacks (failed, out of memory, \
interrupted) fails every gate; a gate with nothing to check fails.
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
    pair_iou, diff_conf = diff_thresholds(pair_iou, diff_conf, old_iou, old_conf)
    intervals = ImageSets(map_ci, coco_dir, dataset) if map_ci else None
    comparisons = compare_paths(base, others, iou=pair_iou, conf=diff_conf, alpha=alpha, intervals=intervals)
    results = [[check_gate(g, c) for g in gates] for c in comparisons]
    failed = any(r.status != "ok" for rs in results for r in rs)
    if as_json:
        print_json(terminal.out, comparisons_json(comparisons, results, failed))
    else:
        print_comparisons(terminal.out, comparisons, results)
    raise typer.Exit(1 if failed else 0)


@app.command()
def report(
    run_dir: Path = typer.Argument(..., help="a run folder, outputs/<run_id>/"),
    log: Path | None = typer.Option(None, "--log", help="append this run's dated section to a Markdown benchmark "
                                                       "log, e.g. BENCHMARKS.md (never rewrites earlier sections)"),
    gates: Path | None = typer.Option(None, "--gates", help="YAML file of targets (none by default; an example to "
                                                            f"copy: {EXAMPLE_GATES})"),
    fail_on_gates: bool = typer.Option(False, "--fail-on-gates", help="exit 1 when a gate is NOT MET or selects no "
                                                                      "cell of the run"),
    as_json: bool = typer.Option(False, "--json", help="print what was written and every gate's result as JSON"),
) -> None:
    """Plots and a self-contained report.html of a run, from its records (nothing is re-run); --log appends
    the run to the benchmark log with its gates. Exit 0; 1 with --fail-on-gates when a gate is NOT MET or selects no
    cell of the run; 2 on bad input."""
    from harness.report.run_report import make_report
    from harness.views.commands import print_report_outcome, report_json

    check_output("--log", log)
    outcome = make_report(run_dir, gates, log, require_gates=fail_on_gates)
    if as_json:
        print_json(terminal.out, report_json(outcome, log))
    else:
        print_report_outcome(terminal.out, outcome, log)
    raise typer.Exit(1 if fail_on_gates and outcome.gates_failing else 0)


@app.command()
def schema() -> None:
    """Print the extended va.submission.v1 JSON Schema (a superset of the site's)."""
    from harness.results.validate import EXTENDED_SCHEMA

    write_stdout(EXTENDED_SCHEMA.read_text(encoding="utf-8"))
