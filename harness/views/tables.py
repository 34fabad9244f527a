"""The end-of-run summary: rich tables that fit 80 columns for people, a dict for --json.

One small table per group (model, backend, precision, input size), one row per batch size, every
cell of the run listed with its status; the reasons of cells that did not finish ok follow it.
"""

from __future__ import annotations

from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table

from harness import shell
from harness.figures import count_of
from harness.measure.stats import percent
from harness.records import CellRecord, LoadKey
from harness.views.text import escape


def stage_split(record: CellRecord) -> str:
    """Stage split of the batch time in %, preprocess/forward/postprocess, e.g. '8/80/12'; the forward's share
    includes the input's transfer to the device (as the submission's inference_ms does)."""
    t = record.timing
    total = t.batch_ms.mean
    parts = []
    for names in (("preprocess",), ("transfer", "forward"), ("postprocess",)):
        stages = [t.stages_ms[n] for n in names if n in t.stages_ms]
        parts.append(f"{100 * sum(s.mean for s in stages) / total:.0f}" if stages and total > 0 else "-")
    return "/".join(parts)


def _invariance(record: CellRecord) -> str:
    inv = record.invariance
    if inv is None:
        return "-"
    if inv.report is None:
        return "ref"
    rate = inv.report.match_rate
    return percent(rate, 1, "down" if rate < 1 else "nearest")  # 99.96 % is not shown as 100.0 %


# Columns of a group table, dropped in this order while the table is wider than the console.
DROP_ORDER = ("J/img", "RAM MB", "p95 ms", "split %")


def _map(record: CellRecord) -> str:
    value = record.accuracy.stats.get("mAP_50_95") if record.accuracy else None
    if value is None:  # undefined (no ground truth among the images scored), or not scored (random weights)
        return "-"
    return f"{value:.4f}" + ("!" if int8_failing(record) else "")


def int8_failing(record: CellRecord) -> str | None:
    """Why an int8 cell fails its accuracy rule (< 99 % of the fp32 mAP), None when it does not."""
    reference = record.accuracy.reference if record.accuracy else None
    return reference.get("failing") if isinstance(reference, dict) else None


def failing_rows(records: list[CellRecord]) -> list[str]:
    """The cells that ran (status ok) whose rows fail a publication rule: int8 below 99 % of its fp32 mAP (the run
    exits 1; validate calls the row an error)."""
    return [r.cell.label for r in records if int8_failing(r)]


def _group_rows(statuses: list, records: dict[str, CellRecord], energy: bool) -> list[dict[str, str]]:
    rows = []
    for status in statuses:
        r = records.get(status.cell.label)
        row = {"batch": str(status.cell.batch_size),
               "status": status.state if r is not None or status.state != "ok" else "ok*"}
        if r is not None:
            t = r.timing
            row.update({"img/s": f"{t.images_per_s:.1f}", "p50 ms": f"{t.batch_ms.p50:.2f}",
                        "p95 ms": f"{t.batch_ms.p95:.2f}", "split %": stage_split(r),
                        "mAP": _map(r),
                        "b-inv": _invariance(r),
                        "RAM MB": f"{r.memory['peak_ram_mb']:.0f}" if r.memory.get("peak_ram_mb") is not None else "-"})
            if energy:
                row["J/img"] = f"{r.energy['joules_per_image']:.3g}" if r.energy.get("status") == "ok" else "-"
        rows.append(row)
    return rows


def group_table(key: LoadKey, statuses: list, records: dict[str, CellRecord], width: int = 80) -> Table:
    """One group's cells: status, throughput, latency, stage split (pre/fwd/post), mAP, batch invariance,
    peak RAM, energy; columns are dropped (least useful first) until the table fits `width`."""
    energy = any((r.energy or {}).get("status") == "ok" for r in records.values())
    columns = ["batch", "status", "img/s", "p50 ms", "p95 ms", "split %", "mAP", "b-inv", "RAM MB"]
    columns += ["J/img"] if energy else []
    rows = _group_rows(statuses, records, energy)
    mine = [records[s.cell.label] for s in statuses if s.cell.label in records]
    impls = sorted({str(r.runtime["preprocess"].get("implementation")) for r in mine
                    if r.runtime.get("preprocess")})  # --preprocess, as recorded
    converters = sorted({str(r.runtime["conversion"].get("converter")).split(" ")[0] for r in mine
                         if isinstance(r.runtime.get("conversion"), dict)})  # the model the runtime ran was made by
    title = escape(" · ".join([key.model, key.backend, key.precision, key.label.rsplit(" ", 1)[1]]
                              + [f"via {'/'.join(converters)}"] * bool(converters)
                              + [f"preprocess {'/'.join(impls)}"] * bool(impls)))
    dropped: list[str] = []
    while True:
        table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, padding=(0, 1), pad_edge=False,
                      collapse_padding=True)
        for col in columns:
            table.add_column(col, justify="left" if col == "status" else "right", no_wrap=True)
        for row in rows:
            table.add_row(*(row.get(col, "-") for col in columns))
        needed = sum(max([len(col)] + [len(row.get(col, "-")) for row in rows]) for col in columns)
        needed += 3 * (len(columns) - 1)  # what SIMPLE_HEAD puts between columns
        droppable = [c for c in DROP_ORDER if c in columns]
        if needed <= width or not droppable:
            break
        columns.remove(droppable[0])
        dropped.append(droppable[0])
    table.caption = ("p50/p95: ms per batch; split %: preprocess/forward (with the transfer)/postprocess share of "
                     "the batch time")
    if any(r.timing.mode == "overlapped" for r in mine):
        table.caption = ("overlapped: p50/p95 ms per batch from its start to its result, queueing included; img/s "
                         "over the stream; split %: each stage's share of the batch time (stages overlap)")
    if any(r.accuracy is not None and "segm" in r.accuracy.iou_types for r in mine):
        table.caption += "; mAP: of the masks (--json: bbox_mAP_50_95 for the boxes)"
    if any(row.get("mAP", "").endswith("!") for row in rows):
        table.caption += "; mAP!: int8 keeps < 99 % of fp32's mAP, or was not compared (failing)"
    if mine and all(r.accuracy is None for r in mine):
        reasons = sorted({str(r.accuracy_reason) for r in mine if r.accuracy_reason})
        table.caption += f"; mAP -: {'; '.join(reasons) or 'not scored'}"
    if dropped:
        table.caption += f"; not shown for width: {', '.join(dropped)} (see --json)"
    table.caption_justify = "left"
    return table


def probe_lines(records: list[CellRecord], top: int = 6) -> list[str]:
    """One line per probe result worth reading: layer types, profiler top ops, why energy is missing."""
    lines = []
    for r in records:
        if r.layers and "by_type_top" in r.layers:
            types = ", ".join(f"{t['layer_type']} {t['share_pct']:.0f}%" for t in r.layers["by_type_top"][:top])
            cover = ", ".join(f"{c:.2f}" for c in r.layers["layer_sum_over_forward"])
            lines.append(f"time per layer type ({r.cell.label}): {types}  [layer sum / forward: {cover}]")
        elif r.layers and r.layers.get("status") == "unavailable":
            lines.append(f"per-layer timing unavailable ({r.cell.label}): {r.layers['reason']}")
        if r.profiler and "top_ops" in r.profiler:
            ops = ", ".join(f"{o['name']} {o.get('self_cpu_ms', 0):.1f} ms" for o in r.profiler["top_ops"][:top])
            lines.append(f"profiler top self-CPU ops ({r.cell.label}): {ops}  -> {r.profiler['trace']}")
    reasons = {r.energy.get("reason") for r in records if r.energy and r.energy.get("status") != "ok"}
    for reason in sorted(filter(None, reasons)):
        lines.append(f"energy unavailable: {reason}")
    return lines


def interval_lines(records: list[CellRecord]) -> list[str]:
    """--map-ci: each scored cell's interval of mAP 50:95 over its images (or why there is none)."""
    lines = []
    for r in records:
        interval = r.accuracy.map_interval if r.accuracy else None
        if not interval:
            continue
        bounds = interval.get("mAP_50_95")
        level = f"{100 * interval['level']:g} %"
        if bounds:  # a short line: the label is already half of 80 columns
            lines.append(f"{r.cell.label}: mAP {level} CI {bounds[0]:.4f}-{bounds[1]:.4f} ({interval['images']} "
                         "images)")
        else:
            lines.append(f"{r.cell.label}: no {level} interval of mAP: {interval.get('reason', 'not drawn')}")
    return lines


def run_warnings(records: list[CellRecord]) -> list[str]:
    """Timing warnings per cell, int8 cells failing their accuracy rule and batch invariance below 99 %."""
    out = []
    for r in records:
        out += [f"{r.cell.label}: {w}" for w in r.timing.warnings]
        if int8_failing(r):
            out.append(f"{r.cell.label}: {int8_failing(r)}")
        if shortfall := (r.runtime.get("quantization") or {}).get("calibration_shortfall"):
            out.append(f"{r.cell.label}: {shortfall}")
        inv = r.invariance
        if inv is not None and inv.report is not None and inv.report.match_rate < 0.99:
            out.append(f"{r.cell.label}: batch invariance {percent(inv.report.match_rate, 2, 'down')} < 99% against "
                       f"batch {inv.reference_batch_size}: detections depend on the batch size")
    return out


def print_summary(console: Console, outcome) -> None:
    """Everything a person reads at the end of `va-bench run`."""
    state, records = outcome.state, {r.cell.label: r for r in outcome.records}
    groups: dict[LoadKey, list] = {}
    for status in state.cells.values():
        groups.setdefault(status.cell.load, []).append(status)
    for key, statuses in groups.items():
        console.print(group_table(key, statuses, records, console.width))
    if any(s.state == "ok" and s.cell.label not in records for s in state.cells.values()):
        console.print("ok* finished by an earlier process of this run (see its submission)", highlight=False)
    for label, problem in outcome.problems.items():
        console.print(f"[red]{escape(label)}[/]: {escape(problem)}", highlight=False)
    for failure in getattr(outcome, "repeat_failures", []):
        console.print(f"[red]--repeats[/]: {escape(failure)}: its samples are missing", highlight=False)
    for line in interval_lines(outcome.records) + probe_lines(outcome.records):
        console.print(escape(line), highlight=False)
    for line in server_lines([(r.cell.label, r.server) for r in outcome.records]):
        console.print(escape(line), highlight=False)
    for label, block in getattr(outcome, "repeats", {}).items():
        console.print(escape(repeats_line(label, block)), highlight=False)
    for line in run_warnings(outcome.records):
        console.print(f"[yellow]warning[/]: {escape(line)}", highlight=False)
    counts = ", ".join(f"{n} {s}" for s, n in state.counts().items())
    failing = failing_rows(outcome.records)
    counts += f" ({len(failing)} failing the int8 accuracy rule)" if failing else ""
    console.print(f"cells: {counts}; artifacts: {escape(str(state.run_dir))}", highlight=False)
    if outcome.problems:
        console.print(f"errors.log in the run folder has the tracebacks; re-run what failed with: va-bench run "
                      f"--resume {escape(state.run_id)} --output-dir {escape(shell.quote(str(state.run_dir.parent)))} "
                      "--retry-failed", highlight=False)


def repeats_line(label: str, block: dict) -> str:
    """--repeats: a cell's median batch time in each process and their spread (none with one process)."""
    medians = " / ".join(f"{v:.2f}" for v in block["batch_ms_p50"])
    spread = (f"spread {block['spread_pct']:.1f} %" if block.get("spread_pct") is not None
              else f"no spread: {block.get('spread_reason', 'unavailable')}")
    return f"{label}: p50 ms/batch in {block['processes']} processes: {medians} ({spread})"


def server_lines(cells: list[tuple[str, dict | None]]) -> list[str]:
    """--scenario server: each cell's (label, its submission's `server` block) trial at --qps and the rate
    --find-max-qps found."""
    lines = []
    for label, block in cells:
        server = block or {}
        bound = server.get("latency_bound_ms")
        if server.get("at_qps"):
            t = server["at_qps"]
            verdict = "held" if t["bound_held"] else "NOT held"
            lines.append(f"{label}: server at {t['qps']:g} qps: p99 {t['latency_ms']['p99']:.1f} ms against "
                         f"{bound:g} ms, {verdict} (p50 {t['latency_ms']['p50']:.1f} ms"
                         + (f", {t['achieved_qps']:.2f} qps achieved)" if t.get("achieved_qps") is not None else ")"))
        if "max_qps" in server:
            found = server["max_qps"]
            lines.append(f"{label}: highest rate holding p99 <= {bound:g} ms: "
                         + (f"{found:g} qps" if found is not None else server["search"]["why_none"])
                         + f" ({len(server['search']['trials'])} trials)")
    return lines


def earlier_figures(path: Path) -> dict:
    """A cell an earlier process of the run finished (`ok*`): the figures `summary_json` gives a cell run now, read
    from its submission, and `finished_earlier`; `unavailable` with why where the file cannot be read."""
    from harness.results.reader import lookup, read_json

    doc, problem = read_json(path)
    if problem is not None or not isinstance(doc, dict):
        why = problem.message if problem is not None else "not an object"
        return {"finished_earlier": True, "unavailable": f"its submission cannot be read ({why})"}
    iou_types = lookup(doc, "eval.iouType") or []
    scored = lookup(doc, "eval.status") == "ok"
    stages = lookup(doc, "timing.stages_ms") or {}
    return {"finished_earlier": True,
            "mode": lookup(doc, "timing.mode"),
            "preprocess": lookup(doc, "runtime.preprocess"),
            "images_per_s": lookup(doc, "throughput.images_per_s"),
            "batch_ms": lookup(doc, "timing.batch_ms"),
            "image_ms_p50": lookup(doc, "timing.per_image_ms.p50"),
            "stages_ms_mean": {k: v.get("mean") for k, v in stages.items() if isinstance(v, dict)},
            "mAP_50_95": lookup(doc, "accuracy.mAP_50_95") if scored else None,
            "scored": ("masks" if "segm" in iou_types else "boxes") if scored else None,
            **({"bbox_mAP_50_95": lookup(doc, "accuracy.bbox_mAP_50_95")} if scored and "segm" in iou_types else {}),
            **({"map_ci": lookup(doc, "eval.map_ci")} if lookup(doc, "eval.map_ci") else {}),
            "batch_invariance": doc.get("batch_invariance"),
            "warnings": lookup(doc, "timing.warnings") or [],
            **{k: doc.get(k) for k in ("memory", "energy", "layers", "profiler")},
            **({"server": doc["server"]} if doc.get("server") is not None else {}),
            **({"repeats": lookup(doc, "timing.repeats")} if lookup(doc, "timing.repeats") else {})}


def summary_json(run_dir: Path, outcome) -> dict:
    """The run summary for scripts: every cell's status and its figures (a cell an earlier process of the run
    finished: read from its submission, `finished_earlier`)."""
    records = {r.cell.label: r for r in outcome.records}
    cells = []
    for label, status in outcome.state.cells.items():
        entry = status.to_dict()
        if status.submission:
            entry["submission"] = str(run_dir / status.submission)
        r = records.get(label)
        if r is not None:
            t = r.timing
            entry.update({
                "mode": t.mode,
                "preprocess": r.runtime.get("preprocess"),
                "images_per_s": round(t.images_per_s, 3),
                "batch_ms": t.batch_ms.to_dict(),
                "image_ms_p50": round(t.image_ms.p50, 4),
                "stages_ms_mean": {k: round(v.mean, 4) for k, v in t.stages_ms.items()},
                "mAP_50_95": r.accuracy.stats["mAP_50_95"] if r.accuracy else None,
                # what mAP_50_95 scores: a segmentation cell's is of masks, its boxes' beside it
                "scored": ("masks" if "segm" in r.accuracy.iou_types else "boxes") if r.accuracy else None,
                **({"bbox_mAP_50_95": r.accuracy.stats.get("bbox_mAP_50_95")}
                   if r.accuracy and "segm" in r.accuracy.iou_types else {}),
                **({"map_ci": r.accuracy.map_interval} if r.accuracy and r.accuracy.map_interval else {}),
                "batch_invariance": r.invariance.to_dict() if r.invariance else None,
                "warnings": t.warnings,
                "memory": r.memory,
                "energy": r.energy,
                "layers": r.layers,
                "profiler": r.profiler,
            })
        elif status.state == "ok" and status.submission:  # finished by an earlier process: its submission's figures
            entry.update(earlier_figures(run_dir / status.submission))
        if r is not None and r.server is not None:
            entry["server"] = r.server
        if label in getattr(outcome, "repeats", {}):
            entry["repeats"] = outcome.repeats[label]
        cells.append(entry)
    return {"run_id": outcome.state.run_id, "run_dir": str(run_dir), "cells": cells,
            "counts": outcome.state.counts(), "failing_rows": failing_rows(outcome.records),
            "warnings": run_warnings(outcome.records) + [f"--repeats: {f}: its samples are missing"
                                                         for f in getattr(outcome, "repeat_failures", [])]}


def print_plan(console: Console, plan: dict) -> None:
    """`run --dry-run`: the cells in the order they run, and what each group loads."""
    d = plan["dataset"]
    lines = [f"plan {escape(plan['run_id'])}: {escape(d['id'])} {escape(d['split'])} {escape(d['variant'])} "
             f"({d['num_images']} images), {count_of(plan['num_cells'], 'cell')} on {escape(plan['device'])}",
             f"each cell's warm-up: >= {plan['warmup']['batches']} batches, then until the batch times settle",
             f"  or {plan['warmup']['seconds']} s since it began; evaluation: {plan['evaluation'] or 'off'}",
             f"nothing written (a run writes {escape(plan['run_dir'])})"]
    timing = plan.get("timing") or {}
    if timing.get("min_seconds") is not None:  # the batch counts below are then the least a cell times
        lines.insert(3, f"each cell's timed pass: >= {timing['min_seconds']:g} s (timed below: at least)")
    if timing.get("target_ci") is not None:
        lines.insert(3, f"each cell's timing goes on until the median's 95 % CI is within +-{timing['target_ci']:g} %")
    lines += [escape(w) for w in plan.get("warnings", [])]
    for line in lines:  # short lines: the plan reads in 80 columns (a long run folder path may still wrap)
        console.print(line, highlight=False)
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
    for col, justify in (("cell", "left"), ("batches", "right"), ("timed", "right"), ("loads", "left")):
        table.add_column(col, justify=justify)
    for group in plan["groups"]:
        for i, cell in enumerate(group["cells"]):
            short = f" + 1 of {cell['short_batch']}" if cell["short_batch"] else ""
            table.add_row(escape(cell["cell"]), f"{cell['full_batches']}{short}", str(cell["timed_batches"]),
                          escape(f"{group['loads']} ({group['weights']} weights)") if i == 0 else "")
    console.print(table)
