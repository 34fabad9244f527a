"""`va-bench data check`: a dataset as a run reads it, counted against the annotation file itself and against
LibreYOLO's view of a YOLO dataset; refused where a run would be."""

from __future__ import annotations

import json
from collections import Counter, defaultdict

import pytest
from conftest import COCO_DIR, REPO, SUBSET_ANNOTATIONS, requires_coco, requires_yolox, run_in_process
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
    assert summary["image_formats"] == {"JPEG": 50} and summary["image_dir"] == str(COCO_DIR / "val2017")
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


@requires_coco
def test_any_model_whatever_runtime_runs_it(tmp_path):
    """The classes are the model's whatever runtime would run it: a PyTorch-only plugin is checked (no runtime is
    loaded), and engine weights too (a family's classes need no weights read)."""
    plugin = f"{REPO / 'tests' / 'plugins' / 'synthetic_detector.py'}:make_detector"
    summary = _checked("--model", plugin, "--limit", "4")
    assert summary["model"] == "synthetic-sleepy" and summary["images"] == 4
    engine = tmp_path / "m.engine"
    engine.write_bytes(b"x")
    assert _checked("--model", "yolox-nano", "--weights", str(engine), "--limit", "4")["model"] == "yolox-nano"


@requires_coco
def test_a_segmentation_model_on_boxes_only_is_refused_unless_no_masks(tmp_path):
    """The run's refusal (its masks would all miss) and its way out: --no-masks scores the boxes, as `run` does."""
    yaml_path = yolo_dataset(tmp_path / "d", images=4)
    args = ("--dataset", str(yaml_path), "--model", "dfine-seg-n", "--weights", "random")
    refused = run_in_process("data", "check", *args)
    assert refused.returncode == 2 and "score boxes only with --no-masks" in refused.stderr
    assert _checked(*args, "--no-masks")["model"] == "dfine-seg-n"


def test_whole_category_names_at_80_columns():
    """A long category name folds in its column; it is never cut."""
    from rich.console import Console

    from harness.data.summary import CategoryCount, DatasetSummary
    from harness.views.commands import print_dataset_summary

    summary = DatasetSummary({"id": "d", "split": "val", "variant": "sample"}, "coco", "a.json", 1, 1, 1, 0, 0, 0,
                             "images", {"JPEG": 1},
                             [CategoryCount(82, "refrigerator with a very long name", 1, 1, 0, 1, 0, 0,
                                            ["refrigerator"])], model="yolox-nano", unscored_model_classes=[])
    console = Console(width=80, record=True, force_terminal=False)
    print_dataset_summary(console, summary)
    text = console.export_text()
    assert "…" not in text and all(len(line) <= 80 for line in text.splitlines())
    assert "refrigera" in text and "long name" in text  # folded over lines, every character kept


@requires_coco
def test_a_jpeg_that_decodes_only_with_errors_is_named_as_a_run_names_it(tmp_path):
    """Zeroed bytes mid-file: the file looks whole and OpenCV decodes it, so only a strict decode tells. A run
    warns and records it (`corrupt_images`); data check, which makes a run's checks, says the same."""
    yaml_path = yolo_dataset(tmp_path / "d", images=4)
    image = sorted((tmp_path / "d").rglob("*.jpg"))[1]
    data = bytearray(image.read_bytes())
    data[len(data) // 3:len(data) // 3 + 2000] = bytes(2000)
    image.unlink()  # a link to the sample: the copy is the dataset's own
    image.write_bytes(bytes(data))
    summary = _checked("--dataset", str(yaml_path))
    (found,) = summary["corrupt_images"]
    assert found["path"] == str(image) and "Corrupt JPEG data" in found["problem"]
    done = run_in_process("data", "check", "--dataset", str(yaml_path))
    assert done.returncode == 0, done.stderr
    assert f"warning: {image} decodes only with errors (Corrupt JPEG" in "".join(done.stdout.split("\n"))
    assert _checked("--limit", "4")["corrupt_images"] == []
    # the run's submissions say it too (it was only in run.json), by the image's name in the dataset, and validate
    # warns of it
    out = tmp_path / "runs"
    ran = run_in_process("run", "--dataset", str(yaml_path), "--batch-sizes", "4", "--warmup-batches", "0",
                         "--warmup-seconds", "0", "--min-timed-batches", "1", "--no-energy", "--draw-images", "0",
                         "--output-dir", str(out), "--run-id", "r")
    assert ran.returncode == 0, ran.stderr
    (submission,) = (out / "r" / "submissions").glob("*.json")
    doc = json.loads(submission.read_text())
    assert doc["repro"]["dataset"]["decoded_with_errors"] == [image.name]
    checked = run_in_process("validate", str(submission), "--json")
    (finding,) = [f for r in json.loads(checked.stdout)["reports"] for f in r["findings"]
                  if f["path"] == "repro.dataset.decoded_with_errors"]
    assert finding["severity"] == "warning" and "1 image(s) decode only with errors" in finding["message"]
