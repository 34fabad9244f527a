"""The `va-bench` command line (Typer). Thin: parse, call, print."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from harness.errors import UsageError, VaBenchError

# torch.profiler's C++ backend (kineto) logs every start/stop and a CUDA probe failure on CPU boxes
os.environ.setdefault("KINETO_LOG_LEVEL", "99")

app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Benchmark object detectors: latency, throughput, memory, energy and COCO mAP.")
models_app = typer.Typer(no_args_is_help=True, help="List and fetch model weights.")
app.add_typer(models_app, name="models")
console = Console()
if not console.is_terminal:  # piped/CI output: don't squeeze the summary table into 80 columns
    console = Console(width=160)
err_console = Console(stderr=True)

# Options that take several values after one flag (`--batch-sizes 1 2 4 8`). Click has no nargs=-1
# for options, so main() rewrites them into repeated flags before Typer parses argv.
MULTI_VALUE_OPTIONS = {"--model", "--backend", "--precision", "--input-size", "--input-sizes",
                       "--batch-sizes", "--batch-size"}


def _progress(quiet: bool):
    """Live bars on a terminal; nothing when output is captured (logs, --json)."""
    from harness.report.progress import RichProgress, SilentProgress

    return SilentProgress() if quiet or not err_console.is_terminal else RichProgress(err_console)


def expand_multi_value_options(argv: list[str]) -> list[str]:
    """['--batch-sizes', '1', '2'] -> ['--batch-sizes', '1', '--batch-sizes', '2']."""
    out: list[str] = []
    current = None
    for token in argv:
        if token.startswith("-"):
            current = token if token in MULTI_VALUE_OPTIONS else None
            out.append(token)
        elif current is not None and out[-1] != current:
            out += [current, token]
        else:
            out.append(token)
    return out


@app.command()
def run(
    config: Path | None = typer.Option(None, "--config", help="YAML preset (configs/*.yaml); flags override it"),
    model: list[str] | None = typer.Option(None, "--model", help="registry id or path/to/file.py:factory"),
    weights: str | None = typer.Option(None, "--weights", help="weights file for a single --model"),
    backend: list[str] | None = typer.Option(None, "--backend", help="onnxruntime, pytorch"),
    precision: list[str] | None = typer.Option(None, "--precision"),
    input_size: list[int] | None = typer.Option(None, "--input-size", "--input-sizes"),
    batch_sizes: list[int] | None = typer.Option(None, "--batch-sizes", "--batch-size"),
    subset: str | None = typer.Option(None, "--subset", help="full, mini500 or sample"),
    limit: int | None = typer.Option(None, "--limit", help="first N images of the variant (-> subsetN)"),
    coco_dir: str | None = typer.Option(None, "--coco-dir", help="COCO root (annotations/ + val2017/)"),
    device: str | None = typer.Option(None, "--device", help="cpu, cuda, cuda:N"),
    threads: int | None = typer.Option(None, "--threads", help="CPU threads for the core (default: all)"),
    warmup_batches: int | None = typer.Option(None, "--warmup-batches"),
    warmup_seconds: float | None = typer.Option(None, "--warmup-seconds"),
    min_timed_batches: int | None = typer.Option(None, "--min-timed-batches"),
    max_timed_batches: int | None = typer.Option(None, "--max-timed-batches"),
    stage_sync: bool | None = typer.Option(None, "--stage-sync/--no-stage-sync",
                                              help="sync the device at every stage (latency) or per batch"),
    overlap: bool | None = typer.Option(None, "--overlap/--no-overlap",
                                        help="overlapped mode: prepare/post-process neighbouring batches "
                                             "while the core runs (stage times then overlap)"),
    accuracy: bool | None = typer.Option(None, "--accuracy/--no-accuracy"),
    accuracy_batch_size: int | None = typer.Option(None, "--accuracy-batch-size"),
    evaluator: str | None = typer.Option(None, "--evaluator", help="pycocotools or faster-coco-eval"),
    conf: float | None = typer.Option(None, "--conf"),
    iou: float | None = typer.Option(None, "--iou"),
    max_det: int | None = typer.Option(None, "--max-det"),
    tf32: str | None = typer.Option(None, "--tf32", help="on, off or default"),
    hardware_id: str | None = typer.Option(None, "--hardware-id"),
    output_dir: str | None = typer.Option(None, "--output-dir"),
    run_id: str | None = typer.Option(None, "--run-id"),
    draw_images: int | None = typer.Option(None, "--draw-images", help="images with boxes to save"),
    layers: bool | None = typer.Option(None, "--layers/--no-layers", help="per-layer timing pass"),
    profile: bool | None = typer.Option(None, "--profile/--no-profile", help="torch.profiler pass + trace.json"),
    energy: bool | None = typer.Option(None, "--energy/--no-energy", help="energy over the timing window"),
    memory: bool | None = typer.Option(None, "--memory/--no-memory", help="peak RSS / VRAM + memory.csv"),
    as_json: bool = typer.Option(False, "--json", help="print the run summary as JSON"),
) -> None:
    """Run the benchmark sweep; writes outputs/<run_id>/ (one va.submission.v1 per cell)."""
    from harness.config import load_config
    from harness.report.tables import probe_lines, probe_table, summary_json, summary_table
    from harness.runner import Runner, prepare

    overrides = dict(models=model, weights=weights, backends=backend, precisions=precision, input_sizes=input_size,
                     batch_sizes=batch_sizes, subset=subset, limit=limit, coco_dir=coco_dir, device=device,
                     threads=threads, warmup_batches=warmup_batches, warmup_seconds=warmup_seconds,
                     min_timed_batches=min_timed_batches, max_timed_batches=max_timed_batches,
                     stage_sync=stage_sync, overlap=overlap, accuracy=accuracy, accuracy_batch_size=accuracy_batch_size,
                     evaluator=evaluator, conf=conf, iou=iou, max_det=max_det, tf32=tf32, hardware_id=hardware_id,
                     output_dir=output_dir, run_id=run_id, draw_images=draw_images, layers=layers, profile=profile,
                     energy=energy, memory=memory)
    cfg = load_config(config, overrides)
    plan = prepare(cfg)
    if not as_json:
        console.print(f"run [bold]{plan.run_id}[/]: {plan.variant.name} ({plan.variant.num_images} images), "
                      f"{sum(len(c) for _, c in plan.groups)} cells on {plan.device}")
    progress = _progress(as_json)
    records = Runner(plan, sys.argv[1:], progress).run()
    if as_json:
        console.print_json(json.dumps(summary_json(plan.run_dir, records)))
    else:
        console.print(summary_table(records))
        if cfg.memory or cfg.energy:
            console.print(probe_table(records))
        for line in probe_lines(records):
            console.print(escape(line), highlight=False, soft_wrap=True)
        for line in summary_json(plan.run_dir, records)["warnings"]:
            console.print(f"[yellow]warning[/]: {line}", markup=True, highlight=False)
        console.print(f"artifacts: {plan.run_dir}")


@app.command()
def validate(
    paths: list[Path] = typer.Argument(..., help="submission files or folders of them"),
    support_matrix: Path | None = typer.Option(None, "--support-matrix",
                                                  help="the site's support-matrix.json (allow-lists)"),
    warnings: bool = typer.Option(True, "--warnings/--no-warnings", help="list warnings too"),
    as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
) -> None:
    """Check submissions: site schema and rules, commit guard, coordinates, dataset fingerprint,
    degenerate statistics. Exit 0 clean, 1 errors found, 2 bad usage."""
    from harness.results.validate import load_support_matrix, validate_paths

    support = load_support_matrix(support_matrix)
    progress = _progress(as_json)
    reports = validate_paths(paths, support, progress)
    n_errors = sum(len(r.errors) for r in reports)
    bad_files = sum(1 for r in reports if r.errors)
    if as_json:
        console.print_json(json.dumps({"files": len(reports), "files_with_errors": bad_files, "errors": n_errors,
                                       "reports": [r.to_dict() for r in reports]}))
    else:
        for r in reports:
            for f in r.findings:
                if f.severity == "error" or warnings:
                    color = "red" if f.severity == "error" else "yellow"
                    console.print(f"[{color}]{f.severity}[/] {escape(str(r.path))}: {escape(f.path)}: "
                                  f"{escape(f.message)} [dim]({f.rule})[/]", highlight=False, soft_wrap=True)
        n_warn = sum(1 for r in reports for f in r.findings if f.severity == "warning")
        console.print(f"{len(reports)} files: {bad_files} with errors ({n_errors} errors), {n_warn} warnings")
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
    support_matrix: Path | None = typer.Option(None, "--support-matrix"),
    strict: bool = typer.Option(False, "--strict", help="exit 1 when the agreement gate finds drift"),
    as_json: bool = typer.Option(False, "--json", help="print the leaderboard JSON on stdout"),
) -> None:
    """Many submissions -> one leaderboard: full-coordinate identity, canonical accuracy, agreement gate."""
    from harness.report.leaderboard import gate_table, leaderboard_table
    from harness.results.aggregate import aggregate as build
    from harness.results.validate import load_support_matrix, validate_paths
    from harness.results.writer import atomic_write_json

    if tolerance < 0:
        raise UsageError("--tolerance must be >= 0 (mAP points)")
    support = load_support_matrix(support_matrix)
    reports = validate_paths(paths, support, _progress(as_json))
    board = build(reports, reference_hardware, tolerance, fallback_hardware)
    if output is not None:
        atomic_write_json(output, board)
    if as_json:
        console.print_json(json.dumps(board))
    else:
        console.print(leaderboard_table(board))
        console.print(gate_table(board))
        c = board["counts"]
        console.print(f"{c['files']} files, {c['included']} included, {c['excluded']} excluded (site rules), "
                      f"{c['rows']} rows, {c['superseded']} superseded, {c['gate_findings']} agreement-gate findings"
                      + (f"; written to {output}" if output else ""))
    raise typer.Exit(1 if strict and board["agreement_gate"] else 0)


@app.command()
def schema() -> None:
    """Print the extended va.submission.v1 JSON Schema (a superset of the site's)."""
    from harness.results.validate import EXTENDED_SCHEMA

    sys.stdout.write(EXTENDED_SCHEMA.read_text())


@app.command()
def hw(as_json: bool = typer.Option(False, "--json", help="print the report as JSON")) -> None:
    """What this machine is (hardware id, CPU, GPU, RAM) and which probes work here, or why not."""
    from rich.table import Table

    from harness.measure.machine import machine_report

    report = machine_report()
    if as_json:
        console.print_json(json.dumps(report))
        return
    h = report["hardware"]
    console.print(f"hardware.id [bold]{escape(h['id'])}[/]: {escape(h['cpu'])} ({h['cpu_cores']} cores, "
                  f"governor {escape(report['cpu']['governor'])}), {h['ram_gb']} GB RAM, GPU {escape(h['gpu'])}")
    table = Table(title="measurement probes")
    for col in ("probe", "status", "detail"):
        table.add_column(col)
    for name, p in report["probes"].items():
        detail = p.get("reason") or p.get("method") or ", ".join(p.get("providers", []))
        color = "green" if p["status"] == "ok" else "yellow"
        table.add_row(name, f"[{color}]{p['status']}[/]", escape(str(detail)))
    console.print(table)


@models_app.command("list")
def models_list(as_json: bool = typer.Option(False, "--json")) -> None:
    """Registered models and whether their weights are present locally."""
    from rich.table import Table

    from harness.models.registry import REGISTRY
    from harness.models.yolox import weight_candidates

    rows = []
    for entry in REGISTRY.values():
        variant = entry.model_id.split("-", 1)[1]
        local = next((str(p) for p in weight_candidates(variant) if p.is_file()), None)
        rows.append({"id": entry.model_id, "family": entry.family, "weights": local, "url": entry.weights_url,
                     "note": entry.note})
    if as_json:
        console.print_json(json.dumps(rows))
        return
    table = Table(title="models")
    for col in ("id", "family", "local weights", "note"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["id"], r["family"], r["weights"] or "- (va-bench models fetch)", r["note"])
    console.print(table)


@models_app.command("fetch")
def models_fetch(model_id: str = typer.Argument(..., help="registry id, e.g. yolox-s")) -> None:
    """Download a model's official weights into the weights cache."""
    from harness.models.registry import REGISTRY
    from harness.models.weights import download, file_sha256, weights_dir

    entry = REGISTRY.get(model_id)
    if entry is None or not entry.weights_url:
        raise UsageError(f"unknown model {model_id!r}; see `va-bench models list`")
    dest = download(entry.weights_url, weights_dir() / entry.weights_file)
    console.print(f"{model_id}: {dest} (sha256 {file_sha256(dest)})")


def main() -> None:
    """Entry point: one clear line per error, exit 2 for bad input, traceback only with --debug."""
    argv = sys.argv[1:]
    debug = "--debug" in argv
    argv = expand_multi_value_options([a for a in argv if a != "--debug"])
    sys.argv = [sys.argv[0], *argv]
    try:
        # standalone mode: click reports its own usage errors (exit 2) and turns typer.Exit into sys.exit
        app(args=argv, prog_name="va-bench")
    except VaBenchError as exc:
        if debug:
            raise
        err_console.print("[red]error[/]: " + escape(str(exc)), highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err_console.print("interrupted: finished cells are kept in outputs/<run_id>/")
        sys.exit(130)
    except Exception as exc:  # anything unexpected: still one line unless --debug
        if debug:
            raise
        message = escape(f"{type(exc).__name__}: {exc}")
        err_console.print(f"[red]error[/]: {message} (rerun with --debug for the traceback)",
                          highlight=False, soft_wrap=True)
        sys.exit(1)
