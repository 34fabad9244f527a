"""`va-bench aggregate`: many submissions -> one leaderboard (seed 000, steps 1-2).

* Performance identity: model | hardware | format | provider | precision | input size | batch size |
  dataset variant | timing mode. Within one identity the latest timestamp wins; nothing else collapses.
  Timing mode is `timing.mode` ("latency", the site's own view and the default for files without it,
  or "overlapped"): an overlapped run's latency includes queueing and its throughput overlaps batches,
  so the two never replace each other. The leaderboard shows a coordinate's latency-mode row where
  there is one.
* Accuracy identity: model | dataset variant | precision. The canonical number comes from the
  reference hardware (default a100), else the first hardware of the fallback order; within a
  hardware PyTorch first, then the newest run. The source is recorded.
* Agreement gate: every other run of an accuracy identity is compared with the canonical value;
  |delta mAP| above the tolerance (in mAP points, 0.3 = 0.003) is a finding.
* Displayed accuracy prefers the canonical full-val number; subset accuracy is shown only with a
  `subset` badge, never as full-val.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field

from harness.hardware import catalogue
from harness.results.validate import FileReport, is_site_rule

BACKEND_PREFERENCE = ("pytorch", "onnx", "torchscript", "openvino", "tensorrt")


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
    num_images: int | None
    created_at: str
    file: str
    submission_id: str | None
    latency_ms_p50: float | None
    latency_ms_mean: float | None
    fps_mean: float | None
    peak_vram_mb: float | None
    peak_ram_mb: float | None
    map_50_95: float | None  # this run's own accuracy
    map_50: float | None
    accuracy_shown: float | None = None
    accuracy_source: str | None = None
    subset: bool = False
    superseded: list[str] = field(default_factory=list)
    flags: list[str] = field(default_factory=list)  # our validator's findings on this file
    accuracy_trusted: bool = True  # False: unpinned full-val commit or implausible accuracy

    @property
    def coordinate(self) -> tuple:
        """What was measured, whatever the timing mode."""
        return (self.model, self.hardware, self.format, self.provider, self.precision, self.input_size,
                self.batch_size, self.dataset_variant)

    @property
    def perf_key(self) -> tuple:
        return (*self.coordinate, self.timing_mode)

    @property
    def accuracy_key(self) -> tuple:
        return (self.model, self.dataset_variant, self.precision)


def _num(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _positive(value) -> float | None:
    """A memory figure of 0 is an unmeasured value, shown as None (the file is flagged)."""
    number = _num(value)
    return number if number else None


def row_from(report: FileReport) -> PerfRow:
    sub, file = report.submission, report.path.name
    total = sub.timing.get("total_ms") if isinstance(sub.timing.get("total_ms"), dict) else {}
    memory = sub.memory or {}
    ours = [f for f in report.findings if not is_site_rule(f)]
    distrust = {"commit_guard", "degenerate"}
    return PerfRow(
        model=sub.model.id or "unknown", hardware=sub.hardware_id, format=sub.runtime.format or "unknown",
        provider=sub.runtime.provider or "unknown", precision=sub.runtime.precision or "unknown",
        input_size=sub.input_size, batch_size=sub.batch_size, dataset_variant=sub.dataset_variant or "unknown",
        timing_mode=sub.timing.get("mode") if isinstance(sub.timing.get("mode"), str) else "latency",
        num_images=sub.num_images, created_at=sub.timestamp.isoformat() if sub.timestamp else "",
        file=file, submission_id=sub.submission_id, latency_ms_p50=_num(total.get("p50")),
        latency_ms_mean=_num(total.get("mean")), fps_mean=_num(sub.throughput.get("fps_mean")),
        peak_vram_mb=_positive(memory.get("peak_vram_mb")), peak_ram_mb=_positive(memory.get("peak_ram_mb")),
        map_50_95=_num(sub.accuracy.get("mAP_50_95")), map_50=_num(sub.accuracy.get("mAP_50")),
        flags=[f"{f.severity}: {f.message}" for f in ours],
        accuracy_trusted=not any(f.severity == "error" and f.rule in distrust and
                                 (f.rule == "commit_guard" or f.path.startswith("accuracy")) for f in ours),
    )


def _derivable_hardware_id(report: FileReport, finding) -> bool:
    """A missing hardware.id does not exclude a file whose GPU/CPU names identify the hardware."""
    about_id = finding.path == "hardware.id" or (finding.path == "hardware" and "'id'" in finding.message)
    return about_id and report.submission is not None and report.submission.hardware_id != "unknown"


def dedup(rows: list[PerfRow]) -> list[PerfRow]:
    """Latest timestamp wins within a performance identity; the losers are listed on the winner."""
    groups: dict[tuple, list[PerfRow]] = {}
    for row in rows:
        groups.setdefault(row.perf_key, []).append(row)
    out = []
    for group in groups.values():
        group.sort(key=lambda r: (r.created_at, r.file), reverse=True)
        winner = group[0]
        winner.superseded = [r.file for r in group[1:]]
        out.append(winner)
    return sorted(out, key=lambda r: str(r.perf_key))


def hardware_order(reference: str, fallback: list[str] | None) -> list[str]:
    order = [reference] + list(fallback or [e["id"] for e in catalogue()])
    return list(dict.fromkeys(order))


def pick_canonical(rows: list[PerfRow], order: list[str]) -> PerfRow:
    """The reference hardware first, then the fallback order, then any; PyTorch first; newest."""
    def preference(r: PerfRow) -> tuple:
        hw = order.index(r.hardware) if r.hardware in order else len(order)
        be = BACKEND_PREFERENCE.index(r.format) if r.format in BACKEND_PREFERENCE else len(BACKEND_PREFERENCE)
        return hw, be, r.batch_size != 1

    best = min(preference(r) for r in rows)
    return max((r for r in rows if preference(r) == best), key=lambda r: (r.created_at, r.file))


def aggregate(reports: list[FileReport], reference_hardware: str = "a100", tolerance_points: float = 0.3,
              fallback_hardware: list[str] | None = None) -> dict:
    """Build the leaderboard document from validated files (files with errors are left out)."""
    rows, excluded = [], []
    for report in reports:
        site_errors = [f for f in report.errors if is_site_rule(f) and not _derivable_hardware_id(report, f)]
        if report.submission is None or site_errors:
            excluded.append({"file": str(report.path), "errors": [f.message for f in site_errors][:5]})
            continue
        rows.append(row_from(report))
    cube = dedup(rows)
    order = hardware_order(reference_hardware, fallback_hardware)

    by_accuracy: dict[tuple, list[PerfRow]] = {}
    for row in cube:
        if row.map_50_95 is not None and row.accuracy_trusted:
            by_accuracy.setdefault(row.accuracy_key, []).append(row)
    canonical, gate = {}, []
    for key, group in sorted(by_accuracy.items()):
        best = pick_canonical(group, order)
        policy = "reference" if best.hardware == reference_hardware else f"fallback ({best.hardware})"
        canonical[key] = {"model": key[0], "dataset_variant": key[1], "precision": key[2],
                          "mAP_50_95": best.map_50_95, "mAP_50": best.map_50, "hardware": best.hardware,
                          "format": best.format, "file": best.file, "policy": policy}
        for other in group:
            if other is best:
                continue
            delta = 100 * (other.map_50_95 - best.map_50_95)
            if abs(delta) > tolerance_points:
                gate.append({"model": key[0], "dataset_variant": key[1], "precision": key[2],
                             "canonical": round(best.map_50_95, 4), "canonical_file": best.file,
                             "canonical_hardware": best.hardware, "other": round(other.map_50_95, 4),
                             "other_file": other.file, "other_hardware": other.hardware,
                             "other_format": other.format, "delta_points": round(delta, 2)})

    for row in cube:
        full = canonical.get((row.model, "full", row.precision))
        own = canonical.get(row.accuracy_key)
        if full is not None:
            row.accuracy_shown, row.subset = full["mAP_50_95"], False
            row.accuracy_source = f"canonical full-val ({full['hardware']}, {full['format']}): {full['file']}"
        elif own is not None:
            row.accuracy_shown, row.subset = own["mAP_50_95"], row.dataset_variant != "full"
            row.accuracy_source = (f"canonical {row.dataset_variant} ({own['hardware']}, {own['format']}): "
                                   f"{own['file']}")
        else:
            row.accuracy_shown, row.accuracy_source = None, "no accuracy for this model/variant/precision"

    default_size = _default_input_sizes(cube)
    with_latency_row = {r.coordinate for r in cube if r.timing_mode == "latency"}
    leaderboard = [r for r in cube if r.batch_size == 1 and r.input_size == default_size.get(r.model)
                   and (r.timing_mode == "latency" or r.coordinate not in with_latency_row)]
    leaderboard.sort(key=lambda r: (r.hardware, r.format, r.provider, -(r.accuracy_shown or -1), r.model))
    return {
        "schema_version": "va-bench.leaderboard.v1",
        "policy": {"reference_hardware": reference_hardware, "fallback_order": order,
                   "tolerance_points": tolerance_points,
                   "performance_identity": ["model", "hardware", "format", "provider", "precision", "input_size",
                                            "batch_size", "dataset_variant", "timing_mode"],
                   "accuracy_identity": ["model", "dataset_variant", "precision"]},
        "counts": {"files": len(reports), "included": len(rows), "excluded": len(excluded), "rows": len(cube),
                   "superseded": sum(len(r.superseded) for r in cube), "gate_findings": len(gate)},
        "leaderboard": [asdict(r) for r in leaderboard],
        "canonical_accuracy": list(canonical.values()),
        "agreement_gate": gate,
        "cube": [asdict(r) for r in cube],
        "excluded": excluded,
    }


def _default_input_sizes(rows: list[PerfRow]) -> dict[str, int | None]:
    """Per model, the most common input size among its batch-1 rows (ties: the smaller)."""
    counts: dict[str, Counter] = {}
    for r in rows:
        if r.batch_size == 1:
            counts.setdefault(r.model, Counter())[r.input_size] += 1
    return {m: min(c.items(), key=lambda kv: (-kv[1], kv[0] or 0))[0] for m, c in counts.items()}
