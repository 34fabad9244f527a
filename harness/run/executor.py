"""The passes of one group (model, backend, precision, input size), loaded once:

- per cell (batch size): warm-up (untimed, unscored), then the timed pass over every image of the
  variant, which is also the scored pass: its detections are saved (`detections/<cell>.json`) and
  COCO-evaluated, so every cell has its own accuracy and batch invariance is the agreement between
  cells of the group (each against the group's reference cell, its smallest batch size);
- optional passes on their own, so they never pollute the timed pass: layers (hooks or ORT's node
  profiler) and torch.profiler, once per group at its largest batch size.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext, suppress
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from harness.backends import BackendOptions, load_detector_core
from harness.backends.support import on_torch_threads
from harness.config import RunConfig, timed_batches
from harness.data.cache import ImageBytes
from harness.data.calibration import CalibrationSet
from harness.data.classes import model_class_names
from harness.data.coco import CocoDataset, ImageRecord
from harness.data.synthetic import SyntheticImages
from harness.data.variants import DatasetVariant
from harness.detector.protocol import Detector, postprocess_spec, task_of
from harness.errors import UsageError
from harness.eval.coco_eval import (
    read_results,
)
from harness.eval.matching import match_detections
from harness.files import atomic_write_bytes, atomic_write_json
from harness.measure.device import Device
from harness.measure.energy import EnergyProbe, energy_block
from harness.measure.hygiene import DeviceSampler, load_average, machine_busy, process_start_time, spinning_openmp
from harness.measure.layers import hook_leaf_modules, per_batch_totals, summarize_by_type
from harness.measure.memory import MemoryMonitor, with_other_processes
from harness.measure.profiler import export_trace, op_rows, torch_profile
from harness.measure.server import SEED as SERVER_SEED
from harness.measure.server import RealClock, ServerResult, find_max_qps, poisson_arrivals, serve
from harness.measure.stats import (
    WARMUP_SPREAD,
    WARMUP_WINDOW,
    median_ci_extent_missing,
    median_ci_extent_pct,
    summarize,
    tail_bounds,
    warmup_end,
)
from harness.pipeline.forward_process import CoreLoad, ForwardProcessCore
from harness.pipeline.pipeline import DetectorPipeline, Thresholds, resolve_workers
from harness.pipeline.preprocess import resolve_implementation
from harness.pipeline.stage_timer import StageTimer, completion_intervals_ms
from harness.records import (
    Cell,
    CellRecord,
    ImageDetections,
    Invariance,
    LayerPassRecord,
    LoadKey,
    ProfilePassRecord,
    TimingRecord,
    utc_now_iso,
)
from harness.report.draw import draw_detections
from harness.results.artifacts import ProbeArtifacts, cell_slug, load_slug
from harness.run.scoring import CellScorer
from harness.run.state import LAYER_PROFILE_PREFIX

# When this module's imports (torch, the pipeline, the backends...) were done: start-up is reported apart
# from the cells' timings, from the process start to here and to each group's model load (environment.startup).
MODULES_LOADED_AT = time.time()

# Batch invariance: same class, IoU >= 0.99 and |score delta| <= 1e-3 between two cells' detections.
INVARIANCE_IOU = 0.99
INVARIANCE_SCORE_TOL = 1e-3
INVARIANCE_MASK_IOU = 0.99  # segmentation: a matched detection's mask also agrees with its batch-1 mask


WARMUP_ENDS = {"stable": f"stable: the last {WARMUP_WINDOW} batch times within {WARMUP_SPREAD:.0%} of each other",
               "cap": "cap: --warmup-seconds reached before the batch times settled"}
# overlapped mode warms up in short streams and compares their wall times
WARMUP_ENDS_OVERLAPPED = {
    "stable": f"stable: the last {WARMUP_WINDOW} warm-up streams' times within {WARMUP_SPREAD:.0%} of each other",
    "cap": "cap: --warmup-seconds reached before the warm-up streams' times settled"}


@dataclass
class RunContext:
    """What every group of a run shares: resolved inputs, probes, and where files go."""

    config: RunConfig
    run_id: str
    run_dir: Path
    device: Device
    dataset: CocoDataset
    variant: DatasetVariant
    records: list[ImageRecord]
    environment: dict
    hardware: dict
    artifacts: ProbeArtifacts
    energy_probe: EnergyProbe | None
    monitor: MemoryMonitor | None
    progress: object
    threads: int
    backend_options: BackendOptions  # the plan's, passed to every load
    label_categories: dict[str, tuple[int, ...]] = field(default_factory=dict)  # model id -> category per label
    sampler: DeviceSampler | None = None  # the device's state (throttling, clocks, load) during each timed pass
    images: ImageBytes | None = None  # the variant's encoded images (memory or disk): set by the first group
    calibration: CalibrationSet | None = None  # int8 groups: images disjoint from the evaluated ones
    corrupt_images: list[dict] = field(default_factory=list)  # JPEGs that decode only with errors (run.json's)
    # (detections sha256, evaluator, cap, task) -> (stats, per-class AP, iouTypes, the cell first scored with it)
    scored: dict[tuple, tuple[dict, dict, list[str], str]] = field(default_factory=dict)

    def batches(self, size: int) -> list[list[ImageRecord]]:
        """The variant's images in order, `size` at a time (the last batch may be short)."""
        return [self.records[i:i + size] for i in range(0, len(self.records), size)]


def _under(path: str, folder: Path | None) -> str:
    """`path` as the dataset names it (relative to its image folder, `/`-separated), else its file name alone: a
    submission carries no path of the machine it was made on."""
    try:
        return Path(path).resolve().relative_to(folder.resolve()).as_posix() if folder else Path(path).name
    except ValueError:
        return Path(path).name


@contextmanager
def _one_torch_thread() -> Iterator[None]:
    """Torch ops on one thread inside the block. Model stats count FLOPs over a batch-1 forward under
    FlopCounterMode (Python dispatch per op): one thread is as fast on an idle box, and when other processes
    share the cores it is 5-9x faster than the default team, whose barriers wait for preempted threads
    (measured, YOLOX-Nano, 2 cores at load 6: 2.1-3.7 s -> 0.4 s)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def stream_warnings(latencies_ms: list[float], depth: int) -> list[str]:
    """An overlapped stream's variation warnings: its first `depth` batches (as many as it holds in flight) had no
    full queue ahead of them and are shorter by design, so variation and the first sample are judged on the rest;
    the sample count on all of them."""
    every = summarize(latencies_ms).warnings
    if len(latencies_ms) <= depth + 1:
        return every
    steady = summarize(latencies_ms[depth:]).warnings
    return [w for w in every if w.startswith("only")] + [w for w in steady if not w.startswith("only")]


MAX_CYCLED_BATCHES = 10**9  # an open-ended stream's batches: more than any --min-seconds will run


class CycledBatches(Sequence):
    """The variant's batches over and over, `length` of them, made as they are asked for: the batches of a timed
    stream that ends when `goes_on` says (run_stream), whose count is not known when it starts."""

    def __init__(self, batches: list[list[ImageRecord]], length: int):
        self.batches, self.length = batches, length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, k):
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(self.length))]
        if not 0 <= k < self.length:
            raise IndexError(k)
        return self.batches[k % len(self.batches)]


@dataclass
class WarmUp:
    """What a cell's warm-up did: its batches, seconds, why it ended, and each batch's total (ms)."""

    batches: int
    seconds: float
    ended: str
    samples_ms: list[float]


@dataclass
class TimedStream:
    """A cell's timed stream: its stage timer, the scored pass's detections, its wall time and start, and what the
    probes saw while it ran (--target-ci's outcome, the energy window, the device's state, peak memory)."""

    timer: StageTimer
    detections: list[ImageDetections]
    seconds: float
    start_ns: int
    target: dict | None
    energy_window: dict
    device_state: dict | None
    memory: dict


class GroupExecutor:
    """One loaded (model, backend, precision, input size) and the passes run on it."""

    def __init__(self, ctx: RunContext, detector: Detector, key: LoadKey, model_spec: str | None = None):
        self.core = None
        try:
            self._set_up(ctx, detector, key, model_spec)
        except BaseException:  # a forward process loaded before the failure (or a Ctrl-C) ends with it
            self.close()
            raise

    def _set_up(self, ctx: RunContext, detector: Detector, key: LoadKey, model_spec: str | None) -> None:
        """Load the group's core (in a process of its own with --forward-process) and make its pipeline."""
        self.ctx, self.detector, self.key = ctx, detector, key
        # the dataset category each label is scored as (checked at plan time: data/classes.py)
        self.label_categories = ctx.label_categories[detector.model_id]
        config = ctx.config
        process_start = process_start_time()
        load_start, clock = time.time(), time.perf_counter()
        synthetic = ctx.dataset.layout == "synthetic"
        if ctx.images is None:  # once per run: every cell decodes from the same place (data/cache.py)
            elsewhere = ("--host-processes: each process reads the files it decodes (from the page cache once read)"
                         if config.host_processes else None)
            ctx.images = SyntheticImages(ctx.dataset) if synthetic else ImageBytes(ctx.records, config.cache_images,
                                                                                   read_elsewhere=elsewhere)
        cache_s, clock = time.perf_counter() - clock, time.perf_counter()
        self.spec = resolve_implementation(detector.preprocess.with_input_size(key.input_size), config.preprocess,
                                           ctx.device.is_cuda)  # --preprocess
        if config.forward_process:  # the same load, in a process of its own (--forward-process)
            self.core = ForwardProcessCore(CoreLoad(model_spec or detector.model_id, config.weights, key.backend,
                                                    ctx.device, key.precision, key.input_size, ctx.backend_options,
                                                    ctx.threads))
        else:
            self.core = load_detector_core(detector, key.backend, ctx.device, key.precision, key.input_size,
                                           options=ctx.backend_options, threads=ctx.threads)
        load_s, clock = time.perf_counter() - clock, time.perf_counter()
        with _one_torch_thread():
            self.stats = detector.model_stats(key.input_size).to_dict()
        self.startup = {"imports_s": round(MODULES_LOADED_AT - process_start, 3),
                        "process_start_to_load_s": round(load_start - process_start, 3),
                        "image_cache_s": round(cache_s, 3), "model_load_s": round(load_s, 3),
                        "model_stats_s": round(time.perf_counter() - clock, 3),
                        "note": "seconds from the process start (interpreter, imports, dataset checks) to this "
                                "group's model load, and of the load itself; never part of a cell's timings"}
        post = postprocess_spec(detector)  # the family's post-processing kind and protocol thresholds
        self.thresholds = Thresholds(config.conf if config.conf is not None else post.conf,
                                     config.iou if config.iou is not None else post.iou,
                                     config.max_det if config.max_det is not None else post.max_det)
        # the kind and the thresholds that ran (--conf/--iou/--max-det over the family's), as config.conf etc. say
        self.postprocess = replace(post, conf=self.thresholds.conf, iou=self.thresholds.iou,
                                   max_det=self.thresholds.max_det).to_dict()
        self.pipeline = DetectorPipeline(detector, self.core, ctx.device, self.spec, self.thresholds,
                                         read_image=ctx.images.read,
                                         stream_workers=resolve_workers(config.workers, ctx.device.is_cuda,
                                                                        config.host_processes),
                                         masks=config.masks, generated=ctx.dataset.image if synthetic else None,
                                         nms_on=config.nms_on, host_processes=config.host_processes)
        # the cell's task: a segmentation model with --no-masks is a detector here (boxes only, the detection board)
        self.task = "segment" if self.pipeline.masks else "detect"
        if self.pipeline.masks:
            self.masks_record: dict | str | None = detector.mask_spec.to_dict()
        else:
            self.masks_record = "off (--no-masks): boxes only" if task_of(detector) == "segment" else None
        self.reference: tuple[int, list[ImageDetections]] | None = None  # (batch size, detections)
        self.scorer = CellScorer(ctx, detector, key, self.task, self.label_categories)
        if getattr(self.core, "needs_calibration", False):
            clock = time.perf_counter()
            self._calibrate()
            self.startup["int8_calibration_s"] = round(time.perf_counter() - clock, 3)

    def close(self) -> None:
        """Release what the group holds beyond its objects: a forward process (--forward-process) ends."""
        close = getattr(self.core, "close", None)
        if close is not None:
            close()

    def _calibrate(self) -> None:
        """int8: quantise the core on the run's calibration images (never evaluated ones), preprocessed exactly
        as the evaluated images are, one image per input; then compile it for the run's batch sizes."""
        calibration = self.ctx.calibration
        if calibration is None:
            raise UsageError("int8 needs calibration images and this run has none; give --calibration DIR")
        if calibration.shortfall:
            self.ctx.progress.log(f"warning: {self.key.label}: {calibration.shortfall}")
        with self.ctx.progress.task(f"int8 calibration on {len(calibration.records)} images", None):
            batches = [self.pipeline.inputs([record]) for record in calibration.records]
            self.core.calibrate(batches, calibration.describe())
            self.core.prepare(tuple(sorted(self.ctx.config.batch_sizes)))

    def _scored(self, detections: list[ImageDetections]) -> list[ImageDetections]:
        """The detections the dataset scores (classes it has): what batch invariance compares, the same whether the
        reference cell ran in this process or is read back from its detections file on --resume."""
        keep = np.asarray(self.label_categories) >= 0
        if keep.all():
            return detections
        return [d.select(keep[d.labels] if len(d.labels) else np.zeros(0, bool)) for d in detections]

    def use_reference(self, batch_size: int, detections_file: Path) -> None:
        """On --resume: the group's reference detections come from a cell finished earlier (its COCO file), read
        into columns (a dict per detection, ~0.5 KB each, would stay in the process's heap through the group's later
        cells and their peak memory). A file that does not read is a ValueError: the caller goes on without it."""
        columns = read_results(detections_file, masks=self.task == "segment")
        by_image = {d.image_id: d for d in columns.per_image()}
        contiguous = np.full(max(self.label_categories, default=0) + 1, -1, dtype=int)
        for i, category in enumerate(self.label_categories):
            if category >= 0:
                contiguous[category] = i
        reference = []
        for record in self.ctx.records:
            d = by_image.get(record.image_id)
            if d is None:  # an image without detections has no line in the COCO file
                reference.append(ImageDetections(record.image_id, np.zeros((0, 4)), np.zeros(0), np.zeros(0, int)))
                continue
            known = (d.labels >= 0) & (d.labels < len(contiguous))
            labels = np.where(known, contiguous[np.clip(d.labels, 0, len(contiguous) - 1)], -1)
            if (labels < 0).any():
                raise ValueError(f"{detections_file.name}: category {int(d.labels[labels < 0][0])} is not one of the "
                                 "model's")
            reference.append(ImageDetections(record.image_id, d.boxes, d.scores, labels, d.masks))
        self.reference = (batch_size, reference)

    # ------------------------------------------------------------------------------------ one cell

    def run_cell(self, cell: Cell) -> CellRecord:
        """The scored timing pass of one batch size: timings, detections file, accuracy, batch invariance."""
        ctx = self.ctx
        load_start = load_average()
        timing, detections, probes = self._timing_pass(cell)
        detections_file, count = self.scorer.save_detections(cell, detections)
        accuracy, accuracy_reason = self.scorer.evaluate(cell, detections_file, count, len(detections))
        if accuracy is not None and cell.load.precision == "int8":
            accuracy.reference = self.scorer.int8_verdict(cell, accuracy, self.pipeline)
            if "failing" in accuracy.reference:
                ctx.progress.log(f"warning: {cell.label}: {accuracy.reference['failing']}")
        invariance = None
        if self.reference is None:
            self.reference = (cell.batch_size, self._scored(detections))
            self._draw(detections)
            if len(ctx.config.batch_sizes) > 1:
                invariance = Invariance(cell.batch_size, None)
        else:
            ref_size, ref = self.reference
            invariance = Invariance(ref_size, match_detections(
                ref, self._scored(detections), INVARIANCE_IOU, INVARIANCE_SCORE_TOL,
                mask_iou_threshold=INVARIANCE_MASK_IOU if self.pipeline.masks else None))
        load_end = load_average()
        record = CellRecord(
            run_id=ctx.run_id,
            created_at=utc_now_iso(),
            cell=cell,
            model={"id": self.detector.model_id, "family": self.detector.family, "variant": self.detector.variant,
                   "task": self.task, "weights": self.detector.weights.__dict__},
            runtime={**{("torch_device" if k == "device" else k): v for k, v in self.core.info().items()},
                     "format": self.core.format, "provider": self.core.provider, "precision": cell.load.precision,
                     "device": "gpu" if ctx.device.is_cuda else "cpu",  # the site's vocabulary: cpu|gpu|npu
                     # --preprocess: implementation, decoder; and what `auto` takes for this family on this device
                     "preprocess": {**self.pipeline.preprocess_info(), "default": resolve_implementation(
                         self.detector.preprocess, "auto", ctx.device.is_cuda).library},
                     "host": self.pipeline.host_info(ctx.config.overlap)},  # --workers; where host ops run
            dataset={**ctx.dataset.describe(), **ctx.variant.describe(),
                     # scored as the decoder made them: the submission says so, and how many
                     **({"decoded_with_errors": [_under(c["path"], ctx.dataset.image_dir)
                                                 for c in ctx.corrupt_images]} if ctx.corrupt_images else {})},
            thresholds={**self.thresholds.__dict__, "postprocess": self.postprocess,
                        "preprocess": self.spec.to_dict(),
                        **({"masks": self.masks_record} if self.masks_record is not None else {})},
            hardware=ctx.hardware,
            environment={**ctx.environment, "load_average": {"cell_start": [round(v, 2) for v in load_start],
                                                             "cell_end": [round(v, 2) for v in load_end]},
                         "startup": self.startup, "images": ctx.images.decision.to_dict(),
                         "device_state": probes["device_state"]},
            model_stats=self.stats,
            timing=timing,
            accuracy=accuracy,
            accuracy_reason=accuracy_reason,
            invariance=invariance,
            energy=probes["energy"],
            memory=probes["memory"],
            detections_file=detections_file,
        )
        if ctx.config.scenario == "server":
            record.server = self._server_scenario(cell, timing)
        state = probes["device_state"] or {}
        if "run_cpu_cores" in state:  # the pass's own window: the load at its end, less what the run used in it
            busy = machine_busy(state["load_average"]["end"][0], state["run_cpu_cores"], os.cpu_count() or 1)
        else:
            busy = machine_busy(max(load_start[0], load_end[0]), None, os.cpu_count() or 1)
        if busy:
            options = self.core.info().get("options")
            spinning = spinning_openmp(on_torch_threads(cell.load.backend), ctx.device.is_cuda, ctx.threads,
                                       options.get("openmp_blocktime") if isinstance(options, dict) else None)
            timing.warnings.append(f"{busy} during this cell; timings are suspect"
                                   + (f"; {spinning}" if spinning else ""))
        if ctx.energy_probe is not None:
            ctx.artifacts.add_energy(cell.label, probes.get("energy_window"))
        return record

    def run_optional_passes(self, cell: Cell, record: CellRecord) -> None:
        """Layer and profiler passes (each on its own), once per group at its largest batch size."""
        ctx, config = self.ctx, self.ctx.config
        full = [b for b in ctx.batches(cell.batch_size) if len(b) == cell.batch_size]
        core = self.core
        if config.layers and getattr(core, "torch_module", None) is None and not hasattr(core, "profiling_copy"):
            reason = core.info().get("layers_unavailable") or f"{core.backend} has no per-layer timing"
            record.layers = {"status": "unavailable", "reason": reason}  # said, never zeros
        elif config.layers:
            batches = [full[i % len(full)] for i in range(config.layer_batches)]
            with ctx.progress.task(f"layers {cell.label}", None):
                runtime = "ort" if self.key.backend == "onnxruntime" else self.key.backend
                layers = layer_pass(self.pipeline, batches, ctx.run_dir,
                                    ctx.run_dir / f"{runtime}_profile__{load_slug(self.key)}.json")
            if layers.runtime_trace:
                layers.runtime_trace = Path(layers.runtime_trace).relative_to(ctx.run_dir).as_posix()
            if layers.calls:
                ctx.artifacts.add_layers(cell, layers)
                record.layers = layers.summary()
            else:  # sums of 0 would read as layers that took no time: the pass measured nothing
                record.layers = {"status": "unavailable", "reason": "no layer was timed: no leaf module of the core's "
                                 "torch_module ran in its forward" if layers.runtime_trace is None else
                                 "no layer was timed: the runtime's profiler recorded no node"}
        if config.profile:
            batches = [full[i % len(full)] for i in range(config.profile_batches)]
            with ctx.progress.task(f"profiler {cell.label}", None):
                profile = profile_pass(self.pipeline, batches, ctx.artifacts.trace_path(cell.load))
            profile.trace_file = Path(profile.trace_file).relative_to(ctx.run_dir).as_posix()
            ctx.artifacts.add_profile(cell, profile)
            record.profiler = profile.summary()

    # ------------------------------------------------------------------------------------- passes

    def _timing_pass(self, cell: Cell) -> tuple[TimingRecord, list[ImageDetections], dict]:
        """Warm-up (untimed, unscored), then timed full batches: the first pass over the variant's batches is also
        scored. The short last batch is run, timed on its own and scored, never mixed into the batch statistics;
        with --max-timed-batches below the variant's batch count, the remaining batches are run untimed so every
        image is still scored."""
        ctx = self.ctx
        batches = ctx.batches(cell.batch_size)
        short = batches.pop() if len(batches[-1]) < cell.batch_size else None
        warm = self._warm_up(cell, batches)
        n_timed = timed_batches(ctx.config, len(batches))
        stream = self._timed_stream(cell, batches, n_timed)
        detections = stream.detections
        untimed = StageTimer(ctx.device, ctx.config.stage_sync)
        for batch in batches[n_timed:]:  # only with --max-timed-batches: scored, not timed
            detections += self.pipeline.run_batch(batch, untimed)
        short_record = None
        if short is not None:
            short_detections, short_record = self._short_batch(short)
            detections += short_detections
        record = self._timing_record(cell, warm, stream, short_record, untimed=len(batches) - n_timed)
        probes = {"memory": stream.memory, "energy_window": stream.energy_window or None,
                  "device_state": stream.device_state,
                  "energy": energy_block(stream.energy_window, ctx.energy_probe, record.timed_images)
                  if ctx.energy_probe else {"status": "unavailable", "reason": "--no-energy"}}
        return record, detections, probes

    def _warm_up(self, cell: Cell, batches: list[list[ImageRecord]]) -> WarmUp:
        """At least --warmup-batches, then until the batch times settle or --warmup-seconds have passed, in the mode
        that is timed: overlapped mode's workers, queue and (on CUDA) streams are first used here, not inside the
        first timed batches."""
        config, pipeline = self.ctx.config, self.pipeline
        scratch = StageTimer(self.ctx.device, config.stage_sync)
        count, start = 0, time.perf_counter()
        # An overlapped chunk keeps every worker busy. Settled when the last few batch times agree; in overlapped
        # mode, the last few chunks' wall times (a chunk's own batches differ by design: the first has no queue
        # ahead of it, the last none behind)
        chunk = pipeline.stream_workers + pipeline.async_slots if config.overlap else 1
        chunk_ms: list[float] = []
        minimum = math.ceil(config.warmup_batches / chunk) if config.overlap else config.warmup_batches
        ended = None
        with self.ctx.progress.task(f"warm-up {cell.label}", None) as advance:
            while ended is None:
                times = chunk_ms if config.overlap else [b.ms("total") for b in scratch.batches]
                ended = warmup_end(times, time.perf_counter() - start, minimum, config.warmup_seconds)
                if ended is not None:
                    break
                warm = [batches[(count + j) % len(batches)] for j in range(chunk)]
                chunk_start = time.perf_counter()
                for _ in pipeline.run_stream(warm, scratch, overlap=config.overlap):
                    count += 1
                    advance()
                chunk_ms.append((time.perf_counter() - chunk_start) * 1000)
        why = (WARMUP_ENDS_OVERLAPPED if config.overlap else WARMUP_ENDS)[ended]
        return WarmUp(count, time.perf_counter() - start, why, [b.ms("total") for b in scratch.batches])

    def _timed_stream(self, cell: Cell, batches: list[list[ImageRecord]], n_timed: int) -> TimedStream:
        """The timed batches as one stream (n_timed of them; with --min-seconds until that long has passed; with
        --target-ci until the median is known well enough), inside the memory, device-state and energy windows. The
        first pass over the variant's batches is the scored one."""
        ctx, config, pipeline = self.ctx, self.ctx.config, self.pipeline
        timer = StageTimer(ctx.device, config.stage_sync)
        detections: list[ImageDetections] = []
        energy_window: dict = {}
        target = None
        try:
            if ctx.monitor is not None:
                ctx.monitor.begin_window(f"timing {cell.label}")
                other_processes_peaks(pipeline, reset=True)  # the run's other processes' peaks start now too
            if ctx.sampler is not None:
                ctx.sampler.begin_window(cell.label)
            energy = ctx.energy_probe.window(energy_window) if ctx.energy_probe else nullcontext()
            pipeline.reset_forward_thread()  # the record's account covers the timed batches only
            stream_start, stream_start_ns = time.perf_counter(), time.perf_counter_ns()

            minimum_seconds = config.min_seconds

            def goes_on(k: int) -> bool:
                """n_timed batches, then (--min-seconds) more until that long has passed since the stream began."""
                return k < n_timed or (minimum_seconds is not None
                                       and time.perf_counter() - stream_start < minimum_seconds)

            timed = CycledBatches(batches, n_timed if minimum_seconds is None else MAX_CYCLED_BATCHES)
            open_ended = config.target_ci is not None or minimum_seconds is not None
            with ctx.progress.task(f"timing {cell.label}", None if open_ended else n_timed) as advance, energy:
                for i, out in enumerate(pipeline.run_stream(timed, timer, config.overlap, goes_on)):
                    if i < len(batches):  # the first pass over the data is the scored one
                        detections += out
                    advance()
                if config.target_ci is not None:
                    target = self._time_to_target(batches, timer, advance, stream_start)
        except BaseException:  # the cell fails (or the run stops): its windows close, or the next cell's warm-up
            for window in (ctx.sampler, ctx.monitor):  # samples would be tagged as this cell's timing; the
                if window is not None:  # cell's own exception is what is reported
                    with suppress(Exception):
                        window.end_window()
            raise
        # the stream ends with its last batch (not after the progress bar's and the energy sources' teardown): the
        # last to complete, not always the last handed on (batches finishing at once, --host-processes)
        stream_seconds = (max(b.end_ns for b in timer.batches) - stream_start_ns) / 1e9 if timer.batches else \
            time.perf_counter() - stream_start
        device_state = ctx.sampler.end_window() if ctx.sampler is not None else None
        memory = ctx.monitor.end_window() if ctx.monitor is not None else {
            "peak_ram_mb": None, "peak_vram_mb": None, "status": "unavailable", "reason": "--no-memory"}
        others = other_processes_peaks(pipeline) if ctx.monitor is not None else {}
        if others:
            memory = with_other_processes(memory, others)
        if ctx.device.is_cuda and getattr(pipeline.core, "torch_module", None) is None and \
                "forward_process" not in others:
            memory.update(peak_vram_mb=None, peak_vram_reserved_mb=None,
                          vram_reason=f"the {pipeline.core.backend} core allocates outside torch's allocator")
        return TimedStream(timer, detections, stream_seconds, stream_start_ns, target, energy_window, device_state,
                           memory)

    def _short_batch(self, short: list[ImageRecord]) -> tuple[list[ImageDetections], dict]:
        """The variant's short last batch: compiled or captured for its shape first (untimed), then run once,
        scored, and timed on its own."""
        prepare_shape = getattr(self.pipeline.core, "prepare_shape", None)
        if prepare_shape is not None:
            prepare_shape((len(short), 3, *self.pipeline.spec.input_size))
        timer = StageTimer(self.ctx.device, self.ctx.config.stage_sync)
        detections = self.pipeline.run_batch(short, timer)
        return detections, {"size": len(short), "total_ms": round(timer.batches[0].ms("total"), 4),
                            "note": "the last batch of the variant is short; run once, scored, excluded from the "
                                    "timing statistics"}

    def _timing_record(self, cell: Cell, warm: WarmUp, stream: TimedStream, short_record: dict | None,
                       untimed: int) -> TimingRecord:
        """The cell's timing: each stage's and the batch's statistics, throughput, and the warnings a reader of
        the figures needs (stability, the device's state, --target-ci not met, batches not timed, a host-bound
        stream)."""
        config, pipeline, timer, size = self.ctx.config, self.pipeline, stream.timer, cell.batch_size
        totals = [b.ms("total") for b in timer.batches]
        names = sorted({n for b in timer.batches for n in b.stages})
        stages = {n: summarize([b.ms(n) for b in timer.batches]) for n in names}
        batch_ms = summarize(totals)
        if config.overlap:  # the record's batch summary says what the cell's warnings say
            depth = pipeline.stream_workers + pipeline.async_slots
            batch_ms = replace(batch_ms, warnings=stream_warnings(totals, depth))
        timed_images = size * len(timer.batches)
        # Latency mode: batches back to back, so throughput is images over the summed batch times. Overlapped:
        # batches are in flight together, so images over the wall time of the stream.
        intervals = completion_intervals_ms(timer.batches, stream.start_ns) if config.overlap else []
        image_samples = intervals if config.overlap else [t / size for t in totals]
        device_state, target = stream.device_state, stream.target
        record = TimingRecord(
            batch_size=size, timed_batches=len(timer.batches), timed_images=timed_images,
            warmup_batches=warm.batches, warmup_seconds=round(warm.seconds, 3), warmup_ended=warm.ended,
            stage_sync=config.stage_sync,
            mode="overlapped" if config.overlap else "latency",
            batch_ms=batch_ms, stages_ms=stages,
            # overlapped: per-image *interval* (1000 / it is the throughput), not end-to-end latency / size
            image_ms=summarize(image_samples),
            images_per_s=timed_images / (stream.seconds if config.overlap else sum(totals) / 1000.0),
            short_batch=short_record, batch_samples_ms=[round(t, 4) for t in totals],
            interval_samples_ms=[round(t, 4) for t in intervals] if config.overlap else None,
            warnings=list(batch_ms.warnings) + (device_state["warnings"] if device_state else []),
            throttled=device_state["throttled"] if device_state else None,
            target_ci=target, timed_seconds=round(stream.seconds, 3),
            warmup_samples_ms=[round(t, 4) for t in warm.samples_ms],
            tail=tail_bounds(image_samples),
        )
        if target is not None and not target["met"]:
            extent = target["extent_pct"]
            reached = (f"undefined ({median_ci_extent_missing(totals)})" if extent is None
                       else f"within +-{extent:.2f} %")
            record.warnings.append(f"--target-ci {target['target_pct']:g}: the median's 95 % CI is {reached} after "
                                   f"{target['seconds']:.0f} s; stopped at --max-seconds {config.max_seconds:g} (raise "
                                   "it, or accept a wider interval)")
        if untimed > 0:  # fewer timed than the variant's batches (a pass cycles them when it times more)
            record.warnings.append(f"--max-timed-batches {config.max_timed_batches}: {untimed} batches were scored but "
                                   "not timed")
        host_bound = pipeline.forward_thread.host_bound_warning(on_gpu=self.ctx.device.is_cuda) if config.overlap \
            else None
        if host_bound is not None:
            record.warnings.append(host_bound)
        return record

    def _server_scenario(self, cell: Cell, timing: TimingRecord) -> dict:
        """--scenario server, after the cell's timed and scored pass: seeded Poisson arrivals at --qps, one image a
        query (the variant's images, cycled), FIFO on this pipeline, each latency from arrival to result, p99
        against --latency-bound; with --find-max-qps the highest rate that holds it, searched between 5 % and 100 %
        of the rate the single-stream pass could sustain (1000 / its mean ms per image)."""
        ctx, config, pipeline = self.ctx, self.ctx.config, self.pipeline
        records, clock, scratch = ctx.records, RealClock(), StageTimer(ctx.device, config.stage_sync)
        done: list[ServerResult] = []

        def trial(qps: float) -> ServerResult:
            arrivals = poisson_arrivals(qps, config.server_queries)
            with ctx.progress.task(f"server {cell.label} at {qps:.2f} qps", None):
                done.append(serve(arrivals, lambda i: pipeline.run_batch([records[i % len(records)]], scratch), clock,
                                  config.latency_bound_ms, qps))
            return done[-1]

        samples_file = f"server/{cell_slug(cell)}.json"
        block: dict = {"scenario": "server", "latency_bound_ms": config.latency_bound_ms,
                       "queries_per_trial": config.server_queries, "arrivals": "Poisson, seeded", "seed": SERVER_SEED,
                       "note": "one image a query, FIFO, latency from arrival to result (queueing included)",
                       "samples": samples_file}
        if config.qps is not None:
            block["at_qps"] = trial(config.qps).to_dict()
        if config.find_max_qps:
            capacity = 1000.0 / timing.image_ms.mean
            if timing.image_ms.min > config.latency_bound_ms:  # every query takes at least this: no rate can hold
                block["max_qps"] = None
                block["search"] = {"between_qps": None, "trials": [],
                                   "why_none": f"the fastest timed query took {timing.image_ms.min:.2f} ms, more than "
                                               f"the {config.latency_bound_ms:g} ms bound: no rate can hold it"}
            else:
                best, trials = find_max_qps(trial, 0.05 * capacity, capacity)
                block["max_qps"] = None if best is None else round(best, 3)
                block["search"] = {"between_qps": [round(0.05 * capacity, 3), round(capacity, 3)],
                                   "trials": [t.to_dict() for t in trials],
                                   "why_none": None if best is not None else "even 5 % of the single-stream rate "
                                                                             "missed the bound"}
        # every query of every trial, in the order run (the at-qps trial first): the figures above can be checked
        atomic_write_json(ctx.run_dir / samples_file, {"cell": cell.label, "trials": [t.samples() for t in done]})
        return block

    def _time_to_target(self, batches: list[list[ImageRecord]], timer: StageTimer, advance,
                        started: float) -> dict:
        """--target-ci: more timed batches (the variant's, cycled, not scored: every image is scored once) until both
        ends of the median batch time's 95 % bootstrap CI are within the target share of the median, or
        --max-seconds after the timed pass began. Checked every quarter of the batches so far (at least 10)."""
        config, pipeline = self.ctx.config, self.pipeline
        added = 0
        while True:
            extent = median_ci_extent_pct([b.ms("total") for b in timer.batches])
            seconds = time.perf_counter() - started
            if extent is not None and extent <= config.target_ci:
                stopped = "met"
                break
            if seconds >= config.max_seconds:
                stopped = "--max-seconds"
                break
            more = max(10, len(timer.batches) // 4)
            per_batch_s = float(np.median([b.ms("total") for b in timer.batches])) / 1000 if timer.batches else 0
            if per_batch_s > 0:  # never planned past --max-seconds
                more = max(1, min(more, int((config.max_seconds - seconds) / per_batch_s)))
            extra = [batches[(added + j) % len(batches)] for j in range(more)]
            for _ in pipeline.run_stream(extra, timer, overlap=config.overlap):
                advance()
            added += more
        return {"target_pct": config.target_ci, "extent_pct": None if extent is None else round(extent, 4),
                "met": stopped == "met", "stopped": stopped, "added_batches": added, "seconds": round(seconds, 2),
                "max_seconds": config.max_seconds}

    def _draw(self, detections: list[ImageDetections]) -> None:
        ctx = self.ctx
        if ctx.dataset.layout == "synthetic":  # noise has nothing to show
            return
        for det, record in zip(detections[: ctx.config.draw_images], ctx.records, strict=False):
            image = draw_detections(record.path, det, model_class_names(self.detector))
            name = f"{load_slug(self.key)}__{record.image_id}.jpg"
            atomic_write_bytes(ctx.run_dir / "images" / name, image)


def other_processes_peaks(pipeline: DetectorPipeline, reset: bool = False) -> dict[str, dict]:
    """The memory peaks of the run's other processes, by name: its forward process's (--forward-process) and its
    host processes' summed (--host-processes); `reset` starts new ones (a timed pass's window)."""
    peaks = {}
    if hasattr(pipeline.core, "memory_peaks"):
        peaks["forward_process"] = pipeline.core.memory_peaks(reset)
    if pipeline.host_processes is not None:
        peaks["host_processes"] = pipeline.host_processes.memory_peaks(reset)
    return peaks


def layer_pass(pipeline: DetectorPipeline, batches: list[list[ImageRecord]], work_dir: Path,
               trace_path: Path) -> LayerPassRecord:
    """Per-layer timing of a few batches: hooks on leaf modules (PyTorch), or the runtime's own per-node
    profiler (ONNX Runtime, OpenVINO) on a second copy of the core, whose trace lands at `trace_path`
    (temp files under `work_dir`)."""
    core, device = pipeline.core, pipeline.device
    timer = StageTimer(device)
    if getattr(core, "torch_module", None) is not None:
        with hook_leaf_modules(core.torch_module, device, lambda: len(timer.batches)) as calls:
            for batch in batches:
                pipeline.run_batch(batch, timer)
        calls = list(calls)
        method = "forward pre/post hooks on leaf modules (device-synced)"
        trace = None
    elif hasattr(core, "profiling_copy"):  # a runtime's own per-node profiler on a second copy of the core
        tmp = tempfile.mkdtemp(prefix=LAYER_PROFILE_PREFIX, dir=work_dir)
        try:
            profiled = pipeline.copy_with(core.profiling_copy(str(Path(tmp) / "profile")))
            for batch in batches:
                profiled.run_batch(batch, timer)
            calls, method = profiled.core.finish_profile(trace_path)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
        trace = str(trace_path)
    else:
        raise ValueError(f"{type(core).__name__} has neither a torch module nor a runtime profiler")
    totals = per_batch_totals(calls)
    return LayerPassRecord(method=method, calls=calls, by_type=summarize_by_type(calls),
                           forward_ms=[b.ms("forward") for b in timer.batches],
                           layer_sum_ms=[totals.get(i, 0.0) for i in range(len(timer.batches))], runtime_trace=trace)


def profile_pass(pipeline: DetectorPipeline, batches: list[list[ImageRecord]], trace_path: Path) -> ProfilePassRecord:
    """torch.profiler over a few batches, stages labelled; Chrome trace + key averages."""
    timer = StageTimer(pipeline.device, profiler_ranges=True)
    # torch.profiler records the ops of the thread that started it: NMS runs here, not on the host pool.
    # the host stages too run here, in this process (not --host-processes'), where the profiler sees their ops
    on_this_thread = pipeline.copy_with(host_workers=1, host_thread=False, host_processes=0)
    with torch_profile(pipeline.device) as prof:
        for batch in batches:
            on_this_thread.run_batch(batch, timer)
    export_trace(prof, trace_path)
    notes = []
    if getattr(pipeline.core, "forward_elsewhere", False):
        notes.append("the forward ran in a process of its own (--forward-process): here it shows as the hand-over "
                     "and the wait for it")
    elif getattr(pipeline.core, "torch_module", None) is None:
        notes.append("the core is not PyTorch: the forward shows as one range; see layer_timer.csv for its nodes")
    return ProfilePassRecord(str(trace_path), op_rows(prof, pipeline.device), len(batches), notes)
