"""Energy over a measurement window: RAPL (through pyJoules), the NVML energy counter, Jetson
INA3221 power rails. A source that cannot be read reports why; nothing is ever reported as 0 J.

RAPL counters are monotonic microjoule counters that wrap at `max_energy_range_uj` (pyJoules
subtracts raw readings; the wrap correction is ours). NVML gives millijoules since driver load.
Jetson rails give instantaneous voltage/current, integrated here by a sampling thread.
"""

from __future__ import annotations

import glob
import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from harness.measure.hygiene import nvml_handle

# np.trapezoid is numpy >= 2.0; np.trapz, its name before, is gone from numpy 2.4
_trapezoid = getattr(np, "trapezoid", None) or np.trapz

RAPL_HOW_TO = ("RAPL energy counters are root-only since Linux 5.10: run as root or "
               "`sudo chmod a+r /sys/class/powercap/intel-rapl*/**/energy_uj`")
JETSON_GLOB = "/sys/bus/i2c/drivers/ina3221/*/hwmon/hwmon*"


class EnergyUnavailable(Exception):
    """This source cannot be read here; the message says why (and how to enable it)."""


@dataclass
class SourceReading:
    """Energy per domain (joules) of one source over one window."""

    method: str
    joules: dict[str, float]
    total_domains: list[str]  # the domains that together are this source's total (no double counting)

    @property
    def total_j(self) -> float:
        return sum(self.joules[d] for d in self.total_domains)


class RaplSource:
    """CPU package/core/uncore/dram energy via pyJoules' RAPL device, with wrap-around handled."""

    method = "RAPL (pyJoules)"

    def __init__(self, api_dir: str | None = None):
        try:
            from pyJoules.device import rapl_device
            from pyJoules.exception import NoSuchDeviceError
        except ImportError as exc:
            raise EnergyUnavailable("pyJoules is not installed (pip install 'va-bench[energy]', or pip install "
                                    "pyJoules)") from exc
        saved = rapl_device.RAPL_API_DIR
        rapl_device.RAPL_API_DIR = api_dir or saved  # pyJoules reads this module constant
        try:
            if not os.path.isdir(rapl_device.RAPL_API_DIR):
                raise EnergyUnavailable(f"no RAPL interface ({rapl_device.RAPL_API_DIR} absent: not an Intel/AMD "
                                        "CPU exposing powercap, or a VM that hides it)")
            try:
                domains = rapl_device.RaplDevice.available_domains()
            except NoSuchDeviceError as exc:
                raise EnergyUnavailable("RAPL interface present but no domain found") from exc
            if not domains:  # pyJoules' own default would fail with "reduce() of empty iterable"
                raise EnergyUnavailable("RAPL interface present but no domain found")
            device = rapl_device.RaplDevice()
            device.configure(domains)
        finally:
            rapl_device.RAPL_API_DIR = saved
        self.device = device
        self.names = [repr(d) for d in domains]
        self.max_range = [self._max_range(f) for f in device._api_file_names]
        try:
            self._read()
        except PermissionError as exc:
            raise EnergyUnavailable(RAPL_HOW_TO) from exc
        self.total_domains = [n for n in self.names if n.startswith(("package", "dram"))]

    @staticmethod
    def _max_range(energy_file: str) -> float | None:
        try:
            return float(Path(energy_file).with_name("max_energy_range_uj").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None

    def _read(self) -> list[float]:
        return self.device.get_energy()

    def start(self) -> None:
        self._start = self._read()

    def stop(self) -> SourceReading:
        end = self._read()
        joules = {}
        for name, a, b, top in zip(self.names, self._start, end, self.max_range, strict=True):
            delta = b - a
            if delta < 0 and top:  # the counter wrapped once during the window
                delta += top  # (without its range a negative delta stays, and the block says unavailable)
            joules[name] = delta / 1e6
        return SourceReading(self.method, joules, self.total_domains)


class NvmlSource:
    """GPU board energy from NVML's total-energy counter (Volta and newer), in millijoules."""

    method = "NVML energy counter"

    def __init__(self, index: int = 0, nvml=None):
        if nvml is None:
            try:
                import pynvml as nvml
            except ImportError as exc:
                raise EnergyUnavailable("nvidia-ml-py is not installed (pip install nvidia-ml-py)") from exc
        self.nvml = nvml
        try:
            nvml.nvmlInit()
            self.handle = nvml_handle(nvml, index)  # by the CUDA device's UUID: CUDA_VISIBLE_DEVICES renumbers
            nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)
        except Exception as exc:  # NVMLError subclasses: no driver, no GPU, not supported
            raise EnergyUnavailable(f"NVML energy counter not readable: {exc}") from exc
        self.name = f"nvidia_gpu_{index}"
        self.total_domains = [self.name]

    def start(self) -> None:
        self._start = self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)

    def stop(self) -> SourceReading:
        end = self.nvml.nvmlDeviceGetTotalEnergyConsumption(self.handle)
        return SourceReading(self.method, {self.name: (end - self._start) / 1e3}, self.total_domains)


class JetsonRailsSource:
    """Jetson INA3221 rails (hwmon: inN_label, inN_input mV, currN_input mA), integrated over time."""

    method = "Jetson INA3221 rails"

    def __init__(self, pattern: str = JETSON_GLOB, interval_s: float = 0.02):
        self.rails: dict[str, tuple[Path, Path]] = {}
        for hwmon in sorted(glob.glob(pattern)):
            for label in sorted(Path(hwmon).glob("in*_label")):
                n = label.name[2:-6]
                volt, curr = Path(hwmon) / f"in{n}_input", Path(hwmon) / f"curr{n}_input"
                if volt.exists() and curr.exists():
                    self.rails[label.read_text(encoding="utf-8").strip()] = (volt, curr)
        if not self.rails:
            raise EnergyUnavailable("no Jetson INA3221 power rails (not a Jetson, or the ina3221 driver is absent)")
        self.interval_s = interval_s
        self.total_domains = ["VDD_IN"] if "VDD_IN" in self.rails else list(self.rails)
        self.samples: list[tuple[float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def read_watts(self) -> dict[str, float]:
        return {name: float(v.read_text()) * float(c.read_text()) / 1e6 for name, (v, c) in self.rails.items()}

    def sample(self, now: float | None = None) -> None:
        self.samples.append((time.perf_counter() if now is None else now, self.read_watts()))

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def start(self, threaded: bool = True) -> None:
        self.samples = []
        self.sample()
        if threaded:
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()

    def stop(self) -> SourceReading:
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
        self.sample()
        return self.integrate()

    def integrate(self) -> SourceReading:
        t = np.array([s[0] for s in self.samples])
        joules = {name: float(_trapezoid([s[1][name] for s in self.samples], t)) for name in self.rails}
        return SourceReading(self.method, joules, self.total_domains)


@dataclass
class EnergyProbe:
    """The energy sources usable on this machine, and why the others are not."""

    sources: list = field(default_factory=list)
    unavailable: dict[str, str] = field(default_factory=dict)

    @classmethod
    def detect(cls, gpu_index: int | None = None) -> EnergyProbe:
        probe = cls()
        candidates = [("rapl", RaplSource), ("jetson", JetsonRailsSource)]
        if gpu_index is not None:
            candidates.append(("nvml", lambda: NvmlSource(gpu_index)))
        else:
            probe.unavailable["nvml"] = "no CUDA device in this run"
        for name, factory in candidates:
            try:
                probe.sources.append(factory())
            except EnergyUnavailable as exc:
                probe.unavailable[name] = str(exc)
        return probe

    @contextmanager
    def window(self, result: dict):
        """Measure the enclosed block; fills `result` with duration and readings."""
        for source in self.sources:
            source.start()
        start = time.perf_counter()
        try:
            yield result
        finally:
            result["duration_s"] = time.perf_counter() - start
            result["timestamp"] = time.time()
            result["readings"] = [s.stop() for s in self.sources]
            result["unavailable"] = dict(self.unavailable)


def _reading_problem(readings: list[SourceReading], duration: float) -> str | None:
    """Why the window's readings are no measurement: a domain's energy negative (a counter that went backwards: a
    wrap whose range is unknown, or a reset), or a source's total not above 0 (its counter did not advance: the
    window is shorter than the counter's update period)."""
    for reading in readings:
        backwards = [name for name, joules in reading.joules.items() if not joules >= 0]
        if backwards:
            return (f"{reading.method}: {', '.join(backwards)} went backwards over the window (a wrap of unknown "
                    "range, or a reset)")
        if not reading.total_j > 0:
            return (f"{reading.method}: the counter did not advance over the {duration:.3f} s window (shorter than "
                    "its update period); time more batches (--min-timed-batches, a larger --subset) to measure it")
    return None


def energy_block(window: dict | None, probe: EnergyProbe, images: int) -> dict:
    """The submission's `energy` block: J/image, images/J, average W per domain, or unavailable + why."""
    if not probe.sources or not window:
        reasons = "; ".join(f"{k}: {v}" for k, v in probe.unavailable.items()) or "energy probe not run"
        return {"status": "unavailable", "reason": reasons}
    duration = window["duration_s"]
    problem = _reading_problem(window["readings"], duration)
    if problem:  # a counter that did not move or went backwards measured nothing: never a 0 or negative figure
        return {"status": "unavailable", "reason": problem}
    domains, total = {}, 0.0
    for reading in window["readings"]:
        for name, joules in reading.joules.items():
            domains[name] = {"joules": round(joules, 6), "avg_w": round(joules / duration, 4), "method": reading.method}
        total += reading.total_j
    return {
        "status": "ok",
        "methods": sorted({r.method for r in window["readings"]}),
        "window_s": round(duration, 4),
        "images": images,
        "joules_total": round(total, 6),
        "joules_per_image": round(total / images, 6) if images else None,
        "images_per_joule": round(images / total, 4) if total > 0 else None,
        "domains": domains,
        "unavailable": probe.unavailable,
    }
