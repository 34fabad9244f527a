"""Per-layer timing: forward pre/post hooks on leaf modules (PyTorch) or ONNX Runtime's own per-node
profiler. One row per module call; a summary by layer type. Runs in its own pass: hooks are removed
(and the profiling ORT session dropped) before anything else is timed."""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from harness.measure.device import Device
from harness.records import LayerCall


def _shapes(obj) -> str:
    if isinstance(obj, torch.Tensor):
        return "x".join(map(str, obj.shape))
    if isinstance(obj, (list, tuple)):
        return ";".join(s for s in (_shapes(o) for o in obj) if s)
    return ""


@contextmanager
def hook_leaf_modules(module: torch.nn.Module, device: Device, batch_index: Callable[[], int]) -> Iterator[list]:
    """Time every leaf module call (device-synced on both sides); hooks are removed on exit. A leaf that calls
    another leaf (one it holds outside its children) keeps its own time only: no time is counted twice."""
    calls: list[LayerCall] = []
    starts: dict[int, list[int]] = defaultdict(list)
    nested: list[int] = []  # per open leaf call, the nanoseconds of leaf calls made inside it
    handles = []

    def pre(mod, inputs):
        device.synchronize()
        starts[id(mod)].append(time.perf_counter_ns())
        nested.append(0)

    def post(mod, inputs, output, name):
        device.synchronize()
        elapsed = time.perf_counter_ns() - starts[id(mod)].pop()
        own = elapsed - nested.pop()
        if nested:
            nested[-1] += elapsed
        calls.append(LayerCall(batch_index(), name, type(mod).__name__, _shapes(inputs), _shapes(output),
                               own / 1e6))

    for name, mod in module.named_modules():
        if next(mod.children(), None) is None and name:
            handles.append(mod.register_forward_pre_hook(pre))
            handles.append(mod.register_forward_hook(lambda m, i, o, n=name: post(m, i, o, n)))
    try:
        yield calls
    finally:
        for handle in handles:
            handle.remove()


def ort_profile_calls(profile_file: Path) -> list[LayerCall]:
    """Node events of an ONNX Runtime profile (Chrome trace JSON), numbered by model run."""
    events = json.loads(Path(profile_file).read_text(encoding="utf-8"))
    runs = sorted(e["ts"] for e in events if e.get("cat") == "Session" and e.get("name") == "model_run")
    calls = []
    for e in events:
        if e.get("cat") != "Node" or not e.get("name", "").endswith("_kernel_time"):
            continue
        args = e.get("args", {})
        batch = sum(1 for start in runs if start <= e["ts"]) - 1
        shapes = [";".join("x".join(map(str, next(iter(d.values())))) for d in args.get(key, []) if d)
                  for key in ("input_type_shape", "output_type_shape")]
        calls.append(LayerCall(batch, e["name"].removesuffix("_kernel_time"), args.get("op_name", "?"),
                               shapes[0], shapes[1], e.get("dur", 0) / 1e3))
    return calls


def summarize_by_type(calls: list[LayerCall]) -> list[dict]:
    """Time spent per layer type: total ms, calls, share of all layer time (descending)."""
    totals: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    for c in calls:
        totals[c.type] += c.ms
        counts[c.type] += 1
    grand = sum(totals.values()) or 1.0
    return [{"layer_type": t, "total_ms": round(ms, 4), "count": counts[t], "share_pct": round(100 * ms / grand, 2)}
            for t, ms in sorted(totals.items(), key=lambda kv: -kv[1])]


def per_batch_totals(calls: list[LayerCall]) -> dict[int, float]:
    """Batch index -> the sum of its layer calls' milliseconds (against the batch's forward: layer sum / forward)."""
    out: dict[int, float] = defaultdict(float)
    for c in calls:
        out[c.batch] += c.ms
    return dict(out)
