"""What a family hands to the backends: its core as a torch module builder, an ONNX graph or an engine file."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import onnx
    import torch


@dataclass(frozen=True)
class CoreSource:
    """What a family provides for its core: [B,3,H,W] float tensor in, raw head tensors out.

    - `torch_module`: builds the core as a torch module (weights loaded); its forward returns a
      tensor or a tuple of tensors (that order is the order of the raw outputs on every backend).
    - `onnx_model`: the core as an ONNX graph whose batch axis is symbolic.
    - `exportable`: False when the torch core cannot be exported with a dynamic batch; `export_note`
      says why (shown when someone asks for an export backend).
    - `check_batches`: for an ONNX source whose batch axis was made dynamic after the fact, batch
      sizes at which each output row must equal that image run alone (checked at load; empty: none).
    - `engine_file`: a serialized TensorRT engine of the core (built elsewhere by trtexec; only the
      tensorrt backend runs it, and a family gives it instead of a module or graph).
    - `query_rows`: the outputs are [B, N, K] rows of a set of queries (DETR-style, NMS-free top-k): another
      runtime may order near-equal queries differently, so load checks compare each image's rows as a set.
    """

    name: str
    torch_module: Callable[[], torch.nn.Module] | None = None
    onnx_model: Callable[[], onnx.ModelProto] | None = None
    exportable: bool = True
    export_note: str = ""
    check_batches: tuple[int, ...] = ()
    engine_file: Path | None = None
    query_rows: bool = False
