"""The end-of-fleet-run summary, from the gathered files (torch-free): a table per hardware id, a row per cell with
its status and headline numbers, the sharded accuracy per group, and a dict for --json."""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.table import Table

from harness.results.reader import submission_of_cell
from harness.views.tables import server_lines
from harness.views.text import escape


def _number(doc: dict, *path: str) -> float | None:
    for key in path:
        doc = doc.get(key) if isinstance(doc, dict) else None
    return doc if isinstance(doc, (int, float)) and not isinstance(doc, bool) else None


def cell_rows(outcome) -> list[dict]:
    """Every cell of every hardware folder: status, reason, and the submission's headline numbers."""
    rows = []
    for hw, folder in outcome.folders.items():
        for status in folder.state.cells.values():
            doc = submission_of_cell(folder.run_dir, status.submission) if status.state == "ok" else {}
            rows.append({"hardware_id": hw, **status.to_dict(),
                         "submission": str(folder.run_dir / status.submission) if status.submission else None,
                         "images_per_s": _number(doc, "throughput", "images_per_s"),
                         "image_ms_p50": _number(doc, "timing", "total_ms", "p50"),
                         "mAP_50_95": _number(doc, "accuracy", "mAP_50_95"),
                         **({"server": doc["server"]} if isinstance(doc.get("server"), dict) else {})})
    return rows


def fleet_tables(run_id: str, cells: list[dict]) -> list[Table]:
    """A table per hardware id, the id in its title (a derived id is long: a column would fold it mid-word), a row
    per cell (`cell_rows`): status, images/s, p50 per image, mAP (from its submission)."""
    rows: dict[str, list[dict]] = {}
    for r in cells:
        rows.setdefault(r["hardware_id"], []).append(r)
    tables = []
    for hw, cells in rows.items():
        table = Table(title=f"fleet {escape(run_id)} on {escape(hw)}", box=box.SIMPLE_HEAD)
        for name, justify in (("cell", "left"), ("status", "left"), ("img/s", "right"), ("p50 ms/img", "right"),
                              ("mAP", "right")):
            table.add_column(name, justify=justify, overflow="fold")
        for r in cells:
            color = "green" if r["status"] == "ok" else "red"
            table.add_row(escape(r["cell"]), f"[{color}]{r['status']}[/]", _fmt(r["images_per_s"], ".1f"),
                          _fmt(r["image_ms_p50"], ".2f"), _fmt(r["mAP_50_95"], ".4f"))
        tables.append(table)
    return tables


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def print_fleet_summary(console: Console, outcome) -> None:
    """Everything a person reads at the end of `va-bench fleet run`."""
    rows = cell_rows(outcome)  # each submission read once
    for table in fleet_tables(outcome.run_id, rows):
        console.print(table)
    for line in server_lines([(f"{r['hardware_id']}: {r['cell']}", r.get("server")) for r in rows]):
        console.print(escape(line), highlight=False)  # --scenario server: each cell's trial, as a run prints it
    for slug, entry in outcome.accuracy.items():
        if entry.get("status") == "ok":
            console.print(f"sharded accuracy {escape(slug)}: mAP {entry['mAP_50_95']:.4f} from "
                          f"{len(entry['shards'])} shards -> {escape(str(outcome.fleet_dir / entry['file']))}",
                          highlight=False)
        else:
            reason = escape(str(entry.get("reason")))
            console.print(f"sharded accuracy {escape(slug)}: {entry.get('status')} ({reason})", highlight=False)
    for line in outcome.refusals:
        console.print(f"[yellow]{escape(line)}[/]", highlight=False)
    for label, problem in outcome.problems.items():
        console.print(f"[red]{escape(label)}[/]: {escape(problem)}", highlight=False)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    console.print(f"cells: {', '.join(f'{n} {s}' for s, n in counts.items())}; gathered in "
                  f"{escape(str(outcome.fleet_dir))}", highlight=False)
    if outcome.problems:
        console.print(f"continue with: {escape(outcome.resume_command)} (add --retry-failed for failed cells)",
                      highlight=False)


def fleet_summary_json(outcome) -> dict:
    """The fleet run for scripts: every cell with its hardware and status, and the sharded accuracy."""
    rows = cell_rows(outcome)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    return {"run_id": outcome.run_id, "fleet_dir": str(outcome.fleet_dir), "hardware": list(outcome.folders),
            "cells": rows, "counts": counts, "accuracy": outcome.accuracy, "refused": outcome.refusals,
            "problems": outcome.problems}
