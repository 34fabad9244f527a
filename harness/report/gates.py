"""Gates: targets from the YAML file a user names (`va-bench report --gates PATH`; gates_example.yaml beside this
module is this project's, for its reference box) held against a run's submissions, shown in the benchmark log as
target vs today with met / NOT MET.

File format (validated; one clear line on any problem)::

    gates:
      - metric: mAP_50_95          # a name from METRICS below
        comparison: ">="           # >=, >, <=, <
        target: 0.25
        cell: {model: yolox-nano}  # optional selector: model, backend, precision, input_size,
                                   # batch_size, hardware, variant, mode
        name: published accuracy   # optional label
        note: YOLOX paper, full val2017   # optional: where the target comes from

A gate is evaluated on every cell it selects (one row each). A cell that has no value for the metric
(energy unavailable on this machine, no accuracy pass) is `not measured` with the reason, never a pass
or a 0; a gate that selects no cell of the run is `not measured` too. NOT MET fails `--fail-on-gates`, and so does
a gate that selects no cell (it checked nothing: a misspelt selector would pass every run); a file of no gate is
refused.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, StrictInt, ValidationError, field_validator

from harness.errors import UsageError, brief
from harness.figures import shown_apart
from harness.files import load_user_yaml, yaml_problem
from harness.report.sections import COCO_METRICS, Table
from harness.results.reader import FinishedCell, RunFolder, number

MAX_GATES_BYTES = 1024 * 1024

# metric name -> (submission path, digits shown, unit)
METRICS: dict[str, tuple[str, int, str]] = {
    **{m: (f"accuracy.{m}", 4, "") for m in COCO_METRICS},
    "images_per_s": ("throughput.images_per_s", 2, " img/s"),
    "fps_mean": ("throughput.fps_mean", 2, " fps"),
    "batch_mean_ms": ("timing.batch_ms.mean", 2, " ms/batch"),
    "batch_p50_ms": ("timing.batch_ms.p50", 2, " ms/batch"),
    "batch_p95_ms": ("timing.batch_ms.p95", 2, " ms/batch"),
    "batch_p99_ms": ("timing.batch_ms.p99", 2, " ms/batch"),
    "image_p50_ms": ("timing.per_image_ms.p50", 2, " ms/img"),
    "image_p95_ms": ("timing.per_image_ms.p95", 2, " ms/img"),
    "peak_ram_mb": ("memory.peak_ram_mb", 1, " MB"),
    "peak_vram_mb": ("memory.peak_vram_mb", 1, " MB"),
    "joules_per_image": ("energy.joules_per_image", 4, " J/img"),
    "images_per_joule": ("energy.images_per_joule", 3, " img/J"),
    "batch_invariance": ("batch_invariance.match_rate", 4, ""),
}
# the batch's figures under their first names, which aggregate's latency_ms_p50 (per image) made easy to misread
RENAMED_METRICS = {f"latency_{stat}_ms": f"batch_{stat}_ms" for stat in ("mean", "p50", "p95", "p99")}
COMPARE = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}
SHOWN = {">=": "≥", ">": ">", "<=": "≤", "<": "<"}

MET, NOT_MET, NOT_MEASURED = "met", "NOT MET", "not measured"
NO_SUCH_CELL = "no such cell in this run"  # a gate that selects nothing: a typo, or another run's gate


class Selector(BaseModel):
    """Which cells a gate applies to; every given coordinate must match."""

    model_config = ConfigDict(extra="forbid")
    model: str | None = None
    backend: str | None = None
    precision: str | None = None
    input_size: StrictInt | None = None
    batch_size: StrictInt | None = None
    hardware: str | None = None
    variant: str | None = None
    mode: Literal["latency", "overlapped"] | None = None

    @field_validator("backend")
    @classmethod
    def _runs_name(cls, value: str | None) -> str | None:
        return "onnxruntime" if value == "onnx" else value  # `run`'s own alias, as a run records the backend

    def matches(self, cell: FinishedCell) -> bool:
        k = cell.key
        actual = {"model": k.model, "backend": k.backend, "precision": k.precision, "input_size": k.input_size,
                  "batch_size": k.batch_size, "hardware": cell.get("hardware.id"),
                  "variant": cell.dataset_variant, "mode": k.mode}
        return all(want is None or actual[name] == want for name, want in self.model_dump().items())

    def describe(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.model_dump().items() if v is not None) or "every cell"


class Gate(BaseModel):
    model_config = ConfigDict(extra="forbid")
    metric: Literal[tuple(METRICS)]  # type: ignore[valid-type]
    comparison: Literal[">=", ">", "<=", "<"]
    # strict: a quoted '10' or a bool is a mistake, not a number; NaN would meet no target and infinity every one
    target: float = Field(strict=True, allow_inf_nan=False)
    cell: Selector = Field(default_factory=Selector)
    name: str | None = None
    note: str | None = None

    @property
    def title(self) -> str:
        if not self.name or self.metric in self.name:
            return self.name or self.metric
        return f"{self.name} ({self.metric})"

    @property
    def target_text(self) -> str:
        digits, unit = METRICS[self.metric][1:]
        return f"{SHOWN[self.comparison]} {self.target:.{digits}f}{unit}"


class GatesFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    gates: list[Gate]


@dataclass
class GateResult:
    gate: Gate
    cell: str  # the cell's label, or the selector when nothing matched
    today: float | None
    status: str  # MET, NOT_MET or NOT_MEASURED
    reason: str = ""  # why not measured

    def today_text(self) -> str:
        if self.today is None:
            return f"not measured ({self.reason})"
        digits, unit = METRICS[self.gate.metric][1:]
        return f"{shown_apart(self.today, self.gate.target, digits)}{unit}"


def load_gates(path: Path) -> list[Gate]:
    """Read and validate a gates YAML file (safe_load); UsageError naming the file and what is wrong."""
    path = Path(path)
    fix = "fix the file or pass another with --gates PATH"
    if not path.is_file():
        raise UsageError(f"gates file {path} not found; pass an existing file with --gates PATH")
    if path.stat().st_size > MAX_GATES_BYTES:
        raise UsageError(f"gates file {path} is {path.stat().st_size} bytes (limit {MAX_GATES_BYTES}); {fix}")
    try:
        doc = load_user_yaml(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise UsageError(f"gates file {path} could not be read ({exc.strerror}); {fix}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise UsageError(f"gates file {path} is not valid YAML{yaml_problem(exc)}; {fix}") from None
    if not isinstance(doc, dict):
        raise UsageError(f"gates file {path}: expected a mapping with a `gates:` list at the top; {fix}")
    for entry in doc.get("gates") or []:  # a file written for the first names still works, and its notes say so
        if isinstance(entry, dict) and isinstance(entry.get("metric"), str) and entry["metric"] in RENAMED_METRICS:
            old = entry["metric"]
            entry["metric"] = RENAMED_METRICS[old]
            said = f"this file's {old} is the batch's time (ms per batch), named {entry['metric']} now"
            entry["note"] = f"{entry['note']} ({said})" if isinstance(entry.get("note"), str) else said
    try:
        gates = GatesFile.model_validate(doc).gates
    except ValidationError as exc:
        err = exc.errors()[0]
        loc = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in err["loc"]).lstrip(".")
        msg = err["msg"]
        if err["type"] == "literal_error" and err["loc"][-1] == "metric":
            msg = f"unknown metric {brief(err.get('input'))}; known: {', '.join(METRICS)}"
        elif err["type"] == "extra_forbidden":
            owner = Selector if "cell" in err["loc"] else Gate if len(err["loc"]) > 1 else GatesFile
            msg = f"unknown key; known: {', '.join(owner.model_fields)}"
        raise UsageError(f"gates file {path}: {loc}: {msg}; {fix}") from None
    if not gates:  # a file that checks nothing would pass every run
        raise UsageError(f"gates file {path} lists no gate; {fix}")
    return gates


def _value(cell: FinishedCell, metric: str) -> tuple[float | None, str]:
    """(value, reason it is missing) of a metric in one submission."""
    path = METRICS[metric][0]
    value = number(cell.get(path))
    if value is not None:
        return value, ""
    block = cell.get(path.split(".")[0])
    reason = None
    if isinstance(block, dict):
        reason = block.get("reason") or block.get("vram_reason") or block.get("status")
        if block.get("is_reference"):  # batch invariance: the cell other cells are compared against
            reason = "this cell is the reference pass"
    return None, str(reason or f"{path} not recorded")


def evaluate(gates: list[Gate], run: RunFolder) -> list[GateResult]:
    """One result per (gate, selected cell); a gate that selects nothing is one `not measured` row."""
    results = []
    for gate in gates:
        cells = [c for c in run.cells if gate.cell.matches(c)]
        if not cells:
            results.append(GateResult(gate, gate.cell.describe(), None, NOT_MEASURED, NO_SUCH_CELL))
        for c in cells:
            value, reason = _value(c, gate.metric)
            if value is None:
                results.append(GateResult(gate, c.key.label, None, NOT_MEASURED, reason))
            else:
                ok = COMPARE[gate.comparison](value, gate.target)
                results.append(GateResult(gate, c.key.label, value, MET if ok else NOT_MET))
    return results


def gate_table(results: list[GateResult]) -> Table:
    """Gate | Cell | Target | Today | Status."""
    rows = [[r.gate.title, r.cell, r.gate.target_text, r.today_text(), r.status] for r in results]
    return Table(["Gate", "Cell", "Target", "Today", "Status"], rows, [False, False, True, True, False])


def gate_notes(gates: list[Gate]) -> list[str]:
    """Where each target comes from (the gates' `note`s), shown under the table."""
    return [f"{g.title}: {g.note}" for g in gates if g.note]
