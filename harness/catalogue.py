"""What commands need of the catalogue without importing a model (torch-free): every model id (a run refuses
an unknown one before torch is imported), each family's size order (aggregate), the ids not on the site's
support matrix yet (validate), and the families the leaderboard names that cannot be built here (models list).

A family's ids are listed smallest first: the libreyolo families in catalogue.yaml's order, the
Ultralytics-format families by their size letter. Torchvision's detectors are different architectures,
not sizes of one, and have no order.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

from harness.errors import UsageError

SIZES = ("n", "s", "m", "l", "x")  # the Ultralytics-format families' size letters, smallest first
ULTRALYTICS_PATTERNS = {"yolov8": "yolov8{}", "yolo11": "yolo11{}", "yolov5u": "yolov5{}u", "yolo26": "yolo26{}"}
# Ultralytics-format segmentation exports users bring (boxes, coefficients and prototypes): model id -> family
ULTRALYTICS_SEGMENT_PATTERNS = {"yolov8": "yolov8{}-seg", "yolo11": "yolo11{}-seg"}
ULTRALYTICS_SEGMENT_IDS: dict[str, str] = {
    pattern.format(size): family for family, pattern in ULTRALYTICS_SEGMENT_PATTERNS.items() for size in SIZES}
ULTRALYTICS_MODEL_IDS: dict[str, str] = {  # model id -> family, smallest first
    **{pattern.format(size): family for family, pattern in ULTRALYTICS_PATTERNS.items() for size in SIZES},
    **ULTRALYTICS_SEGMENT_IDS}
ULTRALYTICS_INPUT_SIZE = 640  # the families' published input size (a fixed-size export states its own)
CATALOGUE = Path(__file__).parent / "models" / "catalogue.yaml"
PLUGIN_PATTERN = re.compile(r"^(?P<path>.+\.py):(?P<factory>[A-Za-z_][A-Za-z0-9_]*)$")  # --model file.py:factory
YOLOX_VARIANTS = {"nano": 416, "tiny": 416, "s": 640, "m": 640, "l": 640, "x": 640}  # -> the release's input size
TORCHVISION_IDS = ("ssdlite320_mobilenet_v3_large", "fasterrcnn_mobilenet_v3_large_320_fpn",
                   "retinanet_resnet50_fpn_v2", "fcos_resnet50_fpn")


def catalogue_data(path: Path | None = None) -> dict:
    """catalogue.yaml (or another file of its form) as loaded, once per process and file (libyaml's safe loader
    where PyYAML has it: 6x faster than the pure-Python one, the same safe constructor)."""
    return _loaded(path or CATALOGUE)


@cache
def _loaded(path: Path) -> dict:
    return yaml.load(path.read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


@cache
def size_ranks() -> dict[str, tuple[str, int]]:
    """Model id -> (catalogue block, rank in its size order, 0 = smallest)."""
    ranks: dict[str, tuple[str, int]] = {}
    for family, pattern in ULTRALYTICS_PATTERNS.items():
        for rank, size in enumerate(SIZES):
            ranks[pattern.format(size)] = (family, rank)
    for family, pattern in ULTRALYTICS_SEGMENT_PATTERNS.items():
        for rank, size in enumerate(SIZES):
            ranks[pattern.format(size)] = (f"{family}-seg", rank)
    # ranked within a catalogue block: a family's segmentation ids (dfine-seg) are not sizes of its detectors
    for key, block in catalogue_data()["libreyolo"]["families"].items():
        for rank, model_id in enumerate(block["models"]):
            ranks[model_id] = (key, rank)
    return ranks




@cache
def segment_ids() -> frozenset[str]:
    """Registry ids of segmentation models (task segment): their masks are computed and scored."""
    return frozenset(model_id for block in catalogue_data()["libreyolo"]["families"].values()
                     if block.get("task") == "segment" for model_id in block["models"]) | set(ULTRALYTICS_SEGMENT_IDS)


@cache
def topk_protocols() -> dict[str, tuple[float, int]]:
    """Model id -> (conf, max_det) that libreyolo's validator applies to an NMS-free (top-k) model whatever it is
    asked: the site's rows of these models state the site's protocol (conf 0.001, max_det 300) for this one."""
    out = {}
    for block in catalogue_data()["libreyolo"]["families"].values():
        post = block.get("postprocess") or {}
        if post.get("kind") != "topk":
            continue
        for model_id, entry in block["models"].items():
            merged = {**post, **((entry or {}).get("postprocess") or {})}
            out[model_id] = (float(merged["conf"]), int(merged["max_det"]))
    return out


@cache
def pending_site_ids() -> frozenset[str]:
    """Catalogue ids of families the site's support matrix does not list yet (`site_matrix: pending`)."""
    return frozenset(model_id for block in catalogue_data()["libreyolo"]["families"].values()
                      if block.get("site_matrix") == "pending" for model_id in block["models"])


@dataclass(frozen=True)
class UnavailableFamily:
    """A family the leaderboard or its harness names that this catalogue cannot build, and why."""

    family: str
    ids: tuple[str, ...]
    why: str


@cache
def unavailable_families() -> tuple[UnavailableFamily, ...]:
    return tuple(UnavailableFamily(block.get("family", key), tuple(block["ids"]), block["why"])
                 for key, block in (catalogue_data().get("unavailable") or {}).items())


@cache
def native_input_sizes() -> dict[str, int]:
    """Model id -> the input size it is published at, where the catalogue states it (YOLOX, the Ultralytics-format
    and LibreYOLO families; torchvision's are their builders' own)."""
    sizes = {f"yolox-{v}": size for v, size in YOLOX_VARIANTS.items()}
    sizes.update(dict.fromkeys(ULTRALYTICS_MODEL_IDS, ULTRALYTICS_INPUT_SIZE))
    for block in catalogue_data()["libreyolo"]["families"].values():
        sizes.update({model_id: int(entry["input_size"]) for model_id, entry in block["models"].items()})
    return sizes


@cache
def model_ids() -> tuple[str, ...]:
    """Every registry id, in `va-bench models list` order (the registry builds exactly these; a test checks)."""
    ids = [f"yolox-{v}" for v in YOLOX_VARIANTS] + list(TORCHVISION_IDS) + list(ULTRALYTICS_MODEL_IDS)
    ids += [m for block in catalogue_data()["libreyolo"]["families"].values() for m in block["models"]]
    return tuple(dict.fromkeys(ids))


def check_model_id(spec: str) -> None:
    """A one-line UsageError for an id the registry does not have: why, when the leaderboard names it but it
    cannot be built here; else the closest ids."""
    ids = model_ids()
    if spec in ids:
        return
    missing = next((u for u in unavailable_families() if spec in u.ids), None)
    if missing is not None:
        raise UsageError(f"{spec} is not available: {missing.why}; `va-bench models list` shows what runs")
    close = difflib.get_close_matches(spec, list(ids), n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(close)}? " if close else ""
    raise UsageError(f"unknown model {spec!r}; {hint}`va-bench models list` shows the {len(ids)} ids (or give "
                     "a plugin path/to/file.py:factory)")
