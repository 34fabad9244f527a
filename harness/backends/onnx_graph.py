"""The ONNX graph a converting backend starts from, and the check of what it built against the source.

Backends that run their own format (OpenVINO, ncnn, LiteRT) convert from ONNX: the family's graph as it
is, or its torch core exported once with a dynamic batch (harness/backends/export.py, cached). What the
runtime built is run at batch 1, 2 and 4 before use, on the same random images as its reference: the torch
module for an exported core, ONNX Runtime (CPU) on the source graph for a graph given as ONNX.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import onnx
import torch

from harness.backends.export import CHECK_BATCHES, check_export, export_core, export_path, state_dict_sha256
from harness.detector.graph import RELATIVE_TOLERANCE, check_batch_rows, max_relative_diff, shape_mismatch
from harness.detector.source import CoreSource
from harness.errors import UsageError


def has_onnx_graph(source: CoreSource) -> bool:
    """Whether the source has an ONNX graph: given as one, or exportable from its torch core."""
    return source.onnx_model is not None or (source.torch_module is not None and source.exportable)


def onnx_graph(source: CoreSource, input_size: tuple[int, int]) -> tuple[onnx.ModelProto, torch.nn.Module | None]:
    """The source's ONNX graph (batch axis symbolic) and, for an exported torch core, its module."""
    if source.onnx_model is not None:
        return source.onnx_model(), None
    module = source.torch_module().eval()
    cached = export_path(source.name, state_dict_sha256(module), input_size).is_file()
    model, path = export_core(source.name, module, input_size)
    if cached:
        # the cache is keyed by the weights alone: an export made before the module's code was edited would be
        # converted as this code, refused for good at fp32 and run unchecked at fp16 or int8. A disagreeing one is
        # removed from the cache (check_export) and the current code exported.
        try:
            check_export(source.name, module, _source_session(model), input_size, path, batches=(1,),
                         rows_as_set=source.query_rows)
        except Exception:  # a disagreement, or an entry ONNX Runtime cannot even load: the current code exported
            if path is not None:
                path.unlink(missing_ok=True)
            model, _ = export_core(source.name, module, input_size)
    return model, module


def load_checked(make_core: Callable[[], Any], check: Callable[[Any], dict[str, Any]],
                 cache_entry: Callable[[Any], Path]) -> Any:
    """A converted core, checked against its source (`check`, the record of what was checked). A cached conversion
    that loads but disagrees (an entry damaged on disk, or left by a broken converter) is removed and converted once
    more, never refused for good; a fresh conversion that disagrees is the refusal."""
    core = make_core()
    try:
        core.conversion["checked"] = check(core)
    except UsageError:
        if not core.conversion.get("cached"):
            raise
        entry = cache_entry(core)
        if entry.is_dir():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        core = make_core()
        core.conversion["checked"] = check(core)
        core.conversion["converted_again"] = f"the cached conversion ({entry}) disagreed with its source: removed"
    return core


def check_against_source(source: CoreSource, graph: onnx.ModelProto, module: torch.nn.Module | None, core: Any,
                         input_size: tuple[int, int], runtime: str,
                         batches: tuple[int, ...] = CHECK_BATCHES) -> dict[str, Any]:
    """Run the converted core at `batches` against its source (one UsageError line when it disagrees), and
    each output row against its image alone where the source asks for it (`check_batches`); returns what was
    checked, for the record."""
    if source.check_batches:
        check_batch_rows(source.name, core, input_size, tuple(b for b in source.check_batches if b <= max(batches))
                         or (1,), source.query_rows)
    if module is not None:
        return {"against": "the torch module", **check_export(source.name, module, core, input_size, None,
                                                                runtime=runtime, batches=batches,
                                                                rows_as_set=source.query_rows)}
    torch.manual_seed(0)
    x = torch.rand(max(batches), 3, *input_size)
    try:
        want = _source_session(graph)(x)
    except Exception as exc:  # ORT's own exception types
        raise UsageError(f"{source.name}: ONNX Runtime cannot run the source graph at batch {max(batches)} to check "
                         f"the {runtime} conversion ({type(exc).__name__}: {str(exc).splitlines()[0][:160]})") from exc
    worst = 0.0
    for b in batches:
        try:
            got = core(x[:b].contiguous())
            diff = max_relative_diff(got, [w[:b] for w in want], source.query_rows)
            detail = (shape_mismatch(got, [w[:b] for w in want])
                      or f"max relative difference {diff:.2e} > {RELATIVE_TOLERANCE:.0e}")
        except Exception as exc:
            diff, detail = float("inf"), f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
        if not diff <= RELATIVE_TOLERANCE:
            raise UsageError(f"{source.name}: its {runtime} conversion disagrees with ONNX Runtime on the source graph "
                             f"at batch {b} ({detail}); use --backend onnxruntime")
        worst = max(worst, diff)
    return {"against": "ONNX Runtime (CPU) on the source graph", "checked_batches": list(batches),
            "max_relative_diff": worst}


def load_rows_checked(make_core: Callable[[], Any], source: CoreSource, graph: onnx.ModelProto,
                      input_size: tuple[int, int]) -> Any:
    """A converted core that differs from its source by more than the conversion check's tolerance (fp16 weights,
    int8), so not checked against it; where the source asks for it (`check_batches`), each output row of the source
    graph is still checked against its image alone, on ONNX Runtime (CPU), before the conversion."""
    if not source.check_batches:
        return make_core()
    check_batch_rows(source.name, _source_session(graph), input_size, source.check_batches, source.query_rows)
    core = make_core()
    core.conversion["checked"] = {"against": "each image alone, on the source graph (ONNX Runtime, CPU)",
                                  "checked_batches": list(source.check_batches)}
    return core


def _source_session(graph: onnx.ModelProto) -> Callable[[torch.Tensor], list[torch.Tensor]]:
    """The source graph on ONNX Runtime's CPU provider, as a core: a [B,3,H,W] tensor in, its outputs out."""
    import onnxruntime as ort

    session = ort.InferenceSession(graph.SerializeToString(), providers=["CPUExecutionProvider"])
    name = session.get_inputs()[0].name
    return lambda x: [torch.from_numpy(o) for o in session.run(None, {name: x.numpy()})]
