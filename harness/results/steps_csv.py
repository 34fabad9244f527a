"""steps_timer.csv in the benchmark's classic shape (stage, total, count, avg, std, min, max, total %), one
block per cell; times in seconds, `total_pct` relative to the cell's whole batch time."""

from __future__ import annotations

import csv
from pathlib import Path

from harness.files import atomic_write_csv
from harness.records import CellRecord

HEADER = ["model", "backend", "precision", "input_size", "batch_size", "stage", "total", "count", "avg", "std",
          "min", "max", "total_pct"]
ORDER = ("total", "preprocess", "preprocess.decode", "transfer", "forward", "postprocess", "postprocess.nms",
         "postprocess.topk",
         "postprocess.boxes")


def steps_rows(record: CellRecord) -> list[list]:
    """steps_timer.csv's rows of one cell: the batch total and each stage (seconds, share of the total time)."""
    timing = record.timing
    load = record.cell.load
    summaries = {"total": timing.batch_ms, **timing.stages_ms}
    grand_total = timing.batch_ms.mean * timing.batch_ms.count
    names = [n for n in ORDER if n in summaries] + sorted(set(summaries) - set(ORDER))
    rows = []
    for name in names:
        s = summaries[name]
        total = s.mean * s.count
        rows.append([load.model, load.backend, load.precision, load.input_size[0], record.cell.batch_size, name,
                     round(total / 1e3, 6), s.count, round(s.mean / 1e3, 6),
                     "" if s.std is None else round(s.std / 1e3, 6),  # one sample: no spread
                     round(s.min / 1e3, 6), round(s.max / 1e3, 6), round(100 * total / grand_total, 3)])
    return rows


def write_steps_csv(path: Path, rows: list[list]) -> Path:
    """steps_timer.csv with its header, written atomically."""
    return atomic_write_csv(path, HEADER, rows)


def existing_rows(path: Path) -> list[list]:
    """Rows an earlier process of this run wrote (kept as they are on --resume)."""
    if not path.is_file():
        return []
    with open(path, newline="", encoding="utf-8") as fh:
        return list(csv.reader(fh))[1:]
