"""The `va-bench` command line (Typer). Thin: parse, call, print."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from harness.errors import UsageError, VaBenchError

app = typer.Typer(add_completion=False, no_args_is_help=True,
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
    as_json: bool = typer.Option(False, "--json", help="print the run summary as JSON"),
) -> None:
    """Run the benchmark sweep; writes outputs/<run_id>/ (one va.submission.v1 per cell)."""
    from harness.config import load_config
    from harness.report.progress import RichProgress, SilentProgress
    from harness.report.tables import summary_json, summary_table
    from harness.runner import Runner, prepare

    overrides = dict(models=model, weights=weights, backends=backend, precisions=precision, input_sizes=input_size,
                     batch_sizes=batch_sizes, subset=subset, limit=limit, coco_dir=coco_dir, device=device,
                     threads=threads, warmup_batches=warmup_batches, warmup_seconds=warmup_seconds,
                     min_timed_batches=min_timed_batches, max_timed_batches=max_timed_batches,
                     stage_sync=stage_sync, accuracy=accuracy, accuracy_batch_size=accuracy_batch_size,
                     evaluator=evaluator, conf=conf, iou=iou, max_det=max_det, tf32=tf32, hardware_id=hardware_id,
                     output_dir=output_dir, run_id=run_id, draw_images=draw_images)
    cfg = load_config(config, overrides)
    plan = prepare(cfg)
    if not as_json:
        console.print(f"run [bold]{plan.run_id}[/]: {plan.variant.name} ({plan.variant.num_images} images), "
                      f"{sum(len(c) for _, c in plan.groups)} cells on {plan.device}")
    progress = SilentProgress() if as_json else RichProgress(err_console)
    records = Runner(plan, sys.argv[1:], progress).run()
    if as_json:
        console.print_json(json.dumps(summary_json(plan.run_dir, records)))
    else:
        console.print(summary_table(records))
        for line in summary_json(plan.run_dir, records)["warnings"]:
            console.print(f"[yellow]warning[/]: {line}", markup=True, highlight=False)
        console.print(f"artifacts: {plan.run_dir}")


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
        app(args=argv, prog_name="va-bench", standalone_mode=False)
    except VaBenchError as exc:
        if debug:
            raise
        err_console.print("[red]error[/]: " + escape(str(exc)), highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except (typer.Exit, SystemExit) as exc:
        sys.exit(getattr(exc, "exit_code", getattr(exc, "code", 0)))
    except KeyboardInterrupt:
        err_console.print("interrupted: finished cells are kept in outputs/<run_id>/")
        sys.exit(130)
    except Exception as exc:  # click usage errors and anything unexpected
        import click

        if isinstance(exc, click.exceptions.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        if isinstance(exc, click.exceptions.Abort):
            sys.exit(1)
        if debug:
            raise
        message = escape(f"{type(exc).__name__}: {exc}")
        err_console.print(f"[red]error[/]: {message} (rerun with --debug for the traceback)",
                          highlight=False, soft_wrap=True)
        sys.exit(1)
