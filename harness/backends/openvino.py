"""The OpenVINO backend (CPU): the family's ONNX graph (or its torch core's export) as an OpenVINO model.

Precision is what the row says, and what the CPU computes is read back, not assumed:
- fp32: fp32 weights, `INFERENCE_PRECISION_HINT` f32. On CPUs with native bf16 (AVX512_BF16, AMX) the CPU
  plugin computes in bf16 unless told otherwise; an fp32 row whose compiled model reports anything but f32
  is an error.
- fp16: the IR's weights stored as fp16 (`ov.save_model(compress_to_fp16=True)`); compute in f16 where the
  CPU has native fp16 (`OPTIMIZATION_CAPABILITIES` lists FP16), else f32 (the plugin widens the weights).
- int8: post-training quantisation with NNCF on calibration images the executor hands over (`calibrate`),
  never the evaluated ones; operations NNCF leaves in float compute in f32.

One compiled model per batch size, with a static shape (what OpenVINO's `benchmark_app` times): compiled
at load for the run's batch sizes and before a short final batch (`prepare_shape`), never in a timed batch.
The forward is timed by OpenVINO's own clock, as in throughput mode: each inference's `InferRequest.latency`, the
native call alone, which is what benchmark_app reports. Around it the Python binding binds the input and wraps the
outputs (0.1-0.3 ms at batch 1 on the 2-core box, 1-3 % of a yolox-nano forward): that time, and the outputs' copy
out of the request's buffers, is the transfer stage, so the batch's stages still add up to its wall time.

Converted models are cached (IR files) by the graph's SHA-256, the OpenVINO (and NNCF) version and the
precision (and calibration set); the record names converter, version and cache file.

Every core compiles through the process's one `ov.Core` (`openvino_runtime`): see there for why.
"""

from __future__ import annotations

import contextlib
import hashlib
import shutil
import sys
import tempfile
import time
from functools import cache
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
from harness.errors import UsageError, exception_line
from harness.files import atomic_folder, atomic_write_json
from harness.measure.device import Device
from harness.records import LayerCall
from harness.storage import cache_writes


@contextlib.contextmanager
def _nncf_log_to_stderr():
    """NNCF's logger writes to the stdout it found when imported (a redirect does not reach it): its handlers point
    at stderr for the quantisation, and back after."""
    import logging

    moved = [h for h in logging.getLogger("nncf").handlers
             if isinstance(h, logging.StreamHandler) and h.stream in (sys.stdout, sys.__stdout__)]
    previous = [h.setStream(sys.stderr) for h in moved]
    try:
        yield
    finally:
        for handler, stream in zip(moved, previous, strict=True):
            handler.setStream(stream)


# compiled-model precision type name -> the record's vocabulary
_PRECISION_NAMES = {"f32": "fp32", "f16": "fp16", "bf16": "bf16"}
# compute precisions an N row may run at (never lower than asked)
_ALLOWED_COMPUTE = {"fp32": ("fp32",), "fp16": ("fp16", "fp32"), "int8": ("fp32",)}


def _type_name(value: Any) -> str:
    """An OpenVINO element type (or its string) as 'f32', 'bf16', ..."""
    name = getattr(value, "get_type_name", lambda: str(value))()
    return {"float32": "f32", "bfloat16": "bf16", "float16": "f16"}.get(name, name)


@cache
def openvino_runtime() -> Any:
    """The process's one `ov.Core`, kept until the process ends.

    OpenVINO's CPU plugin (one per `ov.Core`) gives the thread that loads it an alternate signal stack of its own
    (AMX's larger register state needs room), and when it goes it puts back the stack it found and unmaps its own.
    Two cores whose lifetimes cross (a damaged cache entry converted again while the first core still lives) leave
    the thread's signal stack pointing at unmapped memory: the next signal Python handles on it (Ctrl-C, SIGTERM)
    is a segmentation fault instead of a clean stop, or, once the addresses are reused, a signal frame written over
    other memory. With one Core for the process the run's cores share one plugin, which outlives them; a short-lived
    Core made elsewhere while it lives (NNCF's, during int8 calibration) puts this plugin's stack back when it goes."""
    import openvino as ov

    return ov.Core()


def cpu_has_native_fp16(ov_core: Any) -> bool:
    """Whether the CPU plugin computes fp16 natively here (AVX512_FP16/AMX-FP16, ARM fp16)."""
    return "FP16" in ov_core.get_property("CPU", "OPTIMIZATION_CAPABILITIES")


def _ir_cache_path(name: str, graph_sha: str, variant: str) -> Path:
    safe = "".join(c if c.isalnum() or c in ".-" else "-" for c in name).strip("-.") or "core"
    return weights_dir() / "openvino" / f"{safe}__{graph_sha[:16]}__ov{version('openvino')}__{variant}" / "model.xml"


class OpenVinoCore:
    """An OpenVINO model compiled for the CPU, one compiled model and infer request per input shape."""

    backend = "openvino"
    format = "openvino"
    provider = "cpu"
    takes_device_tensors = False  # host memory in (numpy, shared, no copy)
    torch_module = None

    def __init__(self, name: str, graph: onnx.ModelProto, device: Device, threads: int | None, precision: str,
                 input_size: tuple[int, int], perf_count: bool = False, throughput: bool = False):
        self.name, self.device, self.threads, self.precision = name, device, threads, precision
        self.input_size = input_size
        self._graph_bytes = graph.SerializeToString()
        self.graph_sha256 = hashlib.sha256(self._graph_bytes).hexdigest()
        self._ov = openvino_runtime()
        self.perf_count = perf_count
        self.conversion: dict[str, Any] = {}
        self.quantization: dict[str, Any] | None = None
        compute = "f32"
        if precision == "fp16" and cpu_has_native_fp16(self._ov):
            compute = "f16"
        # Latency: one stream, one request. Throughput (overlapped mode): OpenVINO's THROUGHPUT hint picks its
        # streams, and as many requests as it says are optimal are kept in flight (`async_slots`).
        self.properties = {"INFERENCE_PRECISION_HINT": compute, "PERF_COUNT": perf_count,
                           **({"PERFORMANCE_HINT": "THROUGHPUT"} if throughput else
                              {"PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": "1"})}
        self.throughput = throughput
        self._requests: dict[tuple[int, ...], list[Any]] = {}  # throughput mode: each shape's async requests
        self._started = 0
        if threads:
            self.properties["INFERENCE_NUM_THREADS"] = threads
        self._model = None if precision == "int8" else self._converted()
        self._compiled: dict[tuple[int, ...], tuple[Any, Any]] = {}
        self.compute_precision: str | None = None
        self.read_back: dict[str, Any] = {}
        self.layer_rows: list[dict] = []  # with perf_count: executed nodes of each run (profiling_copy)
        self._runs = -1

    # ---------------------------------------------------------------------------------- conversion

    def _converted(self) -> Any:
        """The fp32 (or fp16-weights) model: from the IR cache, else converted from the ONNX graph and cached."""
        variant = "fp16" if self.precision == "fp16" else "fp32"
        path = _ir_cache_path(self.name, self.graph_sha256, variant)
        clock = time.perf_counter()
        model = self._read_ir(path) if path.is_file() and path.with_suffix(".bin").is_file() else None
        cached = model is not None
        if model is None:
            shutil.rmtree(path.parent, ignore_errors=True)  # a partial entry (an IR without its weights) goes first
            with tempfile.TemporaryDirectory(prefix=".va-ov-") as tmp:
                onnx_file = Path(tmp) / "core.onnx"
                onnx_file.write_bytes(self._graph_bytes)
                try:
                    import openvino as ov

                    model = ov.convert_model(str(onnx_file))
                except Exception as exc:  # OpenVINO's frontend names the op it cannot convert
                    raise UsageError(f"{self.name}: OpenVINO cannot convert this graph "
                                     f"({exception_line(exc, 240)}); use --backend onnxruntime") from exc
            self._save_ir(model, path, compress_to_fp16=variant == "fp16")
            model = self._read_ir(path)
        self.conversion = {"converter": "openvino.convert_model (ONNX frontend)", "openvino": version("openvino"),
                           "source_sha256": self.graph_sha256, "ir_file": str(path), "cached": cached,
                           "weights": "fp16 (compress_to_fp16)" if variant == "fp16" else "fp32",
                           "seconds": round(time.perf_counter() - clock, 3)}
        return model

    def _read_ir(self, path: Path) -> Any | None:
        try:
            return self._ov.read_model(str(path))
        except Exception:  # a damaged cache entry: convert again
            shutil.rmtree(path.parent, ignore_errors=True)
            return None

    @staticmethod
    def _save_ir(model: Any, path: Path, compress_to_fp16: bool) -> None:
        """Written into a temporary folder, then renamed: a crash never leaves half an IR in the cache."""
        import openvino as ov

        with atomic_folder(path.parent) as tmp, cache_writes(path.parent, tmp):  # full: "iostream error"
            ov.save_model(model, str(tmp / path.name), compress_to_fp16=compress_to_fp16)

    # -------------------------------------------------------------------------------- int8

    @property
    def needs_calibration(self) -> bool:
        return self.precision == "int8" and self._model is None

    def calibrate(self, batches: list[torch.Tensor], calibration: dict[str, Any]) -> None:
        """int8: quantise the fp32 model with NNCF on these preprocessed calibration batches ([1,3,H,W] each;
        the images are disjoint from the evaluated ones, the executor checks), cached by their SHA-256."""
        import logging

        # NNCF imports torch's C++-extension helper, which logs that a CPU box has no CUDA runtime: noise here
        logging.getLogger("torch.utils.cpp_extension").setLevel(logging.ERROR)
        import nncf

        digest = hashlib.sha256()
        for b in batches:
            digest.update(b.numpy().tobytes())
        calibration_sha = digest.hexdigest()
        path = _ir_cache_path(self.name, self.graph_sha256, f"int8-nncf{version('nncf')}-{calibration_sha[:16]}")
        clock = time.perf_counter()
        model = self._read_ir(path) if path.is_file() and path.with_suffix(".bin").is_file() else None
        cached = model is not None
        if model is None:
            saved, self.precision = self.precision, "fp32"
            try:
                fp32 = self._converted()
            finally:
                self.precision = saved
            fp32.reshape({0: [1, 3, *self.input_size]})  # the calibration batches' shape; batch made dynamic again
            try:  # NNCF's progress bars and log lines go to stdout, where a run's summary and --json go: to stderr
                with contextlib.redirect_stdout(sys.stderr), _nncf_log_to_stderr():
                    model = nncf.quantize(fp32, nncf.Dataset([b.numpy() for b in batches]),
                                          preset=nncf.QuantizationPreset.MIXED, subset_size=len(batches))
            except Exception as exc:
                raise UsageError(f"{self.name}: NNCF could not quantise this model ({exception_line(exc, 240)}); "
                                 "use --precision fp32 or fp16") from exc
            model.reshape({0: [-1, 3, *self.input_size]})
            if not any(op.get_type_name() == "FakeQuantize" for op in model.get_ops()):
                raise UsageError(f"{self.name}: NNCF left no quantised operation in the model; it cannot be "
                                 "published as int8: use --precision fp32 or fp16")
            self._save_ir(model, path, compress_to_fp16=False)
            model = self._read_ir(path)
        self._model = model
        self.conversion = {"converter": "openvino.convert_model (ONNX frontend) + nncf.quantize",
                           "openvino": version("openvino"), "nncf": version("nncf"),
                           "source_sha256": self.graph_sha256, "ir_file": str(path), "cached": cached,
                           "weights": "int8 (NNCF post-training quantisation)",
                           "seconds": round(time.perf_counter() - clock, 3)}
        self.quantization = {"method": "nncf.quantize, preset MIXED (symmetric weights, asymmetric activations)",
                             "calibration_batches_sha256": calibration_sha, **calibration}

    # ------------------------------------------------------------------------------- compiling

    def _compiled_for(self, shape: tuple[int, ...]) -> tuple[Any, Any]:
        if shape not in self._compiled:
            if self._model is None:
                raise RuntimeError("int8 OpenVINO core used before calibrate()")
            model = self._model.clone()
            model.reshape({0: list(shape)})
            try:
                compiled = self._ov.compile_model(model, "CPU", self.properties)
            except Exception as exc:
                raise UsageError(f"{self.name}: OpenVINO cannot compile this model for the CPU "
                                 f"({exception_line(exc, 240)})") from exc
            self._check_read_back(compiled)
            self._compiled[shape] = (compiled, compiled.create_infer_request())
            if self.throughput:
                count = max(1, int(compiled.get_property("OPTIMAL_NUMBER_OF_INFER_REQUESTS")))
                self._requests[shape] = [compiled.create_infer_request() for _ in range(count)]
        return self._compiled[shape]

    @property
    def async_slots(self) -> int:
        """Forwards that may be in flight: the fewest requests of any compiled shape (1 in latency mode), so a
        shape's requests taken in turn are never reused while one is running."""
        return min((len(r) for r in self._requests.values()), default=1)

    def _check_read_back(self, compiled: Any) -> None:
        """What the compiled model computes in, read back: an error when it is lower than the row says."""
        hint = _type_name(compiled.get_property("INFERENCE_PRECISION_HINT"))
        compute = _PRECISION_NAMES.get(hint, hint)
        if compute not in _ALLOWED_COMPUTE[self.precision]:
            raise UsageError(f"OpenVINO compiled the {self.precision} model to compute in {compute} although "
                             f"{self.properties['INFERENCE_PRECISION_HINT']} was asked; this CPU plugin cannot run "
                             "the row as labelled")
        self.compute_precision = "int8 (quantised ops) + fp32" if self.precision == "int8" else compute
        self.read_back = {key: str(compiled.get_property(key)) for key in
                          ("INFERENCE_PRECISION_HINT", "INFERENCE_NUM_THREADS", "NUM_STREAMS", "PERFORMANCE_HINT",
                           "ENABLE_CPU_PINNING", "ENABLE_HYPER_THREADING", "SCHEDULING_CORE_TYPE",
                           "OPTIMAL_NUMBER_OF_INFER_REQUESTS")}

    def prepare(self, batch_sizes: tuple[int, ...]) -> None:
        """Compile for each batch size now (load time), never inside a timed batch."""
        for b in batch_sizes:
            self._compiled_for((b, 3, *self.input_size))

    def prepare_shape(self, shape: tuple[int, ...]) -> None:
        """Compile for a short final batch before it is timed."""
        self._compiled_for(tuple(shape))

    def __call__(self, batch: torch.Tensor) -> list[torch.Tensor]:
        # the request's buffers are reused by its next inference: copied out
        return [torch.from_numpy(np.array(t.numpy())) for t in self.forward_borrowed(batch)[0]]

    def forward_borrowed(self, batch: torch.Tensor) -> tuple[list[torch.Tensor], int]:
        """The forward as OpenVINO's own `infer()` runs it, and its time as OpenVINO measured it (ns: the native
        inference call alone, `InferRequest.latency`, what benchmark_app reports; the Python binding's work around
        it, binding the input and wrapping the outputs, is not in it). The outputs are the request's buffers,
        valid until its next inference: the pipeline copies them out at once."""
        _, request = self._compiled_for(tuple(batch.shape))
        request.infer({0: batch.numpy()}, share_inputs=True, share_outputs=True)
        measured_ns = int(request.latency * 1e6)
        if self.perf_count:
            self._runs += 1
            run = self._runs
            self.layer_rows += [{"run": run, "name": p.node_name, "type": p.node_type, "exec_type": p.exec_type,
                                 "ms": p.real_time.total_seconds() * 1e3} for p in request.profiling_info
                                if p.status.name == "EXECUTED"]
        return [torch.from_numpy(request.get_output_tensor(i).data) for i in range(len(request.model_outputs))], \
            measured_ns

    def start(self, batch: torch.Tensor) -> tuple[Any, torch.Tensor]:
        """Start a forward on the next of the shape's requests (throughput mode); the pipeline keeps at most
        `async_slots` in flight and collects them in order, so the request is free again by then."""
        self._compiled_for(tuple(batch.shape))
        requests = self._requests[tuple(batch.shape)]
        request = requests[self._started % len(requests)]
        self._started += 1
        request.start_async({0: batch.numpy()}, share_inputs=True)
        return request, batch  # the batch's memory is the request's input until it completes

    def collect(self, ticket: tuple[Any, torch.Tensor]) -> tuple[list[torch.Tensor], int]:
        """Wait for a started forward: its outputs (copied out of the request's buffers) and its time as
        OpenVINO measured it (ns; from the start of its inference to its end, not the wait for it here)."""
        request, _ = ticket
        request.wait()
        outputs = [torch.from_numpy(np.array(request.get_output_tensor(i).data))
                   for i in range(len(request.model_outputs))]
        return outputs, int(request.latency * 1e6)

    # ------------------------------------------------------------------------------ layers, record

    def profiling_copy(self, prefix: str) -> OpenVinoCore:
        """The same model compiled with OpenVINO's performance counters on (for the layer pass); each call
        keeps its executed nodes' rows in `layer_rows`."""
        copy = OpenVinoCore.__new__(OpenVinoCore)
        copy.__dict__.update(self.__dict__)
        # the layer pass calls the core one batch at a time: compiled for latency, as the latency mode's core
        copy.properties = {**self.properties, "PERF_COUNT": True, "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": "1"}
        copy.perf_count, copy._compiled, copy.layer_rows, copy._runs = True, {}, [], -1
        copy.throughput, copy._requests = False, {}
        for shape in self._compiled:  # compiled now: a compile inside the pass would be timed as a forward
            copy._compiled_for(shape)
        return copy

    def finish_profile(self, trace_path: Path) -> tuple[list[LayerCall], str]:
        """The layer pass's calls (one per executed node and run) and how they were measured; the rows are
        written to `trace_path` as JSON."""
        atomic_write_json(trace_path, self.layer_rows, indent=None)
        calls = [LayerCall(r["run"], r["name"], r["type"], "", "", r["ms"]) for r in self.layer_rows]
        return calls, "OpenVINO performance counters (PERF_COUNT, real time per executed node)"

    def info(self) -> dict[str, Any]:
        return {"backend": self.backend, "openvino": version("openvino"), "device_name": "CPU",
                "compute_precision": self.compute_precision,
                "precision_mode": {"fp32": "fp32 weights, f32 compute (INFERENCE_PRECISION_HINT f32, read back)",
                                   "fp16": f"fp16 weights, {self.compute_precision} compute (read back)",
                                   "int8": "int8 quantised (NNCF), float ops in f32 (read back)"}[self.precision],
                "properties": self.properties, "read_back": self.read_back,
                "forward_clock": "OpenVINO's own time for each inference (InferRequest.latency, what benchmark_app "
                                 "reports); the Python binding's hand-over around it and the outputs' copy out are "
                                 "timed as transfer",
                "async_requests": {"x".join(map(str, shape)): len(r) for shape, r in self._requests.items()},
                "compiled_shapes": [list(s) for s in self._compiled], "conversion": self.conversion,
                **({"quantization": self.quantization} if self.quantization else {})}


class OpenVinoBackend:
    """OpenVINO on the CPU: fp32, fp16 (fp16 weights) and int8 (NNCF, calibrated at load)."""

    name = "openvino"

    def supports(self, source: CoreSource) -> bool:
        return has_onnx_graph(source)

    def load(self, source: CoreSource, device: Device, precision: str, input_size: tuple[int, int],
             threads: int | None, options: BackendOptions) -> OpenVinoCore:
        graph, module = onnx_graph(source, input_size)

        def make_core() -> OpenVinoCore:
            core = OpenVinoCore(source.name, graph, device, threads, precision, input_size,
                                throughput=options.overlap)
            if not core.needs_calibration:  # int8 is compiled once calibrated (executor)
                core.prepare(options.batch_sizes)
            return core

        if precision != "fp32":  # fp16 weights and int8 differ from the source by more than the check's tolerance
            return load_rows_checked(make_core, source, graph, input_size)
        return load_checked(make_core, lambda core: check_against_source(source, graph, module, core, input_size,
                                                                         "OpenVINO"),
                            lambda core: Path(core.conversion["ir_file"]).parent)

