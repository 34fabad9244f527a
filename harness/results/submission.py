"""Build `va.submission.v1` documents from cell records.

The site's blocks and field names are kept exactly (see the corpus in ../shared/corpus); what we
add lives in extra keys v1 readers ignore. `timing.total_ms` is per image (batch latency / batch
size, so fps = 1000 / ms at every batch size, as the site computes); per-batch latency is in
`timing.batch_ms`, per-stage times (per batch) in `timing.stages_ms`. `timing.mode` says how the
batches ran: "latency" (one after another: stage times add up to the batch time) or "overlapped"
(overlapped mode: a batch's time is its end-to-end latency with queueing, `throughput.images_per_s` is
images over the wall time of the stream, and `total_ms` is the per-image interval between batch completions,
so the site's fps = 1000 / total_ms.mean reads the throughput). The total_ms split: `site_split`.
"""

from __future__ import annotations

from harness import HARNESS_NAME, __version__
from harness.files import safe_name
from harness.hardware import slugify
from harness.records import CellRecord

SCHEMA_VERSION = "va.submission.v1"


def _ts(created_at: str) -> str:
    """'2026-11-22T03:15:00.123456Z' -> '20261122T031500123456Z' (the site's file-name stamp)."""
    return created_at.replace("-", "").replace(":", "").replace(".", "")


def submission_filename(record: CellRecord) -> str:
    """{model}__{format}__{provider}__{hardware_id}__b{batch}__{timestamp}.json, every part sanitised."""
    parts = [record.model["id"], record.runtime["format"], record.runtime["provider"]]
    safe = [safe_name(p) for p in parts]
    safe.append(slugify(record.hardware["id"]) or "unknown")
    return "__".join(safe) + f"__b{record.cell.batch_size}__{_ts(record.created_at)}.json"


def _stage_mean(record: CellRecord, name: str) -> float | None:
    s = record.timing.stages_ms.get(name)
    return None if s is None else s.mean / record.cell.batch_size


def site_split(record: CellRecord) -> dict[str, float | None]:
    """timing.total_ms.{preprocess,inference,postprocess}_ms per image, adding up to total_ms.mean.

    inference_ms is transfer + forward (the host->device copy of the input belongs to running the model;
    on the device-resident path the uint8 upload is inside preprocess). Latency mode: each stage's mean
    per image (they leave out only the timer's bookkeeping between stages, microseconds). Overlapped mode:
    total_ms.mean is the per-image interval of the stream, the forward runs on the critical path, and host
    work shows only where the forward waited for it: the interval minus inference, split between pre- and
    post-processing in proportion to their measured times. With N forwards running at once (a runtime's own
    streams), each takes 1/N of the interval: inference is the forward's time over N, at most the interval; forwards
    in flight that run one after another (the forward in a process of its own) do not divide it."""
    pre, post = _stage_mean(record, "preprocess"), _stage_mean(record, "postprocess")
    forward, transfer = _stage_mean(record, "forward"), _stage_mean(record, "transfer")
    inference = None if forward is None else forward + (transfer or 0.0)
    if record.timing.mode == "overlapped" and None not in (pre, post, inference):
        host = record.runtime.get("host") or {}
        in_flight = host.get("forwards_concurrent", host.get("forwards_in_flight")) or 1
        inference = min(inference / in_flight, record.timing.image_ms.mean)
        host = max(record.timing.image_ms.mean - inference, 0.0)
        share = pre / (pre + post) if pre + post > 0 else 0.5
        pre, post = host * share, host * (1 - share)
    return {k: None if v is None else round(v, 4)
            for k, v in (("preprocess_ms", pre), ("inference_ms", inference), ("postprocess_ms", post))}


def runtime_block(record: CellRecord) -> dict:
    """The site's runtime fields (format, provider, precision, device in its cpu|gpu|npu vocabulary) plus
    ours: `device_name` (the exact device: "cuda:0 NVIDIA H100 ...", "cpu") and the TF32 state."""
    runtime = dict(record.runtime)
    exact = runtime.get("device_name") or record.environment.get("device") or runtime.get("device") or "cpu"
    runtime["device"] = "gpu" if str(runtime.get("device", exact)).startswith(("cuda", "gpu")) else "cpu"
    runtime["device_name"] = exact
    runtime["tf32"] = record.environment["tf32"]
    return runtime


def build_submission(record: CellRecord) -> dict:
    """One complete submission document for one cell."""
    t = record.timing
    load = record.cell.load
    model = record.model
    size = load.input_size[0]
    env = record.environment
    dataset = record.dataset
    image = t.image_ms
    submission_id = "-".join([model["id"], record.runtime["format"], record.runtime["provider"],
                              record.hardware["id"], f"b{t.batch_size}", f"{size}", _ts(record.created_at)])
    accuracy = (dict(record.accuracy.stats) if record.accuracy
                else {"status": "unavailable", "reason": record.accuracy_reason or "not evaluated"})
    doc = {
        "schema_version": SCHEMA_VERSION,
        "submission_id": submission_id,
        "created_at": record.created_at,
        "benchmark": {"harness": HARNESS_NAME, "harness_version": __version__,
                      # the model library's release that built a libreyolo model, where the site's rows state it
                      **({"libreyolo_version": model["weights"]["libreyolo_version"]}
                         if model["weights"].get("libreyolo_version") else {})},
        "model": {"id": model["id"], "name": model["id"], "family": model["family"], "variant": model["variant"],
                  "task": model.get("task", "detect"), "source": model["weights"]["source"],
                  "weights": model["weights"]["file"], "input_size": size},
        "dataset": {"id": dataset["id"], "split": dataset["split"], "num_images": dataset["num_images"],
                    "variant": dataset["variant"], "base_variant": dataset["base_variant"],
                    "image_id_sha256": dataset["image_id_sha256"], "num_categories": dataset["num_categories"]},
        "config": {"batch_size": t.batch_size, "input_size": size, "conf": record.thresholds["conf"],
                   "iou": record.thresholds["iou"], "max_det": record.thresholds["max_det"],
                   "postprocess": record.thresholds.get("postprocess"),
                   "preprocess": record.thresholds.get("preprocess"),
                   **({"masks": record.thresholds["masks"]} if "masks" in record.thresholds else {})},
        "hardware": {k: v for k, v in record.hardware.items() if k != "id_source"},
        "software": env["software"],
        "accuracy": accuracy,
        "timing": {
            "batch_size": t.batch_size,
            "num_images": t.timed_images,
            "total_ms": {"mean": round(image.mean, 4), "std": None if image.std is None else round(image.std, 4),
                         "p50": round(image.p50, 4), "p95": round(image.p95, 4), "p99": round(image.p99, 4),
                         **site_split(record)},
            "per_image_ms": image.to_dict(),
            **({"tail": t.tail} if t.tail is not None else {}),
            "batch_ms": t.batch_ms.to_dict(),
            "stages_ms": {name: s.to_dict() for name, s in t.stages_ms.items()},
            "batch_samples_ms": t.batch_samples_ms,
            **({"interval_samples_ms": t.interval_samples_ms} if t.interval_samples_ms is not None else {}),
            "timed_batches": t.timed_batches,
            **({"timed_seconds": t.timed_seconds} if t.timed_seconds is not None else {}),
            "warmup": {"batches": t.warmup_batches, "seconds": t.warmup_seconds, "ended": t.warmup_ended,
                       "samples_ms": t.warmup_samples_ms},
            "stage_sync": t.stage_sync,
            "mode": t.mode,
            "short_batch": t.short_batch,
            "throttled": t.throttled,
            **({"target_ci": t.target_ci} if t.target_ci is not None else {}),
            "warnings": t.warnings,
        },
        "throughput": {"fps_mean": round(1000.0 / image.mean, 3), "fps_p50": round(1000.0 / image.p50, 3),
                       "images_per_s": round(t.images_per_s, 3)},
        "model_stats": record.model_stats,
        "memory": record.memory,
        "energy": record.energy,
        "layers": record.layers,
        "profiler": record.profiler,
        "metadata": {"benchmark_date": record.created_at, "benchmark_version": __version__,
                     "run_id": record.run_id},
        "eval": {"dataset": "coco" if dataset["id"] == "coco2017" else dataset["id"], "split": dataset["split"],
                 "numImages": dataset["num_images"],
                 "evaluator": record.accuracy.evaluator if record.accuracy else None,
                 "batch_size": record.accuracy.batch_size if record.accuracy else None,
                 "maxDets": record.accuracy.max_dets if record.accuracy else None,
                 "iouType": record.accuracy.iou_types if record.accuracy else None,
                 "per_class": record.accuracy.per_class_file if record.accuracy else None,
                 **({"operating_point": record.accuracy.operating_point}
                    if record.accuracy and record.accuracy.operating_point else {}),
                 **({"map_ci": record.accuracy.map_interval}
                    if record.accuracy and record.accuracy.map_interval else {}),
                 "detections": record.accuracy.detections_file if record.accuracy else None,
                 "detections_sha256": record.accuracy.detections_sha256 if record.accuracy else None,
                 **({"same_detections_as": record.accuracy.same_detections_as}
                    if record.accuracy and record.accuracy.same_detections_as else {}),
                 "status": "ok" if record.accuracy else f"unavailable: {record.accuracy_reason}"}
        | ({"int8_vs_fp32": record.accuracy.reference} if record.accuracy and record.accuracy.reference else {}),
        "runtime": runtime_block(record),
        "batch_invariance": record.invariance.to_dict() if record.invariance else None,
        **({"server": record.server} if record.server is not None else {}),
        "repro": {"harness_version": env["harness_version"], "harness_commit": env["harness_commit"],
                  "harness_dirty": env["harness_dirty"], "command": env["command"], "argv": env["argv"],
                  "dataset": {"image_id_sha256": dataset["image_id_sha256"], "variant": dataset["variant"],
                              "num_images": dataset["num_images"],
                              **({"categories_sha256": dataset["categories_sha256"]}  # none: generated input
                                 if dataset.get("categories_sha256") else {}),
                              **({"annotations_sha256": dataset["annotations_sha256"]}
                                 if dataset.get("annotations_sha256") else {}),
                              **({"class_map": dataset["class_map"]} if "class_map" in dataset else {}),
                              **({"decoded_with_errors": dataset["decoded_with_errors"]}
                                 if dataset.get("decoded_with_errors") else {})},
                  "weights": model["weights"],
                  # a converting runtime: which converter made the model it ran, its version, from which graph
                  **({"conversion": {k: v for k, v in record.runtime["conversion"].items() if k != "checked"}}
                     if record.runtime.get("conversion") else {}),
                  "preprocess": (record.runtime.get("preprocess") or {}).get("implementation"),
                  "workers": (record.runtime.get("host") or {}).get("workers")},  # --workers (overlapped mode)
        "environment": {k: env[k] for k in ("threads", "memory_allocator", "cpu_governor", "cuda", "platform",
                                            "device")}
        # start-up times; where decode reads from; the device's state during the pass and before the run
        | {k: env[k] for k in ("startup", "images", "device_state", "gpu_hygiene", "cpu_affinity") if k in env},
        "artifacts": record.artifacts,
    }
    return doc
