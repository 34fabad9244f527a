"""The TorchScript backend: the family's torch core (or its ONNX graph's onnx2torch conversion) traced with
`torch.jit.trace` and frozen, on the CPU or a GPU.

Traced at batch 2 (a batch-1 trace can bake the batch size into reshapes) and checked against the eager
module at batch 1, 2 and 4 before use, as the ONNX export is. fp16 (CUDA only, where the GPU computes it)
traces the module converted to half precision; inputs are cast on the way in and outputs back to fp32.
Traces are cached by the weights' SHA-256 and the computation (an ONNX source's graph; a torch module's structure
and the source files of its classes), the torch version, the device (each GPU its own), precision and input size.
"""

from __future__ import annotations

import copy
import hashlib
import time
import warnings
from pathlib import Path
from typing import Any

import torch

from harness.backends import BackendOptions
from harness.backends.export import EXPORT_BATCH, check_export, module_code_sha256, state_dict_sha256
from harness.backends.onnx_graph import has_onnx_graph, load_checked
from harness.backends.pytorch import device_name
from harness.detector.graph import check_batch_rows, onnx_to_torch
from harness.detector.source import CoreSource
from harness.detector.weights import weights_dir
from harness.errors import UsageError
from harness.files import atomic_file, safe_name
from harness.measure.device import Device
from harness.storage import cache_writes


def _trace_path(name: str, identity_sha: str, place: str, precision: str, input_size: tuple[int, int]) -> Path:
    safe = safe_name(name, "core")
    h, w = input_size
    return (weights_dir() / "torchscript" /
            f"{safe}__{identity_sha[:16]}__torch{torch.__version__.split('+')[0]}__{place}__{precision}__{h}x{w}.pt")


class TorchScriptCore:
    """A frozen TorchScript module on the device (takes device tensors, as the eager core does)."""

    backend = "torchscript"
    format = "torchscript"
    takes_device_tensors = True
    torch_module = None  # a traced graph: module hooks do not fire inside it

    def __init__(self, scripted: torch.jit.ScriptModule, device: Device, precision: str, conversion: dict):
        self.scripted, self.device, self.precision, self.conversion = scripted, device, precision, conversion
        self.provider = "cuda" if device.is_cuda else "cpu"
        self.dtype = torch.float16 if precision == "fp16" else torch.float32

    def __call__(self, batch: torch.Tensor) -> list[torch.Tensor]:
        with torch.inference_mode():
            out = self.scripted(batch.to(self.dtype))
        outputs = [out] if isinstance(out, torch.Tensor) else list(out)
        return [o.float() for o in outputs]

    def info(self) -> dict[str, Any]:
        return {"backend": self.backend, "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
                "device_name": device_name(self.device), "compute_precision": self.precision,
                "precision_mode": "fp16 module and inputs (.half())" if self.precision == "fp16" else "fp32 (IEEE)",
                "conversion": self.conversion,
                "layers_unavailable": "a traced TorchScript graph runs no module hooks; per-layer timing: "
                                      "--backend pytorch"}


class TorchScriptBackend:
    """TorchScript (torch.jit.trace + freeze): fp32 on the CPU and GPU, fp16 on the GPU."""

    name = "torchscript"

    def supports(self, source: CoreSource) -> bool:
        # the tracer that exports to ONNX is the one that makes TorchScript: the same cores are out of reach
        return has_onnx_graph(source)

    def load(self, source: CoreSource, device: Device, precision: str, input_size: tuple[int, int],
             threads: int | None, options: BackendOptions) -> TorchScriptCore:
        graph_sha = ""
        if source.torch_module is not None:
            module = source.torch_module().eval()
        else:
            graph = source.onnx_model()
            graph_sha = hashlib.sha256(graph.SerializeToString()).hexdigest()
            try:
                module = onnx_to_torch(graph).eval()
            except Exception as exc:
                raise UsageError(f"{source.name}: onnx2torch cannot convert this ONNX graph for tracing "
                                 f"({type(exc).__name__}: {str(exc)[:200]}); use --backend onnxruntime") from exc
        # a trace is of the weights and the computation: an ONNX source's whole graph, a torch module's structure
        # and code (the weights alone would reuse the trace of a graph changed around the same weights; an fp16
        # trace is not checked against the module, so an edited forward must not find the old one)
        computation = graph_sha or f"{repr(module)}|{module_code_sha256(module)}"
        identity = hashlib.sha256(f"{state_dict_sha256(module)}|{computation}".encode()).hexdigest()
        # per GPU: a trace keeps the device it was made on in its graph (cuda:1 would run part of it on cuda:0)
        place = f"cuda{device.index}" if device.is_cuda else device.kind
        path = _trace_path(source.name, identity, place, precision, input_size)

        def make_core() -> TorchScriptCore:
            cached = path.is_file()
            clock = time.perf_counter()
            scripted = None
            if cached:
                try:
                    with warnings.catch_warnings():  # TorchScript is the runtime asked for: its deprecation is not news
                        warnings.filterwarnings("ignore", message=r".*torch\.jit\.load\W* is deprecated",
                                                category=FutureWarning)
                        scripted = torch.jit.load(str(path), map_location=device.torch_device)
                except Exception:  # a damaged cache file: trace again
                    path.unlink(missing_ok=True)
                    cached = False
            if scripted is None:
                scripted = self._trace(source.name, module, device, precision, input_size, path)
            conversion = {"converter": "torch.jit.trace + torch.jit.freeze", "torch": torch.__version__,
                          "traced_batch": EXPORT_BATCH, "file": str(path), "cached": cached,
                          "seconds": round(time.perf_counter() - clock, 3)}
            return TorchScriptCore(scripted, device, precision, conversion)

        def check(core: TorchScriptCore) -> dict[str, Any]:
            if source.check_batches:  # a graph whose batch axis was made dynamic after export: each row its own image
                check_batch_rows(source.name, _HostInput(core, device), input_size, source.check_batches,
                                 source.query_rows)
            if precision != "fp32":  # fp16 differs from the fp32 module by more than the check's tolerance
                return ({"against": "each image alone", "checked_batches": list(source.check_batches)}
                        if source.check_batches else {"skipped": "fp16 differs from the fp32 module by more than "
                                                                 "the check's tolerance"})
            reference = module if not device.is_cuda else copy.deepcopy(module).to(device.torch_device)
            checked = check_export(source.name, _OnDevice(reference, device), _HostInput(core, device), input_size,
                                   path, runtime="torchscript", rows_as_set=source.query_rows)
            return {"against": "the torch module", **{k: v for k, v in checked.items() if k != "opset"}}

        return load_checked(make_core, check, lambda core: path)

    @staticmethod
    def _trace(name: str, module: torch.nn.Module, device: Device, precision: str, input_size: tuple[int, int],
               path: Path) -> torch.jit.ScriptModule:
        module = copy.deepcopy(module).to(device.torch_device)
        if precision == "fp16":
            module = module.half()
        example = torch.rand(EXPORT_BATCH, 3, *input_size, device=device.torch_device,
                             dtype=torch.float16 if precision == "fp16" else torch.float32)
        try:
            with warnings.catch_warnings(), torch.no_grad():  # the tracer warns about Python-side shape maths
                warnings.simplefilter("ignore")
                scripted = torch.jit.freeze(torch.jit.trace(module, example, check_trace=False))
        except Exception as exc:
            raise UsageError(f"{name}: torch.jit.trace cannot trace this core ({type(exc).__name__}: "
                             f"{str(exc).splitlines()[0][:200]}); use --backend pytorch") from exc
        with atomic_file(path) as tmp, cache_writes(path, Path(tmp)):
            torch.jit.save(scripted, tmp)
        return scripted


class _OnDevice(torch.nn.Module):
    """The eager reference on the core's device, taking host tensors (what check_export feeds)."""

    def __init__(self, module: torch.nn.Module, device: Device):
        super().__init__()
        self.module, self.device = module, device

    def forward(self, x: torch.Tensor):
        out = self.module(x.to(self.device.torch_device))
        outs = [out] if isinstance(out, torch.Tensor) else list(out)
        return [o.cpu() for o in outs]


class _HostInput:
    """The traced core fed host tensors (check_export's random batches), outputs back on the host."""

    def __init__(self, core: TorchScriptCore, device: Device):
        self.core, self.device = core, device

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        return [o.cpu() for o in self.core(x.to(self.device.torch_device))]
