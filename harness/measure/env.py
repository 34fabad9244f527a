"""The environment of a run: hardware, software versions, threads, TF32, allocator, harness commit."""

from __future__ import annotations

import os
import platform
import re
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import psutil
import torch

from harness import __version__, shell
from harness.build_info import harness_commit
from harness.hardware import derive_hardware_id
from harness.measure.device import Device
from harness.measure.hygiene import NO_CPUFREQ, OPENMP_WAIT_SETTINGS, load_nvml

# The packages whose versions change a run's numbers on every machine (a fleet's nodes must agree on them), and
# the runtimes a machine may or may not have (recorded, never compared: a Jetson has tensorrt, a Raspberry Pi not)
CORE_PACKAGES = ("torch", "torchvision", "onnxruntime", "onnx", "onnx2torch", "numpy", "opencv-python-headless",
                 "pycocotools", "faster-coco-eval", "scipy", "libreyolo")
PACKAGES = (*CORE_PACKAGES, "onnxruntime-gpu", "openvino", "ncnn", "ai-edge-litert", "tensorrt")




def cpu_model() -> str:
    """The CPU's marketing name (/proc/cpuinfo on Linux, sysctl's brand string on macOS, where platform says only
    "arm" for every Apple chip; platform otherwise: Windows' "AMD64 Family 25 Model 97 ..." as the site's rows)."""
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    if sys.platform == "darwin":
        try:
            brand = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True,
                                   timeout=5).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            brand = ""
        if brand:
            return brand
    return platform.processor() or "unknown"


def board_model(root: Path = Path("/")) -> str | None:
    """The board an ARM machine is (`/proc/device-tree/model`: "Raspberry Pi 5 Model B Rev 1.1"); None elsewhere."""
    try:
        return (root / "proc" / "device-tree" / "model").read_bytes().rstrip(b"\x00").decode().strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def cpu_governor() -> str:
    """cpu0's frequency governor, or why there is none to read (a VM or container without cpufreq)."""
    try:
        return Path("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor").read_text(encoding="utf-8").strip()
    except OSError:
        return f"unavailable: {NO_CPUFREQ}"


def package_versions(names: tuple[str, ...] = PACKAGES) -> dict[str, str]:
    """Python's and each package's version ("not-installed" where absent)."""
    out = {"python": platform.python_version()}
    for name in names:
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "not-installed"
    return out


# What `make bench` exports (the Makefile): malloc's mmap and trim thresholds out of a detector's way (the default
# thresholds cost ~25 % of CPU time in page faults on the reference box: docs/benchmarks.md)
RECOMMENDED_GLIBC_TUNABLES = "glibc.malloc.mmap_threshold=4294967296:glibc.malloc.trim_threshold=17179869184"


def _mapped_libraries(maps: Path = Path("/proc/self/maps")) -> str:
    try:
        return maps.read_text(encoding="utf-8")
    except OSError:
        return ""


def allocator(maps: Path = Path("/proc/self/maps")) -> dict[str, str | None]:
    """Which malloc the process runs with: glibc tunables and/or a preloaded tcmalloc/jemalloc, judged by the
    libraries mapped into the process (an LD_PRELOAD the loader could not load is ignored by it, and here)."""
    preload = os.environ.get("LD_PRELOAD")
    tunables = os.environ.get("GLIBC_TUNABLES")
    if not sys.platform.startswith("linux"):  # no glibc: the platform's own malloc, with nothing to tune here
        return {"allocator": f"{sys.platform} default", "GLIBC_TUNABLES": tunables, "LD_PRELOAD": preload}
    mapped = re.search(r"lib(tcmalloc|jemalloc)[\w.-]*\.so", _mapped_libraries(maps))
    if mapped:
        kind = mapped.group(1)
    elif tunables and "malloc" in tunables:
        kind = "glibc (tuned)"
    else:
        kind = "glibc (default)"
    return {"allocator": kind, "GLIBC_TUNABLES": tunables, "LD_PRELOAD": preload}


# TF32 as this process found it (torch's defaults and the environment's overrides), taken before the first change:
# 'default' goes back to it, so that a process running several jobs (a fleet node) never hands one job's 'on' or
# 'off' to the next
_TF32_AS_FOUND: tuple[bool, bool, str] | None = None


def apply_tf32(mode: str) -> None:
    """Pin TF32 for CUDA matmul/cuDNN: 'on', 'off', or 'default' (torch's defaults, as this process found them)."""
    global _TF32_AS_FOUND
    if _TF32_AS_FOUND is None:
        _TF32_AS_FOUND = (bool(torch.backends.cuda.matmul.allow_tf32), bool(torch.backends.cudnn.allow_tf32),
                          torch.get_float32_matmul_precision())
    if mode == "default":
        matmul, cudnn, precision = _TF32_AS_FOUND
    else:
        matmul = cudnn = mode == "on"
        precision = "high" if matmul else "highest"
    torch.backends.cuda.matmul.allow_tf32 = matmul
    torch.backends.cudnn.allow_tf32 = cudnn
    torch.set_float32_matmul_precision(precision)


def tf32_state(mode: str) -> dict:
    return {
        "mode": mode,
        "matmul_allow_tf32": bool(torch.backends.cuda.matmul.allow_tf32),
        "cudnn_allow_tf32": bool(torch.backends.cudnn.allow_tf32),
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "cudnn_benchmark": bool(torch.backends.cudnn.benchmark),
    }


def hardware_block(device: Device, hardware_id: str | None, nvml=None) -> dict:
    """The site's hardware block: id, gpu, cpu, ram_gb (+ gpu memory, driver, CUDA); memory in GiB (2^30 bytes).

    The id names the machine, whatever this run computes on: a CPU run on a GPU machine or a Jetson names its GPU
    (read through NVML, or the board's name: no CUDA context is made for it), as the site's CPU rows of a Jetson
    do. `cpu_cores` counts logical CPUs, as the site's rows do (a100's two 24-core Xeons: 96)."""
    cpu = cpu_model()
    gpu_name, gpu_mem, driver, cuda = "none", None, "N/A", "N/A"  # no GPU: no GPU memory (null, not 0)
    board = board_model() or ""
    if device.is_cuda:
        props = torch.cuda.get_device_properties(device.index)
        gpu_name, gpu_mem = props.name, round(props.total_memory / 2**30, 1)
        cuda = torch.version.cuda or "N/A"
        driver = _nvidia_driver() or "unknown"
    elif (machine_gpu := _nvml_gpu(nvml)) is not None:
        gpu_name, gpu_mem, driver = machine_gpu
    elif any(name in board.lower() for name in ("raspberry pi", "jetson")):
        gpu_name = board  # the leaderboard's Raspberry Pi rows name the board there (and derive the id "rpi5" from it)
    logical = os.cpu_count()
    derived = derive_hardware_id(gpu_name if gpu_name != "none" else None, cpu, logical)
    return {
        "id": hardware_id or derived,
        # an id given that is this machine's own derived one (a fleet node joined without --hardware-id) is derived
        "id_source": "--hardware-id" if hardware_id and hardware_id != derived else "derived",
        "gpu": gpu_name,
        "gpu_memory_gb": gpu_mem,
        "driver_version": driver,
        "cuda_version": cuda,
        "cpu": cpu,
        "cpu_cores": logical,
        "cpu_physical_cores": psutil.cpu_count(logical=False),
        "ram_gb": round(psutil.virtual_memory().total / 2**30, 1),
    }


def _nvml_gpu(nvml=None) -> tuple[str, float, str] | None:
    """The machine's GPU as NVML names it (name, memory in GiB, driver); None without NVML or a GPU, and None where
    its GPUs are of several kinds (which one names the machine is not ours to guess: NVML's order is the PCI
    bus's, CUDA's the fastest first)."""
    nvml, _ = load_nvml(nvml)
    if nvml is None:
        return None
    try:
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(nvml.nvmlDeviceGetCount())]
        gpus = {(_text(nvml.nvmlDeviceGetName(h)), round(nvml.nvmlDeviceGetMemoryInfo(h).total / 2**30, 1))
                for h in handles}
        driver = nvml.nvmlSystemGetDriverVersion()
    except Exception:  # NVML without a usable device (a vGPU, a container without one): the machine has none here
        return None
    if len({name for name, _ in gpus}) != 1:
        return None
    (name, memory), *_ = sorted(gpus)
    return name, memory, _text(driver)


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)  # older NVML bindings give bytes


def _nvidia_driver() -> str | None:
    try:
        import pynvml

        pynvml.nvmlInit()
        return pynvml.nvmlSystemGetDriverVersion()
    except Exception:  # no NVML: the driver version is simply not known
        return None


def collect_environment(device: Device, tf32_mode: str, argv: list[str], threads: int) -> dict:
    """Everything that could make two runs differ, recorded once per run."""
    commit, dirty = harness_commit()
    return {
        "harness_version": __version__,
        "harness_commit": commit,
        "harness_dirty": dirty,
        "argv": [shell.recordable(a) for a in argv],
        "command": "va-bench " + shell.join([shell.recordable(a) for a in argv]),
        "python_executable": sys.executable,
        "platform": platform.platform(),
        "software": package_versions(),
        "cuda": {"torch_cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version()
                 if torch.backends.cudnn.is_available() else None},
        "threads": {"torch_intra_op": threads, "torch_inter_op": torch.get_num_interop_threads(),
                    **{name: os.environ.get(name) for name in ("OMP_NUM_THREADS", *OPENMP_WAIT_SETTINGS)}},
        "tf32": tf32_state(tf32_mode),
        "memory_allocator": allocator(),
        "cpu_governor": cpu_governor(),
        "device": str(device),
    }

