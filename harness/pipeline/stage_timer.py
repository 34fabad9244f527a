"""StageTimer: per-batch wall-clock time of each pipeline stage and substep.

Clocks are `time.perf_counter_ns`. The device owns synchronisation: with `stage_sync` (latency
mode) every stage boundary waits for the device, so GPU work is charged to the stage that queued
it; without it (throughput mode) only the batch end waits. On CPU sync is a no-op. On CUDA the
forward's GPU time (CUDA events, `device_time`) is recorded beside the stages as `forward_gpu`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch

from harness.measure.device import Device

STAGES = ("preprocess", "transfer", "forward", "postprocess")
# Measured beside the stages, not part of the batch's wall time: the forward's GPU time (CUDA events).
DEVICE_TIMES = ("forward_gpu",)
# The share of an overlapped stream the forward may spend waiting for host work before the run warns that its
# throughput is the host's, not the model's.
HOST_BOUND_SHARE = 0.10


@dataclass
class BatchTiming:
    """One batch: its size, total wall time and time per stage/substep (nanoseconds)."""

    size: int
    total_ns: int = 0
    stages: dict[str, int] = field(default_factory=dict)
    end_ns: int = 0  # perf_counter_ns when the batch ended (overlapped mode: completion times)

    def ms(self, name: str) -> float:
        return (self.total_ns if name == "total" else self.stages.get(name, 0)) / 1e6


class StageTimer:
    """Times batches; use `begin_batch`, `stage(...)`/`substep(...)` blocks, then `end_batch`."""

    def __init__(self, device: Device, stage_sync: bool = True, profiler_ranges: bool = False,
                 batch_sync: bool = True):
        self.device = device
        self.stage_sync = stage_sync
        # Overlapped mode times each batch from another thread than the forward's: a device-wide
        # sync there would wait for the *next* batch's forward, so only the forward stage syncs.
        self.batch_sync = batch_sync
        self.profiler_ranges = profiler_ranges  # label stages in torch.profiler traces (profiler pass only)
        self.batches: list[BatchTiming] = []
        self._current: BatchTiming | None = None
        self._stage: str | None = None
        self._t0 = 0
        self._events: list[tuple[str, object]] = []

    def begin_batch(self, size: int) -> None:
        if self.batch_sync:
            self.device.synchronize()
        self._current = BatchTiming(size=size)
        self._t0 = time.perf_counter_ns()

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = time.perf_counter_ns()
        self._stage = name
        try:
            if self.profiler_ranges:
                with torch.profiler.record_function(name):
                    yield
            else:
                yield
        finally:
            if self.stage_sync:
                self.device.synchronize()
            self._add(name, time.perf_counter_ns() - start)
            self._stage = None

    @contextmanager
    def substep(self, name: str) -> Iterator[None]:
        """A part of the current stage; repeated calls within a batch add up (e.g. per-image NMS)."""
        start = time.perf_counter_ns()
        try:
            yield
        finally:
            if self.stage_sync:
                self.device.synchronize()
            self._add(f"{self._stage}.{name}" if self._stage else name, time.perf_counter_ns() - start)

    def add_substep(self, name: str, ns: int) -> None:
        """A part of the current stage timed elsewhere (a host process's own clock): added as `substep` adds."""
        self._add(f"{self._stage}.{name}" if self._stage else name, ns)

    def add_stage(self, name: str, ns: int) -> None:
        """A stage timed by the caller (an async forward: from its start to its outputs being ready)."""
        self._add(name, ns)

    def narrow_stage(self, name: str, measured_ns: int, rest_to: str) -> None:
        """Stage `name` of this batch, timed once on the wall clock around a runtime's call, becomes the runtime's
        own measure of its work inside that call; the rest of the call's wall time goes to stage `rest_to`, so
        the batch's stages still add up to its time. (The stage's total in the batch is what is narrowed: call it
        right after the stage, which must be timed once per batch.)"""
        if self._current is None or name not in self._current.stages:
            return
        wall = self._current.stages[name]
        kept = max(0, min(measured_ns, wall))
        self._current.stages[name] = kept
        self._add(rest_to, wall - kept)

    def _add(self, name: str, ns: int) -> None:
        if self._current is not None:
            self._current.stages[name] = self._current.stages.get(name, 0) + ns

    def device_time(self, name: str, events) -> None:
        """Device time of this batch read from `events` (gpu.ForwardEvents) once the batch ends: reading
        it waits for the events, so it is read after the wall clock stops."""
        self._events.append((name, events))

    def end_batch(self) -> BatchTiming:
        if self.batch_sync:
            self.device.synchronize()
        batch = self._current
        batch.end_ns = time.perf_counter_ns()
        batch.total_ns = batch.end_ns - self._t0
        for name, events in self._events:
            self._add(name, events.elapsed_ns())
        self._events = []
        self.batches.append(batch)
        self._current = None
        return batch


@dataclass
class ForwardThreadTime:
    """Where the forward's thread spent an overlapped stream (nanoseconds): in the transfer and forward calls (the
    forward stage and the transfer stage beside it: an upload, a runtime's copy out), waiting for the workers to
    hand it the next prepared batch, waiting for a batch's finishing (the bound on batches finishing at once), in
    the caller between two batches it was handed, and the rest of the loop. Filling (waiting for the first batch's
    preparation) and draining (waiting for the last batches' finishing) are apart: every stream has them, however
    many workers. When the stream is slower than the forward alone, these say why: forward calls slower than alone
    are contention (for the host's cores, the interpreter lock the harness's threads share, or on a GPU the device
    the workers' kernels also run on), waits are host work the forward could not hide."""

    batches: int = 0
    forward_ns: int = 0
    waiting_for_preparation_ns: int = 0
    waiting_for_finishing_ns: int = 0
    caller_ns: int = 0
    filling_ns: int = 0
    draining_ns: int = 0
    wall_ns: int = 0

    def record(self) -> dict:
        """Milliseconds per batch of each part, and the rest of the loop (for the run's record)."""
        if not self.batches:
            return {}
        parts = {"forward": self.forward_ns, "waiting_for_preparation": self.waiting_for_preparation_ns,
                 "waiting_for_finishing": self.waiting_for_finishing_ns, "caller": self.caller_ns,
                 "filling": self.filling_ns, "draining": self.draining_ns}
        parts["rest"] = max(0, self.wall_ns - sum(parts.values()))
        per_batch = {name: round(ns / 1e6 / self.batches, 3) for name, ns in parts.items()}
        return {"batches": self.batches, "ms_per_batch": per_batch,
                "wall_ms_per_batch": round(self.wall_ns / 1e6 / self.batches, 3)}

    def host_bound_warning(self, share: float = HOST_BOUND_SHARE, on_gpu: bool = True) -> str | None:
        """A warning when, between filling and draining, the forward's thread spent at least `share` of the stream
        waiting for the host stages: the throughput is then the harness's host work's, not the model's; None
        otherwise. The advice follows the larger wait (and the device: on a CPU the selection has one place)."""
        waited = self.waiting_for_preparation_ns + self.waiting_for_finishing_ns
        steady = self.wall_ns - self.filling_ns - self.draining_ns
        if not self.batches or steady <= 0 or waited < share * steady:
            return None
        ms = self.record()["ms_per_batch"]
        waited_ms = ms["waiting_for_preparation"] + ms["waiting_for_finishing"]
        advice = ("more --workers or another --preprocess may raise it"
                  if self.waiting_for_preparation_ns >= self.waiting_for_finishing_ns
                  else "its post-processing is the longer wait (--nms-on moves the selection)" if on_gpu
                  else "its post-processing is the longer wait (on a CPU the selection has no other place)")
        return (f"overlapped: the forward waited {waited_ms:.1f} ms per batch ({100 * waited / steady:.0f} % of the "
                f"stream) for host work (preparation {ms['waiting_for_preparation']:.1f}, finishing "
                f"{ms['waiting_for_finishing']:.1f}): the harness's host stages, not the model, bound this "
                f"throughput; {advice}")


def completion_intervals_ms(batches: list[BatchTiming], start_ns: int) -> list[float]:
    """Per-image interval of each batch of a stream: time since the previous batch (or the stream's start)
    completed, over the batch size. In overlapped mode batches are in flight together, so this, not a
    batch's end-to-end latency, is the per-image time whose inverse is the throughput: its mean is the
    stream's wall time over its images (for equal batches). Taken in the order the batches completed: with
    --host-processes and two or more workers, batches finish at once and a later one can end first (in the
    stream's order its interval was negative, and the next one held both)."""
    out, previous = [], start_ns
    for b in sorted(batches, key=lambda b: b.end_ns):
        out.append((b.end_ns - previous) / 1e6 / b.size)
        previous = b.end_ns
    return out
