"""The PyTorch eager backend: the family's torch module, or its ONNX graph converted by onnx2torch."""

from __future__ import annotations

import copy
import time
from importlib.metadata import version
from typing import Any

import torch

from harness.backends import BackendOptions
from harness.backends.capturable import keep_shape_constants_on_host
from harness.detector.graph import onnx_to_torch, output_list
from harness.detector.source import CoreSource
from harness.errors import UsageError
from harness.measure.device import Device

TORCH_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16}


class TorchCore:
    """A PyTorch module in eval mode on the device; forward under inference_mode.

    fp16/bf16 run under torch.autocast: weights stay fp32 and autocast runs convolutions and matmuls in
    the low precision while keeping precision-sensitive ops (sigmoid, exp, sums) in fp32. Measured on
    yolox-nano (CPU, bf16, first 32 sample images): see README "Precisions and GPU backends". The raw
    outputs are handed to decode as fp32 either way.

    Execution modes (`prepare`, at load, never inside a timed batch): `--compile` wraps the forward in
    torch.compile with static shapes and compiles it by one forward per (input size, batch size) of the
    run; `--cuda-graphs` captures one CUDA graph per batch size and replays it (input copied into the
    graph's static buffer, outputs cloned out of it). `torch_module` stays the eager module (hooks, FLOPs).
    """

    takes_device_tensors = True  # the pipeline hands it a batch already on its device

    backend = "pytorch"
    format = "pytorch"

    def __init__(self, module: torch.nn.Module, device: Device, precision: str = "fp32"):
        # the family's module is shared (FLOP count, ONNX export, the next group): move a copy, never it
        on_device = all(t.device == device.torch_device for t in [*module.parameters(), *module.buffers()])
        self.torch_module = (module if on_device else copy.deepcopy(module).to(device.torch_device)).eval()
        self.device = device
        self.precision = precision
        self.dtype = TORCH_DTYPES.get(precision)
        self.provider = "cuda" if device.is_cuda else "cpu"
        self._forward = self.torch_module
        self.mode: dict[str, Any] = {"compile": "none", "cuda_graphs": False}
        self._graphs: dict[tuple[int, ...], tuple[Any, torch.Tensor, list[torch.Tensor]]] = {}
        self._clone_outputs = False  # set when inductor's own CUDA graphs own the outputs (see prepare)
        self._compiled_shapes: set[tuple[int, ...]] = set()

    def prepare(self, compile_mode: str, cuda_graphs: bool, input_size: tuple[int, int],
                batch_sizes: tuple[int, ...]) -> None:
        """Compile and/or capture for each batch size now; the seconds go to runtime, apart from timing."""
        if compile_mode != "none":
            # with our own CUDA graphs, inductor must not add its own (nested capture fails)
            mode = {"default": None, "max-autotune": "max-autotune-no-cudagraphs" if cuda_graphs
                    else "max-autotune"}[compile_mode]
            # dynamic=False compiles one graph per input shape: every batch size and its short final batch.
            # Past dynamo's recompile limit (8) it would run eager under a "compiled" label. The limit counts
            # per code object, and cores of other precisions may share this module's: raise it by this core's
            # shapes, and make hitting it an error, never a silent fallback (where this torch has the switch).
            import torch._dynamo.config as dynamo_config

            limit = "recompile_limit" if hasattr(dynamo_config, "recompile_limit") else "cache_size_limit"
            setattr(dynamo_config, limit, getattr(dynamo_config, limit) + 2 * len(batch_sizes) + 2)
            if hasattr(dynamo_config, "fail_on_recompile_limit_hit"):
                dynamo_config.fail_on_recompile_limit_hit = True
            self._forward = torch.compile(self.torch_module, mode=mode, dynamic=False)
            # max-autotune on CUDA replays inductor's CUDA graphs (CUDAGraph Trees), whose outputs the next
            # replay overwrites: in overlapped mode batch k-1 is post-processed while batch k runs
            self._clone_outputs = mode == "max-autotune" and self.device.is_cuda
            clock = time.perf_counter()
            for b in batch_sizes:
                self(torch.zeros(b, 3, *input_size, device=self.device.torch_device))
                self._compiled_shapes.add((b, 3, *input_size))
            self.device.synchronize()
            self.mode.update(compile=compile_mode, compile_seconds=round(time.perf_counter() - clock, 3),
                             compile_note="torch.compile(dynamic=False): one compiled graph per batch size, "
                                          "compiled at load by a forward at each; never in a timed batch")
        if cuda_graphs:
            clock = time.perf_counter()
            for b in batch_sizes:
                self._capture((b, 3, *input_size))
            self.mode.update(cuda_graphs=True, capture_seconds=round(time.perf_counter() - clock, 3),
                             captured_batch_sizes=list(batch_sizes))

    def prepare_shape(self, shape: tuple[int, ...]) -> None:
        """Compile and/or capture for one more input shape (a short final batch) before it is timed."""
        if self.mode["compile"] != "none" and shape not in self._compiled_shapes:
            # inductor's CUDA graphs (max-autotune) warm up at a shape's first call and record at its second
            for _ in range(2 if self._clone_outputs else 1):
                self._run(torch.zeros(shape, device=self.device.torch_device))
            self.device.synchronize()
            self._compiled_shapes.add(shape)
            self.mode.setdefault("compiled_before_short_batch", []).append(shape[0])
        if self.mode["cuda_graphs"] and shape not in self._graphs:
            self._capture(shape)
            self.mode.setdefault("captured_before_short_batch", []).append(shape[0])

    def _run(self, batch: torch.Tensor) -> list[torch.Tensor]:
        with torch.inference_mode(), torch.autocast(self.device.kind, dtype=self.dtype,
                                                    enabled=self.dtype is not None):
            out = self._forward(batch)
        outputs = output_list(out)
        return [o.float() for o in outputs] if self.dtype is not None else outputs

    def _capture(self, shape: tuple[int, ...]) -> None:
        static_in = torch.zeros(shape, device=self.device.torch_device)
        side = torch.cuda.Stream(self.device.index)
        side.wait_stream(torch.cuda.current_stream(self.device.index))
        with torch.cuda.stream(side):  # warm-up off the capture: cuDNN autotuning, allocator pools
            for _ in range(3):
                self._run(static_in)
        torch.cuda.current_stream(self.device.index).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        try:  # torch.cuda.graph captures on a stream of the *current* device: make it ours (cuda:N, N > 0)
            with torch.cuda.device(self.device.index), torch.cuda.graph(graph):
                static_out = self._run(static_in)
        except RuntimeError as exc:
            raise UsageError(f"--cuda-graphs: this core cannot be captured ({str(exc).splitlines()[0][:200]}); "
                             "run without --cuda-graphs") from exc
        self._graphs[shape] = (graph, static_in, static_out)

    def __call__(self, batch: torch.Tensor) -> list[torch.Tensor]:
        if not self.mode["cuda_graphs"]:
            outputs = self._run(batch)
            # always a copy: under autocast `.float()` of an output that is already fp32 is that same tensor
            return [o.clone() for o in outputs] if self._clone_outputs else outputs
        shape = tuple(batch.shape)
        if shape not in self._graphs:  # not prepared (prepare_shape): captured at first use, and says so
            self._capture(shape)
            self.mode.setdefault("captured_at_first_use", []).append(shape[0])
        graph, static_in, static_out = self._graphs[shape]
        static_in.copy_(batch)
        graph.replay()
        return [o.clone() for o in static_out]  # the next replay overwrites the graph's outputs

    def info(self) -> dict[str, Any]:
        return {"backend": self.backend, "torch_threads": torch.get_num_threads(),
                "device_name": device_name(self.device),
                "precision_mode": f"torch.autocast({self.dtype})" if self.dtype is not None else "fp32 (IEEE)",
                **self.mode}


def device_name(device: Device) -> str:
    """The exact device for runtime.device_name: "cuda:0 NVIDIA H100 80GB HBM3" or "cpu"."""
    return f"{device} {device.name()}" if device.is_cuda else "cpu"


class PyTorchBackend:
    """Eager PyTorch. A source with only an ONNX graph runs as its onnx2torch conversion."""

    name = "pytorch"

    def supports(self, source: CoreSource) -> bool:
        return source.torch_module is not None or source.onnx_model is not None

    def load(self, source: CoreSource, device: Device, precision: str, input_size: tuple[int, int],
             threads: int | None, options: BackendOptions) -> TorchCore:
        if source.torch_module is not None:
            core = TorchCore(source.torch_module(), device, precision)
        else:
            clock = time.perf_counter()
            try:
                module = onnx_to_torch(source.onnx_model())
            except Exception as exc:  # onnx2torch raises NotImplementedError/KeyError for unsupported ops
                raise UsageError(f"{source.name}: onnx2torch cannot convert this ONNX graph "
                                 f"({type(exc).__name__}: {exc}); use --backend onnxruntime") from exc
            # on a GPU (or compiled) the shape constants must not live on the device: see capturable.py
            rebound = (keep_shape_constants_on_host(module)
                       if device.is_cuda or options.compile != "none" else 0)
            core = TorchCore(module, device, precision)
            core.mode["host_shape_constants"] = rebound
            # a "pytorch" row of a model defined by its ONNX graph ran this conversion: said in the summary and record
            core.mode["conversion"] = {"converter": "onnx2torch", "onnx2torch": version("onnx2torch"),
                                       "from": "the model's ONNX graph",
                                       "seconds": round(time.perf_counter() - clock, 3)}
            if source.check_batches:
                from harness.detector.graph import check_batch_rows

                check_batch_rows(source.name, core, input_size, source.check_batches, source.query_rows)
        core.prepare(options.compile, options.cuda_graphs, input_size, options.batch_sizes)
        return core
