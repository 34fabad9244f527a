"""Rich tables of an aggregated leaderboard."""

from __future__ import annotations

from rich.table import Table

from harness.views.text import escape

MAX_ROWS = 40


def _model_label(row: dict, several_weights: set[str]) -> str:
    """The model id, plus a short weights tag where one model id comes with several weights."""
    if row["model"] not in several_weights:
        return row["model"]
    kind, _, value = row["weights"].partition(":")
    return f"{row['model']} [{value[:8] if kind == 'sha256' else value or kind}]"


def leaderboard_table(board: dict, max_rows: int = MAX_ROWS, which: str = "detection") -> Table:
    """Batch-1 rows of one board (detection; segmentation: mask mAP) with the pinned accuracy: `full` (canonical
    full-val) or the variant it came from."""
    rows = board["leaderboard"] if which == "detection" else board.get("segmentation_leaderboard", [])
    variant = board["policy"].get("leaderboard_variant", "full")
    weights_of: dict[str, set] = {}
    for r in board["cube"]:
        weights_of.setdefault(r["model"], set()).add(r["weights"])
    several = {m for m, w in weights_of.items() if len(w) > 1}
    label = "full-val" if variant == "full" else variant
    title = "leaderboard" if which == "detection" else "segmentation board (mask mAP)"
    table = Table(title=f"{title} (batch 1, default input size; mAP: canonical {label} only): {len(rows)} rows"
                  + (f", first {max_rows} shown (-o for all)" if len(rows) > max_rows else ""))
    for col in ("hardware", "model", "format", "provider", "precision", "size", "timed on", "mAP", "mAP of",
                "p50 ms", "fps", "flags"):
        table.add_column(col)
    for r in rows[:max_rows]:
        shown = "-" if r["accuracy_shown"] is None else f"{r['accuracy_shown']:.4f}"
        source = "-" if r["accuracy_shown"] is None else (f"{variant} (subset)" if r["subset"] else "full")
        timed_on = r["dataset_variant"] + (f" ({r['timing_mode']} timing)" if r["timing_mode"] != "latency" else "")
        precision = r["precision"] + ("+tf32" if r["tf32"] == "on" else "")
        table.add_row(*(escape(str(v)) for v in (
            r["hardware"], _model_label(r, several), r["format"], r["provider"], precision, r["input_size"],
            timed_on, shown, source, r["latency_ms_p50"], r["fps_mean"], len(r["flags"]) or "")))
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


def size_order_table(board: dict, max_rows: int = MAX_ROWS) -> Table:
    """Larger variants measured faster than smaller ones of their family at the same coordinate."""
    found = board["size_order"]
    table = Table(title=f"size order: {len(found)} larger variants measured >10% faster than a smaller one "
                        "(busy or throttled device?)")
    for col in ("hardware", "runtime", "smaller", "p50 ms", "larger", "p50 ms", "faster"):
        table.add_column(col)
    for f in sorted(found, key=lambda f: -f["faster_pct"])[:max_rows]:
        table.add_row(*(escape(str(v)) for v in (
            f["hardware"], f"{f['format']}/{f['precision']} b{f['batch_size']}", f["smaller"]["model"],
            f["smaller"]["latency_ms_p50"], f["larger"]["model"], f["larger"]["latency_ms_p50"],
            f"{f['faster_pct']:.0f}%")))
    return table


def rf100vl_table(board: dict) -> Table:
    """The RF100-VL section: one row per campaign (unweighted mean over its datasets), no latency."""
    table = Table(title=f"RF100-VL: {len(board['rf100vl'])} rows (mean over fine-tuned datasets; off the COCO boards)")
    for col in ("model", "hardware", "runtime", "variant", "mAP 50:95", "mAP 50", "valid"):
        table.add_column(col)
    for r in board["rf100vl"]:
        maps = ("-" if r[k] is None else f"{r[k]:.3f}" for k in ("mAP_50_95", "mAP_50"))
        table.add_row(*(escape(str(v)) for v in (
            r["model"], r["hardware"], f"{r['format']}/{r['precision']}", r["variant"], *maps, r["valid_submission"])))
    return table
