"""Rich rendering of `va-bench parity preprocess` (harness/eval/parity.py): input pixels, detection diff,
the 12 COCO metrics side by side with deltas, the noise floor and the verdict."""

from __future__ import annotations

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table

from harness.eval.coco_eval import STAT_NAMES
from harness.eval.parity import GATED, ParityReport
from harness.views.text import escape


def _header(report: ParityReport) -> str:
    s = report.setup
    return (f"[bold]preprocessing parity[/] {escape(str(s.get('model')))} · {escape(str(s.get('backend')))} · "
            f"{escape(str(s.get('device')))} · {s.get('images')} images · batch {s.get('batch_size')} · "
            f"reference [bold]{escape(report.reference)}[/]")


def _pixels(report: ParityReport) -> Table:
    table = Table(title="model input tensor vs the reference (|Δ| in input units, after scale/mean/std; the mean "
                        "over the whole letterboxed input, padding included)",
                  box=box.SIMPLE_HEAD, title_justify="left")
    for col in ("implementation", "max |Δ|", "mean |Δ|", "decode", "resize"):
        table.add_column(col, justify="right" if "Δ" in col else "left")
    info = report.setup.get("preprocess", {})
    for c in report.candidates:
        if c.pixels is not None:
            p = info.get(c.name, {})
            table.add_row(escape(c.name), f"{c.pixels.max_abs:.4g}", f"{c.pixels.mean_abs:.4g}",
                          escape(str(p.get("decode", "-"))), escape(str(p.get("resize", "-"))))
    return table


def _detections(report: ParityReport) -> Table:
    first = report.candidates[0].detections if report.candidates else None
    title = "detections vs the reference (greedy pairing per image and class"
    if first is not None:
        title += f", IoU >= {first.iou}, score >= {first.conf})"
    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left")
    for col in ("run", "matched", "unmatched ref", "unmatched run", "mean |Δconf|", "p95", "max"):
        table.add_column(col, justify="left" if col == "run" else "right")
    for c in report.candidates:
        d = c.detections
        stats = d.conf_delta_stats()
        cells = [f"{stats[k]:.4f}" for k in ("mean", "p95", "max")] if stats else ["-"] * 3
        table.add_row(escape(c.name) + (" [dim]· noise floor[/]" if c.noise else ""),
                      f"{d.matched}/{max(d.detections_a, d.detections_b)} ({d.matched_share:.1%})",
                      str(d.unmatched_a), str(d.unmatched_b), *cells)
    return table


def _metrics(report: ParityReport) -> Table:
    table = Table(title=f"COCO bbox metrics; Δ = run - {report.reference}; gated (*) at ±{report.tolerance}",
                  box=box.SIMPLE_HEAD, title_justify="left")
    table.add_column("metric")
    table.add_column(escape(report.reference), justify="right")
    for c in report.candidates:
        table.add_column("Δ " + escape(c.name), justify="right")
    for key in STAT_NAMES:
        row = [key + (" *" if key in GATED else ""), f"{report.reference_metrics[key]:.4f}"]
        for c in report.candidates:
            d = report.deltas(c)[key]
            over = key in GATED and abs(d) > report.tolerance
            row.append(f"[red]{d:+.4f}[/]" if over else f"{d:+.4f}")
        table.add_row(*row)
    return table


def render_parity(report: ParityReport) -> RenderableType:
    """Everything a reader needs to tell a real delta from noise."""
    floor = report.noise_floor()
    lines = [f"noise floor (the reference against itself, gated metrics): max |Δ| {floor:.4f}"]
    lines += [f"[yellow]note[/]: {escape(n)}" for n in report.notes()]
    failures = report.failures()  # the verdict last: what a script reading the last line takes
    if failures:
        lines += [f"[red]FAIL[/] {escape(f)}" for f in failures]
    else:
        lines.append(f"[green]OK[/] every gated delta is within ±{report.tolerance}")
    return Group(_header(report), _pixels(report), _detections(report), _metrics(report), *lines)
