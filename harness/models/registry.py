"""Model registry: names -> Detector factories, plus user plugins (`path/to/file.py:factory`)."""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.errors import UsageError
from harness.models import yolox
from harness.models.protocol import Detector


@dataclass(frozen=True)
class ModelEntry:
    """A registered model: how to build it and where its weights come from."""

    model_id: str
    family: str
    factory: Callable[[str | None], Detector]
    weights_url: str | None
    weights_file: str | None
    note: str = ""


def _yolox_entry(variant: str) -> ModelEntry:
    return ModelEntry(
        model_id=f"yolox-{variant}",
        family="yolox",
        factory=lambda weights, v=variant: yolox.YoloxDetector(v, weights),
        weights_url=yolox.RELEASE_URL.format(variant=variant),
        weights_file=f"yolox_{variant}.onnx",
        note=f"official YOLOX ONNX export, {yolox.VARIANTS[variant]}px",
    )


REGISTRY: dict[str, ModelEntry] = {e.model_id: e for e in (_yolox_entry(v) for v in yolox.VARIANTS)}
PLUGIN_PATTERN = re.compile(r"^(?P<path>.+\.py):(?P<factory>[A-Za-z_][A-Za-z0-9_]*)$")
REQUIRED_ATTRS = ("model_id", "family", "variant", "preprocess", "defaults", "backends", "class_map",
                  "weights", "load_core", "decode", "model_stats")


def load_plugin(path: str, factory_name: str) -> Detector:
    """Import a user file and call its factory; the result must follow the Detector protocol."""
    file = Path(path)
    if not file.is_file():
        raise UsageError(f"model plugin {file}: no such file")
    module_name = "va_bench_plugin_" + re.sub(r"\W", "_", file.stem)
    spec = importlib.util.spec_from_file_location(module_name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise UsageError(f"model plugin {file} failed to import: {type(exc).__name__}: {exc}") from exc
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        raise UsageError(f"model plugin {file} has no callable {factory_name!r}")
    detector = factory()
    missing = [a for a in REQUIRED_ATTRS if not hasattr(detector, a)]
    if missing:
        raise UsageError(f"{file}:{factory_name} returned an object without {', '.join(missing)} "
                         "(see harness/models/protocol.py: Detector)")
    return detector


def get_detector(spec: str, weights: str | None = None) -> Detector:
    """Build a detector from a registry id or a `file.py:factory` plugin spec."""
    match = PLUGIN_PATTERN.match(spec)
    if match:
        return load_plugin(match["path"], match["factory"])
    entry = REGISTRY.get(spec)
    if entry is None:
        raise UsageError(f"unknown model {spec!r}; known: {', '.join(REGISTRY)} (or path/to/file.py:factory)")
    return entry.factory(weights)
