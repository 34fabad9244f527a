"""Serialized TensorRT engines (`--weights model.engine`, built by `trtexec`) run through the `tensorrt` package.

The leaderboard's own harness accepts such engines with a JSON sidecar describing the build
(`model.engine.json`, or `model.json` beside it: the trtexec command, precision, TensorRT version).
An engine is tied to the GPU and TensorRT version it was built with, so the sidecar is recorded
verbatim in runtime.engine_manifest. Without the `tensorrt` package, or without a GPU, the run is
refused before anything loads.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import torch

from harness.errors import UsageError
from harness.measure.device import Device

INSTALL = "pip install tensorrt-cu12 (or tensorrt-cu13, matching your CUDA)"


def tensorrt_installed() -> bool:
    return importlib.util.find_spec("tensorrt") is not None


def manifest_path(engine: Path) -> Path | None:
    """The engine's JSON sidecar: `x.engine.json`, else `x.json`; None when neither exists."""
    for candidate in (engine.with_name(engine.name + ".json"), engine.with_suffix(".json")):
        if candidate.is_file():
            return candidate
    return None


def read_manifest(engine: Path) -> dict[str, Any]:
    """The sidecar as a dict (json, never executed); a missing or unreadable one is a UsageError."""
    path = manifest_path(engine)
    if path is None:
        raise UsageError(f"--weights {engine}: no JSON sidecar ({engine.name}.json) describing how the engine was "
                         "built; write one with the trtexec command, precision and TensorRT version")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"{path}: not a readable JSON sidecar ({exc}); fix the file") from exc
    if not isinstance(data, dict):
        raise UsageError(f"{path}: the sidecar must be a JSON object")
    return data


def check_engine_weights(weights: str, device_kind: str) -> None:
    """Refuse a serialized engine that cannot run here (before any model is loaded)."""
    engine = Path(weights)
    if not engine.is_file():
        raise UsageError(f"--weights {engine}: no such file")
    if device_kind != "cuda":
        raise UsageError(f"--weights {engine.name} is a TensorRT engine: it runs on a GPU only; add --device cuda")
    if not tensorrt_installed():
        raise UsageError(f"--weights {engine.name} is a TensorRT engine, but the `tensorrt` package is not "
                         f"installed; {INSTALL}")
    read_manifest(engine)


class TensorRTEngineCore:
    """A deserialized engine; torch CUDA tensors are its I/O buffers (execute_async_v3 on torch's stream)."""

    backend = "tensorrt"
    format = "tensorrt"
    provider = "cuda"

    def __init__(self, engine_file: Path, device: Device, precision: str):
        import tensorrt as trt

        self._trt = trt
        self.manifest = read_manifest(engine_file)
        self.engine_file, self.device, self.precision = engine_file, device, precision
        self.torch_module = None
        runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
        self.engine = runtime.deserialize_cuda_engine(engine_file.read_bytes())
        if self.engine is None:
            raise UsageError(f"{engine_file}: TensorRT could not deserialize it (built for another GPU or "
                             f"TensorRT {self.manifest.get('tensorrt_version', '?')}?); rebuild it here")
        self.context = self.engine.create_execution_context()
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.inputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if n not in self.inputs]
        if len(self.inputs) != 1:
            raise UsageError(f"{engine_file}: expected one input tensor, found {self.inputs}")

    def _dtype(self, name: str) -> torch.dtype:
        trt = self._trt
        return {trt.float32: torch.float32, trt.float16: torch.float16, trt.int32: torch.int32,
                trt.int64: torch.int64, trt.bfloat16: torch.bfloat16}[self.engine.get_tensor_dtype(name)]

    def __call__(self, batch: torch.Tensor) -> list[torch.Tensor]:
        name = self.inputs[0]
        x = batch.to(self.device.torch_device, self._dtype(name)).contiguous()
        self.context.set_input_shape(name, tuple(x.shape))
        self.context.set_tensor_address(name, x.data_ptr())
        outputs = []
        for out in self.outputs:
            y = torch.empty(tuple(self.context.get_tensor_shape(out)), dtype=self._dtype(out),
                            device=self.device.torch_device)
            self.context.set_tensor_address(out, y.data_ptr())
            outputs.append(y)
        if not self.context.execute_async_v3(torch.cuda.current_stream(self.device.index).cuda_stream):
            raise RuntimeError(f"TensorRT execution failed for {self.engine_file.name}")
        return [o.float() for o in outputs]

    def info(self) -> dict[str, Any]:
        return {"backend": self.backend, "tensorrt": self._trt.__version__, "engine_file": str(self.engine_file),
                "engine_manifest": self.manifest, "device_name": f"{self.device} {self.device.name()}"}
