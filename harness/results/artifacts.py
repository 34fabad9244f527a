"""Probe artifacts of a run (seed 001's files): layer_timer.csv, layer_types.csv, profiler_ops.csv,
trace*.json, energy.csv, memory.csv. Every file is rewritten atomically as cells finish."""

from __future__ import annotations

from pathlib import Path

from harness.plan import Cell, LoadKey
from harness.probes import LayerPassRecord, ProfilePassRecord
from harness.results.writer import atomic_write_csv


def _cell_cols(cell: Cell) -> list:
    load = cell.load
    return [load.model, load.backend, load.precision, load.input_size[0], cell.batch_size]


CELL_HEADER = ["model", "backend", "precision", "input_size", "batch_size"]


class ProbeArtifacts:
    """Accumulates probe rows for the run and keeps the files on disk current."""

    def __init__(self, run_dir: Path):
        self.run_dir = run_dir
        self.files: dict[str, str] = {}
        self._layer_rows: list[list] = []
        self._type_rows: list[list] = []
        self._op_rows: list[list] = []
        self._energy_rows: list[dict] = []
        self._traces = 0

    def trace_path(self, key: LoadKey) -> Path:
        """trace.json for the first profiled group, trace__<model>__<backend>__<size>.json after that."""
        self._traces += 1
        name = "trace.json" if self._traces == 1 else f"trace__{key.model}__{key.backend}__{key.input_size[0]}.json"
        return self.run_dir / name

    def add_layers(self, cell: Cell, layers: LayerPassRecord) -> None:
        cols = _cell_cols(cell)
        self._layer_rows += [cols + [c.batch, c.name, c.type, c.input_shapes, c.output_shapes, round(c.ms, 5)]
                             for c in layers.calls]
        self._type_rows += [cols + [t["layer_type"], t["total_ms"], t["count"], t["share_pct"]]
                            for t in layers.by_type]
        atomic_write_csv(self.run_dir / "layer_timer.csv",
                         CELL_HEADER + ["batch", "module", "type", "input_shapes", "output_shapes", "ms"],
                         self._layer_rows)
        atomic_write_csv(self.run_dir / "layer_types.csv",
                         CELL_HEADER + ["layer_type", "total_ms", "count", "share_pct"], self._type_rows)
        self.files["layer_timer"] = str(self.run_dir / "layer_timer.csv")
        self.files["layer_types"] = str(self.run_dir / "layer_types.csv")
        if layers.ort_trace:
            self.files[f"ort_profile__{cell.load.model}__{cell.load.backend}"] = layers.ort_trace

    def add_profile(self, cell: Cell, profile: ProfilePassRecord) -> None:
        cols = _cell_cols(cell)
        keys = list(profile.ops[0]) if profile.ops else ["name", "calls", "self_cpu_ms", "cpu_total_ms"]
        self._op_rows += [cols + [op.get(k) for k in keys] for op in profile.ops]
        atomic_write_csv(self.run_dir / "profiler_ops.csv", CELL_HEADER + keys, self._op_rows)
        self.files["profiler_ops"] = str(self.run_dir / "profiler_ops.csv")
        self.files[Path(profile.trace_file).stem] = profile.trace_file

    def add_energy(self, tag: str, window: dict | None) -> None:
        """energy.csv as in seed 001: timestamp, tag, duration, then microjoules per domain."""
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
        atomic_write_csv(self.run_dir / "energy.csv", header, [[r.get(h) for h in header] for r in self._energy_rows])
        self.files["energy"] = str(self.run_dir / "energy.csv")

    def write_memory(self, samples: list[tuple]) -> None:
        atomic_write_csv(self.run_dir / "memory.csv", ["timestamp", "tag", "rss_mb", "cuda_allocated_mb"],
                         [list(s) for s in samples])
        self.files["memory"] = str(self.run_dir / "memory.csv")
