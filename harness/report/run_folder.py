"""Read a finished run folder (outputs/<run_id>/) for the report: run.json, submissions/*.json and the
probe CSVs. Torch-free: it reads what `va-bench run` wrote and never imports the pipeline.

Tolerant of optional parts (a run without layers, energy or memory still reports) and of small layout
changes (every field is looked up with `lookup()`, missing -> None); strict about what makes the folder
unreadable (no submissions, a file that is not JSON): those are one-line `UsageError`s.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.errors import UsageError

# Submissions and run.json are small (~15 kB); anything far bigger is not ours.
MAX_JSON_BYTES = 20 * 1024 * 1024


def lookup(doc: Any, path: str, default: Any = None) -> Any:
    """doc['a']['b'] for path 'a.b'; `default` when any step is missing or not a mapping."""
    for part in path.split("."):
        if not isinstance(doc, dict) or part not in doc:
            return default
        doc = doc[part]
    return doc


def number(value: Any) -> float | None:
    """A real number or None (bools, strings and nulls are not measurements)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


@dataclass(frozen=True)
class CellKey:
    """The coordinates of one performance cell (DESIGN: full coordinates; timing mode kept apart)."""

    model: str
    backend: str
    precision: str
    input_size: int
    batch_size: int
    mode: str

    @property
    def series(self) -> str:
        """Everything but the batch size: one line in a batch-size sweep plot."""
        label = f"{self.model} {self.backend} {self.precision} {self.input_size}"
        return label if self.mode == "latency" else f"{label} ({self.mode})"

    @property
    def label(self) -> str:
        return f"{self.series} b{self.batch_size}"


def short_labels(keys: list[CellKey]) -> dict[CellKey, str]:
    """Labels naming only the coordinates that differ between the keys (for crowded axes)."""
    names = ("model", "backend", "precision", "input_size", "mode")
    varying = [n for n in names if len({getattr(k, n) for k in keys}) > 1]
    out = {}
    for k in keys:
        parts = [str(getattr(k, n)) for n in varying if not (n == "mode" and k.mode == "latency")]
        out[k] = " ".join([*parts, f"b{k.batch_size}"])
    return out


@dataclass
class Cell:
    """One submission of the run."""

    key: CellKey
    path: Path
    doc: dict[str, Any]

    def get(self, path: str, default: Any = None) -> Any:
        return lookup(self.doc, path, default)


@dataclass
class RunFolder:
    path: Path
    run: dict[str, Any]  # run.json, {} when absent
    cells: list[Cell]  # sorted by coordinates
    cell_status: list[dict[str, Any]] = field(default_factory=list)  # run.json's cells [{cell, status, ...}]
    notes: list[str] = field(default_factory=list)  # what the reader decided (superseded files)

    @property
    def run_id(self) -> str:
        return str(self.run.get("run_id") or lookup(self.cells[0].doc, "metadata.run_id") or self.path.name)

    @property
    def created_at(self) -> str:
        """When the run's first cell finished (ISO-8601), from the submissions."""
        stamps = sorted(str(c.get("created_at")) for c in self.cells if c.get("created_at"))
        return stamps[0] if stamps else ""

    def first(self, path: str, default: Any = None) -> Any:
        """A run-level fact: run.json first, else the first submission that has it."""
        value = lookup(self.run, path)
        if value is not None:
            return value
        return next((v for c in self.cells if (v := c.get(path)) is not None), default)

    def csv_rows(self, name: str) -> list[dict[str, str]] | None:
        """Rows of a probe CSV in the run folder, or None when the run did not write it."""
        path = self.path / name
        if not path.is_file():
            return None
        try:
            with path.open(newline="", encoding="utf-8") as fh:
                return list(csv.DictReader(fh))
        except (UnicodeDecodeError, csv.Error) as exc:
            raise UsageError(f"{path}: not a readable CSV ({exc}); re-run the benchmark or remove the file") from None


def _read_json(path: Path) -> dict[str, Any]:
    if path.stat().st_size > MAX_JSON_BYTES:
        raise UsageError(f"{path}: {path.stat().st_size} bytes is too big for a va-bench record; remove it")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"{path}: not valid JSON ({exc}); re-run the benchmark or remove the file") from None
    if not isinstance(doc, dict):
        raise UsageError(f"{path}: expected a JSON object, found {type(doc).__name__}; remove the file")
    return doc


def _cell_key(doc: dict[str, Any], path: Path) -> CellKey:
    batch = number(lookup(doc, "config.batch_size", lookup(doc, "timing.batch_size")))
    size = number(lookup(doc, "config.input_size", lookup(doc, "model.input_size")))
    model = lookup(doc, "model.id")
    if model is None or batch is None or size is None:
        raise UsageError(f"{path}: not a va-bench submission (model.id, config.batch_size or config.input_size "
                         "missing); remove it from submissions/")
    return CellKey(model=str(model),
                   backend=str(lookup(doc, "runtime.backend") or lookup(doc, "runtime.format") or "?"),
                   precision=str(lookup(doc, "runtime.precision") or "?"), input_size=int(size),
                   batch_size=int(batch), mode=str(lookup(doc, "timing.mode") or "latency"))


def load_run(path: Path) -> RunFolder:
    """Read outputs/<run_id>/; UsageError (one line) when it is not a readable run folder."""
    path = Path(path)
    if not path.is_dir():
        raise UsageError(f"{path} is not a folder: pass a run folder, e.g. outputs/<run_id>/")
    run = _read_json(path / "run.json") if (path / "run.json").is_file() else {}
    files = sorted((path / "submissions").glob("*.json"))
    if not files:
        hint = "its cells did not finish (see run.json)" if run else "is it a va-bench run folder?"
        raise UsageError(f"{path} has no submissions/*.json to report: {hint}")
    latest: dict[CellKey, Cell] = {}
    superseded = []
    for f in files:
        doc = _read_json(f)
        cell = Cell(_cell_key(doc, f), f, doc)
        # a resumed run may have re-written a cell: within one identity the latest timestamp wins (DESIGN)
        other = latest.get(cell.key)
        if other is not None:
            older, cell = sorted((other, cell), key=lambda c: str(c.get("created_at") or ""))
            superseded.append(f"{older.path.name} superseded by {cell.path.name} (same cell, later timestamp)")
        latest[cell.key] = cell
    cells = list(latest.values())
    cells.sort(key=lambda c: (c.key.model, c.key.backend, c.key.precision, c.key.input_size, c.key.mode,
                              c.key.batch_size))
    status = [c for c in run.get("cells", []) if isinstance(c, dict)] if isinstance(run.get("cells"), list) else []
    return RunFolder(path=path, run=run, cells=cells, cell_status=status, notes=superseded)
