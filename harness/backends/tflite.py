"""The LiteRT (TFLite) backend (CPU): the family's ONNX graph converted by onnx2tf, run by `ai-edge-litert`.

- Conversion: onnx2tf (pinned by the `edge` extra, its version recorded), in a child process (TensorFlow is
  heavy and stays out of the benchmark's process), from the graph with a symbolic batch and the run's static
  input size, so one model serves every batch size (the interpreter is resized per batch size, at load).
  onnx2tf reads its own sample data from its working folder or else downloads it: a deterministic file is
  written there, so a conversion never touches the network. Cached by the graph's SHA-256, the onnx2tf
  version, the input size and the precision (and, for int8, the calibration data's SHA-256).
- Layout: LiteRT models take NHWC; the batch is transposed on the way in (inside the forward, where a user of
  the model pays for it too). The outputs come back in the graph's order (onnx2tf's Identity, Identity_1, ...)
  and NCHW for 4-D ones; the load check against ONNX Runtime catches any other order.
- Precision: fp32 (XNNPACK fp32), fp16 (onnx2tf's fp16-weight model; XNNPACK computes fp32 on CPUs without
  fp16 arithmetic), int8 (onnx2tf's integer-quantised model with float input/output, calibrated on the run's
  calibration images, never evaluated ones). What the model holds is read back from its tensors.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from harness.backends import BackendOptions
from harness.backends.onnx_graph import (
    check_against_source,
    has_onnx_graph,
    load_checked,
    load_rows_checked,
    onnx_graph,
)
from harness.detector.source import CoreSource
from harness.detector.weights import weights_dir
from harness.errors import UsageError
from harness.files import move_into_place, safe_name
from harness.measure.device import Device
from harness.storage import cache_writes

CONVERT_TIMEOUT_S = 1200
# onnx2tf's own sample data (for its internal checks), read from the working folder when present
ONNX2TF_SAMPLE = "calibration_image_sample_data_20x128x128x3_float32.npy"
MODEL_FILES = {"fp32": "model_float32.tflite", "fp16": "model_float16.tflite", "int8": "model_integer_quant.tflite"}
CONVERT = """
import sys
import onnx2tf
calibration = sys.argv[2] if len(sys.argv) > 2 else None
onnx2tf.convert(input_onnx_file_path="model.onnx", output_folder_path="out", non_verbose=True,
                output_integer_quantized_tflite=calibration is not None,
                custom_input_op_name_np_data_path=[[sys.argv[1], calibration, 0.0, 1.0]] if calibration else None)
"""


def _cache_dir(name: str, graph_sha: str, input_size: tuple[int, int], variant: str) -> Path:
    safe = safe_name(name, "core")
    h, w = input_size
    return weights_dir() / "tflite" / f"{safe}__{graph_sha[:16]}__onnx2tf{version('onnx2tf')}__{h}x{w}__{variant}"


def _static_size(model: onnx.ModelProto, input_size: tuple[int, int]) -> onnx.ModelProto:
    """A copy whose input has the run's height and width (the batch stays symbolic)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[0].dim_param = "batch"
    for dim, value in zip(dims[2:], input_size, strict=True):
        dim.dim_value = value
    return model


def convert_with_onnx2tf(name: str, graph: onnx.ModelProto, input_size: tuple[int, int], precision: str,
                         calibration: np.ndarray | None = None) -> tuple[Path, dict]:
    """The .tflite of this graph at this precision (cached, else converted by onnx2tf in a child process)."""
    model = _static_size(graph, input_size)
    data = model.SerializeToString()
    sha = hashlib.sha256(data).hexdigest()
    variant = "float"  # one conversion writes both the fp32 and the fp16-weight model
    if calibration is not None:
        variant = "int8-" + hashlib.sha256(calibration.tobytes()).hexdigest()[:16]
    folder = _cache_dir(name, sha, input_size, variant)
    info = {"converter": "onnx2tf (ONNX -> TFLite)", "onnx2tf": version("onnx2tf"), "source_sha256": sha,
            "file": str(folder / MODEL_FILES[precision])}
    if (folder / MODEL_FILES[precision]).is_file():
        return folder / MODEL_FILES[precision], {**info, "cached": True}
    clock = time.perf_counter()
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}."))
    try:
        with cache_writes(folder, tmp):  # onnx2tf fails in its own words when the cache's disk is full: named as such
            (tmp / "model.onnx").write_bytes(data)
            np.save(tmp / ONNX2TF_SAMPLE, np.random.default_rng(0).random((20, 128, 128, 3), dtype=np.float32))
            args = [model.graph.input[0].name]
            if calibration is not None:
                np.save(tmp / "calibration.npy", calibration)
                args.append("calibration.npy")
            env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
            done = subprocess.run([sys.executable, "-c", CONVERT, *args], cwd=tmp, capture_output=True, text=True,
                                  timeout=CONVERT_TIMEOUT_S, env=env)
            produced = {p.name: p for p in (tmp / "out").glob("*.tflite")} if (tmp / "out").is_dir() else {}
            wanted = {MODEL_FILES[k] for k in (("int8",) if calibration is not None else ("fp32", "fp16"))}
            if done.returncode != 0 or not wanted <= set(produced):
                text = re.sub(r"\x1b\[[0-9;]*m", "", done.stderr + done.stdout)  # onnx2tf colours its errors
                tail = [line.strip() for line in text.splitlines() if line.strip()
                        and not line.startswith(("I0000", "W0000", "WARNING: All log"))][-2:]
                raise UsageError(f"{name}: onnx2tf cannot convert this graph to TFLite (exit {done.returncode}: "
                                 f"{' / '.join(tail)[:300]}); use --backend onnxruntime")
            folder.mkdir(parents=True, exist_ok=True)
            for file, path in produced.items():  # onnx2tf names them after model.onnx: model_float32.tflite ...
                if file in MODEL_FILES.values():
                    move_into_place(path, folder / file)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder / MODEL_FILES[precision], {**info, "cached": False, "seconds": round(time.perf_counter() - clock, 3)}


class TfliteCore:
    """A LiteRT interpreter per batch size (resized and allocated at load), NHWC in, the graph's outputs out."""

    backend = "tflite"
    format = "tflite"
    provider = "cpu"
    takes_device_tensors = False
    torch_module = None

    def __init__(self, name: str, graph: onnx.ModelProto, device: Device, threads: int | None, precision: str,
                 input_size: tuple[int, int]):
        self.name, self.graph, self.device, self.threads = name, graph, device, threads
        self.precision, self.input_size = precision, input_size
        self.output_names = [o.name for o in graph.graph.output]
        self.path: Path | None = None
        self.conversion: dict[str, Any] = {}
        self.quantization: dict[str, Any] | None = None
        self._interpreters: dict[int, Any] = {}
        self._io: dict[int, tuple[int, list[int]]] = {}  # batch size -> input index, output indices in graph order
        self.held: dict[str, int] = {}
        self._calibration_data: np.ndarray | None = None
        if precision != "int8":
            self.path, self.conversion = convert_with_onnx2tf(name, graph, input_size, precision)

    @property
    def needs_calibration(self) -> bool:
        return self.precision == "int8" and self.path is None

    def calibrate(self, batches: list[torch.Tensor], calibration: dict[str, Any]) -> None:
        """int8: onnx2tf's integer quantisation calibrated on these preprocessed images (NHWC, as the model
        takes them; mean 0 and std 1: they are already what the model reads)."""
        data = np.concatenate([b.numpy() for b in batches]).transpose(0, 2, 3, 1).copy()
        self._calibration_data = data
        self.path, self.conversion = convert_with_onnx2tf(self.name, self.graph, self.input_size, "int8", data)
        self.quantization = {"method": "onnx2tf integer quantisation (int8 weights and activations, float input "
                                       "and output)", "calibration_data_sha256": hashlib.sha256(data.tobytes())
                             .hexdigest(), **calibration}

    def prepare(self, batch_sizes: tuple[int, ...]) -> None:
        for b in batch_sizes:
            self._interpreter(b)

    def prepare_shape(self, shape: tuple[int, ...]) -> None:
        self._interpreter(shape[0])

    def _interpreter(self, batch: int) -> Any:
        if batch not in self._interpreters:
            if self.path is None:
                raise RuntimeError("int8 TFLite core used before calibrate()")
            try:
                interpreter = self._interpreter_for(batch)
            except (RuntimeError, ValueError) as exc:
                if not self.conversion.get("cached") or self._interpreters:
                    raise UsageError(f"{self.name}: LiteRT cannot run the converted model at batch {batch} "
                                     f"({str(exc).splitlines()[0][:200]}); use --backend onnxruntime") from exc
                shutil.rmtree(self.path.parent, ignore_errors=True)  # a damaged cache entry: convert again, once
                self.path, self.conversion = convert_with_onnx2tf(self.name, self.graph, self.input_size,
                                                                  self.precision, self._calibration_data)
                interpreter = self._interpreter_for(batch)
            self._interpreters[batch] = interpreter
            self.held = self._read_back(interpreter)
            if self.precision == "int8" and not self.held.get("int8"):
                raise UsageError(f"{self.name}: the int8 TFLite model onnx2tf wrote holds no int8 tensor (not "
                                 "quantised); it cannot be published as int8: use --precision fp32 or fp16")
            inputs, outputs = interpreter.get_input_details(), self._outputs_in_graph_order(interpreter)
            self._io[batch] = (inputs[0]["index"], [d["index"] for d in outputs])
        return self._interpreters[batch]

    def _interpreter_for(self, batch: int) -> Any:
        from ai_edge_litert.interpreter import Interpreter

        interpreter = Interpreter(model_path=str(self.path), num_threads=self.threads or os.cpu_count())
        interpreter.resize_tensor_input(interpreter.get_input_details()[0]["index"], [batch, *self.input_size, 3])
        interpreter.allocate_tensors()
        return interpreter

    @staticmethod
    def _read_back(interpreter: Any) -> dict[str, int]:
        """How many of the model's tensors are held in each type (int8 tensors: the model is quantised)."""
        counts: dict[str, int] = {}
        for detail in interpreter.get_tensor_details():
            name = np.dtype(detail["dtype"]).name
            counts[name] = counts.get(name, 0) + 1
        return counts

    def _outputs_in_graph_order(self, interpreter: Any) -> list[dict]:
        """onnx2tf names the outputs Identity, Identity_1, ... in the graph's order (it keeps no ONNX names in the
        model): that order, and as many as the graph has; whether they are the right tensors is what the load
        check against ONNX Runtime shows."""
        def rank(detail: dict) -> tuple[int, str]:
            suffix = detail["name"].rsplit("_", 1)[-1]
            return (int(suffix) if suffix.isdigit() else 0, detail["name"])

        details = sorted(interpreter.get_output_details(), key=rank)
        if len(details) != len(self.output_names):
            raise UsageError(f"{self.name}: the TFLite model has {len(details)} outputs where the graph has "
                             f"{len(self.output_names)}; use --backend onnxruntime")
        return details

    def __call__(self, batch: torch.Tensor) -> list[torch.Tensor]:
        interpreter = self._interpreter(batch.shape[0])
        input_index, output_indices = self._io[batch.shape[0]]
        interpreter.set_tensor(input_index, np.ascontiguousarray(batch.numpy().transpose(0, 2, 3, 1)))
        interpreter.invoke()
        outputs = []
        for index in output_indices:
            array = interpreter.get_tensor(index)
            if array.ndim == 4:  # onnx2tf keeps 4-D outputs NHWC: the decoder reads the graph's NCHW
                array = array.transpose(0, 3, 1, 2)
            outputs.append(torch.from_numpy(np.ascontiguousarray(array)))
        return outputs

    @property
    def compute_precision(self) -> str:
        return "int8 (quantised ops) + fp32" if self.precision == "int8" else "fp32"

    def info(self) -> dict[str, Any]:
        return {"backend": self.backend, "ai_edge_litert": version("ai-edge-litert"), "device_name": "cpu",
                "compute_precision": self.compute_precision, "num_threads": self.threads or os.cpu_count(),
                "precision_mode": {"fp32": "fp32 model, XNNPACK fp32",
                                   "fp16": "fp16 weights (onnx2tf), XNNPACK computes fp32 here",
                                   "int8": "int8 quantised model (onnx2tf), float input and output"}[self.precision],
                "tensor_types": self.held, "conversion": self.conversion,
                "layers_unavailable": "LiteRT's Python interpreter exposes no per-op timing",
                **({"quantization": self.quantization} if self.quantization else {})}


class TfliteBackend:
    """LiteRT on the CPU: fp32, fp16 (fp16 weights), int8 (calibrated at load)."""

    name = "tflite"

    def supports(self, source: CoreSource) -> bool:
        return has_onnx_graph(source)

    def load(self, source: CoreSource, device: Device, precision: str, input_size: tuple[int, int],
             threads: int | None, options: BackendOptions) -> TfliteCore:
        graph, module = onnx_graph(source, input_size)

        def make_core() -> TfliteCore:
            core = TfliteCore(source.name, graph, device, threads, precision, input_size)
            if not core.needs_calibration:
                core.prepare(options.batch_sizes)
            return core

        if precision != "fp32":  # fp16 weights and int8 differ from the source by more than the check's tolerance
            return load_rows_checked(make_core, source, graph, input_size)
        return load_checked(make_core, lambda core: check_against_source(source, graph, module, core, input_size,
                                                                         "LiteRT"),
                            lambda core: Path(core.conversion["file"]))
