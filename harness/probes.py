"""The optional passes, each on its own so it never pollutes the timing pass: per-layer timing
(hooks or ORT's node profiler) and torch.profiler. They return records; the runner writes files."""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from harness.data.coco import ImageRecord
from harness.measure.layers import LayerCall, hook_leaf_modules, ort_profile_calls, per_batch_totals, summarize_by_type
from harness.measure.profiler import export_trace, op_rows, torch_profile
from harness.pipeline.pipeline import DetectorPipeline
from harness.pipeline.stage_timer import StageTimer


@dataclass
class LayerPassRecord:
    """Per-layer timing of a few batches, with the forward stage time of the same batches."""

    method: str
    calls: list[LayerCall]
    by_type: list[dict]
    forward_ms: list[float]  # forward stage per batch, hooks included
    layer_sum_ms: list[float]  # layer times summed per batch
    ort_trace: str | None = None

    @property
    def coverage(self) -> list[float]:
        """Summed layer time / forward stage time, per batch."""
        return [s / f if f else 0.0 for s, f in zip(self.layer_sum_ms, self.forward_ms, strict=True)]

    def summary(self, top: int = 10) -> dict:
        return {"method": self.method, "batches": len(self.forward_ms), "layer_calls": len(self.calls),
                "by_type_top": self.by_type[:top],
                "layer_sum_over_forward": [round(c, 4) for c in self.coverage]}


@dataclass
class ProfilePassRecord:
    trace_file: str
    ops: list[dict]
    batches: int
    notes: list[str] = field(default_factory=list)

    def summary(self, top: int = 10) -> dict:
        return {"trace": self.trace_file, "batches": self.batches, "top_ops": self.ops[:top], "notes": self.notes}


def layer_pass(pipeline: DetectorPipeline, batches: list[list[ImageRecord]], run_dir: Path) -> LayerPassRecord:
    """Hooks on leaf modules (PyTorch) or ORT's per-node profiler on a separate session."""
    core, device = pipeline.core, pipeline.device
    timer = StageTimer(device)
    if getattr(core, "torch_module", None) is not None:
        with hook_leaf_modules(core.torch_module, device, lambda: len(timer.batches)) as calls:
            for batch in batches:
                pipeline.run_batch(batch, timer)
        calls = list(calls)
        method = "forward pre/post hooks on leaf modules (device-synced)"
        ort_trace = None
    elif hasattr(core, "profiling_copy"):
        tmp = tempfile.mkdtemp(prefix=".ort_profile_", dir=run_dir)
        profiled = DetectorPipeline(pipeline.detector, core.profiling_copy(str(Path(tmp) / "ort")), device,
                                    pipeline.spec, pipeline.thresholds)
        for batch in batches:
            profiled.run_batch(batch, timer)
        raw_trace = Path(profiled.core.session.end_profiling())
        target = run_dir / f"ort_profile__{pipeline.detector.model_id}__{pipeline.spec.input_size[0]}.json"
        os.replace(raw_trace, target)
        shutil.rmtree(tmp, ignore_errors=True)
        ort_trace = str(target)
        calls = ort_profile_calls(target)
        method = "ONNX Runtime per-node profiler (SessionOptions.enable_profiling)"
    else:
        raise ValueError(f"{type(core).__name__} has neither a torch module nor an ORT session to profile")
    totals = per_batch_totals(calls)
    return LayerPassRecord(method=method, calls=calls, by_type=summarize_by_type(calls),
                           forward_ms=[b.ms("forward") for b in timer.batches],
                           layer_sum_ms=[totals.get(i, 0.0) for i in range(len(timer.batches))], ort_trace=ort_trace)


def profile_pass(pipeline: DetectorPipeline, batches: list[list[ImageRecord]], trace_path: Path) -> ProfilePassRecord:
    """torch.profiler over a few batches, stages labelled; Chrome trace + key averages."""
    timer = StageTimer(pipeline.device, profiler_ranges=True)
    # torch.profiler records the ops of the thread that started it: NMS runs here, not on the host pool.
    on_this_thread = DetectorPipeline(pipeline.detector, pipeline.core, pipeline.device, pipeline.spec,
                                      pipeline.thresholds, host_workers=1)
    with torch_profile(pipeline.device) as prof:
        for batch in batches:
            on_this_thread.run_batch(batch, timer)
    export_trace(prof, trace_path)
    notes = []
    if getattr(pipeline.core, "torch_module", None) is None:
        notes.append("the core is not PyTorch: the forward shows as one range; see layer_timer.csv for its nodes")
    return ProfilePassRecord(str(trace_path), op_rows(prof, pipeline.device), len(batches), notes)
