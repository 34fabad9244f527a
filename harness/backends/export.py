"""Export of a torch core to ONNX with a dynamic batch (cached, checked against PyTorch).

Exports use the TorchScript tracer (`torch.onnx.export(dynamo=False)`): the dynamo exporter needs
onnxscript and fails on detectors' data-dependent guards. Tracing bakes the traced batch into some
graphs, so the export is traced at batch EXPORT_BATCH (> 1), and before use every export is run at
batch 1, 2 and 4 against PyTorch: a graph that disagrees is deleted and the backend refuses it.
"""

from __future__ import annotations

import copy
import hashlib
import inspect
import warnings
from pathlib import Path
from typing import Any

import onnx
import torch

from harness.detector.graph import (
    RELATIVE_TOLERANCE,
    asking_no_gradient,
    max_relative_diff,
    module_outputs,
    shape_mismatch,
)
from harness.detector.weights import weights_dir
from harness.errors import UsageError
from harness.files import DiskFullError, atomic_file, safe_name
from harness.storage import cache_writes

OPSET = 17
EXPORT_BATCH = 2
CHECK_BATCHES = (1, 2, 4)


def state_dict_sha256(module: torch.nn.Module) -> str:
    """SHA-256 over the module's parameters and buffers (names, dtypes, shapes, bytes): the export
    cache key, the same for the same weights whatever file or seed they came from."""
    digest = hashlib.sha256()
    for name, tensor in module.state_dict().items():
        t = tensor.detach().cpu().contiguous()
        digest.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        digest.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return digest.hexdigest()


def module_code_sha256(module: torch.nn.Module) -> str:
    """SHA-256 over the source files that define the module's own classes (torch's left out: its version keys the
    caches already): a trace made before an edit of the code, under the same weights and structure, is another
    key. A class whose methods name no file counts by its qualified name."""
    sources = set()
    classes = {base for m in module.modules() for base in type(m).__mro__}  # an inherited forward is code too
    for cls in classes:
        if cls.__module__.split(".")[0] in ("torch", "builtins"):
            continue
        # the files its own methods were compiled from: found for a class of a file loaded outside sys.modules too
        files = {f.__code__.co_filename for f in vars(cls).values() if inspect.isfunction(f)}
        sources |= files or {f"{cls.__module__}.{cls.__qualname__}"}
    digest = hashlib.sha256()
    for source in sorted(sources):
        digest.update(f"{source}|".encode())
        try:
            digest.update(Path(source).read_bytes())
        except OSError:
            pass
    return digest.hexdigest()


def export_path(name: str, weights_hash: str, input_size: tuple[int, int]) -> Path:
    """Where the export of these weights at this input size is cached (under the weights cache)."""
    safe = safe_name(name, "core")
    h, w = input_size
    return weights_dir() / "onnx-exports" / f"{safe}__{weights_hash[:16]}__opset{OPSET}__{h}x{w}.onnx"


def export_core(name: str, module: torch.nn.Module, input_size: tuple[int, int]) -> tuple[onnx.ModelProto, Path]:
    """The module exported to ONNX at this input size with a dynamic batch axis; from the cache when
    these weights were exported before (keyed by weights hash + opset + input size)."""
    path = export_path(name, state_dict_sha256(module), input_size)
    if path.is_file():
        try:
            return onnx.load(str(path)), path
        except Exception:  # a damaged cache file: export again
            path.unlink(missing_ok=True)
    # the graph is for inference: a weight the forward reads outside the module's own parameters is a constant of it,
    # which the tracer refuses while it requires grad. RF-DETR's backbone, away from its native size, interpolates a
    # position embedding through a method its library bound to the module it built, which a copy still calls: the
    # module given asks for no gradient while it is exported, and its flags are put back after
    with asking_no_gradient(module):
        # a copy: a module that caches tensors made in its forward (an anchor grid) holds inference tensors once
        # PyTorch rows ran it under inference mode, and the tracer cannot use those (deepcopy clones them)
        return _export(name, copy.deepcopy(module), input_size, path)


def _export(name: str, module: torch.nn.Module, input_size: tuple[int, int],
            path: Path) -> tuple[onnx.ModelProto, Path]:
    example = torch.rand(EXPORT_BATCH, 3, *input_size)
    n_out = len(module_outputs(module, example))
    names = [f"out{i}" for i in range(n_out)]
    try:
        with atomic_file(path) as tmp, cache_writes(path, Path(tmp)):  # a full cache is not the model's fault
            with warnings.catch_warnings():  # the tracer warns about every Python-side shape computation
                warnings.simplefilter("ignore")
                torch.onnx.export(module, (example,), tmp, input_names=["images"], output_names=names,
                                  dynamic_axes={n: {0: "batch"} for n in ["images", *names]},
                                  opset_version=OPSET, dynamo=False)
            model = onnx.load(tmp)
    except DiskFullError:
        raise
    except Exception as exc:
        raise UsageError(f"{name}: ONNX export failed ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
                         "use --backend pytorch") from exc
    return model, path


def check_export(name: str, module: torch.nn.Module, core: Any, input_size: tuple[int, int],
                 path: Path | None, runtime: str = "onnxruntime", batches: tuple[int, ...] = CHECK_BATCHES,
                 rows_as_set: bool = False) -> dict[str, Any]:
    """Run the exported (or converted) core on `runtime` at `batches` against the torch module on the same
    random images; a disagreement deletes the cached file at `path` (if given) and raises one line. Returns what
    was checked."""
    torch.manual_seed(0)
    x = torch.rand(max(batches), 3, *input_size)
    want = module_outputs(module, x)
    worst = 0.0
    for b in batches:
        try:
            got = core(x[:b].contiguous())
            diff = max_relative_diff(got, [w[:b] for w in want], rows_as_set)
        except Exception as exc:  # ORT raises its own types when a baked shape meets another batch
            diff, error = float("inf"), f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
        else:
            error = (shape_mismatch(got, [w[:b] for w in want])
                     or f"max relative difference {diff:.2e} > {RELATIVE_TOLERANCE:.0e}")
        if not diff <= RELATIVE_TOLERANCE:
            fix = "use --backend pytorch"
            if path is not None:  # cached by the weights' hash: an export of the module's code before an edit
                path.unlink(missing_ok=True)
                fix = ("its export is removed from the cache: if the module's code changed since it was exported, "
                       f"run again (the current code is exported and checked anew); else {fix}")
            raise UsageError(f"{name}: on {runtime} it disagrees with PyTorch at batch {b} ({error}); {fix}")
        worst = max(worst, diff)
    return {"opset": OPSET, "traced_batch": EXPORT_BATCH, "checked_batches": list(batches),
            "max_relative_diff": worst}


