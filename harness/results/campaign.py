"""One campaign submission from its datasets' submissions: the site's RF100-VL row (one fine-tuned model per
dataset, unweighted mean over datasets), built from files already written, so a resumed campaign gives the
same row (its created_at and submission id aside, and the measured timing of the datasets run after the stop).

The row's shape is the site's (two real RF100-VL submissions in the vision-analysis corpus): `dataset`
{id rf100_vl, split, num_images, num_datasets}, `eval.maxDets`, `accuracy` (each key the unweighted mean of
the datasets' values; a statistic COCOeval leaves undefined for a dataset, e.g. no small objects, is left out
of that key's mean), the `rf100vl` block and `repro.dataset` with its identity scheme.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np

from harness.records import utc_now_iso
from harness.results.site_rules import RF100VL_PROTOCOL

RF100VL_ID = "rf100_vl"
PROTOCOL_VERSION = "rf100vl.libreyolo.v1"
RF100VL_DATASETS = 100  # the protocol's datasets: a row of fewer is partial, however many a download held
RF100VL_NAMES_FILE = Path(__file__).resolve().parents[1] / "data" / "rf100vl_datasets.json"


@cache
def rf100vl_names() -> frozenset[str]:
    """RF100-VL's 100 dataset names (harness/data/rf100vl_datasets.json, as the site's RF100-VL rows list them)."""
    return frozenset(json.loads(RF100VL_NAMES_FILE.read_text(encoding="utf-8"))["datasets"])


def not_rf100vl(names: list[str]) -> str | None:
    """Why datasets named so are not RF100-VL's own (a campaign of 100 other datasets is no RF100-VL row), or None."""
    others = sorted(set(names) - rf100vl_names())
    if not others:
        return None
    listed = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
    return f"{len(others)} of its datasets are not RF100-VL's ({listed}): a row of other datasets is not RF100-VL's"
IDENTITY_SCHEME = ("sha256(canonical JSON of dataset name, image count, per-dataset image-id SHA-256, and locked "
                   "version id)")
PER_DATASET_KEYS = ("mAP_50", "mAP_50_95", "mAP_75", "AR100", "AR_max_det")


@dataclass(frozen=True)
class DatasetResult:
    """One dataset of a campaign: its submission (None when it was skipped) and why it was skipped."""

    name: str
    version: str | int | None
    weights: str
    submission: dict | None
    reason: str | None = None


def canonical_sha256(obj: Any) -> str:
    """SHA-256 of canonical JSON (sorted keys, no spaces)."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _mean(values: list) -> float | None:
    numbers = [v for v in values if isinstance(v, (int, float)) and not isinstance(v, bool)]
    return float(np.mean(numbers)) if numbers else None


def protocol_problems(config: dict, max_dets: Any) -> list[str]:
    """How a run's options differ from rf100vl.libreyolo.v1's (conf, NMS IoU, max_det, COCOeval's cap): a row
    measured otherwise is not comparable with the section's, whatever its datasets."""
    out = [f"{key} {config.get(key)} is not the protocol's {want}" for key, want in RF100VL_PROTOCOL.items()
           if config.get(key) != want]
    if not isinstance(max_dets, list) or RF100VL_PROTOCOL["max_det"] not in max_dets:
        out.append(f"COCOeval's maxDets {max_dets} lack the protocol's {RF100VL_PROTOCOL['max_det']}")
    return out


def count_reason(scored: int, listed: int) -> str:
    """Why a row of `scored` datasets (of the `listed` its campaign named) is not RF100-VL's whole."""
    return f"{scored} of {RF100VL_DATASETS} datasets scored" + (
        f" (the campaign lists {listed})" if listed != RF100VL_DATASETS else "")


def scored_as_listed(block: dict, listed: int) -> bool:
    """Every dataset the campaign lists scored under the protocol on one machine: nothing keeps the row from being
    valid but (for a campaign of other datasets than RF100-VL's 100) their number and names."""
    datasets = block.get("datasets") or []
    allowed = {count_reason(len(datasets), listed), not_rf100vl([d.get("dataset") for d in datasets])}
    return len(datasets) == listed and all(r in allowed for r in block.get("invalid_reasons") or [])


def campaign_submission(results: list[DatasetResult], expected: int, recipe: dict,
                        created_at: str | None = None) -> dict:
    """The campaign's row from its datasets' submissions (at least one scored). `expected`: the datasets the
    campaign lists; the row is valid only with all of RF100-VL's 100 scored under its protocol, on one split (the
    row's split is the one its datasets' runs loaded)."""
    scored = [r for r in results if r.submission is not None]
    if not scored:
        raise ValueError("no dataset of the campaign was scored")
    template = scored[0].submission
    subs = [r.submission for r in scored]
    splits = sorted({str(s["dataset"].get("split")) for s in subs})
    split = "+".join(splits)
    created_at = created_at or utc_now_iso()
    stat_keys = [k for k in template["accuracy"] if isinstance(template["accuracy"][k], (int, float, type(None)))]
    accuracy = {k: _mean([s["accuracy"].get(k) for s in subs]) for k in dict.fromkeys([*stat_keys, "AR_max_det"])}
    datasets = [{"dataset": r.name, "num_images": r.submission["dataset"]["num_images"],
                 "num_classes": r.submission["dataset"].get("num_categories"), "dataset_version": r.version,
                 "weights": r.weights, "weights_sha256": (r.submission["repro"].get("weights") or {}).get("sha256"),
                 **{k: r.submission["accuracy"].get(k) for k in PER_DATASET_KEYS}} for r in scored]
    identities = [{"dataset": r.name, "num_images": r.submission["dataset"]["num_images"],
                   "image_id_sha256": r.submission["dataset"]["image_id_sha256"], "version_id": r.version}
                  for r in scored]
    skipped = [{"dataset": r.name, "reason": r.reason} for r in results if r.submission is None]
    invalid = [count_reason(len(scored), expected)] if len(scored) != RF100VL_DATASETS else []
    invalid += [f"{s['dataset']}: {s['reason']}" for s in skipped]
    invalid += protocol_problems(template["config"], template["eval"].get("maxDets"))
    if (foreign := not_rf100vl([r.name for r in scored])) is not None:
        invalid.append(foreign)
    if len(splits) > 1:
        invalid.append(f"its datasets were scored on different splits ({', '.join(splits)}); one row is one split")
    hardware_ids = sorted({s["hardware"]["id"] for s in subs})
    if len(hardware_ids) > 1:  # a resumed campaign on another machine, or runs brought together by hand
        invalid.append(f"its datasets were measured on different hardware ({', '.join(hardware_ids)}); "
                       "one row is one machine: run the campaign on one")
    num_images = sum(d["num_images"] for d in datasets)
    model, runtime, hardware = template["model"], template["runtime"], template["hardware"]
    stamp = created_at.replace("-", "").replace(":", "").replace(".", "")
    timing = pooled_timing(subs)
    return {
        "schema_version": template["schema_version"],
        "submission_id": "-".join([model["id"], "rf100vl", runtime["format"], runtime["provider"], hardware["id"],
                                   stamp]),
        "created_at": created_at,
        "benchmark": template["benchmark"],
        "model": {**model, "weights": "fine-tuned per dataset (rf100vl.datasets[].weights)"},
        # as the site's rows count: num_datasets the scored ones (rf100vl.datasets), the campaign's own as selected
        "dataset": {"id": RF100VL_ID, "split": split, "num_images": num_images, "num_datasets": len(scored),
                    "num_datasets_selected": len(results)},
        "config": {k: template["config"][k] for k in ("batch_size", "input_size", "conf", "iou", "max_det")},
        "hardware": hardware,
        "software": template.get("software"),
        "runtime": runtime,
        "accuracy": accuracy,
        "timing": timing,
        "throughput": {"fps_mean": round(1000.0 / timing["total_ms"]["mean"], 3),
                       "fps_p50": round(1000.0 / timing["total_ms"]["p50"], 3)},
        "model_stats": template.get("model_stats") or {},
        "memory": {"peak_ram_mb": max((s.get("memory") or {}).get("peak_ram_mb") or 0 for s in subs) or None},
        "metadata": {"benchmark_date": created_at, "campaign": "rf100vl"},
        "eval": {"dataset": RF100VL_ID, "split": split, "numImages": num_images,
                 "maxDets": template["eval"].get("maxDets")},
        "repro": {**{k: template["repro"][k] for k in ("harness_version", "harness_commit", "harness_dirty")},
                  "dataset": {"id": RF100VL_ID, "split": split, "image_id_sha256": canonical_sha256(identities),
                              "identity_scheme": IDENTITY_SCHEME, "datasets": identities}},
        "rf100vl": {"regime": "fine-tuned", "aggregation": "unweighted mean across datasets",
                    "protocol": {"version": PROTOCOL_VERSION, "nms_iou": template["config"]["iou"],
                                 "max_det": template["config"]["max_det"], "expected_datasets": RF100VL_DATASETS},
                    "dataset_versions_sha256": canonical_sha256([[i["dataset"], i["version_id"]] for i in identities]),
                    "recipe_sha256": canonical_sha256(recipe),
                    "valid_submission": not invalid, "invalid_reasons": invalid,
                    "skipped_datasets": [s["dataset"] for s in skipped], "datasets": datasets},
    }


def per_image_samples(timing: dict) -> list[float]:
    """A cell's per-image time of each timed batch: the batch's time / its size, or in overlapped mode the
    interval since the previous completion (a batch's own sample there is its latency, queueing included)."""
    if timing.get("mode") == "overlapped":
        return list(timing["interval_samples_ms"])
    return [t / timing["batch_size"] for t in timing["batch_samples_ms"]]


def pooled_timing(subs: list[dict]) -> dict:
    """Per-image latency over every dataset's timed batches pooled (each batch / its batch size)."""
    per_dataset = [per_image_samples(s["timing"]) for s in subs]
    x = np.asarray([t for samples in per_dataset for t in samples])
    p50, p95, p99 = np.percentile(x, [50, 95, 99])
    # the sample standard deviation, as every cell's: one sample has no spread to speak of, not a spread of 0
    std = round(float(x.std(ddof=1)), 4) if len(x) > 1 else None
    total = {"mean": round(float(x.mean()), 4), "std": std,
             "p50": round(float(p50), 4), "p95": round(float(p95), 4), "p99": round(float(p99), 4)}
    for stage in ("preprocess_ms", "inference_ms", "postprocess_ms"):  # each dataset's mean, weighted by its samples
        means = [((s["timing"].get("total_ms") or {}).get(stage), len(samples))
                 for s, samples in zip(subs, per_dataset, strict=True)]
        total[stage] = (round(sum(m * n for m, n in means) / len(x), 4)
                        if all(isinstance(m, (int, float)) for m, _ in means) else None)
    return {"batch_size": subs[0]["timing"]["batch_size"], "num_images": sum(s["timing"]["num_images"] for s in subs),
            "total_ms": total, "aggregation": "every dataset's timed batches pooled, per image"}
