"""The report's plots (matplotlib, Agg, no pyplot state): each reads the run's records/CSVs, draws one PNG
and returns the numbers it drew, so tests can hold them against the submissions. Nothing is re-run.

A plot with nothing to draw returns `png=None` and says why (`unavailable`), never an empty chart.
"""

from __future__ import annotations

import io
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: never pick an interactive backend on a headless box
matplotlib.rcParams["text.parse_math"] = False  # labels are names from files ("cost$x$" is a name, not TeX)

import numpy as np  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402

from harness.results.reader import (  # noqa: E402
    LAYER_TYPES_FILE,
    MEMORY_FILE,
    FinishedCell,
    RunFolder,
    number,
    short_labels,
)

DPI = 100
STAGES = ("preprocess", "transfer", "forward", "postprocess")
STAGE_COLORS = {"preprocess": "#4c72b0", "transfer": "#8172b2", "forward": "#dd8452", "postprocess": "#55a868",
                "other": "#c8c8c8", "queued": "#e8c8c8"}
TOP_LAYER_TYPES = 12
LOG_Y_RATIO = 20
BAND_FROM_SAMPLES = "p5-p95 of the per-batch samples (timing.batch_samples_ms)"
BAND_FROM_SUMMARY = "min-p95 from the summary (no per-batch samples recorded; the summary has no p5)"


@dataclass
class Plot:
    """One figure of the report: the PNG, the numbers drawn, notes for the caption, or why it is absent."""

    name: str  # PNG file name in the run folder
    title: str
    png: bytes | None
    data: Any
    notes: list[str] = field(default_factory=list)
    unavailable: str | None = None


@dataclass
class LatencySeries:
    """One line of the batch-size sweep (model, backend, precision, input size, mode)."""

    label: str
    mode: str
    batch_sizes: list[int] = field(default_factory=list)
    p50_ms: list[float] = field(default_factory=list)  # per batch
    band_ms: list[tuple[float, float]] = field(default_factory=list)
    band_source: list[str] = field(default_factory=list)
    images_per_s: list[float] = field(default_factory=list)  # throughput.images_per_s as recorded
    band_images_per_s: list[tuple[float, float] | None] = field(default_factory=list)


@dataclass
class StageBar:
    """Mean time per image of each stage in one cell (stage means per batch / batch size)."""

    label: str  # the cell
    batch_size: int
    mode: str
    ms_per_image: dict[str, float]  # stage -> ms, plus "other": batch time the stages do not cover


def _png(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=DPI, bbox_inches="tight")
    return buffer.getvalue()


def _unavailable(name: str, title: str, reason: str) -> Plot:
    return Plot(name=name, title=title, png=None, data=None, unavailable=reason)


def _bands(cell: FinishedCell, p50: float) -> tuple[tuple[float, float], str, tuple[float, float]]:
    """(latency band, its source, images/s band) for one cell."""
    batch = cell.key.batch_size
    samples = cell.get("timing.batch_samples_ms")
    values = [v for v in samples if number(v) is not None] if isinstance(samples, list) else []
    if values:
        lo, hi = (float(v) for v in np.percentile(np.asarray(values, dtype=np.float64), [5, 95]))
        source = BAND_FROM_SAMPLES
    else:
        lo = number(cell.get("timing.batch_ms.min"))
        hi = number(cell.get("timing.batch_ms.p95"))
        lo, hi = (p50 if lo is None else lo), (p50 if hi is None else hi)
        source = BAND_FROM_SUMMARY
    # a batch of `batch` images in t ms is batch * 1000 / t images/s: the slow end of the latency band is
    # the low end of the throughput band
    ips = (batch * 1000.0 / hi, batch * 1000.0 / lo) if lo > 0 and hi > 0 else (float("nan"), float("nan"))
    return (lo, hi), source, ips


def latency_throughput(run: RunFolder) -> Plot:
    """p50 latency per batch and images/s vs batch size, one line per backend/precision/size/mode, with bands."""
    name, title = "latency_throughput.png", "Latency and throughput vs batch size"
    series: dict[str, LatencySeries] = {}
    notes = []
    for cell in run.cells:
        p50 = number(cell.get("timing.batch_ms.p50"))
        ips = number(cell.get("throughput.images_per_s"))
        if p50 is None or ips is None:
            notes.append(f"{cell.key.label}: no timing.batch_ms.p50 / throughput.images_per_s recorded; not plotted")
            continue
        s = series.setdefault(cell.key.series, LatencySeries(cell.key.series, cell.key.mode))
        band, source, ips_band = _bands(cell, p50)
        s.batch_sizes.append(cell.key.batch_size)
        s.p50_ms.append(p50)
        s.band_ms.append(band)
        s.band_source.append(source)
        s.images_per_s.append(ips)
        # overlapped mode: images/s is over the stream's wall time, not 1 / batch latency, so no band
        s.band_images_per_s.append(ips_band if cell.key.mode == "latency" else None)
    if not series:
        return _unavailable(name, title, "no cell has timing.batch_ms and throughput.images_per_s")
    fig = Figure(figsize=(12, 4.6))
    ax_lat, ax_ips = fig.subplots(1, 2)
    all_batches = sorted({b for s in series.values() for b in s.batch_sizes})
    for i, s in enumerate(series.values()):
        color = f"C{i % 10}"
        x = np.asarray(s.batch_sizes, dtype=float)
        p50 = np.asarray(s.p50_ms)
        lo, hi = np.asarray([b[0] for b in s.band_ms]), np.asarray([b[1] for b in s.band_ms])
        ax_lat.errorbar(x, p50, yerr=[p50 - lo, hi - p50], marker="o", capsize=4, color=color, label=s.label)
        ax_lat.fill_between(x, lo, hi, color=color, alpha=0.15)
        ax_ips.plot(x, s.images_per_s, marker="o", color=color, label=s.label)
        banded = [(b, band) for b, band in zip(s.batch_sizes, s.band_images_per_s, strict=True) if band]
        if banded:
            bx = np.asarray([b for b, _ in banded], dtype=float)
            ax_ips.fill_between(bx, [band[0] for _, band in banded], [band[1] for _, band in banded], color=color,
                                alpha=0.15)
            ax_ips.vlines(bx, [band[0] for _, band in banded], [band[1] for _, band in banded], color=color,
                          alpha=0.5)
        if s.mode != "latency":
            notes.append(f"{s.label}: images/s over the stream's wall time; no band (batch times include queueing)")
    for ax, ylabel in ((ax_lat, "ms per batch (p50, band)"), (ax_ips, "images/s (band from per-batch times)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(all_batches, [str(b) for b in all_batches])
        ax.minorticks_off()
        ax.set_xlabel("batch size")
        ax.set_ylabel(ylabel)
        ax.grid(True, alpha=0.3)
    for ax, values in ((ax_lat, [v for s in series.values() for v in s.p50_ms]),
                       (ax_ips, [v for s in series.values() for v in s.images_per_s])):
        positive = [v for v in values if v > 0]
        if positive and max(positive) / min(positive) > LOG_Y_RATIO:  # else the fast lines sit flat on the axis
            ax.set_yscale("log")
            notes.append(f"{'latency' if ax is ax_lat else 'throughput'} axis is logarithmic (values span "
                         f"{max(positive) / min(positive):.0f}x)")
    ax_lat.set_title("latency per batch")
    ax_ips.set_title("throughput")
    ax_ips.legend(fontsize=8, loc="best")
    sources = sorted({src for s in series.values() for src in s.band_source})
    notes[:0] = [f"band: {src}" for src in sources]
    fig.suptitle(title)
    return Plot(name, title, _png(fig), list(series.values()), notes)


def stage_breakdown(run: RunFolder) -> Plot:
    """Stacked bars of the mean time per image in each stage, one bar per cell (grouped by series)."""
    name, title = "stages.png", "Stage breakdown per batch size (mean ms per image)"
    bars: list[StageBar] = []
    notes = []
    for cell in run.cells:
        batch = cell.key.batch_size
        total = number(cell.get("timing.batch_ms.mean"))
        stages = {s: number(cell.get(f"timing.stages_ms.{s}.mean")) for s in STAGES}
        if total is None or all(v is None for v in stages.values()):
            notes.append(f"{cell.key.label}: no timing.stages_ms recorded; not plotted")
            continue
        ms = {s: v / batch for s, v in stages.items() if v is not None}
        # what the stage clocks do not cover: the harness between stages; in overlapped mode a batch's latency also
        # holds its waits for a worker and for the forward, behind other batches (its stages run concurrently with
        # theirs, so the bar is one batch's latency, not the stream's time per image)
        ms["other" if cell.key.mode == "latency" else "queued"] = max(0.0, total / batch - sum(ms.values()))
        bars.append(StageBar(cell.key.label, batch, cell.key.mode, ms))
        if cell.key.mode != "latency":
            notes.append(f"{cell.key.label}: overlapped mode: one batch's end-to-end latency per image (stages "
                         "run concurrently with other batches'; queued = waiting behind them), not the stream's "
                         "time per image")
    if not bars:
        return _unavailable(name, title, "no cell has timing.stages_ms")
    fig = Figure(figsize=(max(6.0, 1.1 * len(bars) + 3), 4.8))
    ax = fig.subplots()
    x = np.arange(len(bars))
    bottom = np.zeros(len(bars))
    for stage in (*STAGES, "other", "queued"):
        values = np.asarray([b.ms_per_image.get(stage, 0.0) for b in bars])
        if not values.any():
            continue
        ax.bar(x, values, bottom=bottom, color=STAGE_COLORS[stage], label=stage, width=0.65)
        bottom += values
    short = short_labels([c.key for c in run.cells])
    by_label = {c.key.label: "\n".join(short[c.key].rsplit(" ", 1)) for c in run.cells}
    ax.set_xticks(x, [by_label[b.label] for b in bars], fontsize=8)
    if len({c.key.series for c in run.cells}) == 1:  # the ticks name only the batch size: say what ran
        ax.set_xlabel(run.cells[0].key.series)
    ax.set_ylabel("ms per image")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_title(title)
    notes.insert(0, "other = batch time not covered by the stage clocks")  # "queued" is said per overlapped cell
    return Plot(name, title, _png(fig), bars, notes)


def layer_types(run: RunFolder) -> Plot:
    """Time per layer type from layer_types.csv, one panel per cell that had a layer pass."""
    name, title = "layer_types.png", "Time per layer type (layer pass)"
    rows = run.csv_rows(LAYER_TYPES_FILE)
    if not rows:
        return _unavailable(name, title, "no layer pass in this run (layer_types.csv absent; run with --layers)")
    finished = {f"{k.model} {k.backend} {k.precision} {k.input_size} b{k.batch_size}": c for c in run.cells
                for k in [c.key]}
    groups: dict[str, list[tuple[str, float]]] = defaultdict(list)
    for r in rows:
        value = _float(r.get("total_ms"))
        label = f"{r.get('model')} {r.get('backend')} {r.get('precision')} {r.get('input_size')} b{r.get('batch_size')}"
        if value is None or not r.get("layer_type") or label not in finished:  # a cell still running, or stopped
            continue
        groups[label].append((str(r["layer_type"]), value))
    if not groups:
        return _unavailable(name, title, "layer_types.csv has no rows with layer_type and total_ms of a finished cell")
    data = {label: sorted(types, key=lambda t: -t[1]) for label, types in groups.items()}
    methods = {label: c.get("layers.method") for label, c in finished.items() if c.get("layers.method")}
    fig = Figure(figsize=(12, 0.32 * TOP_LAYER_TYPES * len(data) + 1.2 * len(data)))
    axes = np.atleast_1d(fig.subplots(len(data), 1, squeeze=False)[:, 0])
    notes = []
    for ax, (label, types) in zip(axes, data.items(), strict=True):
        shown = types[:TOP_LAYER_TYPES]
        ax.barh([t for t, _ in shown][::-1], [v for _, v in shown][::-1], color="#dd8452")
        rest = types[TOP_LAYER_TYPES:]
        suffix = f"; {len(rest)} more types, {sum(v for _, v in rest):.2f} ms, not shown" if rest else ""
        ax.set_title(f"{label}{suffix}", fontsize=9)
        ax.tick_params(axis="y", labelsize=8)
        ax.grid(True, axis="x", alpha=0.3)
        if label in methods:
            notes.append(f"{label}: {methods[label]}")
    axes[-1].set_xlabel("ms, summed over the layer pass's batches")
    fig.suptitle(title)
    return Plot(name, title, _png(fig), data, notes)


MEMORY_GAP_S = 5.0  # memory.csv samples every 50 ms while a process runs: a longer silence is between processes


def memory_timeline(run: RunFolder) -> Plot:
    """Host RSS (and CUDA allocated memory when recorded) over the run, timing windows shaded (memory.csv)."""
    name, title = "memory.png", "Memory over time (memory.csv)"
    rows = run.csv_rows(MEMORY_FILE)
    if not rows:
        return _unavailable(name, title, "memory.csv absent (run with --memory)")
    points = [(_float(r.get("timestamp")), _float(r.get("rss_mb")), _float(r.get("cuda_allocated_mb")),
               str(r.get("tag") or "")) for r in rows]
    points = [p for p in points if p[0] is not None and p[1] is not None]
    if not points:
        return _unavailable(name, title, "memory.csv has no rows with timestamp and rss_mb")
    # a process's samples begin with its "start" tag (a resumed run, a fleet's tasks append theirs to the file):
    # the line breaks there, never drawn across the gap between two processes as if measured
    # (or, for a process that ended before its first window, its samples' silence: far longer than the sampling's)
    breaks = [i for i in range(1, len(points))
              if (points[i][3] == "start" and points[i - 1][3] != "start") or points[i][0] < points[i - 1][0]
              or points[i][0] - points[i - 1][0] > MEMORY_GAP_S]
    # the time between two processes (a run resumed days later) drawn as MEMORY_GAP_S, marked with how long it was:
    # at its true length it would squeeze every process's samples into a line
    gaps = {i: points[i][0] - points[i - 1][0] for i in breaks}
    t, shift = [], 0.0
    for i, point in enumerate(points):
        if i in gaps and gaps[i] > MEMORY_GAP_S:
            shift += gaps[i] - MEMORY_GAP_S
        elif i in gaps:  # a shorter silence, or a clock that went back: drawn as the same gap
            shift -= MEMORY_GAP_S - gaps[i]
        t.append(point[0] - points[0][0] - shift)
    rss = [p[1] for p in points]
    cuda = [p[2] for p in points]
    spans: list[tuple[str, float, float]] = []  # consecutive samples with the same tag
    for ti, (_, _, _, tag) in zip(t, points, strict=True):
        if spans and spans[-1][0] == tag:
            spans[-1] = (tag, spans[-1][1], ti)
        else:
            spans.append((tag, ti, ti))
    fig = Figure(figsize=(12, 4.2))
    ax = fig.subplots()
    ax.plot(*_broken(t, rss, breaks), color="C0", label="host RSS (MB)", linewidth=1.2)
    if any(c is not None for c in cuda):
        ax.plot(*_broken(t, [np.nan if c is None else c for c in cuda], breaks), color="C3",
                label="CUDA allocated (MB)")
    timing_spans = [s for s in spans if s[0].startswith("timing ")]
    # the runner tags a timing window "timing <model> <backend> <precision> <size> b<batch>"
    cells = {f"timing {k.model} {k.backend} {k.precision} {k.input_size} b{k.batch_size}": c
             for c in run.cells for k in [c.key]}
    peaks = {}
    for i, (tag, a, b) in enumerate(timing_spans):
        color = f"C{(i % 9) + 1}"
        ax.axvspan(a, b, color=color, alpha=0.15)
        ax.text((a + b) / 2, 1.0, tag.removeprefix("timing "), transform=ax.get_xaxis_transform(), rotation=90,
                fontsize=7, ha="center", va="top")
        # the run's own process's peak, where other processes' are added to the cell's (the line is this process's)
        peak = (number(cells[tag].get("memory.run_process.peak_ram_mb", cells[tag].get("memory.peak_ram_mb")))
                if tag in cells else None)
        if peak is not None:
            peaks[tag] = peak
            ax.hlines(peak, a, b, colors=color, linestyles="--", linewidth=1.5)
    for i in breaks:  # where a later process's samples begin, and how long after the last ones
        ax.axvline(t[i] - MEMORY_GAP_S / 2, color="0.5", linestyle=":", linewidth=1)
        ax.text(t[i] - MEMORY_GAP_S / 2, 0.02, f" +{_duration(gaps[i])}", transform=ax.get_xaxis_transform(),
                fontsize=7, color="0.3", rotation=90, ha="right", va="bottom")
    ax.set_xlabel("seconds sampled" + (f" (the time between two processes drawn as {MEMORY_GAP_S:g} s, dotted, with "
                                      "how long it was)" if breaks else " since the first sample"))
    ax.set_ylabel("MB")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title(title)
    data = {"t_s": t, "rss_mb": rss, "cuda_allocated_mb": cuda, "spans": spans, "peak_ram_mb": peaks,
            "process_starts": [0, *breaks], "gaps_s": [round(gaps[i], 3) for i in breaks]}
    notes = ["shaded: timing windows; dashed: the cell's peak RAM (memory.peak_ram_mb: the kernel's VmHWM over the "
             "window, a true peak the 50 ms samples can miss; with a forward or host processes, the run's own "
             "process's: memory.run_process)"]
    return Plot(name, title, _png(fig), data, notes)


def _duration(seconds: float) -> str:
    """A gap between processes as a reader says it: 40 s, 12 min, 3.5 h, 2.1 d (a clock that went back: "0 s")."""
    seconds = max(seconds, 0.0)
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}" if unit != "min" else f"{seconds / size:.0f} {unit}"
    return f"{seconds:.0f} s"


def _broken(x: list[float], y: list[float], breaks: list[int]) -> tuple[list[float], list[float]]:
    """x and y with a NaN point before each index in `breaks`, where matplotlib breaks the line."""
    xs, ys, previous = [], [], 0
    for i in [*breaks, len(x)]:
        if previous:
            xs.append(np.nan)
            ys.append(np.nan)
        xs += x[previous:i]
        ys += y[previous:i]
        previous = i
    return xs, ys


def energy_per_image(run: RunFolder) -> Plot:
    """Joules per image per cell where energy was measured; otherwise why not (from the submissions)."""
    name, title = "energy.png", "Energy per image"
    measured = [(c.key.label, number(c.get("energy.joules_per_image")), c.get("energy.methods") or [])
                for c in run.cells if c.get("energy.status") == "ok"]
    measured = [m for m in measured if m[1] is not None]
    if not measured:
        reasons = sorted({str(c.get("energy.reason") or "no energy block in the submission") for c in run.cells})
        return _unavailable(name, title, "energy unavailable: " + " | ".join(reasons))
    fig = Figure(figsize=(max(6.0, 1.0 * len(measured) + 3), 4.2))
    ax = fig.subplots()
    ax.bar(range(len(measured)), [m[1] for m in measured], color="#55a868")
    ax.set_xticks(range(len(measured)), ["\n".join(m[0].rsplit(" ", 1)) for m in measured], fontsize=7)
    ax.set_ylabel("J per image (timing window)")
    ax.grid(True, axis="y", alpha=0.3)
    ax.set_title(title)
    methods = sorted({m for _, _, ms in measured for m in ms})
    missing = [c.key.label for c in run.cells if c.key.label not in {m[0] for m in measured}]
    notes = [f"method: {', '.join(methods) or 'not recorded'}"]
    notes += [f"not measured: {', '.join(missing)}"] if missing else []
    return Plot(name, title, _png(fig), {m[0]: m[1] for m in measured}, notes)


PR_IOUS = (("0.50", "-"), ("0.50:0.95", "--"))


def _evaluations(run: RunFolder, key: str) -> dict[str, dict]:
    """Cell label -> its per_class file, for the scored cells whose file has `key` (one written before the curves
    has not) with distinct detections (the same detections draw the same curves: once)."""
    from harness.report.sections import per_class_file

    out, seen = {}, set()
    for c in run.cells:
        document = per_class_file(run, c)
        if not document or not document.get(key):
            continue
        same = c.get("eval.detections_sha256")
        if same is not None and same in seen:
            continue
        seen.add(same)
        out[c.key.label] = document
    return out


def _point(document: dict) -> dict | None:
    point = document.get("operating_point")
    return point if isinstance(point, dict) and "F1" in point else None


def precision_recall(run: RunFolder) -> Plot:
    """COCO's precision-recall curves averaged over the classes (IoU 0.50 solid, 0.50:0.95 dashed) of each scored
    cell with distinct detections, from its per_class file, with its operating point (the best mean F1: the
    classes' mean recall and precision there, not interpolated, so it can sit off the curve)."""
    name, title = "precision_recall.png", "Precision-recall (COCO, mean over classes)"
    curves = {}
    for label, document in _evaluations(run, "pr_curve").items():
        curve = document.get("pr_curve")
        if not (isinstance(curve, dict) and isinstance(curve.get("precision"), dict) and curve.get("recall")):
            continue
        point = _point(document)
        curves[label] = {"recall": curve["recall"], **{iou: curve["precision"].get(iou) for iou, _ in PR_IOUS},
                         "point": (point["recall"], point["precision"]) if point else None}
    if not curves:
        return _unavailable(name, title, "no scored cell has a per_class file with precision-recall curves")
    fig = _curves_figure(curves, "recall", PR_IOUS, ("recall", "precision", title))
    notes = ["COCO's interpolated precision at 101 recall points, averaged over the classes with ground truth (a "
             "curve's mean is that mAP): solid IoU 0.50, dashed 0.50:0.95; dot: the operating point (the confidence "
             "with the highest mean F1 at IoU 0.50: the classes' mean recall and precision there)", *_left_out(curves)]
    return Plot(name, title, _png(fig), curves, notes)


def confidence_curves(run: RunFolder) -> Plot:
    """The classes' mean F1 (solid), precision (dashed) and recall (dotted) keeping the detections at or above each
    confidence (IoU 0.50, not interpolated), per scored cell with distinct detections, the operating point marked:
    where to set a deployment's threshold."""
    name, title = "confidence.png", "Precision, recall and F1 against confidence (IoU 0.50)"
    curves = {}
    for label, document in _evaluations(run, "confidence_curve").items():
        curve = document.get("confidence_curve")
        if isinstance(curve, dict) and curve.get("confidence"):
            point = _point(document)
            curves[label] = {**{k: curve.get(k) for k in ("confidence", "precision", "recall", "F1")},
                             "point": (point["confidence"], point["F1"])
                             if point and point.get("confidence") is not None else None}
    if not curves:
        return _unavailable(name, title, "no scored cell has a per_class file with a confidence curve")
    fig = _curves_figure(curves, "confidence", (("F1", "-"), ("precision", "--"), ("recall", ":")),
                         ("confidence (detections kept at or above it)", "mean over classes", title))
    notes = ["F1 solid, precision dashed, recall dotted: each class's keeping its detections at or above the "
             "confidence, averaged over the classes with ground truth (a class keeping none: precision 0); dot: the "
             "operating point", *_left_out(curves)]
    return Plot(name, title, _png(fig), curves, notes)


MAX_CONFUSION_CLASSES = 20  # classes drawn in the confusion matrix (chosen by `_confusion_classes` past that)


def _confusion_classes(cells: list) -> tuple[list, int]:
    """The classes a confusion plot draws, and the confusions between classes it leaves out: those taking part in
    confusions first (the most first), then those with the most misses and detections on no object, then the most
    found, up to MAX_CONFUSION_CLASSES."""
    confused, errors, found = defaultdict(int), defaultdict(int), defaultdict(int)
    for truth, detected, count in cells:
        if truth == detected:
            found[truth] += count
        elif truth is not None and detected is not None:
            confused[truth] += count
            confused[detected] += count
        else:
            errors[truth if truth is not None else detected] += count
    every = set(confused) | set(errors) | set(found)
    ranked = sorted(every, key=lambda c: (-confused[c], -errors[c], -found[c], c))[:MAX_CONFUSION_CLASSES]
    drawn = set(ranked)
    left_out = sum(count for truth, detected, count in cells if truth is not None and detected is not None
                   and truth != detected and not (truth in drawn and detected in drawn))
    return ranked, left_out


def confusion(run: RunFolder) -> Plot:
    """The confusion matrix of the first scored cell that has one (cells with the same detections have the same):
    ground truth in rows, detections in columns, background last, each row's share of that class's objects as the
    colour and the counts written in; at most MAX_CONFUSION_CLASSES classes (`_confusion_classes`)."""
    name, title = "confusion.png", "Confusion at the operating point (boxes, IoU 0.50)"
    found = _evaluations(run, "confusion_matrix")
    if not found:
        return _unavailable(name, title, "no scored detection cell has a confusion matrix in its per_class file")
    label, document = next(iter(found.items()))
    matrix = document["confusion_matrix"]
    names = {c["id"]: c.get("name") or str(c["id"]) for c in document.get("categories", [])}
    shown, left_out = _confusion_classes(matrix["cells"])
    order = {c: k for k, c in enumerate(names)}
    shown = sorted(shown, key=lambda c: (order.get(c, len(order)), c))
    axis = [*shown, None]
    at = {c: k for k, c in enumerate(axis)}
    counts = np.zeros((len(axis), len(axis)), dtype=np.int64)
    for truth, detected, count in matrix["cells"]:
        if truth in at and detected in at:
            counts[at[truth], at[detected]] += count
    totals = {truth: 0 for truth in axis}
    for truth, _, count in matrix["cells"]:
        if truth in totals:
            totals[truth] += count
    shares = np.array([[counts[r, c] / totals[axis[r]] if totals[axis[r]] else 0.0 for c in range(len(axis))]
                       for r in range(len(axis))])
    ticks = [names.get(c, str(c)) if c is not None else "background" for c in axis]
    size = max(4.8, 0.38 * len(axis) + 2.2)
    fig = Figure(figsize=(size, size))
    ax = fig.subplots()
    ax.imshow(shares, cmap="Blues", vmin=0, vmax=1)
    for r in range(len(axis)):
        for c in range(len(axis)):
            if counts[r, c]:
                ax.text(c, r, str(counts[r, c]), ha="center", va="center", fontsize=6,
                        color="white" if shares[r, c] > 0.6 else "black")
    ax.set_xticks(range(len(axis)), ticks, rotation=90, fontsize=7)
    ax.set_yticks(range(len(axis)), ticks, fontsize=7)
    ax.set_xlabel("detected as")
    ax.set_ylabel("ground truth")
    ax.set_title(f"{title}\n{label}, confidence >= {matrix['confidence']:g}", fontsize=9)
    fig.tight_layout()
    notes = [f"{label}: each row's objects by what they were detected as (colour: the row's share of all its "
             "objects; background row: detections on no object, by their class); the diagonal is COCO's true "
             "positives at the operating point, confusions only what COCO scored as errors"]
    classes = len({c for cell in matrix["cells"] for c in cell[:2] if c is not None})
    if classes > len(shown):
        notes.append(f"{len(shown)} of {classes} classes drawn (those confused with another class first, then the "
                     "most misses and false positives)"
                     + (f"; {left_out} confusions with classes not drawn are not shown" if left_out else "")
                     + "; the whole matrix is in the cell's per_class file")
    if len(found) > 1:
        notes.append(f"one cell of {len(found)} with distinct detections drawn; each one's matrix is in its "
                     "per_class file")
    return Plot(name, title, _png(fig), {"cell": label, "classes": shown, "counts": counts.tolist()}, notes)


def _curves_figure(curves: dict, x: str, lines: tuple[tuple[str, str], ...], labels: tuple[str, str, str]) -> Figure:
    """One colour per cell (at most MAX_CURVES): each of its `lines` (key, style) against its `x` values, the
    first one named in the legend, its operating point as a dot; unit axes labelled (x, y, title)."""
    fig = Figure(figsize=(6.4, 4.8))
    ax = fig.subplots()
    for index, (label, data) in enumerate(_drawn(curves)):
        color = f"C{index % 10}"
        for key, style in lines:
            if data[key]:
                ax.plot(data[x], data[key], style, color=color, label=label if key == lines[0][0] else None)
        if data["point"]:
            ax.plot(*data["point"], "o", color=color, markersize=6)
    _unit_axes(ax, *labels)
    return fig


MAX_CURVES = 10  # cells drawn in one accuracy plot: more repeat colours and bury the legend


def _drawn(curves: dict) -> list:
    return list(curves.items())[:MAX_CURVES]


def _left_out(curves: dict) -> list[str]:
    rest = list(curves)[MAX_CURVES:]
    return [f"not drawn ({len(rest)} more cells; their curves are in their per_class files): " + ", ".join(rest)] \
        if rest else []


def _unit_axes(ax, xlabel: str, ylabel: str, title: str) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1.02)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="upper right", ncol=1 if len(ax.get_legend_handles_labels()[1]) <= 8 else 2)
    ax.set_title(title)


def _float(value: Any) -> float | None:
    try:
        return float(value) if value not in (None, "") else None
    except (TypeError, ValueError):
        return None


ALL_PLOTS = (latency_throughput, stage_breakdown, layer_types, memory_timeline, energy_per_image, precision_recall,
             confidence_curves, confusion)
PLOT_NAMES = ("latency_throughput.png", "stages.png", "layer_types.png", "memory.png", "energy.png",
              "precision_recall.png", "confidence.png", "confusion.png")


def all_plots(run: RunFolder) -> list[Plot]:
    """Every plot of the report, in the order the report shows them."""
    return [make(run) for make in ALL_PLOTS]


MAX_FRONT_PANELS = 9  # hardware ids drawn in one speed-accuracy figure (3 x 3)


def speed_accuracy(board: dict, which: str = "detection") -> Plot:
    """An aggregated board's speed-accuracy fronts: one panel per hardware id (the most rows first), each runtime's
    rows as points (latency p50 per image, log scale, against the accuracy shown) and its front as a line through
    them, fastest first: the figure detector papers publish, from the leaderboard's own rows."""
    from harness.results.aggregate import runtime_label

    name, title = "speed_accuracy.png", f"Speed and accuracy ({which} board, batch 1)"
    rows = board["leaderboard"] if which == "detection" else board.get("segmentation_leaderboard", [])
    placed = [r for r in rows if r.get("speed_accuracy_front") is not None]
    if not placed:
        return _unavailable(name, title, "no board row has both a latency and a shown accuracy (a canonical "
                                         f"{board['policy'].get('leaderboard_variant', 'full')} mAP)")
    by_hardware: dict[str, list[dict]] = defaultdict(list)
    for r in placed:
        by_hardware[r["hardware"]].append(r)
    hardware = sorted(by_hardware, key=lambda h: (-len(by_hardware[h]), h))
    drawn, left_out = hardware[:MAX_FRONT_PANELS], hardware[MAX_FRONT_PANELS:]
    columns = min(3, len(drawn))
    panel_rows = -(-len(drawn) // columns)
    fig = Figure(figsize=(5.0 * columns, 4.0 * panel_rows), layout="constrained")
    axes = np.atleast_1d(fig.subplots(panel_rows, columns, squeeze=False).ravel())
    data = {}
    for ax, hw in zip(axes, drawn, strict=False):
        runtimes: dict[str, list[dict]] = defaultdict(list)
        for r in by_hardware[hw]:
            runtimes[f"{runtime_label(r)} {r['precision']}" + ("+tf32" if r["tf32"] == "on" else "")].append(r)
        data[hw] = {}
        for index, (runtime, group) in enumerate(sorted(runtimes.items())):
            color = f"C{index % 10}"
            ax.scatter([r["latency_ms_p50"] for r in group], [r["accuracy_shown"] for r in group], s=14,
                       color=color, alpha=0.6)
            front = sorted((r for r in group if r["speed_accuracy_front"]), key=lambda r: r["latency_ms_p50"])
            ax.plot([r["latency_ms_p50"] for r in front], [r["accuracy_shown"] for r in front], "-o", color=color,
                    markersize=4, label=runtime)
            for r in front:
                ax.annotate(r["model"], (r["latency_ms_p50"], r["accuracy_shown"]), fontsize=6,
                            xytext=(3, -8), textcoords="offset points")
            data[hw][runtime] = [(r["model"], r["latency_ms_p50"], r["accuracy_shown"]) for r in front]
        ax.set_xscale("log")
        # plain numbers: the log axis's own labels are TeX, which this module draws as text (names are not TeX)
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _, ax=ax: _minor_label(v, ax.get_xlim())))
        ax.set_xlabel("latency p50, ms per image (log)")
        ax.set_ylabel("mAP 50:95" + (" (masks)" if which == "segmentation" else ""))
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6, loc="lower right")
        ax.set_title(hw, fontsize=9)
    for ax in axes[len(drawn):]:
        ax.set_visible(False)
    fig.suptitle(title)
    notes = ["points: a runtime's rows on the board; line: its front (no row both as fast and as accurate, and "
             "better in one); accuracy as the board shows it"]
    if left_out:
        notes.append(f"not drawn ({len(left_out)} more hardware ids): " + ", ".join(left_out))
    return Plot(name, title, _png(fig), data, notes)


def _minor_label(value: float, limits: tuple[float, float]) -> str:
    """A log axis's minor tick: every one labelled within a decade (no major tick to read by), else 2s and 5s."""
    lo, hi = sorted(limits)
    return f"{value:g}" if lo > 0 and hi / lo < 10 or f"{value:e}"[0] in "25" else ""


def campaign_datasets(rows: list[tuple[str, float | None, str | None]], mean: float | None) -> Plot:
    """A campaign's per-dataset mAP 50:95 (one bar each, in the campaign's order; a skipped dataset is a gap named
    with its reason), the row's unweighted mean as a line. `rows`: (dataset, mAP or None, reason when skipped)."""
    name, title = "datasets.png", "mAP 50:95 per dataset"
    if not any(m is not None for _, m, _ in rows):
        return _unavailable(name, title, "no dataset was scored")
    fig = Figure(figsize=(max(6.0, 0.35 * len(rows) + 2), 4))
    ax = fig.subplots()
    x = np.arange(len(rows))
    values = [m if m is not None else 0.0 for _, m, _ in rows]
    bars = ax.bar(x, values, color=["#4c72b0" if m is not None else "#ffffff" for _, m, _ in rows],
                  edgecolor=["#4c72b0" if m is not None else "#c44e52" for _, m, _ in rows])
    for bar, (_, m, _) in zip(bars, rows, strict=True):
        if m is None:
            bar.set_hatch("//")
    if mean is not None:
        ax.axhline(mean, color="#dd8452", linestyle="--", label=f"unweighted mean {mean:.3f}")
        ax.legend(loc="upper right", fontsize=8)
    ax.set_xticks(x, [d for d, _, _ in rows], rotation=90, fontsize=7)
    ax.set_ylabel("mAP 50:95")
    ax.set_title(title + (f" ({sum(m is None for _, m, _ in rows)} skipped, hatched)"
                          if any(m is None for _, m, _ in rows) else ""))
    notes = [f"{d}: skipped ({why})" for d, m, why in rows if m is None]
    return Plot(name, title, _png(fig), {"datasets": [d for d, _, _ in rows], "mAP_50_95": [m for _, m, _ in rows],
                                         "mean": mean}, notes)
