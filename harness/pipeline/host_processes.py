"""The host stages of a stream in processes of their own (`--host-processes N`).

Every thread of a process shares one interpreter lock. On a GPU an eager forward is a stream of Python calls
that each give the lock up while a kernel is queued and must take it back before the next call; a host stage in a
thread beside it takes the lock in those gaps, and the forward then waits for the stage's next release at every
call, not only while the stage computes (measured on the CPU with a stand-in: harness/bench/lock_convoy.py). In
processes the host stages have locks of their own. They run what needs no device:

- `prepare`: each image's file read and decoded, and letterboxed into a uint8 canvas [B,H,W,3] (cv2 or PIL, the
  host implementations: preprocess.letterbox_canvas). The canvas comes back through shared memory (torch's
  reductions: the child copies it into a shared segment, which the parent maps without a copy); the parent uploads
  and normalises it.
- `select`: the family's selection (NMS per image, or top-k) and the boxes in original pixels, on candidates that
  are on the host (a CPU run, a core whose outputs come back to the host, or --nms-on host). The candidates go
  and the kept ones come back as numpy arrays (their bytes: a batch's are well under a megabyte).

The parent keeps what needs its device or its objects: the upload, the family's head decode, the copy of the
candidates to the host, masks, and splitting the detections by image. Processes are started by torch's `spawn`
context (a process with a CUDA context cannot fork), once per process and count, all at once, when the first
pipeline that asks for them is made (a group's set-up, never a timed pass): each imports torch and cv2 (seconds).
They ignore the stop signals a terminal sends its whole process group (Ctrl-C, a closed terminal): the run decides
how to stop, and closes them.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import cv2
import torch
import torch.multiprocessing

from harness.detector.protocol import PostprocessSpec, PreprocessSpec
from harness.pipeline.postprocess import BatchCandidates, select, to_original
from harness.pipeline.preprocess import ImageTransform, decode_bytes, letterbox_canvas
from harness.process_exit import STOP_SIGNALS, before_leave

PR_SET_PDEATHSIG = 1  # linux/prctl.h

# A BatchCandidates' tensors by name, as they cross between processes (`counts` is a list)
CANDIDATE_FIELDS = ("boxes", "scores", "labels", "image", "rows")


class HostProcessError(RuntimeError):
    """A host process ended while it had work (killed, out of memory): the stream cannot go on."""


@dataclass(frozen=True)
class PreparedCanvas:
    """A batch prepared in a host process: its letterboxed uint8 canvas [B,H,W,3] (BGR, in shared memory), each
    image's transform, and the child's own time for the reads and decodes and for the letterbox (ns)."""

    canvas: torch.Tensor
    transforms: list[ImageTransform]
    decode_ns: int
    letterbox_ns: int


@dataclass(frozen=True)
class Selected:
    """A batch's selection made in a host process: the kept candidates (on the host, grouped by image, best first),
    their boxes in original pixels, and the child's time for the selection and for the boxes (ns)."""

    kept: BatchCandidates
    boxes: torch.Tensor
    select_ns: int
    boxes_ns: int


@dataclass(frozen=True)
class _Pool:
    """An executor and its processes, kept to say how one ended (the executor forgets them once it breaks)."""

    executor: ProcessPoolExecutor
    members: list


class HostProcesses:
    """`processes` host processes (see the module docstring), started now; lower in priority than the parent by
    `nice` (Linux), each running torch and OpenCV on one thread (their parallelism is the processes')."""

    def __init__(self, processes: int, nice: int = 0):
        if processes < 1:
            raise ValueError(f"processes must be >= 1, not {processes}")
        self.processes = processes
        self.nice = nice
        self._lock = threading.Lock()  # workers share the pool: one of them replaces a broken one
        self._pool: _Pool | None = self._start()

    def _start(self) -> _Pool:
        executor = ProcessPoolExecutor(self.processes, mp_context=torch.multiprocessing.get_context("spawn"),
                                       initializer=_init_process, initargs=(self.nice, os.getpid()))
        # every process started and past its imports before the first batch: the pool starts one per task waiting
        done, _ = wait([executor.submit(_ready, 0.05) for _ in range(self.processes)])
        for future in done:
            future.result()
        return _Pool(executor, list((getattr(executor, "_processes", None) or {}).values()))

    def close(self) -> None:
        """Stop the processes (the work they were given is cancelled)."""
        with self._lock:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.executor.shutdown(wait=True, cancel_futures=True)

    def _call(self, fn, *args):
        with self._lock:
            if self._pool is None:  # the last one broke: the next batch (a later cell's) gets working processes
                self._pool = self._start()
            pool = self._pool
        try:
            return pool.executor.submit(fn, *args).result()
        except BrokenProcessPool as exc:
            with self._lock:
                if self._pool is pool:
                    self._pool = None
            pool.executor.shutdown(wait=True, cancel_futures=True)  # broken: its processes end, their codes known
            codes = sorted({p.exitcode for p in pool.members if p.exitcode not in (None, 0)})
            codes = [c for c in codes if c != -signal.SIGTERM] or codes  # SIGTERM: the executor ending the others
            ended = ", ".join(_describe_exit(code) for code in codes) or "its exit status unknown"
            raise HostProcessError(f"a host process ended while preparing or finishing a batch ({ended}); the "
                                   "batch's images and the machine's memory are the first things to check") from exc

    def prepare(self, paths: list[Path], spec: PreprocessSpec) -> PreparedCanvas:
        """Read, decode and letterbox these images in a host process (`spec.library` cv2 or pil)."""
        return self._call(_prepare, [str(p) for p in paths], spec)

    def select(self, cands: BatchCandidates, spec: PostprocessSpec, iou: float, max_det: int,
               transforms: list[ImageTransform], whole_batch: bool) -> Selected:
        """postprocess.select and to_original on host candidates, in a host process."""
        kept, boxes, select_ns, boxes_ns = self._call(_select, _to_arrays(cands), spec, iou, max_det, transforms,
                                                      whole_batch)
        return Selected(_from_arrays(kept), torch.from_numpy(boxes), select_ns, boxes_ns)


@cache
def shared_host_processes(processes: int, nice: int = 0) -> HostProcesses:
    """One set of host processes per count for the whole process (closed when the command leaves)."""
    pool = HostProcesses(processes, nice)
    before_leave(pool.close)
    return pool


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

def _init_process(nice: int, parent: int) -> None:
    _end_with(parent)
    # a terminal's Ctrl-C and hang-up reach its whole process group: the parent stops the run, then closes this
    # process (SIGTERM, which the executor uses to end the processes of a broken pool, still ends it)
    for number in (n for n in STOP_SIGNALS if n != signal.SIGTERM):
        signal.signal(number, signal.SIG_IGN)
    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    if nice and sys.platform.startswith("linux"):
        try:
            os.nice(nice)
        except OSError:  # a sandbox may forbid it; the processes still work, only less politely
            pass


def _end_with(parent: int) -> None:
    """Linux: this process gets SIGTERM when its parent ends, even killed (SIGKILL, the OOM killer), which closes
    nothing: an executor's processes would otherwise wait for work forever. (Strictly, when the thread that started
    it ends: the harness starts them from its main thread or its stream workers, which live as long as the command.)
    prctl through ctypes: one system call, for which a package (python-prctl) would be a dependency of its own."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
        except (OSError, AttributeError):  # no prctl: the parent's own exit still closes the pool
            pass
    if os.getppid() != parent:  # it ended before the line above took effect
        os._exit(0)


def _ready(seconds: float) -> int:
    time.sleep(seconds)  # long enough that the pool starts a process for each of these tasks
    return os.getpid()


def _prepare(paths: list[str], spec: PreprocessSpec) -> tuple:
    clock = time.perf_counter_ns()
    images = [decode_bytes(Path(p).read_bytes(), Path(p)) for p in paths]
    decoded = time.perf_counter_ns()
    canvas, transforms = letterbox_canvas(images, spec)
    return PreparedCanvas(canvas, transforms, decoded - clock, time.perf_counter_ns() - decoded)


def _select(arrays: dict, spec: PostprocessSpec, iou: float, max_det: int, transforms: list[ImageTransform],
            whole_batch: bool) -> tuple:
    clock = time.perf_counter_ns()
    kept = select(_from_arrays(arrays), spec, iou, max_det, transforms, whole_batch=whole_batch)
    selected = time.perf_counter_ns()
    boxes = to_original(kept, transforms)
    return _to_arrays(kept), boxes.numpy(), selected - clock, time.perf_counter_ns() - selected
