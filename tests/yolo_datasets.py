"""YOLO-format datasets written by hand from the offline COCO sample, and LibreYOLO's COCO view of them: the
fixtures of the YOLO dataset tests."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from conftest import COCO_DIR, SUBSET_ANNOTATIONS

from harness.data.yolo import label_path

IMAGES = 24


def sample_annotations(images: int = IMAGES):
    """The first `images` sample images (by id) with their non-crowd annotations, and COCO's categories by id."""
    source = json.loads(SUBSET_ANNOTATIONS.read_text())
    keep = sorted(source["images"], key=lambda i: i["id"])[:images]
    ids = {i["id"] for i in keep}
    annotations = [a for a in source["annotations"] if a["image_id"] in ids and not a["iscrowd"]]
    return keep, annotations, sorted(source["categories"], key=lambda c: c["id"])


def yolo_dataset(folder: Path, images: int = IMAGES, polygons: bool = False, split_folder: str = "images/val",
                  yaml_text: str | None = None) -> Path:
    """The sample's first images as a YOLO dataset written by hand: boxes as `class cx cy w h`, or with `polygons`
    the single-polygon annotations as `class x1 y1 ...`, normalised with Python's exact float repr; class index =
    position in COCO's category list; images symlinked; returns the YAML."""
    keep, annotations, categories = sample_annotations(images)
    index = {c["id"]: i for i, c in enumerate(categories)}
    image_dir = folder / split_folder
    image_dir.mkdir(parents=True)
    by_image: dict[int, list[str]] = {}
    for a in annotations:
        img = next(i for i in keep if i["id"] == a["image_id"])
        w, h = img["width"], img["height"]
        if polygons:
            if not isinstance(a["segmentation"], list) or len(a["segmentation"]) != 1:
                continue
            points = a["segmentation"][0]
            values = [v / (w if k % 2 == 0 else h) for k, v in enumerate(points)]
        else:
            x, y, bw, bh = a["bbox"]
            values = [(x + bw / 2) / w, (y + bh / 2) / h, bw / w, bh / h]
        by_image.setdefault(a["image_id"], []).append(" ".join([str(index[a["category_id"]]), *map(repr, values)]))
    for img in keep:
        os.symlink(COCO_DIR / "val2017" / img["file_name"], image_dir / img["file_name"])
        if img["id"] in by_image:
            labels = label_path(image_dir / img["file_name"])
            labels.parent.mkdir(parents=True, exist_ok=True)
            labels.write_text("\n".join(by_image[img["id"]]) + "\n")
    names = "".join(f"  {i}: {c['name']}\n" for i, c in enumerate(categories))
    path = folder / "data.yaml"
    path.write_text(yaml_text if yaml_text is not None else f"path: .\nval: {split_folder}\nnames:\n{names}")
    return path


def libreyolo_view(yaml_path: Path, split: str = "val", segments: bool = False):
    api = pytest.importorskip("libreyolo.data.yolo_coco_api")
    return api.create_yolo_coco_api(str(yaml_path), split=split, load_segments=segments)


def one_image(tmp_path: Path, rows: str, yaml_text: str = "val: images\nnames: [person, car]\n") -> Path:
    (tmp_path / "images").mkdir(parents=True, exist_ok=True)
    (tmp_path / "labels").mkdir(exist_ok=True)
    keep, _, _ = sample_annotations(1)
    image = tmp_path / "images" / keep[0]["file_name"]
    if not image.exists():
        os.symlink(COCO_DIR / "val2017" / keep[0]["file_name"], image)
    label_path(image).write_text(rows)
    (tmp_path / "data.yaml").write_text(yaml_text)
    return tmp_path / "data.yaml"
