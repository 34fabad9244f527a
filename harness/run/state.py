"""The run folder and run.json: created exclusively, locked while a process writes to it, rewritten
atomically after every cell so that a killed run is always consistent and can be resumed."""

from __future__ import annotations

import csv
import errno
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import UsageError, path_problem
from harness.files import DiskFullError, atomic_write_csv, atomic_write_json, is_disk_full
from harness.locks import lock_file
from harness.records import CELL_STATES, Cell, CellStatus
from harness.results.reader import ENERGY_FILE, RUN_FILE, SUBMISSIONS_DIR, read_run_json, submission_files
from harness.storage import storage_fix

LOCK_FILE = ".lock"
ERROR_LOG = "errors.log"


def _lock(run_dir: Path, run_id: str) -> int:
    """An exclusive lock on the run folder for this process's lifetime (released when it exits, even on kill -9)."""
    return lock_folder(run_dir, f"run {run_id} is being written by another va-bench process; wait for it to finish "
                                "or pick another --run-id")


def lock_folder(folder: Path, busy: str) -> int:
    """An exclusive lock on `folder` (its .lock file) held by this process until it closes the descriptor or exits
    (even on kill -9); `busy` is the one-line refusal when another process holds it."""
    # the umask decides the mode (a group-shared run folder); O_BINARY: no newline translation on Windows
    fd = os.open(folder / LOCK_FILE, os.O_RDWR | os.O_CREAT | getattr(os, "O_BINARY", 0), 0o666)
    if not lock_file(fd, wait=False):
        os.close(fd)
        raise UsageError(busy)
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    return fd


LAYER_PROFILE_PREFIX = ".layer_profile_"  # a runtime profiler's temp folder in the run folder during the layer pass


def remove_leftovers(run_dir: Path) -> list[Path]:
    """Temp files of writes a killed process never finished (atomic writes leave `.name.*.tmp`) and the layer
    pass's profiler folders (`.ort_profile_*`: their name before); returns what was removed."""
    removed = []
    for path in [*run_dir.rglob(".*.tmp"), *run_dir.glob(f"{LAYER_PROFILE_PREFIX}*"), *run_dir.glob(".ort_profile_*")]:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        removed.append(path)
    return removed


def remove_unowned_traces(run_dir: Path, submissions: list[Path]) -> list[Path]:
    """Profiler traces (`trace*.json`, a runtime's `*_profile__*.json`) that none of the ok cells' `submissions`
    names: a pass a stopped process left, whose cell runs again (the next trace would otherwise take another name
    beside it). Nothing is removed when a submission cannot be read (what it names is not known)."""
    named = set()
    for path in submissions:
        try:
            artifacts = json.loads(path.read_text(encoding="utf-8")).get("artifacts")
        except (OSError, ValueError, AttributeError):
            return []
        named |= {v for v in artifacts.values() if isinstance(v, str)} if isinstance(artifacts, dict) else set()
    removed = [p for p in [*run_dir.glob("trace*.json"), *run_dir.glob("*_profile__*.json")] if p.name not in named]
    for path in removed:
        path.unlink(missing_ok=True)
    return removed


class FolderReplacedError(FileNotFoundError):
    """The run folder a process locked is no longer at its path (removed or moved while the run wrote to it)."""


@dataclass
class RunState:
    """A locked run folder and the status of its cells."""

    run_dir: Path
    run_id: str
    header: dict[str, Any]  # config, dataset, device, hardware, environment: run.json minus the cells
    cells: dict[str, CellStatus]  # by cell label, in plan order
    _lock_fd: int | None = field(default=None, repr=False)
    # cells recorded by an earlier process that this one's plan does not hold (a resume forced onto other options):
    # kept as recorded, with their files, never run by this process; run.json's config is the last process's, so
    # a plain resume goes on with what a forced one started
    other_cells: list[dict] = field(default_factory=list)

    @classmethod
    def create(cls, run_dir: Path, run_id: str, header: dict, cells: list[Cell]) -> RunState:
        """A new run folder (exclusive: an existing one is an error, two processes never share one)."""
        try:
            run_dir.parent.mkdir(parents=True, exist_ok=True)
            run_dir.mkdir()
        except FileExistsError:
            raise UsageError(path_problem("--output-dir", run_dir.parent, f"run {run_id} already exists")
                             + f"; pick another --run-id or resume it with --resume {run_id}") from None
        except OSError as exc:
            raise UsageError(path_problem("--output-dir", run_dir.parent, f"cannot create the run folder {run_id} "
                                          f"({exc.strerror})") + "; pick a writable folder") from exc
        state = cls(run_dir, run_id, header, {c.label: CellStatus(c) for c in cells})
        try:
            state._lock_fd = _lock(run_dir, run_id)
            state.save()
        except BaseException as exc:  # a full disk, say: the folder is ours and holds nothing yet, so none is left
            state.close()
            shutil.rmtree(run_dir, ignore_errors=True)
            if is_disk_full(exc):
                path = exc.path if isinstance(exc, DiskFullError) else run_dir
                raise DiskFullError(path, exc if isinstance(exc, OSError) else exc.__cause__,
                                    storage_fix(exc, "free some space") + " and run the command again") from exc
            if isinstance(exc, OSError):
                raise UsageError(path_problem("--output-dir", run_dir.parent, f"cannot write the run folder {run_id} "
                                              f"({(exc.strerror or str(exc)).lower()})")
                                 + "; pick a folder with space that you can write") from exc
            raise
        return state

    @classmethod
    def reopen(cls, run_dir: Path, run_id: str, cells: list[Cell], header: dict) -> RunState:
        """An existing run folder for --resume: statuses as recorded; a cell that was `running` when the
        process died is `interrupted`."""
        doc = read_run_json(run_dir, run_id)
        if not isinstance(doc.get("cells"), list) or not all(isinstance(c, dict) for c in doc["cells"]):
            raise UsageError(f"{run_dir / RUN_FILE} has no list of cells: it was edited or damaged, and what its "
                             "cells did is not known; the run cannot be resumed: start a new one")
        recorded = {c.get("cell"): c for c in doc["cells"]}
        unknown = [(label, c.get("status")) for label, c in recorded.items() if c.get("status", "pending")
                   not in CELL_STATES]
        if unknown:  # a hand-edited or foreign run.json: what became of those cells is not known
            label, state = unknown[0]
            raise UsageError(f"{run_dir / RUN_FILE}: cell {label} has status {str(state)[:30]!r}, not one of "
                             f"{', '.join(CELL_STATES)}; the run cannot be resumed: start a new one")
        fd = _lock(run_dir, run_id)
        try:
            remove_leftovers(run_dir)
            statuses = {}
            for cell in cells:
                old = recorded.get(cell.label, {})
                state = old.get("status", "pending")

                status = CellStatus(cell, "interrupted" if state == "running" else state, old.get("reason"),
                                    old.get("submission"), old.get("started_at"), old.get("finished_at"),
                                    old.get("node") if isinstance(old.get("node"), dict) else None)
                if status.state == "ok" and not (status.submission and (run_dir / status.submission).is_file()):
                    status.state, status.reason = "pending", "its submission file is missing"
                statuses[cell.label] = status
            planned = {cell.label for cell in cells}
            # a cell of other options (an earlier forced resume's), kept as it was; one its process left running
            # was interrupted, as a planned one is
            others = [{**c, "status": "interrupted"} if c.get("status") == "running" else c
                      for label, c in recorded.items() if label not in planned]
            owned = {s.submission for s in statuses.values() if s.state == "ok"}
            owned |= {c.get("submission") for c in others if c.get("status") == "ok"}
            unowned = [p for p in submission_files(run_dir) if p.relative_to(run_dir).as_posix() not in owned]
            # a process killed before "ok" leaves at most its running cell's: more, with planned cells run.json does
            # not list, is a run.json that lost cells (edited or damaged), whose finished submissions must not be
            # taken for a dead process's (every cell listed: what is not ok is to be run again, as before)
            died = sum(c.get("status") in ("running", "interrupted") for c in recorded.values())
            if len(unowned) > died and any(cell.label not in recorded for cell in cells):
                raise UsageError(f"{run_dir / RUN_FILE} does not record {len(unowned)} submission(s) in "
                                 f"{SUBMISSIONS_DIR}/ as finished (first: {unowned[0].name}): it was edited or "
                                 "damaged; restore it, or move the run folder away and start a new run")
            for path in unowned:  # written by a process killed before "ok"
                path.unlink()
            remove_unowned_traces(run_dir, [run_dir / s for s in owned if s])
            drop_energy_rows(run_dir, keep={label for label, s in statuses.items() if s.state == "ok"}
                             | {c.get("cell") for c in others if c.get("status") == "ok"})
            state = cls(run_dir, run_id, header, statuses, other_cells=others)
            state._lock_fd = fd
            try:
                state.save()
            except DiskFullError as exc:
                raise DiskFullError(exc.path, exc.__cause__, storage_fix(exc, "free some space") + ", then resume "
                                    "again") from exc
        except BaseException:  # the lock is this attempt's: a failed resume leaves the folder resumable
            os.close(fd)
            raise
        return state

    def save(self) -> None:
        """run.json rewritten; FolderReplacedError when the locked folder is no longer at its path (run.json
        written there would start another, partial run folder under this run's name)."""
        self.check_folder()
        atomic_write_json(self.run_dir / RUN_FILE,
                          {"run_id": self.run_id, **self.header,
                           "cells": [s.to_dict() for s in self.cells.values()] + self.other_cells})

    def set(self, cell: Cell, state: str, reason: str | None = None, **fields: Any) -> None:
        status = self.cells[cell.label]
        status.state, status.reason = state, reason
        for k, v in fields.items():
            setattr(status, k, v)

    def stop(self, reason: str) -> bool:
        """The sweep stops early (a full disk): the running cell becomes `interrupted` and the cells not run
        yet say why; a plain --resume runs both. Returns whether run.json recorded it: on a full disk it may
        not, and then keeps its last complete version, whose `running` cell a resume treats the same way."""
        for status in self.cells.values():
            if status.state == "running":
                status.state, status.reason = "interrupted", reason
            elif status.state == "pending":
                status.reason = f"not run: {reason}"
        try:
            self.save()
        except (OSError, DiskFullError):  # a full disk, or the folder gone (FolderReplacedError)
            return False
        return True

    def log_error(self, cell_label: str, text: str) -> None:
        """Tracebacks of failed cells, appended to errors.log in the run folder; best effort: a log that cannot be
        written must not hide the failure it was to record."""
        try:
            with open(self.run_dir / ERROR_LOG, "a", encoding="utf-8") as fh:
                fh.write(f"=== {cell_label}\n{text.rstrip()}\n\n")
        except OSError:
            pass

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.cells.values():
            out[s.state] = out.get(s.state, 0) + 1
        return out

    def check_folder(self) -> None:
        """FolderReplacedError when the run folder was removed or moved: nothing more is written for this run."""
        if self.folder_replaced():
            raise FolderReplacedError(errno.ENOENT, "the run folder was removed or moved", str(self.run_dir))

    def folder_replaced(self) -> bool:
        """Whether the run folder this process locked is no longer at its path (removed or moved mid-run: what is
        there now, if anything, is another folder, perhaps made again by a later write)."""
        if self._lock_fd is None:
            return False
        held = os.fstat(self._lock_fd)
        try:
            there = os.stat(self.run_dir / LOCK_FILE)
        except OSError:
            return True
        return (held.st_dev, held.st_ino) != (there.st_dev, there.st_ino)

    def close(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None


def drop_energy_rows(run_dir: Path, keep: set[str]) -> None:
    """energy.csv keeps only the rows of finished cells (its `tag` is the cell label): a cell that is run
    again on resume writes its row anew, as steps_timer.csv and the layer/profiler CSVs are filtered."""
    path = run_dir / ENERGY_FILE
    if not path.is_file():
        return
    with open(path, newline="", encoding="utf-8") as fh:
        rows = list(csv.reader(fh))
    if not rows or "tag" not in rows[0]:
        return
    header, tag = rows[0], rows[0].index("tag")
    kept = [row for row in rows[1:] if len(row) > tag and row[tag] in keep]
    if len(kept) < len(rows) - 1:
        atomic_write_csv(path, header, kept)
