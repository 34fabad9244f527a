"""Backends run a family's core; families only describe it.

A family hands over a `CoreSource` (a torch module builder and/or an ONNX graph); a backend turns it
into a loaded `Core` (harness/models/protocol.py) on a device. Families never dispatch on the backend
name, and backends know nothing about families:

    source = CoreSource("yolox-nano", onnx_model=lambda: graph)
    backend_names(source)                      # ("pytorch", "onnxruntime"): what can run it
    core = load_core(source, "onnxruntime", device, "fp32", (416, 416), threads=2)

Built in: "pytorch" (eager; an ONNX-only source is converted with onnx2torch), "onnxruntime" (an
ONNX source as it is; a torch-only source is exported once with a dynamic batch, cached, and checked
against PyTorch at batch 1, 2 and 4 before use: harness/backends/export.py), "tensorrt" (a serialized
engine, `--weights x.engine`: harness/backends/tensorrt.py), and the runtimes that convert the ONNX graph
to their own format: "openvino" (fp32/fp16/int8), "ncnn" (pnnx; batch 1), "tflite" (LiteRT, converted by
onnx2tf; fp32/fp16/int8) and "torchscript" (a trace of the torch core). One file each; more backends plug
in with `register_backend`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from harness.errors import UsageError

if TYPE_CHECKING:
    import onnx
    import torch

    from harness.models.protocol import Core


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


@dataclass(frozen=True)
class BackendOptions:
    """Run-wide backend settings (from RunConfig, set by plan_cells before anything loads).

    - `ort_provider`: ONNX Runtime provider: auto (the device's own: cpu or cuda), cpu, cuda, tensorrt.
    - `trt_cache_dir`, `trt_workspace_mb`: TensorRT provider engine cache and builder workspace.
    - `max_batch`: the largest batch size of the run (TensorRT engines are built for 1 and this at load).
    - `batch_sizes`, `compile`, `cuda_graphs`: PyTorch execution modes, compiled/captured per batch size.
    """

    ort_provider: str = "auto"
    trt_cache_dir: str = "~/.cache/va-bench/tensorrt"
    trt_workspace_mb: int = 4096
    max_batch: int = 1
    batch_sizes: tuple[int, ...] = (1,)
    compile: str = "none"
    cuda_graphs: bool = False


# One run per process: plan_cells sets these once, and the backends read them at load (the load_core
# signature shared by every family stays backend-agnostic).
_options = BackendOptions()


def set_options(options: BackendOptions) -> None:
    """Set the run-wide backend options (plan_cells does, from the RunConfig)."""
    global _options
    _options = options


def current_options() -> BackendOptions:
    """The run-wide backend options in effect."""
    return _options


class Backend(Protocol):
    """A way to run cores. `name` is the user-facing `--backend` value."""

    name: str

    def supports(self, source: CoreSource) -> bool:
        """Whether this backend can run the source."""
        ...

    def load(self, source: CoreSource, device: Any, precision: str, input_size: tuple[int, int],
             threads: int | None) -> Core:
        """Load the core on the device; UsageError (one line) when it cannot."""
        ...


_BACKENDS: dict[str, Backend] = {}
_builtins_loaded = False


def register_backend(backend: Backend) -> None:
    """Add (or replace) a backend under its name."""
    _BACKENDS[backend.name] = backend


def _registry() -> dict[str, Backend]:
    global _builtins_loaded
    if not _builtins_loaded:  # imported lazily: onnxruntime/onnx2torch are only paid for when used
        from harness.backends.ncnn import NcnnBackend
        from harness.backends.onnxruntime import OnnxRuntimeBackend
        from harness.backends.openvino import OpenVinoBackend
        from harness.backends.pytorch import PyTorchBackend
        from harness.backends.tensorrt import TensorRTBackend
        from harness.backends.tflite import TfliteBackend
        from harness.backends.torchscript import TorchScriptBackend

        for backend in (PyTorchBackend(), OnnxRuntimeBackend(), TensorRTBackend(), OpenVinoBackend(), NcnnBackend(),
                        TfliteBackend(), TorchScriptBackend()):
            _BACKENDS.setdefault(backend.name, backend)
        _builtins_loaded = True
    return _BACKENDS


def backend_names(source: CoreSource) -> tuple[str, ...]:
    """The registered backends that can run this source, in registration order."""
    return tuple(name for name, backend in _registry().items() if backend.supports(source))


def load_core(source: CoreSource, backend: str, device: Any, precision: str, input_size: tuple[int, int],
              threads: int | None = None) -> Core:
    """Load `source` on the named backend; one-line UsageError when that backend cannot run it."""
    registry = _registry()
    if backend not in registry:
        raise UsageError(f"unknown backend {backend!r}; known: {', '.join(registry)}")
    if not registry[backend].supports(source):
        why = f" ({source.export_note})" if source.export_note and source.torch_module is not None else ""
        raise UsageError(f"{source.name} cannot run on {backend}{why}; use one of "
                         f"{', '.join(backend_names(source))}")
    from harness.backends.support import check_support

    check_support(backend, device.kind, precision, current_options().ort_provider, device.index)
    return registry[backend].load(source, device, precision, input_size, threads)
