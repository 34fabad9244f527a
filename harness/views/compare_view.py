"""Rich rendering of a `va-bench compare` result; every table fits 80 columns."""

from __future__ import annotations

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from harness.figures import count_of, shown_apart
from harness.results.compare import COORDS, CellDelta, Comparison
from harness.results.compare_gates import DeltaGateResult
from harness.views.text import escape, printable

LABELS = dict(COORDS)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1%}"


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _verdict(cell: CellDelta) -> str:
    s = cell.significance
    across = {"processes": f" ({s.n_a} vs {s.n_b} processes)", "batch means": " (block means)"}.get(s.basis, "")
    if s.verdict in ("slower", "faster"):
        p = "p<0.001" if s.p_value < 0.001 else f"p={shown_apart(s.p_value, s.alpha, 3)}"
        color = "red" if s.verdict == "slower" else "green"
        return f"[{color}]{s.verdict} ×{s.ratio:.2f}[/] {p}{across}"
    if s.verdict == "no significant change":
        return "no significant change" + across
    return f"[yellow]{s.verdict}[/]{across}"


def _header(c: Comparison) -> list[RenderableType]:
    lines = [Text.assemble(("A  ", "bold"), printable(c.a)), Text.assemble(("B  ", "bold"), printable(c.b))]
    if c.same:
        same = " · ".join(f"{LABELS[k]} {v}" for k, v in c.same.items())
        lines.append(Text.assemble(("same    ", "bold"), printable(same)))
    for k, (va, vb) in c.differ.items():
        lines.append(Text.assemble(("differ  ", "bold"), printable(f"{LABELS[k]}: {va} → {vb}")))
    for name, cells in (("only A", c.only_a), ("only B", c.only_b)):
        if cells:
            lines.append(Text.assemble((f"{name}  ", "bold yellow"), printable(", ".join(cells))))
    return lines


def _accuracy(c: Comparison) -> list[RenderableType]:
    out: list[RenderableType] = []
    for acc in c.accuracy:
        if acc.unavailable:
            out.append(Text(printable(f"accuracy {acc.label} unavailable: {acc.unavailable}")))
            continue
        scored = " (masks; bbox_*: boxes)" if acc.of == "masks" else ""
        table = Table(title=f"accuracy {escape(acc.label)}{scored}", box=box.SIMPLE_HEAD, title_justify="left")
        for col in ("metric", "A", "B", "Δ B−A"):
            table.add_column(col, justify="left" if col == "metric" else "right")
        for name in acc.names:
            a, b, d = acc.a.get(name), acc.b.get(name), acc.delta(name)
            table.add_row(name, "-" if a is None else f"{a:.4f}", "-" if b is None else f"{b:.4f}",
                          "-" if d is None else f"{d:+.4f}")
        out.append(table)
        out.extend(_delta_interval(acc))
        # a class with AP on one side only changed too; one with AP on neither has nothing to show
        changed = [row for row in acc.per_class if row["delta"] != 0 and (row["a"], row["b"]) != (None, None)]
        if acc.per_class_unavailable:  # no file on a side; or classes that share an id only (the rest compare)
            out.append(Text(printable(f"per class AP 50:95 {acc.label}: not compared ({acc.per_class_unavailable})")))
        if acc.per_class and not changed:
            out.append(Text(printable(f"per class AP 50:95 {acc.label}: no class changed (of "
                                      f"{len(acc.per_class)})")))
        elif changed:
            shown = min(PER_CLASS_ROWS, len(changed))
            moved = Table(title=f"per class AP 50:95 {escape(acc.label)}: the {shown} largest changes "
                                f"({len(changed)} of {len(acc.per_class)} classes changed)", box=box.SIMPLE_HEAD,
                          title_justify="left")
            for col in ("class", "A", "B", "Δ B−A"):
                moved.add_column(col, justify="left" if col == "class" else "right")
            for row in changed[:PER_CLASS_ROWS]:
                moved.add_row(escape(str(row["name"] or row["id"])), *("-" if row[k] is None else f"{row[k]:.4f}"
                                                                       for k in ("a", "b")),
                              "-" if row["delta"] is None else f"{row['delta']:+.4f}")
            out.append(moved)
    return out


def _delta_interval(acc) -> list[RenderableType]:
    """The paired bootstrap interval of the mAP deltas (compare --map-ci), or why there is none: "not chance" where
    it excludes 0 (the difference is not an accident of the images drawn), "may be chance" where it holds 0."""
    if acc.delta_interval_unavailable:
        return [Text(printable(f"mAP delta interval {acc.label}: unavailable ({acc.delta_interval_unavailable})"))]
    ci = acc.delta_interval
    if not ci:
        return []
    lines = []
    for name in ("mAP_50_95", "mAP_50"):
        bounds, delta = ci.get(name), acc.delta(name)
        if bounds is None:
            why = next((p for p in str(ci.get("reason", "")).split("; ") if p.startswith(f"{name}:")), name)
            lines.append(Text(printable(f"Δ{name} {'' if delta is None else f'{delta:+.4f} '}interval: none "
                                        f"({why.split(': ', 1)[-1]})")))
            continue
        lo, hi = bounds
        verdict = "not chance" if lo > 0 or hi < 0 else "may be chance"  # of the images drawn
        lines.append(Text(printable(f"Δ{name} {'' if delta is None else f'{delta:+.4f}, '}"
                                    f"{100 * ci['level']:.0f} % [{lo:+.4f}, {hi:+.4f}] over {ci['images']} images: "
                                    f"{verdict}")))
    return lines


PER_CLASS_ROWS = 10


def _detections(c: Comparison) -> list[RenderableType]:
    rows = [r for r in c.detections if r.diff is not None]
    out: list[RenderableType] = []
    if rows:
        d0 = rows[0].diff
        images = {r.diff.images for r in rows}
        where = f" ({images.pop()} images)" if len(images) == 1 else ""
        iou = "mask IoU" if d0.iou_type == "segm" else "IoU"
        table = Table(title=f"detections{where}: score >= {d0.conf:g}, same class, {iou} >= {d0.iou:g}, greedy",
                      box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False, collapse_padding=True)
        widest = max(len(r.label) for r in rows)
        table.caption, table.caption_justify = "Δconf: mean |score A - score B| of the matched pairs", "left"
        for col in ("cells", "A", "B", "matched", "only A", "only B", "Δconf", "p95", "max"):  # a long label
            table.add_column(col, justify="left" if col == "cells" else "right",  # folds, never cut ("openvin…")
                             overflow="fold" if col == "cells" else "ellipsis", no_wrap=col != "cells",
                             min_width=min(widest, 16) if col == "cells" else None)
        for r in rows:
            d, s = r.diff, r.diff.conf_delta_stats()
            stats = [f"{s[k]:.1e}" for k in ("mean", "p95", "max")] if s else ["-"] * 3
            table.add_row(escape(r.label), str(d.detections_a), str(d.detections_b), f"{d.matched_share:.2%}",
                          str(d.unmatched_a), str(d.unmatched_b), *stats)
        out.append(table)
    out += [Text(printable(f"detections {r.label} unavailable: {r.unavailable}")) for r in c.detections
            if r.diff is None]
    return out


def _performance(c: Comparison) -> list[RenderableType]:
    if not c.cells:
        return []
    table = Table(title="performance: ms per image; Δ = B/A − 1", box=box.SIMPLE_HEAD, title_justify="left",
                  pad_edge=False)
    for col in ("cell", "p50 A", "p50 B", "Δp50", "Δp95", "Δimg/s", "verdict (samples)"):
        table.add_column(col, justify="left" if col in ("cell", "verdict (samples)") else "right",
                         overflow="fold" if col in ("cell", "verdict (samples)") else "ellipsis",
                         no_wrap=col not in ("cell", "verdict (samples)"))
    for cell in c.cells:
        table.add_row(escape(cell.label), _ms(cell.p50_a), _ms(cell.p50_b), _pct(cell.change("p50")),
                      _pct(cell.change("p95")), _pct(cell.change("ips")), _verdict(cell))
    out: list[RenderableType] = [table]
    g, n = c.geomean(), c.geomean_cells()
    means = []
    if g["p50"] is not None:
        means.append(f"latency p50 ×{g['p50']:.3f} over {count_of(n['p50'], 'cell')}")
    if g["ips"] is not None:
        means.append(f"images/s ×{g['ips']:.3f}" + (f" over {n['ips']}" if n["ips"] != n["p50"] else ""))
    if means:
        out.append(Text("geometric mean of B/A: " + ", ".join(means)))
    cells_of: dict[str, list[str]] = {}  # a reason shared by several cells is said once, naming them
    for cell in c.cells:
        if cell.significance.reason:
            cells_of.setdefault(cell.significance.reason, []).append(cell.label)
    out += [Text(printable(f"verdict {', '.join(labels)}: {reason}"), style="yellow")
            for reason, labels in sorted(cells_of.items())]
    bases = {cell.significance.basis for cell in c.cells}
    if "batches" in bases:
        out.append(Text("verdicts weigh each run's own batch samples (Mann-Whitney U and a bootstrap CI of the "
                        "ratio of medians); drift between processes is not in them: repeat runs to see it",
                        style="dim"))
    if "batch means" in bases:
        out.append(Text("verdicts marked (block means): those batch times drift together (lag-1 autocorrelation "
                        "beyond chance), so the means of blocks of sqrt(n) batches (n: the smaller side) were tested "
                        "instead, and the ratio is of their medians", style="dim"))
    if "processes" in bases:
        out.append(Text("verdicts marked (N vs M processes) weigh the --repeats processes' medians (Mann-Whitney U "
                        "and a bootstrap CI of the ratio of medians), drift between processes included; p50 and "
                        "the deltas beside them are the first process's", style="dim"))
    return out


def render_comparison(c: Comparison) -> Group:
    """Header, accuracy tables, detection diff, performance table, notes."""
    notes = [Text(printable(f"note: {n}"), style="dim") for n in c.notes]
    return Group(*_header(c), *_accuracy(c), *_detections(c), *_performance(c), *notes)


def render_gates(results: list[DeltaGateResult]) -> Group:
    """One line per --fail-on gate."""
    style = {"ok": "green", "failed": "bold red", "unchecked": "bold red"}
    return Group(*[Text.assemble(("gate ", "bold"), printable(f"{r.gate.spec}: "), (r.status.upper(), style[r.status]),
                                 printable(f" ({r.detail})")) for r in results])


def comparisons_json(comparisons: list[Comparison], results: list[list[DeltaGateResult]], failed: bool) -> dict:
    return {"comparisons": [c.to_dict() | {"gates": [r.to_dict() for r in rs]}
                            for c, rs in zip(comparisons, results, strict=True)], "failed": failed}


def print_comparisons(console, comparisons: list[Comparison], results: list[list[DeltaGateResult]]) -> None:
    for i, (c, rs) in enumerate(zip(comparisons, results, strict=True)):
        if i:
            console.print()
        console.print(render_comparison(c), highlight=False)
        if rs:
            console.print(render_gates(rs), highlight=False)
