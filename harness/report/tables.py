"""The end-of-run summary: a rich table for people, a dict for --json."""

from __future__ import annotations

from pathlib import Path

from rich.markup import escape
from rich.table import Table

from harness.results.records import CellRecord


def _split(record: CellRecord) -> str:
    """Stage split of the batch time, e.g. 'pre 8% / fwd 80% / post 12%'."""
    t = record.timing
    total = t.batch_ms.mean
    parts = []
    for name, short in (("preprocess", "pre"), ("forward", "fwd"), ("postprocess", "post")):
        s = t.stages_ms.get(name)
        if s is not None and total > 0:
            parts.append(f"{short} {100 * s.mean / total:.0f}%")
    return " / ".join(parts)


def summary_table(records: list[CellRecord]) -> Table:
    overlapped = any(r.timing.mode == "overlapped" for r in records)
    table = Table(title="va-bench run summary" + (" (overlapped: img/s over wall time; batch times are end-to-end "
                                                  "latencies with queueing, stages overlap)" if overlapped else ""))
    for col in ("model", "backend", "size", "batch", "img/s", "p50 ms/batch", "p95 ms/batch", "p50 ms/img",
                "stage split", "mAP", "b-invariance"):
        table.add_column(col, justify="right" if col not in ("model", "backend", "stage split") else "left")
    for r in records:
        t = r.timing
        m_ap = f"{r.accuracy.stats['mAP_50_95']:.4f}" if r.accuracy else "-"
        inv = f"{100 * r.invariance.match_rate:.2f}%" if r.invariance else "-"
        table.add_row(escape(r.cell.load.model), escape(r.cell.load.backend), str(r.cell.load.input_size[0]),
                      str(t.batch_size), f"{t.images_per_s:.1f}", f"{t.batch_ms.p50:.2f}", f"{t.batch_ms.p95:.2f}",
                      f"{t.image_ms.p50:.2f}", _split(r), m_ap, inv)
    return table


def probe_table(records: list[CellRecord]) -> Table:
    """Memory and energy per cell."""
    table = Table(title="memory and energy (timing window)")
    for col in ("cell", "peak RAM MB", "peak VRAM MB", "J/image", "images/J"):
        table.add_column(col, justify="left" if col == "cell" else "right")
    for r in records:
        e = r.energy or {}
        ok = e.get("status") == "ok"
        table.add_row(escape(r.cell.label), str(r.memory.get("peak_ram_mb", "-")),
                      str(r.memory.get("peak_vram_mb") or "-"),
                      str(e.get("joules_per_image")) if ok else "unavailable",
                      str(e.get("images_per_joule")) if ok else "-")
    return table


def probe_lines(records: list[CellRecord], top: int = 6) -> list[str]:
    """One line per probe result worth reading: layer types, profiler top ops, why energy is missing."""
    lines = []
    for r in records:
        if r.layers:
            types = ", ".join(f"{t['layer_type']} {t['share_pct']:.0f}%" for t in r.layers["by_type_top"][:top])
            cover = ", ".join(f"{c:.2f}" for c in r.layers["layer_sum_over_forward"])
            lines.append(f"time per layer type ({r.cell.label}): {types}  [layer sum / forward: {cover}]")
        if r.profiler:
            ops = ", ".join(f"{o['name']} {o.get('self_cpu_ms', 0):.1f} ms" for o in r.profiler["top_ops"][:top])
            lines.append(f"profiler top self-CPU ops ({r.cell.label}): {ops}  -> {r.profiler['trace']}")
    reasons = {r.energy.get("reason") for r in records if r.energy and r.energy.get("status") != "ok"}
    for reason in sorted(filter(None, reasons)):
        lines.append(f"energy unavailable: {reason}")
    return lines


def summary_json(run_dir: Path, records: list[CellRecord]) -> dict:
    cells, warnings = [], []
    for r in records:
        t = r.timing
        cells.append({
            "cell": r.cell.label,
            "submission": r.artifacts.get("submission"),
            "mode": t.mode,
            "images_per_s": round(t.images_per_s, 3),
            "batch_ms": t.batch_ms.to_dict(),
            "image_ms_p50": round(t.image_ms.p50, 4),
            "stages_ms_mean": {k: round(v.mean, 4) for k, v in t.stages_ms.items()},
            "mAP_50_95": r.accuracy.stats["mAP_50_95"] if r.accuracy else None,
            "batch_invariance": r.invariance.to_dict() if r.invariance else None,
            "warnings": t.warnings,
            "memory": r.memory,
            "energy": r.energy,
            "layers": r.layers,
            "profiler": r.profiler,
        })
        warnings += [f"{r.cell.label}: {w}" for w in t.warnings]
    return {"run_dir": str(run_dir), "cells": cells, "warnings": warnings}
