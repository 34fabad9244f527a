"""Results of a fleet gathered on the driver: outputs/<run_id>/<hardware_id>/ is an ordinary run folder
(RunState: locked, run.json rewritten atomically) that the driver fills with what nodes send as their
cells finish.

A node runs each group in a scratch run folder of its own and sends `NodeUpdate`s: its run.json (the
cells' statuses and its header) and the files that changed. Files are written first (atomically), then
run.json, so a killed driver leaves every cell that run.json calls ok with its files in place. CSV files
(steps_timer.csv, layer_timer.csv, memory.csv, ...) hold rows of several groups: each update's new rows
are appended to the gathered copy; everything else is written as sent.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from harness.files import atomic_text, atomic_write_bytes, atomic_write_csv
from harness.records import Cell
from harness.results.artifacts import detections_file, write_mprofile
from harness.results.reader import MEMORY_FILE, MPROF_FILE, RUN_FILE, read_run_json
from harness.run.signals import protected
from harness.run.state import ERROR_LOG, LOCK_FILE, RunState

FINAL_STATES = ("ok", "failed", "oom", "skipped")


@dataclass
class NodeUpdate:
    """What a node sends while it runs one group: its local run.json and the files that changed."""

    node: dict  # node_id, host, address, pid
    header: dict  # the node's run.json less run_id and cells: config, dataset, device, hardware, environment
    cells: list[dict]  # CellStatus.to_dict() of the group's cells
    files: dict[str, bytes] = field(default_factory=dict)  # relative to the run folder
    errors_log: str = ""  # text appended to errors.log since the previous update


@dataclass
class Change:
    """A cell whose status changed on the driver."""

    label: str
    state: str
    reason: str | None


def inside_folder(name: str, sender: str = "a node") -> PurePosixPath:
    """A path another process of the fleet sent (`sender`), accepted only if it stays inside the folder it is
    written to."""
    path = PurePosixPath(name)
    if path.is_absolute() or not path.parts or any(p in ("", ".", "..") for p in path.parts) or "\\" in name:
        raise ValueError(f"{sender} sent a file outside its run folder: {name!r}")
    return path




def safe_relative(name: str) -> PurePosixPath:
    """A path a node sent into a gathered hardware folder: inside it, and none of the files the driver keeps."""
    path = inside_folder(name)
    if path.name in (RUN_FILE, LOCK_FILE, ERROR_LOG):
        raise ValueError(f"a node sent {name!r}, which the driver writes itself")
    return path


def _read_csv(data: bytes) -> tuple[list[str], list[list[str]]]:
    rows = list(csv.reader(io.StringIO(data.decode("utf-8"))))
    return (rows[0], rows[1:]) if rows else ([], [])


def append_csv_rows(path: Path, data: bytes, skip: int) -> int:
    """Append the rows of `data` (a whole CSV file a node sent) past its first `skip` rows to the CSV at
    `path`, widening the header when the node's has new columns (energy domains differ between machines).
    Returns the node file's row count, the next `skip`."""
    header, rows = _read_csv(data)
    if path.is_file():
        old_header, old_rows = _read_csv(path.read_bytes())
    else:
        old_header, old_rows = header, []
    merged = old_header + [c for c in header if c not in old_header]

    def widen(columns: list[str], body: list[list[str]]) -> list[list[str]]:
        index = {c: i for i, c in enumerate(columns)}
        return [[row[index[c]] if c in index and index[c] < len(row) else "" for c in merged] for row in body]

    new = rows[skip:]
    if new or not path.is_file() or merged != old_header:
        atomic_write_csv(path, merged, widen(old_header, old_rows) + widen(header, new))
    return len(rows)


class HardwareFolder:
    """One hardware id's run folder in a fleet run."""

    def __init__(self, state: RunState, hardware_id: str):
        self.state = state
        self.hardware_id = hardware_id

    @property
    def run_dir(self) -> Path:
        return self.state.run_dir

    @classmethod
    def create(cls, fleet_dir: Path, run_id: str, hardware_id: str, header: dict, cells: list[Cell]) -> HardwareFolder:
        """A new folder (exclusive and locked, RunState.create), every cell pending."""
        return cls(RunState.create(fleet_dir / hardware_id, run_id, header, cells), hardware_id)

    @classmethod
    def reopen(cls, fleet_dir: Path, run_id: str, hardware_id: str, cells: list[Cell]) -> HardwareFolder:
        """An existing folder for --resume: `running` cells become `interrupted` (RunState.reopen)."""
        doc = read_run_json(fleet_dir / hardware_id, run_id)
        header = {k: v for k, v in doc.items() if k not in ("run_id", "cells")}
        return cls(RunState.reopen(fleet_dir / hardware_id, run_id, cells, header), hardware_id)

    def apply(self, update: NodeUpdate, rows_seen: dict[str, int]) -> list[Change]:
        """Write what a node sent, then its cells' statuses; `rows_seen` (per task, kept by the caller)
        counts the CSV rows of that task's files already appended."""
        with protected():
            for name, data in sorted(update.files.items()):
                rel = safe_relative(name)
                target = self.run_dir / rel
                if rel.as_posix() == MPROF_FILE:  # derived from memory.csv, which gathers every task's samples:
                    continue  # rebuilt below
                if rel.suffix == ".csv":
                    rows_seen[name] = append_csv_rows(target, data, rows_seen.get(name, 0))
                else:
                    atomic_write_bytes(target, data)
            memory = self.run_dir / MEMORY_FILE
            if MEMORY_FILE in update.files and memory.is_file():  # the same timeline as memory.csv, as a run's
                with memory.open(newline="", encoding="utf-8") as fh, atomic_text(self.run_dir / MPROF_FILE) as out:
                    rows = csv.reader(fh)
                    next(rows, None)  # the header
                    write_mprofile(out, rows)
            if update.errors_log:
                with open(self.run_dir / ERROR_LOG, "a", encoding="utf-8") as fh:
                    fh.write(update.errors_log)
            self._take_header(update)
            # read back and sent to nodes later: paths inside the run, every one checked before any status changes
            submissions = [None if e.get("submission") is None else str(inside_folder(str(e["submission"])))
                           for e in update.cells]
            changes = []
            for entry, submission in zip(update.cells, submissions, strict=True):
                status = self.state.cells.get(entry.get("cell"))
                if status is None:
                    continue  # not a cell of this plan: ignored (the driver's plan is the reference)
                changed = (status.state, status.reason) != (entry.get("status"), entry.get("reason"))
                if changed:
                    changes.append(Change(status.cell.label, entry.get("status"), entry.get("reason")))
                    if entry.get("status") != "pending":  # a hardware id may name several machines: which one
                        status.node = {k: update.node.get(k) for k in ("host", "address", "node_id")}
                status.state, status.reason = entry.get("status"), entry.get("reason")
                status.submission = submission
                status.started_at, status.finished_at = entry.get("started_at"), entry.get("finished_at")
            self.state.save()
        return changes

    def _take_header(self, update: NodeUpdate) -> None:
        """The first node to report for this hardware gives the folder its environment; every node that
        ran something here is listed under fleet.nodes."""
        header = self.state.header
        if not header.get("environment"):
            for key in ("dataset", "device", "hardware", "environment"):
                if key in update.header:
                    header[key] = update.header[key]
        nodes = header.setdefault("fleet", {}).setdefault("nodes", [])
        if all(n.get("node_id") != update.node.get("node_id") for n in nodes):
            nodes.append(dict(update.node))

    def mark(self, labels: list[str], state: str, reason: str) -> list[Change]:
        """Cells a task could not finish (it died, was refused or cancelled): every one not yet in a final
        state gets `state` and the reason."""
        changes = []
        with protected():
            for label in labels:
                status = self.state.cells[label]
                if status.state in FINAL_STATES:
                    continue
                status.state, status.reason = state, reason
                changes.append(Change(label, state, reason))
            self.state.save()
        return changes

    def finished_files(self, labels: list[str]) -> dict[str, bytes]:
        """Submission and detections files of the ok cells among `labels` (a node resuming their group needs
        them: the ok cells stay as they are and the first is the batch-invariance reference)."""
        out = {}
        for label in labels:
            status = self.state.cells[label]
            if status.state != "ok" or not status.submission:
                continue
            out[status.submission] = (self.run_dir / status.submission).read_bytes()
            detections = detections_file(status.cell)
            if (self.run_dir / detections).is_file():
                out[detections] = (self.run_dir / detections).read_bytes()
        return out

    def close(self) -> None:
        self.state.close()

