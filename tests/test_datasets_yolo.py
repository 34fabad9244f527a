"""YOLO-format datasets (`data.yaml` + `labels/*.txt`): read as LibreYOLO's own COCO view of them reads them, scored
like any COCO-format dataset, and refused in one line when a label row is not what the format says."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
from pathlib import Path

import pytest
from conftest import COCO_DIR, coco_from, requires_coco, requires_yolox, run_in_process
from yolo_datasets import IMAGES, libreyolo_view, one_image, sample_annotations, yolo_dataset

from harness.data.coco import CocoDataset
from harness.data.images import orientation_warning
from harness.data.yolo import label_path, read_split
from harness.errors import UsageError


@requires_coco
@pytest.mark.parametrize("polygons", [False, True])
def test_the_split_is_read_as_libreyolo_reads_it(tmp_path, polygons):
    """Independent truth: LibreYOLO's COCO view of a YOLO dataset (RF-DETR's YOLOCocoAPI): the same images, sizes,
    classes and, image by image, the same boxes (clipped to the image alike) and polygons; areas are COCO's own."""
    yaml_path = yolo_dataset(tmp_path, polygons=polygons)
    ours = CocoDataset.from_path(str(yaml_path))
    theirs = libreyolo_view(yaml_path, segments=polygons)
    assert ours.identity == (tmp_path.name.lower(), "val") and ours.annotation_format == "yolo"
    assert ours.categories == {c["id"]: c["name"] for c in theirs.cats.values()}
    assert len(ours.categories) == 80 and ours.categories[0] == "person"
    by_name = {img["file_name"]: img for img in theirs.imgs.values()}
    assert sorted(by_name) == sorted(img["file_name"] for img in ours.coco.imgs.values())
    compared = 0
    for image_id, img in ours.coco.imgs.items():
        other = by_name[img["file_name"]]
        assert (img["width"], img["height"]) == (other["width"], other["height"])
        mine = ours.coco.imgToAnns.get(image_id, [])
        their = theirs.imgToAnns[other["id"]]
        assert [a["category_id"] for a in mine] == [a["category_id"] for a in their]
        for a, b in zip(mine, their, strict=True):
            assert a["bbox"] == pytest.approx(b["bbox"], abs=1e-9)
            if polygons:
                assert a["segmentation"][0] == pytest.approx(b["segmentation"][0], abs=1e-9)
            compared += 1
    assert compared > 100
    if polygons:  # COCO's area of a polygon annotation is its shoelace area: the official file's values come back
        _, annotations, _ = sample_annotations()
        official = sorted(a["area"] for a in annotations if isinstance(a["segmentation"], list)
                          and len(a["segmentation"]) == 1)
        assert sorted(a["area"] for a in ours.coco.dataset["annotations"]) == pytest.approx(official, rel=1e-9)


@requires_coco
@requires_yolox
def test_a_run_scores_as_pycocotools_on_libreyolos_view(tmp_path):
    """A real run on a YOLO dataset: its mAP is pycocotools' on the run's own detections against LibreYOLO's COCO view
    of the same dataset (its image ids are its own: matched by file name)."""
    from pycocotools.cocoeval import COCOeval

    yaml_path = yolo_dataset(tmp_path / "data")
    out = tmp_path / "out"
    result = run_in_process("run", "--dataset", str(yaml_path.parent), "--model", "yolox-nano", "--batch-sizes", "4",
                            "--warmup-batches", "1", "--warmup-seconds", "0", "--min-timed-batches", "2",
                            "--no-energy", "--draw-images", "0", "--output-dir", str(out), "--json")
    assert result.returncode == 0, result.stderr
    (path,) = list(out.glob("*/submissions/*.json"))
    sub = json.loads(path.read_text())
    assert (sub["dataset"]["id"], sub["dataset"]["split"], sub["dataset"]["num_images"]) == ("data", "val", IMAGES)

    run = json.loads(next(out.glob("*/run.json")).read_text())
    assert run["dataset"]["annotation_format"] == "yolo" and run["dataset"]["annotation_file"] == str(yaml_path)
    ours = CocoDataset.from_path(str(yaml_path))
    theirs = libreyolo_view(yaml_path)
    to_theirs = {ours.coco.imgs[i]["file_name"]: i for i in ours.coco.imgs}
    to_theirs = {to_theirs[img["file_name"]]: img["id"] for img in theirs.imgs.values()}
    detections = json.loads(next(out.glob("*/detections/*.json")).read_text())
    assert {d["category_id"] for d in detections} <= set(range(80)) and any(d["category_id"] == 0 for d in detections)
    gt = coco_from({"images": list(theirs.imgs.values()), "annotations": list(theirs.anns.values()),
                    "categories": list(theirs.cats.values())})
    with contextlib.redirect_stdout(io.StringIO()):
        coco_eval = COCOeval(gt, gt.loadRes([dict(d, image_id=to_theirs[d["image_id"]]) for d in detections]), "bbox")
        coco_eval.evaluate(), coco_eval.accumulate(), coco_eval.summarize()
    assert sub["accuracy"]["mAP_50_95"] == pytest.approx(coco_eval.stats[0], abs=1e-12)
    assert sub["accuracy"]["mAP_50_95"] > 0.2
    # the report names the dataset and split it scored, beside the variant
    (run_dir,) = out.iterdir()
    assert run_in_process("report", str(run_dir)).returncode == 0
    assert f"· data val sample ({IMAGES} images) ·" in (run_dir / "report.html").read_text()


@requires_coco
def test_roboflow_layout_text_lists_and_folder_lists(tmp_path):
    """A Roboflow YOLO export (`val: ../valid/images` beside its data.yaml, `--split valid` for its folder's name),
    a split given as a text file of image paths, and one given as a list of folders: the same images."""
    names = "names: ['person']\n"
    rf = tmp_path / "rf"
    yolo_dataset(rf, split_folder="valid/images",
                  yaml_text=f"train: ../train/images\nval: ../valid/images\ntest: ../test/images\nnc: 1\n{names}")
    # Roboflow's person-only rows: every row's class must be a class the YAML names, so keep class 0 only
    for labels in (rf / "valid" / "labels").iterdir():
        labels.write_text("".join(line + "\n" for line in labels.read_text().splitlines() if line.startswith("0 ")))
    for split in (None, "valid", "val"):
        dataset = CocoDataset.from_path(str(rf), split)
        assert dataset.identity == ("rf", "val") and len(dataset.coco.imgs) == IMAGES
    with pytest.raises(UsageError, match=r"test: ../test/images \(.*/rf/test/images\): no such file or folder"):
        CocoDataset.from_path(str(rf), "test")
    with pytest.raises(UsageError, match=r"has no 'minival' split; use --split val or test or train"):
        CocoDataset.from_path(str(rf), "minival")
    listing = rf / "val.txt"
    files = sorted((rf / "valid" / "images").iterdir())
    listing.write_text("# the first half\n" + "".join(f"./valid/images/{p.name}\n" for p in files[:12]))
    (rf / "two.yaml").write_text(f"val: val.txt\n{names}")
    assert len(CocoDataset.from_path(str(rf / "two.yaml")).coco.imgs) == 12
    (rf / "valid" / "images" / "more").mkdir()
    for p in files[12:]:
        moved = p.parent / "more" / p.name
        p.rename(moved)
        label_path(moved).parent.mkdir(exist_ok=True)
        if label_path(p).exists():
            label_path(p).rename(label_path(moved))
    (rf / "three.yaml").write_text(f"val: [valid/images/more, val.txt]\n{names}")
    three = CocoDataset.from_path(str(rf / "three.yaml"))
    assert len(three.coco.imgs) == IMAGES and three.image_dir == rf / "valid" / "images"
    assert len(three.coco.anns) == len(CocoDataset.from_path(str(rf)).coco.anns)
    assert any("/" in img["file_name"] for img in three.coco.imgs.values())


@requires_coco
@pytest.mark.parametrize("rows, yaml_text, message", [
    ("0 0.5 0.5 0.2 0.2 0.93\n", None, r"line 1 \('0 0.5 0.5 0.2 0.2 0.93'\) has 6 values: a box with a confidence"),
    ("0 320 240 64 48\n", None, r"holds a value outside \[0, 1\]: pixel coordinates\?"),
    ("0 0.5 0.5 0.2 0.2\n2 0.5 0.5 0.1 0.1\n", None, r"line 2 .* has the class 2, which the dataset YAML does not "
                                                      r"name \(its classes: 0..1\)"),
    ("0 0.5 0.5 0.2\n", None, r"has 4 values"),
    ("0 0.1 0.1 0.5 0.5 0.9 0.1 0.2\n", None, r"has 8 values"),
    ("person 0.5 0.5 0.2 0.2\n", None, r"holds a value that is not a number"),
    ("0 0.5 0.5 nan 0.2\n", None, r"holds a value that is not finite"),
    ("\ufeff0 0.5 0.5 0.2 0.2\n", None, r"line 1 .* starts with a byte order mark .*; save the label file as UTF-8 "
                                      r"without a BOM"),
    ("0 0.5 0.5 0 0.2\n", None, r"is a box of no area"),
    ("1.5 0.5 0.5 0.2 0.2\n", None, r"has the class 1.5, which the dataset YAML does not name"),
    ("0 -0.005 0.5 0.01 0.2\n", None, r"is a box off its image"),
    ("1 0.1 0.5 0.5 0.5 0.9 0.5\n", None, r"is a polygon of no area \(its points on one line\)"),
    ("1 0.1 0.1 0.2 0.2 0.3 0.3\n", None, r"is a polygon of no area \(its points on one line\)"),
    ("0 0.5 0.5 1e-9 0.2\n", None, r"is a box .* px, of no width or height \(a rounded 0\?\)"),
    ("0 0.5 0.5 0.2 0.2\n", "val: images\nnc: 3\nnames: [person, car]\n",
     r"nc is 3 but names holds 2 classes.*; set nc: 2 \(or drop nc\)"),
    ("0 0.5 0.5 0.2 0.2\n", "val: images\n", r"has neither names nor nc"),
    ("0 0.5 0.5 0.2 0.2\n", "train: images\nnames: [person]\n", r"names no val or test split; score the training "
                                                                r"images with --split train"),
    ("0 0.5 0.5 0.2 0.2\n", "val: elsewhere\nnames: [person]\n", r"val: elsewhere .*: no such file or folder"),
    ("0 0.5 0.5 0.2 0.2\n", "val: images\nnames: [person]\nkpt_shape: [17, 3]\n", r"is a pose \(keypoint\) dataset"),
    ("0 0.5 0.5 0.2 0.2\n", "val: [images, images]\nnames: [person]\n", r"lists .* twice"),
    ("0 0.5 0.5 0.2 0.2\n", "val: images\nnames: {a: person}\n", r"names has the key 'a'"),
    ("0 0.5 0.5 0.2 0.2\n", "val: images\nnames: [person]\nval: again\n", r"is not a readable YAML file at line 3"),
    ("0 0.5 0.5 0.2 0.2\n", "- val\n", r"is not a YOLO dataset YAML \(not a mapping\)"),
    ("0 0.5 0.5 0.2 0.2\n", "", r"data.yaml: is empty"),
])
def test_what_the_format_does_not_say_is_refused_by_file_and_line(tmp_path, rows, yaml_text, message):
    args = (rows,) if yaml_text is None else (rows, yaml_text)
    yaml_path = one_image(tmp_path, *args)
    with pytest.raises(UsageError, match=message) as refused:
        CocoDataset.from_path(str(yaml_path))
    assert "\n" not in str(refused.value)


@requires_coco
def test_boxes_past_the_edge_are_clipped_as_libreyolo_clips_them(tmp_path):
    """A box whose centre is on the image but whose edge is past it (annotation tools allow it; the format only
    bounds the centre and size): clipped to the image like LibreYOLO's view, and like the model's boxes are."""
    yaml_path = one_image(tmp_path, "0 0.95 0.5 0.2 0.2\n1 0.02 0.99 0.1 0.1\n0 0.5 0.5 1.0 1.0\n")
    ours = CocoDataset.from_path(str(yaml_path))
    theirs = libreyolo_view(yaml_path)
    (image,) = ours.coco.imgs.values()
    boxes = [a["bbox"] for a in ours.coco.dataset["annotations"]]
    for mine, their in zip(boxes, [a["bbox"] for a in theirs.anns.values()], strict=True):
        assert mine == pytest.approx(their, abs=1e-9)
    assert boxes[0][0] + boxes[0][2] == image["width"] and boxes[1][0] == 0.0
    assert boxes[1][1] + boxes[1][3] == image["height"]
    assert boxes[2] == [0.0, 0.0, image["width"], image["height"]]


@requires_coco
def test_a_refusal_is_one_line_exit_2_and_leaves_no_run_folder(tmp_path):
    yaml_path = one_image(tmp_path / "data", "0 0.5 0.5 0.2 0.2 0.93\n")
    out = tmp_path / "out"
    result = run_in_process("run", "--dataset", str(yaml_path), "--model", "yolox-nano", "--output-dir", str(out))
    assert result.returncode == 2 and "has 6 values" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not out.exists()


@requires_coco
def test_labels_nowhere_are_refused_and_an_image_without_labels_is_background(tmp_path):
    yaml_path = one_image(tmp_path, "0 0.5 0.5 0.2 0.2\n")
    keep, _, _ = sample_annotations(2)
    os.symlink(COCO_DIR / "val2017" / keep[1]["file_name"], tmp_path / "images" / keep[1]["file_name"])
    dataset = CocoDataset.from_path(str(yaml_path))
    assert len(dataset.coco.imgs) == 2 and len(dataset.coco.anns) == 1  # the second image: no object
    for labels in (tmp_path / "labels").iterdir():
        labels.unlink()
    with pytest.raises(UsageError, match=r"split 'val' has 2 images and no label file \(the first image's would be "
                                         r".*/labels/.*\.txt\)"):
        CocoDataset.from_path(str(yaml_path))


@requires_coco
def test_a_label_file_whose_image_is_gone_is_refused_not_dropped(tmp_path):
    """Labels are read through the images (Ultralytics' way): a label file whose image was deleted was never read,
    and its objects silently left out of the ground truth."""
    yaml_path = yolo_dataset(tmp_path / "d", images=4)
    images = sorted((tmp_path / "d" / "images" / "val").iterdir())
    labelled = next(p for p in images if label_path(p).is_file())
    (tmp_path / "d" / "labels" / "val" / "classes.txt").write_text("person\n")  # LabelImg's, not a label file
    hidden = tmp_path / "d" / "labels" / "val" / ".ipynb_checkpoints"  # a hidden folder's, as images skip them
    hidden.mkdir()
    (hidden / "x-checkpoint.txt").write_text("0 0.5 0.5 0.2 0.2\n")
    # one file under two names (what a case-insensitive disk makes of IMG_1.txt and img_1.txt): read, no orphan
    some_label = label_path(images[0])
    if some_label.is_file():
        os.link(some_label, some_label.with_name("IMG-" + some_label.name))
    assert len(CocoDataset.from_path(str(yaml_path)).coco.imgs) == 4
    labelled.unlink()
    with pytest.raises(UsageError, match=rf"label file .*/labels/val/(IMG-)?{labelled.stem}\.txt( and 1 more)? has no "
                                         r"image in "
                                         r".*/images/val; put its image back, or remove the label file"):
        CocoDataset.from_path(str(yaml_path))
    done = run_in_process("data", "check", "--dataset", str(yaml_path))
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr


@requires_coco
def test_a_box_only_dataset_is_refused_for_masks_by_its_first_box_row(tmp_path):
    yaml_path = one_image(tmp_path, "1 0.1 0.1 0.5 0.1 0.5 0.5\n0 0.5 0.5 0.2 0.2\n")
    dataset = CocoDataset.from_path(str(yaml_path))
    variant = dataset.variant("sample")
    with pytest.raises(UsageError, match=r"1 annotations of the images to score have no mask \(the first: label "
                                         r"file .*\.txt line 2, a box\)"):
        dataset.check_masks(variant)


@requires_coco
def test_the_ground_truth_fingerprint_follows_every_label(tmp_path):
    """What a campaign's nodes compare: a YOLO split's SHA-256 changes with any label value, and only with what is
    read (a comment in the YAML changes nothing)."""
    yaml_path = one_image(tmp_path, "0 0.5 0.5 0.2 0.2\n")
    first = CocoDataset.from_path(str(yaml_path)).annotations_sha256()
    yaml_path.write_text("# mine\n" + yaml_path.read_text())
    assert CocoDataset.from_path(str(yaml_path)).annotations_sha256() == first
    label = next((tmp_path / "labels").iterdir())
    label.write_text("0 0.5 0.5 0.2 0.21\n")
    assert CocoDataset.from_path(str(yaml_path)).annotations_sha256() != first


def test_quarter_turns_are_unconfirmed_without_annotated_sizes():
    """A COCO file's width and height confirm a quarter turn; a YOLO label's fractions of the image read cannot."""
    assert orientation_warning({7: 6}) is None
    assert "1 image(s) carry an EXIF orientation that turns or mirrors them (image 7: orientation 6)" in \
        orientation_warning({7: 6}, sizes_annotated=False)


def test_label_paths_are_ultralytics_own():
    """The last images/ folder becomes labels/ (Ultralytics' img2label_paths); without one, the label lies beside
    the image."""
    assert label_path(Path("/d/images/a/images/x.jpg")) == Path("/d/images/a/labels/x.txt")
    assert label_path(Path("/d/pics/x.png")) == Path("/d/pics/x.txt")


def test_read_split_names_the_yaml_as_given(tmp_path):
    (tmp_path / "d.yaml").write_text("val: nope\nnames: [a]\n")
    with pytest.raises(UsageError, match=r"^--dataset given/d.yaml: val: nope"):
        read_split(tmp_path / "d.yaml", None, "given/d.yaml")


@requires_coco
def test_a_campaign_checks_a_yolo_datasets_layout_and_leaves_its_labels_to_its_run(tmp_path):
    """A campaign file's datasets are checked up front for their layout; a broken label is that dataset's run's
    refusal (the campaign skips it), not the whole file's. A YOLO dataset takes the campaign's split."""
    from harness.data.coco import check_custom_layout, takes_split

    yaml_path = one_image(tmp_path, "0 0.5 0.5 0.2 0.2 0.93\n", "val: images\ntest: images\nnames: [person]\n")
    assert takes_split(str(yaml_path)) and takes_split(str(tmp_path))
    check_custom_layout(str(tmp_path), "test")
    with pytest.raises(UsageError, match="has no 'train' split"):
        check_custom_layout(str(yaml_path), "train")
    with pytest.raises(UsageError, match="has 6 values"):
        CocoDataset.from_path(str(tmp_path), "test")


@requires_coco
def test_polygon_labels_score_masks_as_pycocotools_on_libreyolos_view(tmp_path):
    """A YOLO segmentation split's polygons are the ground truth of COCO `segm`: the harness's mask evaluation of
    jittered copies of the objects equals pycocotools' on LibreYOLO's view (load_segments) of the same split."""
    import numpy as np
    from pycocotools import mask as mask_utils
    from pycocotools.cocoeval import COCOeval

    from harness.eval.coco_eval import evaluate_masks_file

    yaml_path = yolo_dataset(tmp_path / "data", polygons=True)
    ours = CocoDataset.from_path(str(yaml_path))
    rng = np.random.default_rng(0)
    detections = []
    for ann in ours.coco.dataset["annotations"]:
        img = ours.coco.imgs[ann["image_id"]]
        h, w = img["height"], img["width"]
        polygon = np.array(ann["segmentation"][0]).reshape(-1, 2)
        moved = (polygon + rng.normal(0, 2, 2) + rng.normal(0, 1, polygon.shape)).clip(0, [w, h]).ravel().tolist()
        rle = mask_utils.merge(mask_utils.frPyObjects([moved], h, w))
        rle["counts"] = rle["counts"].decode()
        detections.append({"image_id": ann["image_id"], "category_id": ann["category_id"], "score": rng.uniform(),
                           "segmentation": rle, "bbox": mask_utils.toBbox(rle).tolist()})
    path = tmp_path / "masks.json"
    path.write_text(json.dumps(detections))
    stats = evaluate_masks_file(ours.coco, path, sorted(ours.coco.imgs))["segm"]

    theirs = libreyolo_view(yaml_path, segments=True)
    to_theirs = {ours.coco.imgs[i]["file_name"]: i for i in ours.coco.imgs}
    to_theirs = {to_theirs[img["file_name"]]: img["id"] for img in theirs.imgs.values()}
    gt = coco_from({"images": list(theirs.imgs.values()), "annotations": list(theirs.anns.values()),
                    "categories": list(theirs.cats.values())})
    with contextlib.redirect_stdout(io.StringIO()):
        coco_eval = COCOeval(gt, gt.loadRes([dict(d, image_id=to_theirs[d["image_id"]]) for d in detections]), "segm")
        coco_eval.evaluate(), coco_eval.accumulate(), coco_eval.summarize()
    assert 0.2 < stats["mAP_50_95"] < 0.95
    assert stats["mAP_50_95"] == pytest.approx(coco_eval.stats[0], abs=1e-12)
    assert stats["mAP_50"] == pytest.approx(coco_eval.stats[1], abs=1e-12)


@requires_coco
def test_a_repeated_label_row_is_refused_not_scored_as_two_objects(tmp_path):
    """Ultralytics drops a repeated row ('N duplicate labels removed'), LibreYOLO keeps it as a second object (a
    perfect detector's mAP halved): the harness names it, whatever its spelling ("0.50" is 0.5)."""
    yaml_path = one_image(tmp_path, "0 0.5 0.5 0.2 0.2\n1 0.3 0.3 0.1 0.1\n0 0.50 0.5 0.2 2e-1\n")
    with pytest.raises(UsageError, match=r"line 3 .* repeats line 1 \(the same object twice.*; remove the repeated"):
        CocoDataset.from_path(str(yaml_path))


@requires_coco
def test_hidden_files_and_folders_are_not_images(tmp_path):
    """Ultralytics lists a split folder with glob.glob('**/*.*', recursive=True), which skips dot files and dot
    folders: a macOS AppleDouble `._x.jpg` (copied to exFAT/SMB) is not an image, nor a copy under `.thumbs/`."""
    yaml_path = yolo_dataset(tmp_path, images=3)
    image_dir = tmp_path / "images" / "val"
    first = sorted(image_dir.iterdir())[0]
    (image_dir / f"._{first.name}").write_bytes(b"\x00\x05\x16\x07\x00\x02\x00\x00Mac OS X        " + bytes(64))
    (image_dir / ".thumbs").mkdir()
    os.symlink(first.resolve(), image_dir / ".thumbs" / first.name)
    assert len(CocoDataset.from_path(str(yaml_path)).coco.imgs) == 3


@requires_coco
def test_images_under_a_symlinked_subfolder_are_read(tmp_path):
    """glob (Ultralytics) follows a symlinked folder inside the split; Path.rglob does not, and its images are
    silently left out of the split."""
    yaml_path = yolo_dataset(tmp_path / "d", images=4)
    image_dir, labels_dir = tmp_path / "d" / "images" / "val", tmp_path / "d" / "labels" / "val"
    elsewhere = tmp_path / "elsewhere" / "images" / "cam2"
    elsewhere.mkdir(parents=True)
    (labels_dir / "cam2").mkdir()
    for image in sorted(image_dir.iterdir())[2:]:
        image.rename(elsewhere / image.name)
        if label_path(image).exists():
            label_path(image).rename(labels_dir / "cam2" / label_path(image).name)
    (image_dir / "cam2").symlink_to(elsewhere, target_is_directory=True)
    assert len(CocoDataset.from_path(str(yaml_path)).coco.imgs) == 4


@requires_coco
def test_an_image_listed_twice_through_another_spelling_is_refused(tmp_path):
    """`./images/x.jpg` and `../<root>/images/x.jpg` are one image: read twice, its boxes would count twice."""
    yaml_path = one_image(tmp_path / "root", "0 0.5 0.5 0.2 0.2\n")
    name = next((tmp_path / "root" / "images").iterdir()).name
    (tmp_path / "root" / "val.txt").write_text(f"./images/{name}\n../root/images/{name}\n")
    yaml_path.write_text("val: val.txt\nnames: [person, car]\n")
    with pytest.raises(UsageError, match=r"lists .*root/images/.* twice \(also as .*root/images/"):
        CocoDataset.from_path(str(yaml_path))


@requires_coco
def test_a_validation_key_is_the_val_split(tmp_path):
    """Ultralytics' check_det_dataset reads a YAML's `validation:` as `val:` (never 'score the training images')."""
    yaml_path = one_image(tmp_path, "0 0.5 0.5 0.2 0.2\n", "train: elsewhere\nvalidation: images\nnames: [person]\n")
    assert CocoDataset.from_path(str(yaml_path)).identity[1] == "val"


@requires_coco
def test_names_with_quoted_integer_keys_are_read_as_ultralytics_reads_them(tmp_path):
    """Ultralytics' check_class_names: `{int(k): str(v)}`, so `'0': person` is class 0."""
    yaml_path = one_image(tmp_path, "0 0.5 0.5 0.2 0.2\n", "val: images\nnames:\n  '0': person\n  '1': car\n")
    assert CocoDataset.from_path(str(yaml_path)).categories == {0: "person", 1: "car"}


@requires_coco
def test_coordinates_within_ultralytics_tolerance_are_read_and_clipped(tmp_path):
    """Ultralytics reads coordinates in [-0.01, 1.01] ('coordinate points check with 1% tolerance'): rounding, clipped
    to the image like any box past its edge (a polygon's points too); a box that does not reach the image is
    refused, and past the tolerance the refusal asks about pixel coordinates only when they look like them."""
    yaml_path = one_image(tmp_path, "0 0.95 0.5 0.1000001 1.0000001\n1 0.5 -0.000001 0.2 0.2\n"
                                     "1 -0.005 0.2 1.005 0.2 0.5 0.6\n")
    dataset = CocoDataset.from_path(str(yaml_path))
    (image,) = dataset.coco.imgs.values()
    boxes = [a["bbox"] for a in dataset.coco.dataset["annotations"]]
    assert boxes[0][1] == 0.0 and boxes[0][3] == image["height"] and boxes[1][1] == 0.0
    assert boxes[2][0] == 0.0 and boxes[2][0] + boxes[2][2] == image["width"]
    assert min(dataset.coco.dataset["annotations"][2]["segmentation"][0]) == 0.0
    for rows, message in [("0 -0.008 0.5 0.004 0.2\n", r"is a box off its image"),
                          ("0 0.5 0.5 0.2 1.02\n", r"holds a value outside \[0, 1\];"),
                          ("0 320 240 64 48\n", r"holds a value outside \[0, 1\]: pixel coordinates\?")]:
        one_image(tmp_path, rows)
        with pytest.raises(UsageError, match=message):
            CocoDataset.from_path(str(yaml_path))


@requires_coco
def test_the_yaml_of_a_folder_and_a_missing_yaml(tmp_path):
    """A folder holding one YAML not named data.yaml (coco8.yaml) is read through it, as Ultralytics'
    find_dataset_yaml reads it; several are refused by name; a YAML path that does not exist, or a folder with
    neither layout, is refused with the YOLO layout among the fixes."""
    yaml_path = one_image(tmp_path / "coco8", "0 0.5 0.5 0.2 0.2\n")
    yaml_path.rename(yaml_path.parent / "coco8.yaml")
    assert CocoDataset.from_path(str(tmp_path / "coco8")).identity == ("coco8", "val")
    (tmp_path / "coco8" / "other.yml").write_text("a: 1\n")
    with pytest.raises(UsageError, match=r"holds several YAML files and no data.yaml \(coco8.yaml, other.yml\); "
                                         r"give the YOLO dataset's YAML itself"):
        CocoDataset.from_path(str(tmp_path / "coco8"))
    with pytest.raises(UsageError, match=r"nothere/data.yaml: no such file; give a YOLO dataset's YAML"):
        CocoDataset.from_path(str(tmp_path / "nothere" / "data.yaml"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match=r"holds no COCO annotations.*or a YOLO dataset's data.yaml"):
        CocoDataset.from_path(str(tmp_path / "empty"))


@requires_coco
def test_a_folder_with_coco_annotations_is_read_as_coco_whatever_yaml_lies_beside(tmp_path):
    yaml_path = one_image(tmp_path, "0 0.5 0.5 0.2 0.2\n")
    keep, _, _ = sample_annotations(1)
    image = keep[0]
    (tmp_path / "_annotations.coco.json").write_text(json.dumps({
        "images": [image], "annotations": [], "categories": [{"id": 1, "name": "person"}]}))
    os.symlink(COCO_DIR / "val2017" / image["file_name"], tmp_path / image["file_name"])
    dataset = CocoDataset.from_path(str(tmp_path))
    assert dataset.annotation_format == "coco" and yaml_path.is_file()


@requires_coco
@requires_yolox
def test_compare_finds_a_relative_yolo_dataset_again_from_anywhere(tmp_path):
    """`compare --map-ci` re-reads the ground truth of the runs: a `--dataset data` given relative to the run's working
    directory is found from another through the YAML's absolute path that run.json records, with its split."""
    yolo_dataset(tmp_path / "data")
    (tmp_path / "data" / "data.yaml").write_text((tmp_path / "data" / "data.yaml").read_text().replace("val:", "test:"))
    for name, size in (("a", "320"), ("b", "416")):
        done = run_in_process("run", "--dataset", "data", "--model", "yolox-nano", "--batch-sizes", "8",
                              "--input-size", size, "--warmup-batches", "1", "--warmup-seconds", "0",
                              "--min-timed-batches", "1", "--no-energy", "--draw-images", "0", "--output-dir", name,
                              cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    (tmp_path / "elsewhere").mkdir()
    (a,), (b,) = (list((tmp_path / name).iterdir()) for name in ("a", "b"))
    done = run_in_process("compare", str(a), str(b), "--map-ci", "100", "--json", cwd=tmp_path / "elsewhere")
    assert done.returncode == 0, done.stderr
    (accuracy,) = json.loads(done.stdout)["comparisons"][0]["accuracy"]
    assert accuracy["delta_interval"]["images"] == IMAGES, accuracy


@requires_coco
@requires_yolox
def test_a_run_is_not_resumed_on_edited_labels(tmp_path):
    """run.json and the submissions record the ground truth's SHA-256; `--resume` on labels edited since is refused
    (its finished cells were scored on the others), accepted again with --force as a recorded difference."""
    from harness.run.resume import prepare_resume

    yaml_path = one_image(tmp_path / "data", "0 0.5 0.5 0.2 0.2\n")
    out = tmp_path / "out"
    done = run_in_process("run", "--dataset", str(yaml_path), "--model", "yolox-nano", "--batch-sizes", "1",
                          "--warmup-batches", "1", "--warmup-seconds", "0", "--min-timed-batches", "1", "--no-energy",
                          "--draw-images", "0", "--output-dir", str(out), "--run-id", "r1")
    assert done.returncode == 0, done.stderr
    recorded = json.loads((out / "r1" / "run.json").read_text())["dataset"]["annotations_sha256"]
    assert recorded == CocoDataset.from_path(str(yaml_path)).annotations_sha256()
    (sub,) = (out / "r1" / "submissions").glob("*.json")
    assert json.loads(sub.read_text())["repro"]["dataset"]["annotations_sha256"] == recorded
    assert prepare_resume("r1", str(out), {}, force=False, retry_failed=False).resume.get("forced_differences") is None
    next((tmp_path / "data" / "labels").iterdir()).write_text("0 0.5 0.5 0.2 0.3\n")
    refused = run_in_process("run", "--resume", "r1", "--output-dir", str(out))
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert f"ground truth {yaml_path} (SHA-256 {recorded[:12]} -> " in refused.stderr, refused.stderr
    forced = prepare_resume("r1", str(out), {}, force=True, retry_failed=False)
    assert any(p.startswith("ground truth") for p in forced.resume["forced_differences"])


@requires_coco
def test_image_ids_are_1_to_n_in_path_order(tmp_path):
    """Image ids 1..N follow the sorted image paths, not the folder's listing order (which the file system chooses):
    a `--limit N` run and the image_id_sha256 a campaign's nodes compare are the same on every machine."""
    yaml_path = yolo_dataset(tmp_path)
    images = CocoDataset.from_path(str(yaml_path)).coco.imgs
    assert sorted(images) == list(range(1, IMAGES + 1))
    names = [images[i]["file_name"] for i in sorted(images)]
    assert names == sorted(names)


@requires_coco
def test_images_only_in_subfolders_and_upper_case_suffixes_are_read(tmp_path):
    """A split folder whose images all lie in subfolders (one per camera) is their common folder, file names
    relative to it; `X.JPG` is an image as Ultralytics reads suffixes (lower-cased), not left out of the split."""
    yaml_path = yolo_dataset(tmp_path, images=4)
    image_dir, labels_dir = tmp_path / "images" / "val", tmp_path / "labels" / "val"
    for k, image in enumerate(sorted(image_dir.iterdir())):
        camera = "cam1" if k < 2 else "cam2"
        (image_dir / camera).mkdir(exist_ok=True)
        (labels_dir / camera).mkdir(exist_ok=True)
        moved = image_dir / camera / (image.stem + (".JPG" if k == 3 else image.suffix))
        image.rename(moved)
        if label_path(image).exists():
            label_path(image).rename(label_path(moved))
    dataset = CocoDataset.from_path(str(yaml_path))
    assert dataset.image_dir == image_dir and len(dataset.coco.imgs) == 4
    assert sorted(img["file_name"].split("/")[0] for img in dataset.coco.imgs.values()) == ["cam1"] * 2 + ["cam2"] * 2
    assert any(img["file_name"].endswith(".JPG") for img in dataset.coco.imgs.values())


@requires_coco
def test_an_image_listed_twice_through_a_linked_folder_is_refused(tmp_path):
    """A split listing a folder and a symlink to it holds each image twice: the link is resolved, not only `..`."""
    yaml_path = one_image(tmp_path, "0 0.5 0.5 0.2 0.2\n", "val: [images, again]\nnames: [person, car]\n")
    (tmp_path / "again").symlink_to(tmp_path / "images", target_is_directory=True)
    with pytest.raises(UsageError, match=r"lists .* twice \(also as "):
        CocoDataset.from_path(str(yaml_path))


@requires_coco
def test_validation_is_read_only_where_val_is_missing(tmp_path):
    """Ultralytics renames `validation:` to `val:` only when the YAML has no `val:`; a YAML with both scores val."""
    yaml_path = one_image(tmp_path, "0 0.5 0.5 0.2 0.2\n", "val: images\nvalidation: elsewhere\nnames: [person]\n")
    assert len(CocoDataset.from_path(str(yaml_path)).coco.imgs) == 1


@requires_coco
def test_polygon_points_past_the_top_and_bottom_are_clamped(tmp_path):
    """A polygon's y values within the 1 % tolerance are clamped to the image like its x values."""
    yaml_path = one_image(tmp_path, "1 0.2 -0.005 0.5 1.005 0.8 0.5\n")
    dataset = CocoDataset.from_path(str(yaml_path))
    (image,) = dataset.coco.imgs.values()
    (annotation,) = dataset.coco.dataset["annotations"]
    ys = annotation["segmentation"][0][1::2]
    assert (min(ys), max(ys)) == (0.0, image["height"])
    assert annotation["bbox"][1] == 0.0 and annotation["bbox"][3] == image["height"]


@requires_coco
@requires_yolox
def test_compare_finds_a_roboflow_split_again_with_or_without_a_relative_path(tmp_path):
    """`compare --map-ci` re-reads a COCO export's split: a relative `--dataset rf --split test` through the split's
    annotation JSON that run.json records (which takes no --split), an absolute one with the run's --split."""
    keep, annotations, categories = sample_annotations()
    for split, images in (("valid", keep[:12]), ("test", keep[12:])):
        folder = tmp_path / "rf" / split
        folder.mkdir(parents=True)
        ids = {i["id"] for i in images}
        for img in images:
            os.symlink(COCO_DIR / "val2017" / img["file_name"], folder / img["file_name"])
        (folder / "_annotations.coco.json").write_text(json.dumps({
            "images": images, "annotations": [a for a in annotations if a["image_id"] in ids],
            "categories": categories}))
    for name, size, dataset in (("a", "320", str(tmp_path / "rf")), ("b", "416", "rf")):
        done = run_in_process("run", "--dataset", dataset, "--split", "test", "--model", "yolox-nano",
                              "--batch-sizes", "4", "--input-size", size, "--warmup-batches", "1",
                              "--warmup-seconds", "0", "--min-timed-batches", "1", "--no-energy", "--draw-images", "0",
                              "--output-dir", name, cwd=tmp_path)
        assert done.returncode == 0, done.stderr
    (tmp_path / "elsewhere").mkdir()
    (a,), (b,) = (list((tmp_path / name).iterdir()) for name in ("a", "b"))
    for first, second in ((a, b), (b, a)):
        done = run_in_process("compare", str(first), str(second), "--map-ci", "100", "--json",
                              cwd=tmp_path / "elsewhere")
        assert done.returncode == 0, done.stderr
        (accuracy,) = json.loads(done.stdout)["comparisons"][0]["accuracy"]
        assert (accuracy["delta_interval"] or {}).get("images") == 12, accuracy


@requires_coco
@requires_yolox
def test_compare_tells_two_splits_and_edited_labels_apart(tmp_path):
    """Two splits of one YOLO dataset hold as many images under the same ids (1..N): the split is part of the
    dataset's coordinate, and labels edited between two runs of one split are named (annotations_sha256), so neither
    is compared as the same images (no interval, no detection diff)."""
    keep, _, _ = sample_annotations(16)
    for split, images in (("valid", keep[:8]), ("test", keep[8:])):
        (tmp_path / split / "images").mkdir(parents=True)
        (tmp_path / split / "labels").mkdir()
        for img in images:
            os.symlink(COCO_DIR / "val2017" / img["file_name"], tmp_path / split / "images" / img["file_name"])
            label_path(tmp_path / split / "images" / img["file_name"]).write_text("0 0.5 0.5 0.5 0.5\n")
    (tmp_path / "data.yaml").write_text("val: ../valid/images\ntest: ../test/images\nnames: [person]\n")

    def run(name: str, split: str) -> Path:
        done = run_in_process("run", "--dataset", str(tmp_path), "--split", split, "--model", "yolox-nano",
                              "--batch-sizes", "8", "--warmup-batches", "1", "--warmup-seconds", "0",
                              "--min-timed-batches", "1", "--no-energy", "--draw-images", "0", "--output-dir",
                              str(tmp_path / "out"), "--run-id", name)
        assert done.returncode == 0, done.stderr
        assert re.search(rf"^run {name}: \S+ {'test' if split == 'test' else 'val'} sample \(8 images\), 1 cell ",
                         done.stdout, re.M), done.stdout  # the run's first line names the dataset and split
        return tmp_path / "out" / name

    valid, test = run("valid", "valid"), run("test", "test")
    label = next((tmp_path / "valid" / "labels").iterdir())
    label.write_text("0 0.5 0.5 0.4 0.4\n")
    edited = run("edited", "valid")
    for other, reason in ((test, r"A and B scored different image sets \(\S+ val sample vs \S+ test sample"),
                          (edited, r"A and B were scored on different ground truth \(annotations_sha256 ")):
        done = run_in_process("compare", str(valid), str(other), "--map-ci", "100", "--json")
        assert done.returncode == 0, done.stderr
        comparison = json.loads(done.stdout)["comparisons"][0]
        (accuracy,) = comparison["accuracy"]
        assert accuracy["delta_interval"] is None
        assert re.search(reason, accuracy["delta_interval_unavailable"]), accuracy
        assert any("different image sets or ground truth" in note for note in comparison["notes"])


@requires_coco
@pytest.mark.parametrize("given, split", [("rf/valid", "valid"), ("rf/valid/images", "valid"),
                                          ("rf/valid/labels", "valid"), ("ul/images/val", "val")])
def test_a_split_folder_given_for_the_dataset_points_at_its_yaml(tmp_path, given, split):
    """A YOLO split's folder given as --dataset (Roboflow's valid/, valid/images, Ultralytics' images/val): the
    refusal names the dataset's YAML and the --split to give with it."""
    yolo_dataset(tmp_path / "rf", images=2, split_folder="valid/images",
                  yaml_text="val: ../valid/images\nnames: [person]\n")
    yolo_dataset(tmp_path / "ul", images=2)
    yaml_path = (tmp_path / given.split("/")[0] / "data.yaml").resolve()
    with pytest.raises(UsageError, match=rf"holds no COCO annotations; this is a YOLO split's folder: give its "
                                         rf"dataset's YAML, --dataset {re.escape(str(yaml_path))} --split {split}$"):
        CocoDataset.from_path(str(tmp_path / given))


@requires_coco
@pytest.mark.parametrize("given", ["images", "labels"])
def test_the_folder_above_the_splits_points_at_the_yaml_alone(tmp_path, given):
    """Ultralytics' images/ (images/val, images/train below it) is no split: its refusal named --split with the
    dataset's folder name."""
    yolo_dataset(tmp_path / "ul", images=2)
    yaml_path = (tmp_path / "ul" / "data.yaml").resolve()
    with pytest.raises(UsageError, match=rf"this is a YOLO dataset's {given} folder: give its dataset's YAML, "
                                         rf"--dataset {re.escape(str(yaml_path))}$"):
        CocoDataset.from_path(str(tmp_path / "ul" / given))


@requires_coco
def test_oriented_images_are_recorded_from_the_headers_read_once(tmp_path, monkeypatch):
    """A YOLO image's EXIF orientation is kept from the header its size was read from (the run warns of it, and a
    decoder that ignores EXIF is not given it): the variant does not read every header a second time."""
    from PIL import Image

    from harness.data import coco

    yaml_path = one_image(tmp_path, "0 0.5 0.5 0.2 0.2\n")
    (image,) = (tmp_path / "images").iterdir()
    pixels = Image.open(image.resolve())
    image.unlink()
    exif = Image.Exif()
    exif[0x0112] = 3  # half a turn: the size stays
    pixels.save(image, exif=exif.tobytes())
    dataset = CocoDataset.from_path(str(yaml_path))
    monkeypatch.setattr(coco, "check_image_sizes", lambda images: pytest.fail("headers read twice"))
    dataset.variant("sample")
    assert dataset.orientations == {1: 3}
    assert "turns or mirrors them (image 1: orientation 3)" in orientation_warning(dataset.orientations, False)
