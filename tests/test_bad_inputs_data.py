"""Bad dataset input: each broken annotation or image file is one clear line on
stderr, exit 2, and nothing under --output-dir. The bad files are built from the real COCO sample."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import re
import shutil
from types import SimpleNamespace

import cv2
import numpy as np
import pytest
from conftest import COCO_DIR, SUBSET_ANNOTATIONS, requires_coco, run_in_process

from harness.data.coco import load_instances
from harness.data.images import (
    check_image_files,
    find_corrupt_images,
    find_corrupt_images_in_background,
    image_file_problem,
)
from harness.errors import UsageError

N_IMAGES = 4
ANNOTATIONS = "annotations/instances_val2017_subset.json"


@pytest.fixture(scope="module")
def sample():
    """The annotations of the first N_IMAGES sample images, and their file names."""
    if not SUBSET_ANNOTATIONS.is_file():
        pytest.skip(f"COCO sample not found at {COCO_DIR}")
    data = json.loads(SUBSET_ANNOTATIONS.read_text())
    images = sorted(data["images"], key=lambda i: i["id"])[:N_IMAGES]
    ids = {i["id"] for i in images}
    data["images"] = images
    data["annotations"] = [a for a in data["annotations"] if a["image_id"] in ids]
    return data


def _coco_dir(tmp_path, data, sample):
    """A COCO root in tmp_path: `data` as the annotation file, copies of the sample's real images."""
    root = tmp_path / "coco"
    (root / "annotations").mkdir(parents=True)
    (root / "val2017").mkdir()
    (root / ANNOTATIONS).write_text(json.dumps(data))
    for image in sample["images"]:
        shutil.copy(COCO_DIR / "val2017" / image["file_name"], root / "val2017")
    return root


def _edit(data, fn):
    data = copy.deepcopy(data)
    fn(data)
    return data


def _first_image(root, data):
    return root / "val2017" / sorted(data["images"], key=lambda i: i["id"])[0]["file_name"]


def _truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


ANNOTATION_ROWS = {
    "annotations are a JSON list": (lambda d: [d], "top level is a JSON list"),
    "image without file_name": (lambda d: _edit(d, lambda x: x["images"][1].pop("file_name")),
                                "images[1].file_name: field required"),
    "no categories": (lambda d: _edit(d, lambda x: x.pop("categories")), "categories: field required"),
    'bbox: "x"': (lambda d: _edit(d, lambda x: x["annotations"][2].update(bbox="x")),
                  "annotations[2].bbox: input should be a valid list"),
}
def _halve(path):
    image = cv2.imread(str(path))
    cv2.imwrite(str(path), cv2.resize(image, (image.shape[1] // 2, image.shape[0] // 2)))


IMAGE_ROWS = {
    "zero-byte JPEG": (lambda p: p.write_bytes(b""), "is empty (0 bytes)"),
    "image of another size": (_halve, "but its annotations say"),
    "truncated JPEG": (_truncate, "is truncated"),
    "random bytes": (lambda p: p.write_bytes(np.random.default_rng(0).bytes(5000)),
                     "is not a JPEG, PNG, WebP, BMP or TIFF image"),
}


def _run_cli(root, out):
    return run_in_process("run", "--coco-dir", str(root), "--subset", "sample", "--output-dir", str(out),
                          "--warmup-batches", "1", "--warmup-seconds", "0", "--min-timed-batches", "2", "--no-layers",
                          "--no-profile")


def _assert_one_clean_line(result, out, expected):
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr and not re.search(r"\w+Error:", result.stderr), result.stderr
    assert expected in lines[0], lines[0]
    assert not out.exists() or not any(out.iterdir()), sorted(out.rglob("*"))


@requires_coco
@pytest.mark.parametrize("row", ANNOTATION_ROWS, ids=list(ANNOTATION_ROWS))
def test_bad_annotations_are_one_line_exit_2_nothing_written(tmp_path, sample, row):
    build, expected = ANNOTATION_ROWS[row]
    root = _coco_dir(tmp_path, build(sample), sample)
    out = tmp_path / "out"
    result = _run_cli(root, out)
    _assert_one_clean_line(result, out, expected)
    assert str(root / ANNOTATIONS) in result.stderr  # names the file


@requires_coco
@pytest.mark.parametrize("row", IMAGE_ROWS, ids=list(IMAGE_ROWS))
def test_bad_images_are_one_line_exit_2_nothing_written(tmp_path, sample, row):
    damage, expected = IMAGE_ROWS[row]
    root = _coco_dir(tmp_path, sample, sample)
    image = _first_image(root, sample)
    damage(image)
    out = tmp_path / "out"
    result = _run_cli(root, out)
    _assert_one_clean_line(result, out, expected)
    assert str(image) in result.stderr  # names the file


def _normalised_by_image(data):
    """Every box divided by its image's width and height (a YOLO-style export written as COCO), one of them the
    whole image, [0, 0, 1, 1]: values up to 1 inclusive."""
    sizes = {i["id"]: (i["width"], i["height"]) for i in data["images"]}
    for a in data["annotations"]:
        w, h = sizes[a["image_id"]]
        x, y, bw, bh = a["bbox"]
        a["bbox"] = [x / w, y / h, bw / w, bh / h]
    next(a for a in data["annotations"] if not a["iscrowd"])["bbox"] = [0.0, 0.0, 1.0, 1.0]


@requires_coco
@pytest.mark.parametrize("change, expected", [
    (lambda x: x["images"][0].update(file_name="../../etc/passwd"), "is not a relative path inside the image"),
    (lambda x: x["images"][0].update(file_name="/etc/passwd"), "is not a relative path inside the image"),
    (lambda x: x["images"][0].update(file_name="val\\\\a.jpg"), "(Windows separators: write it with /)"),
    (lambda x: x["annotations"][0].update(bbox=[1.0, 2.0, float("nan"), 4.0]), "finite number"),
    (lambda x: x["annotations"][0].update(bbox=[1.0, 2.0, 3.0]), "annotations[0].bbox"),
    (lambda x: x["annotations"][0].update(bbox=[1.0, 2.0, -3.0, 4.0]), "has no area"),
    (lambda x: x["annotations"][0].update(bbox=[1.0, 2.0, 0.0, 4.0], iscrowd=0), "has no area"),
    (lambda x: x["annotations"][0].update(bbox=[-30.0, 2.0, 10.0, 4.0]), "reaches past its"),
    (lambda x: x["annotations"][0].update(bbox=[-50.0, 10.0, 100.0, 50.0]), "reaches past its 640x426 image; run"),
    (lambda x: [a.update(bbox=[a["bbox"][0], a["bbox"][1], a["bbox"][0] + a["bbox"][2] + 9000,
                                a["bbox"][1] + a["bbox"][3]]) for a in x["annotations"]], "reaches past its"),
    (lambda x: [a.update(bbox=[a["bbox"][0], a["bbox"][1], a["bbox"][0] + a["bbox"][2], a["bbox"][1] + a["bbox"][3]])
                for a in x["annotations"] if a["bbox"][0] + 2 * a["bbox"][2] > 1], "are the boxes [x1, y1, x2, y2]?"),
    (lambda x: [a.update(bbox=[v / 1000 for v in a["bbox"]]) for a in x["annotations"]], "normalised coordinates?"),
    (_normalised_by_image, "normalised coordinates?"),
    (lambda x: [a.update(area=0) for a in x["annotations"]], "every box's area is 0"),
    (lambda x: x["annotations"][0].update(category_id=999), "999 is not in categories"),
    (lambda x: x["annotations"][0].update(image_id=1), "1 is not in images"),
    (lambda x: x["annotations"][0].pop("area"), "annotations[0].area: field required"),
    (lambda x: x["annotations"][0].update(iscrowd=2), "annotations[0].iscrowd"),
    (lambda x: x["images"].append(dict(x["images"][0])), "images: ids are not unique"),
    (lambda x: x["images"].append(dict(x["images"][0], id=7, file_name="./" + x["images"][0]["file_name"])),
     "is images[0]'s too"),
    (lambda x: x["annotations"][1].update(id=x["annotations"][0]["id"]), "annotations: ids are not unique"),
    (lambda x: x["categories"].append(dict(x["categories"][0], name="other")), "categories: ids are not unique"),
    (lambda x: x["categories"].append({"id": -5, "name": "other"}), "-5 is negative"),
], ids=["path traversal", "absolute path", "Windows separators", "NaN bbox", "3-number bbox", "negative size",
        "zero width", "left of its image", "left of its image, no corners hint",
        "past its image", "corners, not sizes", "normalised", "normalised by image, one a full-image box",
        "every area 0", "unknown category", "unknown image", "no area", "iscrowd 2", "duplicate image id",
        "one file, two image ids", "duplicate annotation id", "duplicate category id", "negative category id"])
def test_malformed_annotations_in_process(tmp_path, sample, change, expected):
    path = tmp_path / "instances.json"
    path.write_text(json.dumps(_edit(sample, change)))  # json writes NaN as the NaN literal, as a bad tool would
    with pytest.raises(UsageError) as err:
        load_instances(path)
    message = str(err.value)
    assert expected in message and str(path) in message and "\n" not in message


def test_invalid_json_annotations(tmp_path):
    path = tmp_path / "instances.json"
    path.write_bytes(b'{"images": [')
    with pytest.raises(UsageError, match="is not valid JSON"):
        load_instances(path)
    # where it stops, whole however far into the file (a message cut at a length said "column 38200 (char 381)")
    path.write_bytes(b'{"images": [' + b'{"id": 1}, ' * 4000 + b'{"id": ')
    with pytest.raises(UsageError, match=r"is not valid JSON \(Expecting value at line 1 column 44020\);"):
        load_instances(path)


@requires_coco
def test_an_annotation_id_of_0_is_scored_as_pycocotools_scores_it_numbered_from_1(sample, tmp_path):
    """pycocotools takes id 0 for "not matched": numbered from 0 (as Roboflow exports are), the box with id 0 is
    never found and its perfect detection is a false positive. Loaded, the ids are renumbered; the independent
    truth is pycocotools on the same file numbered from 1 by hand."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    from harness.eval.coco_eval import evaluate_bbox

    from_0 = _edit(sample, lambda x: [a.update(id=i) for i, a in enumerate(x["annotations"])])
    from_1 = _edit(sample, lambda x: [a.update(id=i + 1) for i, a in enumerate(x["annotations"])])
    image_ids = [i["id"] for i in sample["images"]]
    detections = [{"image_id": a["image_id"], "category_id": a["category_id"], "bbox": a["bbox"], "score": 0.9}
                  for a in sample["annotations"] if not a["iscrowd"]]

    def pycocotools_ap(data) -> float:
        path = tmp_path / "gt.json"
        path.write_text(json.dumps(data))
        with contextlib.redirect_stdout(io.StringIO()):
            gt = COCO(str(path))
            ev = COCOeval(gt, gt.loadRes(copy.deepcopy(detections)), "bbox")
            ev.params.imgIds = image_ids
            ev.evaluate(), ev.accumulate(), ev.summarize()
        return ev.stats[0]

    truth = pycocotools_ap(from_1)
    assert pycocotools_ap(from_0) < truth  # the flaw the renumbering is for
    path = tmp_path / "from_0.json"
    path.write_text(json.dumps(from_0))
    for evaluator in ("pycocotools", "faster-coco-eval"):
        stats = evaluate_bbox(load_instances(path), detections, image_ids, evaluator)
        assert stats["mAP_50_95"] == pytest.approx(truth)


@requires_coco
def test_valid_annotations_load_like_pycocotools(sample, tmp_path):
    from pycocotools.coco import COCO

    ours = load_instances(SUBSET_ANNOTATIONS)
    theirs = COCO(str(SUBSET_ANNOTATIONS))
    assert ours.imgs == theirs.imgs and ours.anns == theirs.anns and ours.cats == theirs.cats


@requires_coco
def test_image_checks_accept_every_real_sample_image():
    paths = sorted((COCO_DIR / "val2017").glob("*.jpg"))
    assert len(paths) >= 200
    check_image_files(paths)  # raises on the first broken one


def test_image_file_problems(tmp_path):
    png = tmp_path / "ok.png"
    cv2.imwrite(str(png), np.zeros((8, 8, 3), np.uint8))
    assert image_file_problem(png) is None
    png.write_bytes(png.read_bytes()[:-12])
    assert "truncated" in image_file_problem(png)
    assert "cannot be read" in image_file_problem(tmp_path / "missing.jpg")
    many = []
    for i in range(6):
        many.append(tmp_path / f"{i}.jpg")
        many[-1].write_bytes(b"")
    with pytest.raises(UsageError) as err:
        check_image_files(many)
    assert "0.jpg is empty" in str(err.value) and "and 5 more broken" in str(err.value)


@requires_coco
def test_corrupt_but_decodable_jpeg_is_found(tmp_path):
    """Zeroed bytes in the middle: OpenCV decodes the file (libjpeg only warns on stderr); the strict
    decode names it. The real sample images are all clean."""
    real = sorted((COCO_DIR / "val2017").glob("*.jpg"))
    data = bytearray(real[0].read_bytes())
    middle = len(data) // 3
    data[middle:middle + 2000] = bytes(2000)
    bad = tmp_path / "zeroed.jpg"
    bad.write_bytes(bytes(data))
    assert cv2.imdecode(np.frombuffer(bytes(data), np.uint8), cv2.IMREAD_COLOR) is not None  # decodable
    assert image_file_problem(bad) is None  # whole from the outside: only a decode can tell
    records = [SimpleNamespace(image_id=i, path=p) for i, p in enumerate(real[:50])]
    records.insert(7, SimpleNamespace(image_id=-1, path=bad))
    (found,) = find_corrupt_images(records)
    assert found.image_id == -1 and found.path == str(bad) and "Corrupt JPEG data" in found.problem
    assert found.to_dict() == {"image_id": -1, "path": str(bad), "problem": found.problem}
    # the same check started at plan time on a thread of its own: the same finding, and its failures reach the run
    assert find_corrupt_images_in_background(records).result(timeout=120) == [found]
    gone = find_corrupt_images_in_background([SimpleNamespace(image_id=0, path=tmp_path / "gone.jpg")])
    with pytest.raises(FileNotFoundError):
        gone.result(timeout=120)
