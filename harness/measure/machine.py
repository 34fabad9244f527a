"""`va-bench hw`: what this machine is and which measurement probes work here (and why not)."""

from __future__ import annotations

import platform
from pathlib import Path

import torch

from harness.measure.device import Device
from harness.measure.energy import EnergyProbe
from harness.measure.env import cpu_governor, cpu_model, hardware_block
from harness.measure.hygiene import CpuFiles


def machine_report() -> dict:
    """Hardware identity plus one status entry per probe: {"status": "ok"|"unavailable", ...}."""
    cuda = torch.cuda.is_available()
    device = Device("cuda", 0) if cuda else Device("cpu")
    hardware = hardware_block(device, None)
    energy = EnergyProbe.detect(0 if cuda else None)
    probes: dict[str, dict] = {}
    for source in energy.sources:
        key = {"RAPL (pyJoules)": "energy.rapl", "NVML energy counter": "energy.nvml"}.get(
            source.method, "energy.jetson")
        probes[key] = {"status": "ok", "method": source.method, "domains": list(getattr(source, "names", [])
                                                                              or getattr(source, "rails", {}))}
    for name, reason in energy.unavailable.items():
        probes[f"energy.{name}"] = {"status": "unavailable", "reason": reason}
    hwm = Path("/proc/self/status").exists()
    try:
        Path("/proc/self/clear_refs").write_text("5")
        resettable = True
    except OSError:
        resettable = False
    probes["memory.host_peak"] = ({"status": "ok", "method": "VmHWM, reset per window"} if hwm and resettable else
                                  {"status": "ok", "method": "psutil RSS sampling (VmHWM reset not permitted)"})
    probes["memory.cuda_peak"] = ({"status": "ok", "method": "torch.cuda.max_memory_allocated/reserved"} if cuda
                                  else {"status": "unavailable", "reason": "no CUDA device"})
    probes["profiler.cpu"] = {"status": "ok", "method": "torch.profiler (CPU activities)"}
    probes["profiler.cuda"] = ({"status": "ok", "method": "torch.profiler (CUDA activities)"} if cuda
                               else {"status": "unavailable", "reason": "no CUDA device"})
    cpu_files = CpuFiles.find(Path("/"))  # what the device sampler reads during a timed pass
    missing = cpu_files.unavailable()
    for what, found in (("frequency", f"{len(cpu_files.freqs)} cpufreq policies"),
                        ("temperature", f"{len(cpu_files.temps)} thermal zones")):
        probes[f"device_state.cpu_{what}"] = ({"status": "unavailable", "reason": missing[what]} if what in missing
                                              else {"status": "ok", "method": f"sysfs, {found}"})
    try:
        import onnxruntime as ort

        probes["onnxruntime"] = {"status": "ok", "providers": ort.get_available_providers(), "version": ort.__version__}
    except ImportError:
        probes["onnxruntime"] = {"status": "unavailable", "reason": "onnxruntime not installed"}
    return {
        "hardware": hardware,
        "cpu": {"model": cpu_model(), "governor": cpu_governor(),
                "logical_cpus": hardware["cpu_cores"], "cores": hardware["cpu_physical_cores"],
                "arch": platform.machine()},
        "gpu": {"name": hardware["gpu"], "memory_gb": hardware["gpu_memory_gb"], "driver": hardware["driver_version"],
                "cuda": hardware["cuda_version"], "torch_cuda_available": cuda},
        "probes": probes,
    }
