"""The catalogue's size order within each family, without importing a model (aggregate reads it).

A family's ids are listed smallest first: the libreyolo families in catalogue.yaml's order, the
Ultralytics-format families by their size letter. Torchvision's detectors are different architectures,
not sizes of one, and have no order.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import yaml

SIZES = ("n", "s", "m", "l", "x")  # the Ultralytics-format families' size letters, smallest first
ULTRALYTICS_PATTERNS = {"yolov8": "yolov8{}", "yolo11": "yolo11{}", "yolov5u": "yolov5{}u", "yolo26": "yolo26{}"}
ULTRALYTICS_MODEL_IDS: dict[str, str] = {  # model id -> family, smallest first
    pattern.format(size): family for family, pattern in ULTRALYTICS_PATTERNS.items() for size in SIZES}
CATALOGUE = Path(__file__).with_name("catalogue.yaml")


@cache
def size_ranks() -> dict[str, tuple[str, int]]:
    """Model id -> (family, rank in the family's size order, 0 = smallest)."""
    ranks: dict[str, tuple[str, int]] = {}
    for family, pattern in ULTRALYTICS_PATTERNS.items():
        for rank, size in enumerate(SIZES):
            ranks[pattern.format(size)] = (family, rank)
    families = yaml.safe_load(CATALOGUE.read_text())["libreyolo"]["families"]
    for key, block in families.items():
        family = block.get("family", key)
        for rank, model_id in enumerate(block["models"]):
            ranks[model_id] = (family, rank)
    return ranks
