"""The host stages of a stream in processes of their own (`--host-processes N`).

Every thread of a process shares one interpreter lock. On a GPU an eager forward is a stream of Python calls
that each give the lock up while a kernel is queued and must take it back before the next call; a host stage in a
thread beside it takes the lock in those gaps, and the forward then waits for the stage's next release at every
call, not only while the stage computes (measured on the CPU with a stand-in: harness/bench/lock_convoy.py). In
processes the host stages have locks of their own. They run what needs no device:

- `prepare`: each image's file read and decoded, and letterboxed into a uint8 canvas [B,H,W,3] (cv2 or PIL, the
  host implementations: preprocess.letterbox_canvas). The canvas is a shared memory segment of the calling
  thread's, made once (anew only to grow) and mapped by both sides: the child letterboxes straight into it, the
  parent uploads and normalises it from there. Nothing but a name crosses the pipe for it. A batch is split over
  the processes idle when it comes (two images a part at least), each writing its own rows of the canvas: a
  stream's first batch is ready in a part's time, not the whole batch's (a b32 batch's preparation on an H200's
  16-core host: 20 ms split, 130 ms in one process, measured on two machines).
- `select`: the family's selection (NMS per image, or top-k) and the boxes in original pixels, on candidates that
  are on the host (a CPU run, a core whose outputs come back to the host, or --nms-on host). The candidates go
  and the batch's detections come back as a few numpy arrays (postprocess.BatchArrays, a batch's well under a
  megabyte), which the run splits by image.
- `finish`: for a family that gives a `host_decoder` (harness/detector/protocol.py), where the selection runs on the
  host anyway, all of a batch's finishing from its raw outputs: the run copies them (from the GPU, one copy each)
  into the calling thread's shared segment (the one its canvases use), and the process checks them, decodes the
  head, gathers the candidates, selects, and returns the batch's detections as select does. Not for segment
  models: their
  outputs hold the mask maps, which stay on the device.

The parent keeps what needs its device or its objects: the upload, the copy of the raw outputs (or, without a
host decoder, the family's head decode and the copy of the candidates to the host), and masks.

Processes are started by torch's `spawn` context (a process with a CUDA context cannot fork), once per process and
count, all at once, when the first pipeline that asks for them is made (a group's set-up, never a timed pass): each
imports torch and cv2 (seconds). They ignore the stop signals a terminal sends its whole process group (Ctrl-C, a
closed terminal): the run decides how to stop, and closes them.

Each process has a pipe of its own: a worker takes an idle process (for a preparation, every idle one up to a
part each), sends it the function and its arguments, and waits for the answer without the interpreter lock; each
process is idle again as soon as its answer is in. That is all the parent does per batch, on the worker's own
thread. (concurrent.futures' process pool, used before, spent about 1.3 ms of the parent's processor a batch in its
manager and feeder threads, and in the handshake that hands each shared canvas's descriptor over: time under the
lock that an eager GPU forward waits for. Measured on the CPU box: harness/bench/lock_convoy.py --handover.)
"""

from __future__ import annotations

import atexit
import ctypes
import errno
import itertools
import math
import os
import pickle
import queue
import re
import secrets
import signal
import sys
import threading
import time
import traceback
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cache
from multiprocessing import shared_memory
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from multiprocessing.reduction import ForkingPickler
from pathlib import Path

import cv2
import torch
import torch.multiprocessing

from harness.detector.protocol import PostprocessSpec, PreprocessSpec
from harness.measure.device import Device
from harness.measure.memory import process_peaks
from harness.pipeline.checks import check_decoded, check_finite
from harness.pipeline.postprocess import (
    BatchCandidates,
    batch_arrays,
    gather_candidates,
    per_image,
    select,
    to_original,
)
from harness.pipeline.preprocess import ImageTransform, decode_bytes, letterbox_canvas
from harness.process_exit import STOP_SIGNALS, before_leave
from harness.records import ImageDetections

PR_SET_PDEATHSIG = 1  # linux/prctl.h
_OWNERS = itertools.count()  # a token per (pool, calling thread): its segments' names start with it
SEGMENT_ALIGN = 64  # each raw output's offset in the shared segment (a cache line; any dtype's alignment)
MIN_IMAGES_PER_PROCESS = 2  # the smallest part of a batch's preparation (each part costs a hand-over; not tuned)
STARTUP_SECONDS = 300  # a host process's start (torch's and OpenCV's imports) on a loaded machine

# A BatchCandidates' tensors by name, as they cross between processes (`counts` is a list)
CANDIDATE_FIELDS = ("boxes", "scores", "labels", "image", "rows")


class HostProcessError(RuntimeError):
    """A host process ended while it had work (killed, out of memory): the stream cannot go on."""


class HostProcessTraceback(Exception):
    """Where in a host process an error was raised (the cause of the error re-raised in the run's process)."""


@dataclass(frozen=True)
class PreparedCanvas:
    """A batch prepared in a host process: its letterboxed uint8 canvas [B,H,W,3] (BGR, in the calling thread's
    shared canvas: valid until that thread prepares its next batch), each image's transform, and the child's own time
    for the reads and decodes and for the letterbox (ns)."""

    canvas: torch.Tensor
    transforms: list[ImageTransform]
    decode_ns: int
    letterbox_ns: int


@dataclass(frozen=True)
class Selected:
    """A batch's selection made in a host process: each image's detections, the kept candidates (on the host,
    grouped by image, best first) and their boxes in original pixels where asked for (masks need them; else None),
    and the child's time for the selection and for the boxes in original pixels (ns)."""

    detections: list[ImageDetections]
    kept: BatchCandidates | None
    boxes: torch.Tensor | None
    select_ns: int
    boxes_ns: int


@dataclass(frozen=True)
class Finished:
    """A batch finished in a host process from its raw outputs: each image's detections, the run's time copying the
    outputs into shared memory, and the child's time for the decode and gathering of candidates, the selection, and
    the boxes in original pixels (ns)."""

    detections: list[ImageDetections]
    copy_ns: int
    decode_ns: int
    select_ns: int
    boxes_ns: int


@dataclass(eq=False)  # each member is itself: two that ended (both fields None) are not one
class _Member:
    """One host process and the run's end of its pipe; `process` None once it ended (started again when next used)."""

    process: BaseProcess | None
    connection: Connection | None


class HostProcesses:
    """`processes` host processes (see the module docstring), started now; lower in priority than the parent by
    `nice` (Linux), each running torch and OpenCV on one thread (their parallelism is the processes')."""

    def __init__(self, processes: int, nice: int = 0):
        if processes < 1:
            raise ValueError(f"processes must be >= 1, not {processes}")
        self.processes = processes
        self.nice = nice
        remove_stale_segments()  # a run killed with its resource tracker (a process group's SIGKILL) left them
        self._context = torch.multiprocessing.get_context("spawn")
        self._idle: queue.SimpleQueue[_Member] = queue.SimpleQueue()
        self._members = [_Member(*self._spawn()) for _ in range(processes)]  # all started, then each awaited
        for member in self._members:
            self._await_ready(member)
            self._idle.put(member)
        # each calling thread's shared segment: its canvas while it prepares a batch, a batch's raw outputs while it
        # finishes one (a thread does one at a time, and is done with the canvas when its preparation returns)
        self._own = threading.local()
        self._segments: list[shared_memory.SharedMemory] = []  # every segment made: unlinked at close
        self._segments_lock = threading.Lock()
        # segments page-locked for a GPU's copies: name -> (the address registered, the GPU it was registered from)
        self._pinned: dict[str, tuple[int, int]] = {}
        self._retired: list[shared_memory.SharedMemory] = []  # replaced by larger ones, still mapped by a tensor
        # how the segments are for a GPU's copies, for the record: None until a GPU run asks
        self.page_locking: str | None = None

    def _spawn(self) -> tuple[BaseProcess, Connection]:
        ours, theirs = self._context.Pipe()
        process = self._context.Process(target=_serve, args=(theirs, self.nice, os.getpid()), daemon=True,
                                        name="va-host-process")
        with stop_signals_blocked():  # a Ctrl-C while it starts would print its imports' traceback: the run stops it
            process.start()
        theirs.close()  # the child's end lives in the child: its exit then shows here as the end of the pipe
        return process, ours

    def _await_ready(self, member: _Member) -> None:
        try:
            if not member.connection.poll(STARTUP_SECONDS):
                raise HostProcessError(f"a host process did not start within {STARTUP_SECONDS} s (importing torch and "
                                       "OpenCV); the machine's load and memory are the first things to check")
            member.connection.recv()  # its pid: started, imports done
        except (EOFError, OSError) as exc:
            raise self._ended(member, "starting") from exc

    def close(self) -> None:
        """Stop the processes (closing their pipes ends them) and remove the shared segments."""
        for member in self._members:
            if member.connection is not None:
                member.connection.close()
                member.connection = None
        for member in self._members:
            if member.process is not None:
                member.process.join(timeout=5)
                if member.process.is_alive():  # busy with a batch nobody waits for any more
                    member.process.terminate()
                    member.process.join()
                member.process = None
        with self._segments_lock:
            segments, self._segments = self._segments, []
            retired, self._retired = self._retired, []
        for segment in segments:
            self._unlock(segment)
            _release(segment)
        for segment in retired:
            _release(segment)

    def _call(self, fn, *args):
        """fn(*args) in an idle host process (waiting, without the interpreter lock, for one to be free)."""
        request = ForkingPickler.dumps((fn, args))  # what cannot be sent fails here, before a process is involved
        return self._exchange(1, lambda parts: [request])[0]

    def _call_split(self, count: int, request) -> list:
        """A batch of `count` images in parts, one per host process that is idle now (at least one, waited for;
        at most one per MIN_IMAGES_PER_PROCESS images): `request(start, stop)` gives the (function, arguments) for
        images [start, stop). Each part's answer, in order. At a stream's start every process is idle and its first
        batch is ready in a part's time, not the whole batch's; once all are busy a batch takes the one free."""
        def requests(parts: int) -> list[bytes]:
            edges = [count * i // parts for i in range(parts + 1)]
            return [ForkingPickler.dumps(request(start, stop)) for start, stop in itertools.pairwise(edges)]

        return self._exchange(max(1, count // MIN_IMAGES_PER_PROCESS), requests)

    def _exchange(self, most: int, requests) -> list:
        """One idle process waited for, and up to `most` in all of those idle now; `requests(n)` gives the n
        pickled requests, one each. Each request sent, then each answer read (without the interpreter lock), each
        process back among the idle ones as soon as its answer is in. The first error is raised once every answer
        sent for has come back. Interrupted (Ctrl-C on the calling thread), the processes whose start or request
        had begun are ended, so that no late answer is read as the next caller's."""
        held: list[_Member] = []  # taken from the idle ones and not yet given back
        pending: list[tuple[int, _Member]] = []  # (part, member) whose start or request has begun, answer unread
        answers: dict[int, tuple] = {}
        failure = None
        try:
            held.append(self._idle.get())
            while len(held) < most:
                try:
                    held.append(self._idle.get_nowait())
                except queue.Empty:
                    break
            sending = requests(len(held))
            pending = list(enumerate(held))
            started = []  # the last ones here ended: this batch (a later cell's) gets new ones, all started at once
            for part, member in list(pending):
                if member.process is None:
                    try:
                        member.process, member.connection = self._spawn()
                        started.append(member)
                    except OSError as exc:
                        pending.remove((part, member))
                        failure = failure or (HostProcessError(f"a host process could not be started: {exc}"), exc)
            for part, member in list(pending):
                try:
                    if member in started:
                        self._await_ready(member)
                    member.connection.send_bytes(sending[part])
                except (EOFError, OSError) as exc:
                    pending.remove((part, member))
                    ended = self._ended(member, "preparing or finishing a batch")
                    failure = failure or (ended, exc)
            while pending:
                part, member = pending[0]
                try:
                    answers[part] = member.connection.recv()
                except (EOFError, OSError) as exc:
                    ended = self._ended(member, "preparing or finishing a batch")
                    failure = failure or (ended, exc)
                pending.pop(0)
                held.remove(member)
                self._idle.put(member)
        except BaseException:
            for _, member in pending:
                self._discard(member)
            raise
        finally:
            for member in held:
                self._idle.put(member)
        if failure is not None:
            raise failure[0] from failure[1]
        for status, value, where in answers.values():
            if status == "error":
                raise value from HostProcessTraceback(where)
        return [answers[part][1] for part in sorted(answers)]

    @staticmethod
    def _detach(member: _Member) -> BaseProcess | None:
        """The member's process, its pipe closed and the member left to be started again (None: close() was first)."""
        process, connection = member.process, member.connection
        member.process = member.connection = None
        if connection is not None:
            connection.close()
        return process

    def _discard(self, member: _Member) -> None:
        process = self._detach(member)
        if process is not None:
            process.terminate()
            process.join()

    def _ended(self, member: _Member, doing: str) -> HostProcessError:
        """The error for a process that ended while `doing`; the member is left to be started again."""
        process = self._detach(member)
        if process is None:
            return HostProcessError(f"the host processes were closed while {doing}")
        process.join(timeout=5)
        if process.is_alive():  # its pipe broke but it runs on: it cannot serve again
            process.terminate()
            process.join()
        ended = _describe_exit(process.exitcode) if process.exitcode is not None else "its exit status unknown"
        return HostProcessError(f"a host process ended while {doing} ({ended}); the batch's images and the machine's "
                                "memory are the first things to check")

    def _segment(self, needed: int, gpu: torch.device | None = None) -> shared_memory.SharedMemory:
        """The calling thread's shared segment, made (or made anew, larger, the old one freed) to hold `needed`
        bytes; for a GPU's copies, registered with CUDA so that they are direct (see _lock_pages). Its name is the
        thread's token and a generation: a host process that meets a newer one of a thread closes the older."""
        segment = getattr(self._own, "segment", None)
        if segment is None or segment.size < needed:
            owner = getattr(self._own, "owner", None)
            if owner is None:
                owner = self._own.owner = f"{segment_prefix()}{os.getpid()}-{next(_OWNERS)}"
            if segment is not None:  # this thread is done with it: its last canvas or outputs went with their batch
                self._drop(segment)
            self._own.generation = getattr(self._own, "generation", -1) + 1
            segment = self._own.segment = _make_segment(needed, f"{owner}-{self._own.generation}")
            with self._segments_lock:
                self._segments.append(segment)
        if gpu is not None and segment.name not in self._pinned and not (self.page_locking or "").startswith(
                "pageable"):
            self._lock_pages(segment, gpu)
        return segment

    def _drop(self, segment: shared_memory.SharedMemory) -> None:
        """Unregister, unlink and unmap a segment its thread has replaced (kept until close while a tensor still
        maps it)."""
        self._unlock(segment)
        with self._segments_lock:
            self._segments.remove(segment)
            retired, self._retired = [*self._retired, segment], []
            for old in retired:
                if not _release(old):
                    self._retired.append(old)

    def _lock_pages(self, segment: shared_memory.SharedMemory, gpu: torch.device) -> None:
        """Register the segment with CUDA (cudaHostRegister, portable: every context), as torch's own staging of
        shared memory does, from the run's GPU (no context made on another). If the driver refuses, the segments
        stay pageable, which only makes the copies slower, and the record says why."""
        address, index = _address(segment), gpu.index or 0

        def register() -> int:
            torch.cuda.set_device(index)
            return int(torch.cuda.cudart().cudaHostRegister(address, segment.size, 1))

        code = _on_own_thread(register)
        with self._segments_lock:
            if code == 0:
                self._pinned[segment.name] = (address, index)
                self.page_locking = "page-locked (cudaHostRegister)"
            else:
                failed = f"CUDA error {code}" if isinstance(code, int) else code
                self.page_locking = f"pageable: cudaHostRegister failed ({failed})"

    def _unlock(self, segment: shared_memory.SharedMemory) -> None:
        with self._segments_lock:
            pinned = self._pinned.pop(segment.name, None)
        if pinned is not None:
            address, index = pinned

            def unregister() -> int:
                torch.cuda.set_device(index)
                return int(torch.cuda.cudart().cudaHostUnregister(address))

            _on_own_thread(unregister)

    def prepare(self, paths: list[Path], spec: PreprocessSpec, gpu: torch.device | None = None) -> PreparedCanvas:
        """Read, decode and letterbox these images in host processes (`spec.library` cv2 or pil), split over those
        idle now (_call_split), into the calling thread's shared canvas (page-locked for `gpu`'s upload: see
        _segment). The decode and letterbox times are the slowest part's own."""
        shape = (len(paths), *spec.input_size, 3)
        segment = self._segment(math.prod(shape), gpu)
        image_bytes = math.prod(shape[1:])
        names = [str(p) for p in paths]
        parts = self._call_split(len(paths), lambda start, stop: (
            _prepare, (names[start:stop], spec, segment.name, start * image_bytes, (stop - start, *shape[1:]))))
        slowest = max(parts, key=lambda part: part[1] + part[2])
        return PreparedCanvas(_view(segment, 0, shape, torch.uint8), [t for part in parts for t in part[0]],
                              slowest[1], slowest[2])

    def finish(self, raw: list[torch.Tensor], decoder, input_size: tuple[int, int], spec: PostprocessSpec,
               conf: float, iou: float, max_det: int, transforms: list[ImageTransform], whole_batch: bool,
               image_ids: list[int], check: tuple[bool, bool] | None) -> Finished:
        """A batch's finishing from its raw outputs in a host process: the outputs copied (from the device, on the
        calling thread's current stream) into the thread's shared segment, then there the finiteness check, the
        family's `decoder` (a Detector's host_decoder), the candidates, the selection and the boxes in original
        pixels (split by image here). `check`: (scores are logits, the weights are trained) to check the decoder's
        output against the contract (a pipeline's first batch), or None."""
        clock = time.perf_counter_ns()
        layout, end = [], 0
        for tensor in raw:
            layout.append((end, tuple(tensor.shape), tensor.dtype))
            end += -(-tensor.numel() * tensor.element_size() // SEGMENT_ALIGN) * SEGMENT_ALIGN
        segment = self._segment(max(end, 1), next((t.device for t in raw if t.is_cuda), None))
        for tensor, (offset, shape, dtype) in zip(raw, layout, strict=True):
            _view(segment, offset, shape, dtype).copy_(tensor)  # from a GPU: waits for the copy, without the lock
        copy_ns = time.perf_counter_ns() - clock
        arrays, decode_ns, select_ns, boxes_ns = self._call(
            _finish, pickle.dumps(decoder), segment.name, layout, input_size, spec, conf, iou, max_det, transforms,
            whole_batch, image_ids, check)
        return Finished(per_image(arrays, image_ids), copy_ns, decode_ns, select_ns, boxes_ns)

    def memory_peaks(self, reset: bool = False) -> dict:
        """The processes' resident memory peaks since the last reset (measure.memory.process_peaks, VmHWM), summed, and
        their count. Asked between passes, when none has a batch, so every process answers; the sum is None where
        one could not say (or did not answer). `reset` starts new ones."""
        request = ForkingPickler.dumps((_memory_peaks, (reset,)))
        ram = self._exchange(self.processes, lambda parts: [request] * parts)
        total = None if len(ram) < self.processes or any(r is None for r in ram) else round(sum(ram), 2)
        return {"peak_ram_mb": total, "processes": self.processes}

    def select(self, cands: BatchCandidates, spec: PostprocessSpec, iou: float, max_det: int,
               transforms: list[ImageTransform], whole_batch: bool, image_ids: list[int],
               keep: bool = False) -> Selected:
        """postprocess.select and to_original on host candidates in a host process, the split by image here; with
        `keep`, the kept candidates and their boxes come back too."""
        arrays, kept, boxes, select_ns, boxes_ns = self._call(_select, _to_arrays(cands), spec, iou, max_det,
                                                              transforms, whole_batch, keep)
        detections = per_image(arrays, image_ids)
        if keep:
            return Selected(detections, _from_arrays(kept), torch.from_numpy(boxes), select_ns, boxes_ns)
        return Selected(detections, None, None, select_ns, boxes_ns)


@cache
def shared_host_processes(processes: int, nice: int = 0) -> HostProcesses:
    """One set of host processes per count for the whole process (closed when the command leaves)."""
    pool = HostProcesses(processes, nice)
    before_leave(pool.close)
    atexit.register(pool.close)  # a process that ends otherwise (a bench, the tests): no segment left behind
    return pool


@cache
def segment_prefix() -> str:
    """What this process's segment names start with, before its pid: `va`, the pid namespace's id and a dot. Two
    containers that share /dev/shm but not their pids cannot take each other's run for one that has ended."""
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:  # no /proc (macOS): one namespace
        namespace = 0
    return f"va{namespace}."


def remove_stale_segments(folder: Path = Path("/dev/shm")) -> list[str]:
    """Remove the segments of runs of this pid namespace that have ended (their pid is gone); the names removed. A
    run's own close and multiprocessing's resource tracker remove them otherwise; a SIGKILL of the run's whole
    process group leaves them, each as large as a batch's canvas or outputs."""
    pattern = re.compile(re.escape(segment_prefix()) + r"(\d+)-\d+-\d+-[0-9a-f]{8}")
    removed = []
    try:
        names = [entry.name for entry in os.scandir(folder)]
    except OSError:  # no /dev/shm: segments live elsewhere, and the resource tracker is all there is
        return removed
    for name in names:
        match = pattern.fullmatch(name)
        if match is None or _alive(int(match.group(1))):
            continue
        try:
            (folder / name).unlink()
            removed.append(name)
        except OSError:  # removed meanwhile, or another user's
            pass
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _make_segment(size: int, name: str) -> shared_memory.SharedMemory:
    """A shared memory segment of `size` bytes named `name` (a random suffix added), with its pages reserved now:
    a full /dev/shm (a container's is often 64 MiB) is an error here, not a SIGBUS in the process that first writes
    to it."""
    segment = shared_memory.SharedMemory(name=f"{name}-{secrets.token_hex(4)}", create=True, size=size)
    try:
        os.posix_fallocate(segment._fd, 0, size)  # the segment's descriptor: SharedMemory keeps it, as _fd
    except OSError as exc:
        if exc.errno in (errno.EOPNOTSUPP, errno.ENOSYS):  # a file system that cannot reserve: as without the call
            return segment
        _release(segment)
        raise HostProcessError(f"no room for a {size / 2**20:.1f} MiB segment in shared memory ({exc.strerror}); give "
                               "the machine or container more shared memory (docker: --shm-size), or use fewer "
                               "--host-processes workers or a smaller batch") from exc
    except AttributeError:  # no posix_fallocate (macOS): the pages are found when written
        pass
    return segment


def _release(segment: shared_memory.SharedMemory) -> bool:
    """Unlink and unmap a segment; False when a tensor still maps it (then only its name is gone)."""
    try:
        segment.unlink()
    except FileNotFoundError:
        pass
    try:
        segment.close()
    except BufferError:
        return False
    return True


def _address(segment: shared_memory.SharedMemory) -> int:
    return torch.frombuffer(segment.buf, dtype=torch.uint8, count=1).data_ptr()


def _on_own_thread(call) -> int | str:
    """`call()` (a CUDA runtime call's error code) on a thread of its own: CUDA keeps a failed call's error per
    thread, and torch reads it after the next kernel it launches on that thread, where it would fail an unrelated
    batch. An exception comes back as its text."""
    result: list[int | str] = []

    def run() -> None:
        try:
            result.append(call())
        except Exception as exc:  # no CUDA runtime to call: the caller records why
            result.append(f"{type(exc).__name__}: {exc}")

    thread = threading.Thread(target=run, name="va-cuda-register")
    thread.start()
    thread.join()
    return result[0]


def _view(segment: shared_memory.SharedMemory, offset: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A tensor of `shape` and `dtype` in `segment` at byte `offset` (its memory, not a copy)."""
    count = math.prod(shape)
    if not count:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(segment.buf, dtype=dtype, count=count, offset=offset).view(shape)


def _describe_exit(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _to_arrays(cands: BatchCandidates) -> dict:
    arrays = {name: getattr(cands, name).numpy() for name in CANDIDATE_FIELDS if getattr(cands, name) is not None}
    return {**arrays, "counts": list(cands.counts)}


def _from_arrays(arrays: dict) -> BatchCandidates:
    tensors = {name: torch.from_numpy(arrays[name]) if name in arrays else None for name in CANDIDATE_FIELDS}
    return BatchCandidates(counts=arrays["counts"], **tensors)


# --- in the host processes ---

# the segments a host process keeps mapped (one for each thread that calls it; the least recently used beyond them
# closed): mapping one again costs the child a page fault per page touched
ATTACHED_SEGMENTS = 64
_attached: OrderedDict[str, shared_memory.SharedMemory] = OrderedDict()  # by owner (the name's first two parts)
_decoders: OrderedDict[bytes, object] = OrderedDict()  # host decoders by their pickle: their caches live on


def _serve(connection: Connection, nice: int, parent: int) -> None:
    """A host process: set up, say it is ready, then run each (function, arguments) that comes down the pipe and send
    back ("ok", result, "") or ("error", exception, its traceback), until the run closes its end."""
    _init_process(nice, parent)
    connection.send(os.getpid())
    while True:
        try:
            request = connection.recv_bytes()
        except EOFError:  # the run closed it: done
            return
        try:  # unpickled here, so that what cannot be (a class this process cannot import) is the caller's error
            fn, args = pickle.loads(request)
            reply = ("ok", fn(*args), "")
        except Exception as exc:
            reply = ("error", exc, traceback.format_exc())
        try:
            connection.send(reply)
        except (pickle.PicklingError, TypeError, AttributeError):  # an error that does not cross: its text does
            connection.send(("error", RuntimeError(f"{type(reply[1]).__name__}: {reply[1]}"), reply[2]))


def _init_process(nice: int, parent: int) -> None:
    _end_with(parent)
    # a terminal's Ctrl-C and hang-up reach its whole process group: the parent stops the run, then closes this
    # process (SIGTERM, with which the run ends a process that can no longer serve, still ends it)
    for number in (n for n in STOP_SIGNALS if n != signal.SIGTERM):
        signal.signal(number, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):  # blocked by the run while this process started
        signal.pthread_sigmask(signal.SIG_SETMASK, set())
    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    if nice and sys.platform.startswith("linux"):
        try:
            os.nice(nice)
        except OSError:  # a sandbox may forbid it; the processes still work, only less politely
            pass


@contextmanager
def stop_signals_blocked() -> Iterator[None]:
    """A terminal's Ctrl-C and hang-up held back from the calling thread while in the block (POSIX): a process started
    here inherits the mask, so one that arrives before it ignores them is not delivered in the middle of its
    imports (it unblocks them once it ignores them). A signal held back from this thread is delivered once the
    block ends, or to another thread meanwhile: the run's own stop is only delayed."""
    quiet = {n for n in STOP_SIGNALS if n != signal.SIGTERM}
    if not hasattr(signal, "pthread_sigmask"):  # Windows: no masks; spawned processes are not in the group there
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, quiet)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _end_with(parent: int) -> None:
    """Linux: this process gets SIGTERM when its parent ends, even killed (SIGKILL, the OOM killer), which closes
    nothing: the processes would otherwise wait for work forever. (Strictly, when the thread that started
    it ends: the harness starts them from its main thread or its stream workers, which live as long as the command.)
    prctl through ctypes: one system call, for which a package (python-prctl) would be a dependency of its own."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        except (OSError, AttributeError):  # no prctl: the parent's own exit still closes the pool
            pass
    if os.getppid() != parent:  # it ended before the line above took effect
        os._exit(0)


def _memory_peaks(reset: bool) -> float | None:
    return process_peaks(Device("cpu"), reset)["peak_ram_mb"]


def _prepare(paths: list[str], spec: PreprocessSpec, segment: str, offset: int, shape: tuple[int, ...]) -> tuple:
    clock = time.perf_counter_ns()
    images = [decode_bytes(Path(p).read_bytes(), Path(p)) for p in paths]
    decoded = time.perf_counter_ns()
    _, transforms = letterbox_canvas(images, spec, out=_view(_attach(segment), offset, shape, torch.uint8))
    return transforms, decoded - clock, time.perf_counter_ns() - decoded


def _attach(name: str) -> shared_memory.SharedMemory:
    """The run's segment `name`, mapped once and kept while its thread uses it (its threads reuse theirs batch after
    batch); a thread's newer segment replaces its older one here too, which is unmapped."""
    owner = name.rsplit("-", 2)[0]
    segment = _attached.pop(owner, None)
    if segment is not None and segment.name.lstrip("/") != name:
        _close(segment)
        segment = None
    _attached[owner] = segment or shared_memory.SharedMemory(name=name)  # the most recently used last
    while len(_attached) > ATTACHED_SEGMENTS:
        _close(_attached.popitem(last=False)[1])
    return _attached[owner]


def _close(segment: shared_memory.SharedMemory) -> None:
    try:
        segment.close()
    except BufferError:  # still mapped by a tensor: unmapped with it
        pass


def _decoder(pickled: bytes):
    """The host decoder of this pickle, unpickled once: the grids and tables it makes are kept between batches."""
    decoder = _decoders.pop(pickled, None) or pickle.loads(pickled)
    _decoders[pickled] = decoder
    while len(_decoders) > ATTACHED_SEGMENTS:
        _decoders.popitem(last=False)
    return decoder


def _select(arrays: dict, spec: PostprocessSpec, iou: float, max_det: int, transforms: list[ImageTransform],
            whole_batch: bool, keep: bool) -> tuple:
    clock = time.perf_counter_ns()
    kept = select(_from_arrays(arrays), spec, iou, max_det, transforms, whole_batch=whole_batch)
    selected = time.perf_counter_ns()
    boxes = to_original(kept, transforms)
    detections = batch_arrays(kept, boxes)  # split by image in the run (see BatchArrays)
    boxes_ns = time.perf_counter_ns() - selected
    if keep:
        return detections, _to_arrays(kept), boxes.numpy(), selected - clock, boxes_ns
    return detections, None, None, selected - clock, boxes_ns


def _finish(decoder: bytes, segment: str, layout: list[tuple[int, tuple[int, ...], torch.dtype]],
            input_size: tuple[int, int], spec: PostprocessSpec, conf: float, iou: float, max_det: int,
            transforms: list[ImageTransform], whole_batch: bool, image_ids: list[int],
            check: tuple[bool, bool] | None) -> tuple:
    clock = time.perf_counter_ns()
    shared = _attach(segment)
    raw = [_view(shared, offset, shape, dtype) for offset, shape, dtype in layout]
    check_finite(raw, image_ids)
    decoded = _decoder(decoder)(raw, input_size, conf)
    if check is not None:
        check_decoded(decoded, len(image_ids), input_size, *check)
    cands = gather_candidates(decoded, spec, conf, max_det)
    decoded_at = time.perf_counter_ns()
    kept = select(cands, spec, iou, max_det, transforms, whole_batch=whole_batch)
    selected_at = time.perf_counter_ns()
    detections = batch_arrays(kept, to_original(kept, transforms))  # split by image in the run (see BatchArrays)
    return detections, decoded_at - clock, selected_at - decoded_at, time.perf_counter_ns() - selected_at
