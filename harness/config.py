"""RunConfig: what `va-bench run` does, from a YAML preset (configs/*.yaml) plus CLI overrides."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from harness.errors import UsageError


class RunConfig(BaseModel):
    """A benchmark sweep on one device. Unknown keys are errors (typos must not pass silently)."""

    model_config = ConfigDict(extra="forbid")

    models: list[str] = Field(default_factory=lambda: ["yolox-nano"])
    weights: str | None = None  # only with a single model
    backends: list[str] = Field(default_factory=lambda: ["onnxruntime"])
    precisions: list[str] = Field(default_factory=lambda: ["fp32"])
    input_sizes: list[int] = Field(default_factory=list)  # empty: each model's native size
    batch_sizes: list[int] = Field(default_factory=lambda: [1])
    subset: str = "sample"
    limit: int | None = None
    coco_dir: str | None = None
    device: str = "cpu"
    threads: int | None = None  # None: all logical cores
    warmup_batches: int = Field(3, ge=0)
    warmup_seconds: float = Field(1.0, ge=0)
    min_timed_batches: int = Field(10, ge=1)
    max_timed_batches: int | None = Field(None, ge=1)
    stage_sync: bool = True
    overlap: bool = False  # overlapped mode: host work of neighbouring batches overlaps the forward
    accuracy: bool = True
    accuracy_batch_size: int = Field(1, ge=1)
    evaluator: Literal["pycocotools", "faster-coco-eval"] = "pycocotools"
    conf: float | None = None
    iou: float | None = None
    max_det: int | None = None
    tf32: Literal["on", "off", "default"] = "default"
    hardware_id: str | None = None
    output_dir: str = "outputs"
    run_id: str | None = None
    draw_images: int = Field(4, ge=0)
    # probes: each in its own pass (layers, profile) or a cheap window around the timed batches
    layers: bool = False
    layer_batches: int = Field(3, ge=1)
    profile: bool = False
    profile_batches: int = Field(2, ge=1)
    energy: bool = True
    memory: bool = True

    @field_validator("batch_sizes", "input_sizes")
    @classmethod
    def _positive(cls, values: list[int]) -> list[int]:
        if any(v < 1 for v in values):
            raise ValueError("must be positive integers")
        return list(dict.fromkeys(values))  # keep order, drop repeats

    @field_validator("models", "backends", "precisions", "batch_sizes")
    @classmethod
    def _not_empty(cls, values: list) -> list:
        if not values:
            raise ValueError("needs at least one value")
        return values


def load_config(path: str | Path | None, overrides: dict) -> RunConfig:
    """Load a YAML preset (safe_load) and apply CLI overrides (None means "not given")."""
    data: dict = {}
    if path is not None:
        path = Path(path)
        if not path.is_file():
            raise UsageError(f"--config {path}: no such file")
        try:
            data = yaml.safe_load(path.read_text()) or {}
        except yaml.YAMLError as exc:
            raise UsageError(f"--config {path} is not valid YAML ({exc.__class__.__name__}); fix the file") from exc
        if not isinstance(data, dict):
            raise UsageError(f"--config {path} must be a YAML mapping of RunConfig fields")
    data.update({k: v for k, v in overrides.items() if v is not None and v != []})
    try:
        return RunConfig(**data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise UsageError(f"invalid run configuration: {where}: {err['msg']}") from exc
