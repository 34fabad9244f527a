"""A fake RF100-VL download for campaign tests: tiny datasets cut from the COCO sample, each with its own
classes (Roboflow's layout and workspace supercategory), and a fine-tuned-shaped libreyolo checkpoint per
dataset; plus one dataset whose annotation file is broken."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import COCO_DIR, SUBSET_ANNOTATIONS

DATASETS = {"cars-and-people": ("person", "car"), "pets": ("dog", "cat"), "street": ("person", "car", "bus")}
IMAGES = 6


def fake_rf100vl(root: Path, weights_root: Path) -> None:
    """<root>/<name>/test/_annotations.coco.json (Roboflow's layout, its supercategory at id 0) and a checkpoint
    per dataset whose classes are the dataset's, by name; "broken" has an annotation file that is not JSON."""
    libreyolo = pytest.importorskip("libreyolo")
    source = json.loads(SUBSET_ANNOTATIONS.read_text())
    coco_ids = {c["name"]: c["id"] for c in source["categories"]}
    for k, (name, classes) in enumerate(DATASETS.items()):
        ids = {coco_ids[c]: i + 1 for i, c in enumerate(classes)}
        anns = [dict(a, category_id=ids[a["category_id"]]) for a in source["annotations"] if a["category_id"] in ids]
        keep = sorted({a["image_id"] for a in anns})[k:k + IMAGES]
        split = root / name / "test"
        split.mkdir(parents=True)
        images = [i for i in source["images"] if i["id"] in keep]
        for image in images:
            os.symlink(COCO_DIR / "val2017" / image["file_name"], split / image["file_name"])
        (split / "_annotations.coco.json").write_text(json.dumps({
            "images": images, "annotations": [a for a in anns if a["image_id"] in keep],
            "categories": [{"id": 0, "name": name, "supercategory": "none"},
                           *({"id": i, "name": c, "supercategory": name} for c, i in
                             ((c, ids[coco_ids[c]]) for c in classes))]}))
        wrapper = libreyolo.LibreYOLOX._from_scratch(size="n", nb_classes=len(classes), device="cpu", seed=k)
        wrapper.names = dict(enumerate(classes))
        (weights_root / name).mkdir(parents=True)
        wrapper.save(str(weights_root / name / "LibreYOLOXn.pt"))
    (root / "broken" / "test").mkdir(parents=True)
    (root / "broken" / "test" / "_annotations.coco.json").write_text("{not json")
    (weights_root / "broken").mkdir()
    (weights_root / "broken" / "LibreYOLOXn.pt").write_bytes((weights_root / "pets" / "LibreYOLOXn.pt").read_bytes())
    # "broken" downloaded whole (listed), its annotation file broken at the source
    (root / "rf100vl_versions.json").write_text(json.dumps({"broken": 1, "cars-and-people": 2, "pets": 1, "street": 3}))


