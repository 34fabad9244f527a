"""What each backend can run where: (backend, device, precision, ONNX Runtime provider) checked up front.

`check_support` runs when a run is planned, before torch, ONNX Runtime or a model is imported (the rules), and
again with the machine's answers once the device is known; `load_core` asks it for every load. It answers from
cheap facts only: the device kind, `onnxruntime.get_available_providers()`, whether torch runs a bf16
convolution here, and whether the optional packages a combination needs are importable. Nothing falls back:
a combination is either run exactly as asked or refused with how to fix it.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from functools import cache

from harness.errors import UsageError

PRECISIONS = ("fp32", "fp16", "bf16", "int8")
# --ort-provider value -> the ONNX Runtime execution provider it asks for
ORT_PROVIDERS = {"cpu": "CPUExecutionProvider", "cuda": "CUDAExecutionProvider",
                 "tensorrt": "TensorrtExecutionProvider"}


@dataclass(frozen=True)
class BuiltinBackend:
    """A built-in runtime's registry entry: where its class is (harness/backends/<module>.py), and for a runtime that
    runs its own converted format, device kind -> precisions (the site's support matrix) and the Python packages
    it needs (one `pip install` line when one is missing). pytorch, onnxruntime and tensorrt state theirs below."""

    module: str
    cls: str
    devices: dict[str, tuple[str, ...]] | None = None
    packages: tuple[str, ...] = ()
    extra: str | None = None  # the va-bench extra that installs the packages (pyproject.toml)
    converts: bool = False  # keeps the model it converts to its own format in the weights cache
    max_batch: int | None = None  # the most images one call takes (a runtime without a batch axis: 1)
    mask_maps: bool = False  # its cores return a segment model's mask maps (masks are scored on it)
    torch_threads: bool = False  # its CPU forward runs on torch's OpenMP threads (their wait policy matters)
    # what it runs of a family's core: "torch" (the torch module, else onnx2torch of the ONNX graph), "onnx" (the ONNX
    # graph, else an export of the torch module) or "converted" (the same ONNX, converted to its own format)
    reads: str = "converted"


# The built-in backends, in registration order, by `--backend` name. A new runtime is its file and one entry here;
# the names and rules are known without importing any runtime.
BUILTINS: dict[str, BuiltinBackend] = {
    "pytorch": BuiltinBackend("pytorch", "PyTorchBackend", mask_maps=True, torch_threads=True, reads="torch"),
    "onnxruntime": BuiltinBackend("onnxruntime", "OnnxRuntimeBackend", mask_maps=True, reads="onnx"),
    "tensorrt": BuiltinBackend("tensorrt", "TensorRTBackend"),
    "openvino": BuiltinBackend("openvino", "OpenVinoBackend", {"cpu": ("fp32", "fp16", "int8")}, ("openvino", "nncf"),
                               "openvino", converts=True),
    "ncnn": BuiltinBackend("ncnn", "NcnnBackend", {"cpu": ("fp32", "fp16")}, ("ncnn", "pnnx"), "ncnn",
                           converts=True, max_batch=1),
    "tflite": BuiltinBackend("tflite", "TfliteBackend", {"cpu": ("fp32", "fp16", "int8")},
                             ("ai_edge_litert", "onnx2tf", "tensorflow"), "litert", converts=True),
    "torchscript": BuiltinBackend("torchscript", "TorchScriptBackend", {"cpu": ("fp32",), "cuda": ("fp32", "fp16")},
                                  converts=True, torch_threads=True, reads="torch"),
}


def int8_hint() -> str:
    """Where int8 runs: the built-in runtimes that quantise on calibration images, by their entries."""
    names = [name for name, entry in BUILTINS.items() if entry.devices and "int8" in entry.devices.get("cpu", ())]
    return f"use --backend {' or '.join(names)} (post-training quantisation on calibration images)"


def mask_backends() -> tuple[str, ...]:
    """The built-in backends whose cores return a segment model's mask maps."""
    return tuple(name for name, entry in BUILTINS.items() if entry.mask_maps)


def what_loads(backend: str, torch_module: bool, onnx_model: bool) -> str:
    """What `backend` loads of a core that has a torch module and/or an ONNX graph (`--dry-run`'s line per group)."""
    entry = BUILTINS.get(backend)
    if entry is None:
        return f"what the {backend} backend makes of its core"
    if entry.reads == "torch":
        return "its torch core" if torch_module else "onnx2torch of its ONNX graph"
    graph = "its ONNX graph" if onnx_model else "an ONNX export of its torch core (cached by content)"
    return graph if entry.reads == "onnx" else f"{graph}, converted for {backend}"


def on_torch_threads(backend: str) -> bool:
    """Whether `backend`'s CPU forward runs on torch's OpenMP threads (a plugged-in backend: not known, no)."""
    entry = BUILTINS.get(backend)
    return entry is not None and entry.torch_threads


def check_batch_sizes(backend: str, sizes, fix: str) -> None:
    """Refuse (UsageError) batch sizes a built-in runtime cannot run in one call (ncnn has no batch axis); `fix`:
    how to, in the caller's own flags."""
    entry = BUILTINS.get(backend)
    if entry is not None and entry.max_batch is not None and max(sizes) > entry.max_batch:
        images = "one image" if entry.max_batch == 1 else f"{entry.max_batch} images"
        raise UsageError(f"--backend {backend} runs {images} per call (no batch axis); {fix}")


def converting_backends(backends: list[str]) -> list[str]:
    """The built-in backends among `backends` that keep the model they convert in the weights cache."""
    return [b for b in backends if b in BUILTINS and BUILTINS[b].converts]
# onnxruntime and onnxruntime-gpu install the same `onnxruntime` package: the CPU build has to go, or the
# one pip wrote last wins (ONNX Runtime's install docs)
GPU_EXTRA = ("pip install 'va-bench[gpu]', then pip uninstall -y onnxruntime onnxruntime-gpu && "
             "pip install onnxruntime-gpu (both builds install the same `onnxruntime` package)")


def ort_provider_for(device_kind: str, requested: str) -> str:
    """The --ort-provider value in effect: 'auto' is the device's own provider (cpu or cuda)."""
    return ("cuda" if device_kind == "cuda" else "cpu") if requested == "auto" else requested


@cache
def cpu_bf16_supported() -> bool:
    """Whether this torch build runs a bf16 convolution on the CPU (tried once on a tiny tensor)."""
    import torch

    try:
        x = torch.ones(1, 1, 4, 4, dtype=torch.bfloat16)
        torch.nn.functional.conv2d(x, torch.ones(1, 1, 3, 3, dtype=torch.bfloat16))
        return True
    except RuntimeError:
        return False


def fp16_converter_installed() -> bool:
    """onnxconverter-common converts an fp32 ONNX graph to fp16 (ONNX Runtime CUDA, --precision fp16)."""
    return importlib.util.find_spec("onnxconverter_common") is not None


def ort_available_providers() -> list[str]:
    import onnxruntime

    return list(onnxruntime.get_available_providers())


def check_support(backend: str, device_kind: str, precision: str, ort_provider: str = "auto",
                  device_index: int = 0, *, machine: bool = True) -> None:
    """Raise a one-line UsageError when `backend` cannot run `precision` on `device_kind` (cpu|cuda; the
    CUDA device `device_index`). `machine=False`: the rules alone, from the options (nothing imported); the
    machine's answers (a bf16 convolution here, the GPU's capability, ONNX Runtime's GPU providers) come with
    `machine=True`, once the device is known."""
    if precision not in PRECISIONS:
        raise UsageError(f"unknown precision {precision!r}; use one of {', '.join(PRECISIONS)}")
    if backend == "pytorch":
        _check_pytorch(device_kind, precision, device_index, machine)
    elif backend == "onnxruntime":
        _check_onnxruntime(device_kind, precision, ort_provider_for(device_kind, ort_provider), machine)
    elif backend == "tensorrt":  # a serialized engine: its precision is its build's (backends/tensorrt.py)
        if device_kind != "cuda":
            raise UsageError("--backend tensorrt runs a serialized TensorRT engine on a GPU; add --device cuda")
    elif backend in BUILTINS and BUILTINS[backend].devices is not None:
        _check_runtime(backend, device_kind, precision)
    elif precision != "fp32":  # a plugged-in backend states its own support at load; fp32 is the baseline
        raise UsageError(f"precision {precision} is only known for the built-in backends; use fp32")


def _check_runtime(backend: str, device_kind: str, precision: str) -> None:
    entry = BUILTINS[backend]
    support = entry.devices
    if device_kind not in support:
        raise UsageError(f"--backend {backend} runs on {' and '.join(support)} only; use --device "
                         f"{next(iter(support))}")
    if precision not in support[device_kind]:
        raise UsageError(f"precision {precision} is not supported by the {backend} backend on {device_kind}; use "
                         f"{', '.join(support[device_kind])}")
    missing = [p for p in entry.packages if importlib.util.find_spec(p) is None]
    if missing:
        extra = f"pip install 'va-bench[{entry.extra}]' (or pip install {' '.join(missing)})" if entry.extra \
            else f"pip install {' '.join(missing)}"
        raise UsageError(f"--backend {backend} needs the Python package{'s' if len(missing) > 1 else ''} "
                         f"{', '.join(missing)}, not installed here; {extra}")


def _check_pytorch(device_kind: str, precision: str, device_index: int, machine: bool) -> None:
    if precision == "int8":
        raise UsageError(f"precision int8 is not supported by the pytorch backend; {int8_hint()}")
    if device_kind == "cpu":
        if precision == "fp16":
            raise UsageError("precision fp16 on the CPU is not supported by the pytorch backend (no fast fp16 "
                             "kernels); use --precision bf16 or fp32, or --device cuda")
        if precision == "bf16" and machine and not cpu_bf16_supported():
            raise UsageError("precision bf16: this torch build cannot run bf16 convolutions on the CPU; use fp32")
    elif precision == "bf16" and machine and _cuda_capability(device_index) < 8:
        # not torch.cuda.is_bf16_supported(): it counts emulation (True before Ampere) and asks the current device
        raise UsageError("precision bf16: this GPU has no bf16 support (needs compute capability 8.0+); "
                         "use --precision fp16 or fp32")


def _cuda_capability(device_index: int) -> int:
    import torch

    return torch.cuda.get_device_properties(device_index).major


def _check_onnxruntime(device_kind: str, precision: str, provider: str, machine: bool) -> None:
    if provider not in ORT_PROVIDERS:
        raise UsageError(f"unknown --ort-provider {provider!r}; use auto, cpu, cuda or tensorrt")
    if device_kind == "cpu" and provider != "cpu":
        raise UsageError(f"--ort-provider {provider} runs on a GPU; add --device cuda (or drop --ort-provider)")
    if device_kind == "cuda" and provider == "cpu":
        raise UsageError("--ort-provider cpu with --device cuda would run on the CPU under a GPU label; "
                         "use --device cpu")
    wanted = ORT_PROVIDERS[provider]
    if machine and provider != "cpu" and wanted not in ort_available_providers():  # every build has the CPU one
        raise UsageError(f"--backend onnxruntime --device cuda needs ONNX Runtime's {wanted}, which this "
                         f"onnxruntime does not have; {GPU_EXTRA}")
    if precision == "int8":
        raise UsageError(f"precision int8 is not supported by the onnxruntime backend; {int8_hint()}")
    if precision == "bf16":
        raise UsageError("precision bf16 is not supported by the onnxruntime backend; use fp16 (GPU) or fp32, "
                         "or --backend pytorch")
    if precision == "fp16":
        if provider == "cpu":
            raise UsageError("precision fp16 is not supported by ONNX Runtime's CPU provider (few fp16 kernels); "
                             "use fp32, or --backend pytorch --precision bf16")
        if provider == "cuda" and not fp16_converter_installed():
            raise UsageError("precision fp16 on ONNX Runtime CUDA converts the graph with onnxconverter-common, "
                             f"which is not installed; {GPU_EXTRA}")
