"""`va-bench data fetch` (COCO val2017, RF100-VL) and `va-bench data check` (a dataset read as a run reads it)."""

from __future__ import annotations

from pathlib import Path

import typer

from harness.cli.app import data_app, terminal
from harness.errors import UsageError
from harness.views.output import print_json
from harness.views.text import escape


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
        lines = fetch_rf100vl(target, progress=lambda line: terminal.err.print(escape(line), highlight=False))
        versions = target / "rf100vl_versions.json"
        terminal.out.print(f"{len(lines)} RF100-VL datasets in {target} (versions in {versions})")
        return
    if dataset != "coco":
        raise UsageError(f"unknown dataset {dataset!r}; use `va-bench data fetch coco` or `... rf100vl`")
    if dest is None:
        dest = Path("datasets") / "coco"
    with download_progress(terminal.err) as progress:
        lines = fetch_archives(dest, base_url=COCO_BASE_URL if base_url is None else base_url, progress=progress,
                               keep_archives=keep_archives)
    for line in lines:
        terminal.out.print(escape(line), highlight=False)


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
        print_json(terminal.out, summary.to_dict())
    else:
        print_dataset_summary(terminal.out, summary)
