"""The ONNX graph a converting backend starts from, and the check of what it built against the source.

Backends that run their own format (OpenVINO, ncnn, LiteRT) convert from ONNX: the family's graph as it
is, or its torch core exported once with a dynamic batch (harness/backends/export.py, cached). What the
runtime built is run at batch 1, 2 and 4 before use: against the torch module for an exported core, or
each output row against its image run alone for a graph given as ONNX.
"""

from __future__ import annotations

from typing import Any

import onnx
import torch

from harness.backends import CoreSource
from harness.backends.export import CHECK_BATCHES, check_batch_rows, check_export, export_core


def onnx_graph(source: CoreSource, input_size: tuple[int, int]) -> tuple[onnx.ModelProto, torch.nn.Module | None]:
    """The source's ONNX graph (batch axis symbolic) and, for an exported torch core, its module."""
    if source.onnx_model is not None:
        return source.onnx_model(), None
    module = source.torch_module().eval()
    model, _ = export_core(source.name, module, input_size)
    return model, module


def check_against_source(source: CoreSource, module: torch.nn.Module | None, core: Any,
                         input_size: tuple[int, int], runtime: str,
                         batches: tuple[int, ...] = CHECK_BATCHES) -> dict[str, Any]:
    """Run the converted core at `batches` against its source (one UsageError line when it disagrees);
    returns what was checked, for the record."""
    if module is not None:
        from harness.backends.export import export_path, state_dict_sha256

        path = export_path(source.name, state_dict_sha256(module), input_size)
        return {"against": "the torch module", **check_export(source.name, module, core, input_size, path,
                                                                runtime=runtime, batches=batches)}
    check_batch_rows(source.name, core, input_size, batches)
    return {"against": "each image run alone", "checked_batches": list(batches)}
