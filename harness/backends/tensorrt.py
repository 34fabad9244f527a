"""The `tensorrt` backend: serialized TensorRT engines (`--weights model.engine`, built by `trtexec`).

The leaderboard's own harness accepts such engines with a JSON sidecar describing the build
(`model.engine.json`, or `model.json` beside it). The sidecar needs `command` (the trtexec command
line); it may add `precision` (fp32|fp16|bf16: needed when the command is --stronglyTyped),
`tensorrt_version` and anything else, all recorded verbatim in runtime.engine_manifest. The engine's
precision and TF32 use are read from the command's flags (--fp16, --bf16, --noTF32): the run's
--precision and --tf32 must agree with them, since an engine's precision is fixed when it is built.

The backend is chosen explicitly: `--backend tensorrt --weights x.engine`. An engine with another
backend, or --backend tensorrt without an engine, is one UsageError line (check_engine_run, called by
plan.check_runtimes before any model is loaded), as are a missing file, no GPU, no `tensorrt` package
and a missing or bad sidecar. An engine is tied to the GPU and TensorRT version it was built with;
its input shapes are checked against the run's batch and input sizes at load.
"""

from __future__ import annotations

import importlib.util
import json
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harness.backends import CoreSource, current_options
from harness.errors import UsageError
from harness.measure.device import Device
from harness.models.protocol import ModelStats, WeightsInfo
from harness.models.weights import file_sha256

if TYPE_CHECKING:
    from harness.config import RunConfig
    from harness.models.protocol import Core

INSTALL = "pip install tensorrt-cu12 (or tensorrt-cu13, matching your CUDA)"
ENGINE_SUFFIXES = (".engine", ".plan")
# trtexec flags that let TensorRT pick precisions va-bench has no coordinate for (int8, fp8, int4; --best: any)
UNBENCHMARKED_FLAGS = ("--int8", "--fp8", "--int4", "--best")
SIDECAR_FIELDS = ('"command" (the trtexec command line), optional "precision" (fp32|fp16|bf16), '
                  '"tensorrt_version"')


def is_engine_file(weights: str | Path | None) -> bool:
    """Whether --weights names a serialized TensorRT engine (by its suffix: .engine or .plan)."""
    return weights is not None and str(weights).lower().endswith(ENGINE_SUFFIXES)


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
                         f"built; write one with {SIDECAR_FIELDS}")
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"{path}: not a readable JSON sidecar ({exc}); fix the file") from exc
    if not isinstance(data, dict):
        raise UsageError(f"{path}: the sidecar must be a JSON object")
    return data


class EngineManifest(BaseModel):
    """The sidecar fields the harness relies on; every other key is kept and recorded as it is."""

    model_config = ConfigDict(extra="allow")

    command: str = Field(min_length=1)
    precision: Literal["fp32", "fp16", "bf16"] | None = None
    tensorrt_version: str | None = None


@dataclass(frozen=True)
class EngineBuild:
    """How an engine was built, from its sidecar: the precision and TF32 use its command gives, and the
    sidecar itself (recorded verbatim)."""

    precision: str
    tf32: bool  # trtexec lets fp32 layers run in TF32 unless built with --noTF32
    sidecar: Path
    manifest: dict[str, Any]


def engine_build(engine: Path) -> EngineBuild:
    """Read and check the engine's sidecar; one UsageError line when it is missing, malformed or says a
    precision va-bench does not benchmark (int8/fp8/--best), or contradicts its own command."""
    data = read_manifest(engine)
    path = manifest_path(engine)
    try:
        manifest = EngineManifest.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"])
        raise UsageError(f"{path}: {where}: {err['msg']}; the sidecar needs {SIDECAR_FIELDS}") from exc
    try:
        flags = {token.split("=", 1)[0] for token in shlex.split(manifest.command)}  # tokenised, never run
    except ValueError as exc:
        raise UsageError(f"{path}: \"command\" is not a command line ({exc}); fix the file") from exc
    unbenchmarked = [f for f in UNBENCHMARKED_FLAGS if f in flags]
    if unbenchmarked:
        raise UsageError(f"{engine.name} was built with {unbenchmarked[0]} ({path.name}); va-bench benchmarks fp32, "
                         "fp16 and bf16 engines: rebuild it without that flag")
    typed = [p for p in ("fp16", "bf16") if f"--{p}" in flags]
    if len(typed) > 1:
        raise UsageError(f"{engine.name} was built with both --fp16 and --bf16 ({path.name}): TensorRT picks per "
                         "layer, and a run records one precision; rebuild it with one of them")
    # --stronglyTyped: the network's own tensor types decide, so only the sidecar can say the precision
    from_command = None if "--stronglyTyped" in flags else (typed[0] if typed else "fp32")
    if manifest.precision and from_command and manifest.precision != from_command:
        raise UsageError(f"{path}: \"precision\" is {manifest.precision}, but its command builds {from_command}; "
                         "fix the sidecar")
    precision = manifest.precision or from_command
    if precision is None:
        raise UsageError(f"{path}: the engine is --stronglyTyped, so its command does not say its precision; add "
                         "\"precision\": \"fp32\", \"fp16\" or \"bf16\" to the sidecar")
    return EngineBuild(precision, "--noTF32" not in flags, path, data)


def check_engine_weights(weights: str, device_kind: str) -> EngineBuild:
    """Refuse a serialized engine that cannot run here (before any model is loaded): no file, no GPU,
    no `tensorrt` package, a missing or bad sidecar. Returns what the sidecar says about the build."""
    engine = Path(weights)
    if not engine.is_file():
        raise UsageError(f"--weights {engine}: no such file")
    if device_kind != "cuda":
        raise UsageError(f"--weights {engine.name} is a TensorRT engine: it runs on a GPU only; add --device cuda")
    if not tensorrt_installed():
        raise UsageError(f"--weights {engine.name} is a TensorRT engine, but the `tensorrt` package is not "
                         f"installed; {INSTALL}")
    return engine_build(engine)


def engine_defaults(config: RunConfig) -> RunConfig:
    """An engine run's --precision and --tf32, when not given, are the engine's build's (its sidecar's
    command): the config with them filled in. Given ones are left for check_engine_run to hold against the
    engine; an unreadable sidecar too (it says what is wrong, in its order)."""
    unset = {"precisions", "tf32"} - config.model_fields_set
    if not unset or not is_engine_file(config.weights) or config.backends != ["tensorrt"]:
        return config
    try:
        build = engine_build(Path(config.weights))
    except UsageError:
        return config
    update = {"precisions": [build.precision], "tf32": "on" if build.tf32 and build.precision == "fp32" else "off"}
    return config.model_copy(update={k: v for k, v in update.items() if k in unset})


def check_engine_run(config: RunConfig, device_kind: str) -> None:
    """A run's engine options, before any model is loaded: an engine runs on `--backend tensorrt` alone and
    that backend runs engines alone; the engine must be runnable here (check_engine_weights), and the run's
    --precision and --tf32 must be what the engine was built with (it cannot run another)."""
    engine, wants_trt = is_engine_file(config.weights), "tensorrt" in config.backends
    if not engine and not wants_trt:
        return
    if not engine:
        raise UsageError("--backend tensorrt runs a serialized TensorRT engine: pass --weights MODEL.engine (built "
                         "by trtexec, with its JSON sidecar); to build engines from ONNX use --backend onnxruntime "
                         "--ort-provider tensorrt")
    name = Path(config.weights).name
    others = [b for b in config.backends if b != "tensorrt"]
    if others:
        raise UsageError(f"--weights {name} is a serialized TensorRT engine: it runs on --backend tensorrt only, not "
                         f"{others[0]}; pass --backend tensorrt alone")
    build = check_engine_weights(config.weights, device_kind)
    if config.precisions != [build.precision]:
        raise UsageError(f"--precision {' '.join(config.precisions)}: {name} was built {build.precision} (its "
                         f"sidecar's command); drop --precision (an engine runs at its build's) or pass "
                         f"--precision {build.precision}")
    recorded_tf32 = config.tf32 != "off"  # "default" keeps torch's flags, which allow TF32 (runtime.tf32)
    if build.precision == "fp32" and build.tf32 != recorded_tf32:
        raise UsageError(
            f"{name} was built without --noTF32 (trtexec then runs fp32 layers in TF32), but --tf32 off records "
            "IEEE fp32; rebuild it with --noTF32, or drop --tf32 to record TF32 on" if build.tf32 else
            f"{name} was built with --noTF32 (IEEE fp32), but --tf32 {config.tf32} records TF32; drop --tf32")
    if config.layers:
        raise UsageError("--layers times PyTorch modules or ONNX Runtime nodes; a TensorRT engine has neither here "
                         "(use trtexec --dumpProfile): drop --layers")


# ------------------------------------------------------------------------------------ what families use


def engine_core_source(name: str, engine: Path) -> CoreSource:
    """A family's CoreSource for a serialized engine (only the tensorrt backend runs it)."""
    return CoreSource(name, engine_file=engine)


def engine_weights(engine: Path) -> WeightsInfo:
    """The weights identity of an engine run: the engine file and its sha256."""
    return WeightsInfo(file=engine.name, sha256=file_sha256(engine),
                       source="--weights (serialized TensorRT engine; its build: runtime.engine_manifest)")


def engine_model_stats() -> ModelStats:
    """Parameters and FLOPs are counted on an ONNX graph or torch module; an engine is neither."""
    reason = ("a serialized TensorRT engine: no ONNX graph or torch module to count on (inspect the ONNX it was "
              "built from)")
    return ModelStats(notes={"params_millions": reason, "gflops": reason})


def probe_outputs(core: Core, input_size: tuple[int, int]) -> list[tuple[int, ...]]:
    """The output shapes of one zero batch of 1 (an engine's graph cannot be read before it runs)."""
    return [tuple(t.shape) for t in core(torch.zeros(1, 3, *input_size))]


# ------------------------------------------------------------------------------------ the core and backend


class TensorRTEngineCore:
    """A deserialized engine; torch CUDA tensors are its I/O buffers (execute_async_v3 on torch's stream).

    It takes a batch already on its GPU (`takes_device_tensors`): the pipeline decodes, letterboxes and
    uploads on the device as for a torch core, so the forward stage is the engine's execution (plus a cast
    where the engine's input is not float32); outputs stay on the device for the shared post-processing."""

    backend = "tensorrt"
    takes_device_tensors = True
    format = "tensorrt"  # the site's vocabulary: format tensorrt on provider cuda
    provider = "cuda"

    def __init__(self, engine_file: Path, device: Device, precision: str):
        import tensorrt as trt

        self._trt = trt
        self.build = engine_build(engine_file)
        if precision != self.build.precision:
            raise UsageError(f"{engine_file.name} was built {self.build.precision} (its sidecar), not {precision}; "
                             f"run it with --precision {self.build.precision}")
        self.engine_file, self.device, self.precision = engine_file, device, precision
        self.torch_module = None
        with torch.cuda.device(device.index):  # TensorRT works on the current CUDA device: make it ours
            runtime = trt.Runtime(trt.Logger(trt.Logger.WARNING))
            self.engine = runtime.deserialize_cuda_engine(engine_file.read_bytes())
        if self.engine is None:
            raise UsageError(f"{engine_file}: TensorRT could not deserialize it (built for another GPU or "
                             f"TensorRT {self.build.manifest.get('tensorrt_version', '?')}?); rebuild it here")
        with torch.cuda.device(device.index):
            self.context = self.engine.create_execution_context()
            # enqueueV3 on the legacy default stream costs extra cudaStreamSynchronize calls (TensorRT warns):
            # the engine runs on a stream of its own, joined to torch's current stream both ways
            self.stream = torch.cuda.Stream(device=device.torch_device)
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.inputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if n not in self.inputs]
        if len(self.inputs) != 1:
            raise UsageError(f"{engine_file}: expected one input tensor, found {self.inputs}")
        torch_dtypes = {trt.float32: torch.float32, trt.float16: torch.float16, trt.int32: torch.int32,
                        trt.int64: torch.int64, trt.bfloat16: torch.bfloat16}
        self.dtypes = {n: torch_dtypes.get(self.engine.get_tensor_dtype(n)) for n in names}
        odd = [f"{n} ({self.engine.get_tensor_dtype(n)})" for n, dtype in self.dtypes.items() if dtype is None]
        if odd:
            raise UsageError(f"{engine_file}: I/O tensors of a type the harness cannot hand over: {', '.join(odd)}; "
                             "build it with float32/float16 inputs and outputs (trtexec --inputIOFormats/"
                             "--outputIOFormats)")

    def check_shapes(self, input_size: tuple[int, int], batch_sizes: tuple[int, ...]) -> None:
        """Every [B, 3, H, W] of the run must lie within the engine's input shape (static) or its
        optimisation profile (dynamic axes, min..max); one UsageError line otherwise."""
        name = self.inputs[0]
        dims = tuple(self.engine.get_tensor_shape(name))
        if len(dims) != 4:
            raise UsageError(f"{self.engine_file.name}: input {name} has shape {list(dims)}; want [B, 3, H, W]")
        low, high = dims, dims
        if -1 in dims:
            low, _, high = (tuple(s) for s in self.engine.get_tensor_profile_shape(name, 0))
        for batch in batch_sizes:
            want = (batch, 3, *input_size)
            if not all(lo <= w <= hi for lo, w, hi in zip(low, want, high, strict=True)):
                raise UsageError(f"{self.engine_file.name} takes {name} from {'x'.join(map(str, low))} to "
                                 f"{'x'.join(map(str, high))}, not {'x'.join(map(str, want))}; run the batch and input "
                                 "sizes it was built for (--batch-sizes, --input-size) or rebuild it with trtexec "
                                 "--minShapes/--optShapes/--maxShapes")

    def __call__(self, batch: torch.Tensor) -> list[torch.Tensor]:
        name = self.inputs[0]
        caller = torch.cuda.current_stream(self.device.index)
        x = batch.to(self.device.torch_device, self.dtypes[name]).contiguous()  # on the caller's stream
        if not self.context.set_input_shape(name, tuple(x.shape)):
            raise RuntimeError(f"{self.engine_file.name} does not take input shape {tuple(x.shape)} (outside the "
                               "shapes it was built for)")
        self.stream.wait_stream(caller)  # the input is written before the engine reads it
        with torch.cuda.device(self.device.index), torch.cuda.stream(self.stream):
            self.context.set_tensor_address(name, x.data_ptr())
            outputs = []
            for out in self.outputs:
                y = torch.empty(tuple(self.context.get_tensor_shape(out)), dtype=self.dtypes[out],
                                device=self.device.torch_device)
                self.context.set_tensor_address(out, y.data_ptr())
                outputs.append(y)
            launched = self.context.execute_async_v3(self.stream.cuda_stream)
        if not launched:
            raise RuntimeError(f"TensorRT execution failed for {self.engine_file.name}")
        caller.wait_stream(self.stream)  # what the caller queues next (events, decode) follows the engine
        if x.is_cuda:  # the caching allocator must not hand these blocks out while the other stream uses them
            x.record_stream(self.stream)  # made on the caller's stream, read on the engine's
            for y in outputs:
                y.record_stream(caller)  # made on the engine's stream, read on the caller's
        return [o.float() for o in outputs]

    def info(self) -> dict[str, Any]:
        io = {n: {"mode": "input" if n in self.inputs else "output",
                  "dtype": str(self.dtypes[n]).removeprefix("torch."),
                  "shape": list(self.engine.get_tensor_shape(n))} for n in self.inputs + self.outputs}
        return {"backend": self.backend, "tensorrt": self._trt.__version__, "engine_file": str(self.engine_file),
                "engine_sidecar": str(self.build.sidecar), "engine_manifest": self.build.manifest,
                "engine_precision": self.build.precision, "engine_tf32": self.build.tf32, "engine_io": io,
                "device_name": f"{self.device} {self.device.name()}"}


class TensorRTBackend:
    """Runs a CoreSource's serialized engine (`engine_file`); nothing else."""

    name = "tensorrt"

    def supports(self, source: CoreSource) -> bool:
        return source.engine_file is not None

    def load(self, source: CoreSource, device: Device, precision: str, input_size: tuple[int, int],
             threads: int | None) -> TensorRTEngineCore:
        core = TensorRTEngineCore(source.engine_file, device, precision)  # threads: the engine runs on the GPU
        core.check_shapes(input_size, current_options().batch_sizes)
        return core
