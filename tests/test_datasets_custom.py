"""Datasets other than COCO val2017: scored by class name, refused when the model does not know their
classes (never a silent mAP of 0), and identified by what was loaded."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import COCO_DIR, SUBSET_ANNOTATIONS, requires_coco, requires_yolox, run_in_process

from harness.data.classes import ClassMap, match_classes, model_class_names
from harness.errors import UsageError

# three COCO classes under other ids (COCO's own: person 1, car 3, dog 18)
RENUMBERED = {"person": 7, "car": 3, "dog": 11}
RENAMED = {"person": "pedestrian", "car": "vehicle", "dog": "canine"}
IMAGES = 24


def _three_class_dataset(folder: Path, names: dict[str, str] | None = None, layout: str = "json") -> Path:
    """The first IMAGES sample images holding a person, car or dog, with those three classes' official
    boxes under the ids in RENUMBERED (and the names in `names`, COCO's when None)."""
    source = json.loads(SUBSET_ANNOTATIONS.read_text())
    coco_ids = {c["name"]: c["id"] for c in source["categories"]}
    to_new = {coco_ids[name]: new for name, new in RENUMBERED.items()}
    annotations = [dict(a, category_id=to_new[a["category_id"]]) for a in source["annotations"]
                   if a["category_id"] in to_new]
    keep = sorted({a["image_id"] for a in annotations})[:IMAGES]
    images = [img for img in source["images"] if img["id"] in keep]
    data = {"images": images, "annotations": [a for a in annotations if a["image_id"] in keep],
            "categories": [{"id": new, "name": (names or {}).get(name, name), "supercategory": "things"}
                           for name, new in RENUMBERED.items()]}
    if layout == "roboflow":  # an export's split folder: its workspace supercategory at id 0, images beside
        data["categories"].insert(0, {"id": 0, "name": "things", "supercategory": "none"})
        split = folder / "my-export" / "valid"
        image_dir, annotation = split, split / "_annotations.coco.json"
    elif layout == "coco":  # the COCO layout --coco-dir reads
        image_dir, annotation = folder / "val2017", folder / "annotations" / "instances_val2017.json"
    else:
        image_dir, annotation = folder / "images", folder / "three.json"
    image_dir.mkdir(parents=True)
    annotation.parent.mkdir(parents=True, exist_ok=True)
    for img in images:
        os.symlink(COCO_DIR / "val2017" / img["file_name"], image_dir / img["file_name"])
    annotation.write_text(json.dumps(data))
    return {"roboflow": folder / "my-export", "coco": folder}.get(layout, annotation)


def _run(tmp_path: Path, *args: str):
    out = tmp_path / "out"
    result = run_in_process("run", "--model", "yolox-nano", "--batch-sizes", "2", "--warmup-batches", "1",
                            "--warmup-seconds", "0", "--min-timed-batches", "2", "--no-energy", "--draw-images",
                            "0", "--output-dir", str(out), "--json", *args)
    return result, out


def _only_submission(out: Path) -> dict:
    (path,) = list(out.glob("*/submissions/*.json"))
    return json.loads(path.read_text())


def test_classes_match_by_name_whatever_the_ids():
    names = ("person", "bicycle", "car", "traffic light")
    assert match_classes("m", names, {7: "person", 3: "Car", 11: "traffic_light"}) == (7, -1, 3, 11)


def test_unknown_categories_are_refused_with_the_class_map_hint():
    with pytest.raises(UsageError, match=r"'widget' \(id 2\).*--class-map FILE"):
        match_classes("m", ("person", "car"), {1: "person", 2: "widget"})


def test_categories_without_boxes_need_no_class():
    """COCOeval leaves a category without ground truth out of its mean: a Roboflow split lists every class of its
    project, some annotated in other splits only. One with boxes is still refused."""
    categories = {1: "person", 2: "unicorn"}
    assert match_classes("m", ("person", "car"), categories, annotated={1}) == (1, -1)
    with pytest.raises(UsageError, match="'unicorn'"):
        match_classes("m", ("person", "car"), categories, annotated={1, 2})


def test_two_categories_of_one_name_are_refused_only_when_both_have_boxes():
    """A class map names categories, so it cannot part two of one name: the one without boxes needs no class (the
    other takes it, whichever comes first), and two with boxes are refused with a fix that works (not a class map)."""
    categories = {1: "person", 3: "car", 1000: "Car"}
    assert match_classes("m", ("person", "car"), categories, annotated={1, 3}) == (1, 3)
    assert match_classes("m", ("person", "car"), categories, annotated={1, 1000}) == (1, 1000)
    with pytest.raises(UsageError, match=r"two categories named 'Car' \(ids 3 and 1000\) with boxes; .*distinct names"):
        match_classes("m", ("person", "car"), categories, annotated={1, 3, 1000})


def test_class_map_renames_and_its_mistakes_are_named(tmp_path):
    good, bad = tmp_path / "good.yaml", tmp_path / "bad.yaml"
    good.write_text("widget: car\n")
    bad.write_text("widget: spaceship\n")
    assert match_classes("m", ("person", "car"), {1: "person", 2: "widget"}, ClassMap.read(str(good))) == (1, 2)
    with pytest.raises(UsageError, match=r"--class-map .*bad.yaml: 'widget' \(id 2\) -> 'spaceship': no class of m "):
        match_classes("m", ("person", "car"), {1: "person", 2: "widget"}, ClassMap.read(str(bad)))
    with pytest.raises(UsageError, match="both map to"):
        match_classes("m", ("person", "car"), {1: "person", 2: "human"}, ClassMap("f", {"human": "person"}))
    # a key that names no category of the dataset would rename nothing, silently
    with pytest.raises(UsageError, match=r"--class-map f: 'pedestrian' is no category of the dataset .*fix the file"):
        match_classes("m", ("person", "car"), {1: "person", 2: "car"}, ClassMap("f", {"pedestrian": "person"}))
    # a campaign's map serves all its datasets: a key of another dataset's is no mistake there
    shared = ClassMap("m.yaml", {"pedestrian": "0", "vehicle": "1"}, shared=True)
    assert match_classes("m", ("class_0", "class_1"), {1: "pedestrian"}, shared) == (1, -1)
    assert match_classes("m", ("class_0", "class_1"), {1: "vehicle"}, shared) == (-1, 1)


def test_torchvision_labels_without_a_class_are_not_scored():
    class TorchvisionLike:
        class_map = tuple(range(91))  # label = COCO id; 0 is background, 12 is unused
    names = model_class_names(TorchvisionLike())
    assert names[0] is None and names[12] is None and names[1] == "person" and names[90] == "toothbrush"


def test_class_names_given_by_index_keep_every_index_up_to_the_last():
    """Ultralytics-style `{index: name}`: label i is names[i] up to the largest index, None where an index is
    missing (no class)."""
    class Named:
        class_names = {0: "dog", 2: "car", 1: "person"}

    class Gapped:
        class_names = {0: "dog", 3: "car"}
    assert model_class_names(Named()) == ("dog", "person", "car")
    assert model_class_names(Gapped()) == ("dog", None, None, "car")


@pytest.mark.parametrize("annotated", [False, True])
def test_a_none_supercategory_with_boxes_of_its_own_is_a_class(tmp_path, annotated):
    """A Roboflow export's workspace category (supercategory "none", every other category's supercategory) is no
    class only while it has no box: one with boxes is a class like any other, its ground truth scored."""
    from harness.data.coco import CocoDataset

    categories = [{"id": 0, "name": "animals", "supercategory": "none"},
                  {"id": 1, "name": "dog", "supercategory": "animals"},
                  {"id": 2, "name": "cat", "supercategory": "animals"}]
    annotations = [{"id": i + 1, "image_id": 1, "category_id": c, "bbox": [10.0 * i, 5.0, 8.0, 8.0], "area": 64.0,
                    "iscrowd": 0} for i, c in enumerate([1, 2] + ([0] if annotated else []))]
    path = tmp_path / "export.json"
    path.write_text(json.dumps({"images": [{"id": 1, "file_name": "a.jpg", "width": 64, "height": 48}],
                                "annotations": annotations, "categories": categories}))
    dataset = CocoDataset.from_path(str(path))
    assert dataset.categories == ({0: "animals", 1: "dog", 2: "cat"} if annotated else {1: "dog", 2: "cat"})


@pytest.mark.parametrize("splits, chosen", [(("train", "test", "valid"), "valid"), (("train", "test"), "test"),
                                            (("train",), "train")])
def test_an_export_root_without_split_scores_its_validation_split_first(tmp_path, splits, chosen):
    """`--dataset EXPORT_ROOT` without --split: valid, else test, else train (never the training split while a
    held-out one is there), its annotation file and images that split's own."""
    from harness.data.coco import CocoDataset

    root = tmp_path / "my-export"
    for split in splits:
        (root / split).mkdir(parents=True)
        (root / split / "_annotations.coco.json").write_text(json.dumps(
            {"images": [], "annotations": [], "categories": [{"id": 1, "name": split}]}))
    dataset = CocoDataset.from_path(str(root))
    assert dataset.identity == ("my-export", chosen)
    assert dataset.annotation_file == (root / chosen / "_annotations.coco.json").resolve()
    assert dataset.image_dir == (root / chosen).resolve() and dataset.categories == {1: chosen}


@requires_coco
@requires_yolox
def test_renumbered_coco_classes_score_as_pycocotools_says(tmp_path):
    """Independent truth: pycocotools run directly on the saved detections and the dataset's own file."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    annotation = _three_class_dataset(tmp_path)
    result, out = _run(tmp_path, "--dataset", str(annotation))
    assert result.returncode == 0, result.stderr
    sub = _only_submission(out)
    assert sub["dataset"]["id"] == tmp_path.name.lower() and sub["dataset"]["split"] == "three"
    assert sub["dataset"]["num_images"] == IMAGES and sub["dataset"]["num_categories"] == 3
    detections = json.loads(next(out.glob("*/detections/*.json")).read_text())
    assert {d["category_id"] for d in detections} <= set(RENUMBERED.values())
    gt = COCO(str(annotation))
    coco_eval = COCOeval(gt, gt.loadRes(detections), "bbox")
    coco_eval.evaluate(), coco_eval.accumulate(), coco_eval.summarize()
    assert sub["accuracy"]["mAP_50_95"] == pytest.approx(coco_eval.stats[0], abs=1e-12)
    assert sub["accuracy"]["mAP_50_95"] > 0.2  # a real detector on three of its own classes
    findings = run_in_process("validate", str(next(out.glob("*/submissions/*.json"))))
    assert findings.returncode == 1 and "is not COCO val2017" in findings.stdout


@requires_coco
@requires_yolox
@pytest.mark.parametrize("layout", ["json", "coco"])
def test_other_names_are_refused_before_anything_is_written(tmp_path, layout):
    path = _three_class_dataset(tmp_path, RENAMED, layout)
    flag = "--coco-dir" if layout == "coco" else "--dataset"
    result, out = _run(tmp_path, flag, str(path))
    assert result.returncode == 2
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1 and "'canine' (id 11)" in line and "--class-map FILE" in line
    assert not any(out.glob("*"))


@requires_coco
@requires_yolox
def test_a_class_map_scores_a_roboflow_export_like_the_coco_names(tmp_path):
    renamed = _three_class_dataset(tmp_path / "a", RENAMED, "roboflow")
    plain = _three_class_dataset(tmp_path / "b")
    class_map = tmp_path / "map.yaml"
    class_map.write_text("".join(f"{new}: {name}\n" for name, new in RENAMED.items()))
    result, out = _run(tmp_path / "a", "--dataset", str(renamed), "--class-map", str(class_map))
    assert result.returncode == 0, result.stderr
    mapped = _only_submission(out)
    assert (mapped["dataset"]["id"], mapped["dataset"]["split"]) == ("my-export", "valid")
    assert mapped["dataset"]["num_categories"] == 3  # the workspace supercategory is no class
    recorded = mapped["repro"]["dataset"]["class_map"]  # the map's entries, not only its path
    assert recorded["entries"] == {new: name for name, new in RENAMED.items()} and len(recorded["sha256"]) == 64
    result, out = _run(tmp_path / "b", "--dataset", str(plain))
    assert result.returncode == 0, result.stderr
    assert mapped["accuracy"] == _only_submission(out)["accuracy"]


@requires_coco
def test_coco_variants_and_dataset_options_are_refused_on_other_datasets(tmp_path):
    annotation = _three_class_dataset(tmp_path)
    for args, message in [(("--dataset", str(annotation), "--subset", "mini500"), "--subset mini500 is a COCO"),
                          (("--dataset", str(annotation), "--coco-dir", str(COCO_DIR)), "name two datasets"),
                          (("--split", "valid"), "--split selects a split"),
                          (("--dataset", str(annotation), "--split", "valid"), "--split applies to a Roboflow"),
                          (("--dataset", str(tmp_path / "nope")), "no such file or folder")]:
        result, _ = _run(tmp_path, *args)
        assert result.returncode == 2 and message in result.stderr, (args, result.stderr)


@requires_coco
@requires_yolox
def test_eval_max_det_and_per_class_ap_of_a_run(tmp_path):
    """`--eval-max-det 500`: eval.maxDets and AR_max_det in the submission; the per-class file's AP of each
    category is pycocotools' own on the saved detections, restricted to that category."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    annotation = _three_class_dataset(tmp_path)
    result, out = _run(tmp_path, "--dataset", str(annotation), "--eval-max-det", "500", "--max-det", "600")
    assert result.returncode == 0, result.stderr
    sub = _only_submission(out)
    assert sub["eval"]["maxDets"] == [1, 10, 100, 500] and "AR_max_det" in sub["accuracy"]
    run_dir = next(out.glob("*"))
    per_class = json.loads((run_dir / sub["eval"]["per_class"]).read_text())
    assert per_class["eval_max_det"] == 500 and [c["id"] for c in per_class["categories"]] == [3, 7, 11]
    detections = json.loads(next(run_dir.glob("detections/*.json")).read_text())
    gt = COCO(str(annotation))
    for entry in per_class["categories"]:
        ev = COCOeval(gt, gt.loadRes(detections), "bbox")
        ev.params.catIds, ev.params.maxDets = [entry["id"]], [1, 10, 500]  # summarize's mAP_50 reads maxDets[2]
        ev.evaluate(), ev.accumulate(), ev.summarize()
        assert entry["AP50"] == pytest.approx(ev.stats[1], abs=1e-6), entry


def _fine_tuned_checkpoint(path: Path, names: dict[int, str] | None) -> None:
    """A libreyolo YOLOX-Nano checkpoint for 3 classes, saved with libreyolo's own `save` (its `nc`, and its
    `names` when given; libreyolo calls them class_0.. otherwise)."""
    libreyolo = pytest.importorskip("libreyolo")
    wrapper = libreyolo.LibreYOLOX._from_scratch(size="n", nb_classes=3, device="cpu", seed=3)
    if names is not None:
        wrapper.names = names
    wrapper.save(str(path))


@requires_coco
def test_fine_tuned_weights_match_the_dataset_by_their_own_class_names(tmp_path):
    """A checkpoint with `nc` 3 named person/car/dog scores the renumbered dataset by name (detections only
    under its 3 ids); one whose classes are class_0.. is refused (counts and names in the line), and scores
    with a class map by index."""
    from harness.models.libreyolo import LibreYoloDetector

    annotation = _three_class_dataset(tmp_path / "data")
    named, unnamed = tmp_path / "named.pt", tmp_path / "unnamed.pt"
    _fine_tuned_checkpoint(named, {0: "dog", 1: "person", 2: "car"})
    _fine_tuned_checkpoint(unnamed, None)
    assert LibreYoloDetector("yolox-nano", str(named)).class_names == ("dog", "person", "car")
    result, out = _run(tmp_path / "a", "--weights", str(named), "--backend", "pytorch", "--dataset", str(annotation))
    assert result.returncode == 0, result.stderr
    sub = _only_submission(out)
    assert isinstance(sub["accuracy"]["mAP_50_95"], float) and sub["dataset"]["num_categories"] == 3
    detections = json.loads(next(out.glob("*/detections/*.json")).read_text())
    assert detections and {d["category_id"] for d in detections} <= set(RENUMBERED.values())
    refused, out = _run(tmp_path / "b", "--weights", str(unnamed), "--backend", "pytorch", "--dataset", str(annotation))
    assert refused.returncode == 2 and "the dataset has 3 classes, yolox-nano 3: class_0" in refused.stderr
    class_map = tmp_path / "map.yaml"
    class_map.write_text("dog: 0\nperson: 1\ncar: 2\n")
    mapped, out = _run(tmp_path / "c", "--weights", str(unnamed), "--backend", "pytorch", "--dataset", str(annotation),
                       "--class-map", str(class_map))
    assert mapped.returncode == 0, mapped.stderr


@requires_coco
def test_coco_images_without_people_are_still_coco(tmp_path):
    """'person' is also a COCO supercategory: with no person in the images it is still a class (the Roboflow
    workspace rule applies to --dataset exports only)."""
    from harness.data.coco import CocoDataset

    source = json.loads(SUBSET_ANNOTATIONS.read_text())
    with_people = {a["image_id"] for a in source["annotations"] if a["category_id"] == 1}
    images = [i for i in source["images"] if i["id"] not in with_people][:5]
    keep = {i["id"] for i in images}
    (tmp_path / "annotations").mkdir()
    (tmp_path / "val2017").mkdir()
    for image in images:
        os.symlink(COCO_DIR / "val2017" / image["file_name"], tmp_path / "val2017" / image["file_name"])
    (tmp_path / "annotations" / "instances_val2017.json").write_text(json.dumps(
        {**source, "images": images, "annotations": [a for a in source["annotations"] if a["image_id"] in keep]}))
    dataset = CocoDataset(tmp_path)
    assert len(dataset.categories) == 80 and dataset.identity == ("coco2017", "val2017")


@requires_coco
@pytest.mark.parametrize("images", ["val2017", "images/val2017"])
def test_an_annotation_file_in_cocos_layout_finds_its_images(tmp_path, images):
    """COCO's own layout (detectron2's and YOLOX's too): root/annotations/instances_<split>.json with the images in
    root/<split>/ or root/images/<split>/; the dataset is the root's, the split the file's."""
    from harness.data.coco import CocoDataset

    root = _three_class_dataset(tmp_path / "mine", layout="coco")
    if images != "val2017":
        (root / images).parent.mkdir()
        (root / "val2017").rename(root / images)
    dataset = CocoDataset.from_path(str(root / "annotations" / "instances_val2017.json"))
    variant = dataset.variant("sample")
    assert variant.num_images == IMAGES and dataset.image_dir == (root / images).resolve()
    assert dataset.identity == ("mine", "val2017")
    assert all(r.path.is_file() for r in dataset.records(variant))
    # an images/ folder beside the file that holds them comes first, under the file's own names
    beside = root / "annotations" / "images"
    beside.mkdir()
    for image in dataset.coco.dataset["images"]:
        os.symlink((root / images / image["file_name"]).resolve(), beside / image["file_name"])
    dataset = CocoDataset.from_path(str(root / "annotations" / "instances_val2017.json"))
    assert dataset.image_dir == beside.resolve() and dataset.identity == ("annotations", "instances_val2017")


@requires_coco
def test_the_root_of_cocos_layout_is_its_annotation_file(tmp_path):
    """root/ with annotations/instances_<split>.json: the same dataset as that file; with several splits, the one
    starting "val" where there is one, else --split; a split it lacks is refused naming those it has. COCO val2017's
    own root is sent to --coco-dir (as --dataset its rows would be another dataset's)."""
    from harness.data.coco import CocoDataset

    root = _three_class_dataset(tmp_path / "mine", layout="coco")
    with pytest.raises(UsageError, match=rf"is COCO val2017 in its own layout.*; give it as --coco-dir {root}"):
        CocoDataset.from_path(str(root))
    (root / "annotations" / "instances_val2017.json").rename(root / "annotations" / "instances_val.json")
    (root / "val2017").rename(root / "val")
    from_file = CocoDataset.from_path(str(root / "annotations" / "instances_val.json"))
    from_root = CocoDataset.from_path(str(root))
    assert from_root.identity == from_file.identity == ("mine", "val")
    assert from_root.annotation_file == from_file.annotation_file and from_root.image_dir == from_file.image_dir
    shutil.copy(root / "annotations" / "instances_val.json", root / "annotations" / "instances_train.json")
    os.symlink(root / "val", root / "train")
    assert CocoDataset.from_path(str(root)).identity == ("mine", "val")
    assert CocoDataset.from_path(str(root), split="train").identity == ("mine", "train")
    with pytest.raises(UsageError, match=r"has no 'test' split; use --split train or val$"):
        CocoDataset.from_path(str(root), split="test")
    (root / "annotations" / "instances_val.json").rename(root / "annotations" / "instances_other.json")
    with pytest.raises(UsageError, match=r"holds the splits other, train; use --split other or train$"):
        CocoDataset.from_path(str(root))


@requires_coco
def test_missing_images_name_every_folder_looked_in(tmp_path):
    from harness.data.coco import CocoDataset

    root = _three_class_dataset(tmp_path / "mine", layout="coco")
    (root / "val2017").rename(root / "elsewhere")
    dataset = CocoDataset.from_path(str(root / "annotations" / "instances_val2017.json"))
    with pytest.raises(UsageError, match=rf"put the image files in {root.resolve()}/annotations \(also looked in "
                                         rf"{root.resolve()}/val2017, {root.resolve()}/images/val2017, "
                                         rf"{root.resolve()}/images\)"):
        dataset.variant("sample")


@requires_coco
def test_an_annotation_file_given_by_its_name_alone_is_its_folders_dataset(tmp_path, monkeypatch):
    from harness.data.coco import CocoDataset

    annotation = _three_class_dataset(tmp_path / "street-scenes")
    monkeypatch.chdir(annotation.parent)
    assert CocoDataset.from_path(annotation.name).identity == ("street-scenes", "three")


@requires_coco
def test_file_names_in_subfolders_of_the_image_folder_are_read(tmp_path):
    """An export whose file names hold folders (Label Studio's images/<name>, a dataset's per-sequence folders): each
    image is the file at that path under the image folder, the one the probe finds them in (here beside the file)."""
    from harness.data.coco import CocoDataset

    annotation = _three_class_dataset(tmp_path / "mine")
    data = json.loads(annotation.read_text())
    nested = tmp_path / "mine" / "frames" / "seq1"
    nested.mkdir(parents=True)
    for image in data["images"]:
        (tmp_path / "mine" / "images" / image["file_name"]).rename(nested / image["file_name"])
        image["file_name"] = "frames/seq1/" + image["file_name"]
    annotation.write_text(json.dumps(data))
    dataset = CocoDataset.from_path(str(annotation))
    variant = dataset.variant("sample")
    assert variant.num_images == IMAGES and dataset.image_dir == (tmp_path / "mine").resolve()
    assert all(r.path.parent == nested.resolve() and r.path.is_file() for r in dataset.records(variant))


@requires_coco
@pytest.mark.parametrize("layout", ["fiftyone", "datumaro-flat"])
def test_the_exports_of_other_labelling_tools_find_their_images(tmp_path, layout):
    """FiftyOne's COCODetectionDataset (labels.json beside data/) and an export with root/annotations/ beside
    root/images/ (CVAT through Datumaro without subset folders)."""
    from harness.data.coco import CocoDataset

    annotation = _three_class_dataset(tmp_path / "export")
    root = tmp_path / "export"
    if layout == "fiftyone":
        (root / "images").rename(root / "data")
        annotation = annotation.rename(root / "labels.json")
        images, identity = root / "data", ("export", "labels")
    else:
        (root / "annotations").mkdir()
        annotation = annotation.rename(root / "annotations" / "instances_default.json")
        images, identity = root / "images", ("export", "default")
    dataset = CocoDataset.from_path(str(annotation))
    assert dataset.variant("sample").num_images == IMAGES
    assert dataset.image_dir == images.resolve() and dataset.identity == identity


@requires_coco
def test_refusals_name_what_to_change(tmp_path):
    """A Roboflow export whose default split is empty names that split and the ones to score instead; a class map
    given as a folder says so; an unreadable image's reason is not cut short by the path it repeats."""
    from harness.data.classes import ClassMap
    from harness.data.coco import CocoDataset

    export = _three_class_dataset(tmp_path / "rf", layout="roboflow")
    annotation = export / "valid" / "_annotations.coco.json"
    shutil.copytree(export / "valid", export / "test", symlinks=True)
    data = json.loads(annotation.read_text())
    annotation.write_text(json.dumps({**data, "images": [], "annotations": []}))
    with pytest.raises(UsageError, match=r"is empty in the 'valid' split's _annotations.coco.json under .*: it lists "
                                         r"no images; score another split \(--split test\)"):
        CocoDataset.from_path(str(export)).variant("sample")
    with pytest.raises(UsageError, match=r"--class-map .*: is a folder; give a YAML file"):
        ClassMap.read(str(tmp_path))
    folder = tmp_path / ("a-long-folder-name-" * 6)
    garbage = _three_class_dataset(folder, layout="json")
    image = sorted((folder / "images").iterdir())[0]
    image.unlink()
    image.write_bytes(b"\xff\xd8\xff" + b"not an image at all" * 10 + b"\xff\xd9")  # whole from the outside
    with pytest.raises(UsageError, match=r"cannot be read as an image \(cannot identify image file\); replace it"):
        CocoDataset.from_path(str(garbage)).variant("sample")


@requires_coco
def test_a_roboflow_splits_annotation_file_is_named_as_its_folder_is(tmp_path):
    """exports/cars/valid/_annotations.coco.json is cars / valid, as the folder exports/cars/valid is (it was
    valid / _annotations.coco: a campaign of such files then read as scored on different splits)."""
    from harness.data.coco import CocoDataset

    export = _three_class_dataset(tmp_path / "rf", layout="roboflow")
    by_file = CocoDataset.from_path(str(export / "valid" / "_annotations.coco.json"))
    assert by_file.identity == CocoDataset.from_path(str(export / "valid")).identity == ("my-export", "valid")


@requires_coco
def test_a_file_outside_an_annotations_folder_is_its_own_folders_dataset(tmp_path):
    """COCO's layout is root/annotations/<file>: a file in any other folder (P/myexport/annotations.json) took the
    images of P/images/ and the id "p"; it is now myexport's, whose images are beside it or in its images/."""
    from harness.data.coco import CocoDataset

    root = _three_class_dataset(tmp_path / "mine", layout="coco")
    export = tmp_path / "P" / "myexport"
    export.mkdir(parents=True)
    shutil.copy(root / "annotations" / "instances_val2017.json", export / "annotations.json")
    shutil.copytree(root / "val2017", tmp_path / "P" / "images")
    dataset = CocoDataset.from_path(str(export / "annotations.json"))
    with pytest.raises(UsageError, match=r"image files absent.*; put the image files in .*/P/myexport"):
        dataset.variant("sample")
    (tmp_path / "P" / "images").rename(export / "images")
    dataset = CocoDataset.from_path(str(export / "annotations.json"))
    assert dataset.variant("sample").num_images == IMAGES and dataset.identity == ("myexport", "annotations")


def test_dataset_ids_keep_letters_of_any_script():
    """Two folders named in another script were both "dataset", and so one row in aggregate."""
    from harness.data.coco import _slug

    assert (_slug("日本"), _slug("中国"), _slug("c_données_日本"), _slug("MyData")) == \
        ("日本", "中国", "c_données_日本", "mydata")
    assert _slug("cafe\u0301") == _slug("caf\u00e9") == "café"  # one name, however the file system composed it
    assert (_slug("a b/c"), _slug("..."), _slug("***")) == ("a-b-c", "dataset", "dataset")
    # scripts whose letters carry combining signs keep them: three Hindi words were all "क-ल"
    assert len({_slug("किला"), _slug("कुला"), _slug("केला")}) == 3 and _slug("தமிழ்") == "தமிழ்"


@requires_coco
def test_an_image_named_in_another_unicode_composition_is_told_apart(tmp_path):
    """An annotation's file name in NFC and the file in NFD (as a macOS folder writes it) look alike: the refusal
    shows both, escaped, and says what differs."""
    import unicodedata

    from harness.data.coco import CocoDataset

    annotation = _three_class_dataset(tmp_path / "d")
    images = annotation.parent / "images"
    data = json.loads(annotation.read_text())
    first = data["images"][0]
    composed = "caf\u00e9-" + first["file_name"]
    (images / first["file_name"]).rename(images / unicodedata.normalize("NFD", composed))
    first["file_name"] = composed
    annotation.write_text(json.dumps(data))
    with pytest.raises(UsageError, match=r"'caf\\xe9-.*' is there as 'cafe\\u0301-.*', the same name composed "
                                         r"otherwise \(Unicode NFC/NFD\): rename the files"):
        CocoDataset.from_path(str(annotation)).variant("sample")
