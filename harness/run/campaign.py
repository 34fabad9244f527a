"""A campaign: one model fine-tuned per dataset, one run per dataset, one row for all of them (the site's
RF100-VL section: 100 datasets, unweighted mean; harness/results/campaign.py builds the row).

Each dataset is a run of its own under `<output>/<campaign id>/datasets/<dataset>/` with the campaign's options
(the RF100-VL protocol: NMS IoU 0.65, max_det 500, COCOeval cap 500): isolated (a dataset that cannot be
loaded or fails is skipped with its reason and the row says `partial{n}`) and resumable (running the same
campaign id again keeps every finished dataset and runs the rest; an unfinished dataset runs again).
"""

from __future__ import annotations

import contextlib
import csv
import io
import os
import re
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

import yaml

from harness import shell
from harness.config import RunConfig, build_config
from harness.data.coco import check_custom_layout, takes_split
from harness.data.fetch import version_number
from harness.errors import RunInterrupted, UsageError, VaBenchError, brief, path_problem
from harness.files import (
    atomic_write_bytes,
    atomic_write_json,
    file_sha256,
    load_user_yaml,
    replace_folder,
    yaml_problem,
)
from harness.report.plots import campaign_datasets
from harness.results.campaign import PER_DATASET_KEYS, RF100VL_DATASETS, DatasetResult, campaign_submission
from harness.results.reader import CAMPAIGN_FILE, finished_submission, read_json_object
from harness.run.state import lock_folder

RF100VL_OPTIONS = {"iou": 0.65, "max_det": 500, "eval_max_det": 500, "conf": 0.001, "batch_sizes": [1]}
CAMPAIGN_DEFAULTS = {"backends": ["pytorch"], "device": "cpu"}  # fine-tuned checkpoints, on this machine's CPU
VERSIONS_FILE = "rf100vl_versions.json"  # written by `va-bench data fetch rf100vl`: dataset -> version id
WEIGHT_SUFFIXES = (".pt", ".pth", ".onnx")


@dataclass(frozen=True)
class CampaignEntry:
    """One dataset of a campaign and the weights fine-tuned on it."""

    name: str
    dataset: str  # what `--dataset` takes
    weights: str | None  # None: no weights found (the dataset is skipped, named)
    version: str | int | None = None
    split: str | None = None
    skipped: str | None = None  # why it is not run at all (a download that did not finish)


@dataclass
class Campaign:
    """A campaign file: one model over datasets, each with its fine-tuned weights, on one split."""

    model: str
    entries: list[CampaignEntry]
    split: str
    options: dict[str, Any] = field(default_factory=dict)  # RunConfig fields every dataset's run shares
    datasets_of: int | None = None  # the benchmark's datasets, where the campaign is one (RF100-VL: 100)

    @property
    def expected(self) -> int:
        """The datasets the campaign has to score: the benchmark's (a download that stopped early is partial),
        else every one its file lists."""
        return self.datasets_of or len(self.entries)

    @cached_property
    def weights_sha256(self) -> dict[str, str | None]:
        """Each dataset's weights file's SHA-256 (None: no weights), read once per campaign."""
        return {e.name: e.weights and file_sha256(Path(e.weights)) for e in self.entries}

    def recipe(self) -> dict:
        """What makes two campaigns the same measurement (its hash is the row's recipe_sha256)."""
        return {"model": self.model, "split": self.split, "options": self.options,
                "datasets": [[e.name, e.version] for e in self.entries]}


def _slug(name: str) -> str:
    """A dataset's name as its run's folder and id (SAFE_ID: starts with a letter or digit, at most 100
    characters)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", name).strip("-._")[:100].rstrip("-._") or "dataset"


def rf100vl_campaign(root: Path, weights_root: Path, model: str, split: str, options: dict) -> Campaign:
    """Every dataset folder under `root` (an RF100-VL download: <dataset>/<split>/_annotations.coco.json) with
    the one weights file under `weights_root/<dataset>/`."""
    if not root.is_dir():
        raise UsageError(path_problem("--rf100vl", root, "no such folder") + "; run `va-bench data fetch rf100vl`")
    if not weights_root.is_dir():
        raise UsageError(path_problem("--weights-root", weights_root, "no such folder")
                         + "; give the folder holding one folder of fine-tuned weights per dataset")
    versions = read_json_object(root / VERSIONS_FILE) if (root / VERSIONS_FILE).is_file() else {}
    entries = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        candidates = sorted(p for p in (weights_root / folder.name).glob("*") if p.suffix in WEIGHT_SUFFIXES) \
            if (weights_root / folder.name).is_dir() else []
        version = versions.get(folder.name)  # a string "4" recorded before versions were numbers: the number
        # a fetch records each dataset once it is whole: a folder it does not list is a download cut short
        unfinished = (f"its download did not finish (not in {VERSIONS_FILE}); run `va-bench data fetch rf100vl` "
                      "again") if versions and version is None else None
        entries.append(CampaignEntry(folder.name, str(folder), str(candidates[0]) if len(candidates) == 1 else None,
                                     None if version is None else version_number(version), split, unfinished))
    if not entries:
        raise UsageError(path_problem("--rf100vl", root, "holds no dataset folders") + "; point it at the download")
    if not any(e.weights for e in entries):  # nothing could be scored: refused before a folder is made
        raise UsageError(path_problem("--weights-root", weights_root, f"no folder of it holds the weights of one of "
                                      f"the {len(entries)} datasets") + f" (one {'/'.join(sorted(WEIGHT_SUFFIXES))} "
                         f"file in {weights_root / entries[0].name}/, and so on); give the folder of fine-tuned "
                         "weights, one folder per dataset")
    return Campaign(model, entries, split, {**RF100VL_OPTIONS, **CAMPAIGN_DEFAULTS, **options},
                    datasets_of=RF100VL_DATASETS)


CAMPAIGN_KEYS = ("model", "split", "options", "datasets")
ENTRY_KEYS = ("name", "dataset", "weights", "version", "split")


def read_campaign_file(path: Path, options: dict) -> Campaign:
    """A campaign YAML (safe_load): `model`, `split`, optional `options` (run options), and `datasets`, a list of
    {name, dataset, weights, version?, split?}. Unknown keys (a misspelt `split` would silently score another
    split), values of the wrong type, weights that are not files and datasets a run cannot read are one line each.
    `split` is taken from Roboflow export roots only (an annotation file or a split's folder is one split).
    Relative `dataset` and `weights` paths are read from the file's folder."""
    def problem(text: str, fix: str = "fix the file") -> UsageError:
        return UsageError(path_problem("campaign file", path, text) + f"; {fix}")

    def beside(given: str) -> Path:  # a relative path is the file's, as in a YOLO data.yaml: not the shell's folder
        return path.parent / Path(given).expanduser()

    try:
        data = load_user_yaml(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError, UnicodeDecodeError) as exc:
        raise problem(f"not readable YAML{yaml_problem(exc)}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("datasets"), list) or "model" not in data:
        raise problem("needs `model` and a `datasets` list", "write `datasets:` as a list of {name, dataset, weights}")
    unknown = [str(k) for k in data if k not in CAMPAIGN_KEYS]
    if unknown:
        raise problem(f"unknown key {brief(unknown[0])}", f"use {', '.join(CAMPAIGN_KEYS)}")
    if not isinstance(data["model"], str) or not data["model"]:
        raise problem(f"`model` is {brief(data['model'])}, not a model id", "name the model the weights are for")
    if not isinstance(data.get("options") or {}, dict):
        raise problem("`options` is not a mapping", "write run options as `name: value` lines under it")
    split = str(data.get("split", "test"))  # the split taken from Roboflow export roots
    entries = []
    for i, item in enumerate(data["datasets"]):
        if not isinstance(item, dict) or not {"name", "dataset", "weights"} <= set(item):
            raise problem(f"datasets[{i}] needs name, dataset and weights")
        unknown = [str(k) for k in item if k not in ENTRY_KEYS]
        if unknown:
            raise problem(f"datasets[{i}] has an unknown key {brief(unknown[0])}", f"use {', '.join(ENTRY_KEYS)}")
        weights = item["weights"]
        if not isinstance(weights, str) or not beside(weights).is_file():  # as a run's --weights
            raise problem(f"datasets[{i}].weights {brief(weights)} is not a file", "give each dataset's weights file")
        entries.append(CampaignEntry(str(item["name"]), str(beside(str(item["dataset"]))), str(beside(weights)),
                                     None if item.get("version") is None else version_number(item["version"]),
                                     None if item.get("split") is None else str(item["split"])))
    if not entries:
        raise UsageError(path_problem("campaign file", path, "lists no datasets") + "; add {name, dataset, weights}")
    slugs = [_slug(e.name) for e in entries]
    if len(set(slugs)) != len(slugs):
        raise UsageError(path_problem("campaign file", path, "names two datasets alike (their folders would be one)")
                         + "; give each a distinct name")
    campaign = Campaign(str(data["model"]), entries, split, {**RF100VL_OPTIONS, **CAMPAIGN_DEFAULTS,
                                                            **(data.get("options") or {}), **options})
    for i, entry in enumerate(entries):  # a dataset path or split the file got wrong is the file's error
        try:
            check_custom_layout(entry.dataset, entry_split(campaign, entry))
        except UsageError as exc:
            raise UsageError(path_problem("campaign file", path, f"datasets[{i}] ({entry.name})") + f": {exc}") from exc
    return campaign


def entry_split(campaign: Campaign, entry: CampaignEntry) -> str | None:
    """The split a dataset's run takes: its own where the file gives one; else the campaign's for a Roboflow export
    root; none for an annotation file or a split's folder (they are one split already)."""
    if entry.split is not None:
        return entry.split
    return campaign.split if takes_split(entry.dataset) else None


def dataset_config(campaign: Campaign, entry: CampaignEntry, datasets_dir: Path, **overrides):
    """The RunConfig of one dataset's run: the campaign's options, its model, weights and dataset, its folder
    `datasets_dir/<dataset>`; UsageError when the options are not a valid run."""
    return build_config({**campaign.options, "models": [campaign.model], "weights": entry.weights,
                         "dataset": entry.dataset, "split": entry_split(campaign, entry),
                         "output_dir": str(datasets_dir), "run_id": run_folder_name(entry), "draw_images": 0,
                         **overrides})


def check_options(campaign: Campaign, datasets_dir: Path) -> None:
    """The options every dataset's run shares, checked once before anything is written (one UsageError line): a
    bad backend or device would otherwise skip every dataset, one by one, and leave a campaign folder that the
    corrected command may not resume."""
    from harness.run.plan import check_runtimes, engine_defaults

    config = engine_defaults(dataset_config(campaign, campaign.entries[0], datasets_dir))
    check_runtimes(config)
    several = [name for name, values in (("backends", config.backends), ("precisions", config.precisions),
                                         ("batch_sizes", config.batch_sizes), ("input_sizes", config.input_sizes))
               if len(values) > 1]
    if several:  # one row is one cell per dataset
        raise UsageError(f"a campaign scores each dataset in one cell: its {several[0]} {getattr(config, several[0])} "
                         "are several; give one (a campaign per setting)")
    if not config.accuracy:
        raise UsageError("a campaign's row is its datasets' accuracy: drop accuracy: false (or --no-accuracy)")
    if config.repeats > 1:
        raise UsageError("a campaign times each dataset in its own process once; its row is accuracy: drop repeats "
                         "(--repeats)")
    if config.subset != RunConfig.model_fields["subset"].default:
        raise UsageError(f"subset {config.subset!r} picks COCO val2017 images; a campaign scores each dataset's own "
                         "images: drop it")
    if config.class_map is not None and not Path(config.class_map).expanduser().is_file():
        raise UsageError(path_problem("class_map", config.class_map, "no such file") + "; fix the campaign's options")
    if config.device.strip().lower().startswith("cuda"):
        from harness.measure.device import parse_device

        parse_device(config.device)  # a GPU asked for and not there: one line, before any dataset is skipped for it


def run_folder_name(entry: CampaignEntry) -> str:
    """The folder of a dataset's run under the campaign's datasets/."""
    return _slug(entry.name)


def incoming_folder(entry: CampaignEntry, datasets_dir: Path) -> Path:
    """Where a dataset's run folder made elsewhere (on a fleet node) is written before it takes its place."""
    return datasets_dir / f".{run_folder_name(entry)}.incoming"


def settled(campaign: Campaign, entry: CampaignEntry, datasets_dir: Path, progress=None) -> DatasetResult | None:
    """A dataset that needs no run: finished by an earlier pass of the campaign on the labels it has now (read
    back), or without weights (skipped, named). None when it has to run: also when its labels changed since it was
    scored (said on `progress`), as `run --resume` refuses to mix them. A finished run folder whose move into place
    was cut short is moved now; an unfinished one is dropped."""
    run_dir, incoming = datasets_dir / run_folder_name(entry), incoming_folder(entry, datasets_dir)
    if incoming.exists():
        if finished_submission(run_dir) is None and finished_submission(incoming) is not None:
            replace_folder(incoming, run_dir)
        else:
            shutil.rmtree(incoming, ignore_errors=True)
    finished = finished_submission(run_dir)
    if finished is not None and (changed := _labels_changed(campaign, entry, datasets_dir, finished)):
        if progress is not None:
            progress.log(f"{entry.name}: {changed} since it was scored: it runs again")
        finished = None
    if finished is not None:
        return DatasetResult(entry.name, entry.version, entry.weights or "", finished)
    if entry.skipped is not None:
        return DatasetResult(entry.name, entry.version, entry.weights or "", None, entry.skipped)
    if entry.weights is None:
        return DatasetResult(entry.name, entry.version, "", None, "no weights file for it")
    return None


def _labels_changed(campaign: Campaign, entry: CampaignEntry, datasets_dir: Path, finished: dict) -> str | None:
    """What changed in a finished dataset's ground truth (its recorded annotations_sha256 against the dataset as
    read now), or None; a dataset that no longer reads is left to its run to refuse."""
    from harness.run.plan import open_dataset
    from harness.run.resume import ground_truth_change

    scored_on = ((finished.get("repro") or {}).get("dataset") or {}).get("annotations_sha256")
    try:  # reading the labels (describe) is where a file broken since fails
        return ground_truth_change(scored_on, open_dataset(dataset_config(campaign, entry, datasets_dir)))
    except UsageError:
        return "its dataset no longer reads as it did"


def run_dataset(campaign: Campaign, entry: CampaignEntry, datasets_dir: Path, argv: list[str], progress,
                execute: Callable | None = None, **overrides) -> DatasetResult:
    """One dataset's run in `datasets_dir/<dataset>` (an unfinished folder of an earlier pass is replaced), or
    its reason for being skipped. `execute(plan, argv, progress)` runs the plan (default: with SIGINT/SIGTERM
    turned into a clean stop); `overrides` are RunConfig fields of this run only."""
    from harness.run.plan import prepare
    from harness.run.scheduler import run_with_interrupts

    run_dir = datasets_dir / run_folder_name(entry)
    if run_dir.exists():  # an unfinished run (killed, or failed before): the dataset runs again
        shutil.rmtree(run_dir)
    try:
        plan = prepare(dataset_config(campaign, entry, datasets_dir, **overrides), shared_class_map=True)
        outcome = (execute or run_with_interrupts)(plan, argv, progress)
    except RunInterrupted as exc:  # its message says how to resume the dataset's run: a campaign resumes itself
        raise RunInterrupted(f"stopped during dataset {entry.name}; the campaign's finished datasets are kept in "
                             f"{datasets_dir}: to continue, run the same command again: va-bench "
                             f"{shell.join(argv)}", exc.exit_code) from None
    except UsageError as exc:
        return DatasetResult(entry.name, entry.version, entry.weights or "", None, str(exc).splitlines()[0])
    if outcome.problems:
        return DatasetResult(entry.name, entry.version, entry.weights or "", None,
                             "; ".join(outcome.problems.values()))
    return DatasetResult(entry.name, entry.version, entry.weights or "", finished_submission(run_dir))


class DatasetRunner(Protocol):
    """Runs a campaign's datasets that still need a run, yielding each one's result as it is known (in any
    order). The local runner runs them one after another here; the fleet's sends each to a node."""

    def __call__(self, campaign: Campaign, entries: list[CampaignEntry], datasets_dir: Path, argv: list[str],
                 progress) -> Iterator[DatasetResult]: ...


def run_here(campaign: Campaign, entries: list[CampaignEntry], datasets_dir: Path, argv: list[str],
             progress) -> Iterator[DatasetResult]:
    """The datasets one after another on this machine."""
    for entry in entries:
        yield run_dataset(campaign, entry, datasets_dir, argv, progress)


def recipe_changes(before: dict, now: dict) -> list[str]:
    """What differs between two recipes, one phrase each: an option by name, with its two values (`backends:
    ['onnxruntime'] -> ['pytorch']`); the datasets and weights by name alone (their lists are long)."""
    changes = []
    for key in sorted(set(before) | set(now)):
        old, new = before.get(key), now.get(key)
        if old == new:
            continue
        if key == "options" and isinstance(old, dict) and isinstance(new, dict):
            changes += [f"{name}: {old.get(name)!r} -> {new.get(name)!r}" for name in sorted(set(old) | set(new))
                        if old.get(name) != new.get(name)]
        elif key in ("model", "split"):
            changes.append(f"{key}: {old!r} -> {new!r}")
        else:
            changes.append(key)
    return changes


def run_campaign(campaign: Campaign, output_dir: Path, campaign_id: str, argv: list[str], progress,
                 runner: DatasetRunner = run_here) -> tuple[Path, list[DatasetResult]]:
    """Every dataset's run (those finished by an earlier pass are read back), then the campaign's row
    (submissions/), its per-dataset table (datasets.csv) and plot (datasets.png)."""
    folder = output_dir / campaign_id
    check_options(campaign, folder / "datasets")
    if output_dir.exists() and not output_dir.is_dir():
        raise UsageError(path_problem("--output-dir", output_dir, "not a folder") + "; pick a folder")
    recipe = {**campaign.recipe(), "weights": campaign.weights_sha256}
    if (folder / CAMPAIGN_FILE).is_file():  # resuming: only the same campaign may add to its folder
        before = read_json_object(folder / CAMPAIGN_FILE).get("recipe")
        # nothing finished: nothing to mix, the corrected campaign starts over
        if before != recipe and any(d.is_dir() and finished_submission(d) for d in (folder / "datasets").glob("*")):
            raise UsageError(f"campaign {campaign_id} in {output_dir} was started with other "
                             f"{'; '.join(recipe_changes(before or {}, recipe))}; its finished datasets would mix "
                             "with these: use another --campaign-id")
    datasets_dir = folder / "datasets"
    created = [p for p in (folder, *folder.parents) if not p.exists()]  # what this call makes, innermost first
    datasets_dir.mkdir(parents=True, exist_ok=True)
    # one process per campaign folder: a second would replace the dataset run the first is writing
    lock = lock_folder(folder, f"campaign {campaign_id} in {output_dir} is being run by another va-bench process; "
                               "wait for it to finish or pick another --campaign-id")
    try:
        return _run_locked(campaign, folder, campaign_id, recipe, argv, progress, runner)
    except UsageError:  # refused before any dataset ran: a folder made now would hold only the recipe
        if folder in created and not any(datasets_dir.iterdir()):
            shutil.rmtree(folder, ignore_errors=True)
            with contextlib.suppress(OSError):  # --output-dir and the folders above it made now, while empty
                for made in created[1:]:
                    made.rmdir()
        raise
    finally:
        os.close(lock)


def _run_locked(campaign: Campaign, folder: Path, campaign_id: str, recipe: dict, argv: list[str], progress,
                runner: DatasetRunner) -> tuple[Path, list[DatasetResult]]:
    datasets_dir = folder / "datasets"
    atomic_write_json(folder / CAMPAIGN_FILE, {"campaign_id": campaign_id, "recipe": recipe})
    by_name: dict[str, DatasetResult] = {}
    todo = []
    for entry in campaign.entries:
        result = settled(campaign, entry, datasets_dir, progress)
        if result is None:
            todo.append(entry)
        else:
            by_name[entry.name] = result
            _log_result(progress, result)
    for result in runner(campaign, todo, datasets_dir, argv, progress):
        by_name[result.name] = result
        _log_result(progress, result)
    results = [by_name[e.name] for e in campaign.entries]
    if not any(r.submission for r in results):
        ran = any(d.is_dir() for d in datasets_dir.iterdir())
        # none ran (each refused: its data, its weights): bad input; else the runs say what failed
        raise (VaBenchError if ran else UsageError)(
            f"no dataset of campaign {campaign_id} could be scored (first reason: {results[0].reason}); "
            + (f"each dataset's run is in {datasets_dir}" if ran else "none ran: fix the datasets named above"))
    doc = campaign_submission(results, campaign.expected, campaign.recipe())
    runtime, hardware = doc["runtime"], doc["hardware"]
    path = folder / "submissions" / f"{campaign.model}__rf100vl__{runtime['format']}__{runtime['provider']}__" \
                                    f"{hardware['id']}.json"
    atomic_write_json(path, doc)
    atomic_write_bytes(folder / "datasets.csv", datasets_csv(results))
    plot = campaign_datasets([(r.name, r.submission["accuracy"].get("mAP_50_95") if r.submission else None, r.reason)
                              for r in results], doc["accuracy"].get("mAP_50_95"))
    if plot.png is not None:
        atomic_write_bytes(folder / plot.name, plot.png)
    return path, results


def _log_result(progress, result: DatasetResult) -> None:
    progress.log(f"{result.name}: " + ("ok, mAP {:.4f}".format(result.submission["accuracy"]["mAP_50_95"] or 0)
                                       if result.submission else f"skipped ({result.reason})"))


def datasets_csv(results: list[DatasetResult]) -> bytes:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(["dataset", "status", "num_images", "num_classes", *PER_DATASET_KEYS, "reason"])
    for r in results:
        sub = r.submission
        if sub is None:
            writer.writerow([r.name, "skipped", "", "", *("" for _ in PER_DATASET_KEYS), r.reason or ""])
        else:
            writer.writerow([r.name, "ok", sub["dataset"]["num_images"], sub["dataset"].get("num_categories"),
                             *(sub["accuracy"].get(k) for k in PER_DATASET_KEYS), ""])
    return out.getvalue().encode()
