"""DetectorPipeline: one batch through decode -> letterbox -> collate -> forward -> decode -> NMS -> rescale.

Two ways to run batches:
- `run_batch` (latency mode): the stages of one batch run one after another on the calling thread,
  so each stage's time is its own and the stages add up to the batch time.
- `run_overlapped` (overlapped mode, for throughput): a host worker prepares batch k+1 and
  post-processes batch k-1 while the core runs batch k, as a deployed pipeline would. Stage times
  overlap; each batch's total is its end-to-end latency through the pipeline (queueing included),
  and throughput is images over the wall time of the whole stream.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import torch

from harness.data.coco import ImageRecord
from harness.measure.device import Device
from harness.models.protocol import Core, Detector, PreprocessSpec, postprocess_spec
from harness.pipeline.checks import check_finite
from harness.pipeline.gpu import ForwardEvents, choose_decoder, decode_on_device, preprocess_record, upload_uint8
from harness.pipeline.postprocess import ImageDetections, gather_candidates, select, split_by_image, to_original
from harness.pipeline.preprocess import (
    ImageTransform,
    decode_bytes,
    decode_tensor,
    preprocess_batch,
    preprocess_tensors,
)
from harness.pipeline.stage_timer import BatchTiming, StageTimer


@dataclass(frozen=True)
class Thresholds:
    conf: float
    iou: float
    max_det: int


@cache
def _host_pool(workers: int) -> ThreadPoolExecutor:
    """One pool per process for per-image host work (NMS); its threads idle between batches."""
    return ThreadPoolExecutor(max_workers=workers, thread_name_prefix="va-host")


# How much lower the overlapped-mode host worker's priority is than the forward's (a nice increment).
# When host work and the forward want the same cores, the scheduler then runs host work in the forward's
# gaps instead of preempting one of its threads mid-operator, which stalls the whole operator at its
# barrier. Measured (2 cores, ONNX Runtime, batch 8, alternating rounds): overhead ratio +0.01 to +0.025.
STREAM_WORKER_NICE = 8


def stream_worker_priority() -> dict:
    """How the overlapped-mode worker is scheduled, for the environment record."""
    return {"torch_intra_op": 1, "nice_increment": STREAM_WORKER_NICE if sys.platform.startswith("linux") else 0}


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


def _init_stream_worker() -> None:
    # Host ops on one thread. With a torch (OpenMP) team of its own, (1) each parallel op waits at a
    # barrier for a partner that the forward's threads keep off the cores, spinning meanwhile (ONNX Runtime,
    # batch 8: worker CPU per batch 23 -> 13 ms), and (2) once that second team exists, the PyTorch forward
    # on the calling thread runs ~28 % slower for the rest of the process (YOLOX-Nano b8: 50 -> 36 img/s).
    torch.get_num_threads()  # a thread takes torch's process default at its first use: let that happen first
    torch.set_num_threads(1)
    _lower_own_priority()


@cache
def _stream_worker() -> ThreadPoolExecutor:
    """The single host worker of `run_overlapped` (one thread: batches stay in order), running torch ops
    single-threaded and at a lower priority than the forward (see STREAM_WORKER_NICE)."""
    threads = torch.get_num_threads()  # the caller's own count is settled before the worker changes the default
    worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="va-stream", initializer=_init_stream_worker)
    worker.submit(lambda: None).result()  # run the initializer now
    torch.set_num_threads(threads)  # set_num_threads also changed the default for threads started later: restore it
    return worker


class DetectorPipeline:
    """The harness side of a detector: everything but the core forward is shared code.

    In latency mode per-image NMS runs on `host_workers` threads (default: torch's thread count),
    inside the postprocess stage, so stage times still add up to the batch time. `read_image` gives an
    image's encoded bytes to the decode substep (a run's ImageBytes: memory or disk, harness/data/cache.py);
    without it the substep reads the file itself.

    `spec.library` is the preprocessing implementation (preprocess.resolve_implementation): with "torch" the
    images are decoded by torchvision (nvJPEG on CUDA) and letterboxed on the core's device."""

    def __init__(self, detector: Detector, core: Core, device: Device, spec: PreprocessSpec,
                 thresholds: Thresholds, host_workers: int | None = None,
                 read_image: Callable[[ImageRecord], bytes] | None = None):
        workers = host_workers or torch.get_num_threads()
        self.host_executor = _host_pool(workers) if workers > 1 else None
        self.detector = detector
        self.core = core
        self.device = device
        self.spec = spec
        self.thresholds = thresholds
        self.read_image = read_image
        self.postprocess = postprocess_spec(detector)  # the kind; thresholds come from `thresholds`
        # ONNX Runtime takes host memory (it copies to its device itself); torch cores take device tensors.
        self.input_device = device.torch_device if getattr(core, "torch_module", None) is not None else None
        # nvJPEG only where the tensors stay on the GPU (a torch core); an ONNX Runtime core takes host memory
        on_gpu = self.input_device is not None and self.input_device.type == "cuda"
        self.decoder = choose_decoder(spec.library, on_gpu)

    def preprocess_info(self) -> dict:
        """Which preprocessing implementation, decoder and device this pipeline uses (for the record)."""
        return preprocess_record(self.spec.library, self.decoder, self.input_device)

    def _read(self, record: ImageRecord) -> bytes:
        return self.read_image(record) if self.read_image else Path(record.path).read_bytes()

    def run_batch(self, records: list[ImageRecord], timer: StageTimer,
                  images: list[np.ndarray] | None = None) -> list[ImageDetections]:
        """Run one batch; `images` (already decoded) skips the decode substep."""
        timer.begin_batch(len(records))
        batch, transforms = self._preprocess(records, timer, images)
        raw = self._forward(batch, timer)
        detections = self._postprocess(records, raw, transforms, timer, self.host_executor)
        timer.end_batch()
        return detections

    def run_stream(self, batches: Sequence[list[ImageRecord]], timer: StageTimer,
                   overlap: bool = False) -> Iterator[list[ImageDetections]]:
        """Run batches in latency mode (`run_batch`) or overlapped (`run_overlapped`); either way
        each batch's timing lands in `timer.batches` and its detections are yielded in order."""
        if not overlap:
            for records in batches:
                yield self.run_batch(records, timer)
            return
        for detections, timing in self.run_overlapped(batches):
            timer.batches.append(timing)
            yield detections

    def run_overlapped(self, batches: Sequence[list[ImageRecord]],
                       images: Sequence[list[np.ndarray]] | None = None,
                       ) -> Iterator[tuple[list[ImageDetections], BatchTiming]]:
        """Overlapped mode (see the module docstring): yields each batch's detections and timing, in order."""
        worker = _stream_worker()

        def prepare(k: int) -> tuple[StageTimer, torch.Tensor, list[ImageTransform]]:
            timer = StageTimer(self.device, stage_sync=False, batch_sync=False)
            timer.begin_batch(len(batches[k]))
            batch, transforms = self._preprocess(batches[k], timer, images[k] if images is not None else None)
            return timer, batch, transforms

        # On CUDA the worker decodes on its own stream: on the default stream its kernels would queue
        # behind the next batch's forward (raw is complete: the forward stage synchronised).
        side_stream = torch.cuda.Stream(device=self.device.torch_device) if self.device.is_cuda else None

        def finish(k: int, timer: StageTimer, raw: list[torch.Tensor], transforms: list[ImageTransform]):
            with torch.cuda.stream(side_stream) if side_stream is not None else nullcontext():
                detections = self._postprocess(batches[k], raw, transforms, timer, executor=None)
            return detections, timer.end_batch()

        if not batches:
            return
        prepared = worker.submit(prepare, 0)
        finishing: Future | None = None
        for k in range(len(batches)):
            timer, batch, transforms = prepared.result()
            if k + 1 < len(batches):
                prepared = worker.submit(prepare, k + 1)
            raw = self._forward(batch, timer, sync=True)  # the worker reads raw only once it is ready
            if finishing is not None:
                yield finishing.result()
            finishing = worker.submit(finish, k, timer, raw, transforms)
        yield finishing.result()

    def _preprocess(self, records: list[ImageRecord], timer: StageTimer,
                    images: list[np.ndarray] | None) -> tuple[torch.Tensor, list[ImageTransform]]:
        with timer.stage("preprocess"):
            if self.spec.library != "torch":
                if images is None:
                    with timer.substep("decode"):
                        images = [decode_bytes(self._read(r), r.path) for r in records]
                return preprocess_batch(images, self.spec)
            target = self.input_device if self.input_device is not None else torch.device("cpu")
            if images is None:
                with timer.substep("decode"):
                    datas = [self._read(r) for r in records]
                    paths = [r.path for r in records]
                    images = (decode_on_device(datas, target, paths) if self.decoder == "nvjpeg"
                              else [decode_tensor(d, p) for d, p in zip(datas, paths, strict=True)])
            if target.type == "cuda" and any(not isinstance(i, torch.Tensor) or i.device != target for i in images):
                with timer.substep("upload"):  # host-decoded images go up as uint8, not float32
                    images = upload_uint8([i if isinstance(i, torch.Tensor) else torch.from_numpy(i)
                                           .permute(2, 0, 1).flip(0) for i in images], target)
            return preprocess_tensors(images, self.spec, target)

    def _forward(self, batch: torch.Tensor, timer: StageTimer, sync: bool = False) -> list[torch.Tensor]:
        with timer.stage("transfer"):
            if self.input_device is not None and self.input_device.type != "cpu":
                batch = batch.to(self.input_device, non_blocking=True)
        with timer.stage("forward"):
            events = ForwardEvents.begin(self.device.torch_device) if self.device.is_cuda else None
            raw = self.core(batch)
            if events is not None:
                events.stop(self.device.torch_device)
            if sync:
                self.device.synchronize()
        if events is not None:  # GPU time of the forward beside its wall time; absent on CPU (not 0)
            timer.device_time("forward_gpu", events)
        return raw

    def _postprocess(self, records: list[ImageRecord], raw: list[torch.Tensor], transforms: list[ImageTransform],
                     timer: StageTimer, executor: ThreadPoolExecutor | None) -> list[ImageDetections]:
        t, post = self.thresholds, self.postprocess
        with timer.stage("postprocess"):
            check_finite(raw, [r.image_id for r in records])
            decoded = self.detector.decode(raw, self.spec.input_size, t.conf)
            candidates = gather_candidates(decoded, post, t.conf, t.max_det)
            with timer.substep(post.kind):  # "nms" or "topk"
                kept = select(candidates, post, t.iou, t.max_det, transforms, executor)
            with timer.substep("boxes"):
                boxes = to_original(kept, transforms)
                return split_by_image(kept, boxes, [r.image_id for r in records])
