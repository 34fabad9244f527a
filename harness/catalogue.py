"""What the commands that read submissions need of the catalogue, without importing a model (torch-free):
each family's size order (aggregate), the ids not on the site's support matrix yet (validate), and the
families the leaderboard names that cannot be built here (models list).

A family's ids are listed smallest first: the libreyolo families in catalogue.yaml's order, the
Ultralytics-format families by their size letter. Torchvision's detectors are different architectures,
not sizes of one, and have no order.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import yaml

SIZES = ("n", "s", "m", "l", "x")  # the Ultralytics-format families' size letters, smallest first
ULTRALYTICS_PATTERNS = {"yolov8": "yolov8{}", "yolo11": "yolo11{}", "yolov5u": "yolov5{}u", "yolo26": "yolo26{}"}
ULTRALYTICS_MODEL_IDS: dict[str, str] = {  # model id -> family, smallest first
    pattern.format(size): family for family, pattern in ULTRALYTICS_PATTERNS.items() for size in SIZES}
CATALOGUE = Path(__file__).parent / "models" / "catalogue.yaml"


@cache
def _catalogue() -> dict:
    return yaml.safe_load(CATALOGUE.read_text())


@cache
def size_ranks() -> dict[str, tuple[str, int]]:
    """Model id -> (catalogue block, rank in its size order, 0 = smallest)."""
    ranks: dict[str, tuple[str, int]] = {}
    for family, pattern in ULTRALYTICS_PATTERNS.items():
        for rank, size in enumerate(SIZES):
            ranks[pattern.format(size)] = (family, rank)
    # ranked within a catalogue block: a family's segmentation ids (dfine-seg) are not sizes of its detectors
    for key, block in _catalogue()["libreyolo"]["families"].items():
        for rank, model_id in enumerate(block["models"]):
            ranks[model_id] = (key, rank)
    return ranks


@cache
def pending_site_ids() -> frozenset[str]:
    """Catalogue ids of families the site's support matrix does not list yet (`site_matrix: pending`)."""
    return frozenset(model_id for block in _catalogue()["libreyolo"]["families"].values()
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
                 for key, block in (_catalogue().get("unavailable") or {}).items())
