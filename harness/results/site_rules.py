"""The vision-analysis site's own acceptance rules for a submission (its validator, re-implemented
so a harness user learns of a rejection before opening a pull request), plus its JSON Schema."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from harness.catalogue import topk_protocols
from harness.records import COCO_MAX_DETS

REQUIRED_BLOCKS = {
    "schema_version": str, "submission_id": str, "created_at": str, "model": dict, "config": dict,
    "hardware": dict, "runtime": dict, "accuracy": dict, "timing": dict, "throughput": dict,
    "model_stats": dict, "metadata": dict, "benchmark": dict,
}
NON_NEGATIVE_BLOCKS = ("config", "hardware", "accuracy", "timing", "throughput", "model_stats")
CONFIG_FIELDS = ("batch_size", "input_size", "conf", "iou", "max_det")
ACCURACY_STATS = ("mAP_50_95", "mAP_50", "mAP_75", "mAP_small", "mAP_medium", "mAP_large",
                  "AR1", "AR10", "AR100", "AR_small", "AR_medium", "AR_large")
# Every numeric field the site reads, by JSON path: "int", "number", or with "?" also null (a figure
# that may be unavailable). The site's schema leaves these blocks untyped, so a string p50 passes it
# and then renders as garbage; types here are what the 708 real files hold.
SITE_NUMBERS: dict[str, str] = {
    "model.input_size": "number",
    **{f"config.{k}": "int" for k in ("batch_size", "max_det")},
    **{f"config.{k}": "number" for k in ("input_size", "conf", "iou")},
    "hardware.ram_gb": "number", "hardware.gpu_memory_gb": "number?", "hardware.cpu_cores": "int?",
    # pycocotools gives -1 for an area range without ground truth (small subsets): recorded as null + reason
    **{f"accuracy.{k}": "number" if k in ("mAP_50_95", "mAP_50", "mAP_75") else "number?" for k in ACCURACY_STATS},
    # a segmentation row's box figures beside its mask ones (the site's segmentation board shows both)
    **{f"accuracy.bbox_{k}": "number" if k in ("mAP_50_95", "mAP_50", "mAP_75") else "number?"
       for k in ACCURACY_STATS if k.startswith("mAP")},
    "dataset.num_datasets": "int",  # an RF100-VL row's
    "timing.batch_size": "int", "timing.num_images": "int",
    **{f"timing.total_ms.{k}": "number" for k in ("mean", "std", "p50", "p95", "p99")},
    **{f"timing.total_ms.{k}": "number?" for k in ("preprocess_ms", "inference_ms", "postprocess_ms")},
    "throughput.fps_mean": "number", "throughput.fps_p50": "number",
    "memory.peak_ram_mb": "number?", "memory.peak_vram_mb": "number?",
    "model_stats.params_millions": "number?", "model_stats.gflops": "number?",
    "dataset.num_images": "int", "eval.numImages": "int",
}
# The site's evaluation protocol (conf, iou, max_det), and the families that document another one:
# Ultralytics' own val defaults are iou 0.7 (the corpus's yolov5u/yolov8/yolo11/yolo26 runs use it).
SITE_PROTOCOL = {"conf": 0.001, "iou": 0.6, "max_det": 300}
FAMILY_PROTOCOL = {family: {**SITE_PROTOCOL, "iou": 0.7} for family in ("yolov5u", "yolov8", "yolo11", "yolo26")}
RF100VL_PROTOCOL = {"conf": 0.001, "iou": 0.65, "max_det": 500}  # the site's RF100-VL section (rf100vl.libreyolo.v1)


def is_rf100vl(doc: Any) -> bool:
    """The site's rule (transform.ts): an `rf100vl` block, or dataset id rf100_vl."""
    if not isinstance(doc, dict):
        return False
    dataset = doc.get("dataset")
    return isinstance(doc.get("rf100vl"), dict) or (isinstance(dataset, dict) and dataset.get("id") == "rf100_vl")


def _rf100vl_protocol(doc: dict) -> dict:
    """RF100-VL's protocol as the file's own block states it (nms_iou, max_det), else the section's."""
    block = doc.get("rf100vl") if isinstance(doc.get("rf100vl"), dict) else {}
    stated = block.get("protocol") if isinstance(block.get("protocol"), dict) else {}
    return {"conf": RF100VL_PROTOCOL["conf"], "iou": stated.get("nms_iou", RF100VL_PROTOCOL["iou"]),
            "max_det": stated.get("max_det", RF100VL_PROTOCOL["max_det"])}


@dataclass(frozen=True)
class Finding:
    """One problem in one file: where (a JSON path like `timing.total_ms.p50`) and what."""

    path: str
    message: str
    rule: str
    severity: str = "error"  # error | warning

    def to_dict(self) -> dict:
        return {"path": self.path, "message": self.message, "rule": self.rule, "severity": self.severity}


def parse_iso8601(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def site_findings(doc: Any, support: dict | None) -> list[Finding]:
    """The site validator's rules; `support` is its support-matrix.json (None skips allow-lists)."""
    if not isinstance(doc, dict):
        return [Finding("$", "a submission must be a JSON object", "site.type")]
    out: list[Finding] = []
    for key, kind in REQUIRED_BLOCKS.items():
        if key not in doc:
            out.append(Finding(key, f"missing {key}", "site.required"))
        elif not isinstance(doc[key], kind):
            out.append(Finding(key, f"{key} must be {'an object' if kind is dict else 'a string'}", "site.type"))

    def block(name: str) -> dict:
        value = doc.get(name)
        return value if isinstance(value, dict) else {}

    if isinstance(doc.get("schema_version"), str) and doc["schema_version"] != "va.submission.v1":
        out.append(Finding("schema_version", "schema_version must be va.submission.v1", "site.schema_version"))
    for path, value in (("created_at", doc.get("created_at")),
                        ("metadata.benchmark_date", block("metadata").get("benchmark_date", 0))):
        if value is None and path == "created_at":
            continue
        if not isinstance(value, str):
            if "metadata" in doc and path != "created_at":
                out.append(Finding(path, f"{path} must be a string", "site.date"))
            continue
        try:
            parse_iso8601(value)
        except ValueError:
            out.append(Finding(path, f"{path} is not valid ISO-8601: {value[:40]!r}", "site.date"))
    if "submission_id" in doc and isinstance(doc["submission_id"], str) and not doc["submission_id"].strip():
        out.append(Finding("submission_id", "submission_id must be non-empty", "site.required"))

    model = block("model")
    model_id = str(model.get("id", "")).strip()
    if "model" in doc and not model_id:
        out.append(Finding("model.id", "model.id must be non-empty", "site.required"))
    elif support is not None and model_id and model_id not in set(support.get("models", [])):
        out.append(Finding("model.id", f"model.id {model_id} is not in the support matrix", "site.support_matrix"))

    runtime = block("runtime")
    if support is not None and runtime:
        runtimes = {r.get("backend"): r for r in support.get("runtimes", []) if isinstance(r, dict)}
        fmt, provider, precision = runtime.get("format"), runtime.get("provider"), runtime.get("precision")
        if fmt not in runtimes:
            out.append(Finding("runtime.format", f"runtime.format {fmt} is not in the support matrix",
                               "site.support_matrix"))
        else:
            if provider not in runtimes[fmt].get("providers", []):
                out.append(Finding("runtime.provider", f"runtime.provider {provider} is not supported for {fmt}",
                                   "site.support_matrix"))
            if precision not in runtimes[fmt].get("precisions", []):
                out.append(Finding("runtime.precision", f"runtime.precision {precision} is not supported for "
                                   f"{fmt}", "site.support_matrix"))

    for name in NON_NEGATIVE_BLOCKS:  # the site looks one level deep
        for key, value in block(name).items():
            items = value.items() if isinstance(value, dict) else [(None, value)]
            for sub, v in items:
                path = f"{name}.{key}" + (f".{sub}" if sub is not None else "")
                if _number(v) and (v < 0 or (isinstance(v, float) and math.isnan(v))):
                    out.append(Finding(path, f"{path} must be non-negative (is {v})", "site.non_negative"))

    config = block("config")
    if "config" in doc:
        for field in CONFIG_FIELDS:
            if field not in config:
                out.append(Finding(f"config.{field}", f"missing config.{field}", "site.required"))
    if "hardware" in doc and not str(block("hardware").get("id", "")).strip():
        out.append(Finding("hardware.id", "hardware.id must be non-empty", "site.required"))

    commit = block("benchmark").get("libreyolo_commit")
    allowed = support.get("supported_libreyolo_identifier") if support else None
    allowed = [allowed] if isinstance(allowed, str) else [a for a in (allowed or []) if isinstance(a, str)]
    if allowed and commit and commit != "unknown" and commit not in allowed:
        out.append(Finding("benchmark.libreyolo_commit", f"libreyolo_commit {commit} is not in the support matrix",
                           "site.support_matrix"))
    return out


def _lookup(doc: dict, dotted: str) -> tuple[bool, Any]:
    """(present, value) at a dotted path; absent when any block on the way is missing or not an object."""
    value: Any = doc
    for key in dotted.split("."):
        if not isinstance(value, dict) or key not in value:
            return False, None
        value = value[key]
    return True, value


def number_type_findings(doc: Any) -> list[Finding]:
    """A finding for each SITE_NUMBERS field that is present with the wrong type (absent ones are the
    required-field rules' business)."""
    if not isinstance(doc, dict):
        return []
    out = []
    for path, kind in SITE_NUMBERS.items():
        present, value = _lookup(doc, path)
        if not present or (value is None and kind.endswith("?")):
            continue
        want_int = kind.startswith("int")
        ok = (isinstance(value, int) if want_int else _number(value)) and not isinstance(value, bool)
        if not ok:
            want = "an integer" if want_int else "a number"
            out.append(Finding(path, f"{path} must be {want}{' or null' if kind.endswith('?') else ''}, "
                               f"got {type(value).__name__} {str(value)[:30]!r}", "type.number"))
    return out


def as_stated_by_site(model_id: Any, conf: Any, max_det: Any) -> tuple[Any, Any]:
    """(conf, max_det) as the site's rows state them: a top-k model run at the thresholds libreyolo's validator
    applies to it (conf 0 or 0.001, its own query count) ran the site's protocol, which those rows state as conf
    0.001, max_det 300; anything else is returned as given."""
    effective = topk_protocols().get(model_id) if isinstance(model_id, str) else None
    if effective is not None and (conf, max_det) == effective:
        return SITE_PROTOCOL["conf"], SITE_PROTOCOL["max_det"]
    return conf, max_det


def protocol_findings(doc: Any) -> list[Finding]:
    """A warning when conf/iou/max_det differ from the site's protocol (or the family's documented one)."""
    if not isinstance(doc, dict) or not isinstance(doc.get("config"), dict):
        return []
    model = doc["model"] if isinstance(doc.get("model"), dict) else {}
    family = model.get("family") if isinstance(model.get("family"), str) else None
    protocol = _rf100vl_protocol(doc) if is_rf100vl(doc) else FAMILY_PROTOCOL.get(family, SITE_PROTOCOL)
    config = dict(doc["config"])
    if not is_rf100vl(doc):
        config["conf"], config["max_det"] = as_stated_by_site(model.get("id"), config.get("conf"),
                                                              config.get("max_det"))
    off = {k: config[k] for k, want in protocol.items() if _number(config.get(k)) and config[k] != want}
    max_dets = doc["eval"].get("maxDets") if isinstance(doc.get("eval"), dict) else None
    if not is_rf100vl(doc) and isinstance(max_dets, list) and max_dets and (
            not all(_number(m) for m in max_dets) or max(max_dets) != COCO_MAX_DETS):
        off["eval.maxDets"] = max_dets  # AP read at another cap than COCO's (RF100-VL's are checked with its row)
        protocol = {**protocol, "eval.maxDets": [1, 10, COCO_MAX_DETS]}
    if not off:
        return []
    got = ", ".join(f"{k} {v}" for k, v in off.items())
    want = ", ".join(f"{k} {protocol[k]}" for k in off)
    whose = "RF100-VL's" if is_rf100vl(doc) else f"the {family} family's" if family in FAMILY_PROTOCOL else "the site's"
    return [Finding("config", f"non-standard protocol: {got} ({whose} protocol is {want}); its accuracy is "
                    "not comparable with standard runs", "nonstandard-protocol", "warning")]


def schema_findings(doc: Any, schema: dict) -> list[Finding]:
    """JSON Schema (draft 2020-12) violations, one finding each."""
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(schema)
    out = []
    for error in sorted(validator.iter_errors(doc), key=lambda e: list(e.absolute_path)):
        path = ".".join(str(p) for p in error.absolute_path) or "$"
        out.append(Finding(path, error.message[:300], "schema"))
    return out
