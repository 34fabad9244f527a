"""What the small commands print: validate, aggregate, campaign, hw, models list, report, and a run's header."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table

from harness.figures import count_of
from harness.views.text import escape


def run_header(console: Console, run_id: str, plan, resuming: bool, where: str, prefix: str = "") -> None:
    """The line a run (or a fleet run) starts with: its id, dataset (a dataset other than COCO val2017 named with its
    split, as the plan names it), variant, cells and where they run."""
    described = plan.dataset.describe()
    named = "" if described["id"] in ("coco2017", "synthetic") else f"{described['id']} {described['split']} "
    console.print(f"{prefix}{'resuming' if resuming else 'run'} [bold]{escape(run_id)}[/]: "
                  f"{escape(named + plan.variant.name)} ({plan.variant.num_images} images), "
                  f"{count_of(len(plan.cells), 'cell')} on {escape(where)}", highlight=False)


def validation_json(validation) -> dict:
    reports = validation.reports
    return {"files": len(reports), "files_with_errors": sum(1 for r in reports if r.errors),
            "errors": sum(len(r.errors) for r in reports),
            "warnings": sum(f.severity == "warning" for r in reports for f in r.findings), "notes": validation.notes,
            "reports": [r.to_dict() for r in reports]}


def print_notes(console: Console, notes: list[str]) -> None:
    for note in notes:
        console.print(f"note: {escape(note)}", highlight=False)  # wrapped at the console's width


def print_validation(console: Console, validation, warnings: bool) -> None:
    """Every finding (warnings too unless told not to), then one line of totals."""
    reports = validation.reports
    print_notes(console, validation.notes)
    for r in reports:
        for f in r.findings:
            if f.severity == "error" or warnings:
                color = "red" if f.severity == "error" else "yellow"
                console.print(f"[{color}]{f.severity}[/] {escape(str(r.path))}: {escape(f.path)}: "
                              f"{escape(f.message)} [dim]({f.rule})[/]", highlight=False, soft_wrap=True)
    n_errors = sum(len(r.errors) for r in reports)
    bad_files = sum(1 for r in reports if r.errors)
    n_warn = sum(1 for r in reports for f in r.findings if f.severity == "warning")
    console.print(f"{len(reports)} files: {bad_files} with errors ({n_errors} errors), {n_warn} warnings")


def print_leaderboard(console: Console, board: dict, notes: list[str], output) -> None:
    """The leaderboard (and the segmentation board when it has rows), its agreement gate, size order and RF100-VL
    tables, then the counts."""
    from harness.views.leaderboard import WIDTH, gate_table, leaderboard_table, rf100vl_table, size_order_table

    def wide(table) -> None:  # laid out for 80 columns: a narrower terminal wraps the lines, never cuts a figure
        narrow = console.width
        console.width = max(narrow, WIDTH)  # print(width=) is capped at the console's own width
        try:
            console.print(table, crop=False)
        finally:
            console.width = narrow

    print_notes(console, notes)
    wide(leaderboard_table(board))
    if board.get("segmentation_leaderboard"):
        wide(leaderboard_table(board, which="segmentation"))
    if board["agreement_gate"]:
        wide(gate_table(board))
    if board["size_order"]:
        wide(size_order_table(board))
    if board["rf100vl"]:
        wide(rf100vl_table(board))
    c = board["counts"]
    why = [f"{c['not_submissions']} not submissions"] if c["not_submissions"] else []
    why += [f"{c['by_site_rules']} by the site's rules"] if c["by_site_rules"] else []
    unpublishable = sorted({r for e in board["excluded"] if e["submission"] and not e["by_site_rules"]
                            for r in e["rules"]})
    why += [f"{c['unpublishable']} by va-bench's rules ({', '.join(unpublishable)})"] if c["unpublishable"] else []
    console.print(f"{c['files']} files, {c['included']} included, {c['excluded']} excluded"
                  + (f" ({', '.join(why)})" if why else "") + ", "
                  f"{c['rows']} rows, {c['superseded']} superseded, {c['gate_findings']} agreement-gate findings, "
                  f"{c['size_order_findings']} size-order findings"
                  + (f"; written to {output}" if output else ""))


def _variant(block: dict) -> str:
    """fullN or partialN, N the datasets scored: the site's rule, the count alone."""
    scored = len(block["datasets"])
    return f"{'full' if scored == block['protocol']['expected_datasets'] else 'partial'}{scored}"


def campaign_json(path, doc: dict, results) -> dict:
    """What `campaign` prints, for scripts: the row's file, whether the site takes it and why not, each skipped
    dataset with its reason."""
    block = doc["rf100vl"]
    reasons = {r.name: None if r.reason is None else str(r.reason) for r in results}
    return {"submission": str(path), "valid_submission": block["valid_submission"], "variant": _variant(block),
            "invalid_reasons": block["invalid_reasons"], "skipped_datasets": block["skipped_datasets"],
            "skipped": [{"name": n, "reason": reasons.get(n)} for n in block["skipped_datasets"]],
            "accuracy": doc["accuracy"], "datasets": block["datasets"]}


def print_campaign(console: Console, path, doc: dict, results) -> None:
    block = doc["rf100vl"]
    scored, expected = len(block["datasets"]), block["protocol"]["expected_datasets"]
    listed = len(results) or scored  # the datasets the campaign named, scored or skipped
    lists = f" (the campaign lists {listed})" if listed != expected else ""
    console.print(f"{scored} of {expected} datasets scored{lists} ({_variant(block)}): mean mAP 50:95 "
                  f"{doc['accuracy']['mAP_50_95']:.4f}; {escape(str(path))}", highlight=False)
    for name in block["skipped_datasets"]:
        reason = next(r.reason for r in results if r.name == name)
        console.print(f"skipped {escape(name)}: {escape(str(reason))}", highlight=False)
    said = {f"{scored} of {expected} datasets scored", *(f"{n}: " for n in block["skipped_datasets"])}
    for reason in block["invalid_reasons"]:  # what else keeps the row from being valid (e.g. mixed hardware)
        if not any(reason.startswith(s) for s in said):
            console.print(f"not valid: {escape(reason)}", highlight=False)


def print_hw(console: Console, report: dict) -> None:
    h = report["hardware"]
    console.print(f"hardware.id [bold]{escape(h['id'])}[/]: {escape(h['cpu'])} ({h['cpu_cores']} logical CPUs, "
                  f"governor {escape(report['cpu']['governor'])}), {h['ram_gb']} GiB RAM, GPU {escape(h['gpu'])}")
    table = Table(title="measurement probes")
    for col in ("probe", "status", "detail"):
        table.add_column(col, overflow="fold")  # a reason's path whole, folded, never cut with an ellipsis
    for name, p in report["probes"].items():
        detail = p.get("reason") or p.get("method") or ", ".join(p.get("providers", []))
        color = "green" if p["status"] == "ok" else "yellow"
        table.add_row(name, f"[{color}]{p['status']}[/]", escape(str(detail)))
    console.print(table)


NOTES_FROM_WIDTH = 120  # narrower, a note column would wrap every row to a word a line


def models_table(rows: list[dict], width: int) -> Table:
    """The registry: each id whole (it is what commands take), its local weights folded but every character shown;
    the notes where the terminal is wide enough for them (`--json` has them always)."""
    notes = width >= NOTES_FROM_WIDTH
    caption = None if notes else f"notes: --json, or a terminal of {NOTES_FROM_WIDTH} columns"
    table = Table(title="models", caption=caption, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    longest = max((len(r["id"]) for r in rows), default=2)
    table.add_column("id", no_wrap=True, min_width=longest)
    table.add_column("family", no_wrap=True)
    table.add_column("task", no_wrap=True)
    table.add_column("local weights", overflow="fold", ratio=1)
    if notes:
        table.add_column("note", ratio=2)
    for r in rows:
        weights = r["weights"] or ("- (not available here)" if r.get("available") is False
                                   else "- (va-bench models fetch)" if r["fetch"] else "-")
        table.add_row(r["id"], r["family"], r["task"], weights, *([r["note"]] if notes else []))
    return table


def print_report_outcome(console: Console, outcome, log) -> None:
    """Where the report and plots went, plots that could not be drawn, the gates, the log line."""
    from harness.report.gates import NOT_MEASURED

    console.print(f"report: {escape(str(outcome.html))}", highlight=False)
    console.print("plots: " + escape(", ".join(p.name for p in outcome.pngs)), highlight=False)
    for plot in outcome.plots:
        if plot.png is None:
            console.print(f"[yellow]{escape(plot.title)}[/]: {escape(plot.unavailable or '')}", highlight=False)
    if outcome.gates is not None:
        results = outcome.gates
        unmeasured = sum(r.status == NOT_MEASURED for r in results)
        not_met = outcome.gates_not_met
        console.print(f"gates ({escape(outcome.gate_source)}): {len(results) - unmeasured - len(not_met)} met, "
                      f"{len(not_met)} NOT MET, {unmeasured} not measured", highlight=False)
        for r in not_met:
            console.print(f"[red]NOT MET[/] {escape(r.gate.title)} on {escape(r.cell)}: target "
                          f"{escape(r.gate.target_text)}, today {escape(r.today_text())}", highlight=False)
    if log is not None:
        console.print(f"log: appended run {escape(outcome.run_id)} to {escape(str(log))}", highlight=False)


def report_json(outcome, log) -> dict:
    """`va-bench report --json`: the files written, the plots not drawn and why, every gate result (a gate is the
    figure of one cell against its target: the same names as report.html and the log), the log appended to."""
    gates = None if outcome.gates is None else [
        {"gate": r.gate.title, "metric": r.gate.metric, "cell": r.cell, "comparison": r.gate.comparison,
         "target": r.gate.target, "today": r.today, "status": r.status, **({"reason": r.reason} if r.reason else {})}
        for r in outcome.gates]
    return {"run_id": outcome.run_id, "report": str(outcome.html), "plots": [str(p) for p in outcome.pngs],
            "plots_unavailable": {p.name: p.unavailable for p in outcome.plots if p.png is None},
            "gates_file": outcome.gate_source if outcome.gates is not None else None, "gates": gates,
            "gates_failing": [r.gate.title for r in outcome.gates_failing], "log": str(log) if log else None}


MAX_SUMMARY_CATEGORIES = 30  # categories listed on the terminal (--json has them all)


def print_dataset_summary(console: Console, summary) -> None:
    """`va-bench data check`: what the dataset variant holds, as a run reads it, and each category's ground truth
    (and the model's classes scored as it); the categories with the most objects first, at most
    MAX_SUMMARY_CATEGORIES."""
    d = summary.dataset
    lines = [f"{d['id']} {d['split']} {d['variant']}: {summary.images} images ({summary.images_with_objects} with "
             f"objects, {summary.images - summary.images_with_objects} without), {summary.objects} objects, "
             f"{summary.crowd} crowd regions, {len(summary.categories)} categories",
             f"read from {summary.annotation_file} ({summary.annotation_format}; annotations_sha256 "
             f"{(d.get('annotations_sha256') or '?')[:12]})",
             f"images in {summary.image_dir}: "
             + ", ".join(f"{count} {kind}" for kind, count in summary.image_formats.items()),
             f"masks: {summary.with_masks} of {summary.objects + summary.crowd} annotations"
             + (f"; {summary.oriented_images} images turned upright by their EXIF orientation"
                if summary.oriented_images else "")]
    lines += [f"warning: {c['path']} decodes only with errors ({c['problem']})" for c in summary.corrupt_images]
    for line in lines:
        console.print(escape(line), highlight=False)
    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for name in ("id", "category", "objects", "images", "small", "medium", "large", "crowd"):
        table.add_column(name, justify="left" if name == "category" else "right",
                         overflow="fold" if name == "category" else "ellipsis")
    if summary.model is not None:
        table.add_column(f"{summary.model} class", overflow="fold")
    ranked = sorted(summary.categories, key=lambda c: (-c.objects, c.id))
    for c in ranked[:MAX_SUMMARY_CATEGORIES]:
        matched = [", ".join(c.model_classes) or "-"] if summary.model is not None else []
        table.add_row(str(c.id), escape(c.name), str(c.objects), str(c.images), str(c.small), str(c.medium),
                      str(c.large), str(c.crowd), *map(escape, matched))
    console.print(table)
    if len(ranked) > MAX_SUMMARY_CATEGORIES:
        console.print(f"{len(ranked) - MAX_SUMMARY_CATEGORIES} more categories (fewest objects): --json lists them",
                      highlight=False)
    if summary.unscored_model_classes:
        shown = ", ".join(summary.unscored_model_classes[:8]) + (", ..." if len(summary.unscored_model_classes) > 8
                                                                 else "")
        console.print(escape(f"{len(summary.unscored_model_classes)} classes of {summary.model} have no category "
                             f"here (their detections are not scored): {shown}"), highlight=False)
