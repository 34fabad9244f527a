"""`va-bench aggregate`: many submissions -> one leaderboard.

* Performance identity: model | weights | hardware | format | provider | precision | TF32 | input size |
  batch size | protocol | dataset variant | timing mode. Within one identity the latest timestamp wins; nothing
  else collapses. Weights are `repro.weights.sha256`, else its source, else "unrecorded" (the site's
  older files): other weights never supersede a run. Timing mode is `timing.mode` ("latency", the
  site's own view and the default for files without it, or "overlapped"): an overlapped run's latency
  includes queueing and its throughput overlaps batches, so the two never replace each other. The
  leaderboard shows a coordinate's latency-mode row where there is one. The protocol is the post-processing
  thresholds `config.conf` / `iou` / `max_det`: they change both the NMS work and the mAP (a conf 0.25 run
  scores lower than one at the site's 0.001), so runs at other thresholds never replace each other. A top-k
  (DETR-style) model run at what libreyolo's validator applies to it (conf 0 or its family's 0.001, its query count)
  ran the site's
  protocol, which the site's rows state as conf 0.001, max_det 300: it is keyed so (`Submission.protocol`).
  An evaluation cap other than COCO's 100 detections per image (`eval.maxDets`, `--eval-max-det`) is part of
  the protocol too: AP read at 500 is not COCO's AP.
* Accuracy identity: model | weights | dataset variant | precision | input size | protocol, where fp32 run
  with TF32 on (see `Submission.tf32`) is its own lineage "fp32+tf32": it never becomes the canonical fp32
  number, int8 is each format's own lineage ("int8 (openvino)": its quantiser and calibration), and a run at
  other thresholds never becomes the canonical number of standard-protocol rows. The
  canonical number comes from the reference hardware (default a100), else the first hardware of the
  fallback order; within a hardware PyTorch first, then the newest run. The source is recorded.
* Agreement gate: every other run of an accuracy identity is compared with the canonical value;
  |delta mAP| above the tolerance (in mAP points, 0.3 = 0.003) is a finding.
* Cube rows: displayed accuracy prefers the canonical full-val number; subset accuracy is shown only
  with a `subset` badge, never as full-val.
* Leaderboard (batch 1, default input size: the published one where the catalogue states it, every dataset
  variant's timing; the standard-protocol run of a coordinate over one at other thresholds): displayed accuracy is
  pinned to the canonical number of `leaderboard_variant` (default "full"); a model without one shows
  none rather than a subset number. Another variant (e.g. "mini500") shows its canonical numbers with
  the `subset` badge.
* Size order: within one family, hardware, format, provider, precision, input size, batch size, timing mode
  and dataset variant, a variant later in its family's size order (`size_ranks`: the CLI passes the
  catalogue's, harness.catalogue.py) measured
  more than SIZE_ORDER_MARGIN faster (latency p50) than a smaller one is a finding naming both rows: the
  tell of a busy or throttled device (the site removed such rows).
* RF100-VL rows (an `rf100vl` block or dataset id rf100_vl: 100 fine-tuned datasets, one row) are the site's
  own section: they stay in the cube, as the site lists them, but never in the COCO leaderboard, its
  canonical accuracy or the size-order check; `rf100vl` lists them with their variant (full100 / partial{n}).
* Boards: a file whose model.task is "segment" (the site's rule) is on the segmentation board, its accuracy the
  mask mAP: `segmentation_leaderboard`, apart from the detection `leaderboard`; the same model id on both is two
  rows, never one (the board is part of the row's coordinate and of its accuracy identity).
* Files the site would reject, random-weights and synthetic-input runs (timing only) and COCO rows scored through a
  class map are left out.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime

from harness.catalogue import native_input_sizes
from harness.errors import UsageError
from harness.hardware import catalogue
from harness.records import COCO_MAX_DETS
from harness.results.model import FORMAT_RUNTIME
from harness.results.reader import latest_wins
from harness.results.validate import FileReport, derivable_hardware_id, is_site_rule

BACKEND_PREFERENCE = ("pytorch", "onnx", "torchscript", "openvino", "tensorrt")
KNOWN_VARIANTS = ("full", "mini500")
BOARDS = ("detection", "segmentation")  # the site's COCO boards (model.task segment: mask mAP)
# Our rules that keep a file out of the leaderboard altogether (the site's own rules always do): timing only,
# figures that contradict each other (which one is right is not known), or COCO scored through a class map
UNPUBLISHABLE = {"random-weights", "synthetic-input", "inconsistent", "class-map", "task", "rf100vl"}
SIZE_ORDER_MARGIN = 0.10  # a larger variant this much faster than a smaller one is a finding
# Our rules that keep a file's accuracy out of the canonical numbers (its timing still counts).
DISTRUST_ACCURACY = {"commit_guard", "degenerate", "detections"}


@dataclass
class PerfRow:
    """One performance coordinate (after dedup) with its own and its displayed accuracy."""

    model: str
    hardware: str
    format: str
    provider: str
    precision: str
    input_size: int | None
    batch_size: int | None
    dataset_variant: str
    timing_mode: str
    weights: str  # sha256:..., source:..., or unrecorded
    tf32: str  # on | off | unrecorded
    conf: float | None  # post-processing thresholds (config block); None: not recorded
    iou: float | None
    max_det: int | None
    eval_cap: int | None  # COCOeval's largest maxDets; None: not recorded (the site's COCO rows: COCO's 100)
    standard_protocol: bool  # no nonstandard-protocol finding (the site's, or the family's documented one)
    num_images: int | None
    created_at: str
    file: str
    submission_id: str | None
    latency_ms_p50: float | None
    latency_ms_mean: float | None
    fps_mean: float | None
    peak_vram_mb: float | None
    peak_ram_mb: float | None
    mAP_50_95: float | None  # this run's own accuracy
    mAP_50: float | None
    accuracy_shown: float | None = None
    accuracy_source: str | None = None
    subset: bool = False
    superseded: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)  # our validator's findings on this file
    accuracy_trusted: bool = True  # False: unpinned full-val commit or implausible accuracy
    section: str = "coco"  # "rf100vl": the site's RF100-VL section; "other": another dataset; both off the COCO boards
    dataset: str = "coco2017"  # dataset id and split
    board: str = "detection"  # the site's COCO board: "detection", or "segmentation" (model.task segment; mask mAP)
    backend: str = "?"  # the runtime that ran it (Submission.backend): rows of two runtimes never replace each other
    # "default" (what --preprocess auto takes for the family on its device, or not recorded), else the implementation
    # (Submission.preprocess_choice): a pil row never replaces the family's own cv2 one (their mAP differs); both stay
    # in the cube, the default one is shown and canonical, and the agreement gate compares their accuracy
    preprocess: str = "default"
    # on a board: no other row of its runtime on its hardware (format, provider, precision, tf32) is at least as fast
    # and as accurate, and better in one; None: not on a board, or no latency or accuracy to place it by
    speed_accuracy_front: bool | None = None

    @property
    def coordinate(self) -> tuple:
        """What was measured, whatever the timing mode and dataset variant (a model's segmentation and detection
        rows are two coordinates: their accuracy is of masks and of boxes)."""
        return (self.model, self.weights, self.hardware, self.backend, self.format, self.provider, self.precision,
                self.tf32, self.input_size, self.batch_size, self.board)

    @property
    def protocol(self) -> str:
        """The post-processing thresholds and an evaluation cap other than COCO's 100 as one comparable value ("?"
        where not recorded)."""
        cap = "" if self.eval_cap in (None, COCO_MAX_DETS) else f" eval_cap={self.eval_cap}"
        return " ".join(f"{name}={'?' if v is None else f'{v:g}'}"
                        for name, v in (("conf", self.conf), ("iou", self.iou), ("max_det", self.max_det))) + cap

    @property
    def perf_key(self) -> tuple:
        return (*self.coordinate, self.protocol, self.dataset, self.dataset_variant, self.timing_mode, self.preprocess)

    @property
    def accuracy_precision(self) -> str:
        """The accuracy lineage: fp32 with TF32 on is not IEEE fp32; int8 is each runtime's own quantisation (its
        quantiser, its calibration), never another runtime's number."""
        if self.precision == "int8":
            return f"int8 ({self.format})"
        return f"{self.precision}+tf32" if self.precision == "fp32" and self.tf32 == "on" else self.precision

    @property
    def accuracy_key(self) -> tuple:
        """Accuracy depends on the input size (a 320 px run never stands for a 640 px row; 0: unknown) and on
        the thresholds (a conf 0.25 run never stands for rows at the site's conf 0.001)."""
        return (self.model, self.weights, self.dataset, self.dataset_variant, self.accuracy_precision,
                self.input_size or 0, self.protocol, self.board)


def _num(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _positive(value) -> float | None:
    """A memory figure of 0 is an unmeasured value, shown as None (the file is flagged)."""
    number = _num(value)
    return number if number else None


def row_from(report: FileReport) -> PerfRow:
    """The performance row of one validated file (its accuracy trusted or not by our own findings)."""
    sub, file = report.submission, str(report.path)  # as given: two folders' files may share a name
    total = sub.timing.get("total_ms") if isinstance(sub.timing.get("total_ms"), dict) else {}
    memory = sub.memory or {}
    ours = [f for f in report.findings if not is_site_rule(f)]
    conf, _, max_det = sub.protocol  # a top-k model's as the site's rows state it (Submission.protocol)
    section = "rf100vl" if sub.is_rf100vl else "coco" if sub.dataset_id == "coco2017" else "other"
    dataset = f"{sub.dataset_id}/{(sub.dataset.split if sub.dataset else None) or 'val2017'}"
    if section == "other" and sub.annotations_sha256:  # a user's dataset is named by its folder: two of one name
        dataset += f"@{sub.annotations_sha256[:12]}"  # are two datasets when their ground truth differs
    return PerfRow(
        model=sub.model.id or "unknown", hardware=sub.hardware_id, format=sub.runtime.format or "unknown",
        provider=sub.runtime.provider or "unknown", precision=sub.runtime.precision or "unknown",
        input_size=sub.input_size, batch_size=sub.batch_size, dataset_variant=sub.dataset_variant or "unknown",
        timing_mode=sub.timing.get("mode") if isinstance(sub.timing.get("mode"), str) else "latency",
        weights=sub.weights_identity, tf32=sub.tf32, num_images=sub.num_images,
        conf=_num(conf), iou=_num(sub.config.iou), max_det=max_det, eval_cap=sub.eval_cap,
        standard_protocol=not any(f.rule == "nonstandard-protocol" for f in report.findings),
        created_at=sub.timestamp.isoformat() if sub.timestamp else "",
        file=file, submission_id=sub.submission_id, latency_ms_p50=_num(total.get("p50")),
        latency_ms_mean=_num(total.get("mean")), fps_mean=_num(sub.throughput.get("fps_mean")),
        peak_vram_mb=_positive(memory.get("peak_vram_mb")), peak_ram_mb=_positive(memory.get("peak_ram_mb")),
        mAP_50_95=_num(sub.accuracy.get("mAP_50_95")), mAP_50=_num(sub.accuracy.get("mAP_50")),
        flags=[f"{f.severity}: {f.message}" for f in ours] + [
            f"derived: hardware.id {sub.hardware_id} from its GPU/CPU names (the site refuses the file's own: "
            f"{f.message})" for f in report.errors if is_site_rule(f) and derivable_hardware_id(report, f)][:1],
        accuracy_trusted=not any(f.severity == "error" and f.rule in DISTRUST_ACCURACY and
                                 (f.rule != "degenerate" or f.path.startswith("accuracy")) for f in ours),
        section=section,
        dataset=dataset,
        board=sub.board,
        backend=sub.backend,
        preprocess=sub.preprocess_choice,
    )


def _created(row: PerfRow) -> datetime | None:
    return datetime.fromisoformat(row.created_at) if row.created_at else None


def dedup(rows: list[PerfRow]) -> list[PerfRow]:
    """Latest timestamp wins within a leaderboard row's identity (the reader's rule); the losers are listed on the
    winner, newest first."""
    winners, losers = latest_wins(rows, key=lambda r: r.perf_key, when=_created, name=lambda r: r.file)
    beaten: dict[int, list[str]] = {}  # by the winner's identity: one pass over the losers
    for old, new in reversed(losers):
        beaten.setdefault(id(new), []).append(old.file)
    for row in winners:
        row.superseded = beaten.get(id(row), [])
    return sorted(winners, key=lambda r: str(r.perf_key))


def hardware_order(reference: str, fallback: list[str] | None) -> list[str]:
    """The hardware ids whose full-val runs give a model's canonical accuracy, in the order tried: the reference,
    then the fallback order given (else the hardware catalogue's)."""
    order = [reference] + list(fallback or [e["id"] for e in catalogue()])
    return list(dict.fromkeys(order))


def pick_canonical(rows: list[PerfRow], order: list[str]) -> PerfRow:
    """The reference hardware first, then the fallback order, then any; the family's own preprocessing first (a
    `--preprocess pil` run is not its number); PyTorch first; newest."""
    def preference(r: PerfRow) -> tuple:
        hw = order.index(r.hardware) if r.hardware in order else len(order)
        be = BACKEND_PREFERENCE.index(r.format) if r.format in BACKEND_PREFERENCE else len(BACKEND_PREFERENCE)
        return hw, r.preprocess != "default", be, r.batch_size != 1

    best = min(preference(r) for r in rows)
    return max((r for r in rows if preference(r) == best), key=lambda r: (r.created_at, r.file))


def aggregate(reports: list[FileReport], reference_hardware: str = "a100", tolerance_points: float = 0.3,
              fallback_hardware: list[str] | None = None, leaderboard_variant: str = "full",
              size_ranks: dict[str, tuple[str, int]] | None = None) -> dict:
    """Build the leaderboard document from validated files (files the site would reject, random-weights runs and
    files whose figures contradict each other are left out)."""
    rows, excluded = [], []
    for report in reports:
        blocking = [f for f in report.errors if (is_site_rule(f) and not derivable_hardware_id(report, f))
                    or f.rule in UNPUBLISHABLE]
        if report.submission is None or blocking:  # not a submission at all (unreadable), or one the site rejects
            excluded.append({"file": str(report.path), "submission": report.submission is not None,
                             "by_site_rules": any(is_site_rule(f) for f in blocking),
                             "rules": sorted({f.rule for f in blocking}),
                             "errors": [f.message for f in blocking or report.errors][:5]})
            continue
        rows.append(row_from(report))
    cube = dedup(rows)
    variants = {r.dataset_variant for r in cube if r.section == "coco"}  # the COCO boards' variants
    if leaderboard_variant not in (*KNOWN_VARIANTS, *variants):
        raise UsageError(f"--leaderboard-variant {leaderboard_variant!r} is not a dataset variant of these files; "
                         f"use one of {', '.join(sorted({*KNOWN_VARIANTS, *variants}))}")
    known = {e["id"] for e in catalogue()} | {r.hardware for r in cube}
    unknown = [h for h in [reference_hardware, *(fallback_hardware or [])] if h not in known]
    if unknown:  # a misspelt id would silently pick the canonical accuracy from other hardware
        raise UsageError(f"hardware {unknown[0]!r} (--reference-hardware / --fallback-hardware) is neither in the "
                         f"hardware catalogue nor in these files; use one of {', '.join(sorted(known))}")
    order = hardware_order(reference_hardware, fallback_hardware)

    by_accuracy: dict[tuple, list[PerfRow]] = {}
    coco_cube = [r for r in cube if r.section == "coco"]
    for row in coco_cube:
        if row.mAP_50_95 is not None and row.accuracy_trusted:
            by_accuracy.setdefault(row.accuracy_key, []).append(row)
    canonical, gate = {}, []
    for key, group in sorted(by_accuracy.items()):
        best = pick_canonical(group, order)
        policy = "reference" if best.hardware == reference_hardware else f"fallback ({best.hardware})"
        identity = {"model": key[0], "weights": key[1], "dataset": key[2], "dataset_variant": key[3],
                    "precision": key[4], "input_size": key[5] or None, "conf": best.conf, "iou": best.iou,
                    "max_det": best.max_det, "eval_cap": best.eval_cap, "board": best.board}
        canonical[key] = {**identity, "mAP_50_95": best.mAP_50_95, "mAP_50": best.mAP_50, "hardware": best.hardware,
                          "format": best.format, "tf32": best.tf32, "preprocess": best.preprocess, "file": best.file,
                          "policy": policy}
        for other in group:
            if other is best:
                continue
            delta = 100 * (other.mAP_50_95 - best.mAP_50_95)
            if abs(delta) > tolerance_points:
                gate.append({**identity, "canonical": best.mAP_50_95, "canonical_file": best.file,
                             "canonical_hardware": best.hardware, "canonical_preprocess": best.preprocess,
                             "other": other.mAP_50_95, "other_file": other.file, "other_hardware": other.hardware,
                             "other_format": other.format, "other_preprocess": other.preprocess,
                             "other_batch_size": other.batch_size, "delta_points": delta})

    def canonical_of(row: PerfRow, variant: str) -> dict | None:
        return canonical.get((row.model, row.weights, row.dataset, variant, row.accuracy_precision,
                              row.input_size or 0, row.protocol, row.board))

    def show(row: PerfRow, entry: dict | None, variant: str) -> None:
        if entry is None:
            row.accuracy_shown, row.subset = None, False
            row.accuracy_source = f"no canonical {variant} accuracy for this model/weights/precision/size/protocol"
            return
        label = "full-val" if variant == "full" else variant
        row.accuracy_shown, row.subset = entry["mAP_50_95"], variant != "full"
        row.accuracy_source = f"canonical {label} ({entry['hardware']}, {entry['format']}): {entry['file']}"

    for row in cube:  # the cube: full-val when there is one, else the row's own variant, badged
        full = canonical_of(row, "full")
        show(row, full or canonical_of(row, row.dataset_variant), "full" if full else row.dataset_variant)

    size_order = size_order_findings(coco_cube, size_ranks or {})
    boards = {}
    for board in BOARDS:
        rows_shown = [replace(r) for r in _leaderboard_rows([r for r in coco_cube if r.board == board],
                                                            leaderboard_variant)]
        for row in rows_shown:  # pinned: the leaderboard variant's canonical number or nothing
            show(row, canonical_of(row, leaderboard_variant), leaderboard_variant)
        rows_shown.sort(key=lambda r: (r.hardware, r.format, r.provider, r.backend, -(r.accuracy_shown or -1),
                                       r.model))
        mark_speed_accuracy_fronts(rows_shown)
        boards[board] = rows_shown
    leaderboard = boards["detection"]
    return {
        "schema_version": "va-bench.leaderboard.v1",
        "policy": {"reference_hardware": reference_hardware, "fallback_order": order,
                   "tolerance_points": tolerance_points, "leaderboard_variant": leaderboard_variant,
                   "performance_identity": ["model", "weights", "hardware", "backend", "format", "provider",
                                            "precision", "tf32", "input_size", "batch_size", "board",
                                            "protocol (conf, iou, max_det, eval cap)", "dataset_variant",
                                            "timing_mode", "preprocess"],
                   "accuracy_identity": ["model", "weights", "dataset_variant",
                                         "precision (fp32+tf32: TF32 on; int8: per format)", "input_size",
                                         "protocol (conf, iou, max_det, eval cap)",
                                         "board (mask or box mAP)"]},
        "counts": {"files": len(reports), "included": len(rows), "excluded": len(excluded),
                   "not_submissions": sum(not e["submission"] for e in excluded),
                   "by_site_rules": sum(e["submission"] and e["by_site_rules"] for e in excluded),
                   "unpublishable": sum(e["submission"] and not e["by_site_rules"] for e in excluded),
                   "rows": len(cube),
                   "superseded": sum(len(r.superseded) for r in cube), "gate_findings": len(gate),
                   "size_order_findings": len(size_order), "rf100vl_rows": sum(r.section == "rf100vl" for r in cube),
                   "other_dataset_rows": sum(r.section == "other" for r in cube),
                   "segmentation_rows": sum(r.board == "segmentation" for r in coco_cube)},
        "speed_accuracy_fronts": {board: fronts(rows) for board, rows in boards.items()},
        "leaderboard": [asdict(r) for r in leaderboard],
        "segmentation_leaderboard": [asdict(r) for r in boards["segmentation"]],
        "canonical_accuracy": list(canonical.values()),
        "agreement_gate": gate,
        "size_order": size_order,
        "rf100vl": rf100vl_rows(reports, {r.file for r in cube if r.section == "rf100vl"}),
        "cube": [asdict(r) for r in cube],
        "excluded": excluded,
    }


def _leaderboard_rows(cube: list[PerfRow], variant: str) -> list[PerfRow]:
    """Batch 1 at the model's default input size, one row per coordinate: the standard-protocol run over one
    at other thresholds, then the family's own preprocessing over another, then the latency-mode run over an
    overlapped one, then a run on `variant`, then the most images, then the newest."""
    def rank(r: PerfRow) -> tuple:
        return (r.standard_protocol, r.preprocess == "default", r.timing_mode == "latency",
                r.dataset_variant == variant, r.num_images or 0, r.created_at, r.file)

    default_size = _default_input_sizes(cube)
    best: dict[tuple, PerfRow] = {}
    for r in cube:
        if r.batch_size == 1 and r.input_size == default_size.get(r.model):
            current = best.get(r.coordinate)
            if current is None or rank(r) > rank(current):
                best[r.coordinate] = r
    return list(best.values())


def runtime_on_hardware(row: PerfRow) -> tuple:
    """What a speed-accuracy front is drawn within: one runtime at one precision on one device."""
    return row.hardware, row.format, row.provider, row.precision, row.tf32, row.backend



def runtime_label(row: dict) -> str:
    """A row's runtime as the tables and plots name it: format/provider, and the runtime that ran it where that is not
    the format's own (ONNX Runtime's TensorRT provider: "tensorrt/cuda (onnxruntime)", beside a native engine's
    "tensorrt/cuda")."""
    label = f"{row['format']}/{row['provider']}"
    backend = row.get("backend")
    own = FORMAT_RUNTIME.get(row["format"], row["format"])
    return label if backend in (None, "?", row["format"], own) else f"{label} ({backend})"


def mark_speed_accuracy_fronts(rows: list[PerfRow]) -> None:
    """Set `speed_accuracy_front` on a board's rows: within each runtime on each hardware, a row is on the front when
    no other row is at least as fast (latency p50) and as accurate (the accuracy shown), and better in one; rows
    without either figure are off the comparison (None). One sweep by latency: a row is on the front when it is
    more accurate than every faster row (or the very point of the last one that was)."""
    groups: dict[tuple, list[PerfRow]] = {}
    for row in rows:
        row.speed_accuracy_front = None
        if row.latency_ms_p50 is not None and row.accuracy_shown is not None:
            groups.setdefault(runtime_on_hardware(row), []).append(row)
    for group in groups.values():
        best: tuple[float, float] | None = None  # (accuracy, latency) of the most accurate row so far
        for row in sorted(group, key=lambda r: (r.latency_ms_p50, -r.accuracy_shown)):
            point = (row.accuracy_shown, row.latency_ms_p50)
            row.speed_accuracy_front = best is None or point[0] > best[0] or point == best
            if row.speed_accuracy_front:
                best = point


def fronts(rows: list[PerfRow]) -> list[dict]:
    """Each runtime on each hardware with a front: its rows on the front, fastest first (latency p50 ms per image,
    the accuracy shown), and how many rows were compared."""
    groups: dict[tuple, list[PerfRow]] = {}
    for row in rows:
        if row.speed_accuracy_front is not None:
            groups.setdefault(runtime_on_hardware(row), []).append(row)
    return [{"hardware": key[0], "format": key[1], "provider": key[2], "precision": key[3], "tf32": key[4],
             "backend": key[5], "rows_compared": len(group),
             "front": [{"model": r.model, "weights": r.weights, "latency_ms_p50": r.latency_ms_p50,
                        "accuracy_shown": r.accuracy_shown, "file": r.file}
                       for r in sorted(group, key=lambda r: r.latency_ms_p50) if r.speed_accuracy_front]}
            for key, group in sorted(groups.items(), key=lambda kv: str(kv[0]))]


def _default_input_sizes(rows: list[PerfRow]) -> dict[str, int | None]:
    """Per model, the input size the catalogue says it is published at, where it has batch-1 rows at that size;
    else (torchvision's, a plugin's, a model measured only at other sizes) the most common size among its batch-1
    rows, ties to the smaller."""
    counts: dict[str, Counter] = {}
    for r in rows:
        if r.batch_size == 1:
            counts.setdefault(r.model, Counter())[r.input_size] += 1
    native = native_input_sizes()
    return {m: native[m] if c[native.get(m)] else min(c.items(), key=lambda kv: (-kv[1], kv[0] or 0))[0]
            for m, c in counts.items()}


def size_order_findings(rows: list[PerfRow], ranks: dict[str, tuple[str, int]],
                        margin: float = SIZE_ORDER_MARGIN) -> list[dict]:
    """Pairs of one family's variants at the same coordinate where the larger one's latency p50 is more than
    `margin` below the smaller one's: {coordinate, smaller, larger (model, file, p50), faster_pct}."""
    groups: dict[tuple, list[PerfRow]] = {}
    for r in rows:
        if r.model in ranks and r.latency_ms_p50:
            key = (ranks[r.model][0], r.hardware, r.format, r.provider, r.precision, r.tf32, r.input_size,
                   r.batch_size, r.timing_mode, r.dataset, r.dataset_variant, r.protocol, r.backend)
            groups.setdefault(key, []).append(r)
    findings = []
    for key, group in sorted(groups.items(), key=lambda kv: str(kv[0])):
        group.sort(key=lambda r: ranks[r.model][1])
        for i, small in enumerate(group):
            for large in group[i + 1:]:
                if ranks[large.model][1] == ranks[small.model][1]:
                    continue
                faster = 1 - large.latency_ms_p50 / small.latency_ms_p50
                if faster > margin:
                    findings.append({
                        "family": key[0], "hardware": key[1], "format": key[2], "provider": key[3],
                        "precision": key[4], "input_size": key[6], "batch_size": key[7], "backend": key[12],
                        "smaller": {"model": small.model, "latency_ms_p50": small.latency_ms_p50, "file": small.file},
                        "larger": {"model": large.model, "latency_ms_p50": large.latency_ms_p50, "file": large.file},
                        "faster_pct": 100 * faster})
    return findings


def rf100vl_rows(reports: list[FileReport], files: set[str]) -> list[dict]:
    """The RF100-VL section: one row per campaign, as the site shows it (no latency)."""
    out = []
    for report in reports:
        sub = report.submission
        if sub is None or str(report.path) not in files:
            continue
        block = getattr(sub, "rf100vl", None) or {}
        out.append({"model": sub.model.id, "hardware": sub.hardware_id, "format": sub.runtime.format,
                    "precision": sub.runtime.precision, "variant": sub.rf100vl_variant,
                    "datasets": len(block.get("datasets") or []), "valid_submission": block.get("valid_submission"),
                    "mAP_50_95": _num(sub.accuracy.get("mAP_50_95")), "mAP_50": _num(sub.accuracy.get("mAP_50")),
                    "file": str(report.path)})
    return sorted(out, key=lambda r: (-(r["mAP_50_95"] or -1), r["model"]))
