"""torch.profiler pass: a Chrome/Perfetto trace and the key-averages table of a few batches."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from harness.files import atomic_file
from harness.measure.device import Device
from harness.storage import discard_cut_write


@contextmanager
def torch_profile(device: Device):
    """Profile CPU activity (plus CUDA when the device is CUDA)."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.is_cuda else [])
    with profile(activities=activities, record_shapes=False) as prof:
        yield prof


def export_trace(prof, path: Path) -> Path:
    """Write the Chrome trace atomically (the profiler writes to a temp file we then rename). torch writes it to
    `tmp + ".tmp"` and renames that, saying nothing when the write fails (a full disk, a file-size limit): its
    leftover, or an empty trace, is an error (DiskFullError where the storage is why), never a trace."""
    with atomic_file(path, suffix=".tmp") as tmp:
        prof.export_chrome_trace(tmp)
        unfinished = Path(tmp + ".tmp")
        if unfinished.exists() or Path(tmp).stat().st_size == 0:
            full = discard_cut_write(unfinished, path)
            if full is not None:
                raise full
            raise RuntimeError(f"torch's profiler did not finish writing its trace {path}")
    return path


def op_rows(prof, device: Device, limit: int | None = None) -> list[dict]:
    """Key averages, most self time first (CPU, or device time on CUDA)."""
    rows = []
    for evt in prof.key_averages():
        row = {"name": evt.key, "calls": evt.count,
               "self_cpu_ms": round(evt.self_cpu_time_total / 1e3, 4),
               "cpu_total_ms": round(evt.cpu_time_total / 1e3, 4)}
        if device.is_cuda:
            row["self_device_ms"] = round(getattr(evt, "self_device_time_total", 0) / 1e3, 4)
            row["device_total_ms"] = round(getattr(evt, "device_time_total", 0) / 1e3, 4)
        rows.append(row)
    key = "self_device_ms" if device.is_cuda else "self_cpu_ms"
    rows.sort(key=lambda r: -r[key])
    return rows[:limit] if limit else rows


def record(name: str):
    """A labelled range in the trace (no-op cost when no profiler is active is ~1 us)."""
    return torch.profiler.record_function(name)
