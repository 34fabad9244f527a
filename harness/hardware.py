"""Hardware catalogue (harness/hardware.yaml): ids and name patterns; id derivation."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import yaml

CATALOGUE = Path(__file__).with_name("hardware.yaml")


@cache
def catalogue(path: Path = CATALOGUE) -> tuple[dict, ...]:
    """The hardware entries (safe YAML)."""
    data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    return tuple(data.get("hardware", []))


def slugify(text: str) -> str:
    """'NVIDIA GeForce RTX 5070 Ti' -> 'nvidia_geforce_rtx_5070_ti' (also strips (R)/(TM) marks)."""
    text = re.sub(r"\((r|tm|c)\)", "", text, flags=re.IGNORECASE)
    return re.sub(r"[^a-z0-9]+", "_", text.lower()).strip("_")


def _names(name: str, pattern: str) -> bool:
    """Whether `pattern` is in `name` as whole words (case-insensitive): "A100" names "NVIDIA A100-SXM4-80GB",
    not "RTX A1000"; "H200" not "GH200"."""
    return re.search(rf"(?<![a-z0-9]){re.escape(pattern.lower())}(?![a-z0-9])", name.lower()) is not None


def derive_hardware_id(gpu: str | None, cpu: str | None, cores: int | None = None) -> str:
    """A hardware id from device names: a catalogue match (GPU first: the site's ids), else a slug of the name.

    A GPU of "Orin (nvgpu)" becomes jetson_orin; a machine without a GPU gets cpu_<cpu slug>_<cores>c: a CPU's
    name alone ("AMD EPYC") does not tell a 2-core VM from a 64-core server.
    """
    gpu = (gpu or "").strip()
    if gpu.lower() in {"", "none", "n/a", "unknown", "cpu"}:
        gpu = ""
    cpu = (cpu or "").strip()
    for name in (gpu, cpu):
        if not name:
            continue
        for entry in catalogue():
            if any(_names(name, p) for p in entry.get("match", [])) and not any(
                    _names(name, p) for p in entry.get("unless", [])):
                return entry["id"]
    if gpu:
        return slugify(gpu)
    if cpu and cpu.lower() != "unknown":
        return "cpu_" + slugify(cpu) + (f"_{cores}c" if cores else "")
    return "unknown"

