"""Rich tables of an aggregated leaderboard."""

from __future__ import annotations

from itertools import groupby

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from harness.figures import shown_apart
from harness.results.aggregate import SIZE_ORDER_MARGIN, runtime_label
from harness.views.text import escape, printable

MAX_ROWS = 40


def _model_label(row: dict, several_weights: set[str]) -> str:
    """The model id, plus a short weights tag where one model id comes with several weights."""
    if row["model"] not in several_weights:
        return row["model"]
    kind, _, value = row["weights"].partition(":")
    return f"{row['model']} [{value[:8] if kind == 'sha256' else value or kind}]"


LEADERBOARD_COLUMNS = ("model", "runtime", "prec.", "size", "mAP", "F", "p50 ms", "fps", "timed", "!")
NUMERIC = {"size", "mAP", "F", "p50 ms", "fps", "!"}
WIDTH = 80  # the terminal summary's width


def fit_widths(columns: tuple[str, ...], rows: list[tuple[str, ...]], numeric: set[str]) -> list[int]:
    """Column widths for WIDTH characters with one space between columns: figures at their full width, the text
    columns at theirs where it all fits, else the widest text columns narrowed (their names wrap) until it does."""
    widths = [max([len(col), *(len(row[i]) for row in rows)]) for i, col in enumerate(columns)]
    text = [i for i, col in enumerate(columns) if col not in numeric]
    while sum(widths) + len(columns) - 1 > WIDTH and max(widths[i] for i in text) > 6:
        widest = max(text, key=lambda i: widths[i])
        widths[widest] -= 1
    return widths


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
    widths = fit_widths(LEADERBOARD_COLUMNS, [c for _, c in cells], NUMERIC)
    parts: list[RenderableType] = [Text(f"{title} (batch 1, default input size; mAP: canonical {label} only): "
                                        f"{len(rows)} rows" + (f", first {max_rows} shown (-o for all)"
                                                               if len(rows) > max_rows else ""), style="italic")]
    first = True
    for hardware, group in groupby(cells, key=lambda hc: hc[0]):
        parts.append(Text(printable(hardware), style="bold"))
        table = Table(box=box.SIMPLE_HEAD, padding=0, show_edge=False, show_header=first)
        for col, width in zip(LEADERBOARD_COLUMNS, widths, strict=True):
            table.add_column(col, justify="right" if col in NUMERIC else "left", no_wrap=col in NUMERIC,
                             overflow="fold", width=width)
        for _, row in group:
            table.add_row(*row)
        parts.append(table)
        first = False
    notes = ["F +: on the speed-accuracy front of its runtime on its hardware (no row there both as fast and as "
             "accurate, and better in one)",
             "fps: images/s from the mean latency; timed: the images timed; ! = flags (see -o)"]
    if any(r["accuracy_shown"] is not None and r["subset"] for r in shown_rows):
        notes.append(f"* mAP of the {variant} subset, not full-val")
    parts.append(Text("; ".join(notes), style="dim"))
    return Group(*parts)


def _cells(r: dict, several: set[str]) -> tuple:
    shown = "-" if r["accuracy_shown"] is None else f"{r['accuracy_shown']:.4f}" + ("*" if r["subset"] else "")
    timed_on = r["dataset_variant"] + (f" ({r['timing_mode']})" if r["timing_mode"] != "latency" else "")
    precision = r["precision"] + ("+tf32" if r["tf32"] == "on" else "")
    front = {True: "+", False: "", None: ""}[r.get("speed_accuracy_front")]
    return (_model_label(r, several), runtime_label(r), precision, r["input_size"], shown, front,
            _figure(r["latency_ms_p50"]), _figure(r["fps_mean"]), timed_on, len(r["flags"]) or "")


def _figure(value: object) -> str:
    """A latency or rate in three significant digits or more (1234, 67.3, 0.57); "-" when there is none."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return "-" if value is None else str(value)
    magnitude = abs(value)
    return f"{value:.0f}" if magnitude >= 100 else f"{value:.1f}" if magnitude >= 10 else f"{value:.2f}"


def _compact(title: str, columns: tuple[str, ...], numeric: set[str], rows: list[tuple[str, ...]]) -> Table:
    """A table of WIDTH characters: light rules, one space between columns, names wrapping, figures never cut."""
    table = Table(title=title, box=box.SIMPLE_HEAD, padding=0, show_edge=False)
    for col, width in zip(columns, fit_widths(columns, rows, numeric), strict=True):
        table.add_column(col, justify="right" if col in numeric else "left", no_wrap=col in numeric,
                         overflow="fold", width=width)
    for row in rows:
        table.add_row(*row)
    return table


def _how(gate: dict) -> str:
    """How a gate's other run was made, where the table shows it: its format, its preprocessing where that is not the
    canonical run's, its batch size."""
    made = [gate["other_format"]]
    if gate.get("other_preprocess", "?") != gate.get("canonical_preprocess", "?"):
        made.append(f"{gate['other_preprocess']} preprocessing")
    if gate.get("other_batch_size") is not None:
        made.append(f"b{gate['other_batch_size']}")
    return ", ".join(made)


def gate_table(board: dict, max_rows: int = MAX_ROWS) -> Table:
    gate = board["agreement_gate"]
    tol = board["policy"]["tolerance_points"]
    rows = [tuple(escape(str(v)) for v in (
        g["model"], g["dataset_variant"], g["precision"], f"{g['canonical']:.4f}", g["canonical_hardware"],
        f"{g['other']:.4f}",
        f"{g['other_hardware']} ({_how(g)})",
        ("+" if g["delta_points"] >= 0 else "-") + shown_apart(abs(g["delta_points"]), tol, 2)))
        for g in sorted(gate, key=lambda g: -abs(g["delta_points"]))[:max_rows]]
    return _compact(f"agreement gate: {len(gate)} runs differ from the canonical mAP by > {tol} points",
                    ("model", "variant", "prec.", "canonical", "on", "other", "on (how)", "Δ points"),
                    {"canonical", "other", "Δ points"}, rows)


SIZE_ORDER_COLUMNS = ("runtime", "prec.", "size", "b", "smaller", "p50 ms", "larger", "p50 ms ", "faster")
SIZE_ORDER_NUMERIC = {"size", "b", "p50 ms", "p50 ms ", "faster"}


def size_order_table(board: dict, max_rows: int = MAX_ROWS) -> Group:
    """Larger variants measured faster than smaller ones of their family at the same coordinate, grouped by
    hardware as the leaderboard is (the id heads its group, whole)."""
    worst = sorted(board["size_order"], key=lambda f: -f["faster_pct"])[:max_rows]  # the largest, then by hardware
    found = sorted(worst, key=lambda f: (f["hardware"], -f["faster_pct"]))
    cells = [(f["hardware"], tuple(escape(str(v)) for v in (
        runtime_label(f), f["precision"], f["input_size"], f["batch_size"], f["smaller"]["model"],
        _figure(f["smaller"]["latency_ms_p50"]), f["larger"]["model"], _figure(f["larger"]["latency_ms_p50"]),
        f"{shown_apart(f['faster_pct'], 100 * SIZE_ORDER_MARGIN, 0)}%"))) for f in found]
    widths = fit_widths(SIZE_ORDER_COLUMNS, [c for _, c in cells], SIZE_ORDER_NUMERIC)
    total = len(board["size_order"])
    parts: list[RenderableType] = [Text(
        f"size order: {total} larger variants measured >10% faster than a smaller one (a busy or throttled device, "
        "or a real trait of the two architectures: check before trusting either row)"
        + (f"; first {max_rows} shown (-o for all)" if total > max_rows else ""), style="italic")]
    first = True
    for hardware, group in groupby(cells, key=lambda hc: hc[0]):
        parts.append(Text(printable(hardware), style="bold"))
        table = Table(box=box.SIMPLE_HEAD, padding=0, show_edge=False, show_header=first)
        for col, width in zip(SIZE_ORDER_COLUMNS, widths, strict=True):
            table.add_column(col.strip(), justify="right" if col in SIZE_ORDER_NUMERIC else "left",
                             no_wrap=col in SIZE_ORDER_NUMERIC, overflow="fold", width=width)
        for _, row in group:
            table.add_row(*row)
        parts.append(table)
        first = False
    return Group(*parts)


def rf100vl_table(board: dict) -> Table:
    """The RF100-VL section: one row per campaign (unweighted mean over its datasets), no latency."""
    rows = [tuple(escape(str(v)) for v in (
        r["model"], r["hardware"], f"{r['format']}/{r['precision']}", r["variant"],
        *("-" if r[k] is None else f"{r[k]:.3f}" for k in ("mAP_50_95", "mAP_50")), r["valid_submission"]))
        for r in board["rf100vl"]]
    return _compact(f"RF100-VL: {len(board['rf100vl'])} rows (mean over fine-tuned datasets; off the COCO boards)",
                    ("model", "hardware", "runtime", "variant", "mAP 50:95", "mAP 50", "valid"),
                    {"mAP 50:95", "mAP 50"}, rows)
