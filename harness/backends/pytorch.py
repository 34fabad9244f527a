"""The PyTorch eager backend: the family's torch module, or its ONNX graph converted by onnx2torch."""

from __future__ import annotations

import io
import warnings
from typing import Any

import onnx
import torch

from harness.backends import CoreSource
from harness.errors import UsageError
from harness.measure.device import Device


class TorchCore:
    """A PyTorch module in eval mode on the device; forward under inference_mode."""

    backend = "pytorch"
    format = "pytorch"

    def __init__(self, module: torch.nn.Module, device: Device, precision: str = "fp32"):
        if precision != "fp32":
            raise UsageError(f"precision {precision} is not supported by the pytorch backend yet; use fp32")
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


def count_flops(module: torch.nn.Module, input_size: tuple[int, int]) -> int:
    """FLOPs of one batch-1 forward (FlopCounterMode: 2 x MACs of conv/linear/matmul)."""
    from torch.utils.flop_counter import FlopCounterMode

    x = torch.zeros(1, 3, *input_size)
    counter = FlopCounterMode(display=False)
    with counter, torch.inference_mode():
        module(x)
    return int(counter.get_total_flops())


class PyTorchBackend:
    """Eager PyTorch. A source with only an ONNX graph runs as its onnx2torch conversion."""

    name = "pytorch"

    def supports(self, source: CoreSource) -> bool:
        return source.torch_module is not None or source.onnx_model is not None

    def load(self, source: CoreSource, device: Device, precision: str, input_size: tuple[int, int],
             threads: int | None) -> TorchCore:
        if source.torch_module is not None:
            return TorchCore(source.torch_module(), device, precision)
        try:
            module = onnx_to_torch(source.onnx_model())
        except Exception as exc:  # onnx2torch raises NotImplementedError/KeyError for unsupported ops
            raise UsageError(f"{source.name}: onnx2torch cannot convert this ONNX graph "
                             f"({type(exc).__name__}: {exc}); use --backend onnxruntime") from exc
        core = TorchCore(module, device, precision)
        if source.check_batches:
            from harness.backends.export import check_batch_rows

            check_batch_rows(source.name, core, input_size, source.check_batches)
        return core
