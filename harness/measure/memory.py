"""Host and GPU memory: a true peak RSS (the kernel's VmHWM high-water mark, reset per window, plus a
psutil sampling thread for the timeline) and CUDA peak allocated/reserved memory."""

from __future__ import annotations

import math
import threading
import time
from array import array
from collections.abc import Iterator
from pathlib import Path

import psutil
import torch

from harness.measure.device import Device

MIB = 2**20


def _vm_hwm_mb() -> float | None:
    """The process's peak resident set size since start or the last reset (Linux)."""
    try:
        for line in Path("/proc/self/status").read_text(encoding="utf-8").splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _reset_vm_hwm() -> bool:
    """Writing 5 to /proc/self/clear_refs resets VmHWM to the current RSS (Linux >= 4.0)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def process_peaks(device: Device, reset: bool = False) -> dict:
    """This process's peaks since its start or the last reset: resident memory (VmHWM, Linux; else None) and, on a
    GPU, the device memory allocated through torch (MiB); `reset` starts new peaks after reading them."""
    ram = _vm_hwm_mb()
    peaks = {"peak_ram_mb": None if ram is None else round(ram, 2), "peak_vram_mb": None,
             "peak_vram_reserved_mb": None}
    if device.is_cuda:
        peaks.update(peak_vram_mb=round(torch.cuda.max_memory_allocated(device.index) / MIB, 2),
                     peak_vram_reserved_mb=round(torch.cuda.max_memory_reserved(device.index) / MIB, 2))
    if reset:
        _reset_vm_hwm()
        if device.is_cuda:
            torch.cuda.reset_peak_memory_stats(device.index)
    return peaks


PEAK_KEYS = ("peak_ram_mb", "peak_vram_mb", "peak_vram_reserved_mb")


def with_other_processes(memory: dict, others: dict[str, dict]) -> dict:
    """A timed window's peaks (MemoryMonitor.end_window) with those of the run's other processes added, by name
    (`forward_process`: its process_peaks; `host_processes`: theirs summed): each figure the sum of every process's
    peak that has it (an upper bound: the peaks need not coincide; None where one of them is unknown), the run's own
    process's peaks under `run_process` and each other's under its name."""
    out = {**memory, "run_process": {key: memory[key] for key in PEAK_KEYS if key in memory}, **others,
           "processes": "each figure the sum of the peaks of the run's process and its " + " and ".join(others)
                        + " (an upper bound: the peaks need not coincide)"}
    for key in PEAK_KEYS:
        parts = [part[key] for part in (memory, *others.values()) if key in part]
        if parts:
            out[key] = None if any(p is None for p in parts) else round(sum(parts), 2)
    for part in others.values():
        if "vram_reason" in part:
            out["vram_reason"] = part["vram_reason"]
    return out


class MemoryMonitor:
    """Samples RSS (and CUDA memory) every `interval_s` on a thread for the run's timeline, and
    measures per-window peaks. The sampler is light (one /proc read per 50 ms)."""

    def __init__(self, device: Device, interval_s: float = 0.05):
        self.device = device
        self.interval_s = interval_s
        self.process = psutil.Process()
        # the timeline as columns (8 bytes a number, a tag's index): a long sustained run holds hundreds of thousands
        # of samples, which as tuples of floats would add ~120 bytes each to the very RSS being measured
        self._times, self._tags, self._rss, self._cuda = array("d"), array("H"), array("d"), array("d")
        self._tag_names: list[str] = []  # a tag's index is an array("H"): up to 65,535 tags, one or two a cell
        self._tag_ids: dict[str, int] = {}
        self._append = threading.Lock()  # the sampler thread and end_window() both sample: whole rows, one at a time
        self.tag = "start"
        self._window_peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._hwm_resettable = False

    def _rss_mb(self) -> float:
        return self.process.memory_info().rss / MIB

    def _sample(self) -> None:
        rss = self._rss_mb()
        cuda = torch.cuda.memory_allocated(self.device.index) / MIB if self.device.is_cuda else None
        name = self.tag
        with self._append:
            self._window_peak = max(self._window_peak, rss)
            tag = self._tag_ids.get(name)
            if tag is None:  # the name goes in before any sample refers to it
                self._tag_names.append(name)
                tag = self._tag_ids[name] = len(self._tag_names) - 1
            self._times.append(time.time())
            self._tags.append(tag)
            self._rss.append(round(rss, 2))
            self._cuda.append(math.nan if cuda is None else round(cuda, 2))  # appended last: whole samples' count

    def count(self) -> int:
        """How many samples were taken so far."""
        return len(self._cuda)

    def rows(self, count: int | None = None) -> Iterator[tuple[float, str, float, float | None]]:
        """The first `count` samples (default: those taken so far), oldest first: (time, tag, rss MiB, cuda MiB or
        None), made one at a time."""
        for i in range(self.count() if count is None else count):
            cuda = self._cuda[i]
            yield self._times[i], self._tag_names[self._tags[i]], self._rss[i], None if math.isnan(cuda) else cuda

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sample()

    def __enter__(self) -> MemoryMonitor:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def begin_window(self, tag: str) -> None:
        """Start a measured window: reset the kernel high-water mark and the CUDA peak counters."""
        self.tag = tag
        self._hwm_resettable = _reset_vm_hwm()
        self._window_peak = self._rss_mb()
        if self.device.is_cuda:
            torch.cuda.reset_peak_memory_stats(self.device.index)

    def end_window(self) -> dict:
        """Peaks since `begin_window`: the larger of VmHWM (exact, if it could be reset) and samples."""
        self._sample()
        hwm = _vm_hwm_mb() if self._hwm_resettable else None
        peak = max(self._window_peak, hwm or 0.0)
        out = {"peak_ram_mb": round(peak, 2), "ram_method": "VmHWM (reset per window) + psutil sampling"
               if hwm is not None else f"psutil RSS sampling every {int(self.interval_s * 1000)} ms"}
        if self.device.is_cuda:
            out["peak_vram_mb"] = round(torch.cuda.max_memory_allocated(self.device.index) / MIB, 2)
            out["peak_vram_reserved_mb"] = round(torch.cuda.max_memory_reserved(self.device.index) / MIB, 2)
        else:
            out["peak_vram_mb"] = None
            out["vram_reason"] = "CPU run: no device memory"
        self.tag = "between"
        return out
