"""Executes a run: loads each (model, backend, precision, input size) once, runs the accuracy pass,
then one timing pass per batch size, and writes every artifact under outputs/<run_id>/."""

from __future__ import annotations

import secrets
import time
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch

from harness.config import RunConfig
from harness.data.coco import CocoDataset, ImageRecord
from harness.data.variants import DatasetVariant
from harness.errors import UsageError
from harness.eval.coco_eval import evaluate_bbox, evaluator_version
from harness.eval.matching import match_detections
from harness.measure.device import Device, parse_device
from harness.measure.energy import EnergyProbe, energy_block
from harness.measure.env import apply_tf32, collect_environment, hardware_block
from harness.measure.memory import MemoryMonitor
from harness.measure.stats import summarize
from harness.models.protocol import Detector
from harness.models.registry import get_detector
from harness.pipeline.pipeline import DetectorPipeline, Thresholds, stream_worker_priority
from harness.pipeline.postprocess import ImageDetections
from harness.pipeline.stage_timer import StageTimer
from harness.plan import Cell, LoadKey, plan_cells
from harness.probes import layer_pass, profile_pass
from harness.report.draw import draw_detections
from harness.report.progress import SilentProgress
from harness.results.artifacts import ProbeArtifacts
from harness.results.records import AccuracyRecord, CellRecord, TimingRecord
from harness.results.steps_csv import write_steps_csv
from harness.results.submission import build_submission, submission_filename
from harness.results.writer import atomic_write_bytes, atomic_write_json


@dataclass
class RunPlan:
    """Everything resolved and checked before the first file is written."""

    config: RunConfig
    run_id: str
    run_dir: Path
    device: Device
    dataset: CocoDataset
    variant: DatasetVariant
    records: list[ImageRecord]
    detectors: dict[str, Detector]
    groups: list[tuple[LoadKey, list[Cell]]]


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


def prepare(config: RunConfig) -> RunPlan:
    """Resolve dataset, models and cells. Raises UsageError on bad input; writes nothing."""
    device = parse_device(config.device)
    dataset = CocoDataset(config.coco_dir)
    variant = dataset.variant(config.subset, config.limit)
    if config.weights and len(config.models) > 1:
        raise UsageError("--weights applies to a single --model; run one model at a time with it")
    detectors = {}
    for spec in config.models:
        detector = get_detector(spec, config.weights)
        detectors[detector.model_id] = detector
    groups = plan_cells(config, detectors, variant.num_images)
    run_id = config.run_id or new_run_id()
    run_dir = Path(config.output_dir) / run_id
    if run_dir.exists():
        raise UsageError(f"{run_dir} already exists; pick another --run-id")
    return RunPlan(config, run_id, run_dir, device, dataset, variant, dataset.records(variant), detectors, groups)


class Runner:
    """Runs a prepared plan. `progress` shows bars; results go to disk and are returned as records."""

    def __init__(self, plan: RunPlan, argv: list[str], progress=None):
        self.plan = plan
        self.config = plan.config
        self.progress = progress or SilentProgress()
        self.argv = argv
        self._all_records: list[CellRecord] = []

    def run(self) -> list[CellRecord]:
        plan, config = self.plan, self.config
        threads = config.threads or torch.get_num_threads()
        torch.set_num_threads(threads)
        apply_tf32(config.tf32)
        environment = collect_environment(plan.device, config.tf32, self.argv, threads)
        if config.overlap:
            environment["threads"]["overlapped_host_worker"] = {"threads": 1, **stream_worker_priority()}
        hardware = hardware_block(plan.device, config.hardware_id)
        plan.run_dir.mkdir(parents=True)
        status = {c.label: "pending" for _, cells in plan.groups for c in cells}
        self._write_run_json(environment, hardware, status)
        records: list[CellRecord] = []
        self.energy_probe = EnergyProbe.detect(plan.device.index if plan.device.is_cuda else None) \
            if config.energy else None
        self.monitor = MemoryMonitor(plan.device) if config.memory else None
        self.artifacts = ProbeArtifacts(plan.run_dir)
        with self.monitor or nullcontext():
            for key, cells in plan.groups:
                records += self._run_group(key, cells, threads, environment, hardware, status)
        if self.monitor is not None:
            self.artifacts.write_memory(self.monitor.samples)
        return records

    def _run_group(self, key: LoadKey, cells: list[Cell], threads: int, environment: dict, hardware: dict,
                   status: dict) -> list[CellRecord]:
        """One (model, backend, precision, input size): load once, accuracy pass, then every batch size."""
        plan, config = self.plan, self.config
        detector = plan.detectors[key.model]
        spec = detector.preprocess.with_input_size(key.input_size)
        core = detector.load_core(key.backend, plan.device, key.precision, key.input_size, threads=threads)
        d = detector.defaults
        thresholds = Thresholds(config.conf if config.conf is not None else d.conf,
                                config.iou if config.iou is not None else d.iou,
                                config.max_det if config.max_det is not None else d.max_det)
        pipeline = DetectorPipeline(detector, core, plan.device, spec, thresholds)
        accuracy, reference = (self._accuracy_pass(key, pipeline) if config.accuracy else (None, None))
        stats = detector.model_stats(key.input_size).to_dict()
        records = []
        for cell in cells:
            timing, detections, probes = self._timing_pass(cell, pipeline)
            if cell is cells[-1]:  # the optional passes once per group, at its largest batch size
                probes.update(self._optional_passes(key, cell, pipeline))
            invariance = match_detections(reference, detections) if reference is not None else None
            record = CellRecord(
                run_id=plan.run_id,
                created_at=datetime.now(timezone.utc).isoformat().replace("+00:00", "Z"),
                cell=cell,
                model={"id": detector.model_id, "family": detector.family, "variant": detector.variant,
                       "weights": detector.weights.__dict__},
                runtime={"format": core.format, "provider": core.provider, "precision": key.precision,
                         "device": "gpu" if plan.device.is_cuda else "cpu", **core.info()},
                dataset=plan.variant.describe(),
                thresholds=thresholds.__dict__,
                hardware=hardware,
                environment=environment,
                model_stats=stats,
                timing=timing,
                accuracy=accuracy,
                invariance=invariance,
                energy=probes["energy"],
                memory=probes["memory"],
                layers=probes.get("layers"),
                profiler=probes.get("profiler"),
            )
            path = plan.run_dir / "submissions" / submission_filename(record)
            record.artifacts = {"run_dir": str(plan.run_dir), "submission": str(path),
                                "steps_timer": str(plan.run_dir / "steps_timer.csv"), **self.artifacts.files}
            if accuracy is not None:
                record.artifacts["detections"] = accuracy.detections_file
            atomic_write_json(path, build_submission(record))
            records.append(record)
            status[cell.label] = "ok"
            self._write_run_json(environment, hardware, status)
            write_steps_csv(plan.run_dir / "steps_timer.csv", self._all_records + records)
            if self.energy_probe is not None:
                self.artifacts.add_energy(cell.label, probes.get("energy_window"))
        self._all_records += records
        return records

    def _optional_passes(self, key: LoadKey, cell: Cell, pipeline: DetectorPipeline) -> dict:
        config, plan = self.config, self.plan
        size = cell.batch_size
        full = [b for b in self._batches(size) if len(b) == size]
        out = {}
        if config.layers:
            batches = [full[i % len(full)] for i in range(config.layer_batches)]
            with self.progress.task(f"layers {cell.label}", None):
                layers = layer_pass(pipeline, batches, plan.run_dir)
            self.artifacts.add_layers(cell, layers)
            out["layers"] = layers.summary()
        if config.profile:
            batches = [full[i % len(full)] for i in range(config.profile_batches)]
            with self.progress.task(f"profiler {cell.label}", None):
                profile = profile_pass(pipeline, batches, self.artifacts.trace_path(key))
            self.artifacts.add_profile(cell, profile)
            out["profiler"] = profile.summary()
        return out

    def _batches(self, size: int) -> list[list[ImageRecord]]:
        """The variant's images in order, `size` at a time (the last batch may be short)."""
        records = self.plan.records
        return [records[i:i + size] for i in range(0, len(records), size)]

    def _write_run_json(self, environment: dict, hardware: dict, status: dict) -> None:
        plan = self.plan
        atomic_write_json(plan.run_dir / "run.json", {
            "run_id": plan.run_id,
            "config": self.config.model_dump(),
            "dataset": {**plan.variant.describe(), "root": str(plan.dataset.root),
                        "annotation_file": str(plan.dataset.annotation_file)},
            "device": str(plan.device),
            "hardware": hardware,
            "environment": environment,
            "cells": [{"cell": label, "status": s} for label, s in status.items()],
        })

    def _accuracy_pass(self, key: LoadKey, pipeline: DetectorPipeline):
        """Every image of the variant once; COCO eval of the detections; they are the invariance reference."""
        plan = self.plan
        size = self.config.accuracy_batch_size
        timer = StageTimer(plan.device)
        detections: list[ImageDetections] = []
        batches = self._batches(size)
        with self.progress.task(f"accuracy {key.model} {key.backend}", len(plan.records)) as advance:
            for batch in batches:
                detections += pipeline.run_batch(batch, timer)
                advance(len(batch))
        class_map = pipeline.detector.class_map
        coco_dets = [d for det in detections for d in det.to_coco(class_map)]
        name = f"{key.model}__{key.backend}__{key.precision}__{key.input_size[0]}.json"
        path = atomic_write_json(plan.run_dir / "detections" / name, coco_dets, indent=None)
        stats = evaluate_bbox(plan.dataset.coco, coco_dets, list(plan.variant.image_ids), self.config.evaluator)
        if self.config.draw_images:
            for det, record in zip(detections[: self.config.draw_images], plan.records, strict=False):
                image = draw_detections(record.path, det, class_map)
                name = f"{key.model}__{key.backend}__{record.image_id}.jpg"
                atomic_write_bytes(plan.run_dir / "images" / name, image)
        record = AccuracyRecord(stats=stats, evaluator=evaluator_version(self.config.evaluator),
                                num_images=len(detections), num_detections=len(coco_dets),
                                batch_size=size, detections_file=str(path))
        return record, detections

    def _timing_pass(self, cell: Cell, pipeline: DetectorPipeline) -> tuple[TimingRecord, list[ImageDetections], dict]:
        """Warm-up (by count and by time, untimed), then timed full batches; the short last batch is
        run and recorded on its own, never mixed into the batch statistics."""
        config, plan = self.config, self.plan
        size = cell.batch_size
        batches = self._batches(size)
        short = batches.pop() if len(batches[-1]) < size else None
        scratch = StageTimer(plan.device, config.stage_sync)
        warm_count, start = 0, time.perf_counter()
        with self.progress.task(f"warm-up {cell.label}", config.warmup_batches or None) as advance:
            while warm_count < config.warmup_batches or time.perf_counter() - start < config.warmup_seconds:
                pipeline.run_batch(batches[warm_count % len(batches)], scratch)
                warm_count += 1
                advance()
        warm_seconds = time.perf_counter() - start
        n_timed = max(len(batches), config.min_timed_batches)
        if config.max_timed_batches:
            n_timed = min(n_timed, config.max_timed_batches)
        timer = StageTimer(plan.device, config.stage_sync)
        detections: list[ImageDetections] = []
        energy_window: dict = {}
        if self.monitor is not None:
            self.monitor.begin_window(f"timing {cell.label}")
        energy = self.energy_probe.window(energy_window) if self.energy_probe else nullcontext()
        timed = [batches[i % len(batches)] for i in range(n_timed)]
        stream_start = time.perf_counter()
        with self.progress.task(f"timing {cell.label}", n_timed) as advance, energy:
            for i, out in enumerate(pipeline.run_stream(timed, timer, overlap=config.overlap)):
                if i < len(batches):  # first pass over the data: keep for the invariance check
                    detections += out
                advance()
        stream_seconds = time.perf_counter() - stream_start
        memory = self.monitor.end_window() if self.monitor is not None else {
            "peak_ram_mb": None, "peak_vram_mb": None, "status": "unavailable", "reason": "--no-memory"}
        if plan.device.is_cuda and getattr(pipeline.core, "torch_module", None) is None:
            memory.update(peak_vram_mb=None, vram_reason="ONNX Runtime allocates outside torch's allocator")
        short_record = None
        if short is not None and n_timed >= len(batches):
            short_timer = StageTimer(plan.device, config.stage_sync)
            detections += pipeline.run_batch(short, short_timer)
            short_record = {"size": len(short), "total_ms": round(short_timer.batches[0].ms("total"), 4),
                            "note": "the last batch of the variant is short; run once, excluded from statistics"}
        totals = [b.ms("total") for b in timer.batches]
        names = sorted({n for b in timer.batches for n in b.stages})
        stages = {n: summarize([b.ms(n) for b in timer.batches]) for n in names}
        batch_ms = summarize(totals)
        image_ms = summarize([t / size for t in totals])
        timed_images = size * len(timer.batches)
        # Latency mode: batches back to back, so throughput is images over the summed batch times. Overlapped:
        # batches are in flight together, so images over the wall time of the stream.
        record = TimingRecord(
            batch_size=size, timed_batches=len(timer.batches), timed_images=timed_images,
            warmup_batches=warm_count, warmup_seconds=round(warm_seconds, 3), stage_sync=config.stage_sync,
            mode="overlapped" if config.overlap else "latency",
            batch_ms=batch_ms, image_ms=image_ms, stages_ms=stages,
            images_per_s=timed_images / (stream_seconds if config.overlap else sum(totals) / 1000.0),
            short_batch=short_record, warnings=list(batch_ms.warnings),
        )
        probes = {"memory": memory, "energy_window": energy_window or None,
                  "energy": energy_block(energy_window, self.energy_probe, timed_images) if self.energy_probe
                  else {"status": "unavailable", "reason": "--no-energy"}}
        return record, detections, probes
