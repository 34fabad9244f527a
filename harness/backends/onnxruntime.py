"""The ONNX Runtime backend: an ONNX source as it is, or a torch core exported (harness/backends/export.py)."""

from __future__ import annotations

from typing import Any

import onnx
import torch

from harness.backends import CoreSource
from harness.errors import UsageError
from harness.measure.device import Device

ORT_PROVIDER_NAMES = {
    "CPUExecutionProvider": "cpu",
    "CUDAExecutionProvider": "cuda",
    "TensorrtExecutionProvider": "tensorrt",
}


class OnnxRuntimeCore:
    """An ONNX Runtime session. On CUDA the session copies host<->device itself (no transfer stage)."""

    backend = "onnxruntime"
    format = "onnx"

    def __init__(self, model: onnx.ModelProto, device: Device, threads: int | None, precision: str = "fp32",
                 allow_spinning: bool = False):
        import onnxruntime as ort

        if precision != "fp32":
            raise UsageError(f"precision {precision} is not supported by the onnxruntime backend yet; use fp32")
        wanted = ["CPUExecutionProvider"]
        if device.is_cuda:
            available = ort.get_available_providers()
            wanted = [p for p in ("CUDAExecutionProvider",) if p in available] + wanted
        self._model, self._wanted = model, wanted
        self.threads = threads
        self.allow_spinning = allow_spinning
        self.session = self._session()
        self.input_name = self.session.get_inputs()[0].name
        self.execution_provider = self.session.get_providers()[0]
        self.provider = ORT_PROVIDER_NAMES.get(self.execution_provider, self.execution_provider.lower())
        self.precision = precision
        self.device = device
        self.torch_module = None
        self.export_info: dict[str, Any] | None = None  # set when the graph is an export of a torch core

    def _session(self, profile_prefix: str | None = None):
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        if self.threads:
            options.intra_op_num_threads = self.threads
        options.log_severity_level = 3
        # ORT's idle workers spin after each Run() by default and steal the cores the harness's own
        # pre/post-processing needs; measured here, end-to-end throughput is equal or better without it.
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if self.allow_spinning else "0")
        if profile_prefix is not None:
            options.enable_profiling = True
            options.profile_file_prefix = profile_prefix
        try:
            return ort.InferenceSession(self._model.SerializeToString(), options, providers=self._wanted)
        except Exception as exc:  # ORT raises its own Fail/InvalidGraph types
            raise UsageError(f"ONNX Runtime cannot load this graph ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0][:300]})") from exc

    def profiling_copy(self, prefix: str) -> OnnxRuntimeCore:
        """A second session of the same model with ORT's per-node profiler on (for the layer pass);
        `end_profiling()` on its session writes the Chrome-trace JSON and returns its path."""
        copy = OnnxRuntimeCore.__new__(OnnxRuntimeCore)
        copy.__dict__.update(self.__dict__)
        copy.session = self._session(profile_prefix=prefix)
        return copy

    def __call__(self, batch: torch.Tensor) -> list[torch.Tensor]:
        outputs = self.session.run(None, {self.input_name: batch.numpy()})
        return [torch.from_numpy(o) for o in outputs]

    def info(self) -> dict[str, Any]:
        import onnxruntime as ort

        return {
            "backend": self.backend,
            "execution_provider": self.execution_provider,
            "providers": self.session.get_providers(),
            "onnxruntime": ort.__version__,
            "intra_op_num_threads": self.threads,
            "intra_op_allow_spinning": self.allow_spinning,
            **({"exported_from_pytorch": self.export_info} if self.export_info else {}),
        }


class OnnxRuntimeBackend:
    """ONNX Runtime (CPU; CUDA when the device is a GPU and the CUDA provider is installed)."""

    name = "onnxruntime"

    def supports(self, source: CoreSource) -> bool:
        return source.onnx_model is not None or (source.torch_module is not None and source.exportable)

    def load(self, source: CoreSource, device: Device, precision: str, input_size: tuple[int, int],
             threads: int | None) -> OnnxRuntimeCore:
        from harness.backends.export import check_batch_rows, check_export, export_core

        if source.onnx_model is not None:
            core = OnnxRuntimeCore(source.onnx_model(), device, threads, precision)
            if source.check_batches:
                check_batch_rows(source.name, core, input_size, source.check_batches)
            return core
        module = source.torch_module().eval()
        model, path = export_core(source.name, module, input_size)
        core = OnnxRuntimeCore(model, device, threads, precision)
        core.export_info = {"file": str(path), **check_export(source.name, module, core, input_size, path)}
        return core
