"""The commands that look at one thing without a benchmark: a model (inspect), this machine (hw), and an
implementation choice (parity preprocess)."""

from __future__ import annotations

from pathlib import Path

import typer

from harness.cli.app import app, check_output, deprecated, diff_thresholds, parity_app, progress, run_field, terminal
from harness.errors import UsageError
from harness.views.output import print_json


@app.command("inspect")
def inspect_command(
    model: str | None = typer.Argument(None, help="registry id (yolox-nano) or path/to/file.py:factory"),
    weights: Path | None = typer.Option(None, "--weights", help="an ONNX file (alone, or the weights of MODEL), or "
                                                               "random (seeded random weights: a model whose trained "
                                                               "ones are not here)"),
    input_size: list[int] | None = typer.Option(None, "--input-size", help="square input size (default: native)"),
    top: int = typer.Option(15, "--top", min=0, help="rows of the per-layer table, by FLOPs (0: all)"),
    csv_path: Path | None = typer.Option(None, "--csv", help="write the full per-layer table here"),
    as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
) -> None:
    """Parameters, FLOPs (FLOP = 2 x MAC), per-layer table, weight sparsity and ONNX graph metrics."""
    from harness.files import atomic_write_csv
    from harness.models.inspect import inspect_model
    from harness.views.inspect_view import render_inspect

    check_output("--csv", csv_path)

    if input_size and len(input_size) > 1:
        raise UsageError(f"--input-size: give one size (got {' '.join(map(str, input_size))})")
    report = inspect_model(model, weights, input_size[0] if input_size else None)
    if csv_path is not None:
        atomic_write_csv(csv_path, *report.csv_rows())
    if as_json:
        print_json(terminal.out, (report.to_dict()))
    else:
        terminal.out.print(render_inspect(report.to_dict(), top), highlight=False)
        if csv_path is not None:
            terminal.out.print(f"per-layer table: {csv_path}")


@app.command()
def hw(as_json: bool = typer.Option(False, "--json", help="print the report as JSON")) -> None:
    """What this machine is (hardware id, CPU, GPU, RAM) and which probes work here, or why not."""
    from harness.measure.machine import machine_report
    from harness.views.commands import print_hw

    report = machine_report()
    print_json(terminal.out, report) if as_json else print_hw(terminal.out, report)


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

    check_output("--json-out", json_out)
    if any("," in n for n in impls):
        terminal.err.print("[yellow]deprecated[/]: --impls a,b is now --impls a b", highlight=False)
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
    pair_iou, diff_conf = diff_thresholds(pair_iou, diff_conf, old_iou, old_conf)
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
    report = run_parity(detector, core, dev, dataset, records, setup, progress=progress())
    if json_out is not None:
        atomic_write_json(json_out, report.to_dict())
    if as_json:
        print_json(terminal.out, report.to_dict())
    else:
        terminal.out.print(render_parity(report), highlight=False)
    raise typer.Exit(report.exit_code)
