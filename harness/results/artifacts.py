"""Probe artifacts of a run: layer_timer.csv, layer_types.csv, profiler_ops.csv,
trace*.json, energy.csv, memory.csv. Every file is rewritten atomically as cells finish."""

from __future__ import annotations

import csv
import re
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

from harness.files import JsonArrayWriter, atomic_text, atomic_write_csv, safe_name
from harness.records import Cell, LayerPassRecord, LoadKey, ProfilePassRecord, coco_json_texts
from harness.results.reader import (
    DETECTIONS_DIR,
    ENERGY_FILE,
    LAYER_TYPES_FILE,
    LAYERS_FILE,
    MEMORY_FILE,
    MPROF_FILE,
    PROFILER_OPS_FILE,
    TRACE_FILE,
)


def load_slug(key: LoadKey) -> str:
    """A file-name-safe name of a group: {model}__{backend}__{precision}__{size}."""
    h, w = key.input_size
    return "__".join(safe_name(p) for p in (key.model, key.backend, key.precision, str(h) if h == w else f"{h}x{w}"))


def cell_slug(cell: Cell) -> str:
    """A file-name-safe name of a cell: {model}__{backend}__{precision}__{size}__b{batch}."""
    return f"{load_slug(cell.load)}__b{cell.batch_size}"


def detections_file(cell: Cell, suffix: str = "") -> str:
    """Where a cell's detections (COCO results format) are, relative to the run folder: detections/<cell><suffix>.json
    (`suffix`: another pass of the same cell, such as its fp32 reference)."""
    return f"{DETECTIONS_DIR}/{cell_slug(cell)}{suffix}.json"


def _cell_cols(cell: Cell) -> list:
    load = cell.load
    return [load.model, load.backend, load.precision, load.input_size[0], cell.batch_size]


CELL_HEADER = ["model", "backend", "precision", "input_size", "batch_size"]


def cell_csv_key(cell: Cell) -> tuple[str, ...]:
    """A cell's first five columns in the run's CSVs, as the CSV reader gives them back (strings)."""
    return tuple(str(v) for v in _cell_cols(cell))


LAYER_HEADER = CELL_HEADER + ["batch", "module", "type", "input_shapes", "output_shapes", "ms"]
TYPE_HEADER = CELL_HEADER + ["layer_type", "total_ms", "count", "share_pct"]
MEMORY_HEADER = ["timestamp", "tag", "rss_mb", "cuda_allocated_mb"]


class ProbeArtifacts:
    """Accumulates probe rows for the run and keeps the files on disk current. A resumed run starts from
    the rows its files already hold, so earlier cells' rows are kept as they were."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.files: dict[str, str] = {}  # name -> path relative to the run folder
        self._layer_rows = self._existing(LAYERS_FILE, "layer_timer")
        self._type_rows = self._existing(LAYER_TYPES_FILE, "layer_types")
        self._op_header, self._op_rows = self._existing_with_header(PROFILER_OPS_FILE, "profiler_ops")
        energy_header, energy_rows = self._existing_with_header(ENERGY_FILE, "energy")
        self._energy_rows = [{k: v for k, v in zip(energy_header, row, strict=False) if v != ""}
                             for row in energy_rows]
        self._memory_rows = self._existing(MEMORY_FILE, "memory")

    def keep_cells(self, keys: set[tuple[str, ...]]) -> None:
        """Forget rows of cells that are not finished (a process killed between writing a cell's rows and
        marking it ok): on resume they are measured again and must not appear twice."""
        self._layer_rows = [r for r in self._layer_rows if tuple(map(str, r[:5])) in keys]
        self._type_rows = [r for r in self._type_rows if tuple(map(str, r[:5])) in keys]
        self._op_rows = [r for r in self._op_rows if tuple(map(str, r[:5])) in keys]

    def _existing_with_header(self, name: str, key: str) -> tuple[list[str], list[list]]:
        path = self.run_dir / name
        if not path.is_file():
            return [], []
        self.files[key] = name
        with open(path, newline="", encoding="utf-8") as fh:
            rows = list(csv.reader(fh))
        return (rows[0], rows[1:]) if rows else ([], [])

    def _existing(self, name: str, key: str) -> list[list]:
        return self._existing_with_header(name, key)[1]

    def trace_path(self, key: LoadKey) -> Path:
        """trace.json for the first profiled group, trace__<model>__<backend>__<precision>__<size>.json after."""
        first = self.run_dir / TRACE_FILE
        return self.run_dir / f"trace__{load_slug(key)}.json" if first.exists() else first

    def add_layers(self, cell: Cell, layers: LayerPassRecord) -> None:
        cols = _cell_cols(cell)
        self._layer_rows += [cols + [c.batch, c.name, c.type, c.input_shapes, c.output_shapes, round(c.ms, 5)]
                             for c in layers.calls]
        self._type_rows += [cols + [t["layer_type"], t["total_ms"], t["count"], t["share_pct"]]
                            for t in layers.by_type]
        atomic_write_csv(self.run_dir / LAYERS_FILE, LAYER_HEADER, self._layer_rows)
        atomic_write_csv(self.run_dir / LAYER_TYPES_FILE, TYPE_HEADER, self._type_rows)
        self.files["layer_timer"] = LAYERS_FILE
        self.files["layer_types"] = LAYER_TYPES_FILE
        if layers.runtime_trace:
            self.files[Path(layers.runtime_trace).stem] = layers.runtime_trace  # the runtime's own profile

    def add_profile(self, cell: Cell, profile: ProfilePassRecord) -> None:
        cols = _cell_cols(cell)
        keys = list(profile.ops[0]) if profile.ops else ["name", "calls", "self_cpu_ms", "cpu_total_ms"]
        if self._op_header and self._op_header != CELL_HEADER + keys:  # another device's columns: keep theirs
            keys = self._op_header[len(CELL_HEADER):]
        self._op_header = CELL_HEADER + keys
        self._op_rows += [cols + [op.get(k) for k in keys] for op in profile.ops]
        atomic_write_csv(self.run_dir / PROFILER_OPS_FILE, self._op_header, self._op_rows)
        self.files["profiler_ops"] = PROFILER_OPS_FILE
        self.files[Path(profile.trace_file).stem] = profile.trace_file

    def add_energy(self, tag: str, window: dict | None) -> None:
        """energy.csv: timestamp, tag, duration, then microjoules per domain."""
        if not window:
            return
        row = {"timestamp": round(window["timestamp"], 3), "tag": tag, "duration": round(window["duration_s"], 6)}
        for reading in window["readings"]:
            row.update({name: round(j * 1e6, 1) for name, j in reading.joules.items()})
        if not window["readings"]:
            row["note"] = "unavailable: " + "; ".join(f"{k}: {v}" for k, v in window.get("unavailable", {}).items())
        self._energy_rows.append(row)
        domains = sorted({k for r in self._energy_rows for k in r} - {"timestamp", "tag", "duration", "note"})
        domains += ["note"] if any("note" in r for r in self._energy_rows) else []
        header = ["timestamp", "tag", "duration", *domains]
        atomic_write_csv(self.run_dir / ENERGY_FILE, header, [[r.get(h) for h in header] for r in self._energy_rows])
        self.files["energy"] = ENERGY_FILE

    def write_memory(self, samples: Callable[[], Iterable[tuple]]) -> None:
        """memory.csv: the rows of earlier processes of this run, then this process's samples (`samples()` gives them
        anew for each file: both are written a row at a time); the same timeline in memory-profiler's mprofile format
        (memory.mprof.dat: `mprof plot memory.mprof.dat` draws it, each tagged window as a bracket)."""
        def rows() -> Iterator[list]:
            yield from self._memory_rows
            yield from (["" if v is None else v for v in sample] for sample in samples())

        with atomic_text(self.run_dir / MEMORY_FILE) as fh:
            writer = csv.writer(fh, lineterminator="\n")
            writer.writerow(MEMORY_HEADER)
            writer.writerows(rows())
        with atomic_text(self.run_dir / MPROF_FILE) as fh:
            write_mprofile(fh, rows())
        self.files["memory"] = MEMORY_FILE


def write_mprofile(fh, rows: Iterable[list]) -> None:
    """memory.csv rows (timestamp, tag, rss MiB, ...) as an mprofile, a row at a time: MEM lines, then a FUNC line per
    run of samples with one tag (its name with spaces as '_')."""
    fh.write("CMDLINE va-bench run\n")
    runs: list[str] = []
    first = last = None
    for row in rows:
        fh.write(f"MEM {float(row[2]):.4f} {float(row[0]):.4f}\n")
        if first is not None and row[1] != first[1]:
            runs.append(_func_line(first, last))
            first = None
        first, last = first or row, row
    if first is not None:
        runs.append(_func_line(first, last))
    fh.writelines(runs)


def _func_line(first: list, last: list) -> str:
    tag = re.sub(r"\s+", "_", str(first[1]))
    return f"FUNC {tag} {float(first[2]):.4f} {float(first[0]):.4f} {float(last[2]):.4f} {float(last[0]):.4f}\n"


def write_coco_detections(path: Path, detections: Iterable, label_categories) -> int:
    """A COCO results file of `detections` (ImageDetections, image by image, never all held as text), written
    atomically; the number of detections in it."""
    with JsonArrayWriter(path) as out:
        for image in detections:
            out.extend_encoded(coco_json_texts(image, label_categories))
    return out.count
