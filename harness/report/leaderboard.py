"""Rich tables of an aggregated leaderboard."""

from __future__ import annotations

from rich.markup import escape
from rich.table import Table

MAX_ROWS = 40


def leaderboard_table(board: dict, max_rows: int = MAX_ROWS) -> Table:
    rows = board["leaderboard"]
    table = Table(title=f"leaderboard (batch 1, default input size): {len(rows)} rows"
                  + (f", first {max_rows} shown (-o for all)" if len(rows) > max_rows else ""))
    for col in ("hardware", "model", "format", "provider", "precision", "size", "variant", "mAP", "source",
                "p50 ms", "fps", "flags"):
        table.add_column(col)
    for r in rows[:max_rows]:
        shown = "-" if r["accuracy_shown"] is None else f"{r['accuracy_shown']:.4f}"
        source = "subset" if r["subset"] else ("full" if r["accuracy_shown"] is not None else "-")
        variant = r["dataset_variant"] + (f" ({r['timing_mode']} timing)" if r["timing_mode"] != "latency" else "")
        table.add_row(*(escape(str(v)) for v in (
            r["hardware"], r["model"], r["format"], r["provider"], r["precision"], r["input_size"],
            variant, shown, source, r["latency_ms_p50"], r["fps_mean"], len(r["flags"]) or "")))
    return table


def gate_table(board: dict, max_rows: int = MAX_ROWS) -> Table:
    gate = board["agreement_gate"]
    tol = board["policy"]["tolerance_points"]
    table = Table(title=f"agreement gate: {len(gate)} runs differ from the canonical mAP by > {tol} points")
    for col in ("model", "variant", "precision", "canonical", "on", "other", "on", "Δ points"):
        table.add_column(col)
    for g in sorted(gate, key=lambda g: -abs(g["delta_points"]))[:max_rows]:
        table.add_row(*(escape(str(v)) for v in (
            g["model"], g["dataset_variant"], g["precision"], g["canonical"], g["canonical_hardware"], g["other"],
            f"{g['other_hardware']} ({g['other_format']})", f"{g['delta_points']:+.2f}")))
    return table
