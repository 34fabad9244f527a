"""The Detector protocol: what every model family provides to the shared pipeline.

A detector is split as DESIGN.md says: a *core* (float tensor [B,3,H,W] -> raw head tensors), a
*preprocessing spec* the harness applies, and a *decoder* (raw head tensors -> candidate boxes,
scores, classes before NMS). NMS, rescaling and COCO mapping are harness code shared by all.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, runtime_checkable

import torch


@dataclass(frozen=True)
class PreprocessSpec:
    """How images become the model's input tensor."""

    input_size: tuple[int, int]  # (height, width)
    resize: Literal["letterbox", "stretch"] = "letterbox"
    pad_position: Literal["top-left", "center"] = "top-left"
    pad_value: int = 114
    channel_order: Literal["BGR", "RGB"] = "BGR"
    scale: float = 1.0  # multiply pixel values (0-255) by this
    mean: tuple[float, float, float] | None = None  # after scaling, per channel in channel_order
    std: tuple[float, float, float] | None = None

    def with_input_size(self, size: int | tuple[int, int]) -> PreprocessSpec:
        hw = (size, size) if isinstance(size, int) else tuple(size)
        return PreprocessSpec(**{**self.__dict__, "input_size": hw})


@dataclass(frozen=True)
class ProtocolDefaults:
    """Evaluation thresholds; the site's protocol unless a family documents otherwise."""

    conf: float = 0.001
    iou: float = 0.6
    max_det: int = 300


@dataclass(frozen=True)
class Candidates:
    """Decoded head output of one image, before NMS: boxes xyxy in input-tensor pixels.

    A decoder may drop candidates whose score is below the `conf` it is given (the harness
    applies the threshold again, so a decoder that ignores it is still correct)."""

    boxes: torch.Tensor  # [K, 4]
    scores: torch.Tensor  # [K]
    labels: torch.Tensor  # [K] contiguous class index


@dataclass(frozen=True)
class WeightsInfo:
    """Where the weights came from (recorded in repro.weights)."""

    file: str
    sha256: str | None
    source: str  # "official release", "local file", "plugin", ...


@runtime_checkable
class Core(Protocol):
    """A loaded model core on one backend."""

    backend: str  # user-facing backend name: onnxruntime | pytorch | ...
    format: str  # site runtime.format: onnx | pytorch | tensorrt ...
    provider: str  # site runtime.provider: cpu | cuda | tensorrt ...
    precision: str  # fp32 | fp16 ...

    def __call__(self, batch: torch.Tensor) -> list[torch.Tensor]: ...

    def info(self) -> dict[str, Any]: ...


@runtime_checkable
class Detector(Protocol):
    """A model family instance: see the module docstring."""

    model_id: str
    family: str
    variant: str
    preprocess: PreprocessSpec
    defaults: ProtocolDefaults
    backends: tuple[str, ...]
    class_map: tuple[int, ...]  # contiguous class index -> COCO category id
    weights: WeightsInfo

    def load_core(
        self, backend: str, device: Any, precision: str, input_size: tuple[int, int], threads: int | None = None
    ) -> Core: ...

    def decode(self, raw: list[torch.Tensor], input_size: tuple[int, int], conf: float) -> list[Candidates]:
        """Raw head tensors of a batch -> one Candidates per image."""
        ...

    def model_stats(self, input_size: tuple[int, int]) -> ModelStats: ...


@dataclass
class ModelStats:
    """Static model statistics; None with a reason when a figure could not be computed."""

    params_millions: float | None = None
    gflops: float | None = None
    notes: dict[str, str] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"params_millions": self.params_millions, "gflops": self.gflops}
        if self.gflops is not None:
            out["flops_convention"] = "2 x multiply-accumulates of conv/linear/matmul (torch FlopCounterMode)"
        if self.notes:
            out["unavailable"] = self.notes
        return out

