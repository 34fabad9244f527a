"""`va-bench data check`: a dataset as a run reads it, counted against the annotation file itself and against
LibreYOLO's view of a YOLO dataset; refused where a run would be."""

from __future__ import annotations

import json
from collections import Counter, defaultdict

import pytest
from conftest import SUBSET_ANNOTATIONS, requires_coco, requires_yolox, run_in_process
from yolo_datasets import libreyolo_view, one_image, yolo_dataset


def _checked(*args: str) -> dict:
    done = run_in_process("data", "check", *args, "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@requires_coco
def test_the_sample_counted_as_its_annotation_file_says():
    """Independent truth: the annotation file read with json, COCO's area ranges applied by hand."""
    summary = _checked("--limit", "50")
    raw = json.loads(SUBSET_ANNOTATIONS.read_text())
    ids = sorted(i["id"] for i in raw["images"])[:50]
    anns = [a for a in raw["annotations"] if a["image_id"] in set(ids)]
    objects = [a for a in anns if not a["iscrowd"]]
    assert (summary["images"], summary["objects"], summary["crowd"]) == (50, len(objects), len(anns) - len(objects))
    assert summary["images_with_objects"] == len({a["image_id"] for a in objects})
    assert summary["dataset"]["id"] == "coco2017" and summary["annotation_format"] == "coco"
    by_category = {c["id"]: c for c in summary["categories"]}
    assert len(by_category) == 80
    images = defaultdict(set)
    for a in objects:
        images[a["category_id"]].add(a["image_id"])
    for category, count in Counter(a["category_id"] for a in objects).items():
        c = by_category[category]
        assert (c["objects"], c["images"]) == (count, len(images[category]))
        areas = [a["area"] for a in objects if a["category_id"] == category]
        assert (c["small"], c["medium"], c["large"]) == (sum(x < 1024 for x in areas),
                                                         sum(1024 <= x < 9216 for x in areas),
                                                         sum(x >= 9216 for x in areas))
    assert sum(c["crowd"] for c in by_category.values()) == summary["crowd"]


@requires_coco
def test_a_yolo_split_counted_as_libreyolo_reads_it(tmp_path):
    yaml_path = yolo_dataset(tmp_path / "d")
    summary = _checked("--dataset", str(yaml_path))
    theirs = libreyolo_view(yaml_path)
    counts = Counter(a["category_id"] for a in theirs.anns.values())
    assert {c["id"]: c["objects"] for c in summary["categories"] if c["objects"]} == dict(counts)
    assert summary["annotation_format"] == "yolo" and summary["dataset"]["split"] == "val"


@requires_coco
@requires_yolox
def test_with_a_model_each_category_shows_the_class_it_scores_as(tmp_path):
    """--model: the class each category scores as (a class map renames one), the model's classes the dataset has no
    category for; a category no class names is the run's refusal, one line, exit 2."""
    yaml_path = one_image(tmp_path, "0 0.5 0.5 0.2 0.2\n1 0.3 0.3 0.1 0.1\n",
                           "val: images\nnames: [pedestrian, car]\n")
    (tmp_path / "map.yaml").write_text("pedestrian: person\n")
    summary = _checked("--dataset", str(yaml_path), "--model", "yolox-nano", "--class-map", str(tmp_path / "map.yaml"))
    assert [(c["name"], c["model_classes"]) for c in summary["categories"]] == [("pedestrian", ["person"]),
                                                                                 ("car", ["car"])]
    assert len(summary["unscored_model_classes"]) == 78 and "dog" in summary["unscored_model_classes"]
    refused = run_in_process("data", "check", "--dataset", str(yaml_path), "--model", "yolox-nano")
    assert refused.returncode == 2 and "'pedestrian'" in refused.stderr and "--class-map" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1


@requires_coco
@pytest.mark.parametrize("args, message", [
    (("--split", "val"), "--split selects a split of a --dataset"),
    (("--weights", "x.onnx"), "--weights goes with --model"),
    (("--subset", "nope"), "unknown dataset variant 'nope'"),
])
def test_what_a_run_refuses_data_check_refuses(args, message):
    done = run_in_process("data", "check", *args)
    assert done.returncode == 2 and message in done.stderr, done.stderr
