"""`va-bench compare --fail-on METRIC:±X[%]`: thresholds on the deltas of a comparison (harness/results/compare.py),
each checked over every paired cell: a performance change the verdict calls noise, or an accuracy fall whose paired
interval over the images holds 0 (`--map-ci`), never fails one; a cell of A that B lacks fails every gate (B lost it:
failed, out of memory, interrupted); a gate with nothing to check is `unchecked`."""

from __future__ import annotations

import re
from dataclasses import dataclass

from harness.errors import UsageError
from harness.eval.coco_eval import STAT_NAMES
from harness.results.compare import OPERATING_POINT_KEYS, Comparison

GATE_ALIASES = {"map": "mAP_50_95", "map50": "mAP_50", "map75": "mAP_75", "f1": "op_F1"}
PERF_GATES = {"latency": ("p50_a", "p50_b"), "latency_p95": ("p95_a", "p95_b"),
              "throughput": ("ips_a", "ips_b")}
# the same figures under the names `report --gates` gives them, so that one name means one figure in both
PERF_ALIASES = {"image_p50_ms": "latency", "image_p95_ms": "latency_p95", "images_per_s": "throughput"}


@dataclass(frozen=True)
class DeltaGate:
    """One --fail-on threshold."""

    spec: str
    metric: str  # an accuracy name, or latency / latency_p95 / throughput
    threshold: float  # signed; a fraction of A when relative
    relative: bool

    def crossed(self, delta: float) -> bool:
        return delta < self.threshold if self.threshold < 0 else delta > self.threshold


GATE_PATTERN = re.compile(r"^(?P<metric>[A-Za-z0-9_]+):(?P<value>[+-](?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)"
                          r"(?P<pct>%?)$")


def parse_gate(spec: str) -> DeltaGate:
    """'map:-0.005' / 'latency:+10%' -> DeltaGate; anything else is a usage error."""
    m = GATE_PATTERN.match(spec.strip())
    if not m:
        raise UsageError(f"--fail-on {spec!r}: want METRIC:+X or METRIC:-X (optionally X%), "
                         "e.g. map:-0.005 or latency:+10%")
    name = m["metric"]
    accuracy = (*STAT_NAMES, *(n for n, _ in OPERATING_POINT_KEYS))
    metric = GATE_ALIASES.get(name.lower()) or next((s for s in accuracy if s.lower() == name.lower()), None)
    metric = metric or (name.lower() if name.lower() in PERF_GATES else PERF_ALIASES.get(name.lower()))
    if metric is None:
        raise UsageError(f"--fail-on {spec!r}: unknown metric {name!r}; use {', '.join(GATE_ALIASES)}, "
                         f"{', '.join(accuracy)}, {', '.join(PERF_GATES)} ({', '.join(PERF_ALIASES)})")
    value = float(m["value"])
    relative = m["pct"] == "%"
    if value == 0:
        raise UsageError(f"--fail-on {spec!r}: a threshold of 0 fails on noise; give a non-zero margin")
    return DeltaGate(spec, metric, value / 100 if relative else value, relative)


@dataclass(frozen=True)
class DeltaGateResult:
    gate: DeltaGate
    status: str  # ok | failed | unchecked
    detail: str
    # cells past the threshold whose paired interval of B - A holds 0 (--map-ci): the images' chance, not failed
    by_chance: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return {"gate": self.gate.spec, "metric": self.gate.metric, "status": self.status, "detail": self.detail,
                "by_chance": list(self.by_chance)}


def _fmt_delta(value: float, relative: bool) -> str:
    return f"{value:+.1%}" if relative else f"{value:+.4g}"


def check_gate(gate: DeltaGate, comparison: Comparison) -> DeltaGateResult:
    """Failed when any paired cell crosses the threshold (performance: unless the verdict says noise; mAP 50:95 and
    mAP 50 with `--map-ci`: unless the paired interval of the delta holds 0, the images' chance)."""
    crossings, checked, chance = [], 0, []
    if gate.metric in PERF_GATES:
        ka, kb = PERF_GATES[gate.metric]
        for c in comparison.cells:
            a, b = getattr(c, ka), getattr(c, kb)
            if a is None or b is None or a <= 0 or b <= 0:  # as the table: a figure of 0 is no figure
                continue
            checked += 1
            delta = b / a - 1 if gate.relative else b - a
            if gate.crossed(delta) and not c.significance.is_noise:
                crossings.append(f"{c.label} {_fmt_delta(delta, gate.relative)} ({c.significance.verdict})")
    else:
        for acc in comparison.accuracy:
            a, b = acc.a.get(gate.metric), acc.b.get(gate.metric)
            if a is None or b is None or acc.unavailable:  # unavailable: not comparable (masks against boxes)
                continue
            checked += 1
            if acc.other_images:  # the delta is as much the images' as the model's: no verdict on the model
                crossings.append(f"{acc.label}: not comparable ({acc.other_images}); gate accuracy on runs scored "
                                 "on the same images")
                continue
            if gate.relative and a == 0:
                crossings.append(f"{acc.label}: A is 0, relative change undefined")
                continue
            delta = (b - a) / a if gate.relative else b - a
            bounds = (acc.delta_interval or {}).get(gate.metric)  # of B - A, absolute even where the gate is relative
            interval = f"95 % interval of B - A {bounds[0]:+.4f} to {bounds[1]:+.4f}" if bounds else ""
            if gate.crossed(delta) and gate.threshold < 0 and bounds and bounds[0] <= 0 <= bounds[1]:
                chance.append(f"{acc.label} {_fmt_delta(delta, gate.relative)} ({interval})")
            elif gate.crossed(delta):
                crossings.append(f"{acc.label} {_fmt_delta(delta, gate.relative)}"
                                 + (f" ({interval})" if bounds else ""))
    if not comparison.cells and not comparison.accuracy and not comparison.detections:
        return DeltaGateResult(gate, "unchecked", "no cell of A pairs with one of B (see only in A / only in B)")
    if not checked:
        why = next((acc.unavailable for acc in comparison.accuracy if acc.unavailable), None)
        return DeltaGateResult(gate, "unchecked", f"no {gate.metric} measured on both sides"
                               + (f" that compares ({why})" if why and gate.metric not in PERF_GATES else ""))
    if comparison.only_a:  # a cell B lost (failed, out of memory, interrupted) is the largest regression of all
        crossings.append(f"{len(comparison.only_a)} cell(s) of A have no counterpart in B, so nothing was checked for "
                         f"them: {', '.join(comparison.only_a)}")
    if crossings:
        return DeltaGateResult(gate, "failed", "; ".join(crossings))
    threshold = gate.spec.split(":", 1)[1]
    if chance:  # past the threshold, and yet within what the images' resampling gives: said, not hidden in a pass
        return DeltaGateResult(gate, "ok", f"{checked} checked; past {threshold} only where the 95 % interval of "
                               f"B - A holds 0, so not called a fall (the images' chance; more --map-ci resamples "
                               f"steady an interval's end): {'; '.join(chance)}", tuple(chance))
    return DeltaGateResult(gate, "ok", f"{checked} checked, none beyond {threshold}")
