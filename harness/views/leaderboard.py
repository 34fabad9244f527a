"""Rich tables of an aggregated leaderboard."""

from __future__ import annotations

from itertools import groupby

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from harness.views.text import escape, printable

MAX_ROWS = 40


def _model_label(row: dict, several_weights: set[str]) -> str:
    """The model id, plus a short weights tag where one model id comes with several weights."""
    if row["model"] not in several_weights:
        return row["model"]
    kind, _, value = row["weights"].partition(":")
    return f"{row['model']} [{value[:8] if kind == 'sha256' else value or kind}]"


LEADERBOARD_COLUMNS = ("model", "runtime", "prec.", "size", "mAP", "p50 ms", "fps", "timed", "!")
NUMERIC = {"size", "mAP", "p50 ms", "fps", "!"}
TEXT_WIDTH = {"model": 18, "runtime": 16, "prec.": 9, "timed": 12}  # at most: 80 columns in all; longer names wrap


def leaderboard_table(board: dict, max_rows: int = MAX_ROWS, which: str = "detection") -> Group:
    """Batch-1 rows of one board (detection; segmentation: mask mAP) with the pinned accuracy: `full` (canonical
    full-val) or the variant it came from. Rows are grouped by hardware, whose id heads its group (whole, however
    long), the groups' columns aligned; figures are never cut (the JSON and -o keep every digit)."""
    rows = board["leaderboard"] if which == "detection" else board.get("segmentation_leaderboard", [])
    variant = board["policy"].get("leaderboard_variant", "full")
    weights_of: dict[str, set] = {}
    for r in board["cube"]:
        weights_of.setdefault(r["model"], set()).add(r["weights"])
    several = {m for m, w in weights_of.items() if len(w) > 1}
    label = "full-val" if variant == "full" else variant
    title = "leaderboard" if which == "detection" else "segmentation board (mask mAP)"
    shown_rows = rows[:max_rows]
    cells = [(r["hardware"], tuple(escape(str(v)) for v in _cells(r, several))) for r in shown_rows]
    widths = [max([len(col), *(len(c[i]) for _, c in cells)]) for i, col in enumerate(LEADERBOARD_COLUMNS)]
    widths = [min(w, TEXT_WIDTH.get(col, w)) for w, col in zip(widths, LEADERBOARD_COLUMNS, strict=True)]
    parts: list[RenderableType] = [Text(f"{title} (batch 1, default input size; mAP: canonical {label} only): "
                                        f"{len(rows)} rows" + (f", first {max_rows} shown (-o for all)"
                                                               if len(rows) > max_rows else ""), style="italic")]
    first = True
    for hardware, group in groupby(cells, key=lambda hc: hc[0]):
        parts.append(Text(printable(hardware), style="bold"))
        table = Table(box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), show_edge=False, show_header=first)
        for col, width in zip(LEADERBOARD_COLUMNS, widths, strict=True):
            table.add_column(col, justify="right" if col in NUMERIC else "left", no_wrap=col in NUMERIC,
                             overflow="fold", width=width)
        for _, row in group:
            table.add_row(*row)
        parts.append(table)
        first = False
    notes = ["timed: the images timed; ! = flags (see -o)"]
    if any(r["accuracy_shown"] is not None and r["subset"] for r in shown_rows):
        notes.append(f"* mAP of the {variant} subset, not full-val")
    parts.append(Text("; ".join(notes), style="dim"))
    return Group(*parts)


def _cells(r: dict, several: set[str]) -> tuple:
    shown = "-" if r["accuracy_shown"] is None else f"{r['accuracy_shown']:.4f}" + ("*" if r["subset"] else "")
    timed_on = r["dataset_variant"] + (f" ({r['timing_mode']})" if r["timing_mode"] != "latency" else "")
    precision = r["precision"] + ("+tf32" if r["tf32"] == "on" else "")
    return (_model_label(r, several), f"{r['format']}/{r['provider']}", precision, r["input_size"], shown,
            _figure(r["latency_ms_p50"]), _figure(r["fps_mean"]), timed_on, len(r["flags"]) or "")


def _figure(value: object) -> str:
    """A latency or rate in three significant digits or more (1234, 67.3, 0.57); "-" when there is none."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "-" if value is None else str(value)
    magnitude = abs(value)
    return f"{value:.0f}" if magnitude >= 100 else f"{value:.1f}" if magnitude >= 10 else f"{value:.2f}"


def _compact(title: str, columns: tuple[str, ...], numeric: set[str]) -> Table:
    """A table for 80 columns: light rules, one space between columns, names wrapping, figures never cut."""
    table = Table(title=title, box=box.SIMPLE_HEAD, padding=(0, 1, 0, 0), show_edge=False)
    for col in columns:
        table.add_column(col, justify="right" if col in numeric else "left", no_wrap=col in numeric,
                         overflow="fold")
    return table


def gate_table(board: dict, max_rows: int = MAX_ROWS) -> Table:
    gate = board["agreement_gate"]
    tol = board["policy"]["tolerance_points"]
    table = _compact(f"agreement gate: {len(gate)} runs differ from the canonical mAP by > {tol} points",
                     ("model", "variant", "prec.", "canonical", "on", "other", "on (format)", "Δ points"),
                     {"canonical", "other", "Δ points"})
    for g in sorted(gate, key=lambda g: -abs(g["delta_points"]))[:max_rows]:
        table.add_row(*(escape(str(v)) for v in (
            g["model"], g["dataset_variant"], g["precision"], g["canonical"], g["canonical_hardware"], g["other"],
            f"{g['other_hardware']} ({g['other_format']})", f"{g['delta_points']:+.2f}")))
    return table


def size_order_table(board: dict, max_rows: int = MAX_ROWS) -> Table:
    """Larger variants measured faster than smaller ones of their family at the same coordinate."""
    found = board["size_order"]
    table = _compact(f"size order: {len(found)} larger variants measured >10% faster than a smaller one (busy or "
                     "throttled device?)", ("hardware", "runtime", "smaller", "p50 ms", "larger", "p50 ms ", "faster"),
                     {"p50 ms", "p50 ms ", "faster"})
    for f in sorted(found, key=lambda f: -f["faster_pct"])[:max_rows]:
        table.add_row(*(escape(str(v)) for v in (
            f["hardware"], f"{f['format']}/{f['precision']} b{f['batch_size']}", f["smaller"]["model"],
            _figure(f["smaller"]["latency_ms_p50"]), f["larger"]["model"], _figure(f["larger"]["latency_ms_p50"]),
            f"{f['faster_pct']:.0f}%")))
    return table


def rf100vl_table(board: dict) -> Table:
    """The RF100-VL section: one row per campaign (unweighted mean over its datasets), no latency."""
    table = _compact(f"RF100-VL: {len(board['rf100vl'])} rows (mean over fine-tuned datasets; off the COCO boards)",
                     ("model", "hardware", "runtime", "variant", "mAP 50:95", "mAP 50", "valid"),
                     {"mAP 50:95", "mAP 50"})
    for r in board["rf100vl"]:
        maps = ("-" if r[k] is None else f"{r[k]:.3f}" for k in ("mAP_50_95", "mAP_50"))
        table.add_row(*(escape(str(v)) for v in (
            r["model"], r["hardware"], f"{r['format']}/{r['precision']}", r["variant"], *maps, r["valid_submission"])))
    return table
