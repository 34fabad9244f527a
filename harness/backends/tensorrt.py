"""The `tensorrt` backend: runs a serialized TensorRT engine (`--weights model.engine`, built by `trtexec`).

The engine file, its sidecar and what they say about the build are in harness/detector/engine.py. The
backend is chosen explicitly: `--backend tensorrt --weights x.engine`. An engine with another backend,
or --backend tensorrt without an engine, is one UsageError line (the run's plan checks it before any
model is loaded), as are a missing file, no GPU, no `tensorrt` package and a missing or bad sidecar.
An engine is tied to the GPU and TensorRT version it was built with; its input shapes are checked
against the run's batch and input sizes at load.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from harness.backends import BackendOptions
from harness.detector.engine import engine_build
from harness.detector.source import CoreSource
from harness.errors import UsageError
from harness.measure.device import Device

if TYPE_CHECKING:
    pass

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
             threads: int | None, options: BackendOptions) -> TensorRTEngineCore:
        core = TensorRTEngineCore(source.engine_file, device, precision)  # threads: the engine runs on the GPU
        core.check_shapes(input_size, options.batch_sizes)
        return core
