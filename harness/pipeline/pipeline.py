"""DetectorPipeline: one batch through decode -> letterbox -> collate -> forward -> decode -> NMS -> rescale.

Two ways to run batches:
- `run_batch` (latency mode): the stages of one batch run one after another, so each stage's time is
  its own and the stages add up to the batch time. The forward runs on the calling thread with the
  core's thread team; the harness's own host stages are handed, synchronously, to a host thread whose
  torch ops run on one thread (see `_host_thread`).
- `run_overlapped` (overlapped mode, for throughput): N host workers prepare the next batches (at most
  N ahead) and post-process batch k-1 while the core runs batch k, as a deployed pipeline would. Stage
  times overlap; each batch's total is its end-to-end latency through the pipeline (queueing
  included), and throughput is images over the wall time of the whole stream.
"""

from __future__ import annotations

import functools
import itertools
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch

from harness.data.coco import ImageRecord
from harness.detector.protocol import RANDOM_WEIGHTS, Core, Detector, PreprocessSpec, postprocess_spec, task_of
from harness.measure.device import Device
from harness.pipeline.checks import check_decoded, check_finite
from harness.pipeline.gpu import ForwardEvents, choose_decoder, decode_on_device, preprocess_record, upload_uint8
from harness.pipeline.host_processes import HostProcesses, shared_host_processes
from harness.pipeline.masks import batch_masks
from harness.pipeline.postprocess import ImageDetections, gather_candidates, select, split_by_image, to_original
from harness.pipeline.preprocess import (
    ImageTransform,
    canvas_to_batch,
    decode_bytes,
    decode_tensor,
    letterbox_canvas,
    preprocess_tensors,
    whole_batch_letterbox,
)
from harness.pipeline.scratch import scratch_bytes
from harness.pipeline.stage_timer import BatchTiming, ForwardThreadTime, StageTimer
from harness.process_exit import before_leave


@functools.cache  # asked each batch (the finishing's route): the finders are searched once per module
def importable_by_name(module: str) -> bool:
    """Whether a spawned process finds `module` by its name (its import finders, not this process's sys.modules):
    the harness's own modules and installed packages are; a plugin file loaded from its path is not."""
    top = module.partition(".")[0]
    for finder in sys.meta_path:
        find = getattr(finder, "find_spec", None)
        try:
            if find is not None and find(top, None) is not None:
                return True
        except (ImportError, ValueError, AttributeError):  # a finder that cannot answer for this name
            continue
    return False


@dataclass(frozen=True)
class Thresholds:
    """The post-processing thresholds a run applies: score, NMS IoU, detections kept per image."""

    conf: float
    iou: float
    max_det: int


# How much lower the overlapped-mode host workers' priority is than the forward's (a nice increment).
# When host work and the forward want the same cores, the scheduler then runs host work in the forward's
# gaps instead of preempting one of its threads mid-operator, which stalls the whole operator at its
# barrier. Measured (2 cores, ONNX Runtime, batch 8, alternating rounds): overhead ratio +0.01 to +0.025.
STREAM_WORKER_NICE = 8

# The preprocessing implementations that letterbox on the host, into a uint8 canvas (the ones host processes run)
HOST_LIBRARIES = ("cv2", "pil")

# Most host workers `--workers auto` gives overlapped mode on CUDA (one core stays with the forward's thread).
MAX_AUTO_WORKERS = 8


def stream_worker_priority() -> dict:
    """How the overlapped-mode workers are scheduled, for the environment record."""
    return {"torch_intra_op": 1, "opencv_threads": 1,
            "nice_increment": STREAM_WORKER_NICE if sys.platform.startswith("linux") else 0}


def resolve_workers(workers: str | int, cuda: bool, host_processes: int = 0) -> int:
    """`--workers N|auto` -> the number of overlapped-mode host workers. auto: with host processes, one worker a
    process (each worker hands its batch to a process and waits); else 1 on a CPU-only run (a second
    worker only takes cores from the forward there: README, Benchmarks of the harness itself), else
    min(usable cores - 1, MAX_AUTO_WORKERS), at least 1: on a GPU the host decodes while the device computes."""
    if str(workers) != "auto":
        return int(workers)
    if host_processes:
        return host_processes
    if not cuda:
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(cores - 1, MAX_AUTO_WORKERS))


def _lower_own_priority() -> None:
    # Linux only: there PRIO_PROCESS with a thread id renices just that thread (and the threads it
    # starts); elsewhere it would renice the whole process, forward included.
    if not sys.platform.startswith("linux"):
        return
    tid = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, os.getpriority(os.PRIO_PROCESS, tid) + STREAM_WORKER_NICE))
    except OSError:  # a sandbox may forbid it; the mode still works, only less well
        pass


def _init_host_thread(lower_priority: bool) -> None:
    # Host ops on one thread. Run through a torch (OpenMP) team, even a tiny op waits at a barrier for a
    # partner thread: on a loaded 2-core box `boxes.max(dim=1)` on a 7x4 tensor took 7-15 ms with 2 threads,
    # 0.003 ms with 1. A worker with a team of its own also (1) spins at every barrier for a
    # partner that the forward's threads keep off the cores (ONNX Runtime, batch 8: worker CPU per batch
    # 23 -> 13 ms) and (2) once that second team exists, slows the PyTorch forward on the calling thread
    # ~28 % for the rest of the process (YOLOX-Nano b8: 50 -> 36 img/s).
    torch.get_num_threads()  # a thread takes torch's process default at its first use: let that happen first
    torch.set_num_threads(1)
    # OpenCV's resize and colour conversion likewise: its pthreads pool spins (sched_yield) after every parallel
    # call and took the cores from the forward that followed (OpenVINO b1, time-sliced against benchmark_app in 4
    # rounds: 1.04-1.12 of it with the pool, 1.02-1.04 without; the forward's thread preempted ~5000 times/s ->
    # ~190). Its thread count is process-wide: one for the whole harness, whose host work runs on threads of
    # its own (the overlapped workers give its parallelism).
    cv2.setNumThreads(1)
    if lower_priority:
        _lower_own_priority()


def _single_threaded_pool(workers: int, prefix: str, lower_priority: bool) -> ThreadPoolExecutor:
    """`workers` threads, all started now, each running torch ops on one thread (see _init_host_thread);
    the caller's torch thread count, and the default of threads started later, stay as they were."""
    threads = torch.get_num_threads()  # the caller's own count is settled before the workers change the default
    pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=prefix, initializer=_init_host_thread,
                              initargs=(lower_priority,))
    started = threading.Barrier(workers)  # every task waits for the others: each runs on a thread of its own
    for done in [pool.submit(started.wait) for _ in range(workers)]:
        done.result()
    torch.set_num_threads(threads)  # set_num_threads also changed the default for threads started later: restore it
    # its threads are not daemons: closed when the command leaves, or the process would take the slow exit
    before_leave(lambda: pool.shutdown(wait=True, cancel_futures=True))
    return pool


def _settle(futures: list[Future]) -> None:
    """Cancel the futures not started yet and wait for the running ones, their errors ignored (a stream that stopped
    early raised its own already)."""
    for future in futures:
        future.cancel()
    for future in futures:
        if not future.cancelled():
            try:
                future.result()
            except Exception:  # see above
                pass


@cache
def _host_pool(workers: int) -> ThreadPoolExecutor:
    """One pool per process for per-image host work (NMS); its threads idle between batches."""
    return _single_threaded_pool(workers, "va-host", lower_priority=False)


@cache
def _host_thread() -> ThreadPoolExecutor:
    """The thread that runs latency mode's host stages (decode, letterbox, collate, head decode, NMS, boxes),
    handed each stage synchronously, so stage times keep their meaning. Its torch ops run on one thread
    instead of the forward's intra-op team (see _init_host_thread); the forward keeps the caller's team.
    Not reniced: in latency mode it is on the critical path."""
    return _single_threaded_pool(1, "va-host-ops", lower_priority=False)


@cache
def _stream_workers(workers: int) -> ThreadPoolExecutor:
    """The host workers of `run_overlapped` (one pool per count, per process), running torch ops
    single-threaded and at a lower priority than the forward (see STREAM_WORKER_NICE)."""
    return _single_threaded_pool(workers, "va-stream", lower_priority=True)


class DetectorPipeline:
    """The harness side of a detector: everything but the core forward is shared code.

    In latency mode the host stages run on the host thread (`host_thread`, default on; the profiler pass
    turns it off, because torch.profiler records only the thread that started it) and per-image NMS on
    `host_workers` threads (default: torch's thread count), inside the postprocess stage, so stage times
    still add up to the batch time. Overlapped mode runs `stream_workers` host workers. `read_image` gives an
    image's encoded bytes to the decode substep (a run's ImageBytes: memory or disk, harness/data/cache.py);
    without it the substep reads the file itself.

    `spec.library` is the preprocessing implementation (preprocess.resolve_implementation): with "torch" the
    images are decoded by cv2 on the host (nvJPEG on CUDA) and letterboxed on the core's device (on a GPU, the whole
    batch at once: `whole_batch`).

    A segment detector's detections carry masks (COCO RLE at the source size; the "masks" substep of
    post-processing) unless `masks` is False (`--no-masks`). With `generated` (--input synthetic) each record's
    image comes from it, already decoded: there is no decode substep."""

    def __init__(self, detector: Detector, core: Core, device: Device, spec: PreprocessSpec,
                 thresholds: Thresholds, host_workers: int | None = None,
                 read_image: Callable[[ImageRecord], bytes | bytearray] | None = None, stream_workers: int = 1,
                 host_thread: bool = True, masks: bool = True,
                 generated: Callable[[ImageRecord], np.ndarray] | None = None, nms_on: str = "device",
                 finishes_in_flight: int = 1, whole_batch: bool | None = None, host_processes: int = 0):
        if stream_workers < 1 or finishes_in_flight < 1:
            raise ValueError(f"stream_workers and finishes_in_flight must be >= 1, not {stream_workers}, "
                             f"{finishes_in_flight}")
        self.masks = masks and task_of(detector) == "segment"
        self.generated = generated  # --input synthetic: a record's image, generated (BGR uint8): nothing to decode
        self.nms_threads = host_workers or torch.get_num_threads()
        self.host_executor = _host_pool(self.nms_threads) if self.nms_threads > 1 else None
        self.host_thread = _host_thread() if host_thread else None
        self.stream_workers = stream_workers
        self.max_ahead = 0  # the last overlapped stream's most batches prepared (or preparing) ahead of the forward
        self.in_flight = 1  # forwards the last overlapped stream kept in flight
        self._worker_streams = threading.local()  # on CUDA: each overlapped worker's stream
        # with host processes a batch's finishing is mostly a wait for its process: as many finish at once as there
        # are workers, or the processes would finish one batch at a time
        self.finishes_in_flight = max(finishes_in_flight, stream_workers) if host_processes else finishes_in_flight
        self.forward_thread = ForwardThreadTime()  # where the forward's thread spent overlapped streams
        self.detector = detector
        self.core = core
        self.device = device
        self.spec = spec
        self.thresholds = thresholds
        self.read_image = read_image
        self.postprocess = postprocess_spec(detector)  # the kind; thresholds come from `thresholds`
        self._decoded_checked = False  # the decoder's output checked against the contract (its first batch)
        # ONNX Runtime takes host memory (it copies to its device itself); torch and TensorRT engine cores
        # take device tensors (Core.takes_device_tensors; plugin cores: those with a torch module)
        takes_device = getattr(core, "takes_device_tensors", getattr(core, "torch_module", None) is not None)
        self.input_device = device.torch_device if takes_device else None
        # CUDA events on torch's stream time only cores that run there (torch, TensorRT engines); ONNX Runtime
        # launches on a stream of its own, which the events would not bracket: no forward_gpu for it
        # nor a core whose forward runs in another process (--forward-process)
        self.forward_gpu_timed = takes_device and device.is_cuda and not getattr(core, "forward_elsewhere", False)
        # nvJPEG only where the tensors stay on the GPU; an ONNX Runtime core takes host memory
        on_gpu = self.input_device is not None and self.input_device.type == "cuda"
        self.decoder = choose_decoder(spec.library, on_gpu)
        if nms_on not in ("device", "host"):
            raise ValueError(f"nms_on must be device or host, not {nms_on!r}")
        # "host": a GPU run's candidates come to the host in one copy and the selection and boxes run there, on
        # the NMS pool, one image at a time, instead of the whole batch's NMS on the device; on a CPU both are the same
        self.selection_on_host = nms_on == "host" and device.is_cuda
        # the torch letterbox and the NMS of a whole batch in a fixed number of tensor operations (None: where the
        # tensors are on a GPU, whose per-image calls each take the interpreter lock that the forward's launches need;
        # on a CPU one image at a time is the faster, and the lighter on memory)
        self.whole_batch = whole_batch
        # the host's decode + letterbox (cv2, PIL) and the selection of host candidates in processes of their own,
        # outside this process's interpreter lock (host_processes.py)
        if host_processes and (spec.library not in HOST_LIBRARIES or generated is not None):
            raise ValueError("host processes read and letterbox the dataset's files on the host (cv2 or pil), not "
                             f"{'generated images' if generated is not None else spec.library}")
        self.host_processes: HostProcesses | None = (shared_host_processes(host_processes, STREAM_WORKER_NICE)
                                                     if host_processes else None)

    def copy_with(self, core: Core | None = None, **changes: Any) -> DetectorPipeline:
        """A pipeline with this one's settings (masks, NMS placement, image source, workers), on `core` (this one's
        by default) with `changes` to the constructor's keyword arguments: an extra pass does the row's own work."""
        settings = {"host_workers": self.nms_threads, "read_image": self.read_image,
                    "stream_workers": self.stream_workers, "host_thread": self.host_thread is not None,
                    "masks": self.masks, "generated": self.generated,
                    "nms_on": "host" if self.selection_on_host else "device",
                    "finishes_in_flight": self.finishes_in_flight, "whole_batch": self.whole_batch,
                    "host_processes": self.host_processes.processes if self.host_processes is not None else 0}
        return DetectorPipeline(self.detector, core if core is not None else self.core, self.device, self.spec,
                                self.thresholds, **{**settings, **changes})

    def preprocess_info(self) -> dict:
        """Which preprocessing implementation, decoder and device this pipeline uses (for the record)."""
        record = preprocess_record(self.spec, self.decoder, self.input_device, self.letterbox_whole_batch)
        if self.generated is not None:
            record.update(decode="skipped", decode_detail="generated images (--input synthetic): nothing to decode")
        if self.host_processes is not None:
            n = self.host_processes.processes
            record.update(host_processes=n, decode_detail=f"{record['decode_detail']}, in {n} host processes, each "
                          "reading the image files itself (from the page cache once read)")
            if "upload" in record:
                record["upload"] = ("the uint8 canvas from the host processes' shared memory (page-locked or not: "
                                    "runtime.host.host_processes.shared_segments), non_blocking; float and normalised "
                                    "on the device")
        return record

    def host_info(self, overlap: bool) -> dict:
        """Where the harness's host work runs in the given mode (runtime.host in the record)."""
        if overlap:
            processes = {} if self.host_processes is None else {"host_processes": {
                "processes": self.host_processes.processes, "start": "spawn", "nice_increment": STREAM_WORKER_NICE,
                "shared_segments": self.host_processes.page_locking or "pageable (no copies to or from a GPU)",
                "runs": "each batch's file reads, decode and letterbox" + self._finishing_in_processes()}}
            if getattr(self.core, "forward_elsewhere", False):
                processes["forward"] = (f"in a process of its own (spawned), {self.async_slots} forwards in flight "
                                        "through slots the batch's size; the forward stage is that process's own time")
            return {"mode": "overlapped", "workers": self.stream_workers, **stream_worker_priority(), **processes,
                    "selection_on": self.selection_on,
                    "queue": f"at most {self.stream_workers} batches prepared ahead of the forward",
                    "max_batches_ahead": self.max_ahead, "forwards_in_flight": self.in_flight,
                    "forwards_concurrent": min(self.in_flight, getattr(self.core, "concurrent_forwards",
                                                                       self.in_flight)),
                    "finishes_in_flight": self.finishes_in_flight, "forward_thread": self.forward_thread.record(),
                    "nms": self.nms_calls}
        elsewhere = {"forward": "in a process of its own (spawned), one forward at a time; the forward stage is that "
                                "process's own time, the hand-over transfer"} \
            if getattr(self.core, "forward_elsewhere", False) else {}
        return {"mode": "latency", **elsewhere, "host_thread": self.host_thread is not None,
                "torch_intra_op": 1 if self.host_thread is not None else torch.get_num_threads(),
                "opencv_threads": cv2.getNumThreads(),
                "nms_threads": self.nms_threads, "selection_on": self.selection_on, "nms": self.nms_calls}

    def _finishing_in_processes(self) -> str:
        if self.decode_runs_in_host_processes:
            return (", and from the raw outputs (copied to shared memory) the finiteness check, the head decode, the "
                    "selection, boxes and split by image")
        if self.selection_runs_on_host:
            return ", and the selection, boxes and split by image of host candidates"
        return ""

    def _whole_batch_on(self, device: torch.device | None) -> bool:
        """Whether work on `device` (None: the host, for a host core's outputs or --nms-on host) goes whole-batch: as
        asked, or by default where a CUDA run keeps the tensors on the core's device."""
        if self.whole_batch is not None:
            return self.whole_batch
        return self.device.is_cuda and device is not None

    @property
    def letterbox_whole_batch(self) -> bool:
        """Whether the torch letterbox resizes the whole batch at once (preprocess.letterbox_whole_batch)."""
        return self.spec.library == "torch" and whole_batch_letterbox(self.spec) and \
            self._whole_batch_on(self.input_device)

    @property
    def nms_whole_batch(self) -> bool:
        """Whether the class-aware NMS runs for the whole batch at once (batch_nms), not one call per image: where
        the candidates are (the core's device, or the host with a host core or --nms-on host)."""
        return self.postprocess.kind == "nms" and self._whole_batch_on(
            None if self.selection_on_host else self.input_device)

    @property
    def nms_calls(self) -> str:
        """How the selection runs, for the record."""
        if self.postprocess.kind != "nms":
            return f"none: the family's selection is {self.postprocess.kind}"
        if self.nms_whole_batch:
            return ("the whole batch at once: the suppression matrix to its fixed point (torchvision's rule), its "
                    "temporaries within 1 % of the device's memory")
        return "torchvision.ops.nms, one call per image"

    @property
    def selection_runs_on_host(self) -> bool:
        """Whether the candidates are on the host when selected: a host core's outputs, a CPU run, --nms-on host."""
        return self.selection_on_host or self.input_device is None or self.input_device.type == "cpu"

    @property
    def decode_runs_in_host_processes(self) -> bool:
        """Whether the family's head decode runs in the host processes, on the raw outputs copied to shared memory:
        with host processes, where the selection runs on the host anyway, for a detection family of the harness's
        own that gives a host_decoder (a plugin file is not importable there; a segment model's outputs hold its
        mask maps, which stay with the run, masks or not)."""
        decoder = getattr(self.detector, "host_decoder", None)
        return (self.host_processes is not None and self.selection_runs_on_host
                and task_of(self.detector) == "detect" and decoder is not None
                # where its code lives: a class's module for an instance, a function's own for a (bound) function
                and importable_by_name(getattr(decoder, "__module__", None) or type(decoder).__module__))

    @property
    def selection_on(self) -> str:
        """Where the selection (NMS or top-k) and the boxes run: the core's device, or the host after one copy."""
        if self.selection_on_host:
            copied = "raw outputs" if self.decode_runs_in_host_processes else "candidates"
            return f"host (one copy of the {copied})"
        return str(self.device.torch_device)

    @property
    def async_slots(self) -> int:
        """Forwards the core keeps in flight in overlapped mode (1: one at a time)."""
        return getattr(self.core, "async_slots", 1) if hasattr(self.core, "start") else 1

    def _read(self, record: ImageRecord) -> bytes | bytearray:
        return self.read_image(record) if self.read_image else Path(record.path).read_bytes()

    def _on_host(self, fn: Callable, *args):
        """`fn(*args)` on the host thread (latency mode), waiting for it; on this thread without one."""
        return fn(*args) if self.host_thread is None else self.host_thread.submit(fn, *args).result()

    def run_batch(self, records: list[ImageRecord], timer: StageTimer,
                  images: list[np.ndarray] | None = None) -> list[ImageDetections]:
        """Run one batch; `images` (already decoded) skips the decode substep. The stages are timed on
        this thread, so a stage's time includes handing it to the host thread (microseconds)."""
        timer.begin_batch(len(records))
        with timer.stage("preprocess"):
            batch, transforms = self._on_host(self._collate, records, timer, images)
        raw = self._forward(batch, timer)
        with timer.stage("postprocess"):
            detections = self._on_host(self._finish, records, raw, transforms, timer, self.host_executor)
        timer.end_batch()
        return detections

    def inputs(self, records: list[ImageRecord]) -> torch.Tensor:
        """The model input of these images, preprocessed exactly as a timed batch is (untimed: int8 calibration)."""
        timer = StageTimer(self.device)
        timer.begin_batch(len(records))
        batch, _ = self._collate(records, timer, None)
        return batch

    def run_stream(self, batches: Sequence[list[ImageRecord]], timer: StageTimer, overlap: bool = False,
                   goes_on: Callable[[int], bool] | None = None) -> Iterator[list[ImageDetections]]:
        """Run batches in latency mode (`run_batch`) or overlapped (`run_overlapped`); either way
        each batch's timing lands in `timer.batches` and its detections are yielded in order. `goes_on(k)`, asked
        before batch k starts (is prepared, overlapped), ends the stream at the first k it refuses: for `batches`
        longer than will be run (the variant's, cycled), a stream timed until a deadline."""
        if not overlap:
            for k, records in enumerate(batches):
                if goes_on is not None and not goes_on(k):
                    return
                yield self.run_batch(records, timer)
            return
        for detections, timing in self.run_overlapped(batches, goes_on=goes_on):
            timer.batches.append(timing)
            yield detections

    def run_overlapped(self, batches: Sequence[list[ImageRecord]],
                       images: Sequence[list[np.ndarray]] | None = None,
                       goes_on: Callable[[int], bool] | None = None,
                       ) -> Iterator[tuple[list[ImageDetections], BatchTiming]]:
        """Overlapped mode (see the module docstring): yields each batch's detections and timing, in order.

        `stream_workers` workers prepare batches (decode + letterbox + collate) in parallel, at most that
        many ahead of the forward; finishing (decode, NMS, boxes) runs on the same workers, at most
        `finishes_in_flight` batches at once, handed out in order. With one worker it is one thread doing
        finish(k-1) then prepare(k+1) while the forward runs batch k. Where the forward's thread spent the
        stream is added to `forward_thread` (see reset_forward_thread). `goes_on`: see run_stream."""
        workers = _stream_workers(self.stream_workers)
        limit = len(batches)  # the batches the stream runs: fewer once `goes_on` refuses one

        def admitted(k: int) -> bool:
            nonlocal limit
            if k < limit and goes_on is not None and not goes_on(k):
                limit = k
            return k < limit

        taken = 0  # batches the forward has taken from the queue
        count_lock = threading.Lock()
        self.max_ahead = 0
        account = self.forward_thread
        clock = time.perf_counter_ns
        started = clock()

        def prepare(k: int) -> tuple[StageTimer, torch.Tensor, list[ImageTransform]]:
            with count_lock:  # batches k+1-taken .. k are prepared or preparing ahead of the forward
                self.max_ahead = max(self.max_ahead, k + 1 - taken)
            timer = StageTimer(self.device, stage_sync=False, batch_sync=False)
            timer.begin_batch(len(batches[k]))
            stream = self._worker_stream()
            with timer.stage("preprocess"):
                with torch.cuda.stream(stream) if stream is not None else nullcontext():
                    batch, transforms = self._collate(batches[k], timer, images[k] if images is not None else None)
                if stream is not None:  # the stage ends when its GPU work is done: the forward reads a whole batch
                    stream.synchronize()
            return timer, batch, transforms

        def finish(k: int, timer: StageTimer, raw: list[torch.Tensor], transforms: list[ImageTransform]):
            # raw is complete (the forward stage synchronised its stream); the worker's own stream keeps these
            # kernels out of the queue of the next batch's forward and of another batch finishing at the same time
            stream = self._worker_stream()
            if stream is not None:  # made on the forward's stream: its memory is not reused there while read here
                for tensor in raw:
                    if tensor.is_cuda:
                        tensor.record_stream(stream)
            with torch.cuda.stream(stream) if stream is not None else nullcontext():
                with timer.stage("postprocess"):
                    detections = self._finish(batches[k], raw, transforms, timer, None)
            return detections, timer.end_batch()

        finishing: deque[Future] = deque()

        def make_room(room: int, draining: bool = False) -> Iterator[tuple[list[ImageDetections], BatchTiming]]:
            """Hand the caller finished batches, oldest first, until fewer than `room` are finishing."""
            while len(finishing) >= room:
                waited = clock()
                done = finishing.popleft().result()
                handed = clock()
                if draining:
                    account.draining_ns += handed - waited
                else:
                    account.waiting_for_finishing_ns += handed - waited
                yield done
                account.caller_ns += clock() - handed

        # The bounded queue: batch k's forward starts once prepare(k) is done, and only then is prepare(k + N)
        # submitted, so at most N batches are ever prepared (or being prepared) ahead of the forward.
        # A runtime with streams of its own keeps `slots` forwards in flight (started here, collected oldest
        # first); each batch's forward stage is that forward's time as the runtime measured it.
        slots = self.in_flight = self.async_slots
        in_flight: deque = deque()
        ahead: deque = deque()
        try:
            for k in range(self.stream_workers):
                if not admitted(k):
                    break
                ahead.append(workers.submit(prepare, k))
            for k in itertools.count():
                if k >= limit + slots - 1:
                    break
                if k < limit:
                    waited = clock()
                    timer, batch, transforms = ahead.popleft().result()
                    if k:
                        account.waiting_for_preparation_ns += clock() - waited
                    else:  # the stream filling: nothing to overlap the first preparation with
                        account.filling_ns += clock() - waited
                    account.batches += 1
                    with count_lock:
                        taken = k + 1
                    if admitted(k + self.stream_workers):
                        ahead.append(workers.submit(prepare, k + self.stream_workers))
                    if self.device.is_cuda and batch.is_cuda:  # made on a worker's stream, read on this one
                        batch.record_stream(torch.cuda.current_stream(self.device.torch_device))
                    forward_start = clock()
                    if slots == 1:
                        raw = self._forward(batch, timer, sync=True)  # the workers read raw only once it is ready
                        account.forward_ns += clock() - forward_start
                        yield from make_room(self.finishes_in_flight)
                        finishing.append(workers.submit(finish, k, timer, raw, transforms))
                        continue
                    in_flight.append((k, timer, transforms, self.core.start(batch)))
                    account.forward_ns += clock() - forward_start
                if in_flight and (len(in_flight) == slots or k >= limit):
                    done, timer, transforms, ticket = in_flight.popleft()
                    collect_start = clock()
                    raw, forward_ns = self.core.collect(ticket)
                    account.forward_ns += clock() - collect_start
                    timer.add_stage("forward", forward_ns)
                    yield from make_room(self.finishes_in_flight)
                    finishing.append(workers.submit(finish, done, timer, raw, transforms))
            yield from make_room(1, draining=True)
        finally:  # stopped early or failed: no started forward, and no finishing, is left running for nobody
            account.wall_ns += clock() - started
            for *_, ticket in in_flight:
                try:
                    self.core.collect(ticket)
                except Exception:  # its own failure was raised already, or does not matter now
                    pass
            # preparations queued ahead too: left running, they would decode and allocate while the next cell starts
            _settle([*ahead, *finishing])

    def reset_forward_thread(self) -> None:
        """Start a new account of where the forward's thread spends overlapped streams: the streams run from now
        on add to it (a run's timed pass and the batches --target-ci adds to it, not its warm-up)."""
        self.forward_thread = ForwardThreadTime()

    def _worker_stream(self):
        """On CUDA, the calling overlapped worker's own stream, else None. Its preprocessing and finishing run
        there, not on the forward's stream, where their kernels would queue behind (and be timed inside) the
        running forward. One stream per worker thread, made once: the allocator reuses blocks per stream, and
        torch hands streams out round-robin from a pool of 32 (a new one per batch would come back as another's)."""
        if not self.device.is_cuda:
            return None
        stream = getattr(self._worker_streams, "stream", None)
        if stream is None:
            stream = self._worker_streams.stream = torch.cuda.Stream(device=self.device.torch_device)
        return stream

    def _collate(self, records: list[ImageRecord], timer: StageTimer,
                 images: list[np.ndarray] | None) -> tuple[torch.Tensor, list[ImageTransform]]:
        """The preprocess stage's work: decode (unless `images` are given), letterbox/resize, collate."""
        if images is None and self.generated is not None:
            images = [self.generated(r) for r in records]
            if self.spec.library == "torch":  # what torchvision's decoder gives: 3 x H x W RGB
                images = [torch.from_numpy(i).permute(2, 0, 1).flip(0) for i in images]
        if self.spec.library != "torch":
            on_gpu = self.input_device is not None and self.input_device.type == "cuda"
            if images is None and self.host_processes is not None:
                prepared = self.host_processes.prepare([r.path for r in records], self.spec,
                                                       gpu=self.input_device if on_gpu else None)
                timer.add_substep("decode", prepared.decode_ns)  # the child's own clocks: the hand-over is not in them
                timer.add_substep("letterbox", prepared.letterbox_ns)
                canvas, transforms = prepared.canvas, prepared.transforms
            else:
                if images is None:
                    with timer.substep("decode"):
                        images = [decode_bytes(self._read(r), r.path) for r in records]
                canvas, transforms = letterbox_canvas(images, self.spec, pinned=on_gpu)
            if on_gpu:  # up as uint8 (a quarter of the float batch's bytes), converted and normalised there
                with timer.substep("upload"):
                    canvas = canvas.to(self.input_device, non_blocking=True)
            return canvas_to_batch(canvas, self.spec), transforms
        target = self.input_device if self.input_device is not None else torch.device("cpu")
        if images is None:
            with timer.substep("decode"):
                datas = [self._read(r) for r in records]
                paths = [r.path for r in records]
                images = (decode_on_device(datas, target, paths, [r.exif_orientation != 1 for r in records])
                          if self.decoder == "nvjpeg"
                          else [decode_tensor(d, p) for d, p in zip(datas, paths, strict=True)])
        if target.type == "cuda" and any(not isinstance(i, torch.Tensor) or i.device != target for i in images):
            with timer.substep("upload"):  # host-decoded images go up as uint8, not float32
                images = upload_uint8([i if isinstance(i, torch.Tensor) else torch.from_numpy(i)
                                       .permute(2, 0, 1).flip(0) for i in images], target)
        whole = self.letterbox_whole_batch
        return preprocess_tensors(images, self.spec, target, whole_batch=whole,
                                  scratch=scratch_bytes(target) if whole else 0)

    def _forward(self, batch: torch.Tensor, timer: StageTimer, sync: bool = False) -> list[torch.Tensor]:
        with timer.stage("transfer"):
            if self.input_device is not None and self.input_device.type != "cpu":
                batch = batch.to(self.input_device, non_blocking=True)
        borrowed = getattr(self.core, "forward_borrowed", None)
        elsewhere = getattr(self.core, "forward_elsewhere", False)
        with timer.stage("forward"):
            events = ForwardEvents.begin(self.device.torch_device) if self.forward_gpu_timed else None
            if borrowed is not None:
                raw, measured_ns = borrowed(batch)
            elif elsewhere:  # the other process's own clock, as in an overlapped stream
                raw, measured_ns = self.core.collect(self.core.start(batch))
            else:
                raw = self.core(batch)
            if events is not None:
                events.stop(self.device.torch_device)
            if sync:  # this stream only: a device-wide sync would also wait for the workers' preprocessing
                self.device.synchronize_stream()
        if borrowed is not None:
            # the forward is the runtime's own time for its call, as its benchmark tool reports it; the binding's
            # hand-over around it is transfer, as is copying out the outputs (its own buffers, reused by its next
            # inference), by numpy: one thread, no torch intra-op team beside the runtime's threads
            timer.narrow_stage("forward", measured_ns, rest_to="transfer")
            with timer.stage("transfer"):
                raw = [torch.from_numpy(np.array(t.numpy())) for t in raw]
        elif elsewhere:  # the batch's copy into its slot and the outputs' out of theirs: the hand-over is transfer
            timer.narrow_stage("forward", measured_ns, rest_to="transfer")
        if events is not None:  # GPU time of the forward beside its wall time; absent otherwise (not 0)
            timer.device_time("forward_gpu", events)
        return raw

    def _finish(self, records: list[ImageRecord], raw: list[torch.Tensor], transforms: list[ImageTransform],
                timer: StageTimer, executor: ThreadPoolExecutor | None) -> list[ImageDetections]:
        """The postprocess stage's work: head decode, the family's selection (NMS or top-k), boxes."""
        t, post = self.thresholds, self.postprocess
        if self.decode_runs_in_host_processes:
            check = None if self._decoded_checked else (post.activation == "sigmoid",
                                                        self.detector.weights.source != RANDOM_WEIGHTS)
            finished = self.host_processes.finish(raw, self.detector.host_decoder, self.spec.input_size, post, t.conf,
                                                  t.iou, t.max_det, transforms, self.nms_whole_batch,
                                                  [r.image_id for r in records], check)
            self._decoded_checked = True
            timer.add_substep("copy", finished.copy_ns)  # the raw outputs into shared memory; the rest, the child's
            timer.add_substep(post.kind, finished.select_ns)
            timer.add_substep("boxes", finished.boxes_ns)
            return finished.detections
        check_finite(raw, [r.image_id for r in records])
        decoded = self.detector.decode(raw, self.spec.input_size, t.conf)
        if not self._decoded_checked:  # the contract, once per pipeline: a plugin's systematic mistake shows here
            check_decoded(decoded, len(records), self.spec.input_size, post.activation == "sigmoid",
                          self.detector.weights.source != RANDOM_WEIGHTS)
            self._decoded_checked = True
        candidates = gather_candidates(decoded, post, t.conf, t.max_det)
        if self.selection_on_host:
            with timer.substep("copy"):
                candidates = candidates.to(torch.device("cpu"))
        whole = self.nms_whole_batch
        if self.host_processes is not None and candidates.boxes.device.type == "cpu":
            selected = self.host_processes.select(candidates, post, t.iou, t.max_det, transforms, whole,
                                                  [r.image_id for r in records], keep=self.masks)
            timer.add_substep(post.kind, selected.select_ns)  # the child's own clocks
            timer.add_substep("boxes", selected.boxes_ns)
            kept, boxes, detections = selected.kept, selected.boxes, selected.detections
        else:
            with timer.substep(post.kind):  # "nms" or "topk"
                kept = select(candidates, post, t.iou, t.max_det, transforms, executor, whole_batch=whole,
                              scratch=scratch_bytes(candidates.boxes.device) if whole else 0)
            with timer.substep("boxes"):
                boxes = to_original(kept, transforms)
                detections = split_by_image(kept, boxes, [r.image_id for r in records])
        if self.masks:
            with timer.substep("masks"):
                if self.selection_on_host:  # the mask head's maps stay on the device: the kept boxes go back
                    kept, boxes = kept.to(self.device.torch_device), boxes.to(self.device.torch_device)
                per_image = batch_masks(self.detector.mask_maps(raw), self.detector.mask_spec, kept, boxes,
                                        transforms, self.spec.input_size)
                for det, rles in zip(detections, per_image, strict=True):
                    det.masks = rles
        return detections
