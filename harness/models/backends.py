"""Model cores on each backend: ONNX Runtime sessions and PyTorch modules (incl. ONNX via onnx2torch)."""

from __future__ import annotations

import io
import warnings
from typing import Any

import numpy as np
import onnx
import torch

from harness.measure.device import Device

ORT_PROVIDER_NAMES = {
    "CPUExecutionProvider": "cpu",
    "CUDAExecutionProvider": "cuda",
    "TensorrtExecutionProvider": "tensorrt",
}


def make_batch_dynamic(model: onnx.ModelProto, spatial_dynamic: bool = True) -> onnx.ModelProto:
    """Return a copy whose batch axis (and optionally H, W) is symbolic.

    Exporters often bake the traced batch into Reshape targets (YOLOX: [1, 85, -1]); a 0 there
    means "copy this dim from the input", which makes the graph batch-agnostic.
    """
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    for value in list(graph.input) + list(graph.output):
        dims = value.type.tensor_type.shape.dim
        if dims:
            dims[0].dim_param = "batch"
        if spatial_dynamic and value in graph.input and len(dims) == 4:
            dims[2].dim_param, dims[3].dim_param = "height", "width"
    reshape_shapes = {node.input[1] for node in graph.node if node.op_type == "Reshape"}
    for init in graph.initializer:
        if init.name in reshape_shapes:
            shape = onnx.numpy_helper.to_array(init)
            if shape.ndim == 1 and shape.size > 1 and shape[0] == 1:
                fixed = shape.copy()
                fixed[0] = 0
                init.CopyFrom(onnx.numpy_helper.from_array(fixed, init.name))
    for node in graph.node:  # the same constants may come as Constant nodes
        if node.op_type == "Constant" and node.output[0] in reshape_shapes:
            for attr in node.attribute:
                if attr.name == "value":
                    shape = onnx.numpy_helper.to_array(attr.t)
                    if shape.ndim == 1 and shape.size > 1 and shape[0] == 1:
                        fixed = shape.copy()
                        fixed[0] = 0
                        attr.t.CopyFrom(onnx.numpy_helper.from_array(fixed))
    del graph.value_info[:]  # stale static shapes of intermediates would contradict the new dims
    return model


def onnx_param_count(model: onnx.ModelProto) -> int:
    """Number of weights stored in the graph (float initializers)."""
    total = 0
    for init in model.graph.initializer:
        if init.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE):
            total += int(np.prod(init.dims)) if init.dims else 1
    return total


def count_flops(module: torch.nn.Module, input_size: tuple[int, int]) -> int:
    """FLOPs of one batch-1 forward (FlopCounterMode: 2 x MACs of conv/linear/matmul)."""
    from torch.utils.flop_counter import FlopCounterMode

    x = torch.zeros(1, 3, *input_size)
    counter = FlopCounterMode(display=False)
    with counter, torch.inference_mode():
        module(x)
    return int(counter.get_total_flops())


class OnnxRuntimeCore:
    """An ONNX Runtime session. On CUDA the session copies host<->device itself (no transfer stage)."""

    backend = "onnxruntime"
    format = "onnx"

    def __init__(self, model: onnx.ModelProto, device: Device, threads: int | None, precision: str = "fp32",
                 allow_spinning: bool = False):
        import onnxruntime as ort

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
        return ort.InferenceSession(self._model.SerializeToString(), options, providers=self._wanted)

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
        }


class TorchCore:
    """A PyTorch module in eval mode on the device; forward under inference_mode."""

    backend = "pytorch"
    format = "pytorch"

    def __init__(self, module: torch.nn.Module, device: Device, precision: str = "fp32"):
        if precision != "fp32":
            raise ValueError(f"precision {precision} is not supported by the pytorch backend yet")
        self.torch_module = module.eval().to(device.torch_device)
        self.device = device
        self.precision = precision
        self.provider = "cuda" if device.is_cuda else "cpu"

    def __call__(self, batch: torch.Tensor) -> list[torch.Tensor]:
        with torch.inference_mode():
            out = self.torch_module(batch)
        if isinstance(out, torch.Tensor):
            return [out]
        return list(out)

    def info(self) -> dict[str, Any]:
        return {"backend": self.backend, "torch_threads": torch.get_num_threads(), "device": str(self.device)}


def onnx_to_torch(model: onnx.ModelProto) -> torch.nn.Module:
    """Convert an ONNX graph into a real torch module (onnx2torch): hooks/profiler see real layers."""
    from onnx2torch import convert

    # onnx2torch's Slice indexes with a list (deprecated in torch); harmless, but noisy at every forward.
    warnings.filterwarnings("ignore", message="Using a non-tuple sequence", category=UserWarning)

    buffer = io.BytesIO(model.SerializeToString())
    return convert(onnx.load_model(buffer))
