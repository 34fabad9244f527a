"""`va-bench validate`: the site's rules plus ours (numeric types of the fields the site reads, commit
guard, coordinate completeness, dataset fingerprint, degenerate statistics, non-standard protocol,
random weights, the run's detections file) over files or folders of submissions. Never crashes on a
file: anything unreadable is a finding."""

from __future__ import annotations

import json
import math
import unicodedata
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from harness.data.variants import KNOWN_FINGERPRINTS
from harness.errors import UsageError, path_problem
from harness.files import file_identity, file_sha256
from harness.json_stream import NotAJsonArray
from harness.results.campaign import PROTOCOL_VERSION, RF100VL_DATASETS, not_rf100vl, protocol_problems
from harness.results.model import SEGMENT_TASKS, Submission
from harness.results.reader import collect_files, detections_file, other_document, read_detections, read_json
from harness.results.site_rules import (
    RF100VL_PROTOCOL,
    Finding,
    number_type_findings,
    protocol_findings,
    schema_findings,
    site_findings,
)

MIN_IMAGES_FOR_SPREAD = 10
EXTENDED_SCHEMA = Path(__file__).with_name("submission.v1.extended.schema.json")


def is_site_rule(finding: Finding) -> bool:
    """Findings the site itself would reject a file for (as opposed to va-bench's stricter rules)."""
    return finding.rule.startswith(("site.", "schema", "file.", "type"))


@dataclass
class FileReport:
    """Findings for one file; `submission` is set when the file parsed."""

    path: Path
    findings: list[Finding] = field(default_factory=list)
    submission: Submission | None = None
    raw: dict | None = None
    other_kind: str | None = None  # a JSON document of another kind (a support matrix, a JSON Schema)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    def to_dict(self) -> dict:
        return {"file": str(self.path), "ok": not self.errors, "findings": [f.to_dict() for f in self.findings]}


@dataclass
class Validation:
    """The reports of one validate call, and notes on what was (not) read."""

    reports: list[FileReport]
    notes: list[str] = field(default_factory=list)


def _walk_numbers(obj: Any, path: str = ""):
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _walk_numbers(v, f"{path}.{k}" if path else str(k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            yield from _walk_numbers(v, f"{path}[{i}]")
    elif isinstance(obj, (int, float)) and not isinstance(obj, bool):
        yield path, obj


def commit_problem(commit: object, dirty: object, where: str) -> str | None:
    """Why `commit` does not pin the code that measured (None when it does: a commit hash of a clean tree)."""
    if commit is not None and not isinstance(commit, str):
        return f"{where} is {commit!r}, not a commit hash"
    if not commit or commit == "unknown":
        return f"{where} is {commit or 'missing'}"
    if dirty:
        return f"{where} {commit[:12]} was dirty"
    return None


def our_findings(doc: dict, sub: Submission) -> list[Finding]:
    """The harness's rules on top of the site's."""
    out: list[Finding] = []
    variant = sub.dataset_variant
    # commit guard: full-val accuracy must come from a pinned, clean tree
    commit, dirty, where = sub.commit
    has_accuracy = isinstance(sub.accuracy.get("mAP_50_95"), (int, float))
    if has_accuracy:
        problem = commit_problem(commit, dirty, where)
        if problem:
            if sub.is_full_val:
                out.append(Finding(where, f"full-val accuracy needs a pinned, clean commit: {problem}",
                                   "commit_guard"))
            else:
                kind = "an RF100-VL run" if sub.is_rf100vl else "a subset run"
                out.append(Finding(where, f"unpinned commit on {kind}: {problem}", "commit_guard", "warning"))
    out += rf100vl_findings(doc, sub)
    out += task_findings(doc, sub)
    out += text_findings(doc)
    samples = (doc.get("timing") or {}).get("batch_samples_ms") if isinstance(doc.get("timing"), dict) else None
    if samples is not None and not (isinstance(samples, list) and all(
            _finite_number(x) and x > 0 for x in samples)):
        out.append(Finding("timing.batch_samples_ms", "timing.batch_samples_ms is not a list of positive numbers "
                           f"({str(samples)[:40]}): no latency statistic can be read from it", "timing"))
    # coordinate completeness
    coords = {"hardware.id": sub.hardware_id if sub.hardware_id != "unknown" else None,
              "config.batch_size": sub.batch_size, "config.input_size": sub.input_size,
              "runtime.precision": sub.runtime.precision, "dataset.num_images": sub.num_images}
    for path, value in coords.items():
        if value in (None, ""):
            out.append(Finding(path, f"coordinate {path} is missing and cannot be derived", "coordinates"))
    if not (sub.hardware.id and str(sub.hardware.id).strip()) and coords["hardware.id"]:
        out.append(Finding("hardware.id", f"hardware.id absent; derived {coords['hardware.id']!r} from device names",
                           "coordinates", "warning"))
    # a dataset of its own: the site has no board for it (its rule puts every non-RF100-VL file on COCO's)
    if sub.dataset_id == "synthetic":
        out.append(Finding("dataset.id", "synthetic input (--input synthetic: generated images, a timing-only run): "
                           "not publishable; rerun on the dataset to publish", "synthetic-input"))
    elif sub.dataset_id == "coco2017" and isinstance(recorded := (sub.repro or {}).get("dataset"), dict) \
            and recorded.get("class_map"):
        # the COCO boards rank models on COCO's own classes: a renamed scoring is a different question
        out.append(Finding("repro.dataset.class_map", "scored on COCO val2017 through a class map (--class-map): "
                           "its mAP is not the model's on COCO's classes; keep it for your own comparisons, or rerun "
                           "without the map to publish", "class-map"))
    elif sub.dataset_id != "coco2017" and not sub.is_rf100vl:
        out.append(Finding("dataset.id", f"dataset {sub.dataset_id!r} is not COCO val2017: the site would list this "
                           f"file on its COCO {sub.board} board; keep it for your own comparisons", "dataset"))
    recorded = (sub.repro or {}).get("dataset")
    garbled = recorded.get("decoded_with_errors") if isinstance(recorded, dict) else None
    if isinstance(garbled, list) and garbled:
        out.append(Finding("repro.dataset.decoded_with_errors", f"{len(garbled)} image(s) decode only with errors "
                           f"(first: {str(garbled[0])[-60:]}): the accuracy scores what the decoder made of them; "
                           "replace the files to publish", "dataset", "warning"))
    # the device it was measured on
    if sub.timing.get("throttled") is True:
        out.append(Finding("timing.throttled", "the device throttled during the timed pass (environment.device_state"
                           " says why): timings are suspect", "device", "warning"))
    hygiene = (doc.get("environment") or {}).get("gpu_hygiene") if isinstance(doc.get("environment"), dict) else None
    if isinstance(hygiene, dict) and hygiene.get("shared_gpu_allowed") and hygiene.get("other_processes"):
        out.append(Finding("environment.gpu_hygiene", f"measured on a shared GPU ({len(hygiene['other_processes'])} "
                           "other compute processes, --allow-shared-gpu): latency is suspect", "device", "warning"))
    # dataset fingerprint
    n, sha = sub.num_images, sub.image_id_sha256
    if variant in KNOWN_FINGERPRINTS:
        want_n, want_sha = KNOWN_FINGERPRINTS[variant]
        if n is not None and n != want_n:
            out.append(Finding("dataset.num_images", f"variant {variant} has {want_n} images, file says {n}",
                               "dataset_fingerprint"))
        if sha and sha != want_sha:
            out.append(Finding("dataset.image_id_sha256", f"image ids are not the {variant} set "
                               f"(sha256 {sha[:12]}…, expected {want_sha[:12]}…)", "dataset_fingerprint"))
    elif sha and n is not None:
        for name, (known_n, known_sha) in KNOWN_FINGERPRINTS.items():
            if sha == known_sha and n != known_n:
                out.append(Finding("dataset.num_images", f"image ids are the {name} set but num_images is {n}",
                                   "dataset_fingerprint"))
    legacy_n = sub.eval.num_images if sub.eval else None
    if isinstance(legacy_n, int) and n is not None and legacy_n != n:
        out.append(Finding("eval.numImages", f"eval.numImages {legacy_n} disagrees with dataset.num_images {n}",
                           "dataset_fingerprint"))
    # degenerate statistics
    total = sub.timing.get("total_ms")
    timed = sub.timing.get("num_images") or n or 0
    if isinstance(total, dict):
        std, p50, p95, p99 = (total.get(k) for k in ("std", "p50", "p95", "p99"))
        if std == 0 and p50 is not None and p50 == p95 == p99 and timed >= MIN_IMAGES_FOR_SPREAD:
            out.append(Finding("timing.total_ms", f"degenerate timing: std 0 and p50 = p95 = p99 = {p50} over "
                               f"{timed} images (a constant, not a measurement)", "degenerate"))
        if isinstance(p50, (int, float)) and p50 == 0:
            out.append(Finding("timing.total_ms.p50", "latency of 0 ms is not a measurement", "degenerate"))
    batch_ms = sub.timing.get("batch_ms")
    if isinstance(batch_ms, dict):
        for key in ("mean", "p50", "min", "max"):
            if _is_number(batch_ms.get(key)) and batch_ms[key] == 0:
                out.append(Finding(f"timing.batch_ms.{key}", f"timing.batch_ms.{key} of 0 ms is not a measurement",
                                   "degenerate"))
    throughput = doc.get("throughput") if isinstance(doc.get("throughput"), dict) else {}
    for key in ("images_per_s", "fps_mean"):
        if _is_number(throughput.get(key)) and throughput[key] == 0:
            out.append(Finding(f"throughput.{key}", f"throughput.{key} is 0: an unmeasured rate must be null "
                               "(unavailable), not 0", "degenerate"))
    memory = doc.get("memory") if isinstance(doc.get("memory"), dict) else {}
    for key in ("peak_ram_mb", "peak_vram_mb"):
        if memory.get(key) == 0:
            # a CPU-only run has no VRAM: 0 there is misleading rather than wrong
            cpu_only = key == "peak_vram_mb" and sub.runtime.device == "cpu"
            out.append(Finding(f"memory.{key}", f"memory.{key} is 0: an unmeasured value must be null "
                               "(unavailable), not 0", "degenerate", "warning" if cpu_only else "error"))
    for key, value in sub.accuracy.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and not 0 <= value <= 1:
            out.append(Finding(f"accuracy.{key}", f"accuracy.{key} = {value} is outside [0, 1]", "degenerate"))
    for path, value in _walk_numbers(doc):
        if (isinstance(value, float) and not math.isfinite(value)) or abs(value) > 1e15:
            out.append(Finding(path, f"{path} = {value} is not a plausible measurement", "degenerate"))
    out += consistency_findings(sub)
    out += int8_findings(doc, sub, has_accuracy)
    if sub.random_weights:
        out.append(Finding("repro.weights.source", "random weights (a timing-only run): not publishable, its "
                           "accuracy means nothing; rerun with trained weights to publish", "random-weights"))
    return out


def _close(a: float, b: float) -> bool:
    """Equal up to the rounding a file may carry (1 %, or 0.01 absolute for small values)."""
    return abs(a - b) <= max(0.01 * abs(b), 0.01)


def consistency_findings(sub: Submission) -> list[Finding]:
    """Figures the file gives twice, or that bound each other, must agree: the site ranks by `throughput.fps_*`,
    which is 1000 / `timing.total_ms` (per image); every row of the site's corpus agrees with each rule here."""
    out = []
    total = sub.timing.get("total_ms") if isinstance(sub.timing.get("total_ms"), dict) else {}
    for fps_key, ms_key in (("fps_mean", "mean"), ("fps_p50", "p50")):
        fps, ms = sub.throughput.get(fps_key), total.get(ms_key)
        if _finite_number(fps) and _finite_number(ms) and ms > 0 and not _close(fps, 1000.0 / ms):
            out.append(Finding(f"throughput.{fps_key}", f"throughput.{fps_key} {fps:g} is not 1000 / "
                               f"timing.total_ms.{ms_key} ({ms:g} ms per image: {1000.0 / ms:.4g})", "inconsistent"))
    p50, p95, p99 = (total.get(k) for k in ("p50", "p95", "p99"))
    if all(_finite_number(v) for v in (p50, p95, p99)) and not (p50 <= p95 + 1e-6 and p95 <= p99 + 1e-6):
        out.append(Finding("timing.total_ms", f"percentiles out of order: p50 {p50:g}, p95 {p95:g}, p99 {p99:g}",
                           "inconsistent"))
    parts = [total.get(k) for k in ("preprocess_ms", "inference_ms", "postprocess_ms")]
    mean = total.get("mean")
    if all(_finite_number(v) for v in parts) and _finite_number(mean) and sum(parts) > 1.02 * mean + 0.01:
        out.append(Finding("timing.total_ms", f"the stage split adds up to {sum(parts):g} ms, more than the mean of "
                           f"{mean:g} ms per image it splits", "inconsistent"))
    for path, stated, coordinate in (("timing.batch_size", sub.timing.get("batch_size"), sub.config.batch_size),
                                     ("model.input_size", sub.model.input_size, sub.config.input_size)):
        if _is_number(stated) and _is_number(coordinate) and stated != coordinate:
            out.append(Finding(path, f"{path} {stated:g} disagrees with config.{path.split('.')[1]} {coordinate:g}",
                               "inconsistent"))
    for prefix in ("", "bbox_"):  # a segmentation row's box figures too
        m50, m5095 = sub.accuracy.get(f"{prefix}mAP_50"), sub.accuracy.get(f"{prefix}mAP_50_95")
        if _finite_number(m50) and _finite_number(m5095) and m50 < m5095 - 1e-6:
            out.append(Finding(f"accuracy.{prefix}mAP_50", f"{prefix}mAP_50 {m50:g} is below {prefix}mAP_50_95 "
                               f"{m5095:g}, which averages it with stricter IoU thresholds", "inconsistent"))
    return out


TASKS = ("detect", "detection", *SEGMENT_TASKS)  # what model.task may say: the site's boards


def task_findings(doc: dict, sub: Submission) -> list[Finding]:
    """model.task decides the site's board (segment or segmentation: the segmentation board, whose mAP is of masks;
    anything else: detection). A task the site has no board for, or a row whose figures are of masks under another
    task, would be ranked against box mAP: an error."""
    model = doc.get("model") if isinstance(doc.get("model"), dict) else {}
    task = model.get("task")
    if task is not None and task not in TASKS:
        return [Finding("model.task", f"model.task {str(task)[:40]!r} is not a task the site has a board for (one "
                        f"of {', '.join(TASKS)})", "task")]
    if task in SEGMENT_TASKS:
        if not any(key.startswith("bbox_") for key in sub.accuracy) and "mAP_50_95" in sub.accuracy:
            return [Finding("accuracy", "a segmentation row without its box figures (bbox_mAP_50_95, ...): the "
                            "site's segmentation board shows both", "task", "warning")]
        return []
    ev = doc.get("eval") if isinstance(doc.get("eval"), dict) else {}
    config = doc.get("config") if isinstance(doc.get("config"), dict) else {}
    iou_types = ev.get("iouType") if isinstance(ev.get("iouType"), list) else [ev.get("iouType")]
    # config.masks is the mask spec the masks were made with (a dict); --no-masks records why there are none (text)
    evidence = ([f"accuracy.{k}" for k in sub.accuracy if k.startswith("bbox_")][:1]
                + (["eval.iouType segm"] if "segm" in iou_types else [])
                + (["config.masks"] if isinstance(config.get("masks"), dict) else []))
    if evidence:
        return [Finding("model.task", f"model.task is {task or 'missing'} but the row's figures are of masks "
                        f"({', '.join(evidence)}): the site would rank its mask mAP on the detection board; set "
                        "model.task to segment", "task")]
    return []


def int8_findings(doc: dict, sub: Submission, has_accuracy: bool) -> list[Finding]:
    """An int8 row publishes its mAP beside the same model's fp32 mAP on the same images; one that keeps < 99 % of
    it (MLPerf's rule) is failing."""
    if sub.runtime.precision != "int8" or not has_accuracy:
        return []
    ev = doc.get("eval") if isinstance(doc.get("eval"), dict) else {}
    verdict = ev.get("int8_vs_fp32")
    if not isinstance(verdict, dict):
        return [Finding("eval.int8_vs_fp32", "an int8 row without the same model's fp32 mAP on the same images: "
                        "its accuracy loss is unknown", "int8-accuracy", "warning")]
    if verdict.get("status") == "unavailable":  # the run marked it failing: a loss nobody checked is not passed
        return [Finding("eval.int8_vs_fp32", f"the fp32 reference of this int8 row is unavailable "
                        f"({verdict.get('reason')}): its accuracy loss is unknown, a failing int8 row",
                        "int8-accuracy")]
    if verdict.get("passed") is not True:
        return [Finding("eval.int8_vs_fp32", f"int8 keeps {verdict.get('kept')} of the fp32 mAP "
                        f"({verdict.get('int8_mAP_50_95')} vs {verdict.get('mAP_50_95')}): below 0.99, a failing "
                        "int8 row", "int8-accuracy")]
    return []


IDENTITY_BLOCKS = ("model", "hardware", "runtime", "dataset", "config")
# the strings that make a row's coordinates (the rest of those blocks describes them)
IDENTIFIERS = ("submission_id", "model.id", "model.family", "model.variant", "hardware.id", "runtime.format",
               "runtime.provider", "runtime.precision", "runtime.device", "dataset.id", "dataset.split",
               "dataset.variant")


def _control_characters(text: str) -> bool:
    return any(unicodedata.category(ch) in ("Cc", "Cf") for ch in text)


def text_findings(doc: dict) -> list[Finding]:
    """Names that would act on a terminal instead of showing in it (control characters: an escape sequence, a
    forged line, reordered text) in the submission's id and its identity blocks: an error, never a coordinate."""
    fields = [("submission_id", doc.get("submission_id"))]
    for block in IDENTITY_BLOCKS:
        values = doc.get(block) if isinstance(doc.get(block), dict) else {}
        fields += [(f"{block}.{k}", v) for k, v in values.items()]
    return [Finding(path, f"{path} holds control characters ({value[:40]!r}): not a name", "identifier",
                    "error" if path in IDENTIFIERS else "warning")  # a coordinate, or a description of one
            for path, value in fields if isinstance(value, str) and _control_characters(value)]


def rf100vl_findings(doc: dict, sub: Submission) -> list[Finding]:
    """An RF100-VL row's block against itself: each accuracy key the unweighted mean of the datasets' values
    (the site's aggregation), and `valid_submission` true only with every expected dataset scored."""
    block = doc.get("rf100vl")
    if not sub.is_rf100vl or not isinstance(block, dict):
        return []
    datasets = block.get("datasets")
    if not isinstance(datasets, list) or not datasets:
        return [Finding("rf100vl.datasets", "an RF100-VL row without its per-dataset results", "rf100vl")]
    out = []
    for key in ("mAP_50_95", "mAP_50", "mAP_75", "AR100", "AR_max_det"):
        values = [d.get(key) for d in datasets if isinstance(d, dict) and _finite_number(d.get(key))]
        stated = sub.accuracy.get(key)
        if values and _finite_number(stated) and abs(sum(values) / len(values) - stated) > 1e-6:
            out.append(Finding(f"accuracy.{key}", f"accuracy.{key} {stated:.6f} is not the mean of the "
                               f"{len(values)} datasets' {key} ({sum(values) / len(values):.6f})", "rf100vl"))
    valid = block.get("valid_submission")
    if valid is not None and not isinstance(valid, bool):
        out.append(Finding("rf100vl.valid_submission", f"rf100vl.valid_submission must be true or false, got "
                           f"{type(valid).__name__} {str(valid)[:20]!r}", "rf100vl"))
    names = [str(d.get("dataset")) for d in datasets if isinstance(d, dict)]
    if repeated := sorted(name for name, n in Counter(names).items() if n > 1):
        out.append(Finding("rf100vl.datasets", f"listed more than once: {', '.join(repeated[:3])}"
                           f"{' ...' if len(repeated) > 3 else ''} (each dataset counts once in the row's mean)",
                           "rf100vl"))
    counted = (doc.get("dataset") or {}).get("num_datasets") if isinstance(doc.get("dataset"), dict) else None
    if _is_number(counted) and counted != len(datasets):  # the scored ones, as the site's rows count them
        out.append(Finding("dataset.num_datasets", f"dataset.num_datasets {counted} disagrees with the "
                           f"{len(datasets)} datasets listed in rf100vl.datasets", "rf100vl"))
    protocol = block.get("protocol") if isinstance(block.get("protocol"), dict) else {}
    expected = protocol.get("expected_datasets", RF100VL_DATASETS)
    if block.get("valid_submission") is True and len(datasets) != expected:
        out.append(Finding("rf100vl.valid_submission", f"valid_submission is true with {len(datasets)} of "
                           f"{expected} datasets (a partial{len(datasets)} row)", "rf100vl"))
    if block.get("valid_submission") is True and (foreign := not_rf100vl(names)) is not None:
        out.append(Finding("rf100vl.valid_submission", f"valid_submission is true but {foreign}", "rf100vl"))
    if protocol.get("version") == PROTOCOL_VERSION:  # the version fixes the protocol: the row must be measured so
        stated = {"nms_iou": RF100VL_PROTOCOL["iou"], "max_det": RF100VL_PROTOCOL["max_det"],
                  "expected_datasets": RF100VL_DATASETS}
        # an error where the row claims to be valid; a partial row written before expected_datasets was the
        # protocol's own count (the campaign's, then) is flagged, not failed
        severity = "error" if block.get("valid_submission") is True else "warning"
        out += [Finding(f"rf100vl.protocol.{key}", f"rf100vl.protocol.{key} {protocol.get(key)} is not "
                        f"{PROTOCOL_VERSION}'s {want}", "rf100vl", severity) for key, want in stated.items()
                if protocol.get(key) != want]
        config = doc.get("config") if isinstance(doc.get("config"), dict) else {}
        max_dets = (doc.get("eval") or {}).get("maxDets") if isinstance(doc.get("eval"), dict) else None
        if block.get("valid_submission") is True:
            out += [Finding("config", f"valid_submission is true but {problem}", "rf100vl")
                    for problem in protocol_problems(config, max_dets)]
    return out


def _detection_problem(det: Any) -> str | None:
    """Why one COCO-format detection is unusable, or None."""
    if not isinstance(det, dict):
        return "not an object"
    box = det.get("bbox")
    if not (isinstance(box, list) and len(box) == 4 and all(_finite_number(v) for v in box)):
        return f"bbox {str(box)[:60]} is not 4 finite numbers"
    if box[2] < 0 or box[3] < 0:
        return f"bbox {box} has a negative width or height"
    if not _finite_number(det.get("score")):
        return f"score {str(det.get('score'))[:30]} is not a finite number"
    for key in ("image_id", "category_id"):
        if not isinstance(det.get(key), int) or isinstance(det.get(key), bool):
            return f"{key} {str(det.get(key))[:30]} is not an integer"
    return None


def _finite_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def detections_findings(file: Path) -> list[Finding]:
    """Check a COCO-format detections file: every box 4 finite numbers (a NaN box written as null is an
    error), non-negative sizes, finite scores, integer ids."""
    where = "artifacts.detections"
    if not file.is_file():
        return [Finding(where, f"the detections file {file.name} is not in {file.parent}", "detections", "warning")]
    results, problem = read_detections(file)
    if problem is not None:
        severity = "warning" if "not checked" in problem else "error"
        return [Finding(where, problem, "detections", severity)]
    total, bad, first = 0, 0, None
    try:
        for i, d in enumerate(results):  # one result at a time: a full-val file never held as dicts
            total += 1
            if (why := _detection_problem(d)) is not None:
                bad, first = bad + 1, first or (i, why)
    except NotAJsonArray:
        return [Finding(where, f"{file.name} is not a list of COCO detections", "detections")]
    except (ValueError, RecursionError) as exc:
        return [Finding(where, f"{file.name} is not valid JSON: {str(exc)[:120]}", "detections")]
    if first is None:
        return []
    i, why = first
    return [Finding(where, f"{file.name}: {bad} of {total} detections are unusable (first: [{i}] "
                    f"{why}); the model produced NaN/Inf or the file was edited: its accuracy is not "
                    "trustworthy", "detections")]


def validate_file(path: Path, support: dict | None, schema: dict,
                  checked_detections: dict | None = None,
                  pending_models: frozenset[str] = frozenset()) -> FileReport:
    """Every rule on one file. `checked_detections` caches detections checks: a run's batch sizes share
    one detections file. `pending_models`: ids the harness builds that the site's support matrix does not
    list yet; for them the matrix's model check is a warning."""
    report = FileReport(path)
    doc, problem = read_json(path)
    if problem:
        report.findings.append(problem)
        return report
    if not isinstance(doc, dict):  # one line, not a schema dump of the whole document
        what = "a COCO detections file? it is checked through the submission that references it" \
            if isinstance(doc, list) and doc and isinstance(doc[0], dict) and "bbox" in doc[0] else "not a submission"
        report.findings.append(Finding("$", f"a JSON {type(doc).__name__}, not an object ({what})", "site.type"))
        return report
    report.other_kind = other_document(doc)
    if report.other_kind is not None:  # one line, not the schema's dozens about a document of another kind
        report.findings.append(Finding("$", f"not a va.submission.v1 ({report.other_kind})", "site.type"))
        return report
    report.findings += schema_findings(doc, schema)
    report.findings += [_pending(f, doc, pending_models) for f in site_findings(doc, support)]
    report.findings += number_type_findings(doc)
    report.findings += protocol_findings(doc)
    report.raw = doc
    try:
        report.submission = Submission.model_validate(doc)
    except ValidationError as exc:
        typed = {f.path for f in report.findings}  # already said, in the site's terms
        errors = [e for e in exc.errors() if ".".join(map(str, e["loc"])) not in typed]
        for err in errors[:5]:
            where = ".".join(str(p) for p in err["loc"])
            report.findings.append(Finding(where, f"{where}: {err['msg']}", "type"))
        return report
    report.findings += our_findings(doc, report.submission)
    detections = detections_file(path, doc)
    if detections is not None:
        cache = {} if checked_detections is None else checked_detections
        key = file_identity(detections)  # a run's cells share one file, under one name or (hard links) several
        if key not in cache:
            cache[key] = detections_findings(detections)
        report.findings += cache[key]
        recorded = doc.get("eval", {}).get("detections_sha256") if isinstance(doc.get("eval"), dict) else None
        if isinstance(recorded, str) and detections.is_file():
            if (key, "sha256") not in cache:
                try:
                    cache[key, "sha256"] = file_sha256(detections)
                except OSError:  # unreadable: detections_findings says so
                    cache[key, "sha256"] = recorded
            if cache[key, "sha256"] != recorded:  # its mAP was scored on other detections: edited or replaced since
                report.findings.append(Finding(
                    "eval.detections_sha256", f"{detections.name} is not the file this submission scored (SHA-256 "
                    f"{cache[key, 'sha256'][:12]}, recorded {recorded[:12]}): replaced or edited since, so neither "
                    "its mAP nor a comparison of its detections can be checked against it", "detections"))
    # one finding per (path, rule): the schema and the site rules often see the same problem
    unique, seen = [], set()
    for f in report.findings:
        if (f.path, f.message) not in seen:
            seen.add((f.path, f.message))
            unique.append(f)
    report.findings = unique
    return report


def _pending(finding: Finding, doc: dict, pending_models: frozenset[str]) -> Finding:
    model_id = (doc.get("model") or {}).get("id") if isinstance(doc.get("model"), dict) else None
    if finding.rule == "site.support_matrix" and finding.path == "model.id" and model_id in pending_models:
        return Finding("model.id", f"model.id {model_id} is not on the site's support matrix yet (a family "
                       "va-bench builds; the site's validator refuses it until the matrix lists it)",
                       "pending-support-matrix", "warning")
    return finding


def derivable_hardware_id(report: FileReport, finding: Finding) -> bool:
    """A finding of a missing hardware.id that does not exclude the file from aggregate: its GPU/CPU names identify
    the hardware (the refactor plan derives the id)."""
    about_id = finding.path == "hardware.id" or (finding.path == "hardware" and "'id'" in finding.message)
    return about_id and report.submission is not None and report.submission.hardware_id != "unknown"


def site_refused(report: FileReport) -> bool:
    """Whether the site refuses the file (aggregate leaves it out), a missing id it derives aside."""
    return any(is_site_rule(f) and not derivable_hardware_id(report, f) for f in report.errors)


def validate_paths(paths: list[str | Path], support: dict | None, progress=None,
                   pending_models: frozenset[str] = frozenset()) -> Validation:
    """Validate every file, then the cross-file rule (unique submission_id)."""
    schema = json.loads(EXTENDED_SCHEMA.read_text(encoding="utf-8"))
    files, notes = collect_files(paths)
    if support is None and files:  # the site's own check has them: a row it refuses would pass here in silence
        notes.append("the site's allow-lists of models and runtimes were not checked (a pytorch bf16 row, which the "
                     "site refuses, passes without them): pass --support-matrix FILE, the site's support-matrix.json")
    reports = []
    checked: dict[Path, list[Finding]] = {}
    if progress is None:
        reports = [validate_file(f, support, schema, checked, pending_models) for f in files]
    else:
        with progress.task("validate", len(files)) as advance:
            for f in files:
                reports.append(validate_file(f, support, schema, checked, pending_models))
                advance()
    # a site's schema, support matrix or generated tables found beside its submissions are skipped with a note; a file
    # named on the command line is the user's to hear about (its one finding)
    named = {Path(p) for p in paths}
    others = [r for r in reports if r.other_kind is not None and r.path not in named]
    if others:
        reports = [r for r in reports if r.other_kind is None or r.path in named]
        listed = ", ".join(f"{r.path} ({r.other_kind})" for r in others[:5]) + (", ..." if len(others) > 5 else "")
        notes.append(f"skipped {len(others)} JSON document(s) of other kinds: {listed}")
    # a submission_id names one submission: where files the site would take share one, each is an error naming the
    # others (which one is meant is for the user to say, not for the files' order); a file the site refuses already
    # claims no id (its broken copy would otherwise take the id from the one good file)
    holders: dict[str, list[FileReport]] = {}
    for r in reports:
        sid = r.raw.get("submission_id") if r.raw else None
        if isinstance(sid, str) and not site_refused(r):
            holders.setdefault(sid, []).append(r)
    for sid, group in holders.items():
        if len(group) < 2:
            continue
        if len({json.dumps(r.raw, sort_keys=True) for r in group}) == 1:  # copies of one submission: one row
            for r in group[1:]:
                r.findings.append(Finding("submission_id", f"{r.path.name} is a copy of {group[0].path.name} "
                                          f"(submission {sid}): one submission", "duplicate-copy", "warning"))
            continue
        for r in group:
            others = [o.path.name for o in group if o is not r]
            listed = ", ".join(others[:3]) + (f" and {len(others) - 3} more" if len(others) > 3 else "")
            r.findings.append(Finding("submission_id", f"duplicate submission_id {sid} (also in {listed}): give "
                                      "each submission its own id", "site.unique_id"))
    return Validation(reports, notes)


def load_support_matrix(path: str | Path | None) -> dict | None:
    """The site's support-matrix.json (its allow-lists of models and runtimes), checked for its shape; None without
    a path (the allow-lists are then not checked). One UsageError line for a file that is not one."""
    if path is None:
        return None
    path = Path(path)
    if not path.is_file():
        why = "is a folder" if path.is_dir() else "no such file" if not path.exists() else "not a regular file"
        raise UsageError(path_problem("--support-matrix", path, why) + "; give the site's support-matrix.json")
    doc, problem = read_json(path)
    if problem:
        raise UsageError(f"--support-matrix {path}: {problem.message}")
    shape = _support_matrix_problem(doc)
    if shape:  # an empty or half matrix would put every file off the board, and the command would still pass
        raise UsageError(f"--support-matrix {path}: not a support matrix ({shape}); give the site's "
                         "support-matrix.json")
    return doc


def _support_matrix_problem(doc: Any) -> str | None:
    """What keeps `doc` from being the site's support matrix: models (ids), runtimes ({backend, ...})."""
    if not isinstance(doc, dict):
        return "want an object with models and runtimes"
    models = doc.get("models")
    if not isinstance(models, list) or not models or not all(isinstance(m, str) for m in models):
        return "`models` is not a list of model ids"
    runtimes = doc.get("runtimes")
    if not isinstance(runtimes, list) or not runtimes or not all(
            isinstance(r, dict) and isinstance(r.get("backend"), str) for r in runtimes):
        return "`runtimes` is not a list of {backend, providers, precisions}"
    identifiers = doc.get("supported_libreyolo_identifier", [])
    if not isinstance(identifiers, list) or not all(isinstance(i, str) for i in identifiers):
        return "`supported_libreyolo_identifier` is not a list of names"
    return None


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
