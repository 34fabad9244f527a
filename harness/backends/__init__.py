"""Backends run a family's core; families only describe it.

A family hands over a `CoreSource` (a torch module builder and/or an ONNX graph); a backend turns it
into a loaded `Core` (harness/detector/protocol.py) on a device. Families never dispatch on the backend
name, and backends know nothing about families:

    source = CoreSource("yolox-nano", onnx_model=lambda: graph)
    backend_names(source)                      # ("pytorch", "onnxruntime", "openvino", ...): what can run it
    core = load_core(source, "onnxruntime", device, "fp32", (416, 416), options=options, threads=2)

Built in: "pytorch" (eager; an ONNX-only source is converted with onnx2torch), "onnxruntime" (an
ONNX source as it is; a torch-only source is exported once with a dynamic batch, cached, and checked
against PyTorch at batch 1, 2 and 4 before use: harness/backends/export.py), "tensorrt" (a serialized
engine, `--weights x.engine`: harness/backends/tensorrt.py), and the runtimes that convert the ONNX graph
to their own format: "openvino" (fp32/fp16/int8), "ncnn" (pnnx; batch 1), "tflite" (LiteRT, converted by
onnx2tf; fp32/fp16/int8) and "torchscript" (a trace of the torch core). One file each; more backends plug
in with `register_backend`.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from harness.backends.support import BUILTINS
from harness.detector.source import CoreSource
from harness.errors import UsageError

if TYPE_CHECKING:
    from harness.config import RunConfig
    from harness.detector.protocol import Core, Detector


@dataclass(frozen=True)
class BackendOptions:
    """A run's backend settings, passed to every load (built from its RunConfig by `from_config`).

    - `ort_provider`: ONNX Runtime provider: auto (the device's own: cpu or cuda), cpu, cuda, tensorrt.
    - `trt_cache_dir`, `trt_workspace_mb`: TensorRT provider engine cache and builder workspace.
    - `batch_sizes`: the run's batch sizes (TensorRT engines are built for 1 and the largest; OpenVINO,
      LiteRT and compiled PyTorch prepare one shape each).
    - `compile`, `cuda_graphs`: PyTorch execution modes, compiled/captured per batch size.
    - `overlap`: overlapped (throughput) mode: a runtime with streams of its own (OpenVINO) compiles for
      throughput and keeps several forwards in flight.
    - `tf32`: TF32 on CUDA (off, on, default): runtimes with a switch of their own (ONNX Runtime's CUDA
      provider) are set to the same as torch's flags.
    """

    ort_provider: str
    trt_cache_dir: str
    trt_workspace_mb: int
    batch_sizes: tuple[int, ...]
    compile: str
    cuda_graphs: bool
    tf32: str
    overlap: bool = False

    @property
    def max_batch(self) -> int:
        """The largest batch size of the run."""
        return max(self.batch_sizes)

    @classmethod
    def from_config(cls, config: RunConfig) -> BackendOptions:
        """The backend settings of a run (its defaults are RunConfig's: declared once, there)."""
        return cls(ort_provider=config.ort_provider, trt_cache_dir=config.trt_cache_dir,
                   trt_workspace_mb=config.trt_workspace_mb, batch_sizes=tuple(sorted(set(config.batch_sizes))),
                   compile=config.compile, cuda_graphs=config.cuda_graphs, overlap=config.overlap,
                   tf32=config.tf32)


class Backend(Protocol):
    """A way to run cores. `name` is the user-facing `--backend` value."""

    name: str

    def supports(self, source: CoreSource) -> bool:
        """Whether this backend can run the source."""
        ...

    def load(self, source: CoreSource, device: Any, precision: str, input_size: tuple[int, int],
             threads: int | None, options: BackendOptions) -> Core:
        """Load the core on the device; UsageError (one line) when it cannot."""
        ...


BUILTIN_BACKENDS = tuple(BUILTINS)  # the registry entries: backends/support.py
_BACKENDS: dict[str, Backend] = {}
_builtins_loaded = False


def register_backend(backend: Backend) -> None:
    """Add (or replace) a backend under its name."""
    _BACKENDS[backend.name] = backend


def _registry() -> dict[str, Backend]:
    global _builtins_loaded
    if not _builtins_loaded:  # imported lazily: onnxruntime/onnx2torch are only paid for when used
        for name, entry in BUILTINS.items():
            backend = getattr(importlib.import_module(f"harness.backends.{entry.module}"), entry.cls)()
            assert backend.name == name, f"{entry.cls}.name is {backend.name!r}, its BUILTINS entry {name!r}"
            _BACKENDS.setdefault(name, backend)
        _builtins_loaded = True
    return _BACKENDS


def backend_names(source: CoreSource) -> tuple[str, ...]:
    """The registered backends that can run this source, in registration order."""
    return tuple(name for name, backend in _registry().items() if backend.supports(source))


def load_core(source: CoreSource, backend: str, device: Any, precision: str, input_size: tuple[int, int], *,
              options: BackendOptions, threads: int | None = None) -> Core:
    """Load `source` on the named backend; one-line UsageError when that backend cannot run it."""
    registry = _registry()
    if backend not in registry:
        raise UsageError(f"unknown backend {backend!r}; known: {', '.join(registry)}")
    if not registry[backend].supports(source):
        why = f" ({source.export_note})" if source.export_note and source.torch_module is not None else ""
        raise UsageError(f"{source.name} cannot run on {backend}{why}; use one of "
                         f"{', '.join(backend_names(source))}")
    from harness.backends.support import check_support

    check_support(backend, device.kind, precision, options.ort_provider, device.index)
    return registry[backend].load(source, device, precision, input_size, threads, options)


def detector_backends(detector: Detector) -> tuple[str, ...]:
    """The backends that can run a detector: those that can run its `core_source`, or what a plugin that loads
    its own core declares (`backends`)."""
    source = getattr(detector, "core_source", None)
    return backend_names(source) if source is not None else tuple(detector.backends)


def load_detector_core(detector: Detector, backend: str, device: Any, precision: str, input_size: tuple[int, int],
                       *, options: BackendOptions, threads: int | None = None) -> Core:
    """A detector's core loaded on a backend: its `core_source` on the registered backend, with the family's own
    checks when it has them (`check_input_size(input_size)` before, `check_core(core, input_size)` after); a
    plugin without a core source loads its core itself (`load_core(backend, device, precision, input_size,
    threads)`)."""
    check_size = getattr(detector, "check_input_size", None)
    if check_size is not None:
        check_size(input_size)
    source = getattr(detector, "core_source", None)
    if source is None:
        if backend not in detector.backends:
            raise UsageError(f"{detector.model_id} has no backend {backend!r}; it has {', '.join(detector.backends)}")
        core = detector.load_core(backend, device, precision, input_size, threads)
        if getattr(core, "precision", precision) != precision:  # the record would say what was asked, not what ran
            raise UsageError(f"{detector.model_id}: load_core gave a {core.precision} core for --precision "
                             f"{precision}; run the precision asked for, or refuse it in load_core")
        return core
    core = load_core(source, backend, device, precision, input_size, options=options, threads=threads)
    check = getattr(detector, "check_core", None)
    if check is not None:
        check(core, input_size)
    return core
