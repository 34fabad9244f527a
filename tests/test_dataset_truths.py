"""A dataset is scored only as what it is: images at the size their annotations give (EXIF orientation applied by
every decoder alike), ground-truth masks for a segmentation model, ground truth at all, and class names that say
which class a category is. Anything else is refused in one line before a run starts."""

from __future__ import annotations

import io
import json
import os
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from conftest import COCO_DIR, SUBSET_ANNOTATIONS, requires_coco, run_in_process
from PIL import Image

from harness.data.classes import ClassMap, match_classes
from harness.data.coco import CocoDataset
from harness.data.images import check_image_sizes, decoded_size
from harness.errors import UsageError
from harness.pipeline import gpu
from harness.pipeline.preprocess import decode_bytes, decode_tensor

ROTATE_90_CW = 6  # EXIF orientation: the stored image is shown turned a quarter clockwise


def _first_sample():
    data = json.loads(SUBSET_ANNOTATIONS.read_text())
    image = sorted(data["images"], key=lambda i: i["id"])[0]
    return data, image


def _exif_rotated_jpeg(source: Path, target: Path) -> np.ndarray:
    """`source` stored turned a quarter anticlockwise with EXIF orientation 6, so that a viewer (and cv2) shows it
    upright; returns the upright pixels as cv2 decodes the original (BGR)."""
    upright = cv2.imread(str(source))
    stored = cv2.rotate(upright, cv2.ROTATE_90_COUNTERCLOCKWISE)
    exif = Image.Exif()
    exif[0x0112] = ROTATE_90_CW
    Image.fromarray(stored[..., ::-1]).save(target, quality=100, exif=exif.tobytes())
    return upright


@requires_coco
def test_exif_orientation_counts_in_the_size_check_and_every_decoder_applies_it(tmp_path):
    data, info = _first_sample()
    path = tmp_path / info["file_name"]
    upright = _exif_rotated_jpeg(COCO_DIR / "val2017" / info["file_name"], path)
    w, h = info["width"], info["height"]
    assert decoded_size(path) == (w, h, ROTATE_90_CW)
    # the annotations give the upright size: accepted, and the orientation is remembered for the GPU's decoder
    assert check_image_sizes([(info["id"], path, w, h)]) == {info["id"]: ROTATE_90_CW}
    # annotations made on the stored pixels (a tool that ignores EXIF): swapping width and height is no fix
    with pytest.raises(UsageError, match=f"is {w}x{h} once its EXIF orientation 6 is applied but its annotations "
                                         f"say {h}x{w}.*made on the stored pixels.*remove the images' EXIF"):
        check_image_sizes([(info["id"], path, h, w)])
    raw = path.read_bytes()
    by_cv2 = decode_bytes(raw, path)  # OpenCV applies the orientation itself
    by_torchvision = decode_tensor(raw, path).permute(1, 2, 0).flip(-1).numpy()
    assert by_cv2.shape == by_torchvision.shape == upright.shape
    # two libjpeg-turbo decodes of a quality-100 JPEG of the same pixels: close to the original, not bit-equal
    for decoded in (by_cv2, by_torchvision):
        assert np.abs(decoded.astype(int) - upright).mean() < 2.0


def test_a_half_turn_or_mirror_in_exif_is_warned_about_a_quarter_turn_is_not():
    """Orientation 3 (half a turn) keeps the size, so the size check cannot say which view the annotations are of;
    a quarter turn (6) can, and is confirmed by it."""
    from harness.data.images import orientation_warning

    assert orientation_warning({}) is None and orientation_warning({7: ROTATE_90_CW}) is None
    warning = orientation_warning({9: 3, 7: ROTATE_90_CW, 8: 2})
    assert warning.startswith("warning: 2 image(s)") and "image 8: orientation 2" in warning
    assert "exiftool -Orientation=1 -n" in warning


def test_a_16_bit_png_decodes_to_the_pixels_cv2_gives(tmp_path):
    """cv2 keeps a 16-bit PNG's high byte; torchvision decodes uint16, which the torch path converts likewise."""
    rng = np.random.default_rng(0)
    for shape in ((37, 53, 3), (20, 30)):
        encoded = cv2.imencode(".png", rng.integers(0, 65536, size=shape, dtype=np.uint16))[1].tobytes()
        by_torchvision = decode_tensor(encoded, Path("x.png"))
        assert by_torchvision.dtype == torch.uint8
        assert np.array_equal(by_torchvision.permute(1, 2, 0).flip(-1).numpy(), decode_bytes(encoded, Path("x.png")))


@requires_coco
def test_nvjpeg_leaves_exif_oriented_jpegs_to_the_host(monkeypatch):
    """nvJPEG ignores EXIF orientation: the JPEGs the dataset check found oriented go to the host decoder (faked
    nvJPEG here: no GPU)."""
    calls = []

    def fake_decode_jpeg(encoded, mode, device):
        calls.append(len(encoded))
        return [decode_tensor(e.numpy().tobytes(), "x") for e in encoded]

    import torchvision.io

    monkeypatch.setattr(torchvision.io, "decode_jpeg", fake_decode_jpeg)
    data = json.loads(SUBSET_ANNOTATIONS.read_text())
    datas = [(COCO_DIR / "val2017" / i["file_name"]).read_bytes() for i in data["images"][:3]]
    out = gpu.decode_on_device(datas, torch.device("cpu"), ["a", "b", "c"], [False, True, False])
    assert calls == [2] and len(out) == 3
    assert torch.equal(out[1], decode_tensor(datas[1], "b"))


@pytest.fixture
def boxes_only(tmp_path):
    """Four sample images with their official boxes and masks, written once with masks and once without (a
    detection export's `"segmentation": []`)."""
    data = json.loads(SUBSET_ANNOTATIONS.read_text())
    images = sorted(data["images"], key=lambda i: i["id"])[:4]
    ids = {i["id"] for i in images}
    data["images"], data["annotations"] = images, [a for a in data["annotations"] if a["image_id"] in ids]
    for image in images:
        os.symlink(COCO_DIR / "val2017" / image["file_name"], tmp_path / image["file_name"])
    (tmp_path / "masks.json").write_text(json.dumps(data))
    for a in data["annotations"]:
        a["segmentation"] = []
    (tmp_path / "boxes.json").write_text(json.dumps(data))
    return tmp_path


@requires_coco
def test_masks_are_not_scored_against_boxes_only_ground_truth(boxes_only):
    with_masks = CocoDataset.from_path(str(boxes_only / "masks.json"))
    with_masks.check_masks(with_masks.variant("sample"))
    boxes = CocoDataset.from_path(str(boxes_only / "boxes.json"))
    with pytest.raises(UsageError, match=r"annotations of the images to score have no mask .*--no-masks"):
        boxes.check_masks(boxes.variant("sample"))
    out = boxes_only / "out"
    args = ["run", "--model", "rfdetr-seg-n", "--weights", "random", "--dataset", str(boxes_only / "boxes.json"),
            "--batch-sizes", "1", "--output-dir", str(out), "--dry-run"]
    refused = run_in_process(*args)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "have no mask" in refused.stderr and not out.exists()
    assert run_in_process(*args, "--no-masks").returncode == 0  # boxes only: a detection row, scored as such


def _first_with(data: dict, crowd: bool) -> dict:
    return next(a for a in data["annotations"] if bool(a["iscrowd"]) == crowd and a["image_id"] in
                {i["id"] for i in data["images"]})


@requires_coco
@pytest.mark.parametrize("breakage, says", [
    ("swapped size", r"an RLE of size \[\d+, \d+\], not its image's \[height, width\]"),
    ("short runs", r"RLE runs covering \d+ pixels, not its image's"),
    ("compressed short runs", r"RLE runs covering \d+ pixels, not its image's"),
    ("garbage string", r"neither run lengths .* nor COCO's compressed string"),
    ("two-point polygon", r"a first polygon of 4 values, not three points or more \(pycocotools reads 4 as a box\)"),
    ("polygon of strings", r"a polygon that is not a list of numbers"),
])
def test_masks_pycocotools_cannot_score_as_drawn_are_refused_before_the_run(boxes_only, breakage, says):
    """An RLE of another size or whose runs do not cover its image, and polygons pycocotools reads otherwise (4
    values: a box) or not at all, were scored silently (a mask nothing matches: segm AP 0.94 for perfect
    predictions) or failed a cell after its timed pass: refused in one line, naming the annotation."""
    from pycocotools import mask as mask_api

    data = json.loads((boxes_only / "masks.json").read_text())
    sizes = {i["id"]: (i["height"], i["width"]) for i in data["images"]}
    crowd, plain = _first_with(data, crowd=True), _first_with(data, crowd=False)
    height, width = sizes[crowd["image_id"]]
    if breakage == "swapped size":
        crowd["segmentation"]["size"] = [width, height]
    elif breakage == "short runs":
        crowd["segmentation"]["counts"] = crowd["segmentation"]["counts"][:-1]
    elif breakage == "compressed short runs":
        short = {"size": [height, width], "counts": crowd["segmentation"]["counts"][:-1]}
        crowd["segmentation"] = {**short, "counts": mask_api.frPyObjects(short, height, width)["counts"].decode()}
    elif breakage == "garbage string":
        crowd["segmentation"] = {"size": [height, width], "counts": "not an RLE!"}
    elif breakage == "two-point polygon":
        plain["segmentation"] = [plain["segmentation"][0][:4]]
    else:
        plain["segmentation"] = [[str(v) for v in plain["segmentation"][0]]]
    broken = boxes_only / "broken.json"
    broken.write_text(json.dumps(data))
    dataset = CocoDataset.from_path(str(broken))
    with pytest.raises(UsageError, match=says + r".*--no-masks"):
        dataset.check_masks(dataset.variant("sample"))
    out = boxes_only / "out"
    refused = run_in_process("run", "--model", "rfdetr-seg-n", "--weights", "random", "--dataset", str(broken),
                             "--batch-sizes", "1", "--output-dir", str(out))
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert "annotations[" in refused.stderr and not out.exists()


def test_compressed_rle_runs_are_read_as_pycocotools_writes_them():
    """The run lengths read from COCO's compressed string equal those pycocotools compressed (its own encoder, from
    masks of every density), and add up to the image."""
    from pycocotools import mask as mask_api

    from harness.data.coco import mask_problem, rle_runs

    rng = np.random.default_rng(0)
    for _ in range(200):
        height, width = (int(v) for v in rng.integers(1, 50, 2))
        mask = np.asfortranarray(rng.random((height, width)) < rng.random(), dtype=np.uint8)
        flat, runs, value, start = mask.flatten(order="F"), [], 0, 0
        while start < flat.size:  # the runs of zeros and ones, zeros first, by a plain walk
            end = start
            while end < flat.size and flat[end] == value:
                end += 1
            runs.append(end - start)
            start, value = end, 1 - value
        compressed = mask_api.encode(mask)["counts"].decode()
        assert rle_runs(compressed) == runs
        assert mask_problem({"size": [height, width], "counts": compressed}, height, width) is None


@requires_coco
def test_images_without_ground_truth_are_refused_before_the_run(tmp_path):
    data, info = _first_sample()
    data = {**data, "images": [info], "annotations": []}
    shutil.copy(COCO_DIR / "val2017" / info["file_name"], tmp_path)
    (tmp_path / "empty.json").write_text(json.dumps(data))
    dataset = CocoDataset.from_path(str(tmp_path / "empty.json"))
    with pytest.raises(UsageError, match="holds no annotation to score.*--no-accuracy"):
        dataset.check_ground_truth(dataset.variant("sample"))
    args = ["run", "--dataset", str(tmp_path / "empty.json"), "--batch-sizes", "1", "--dry-run"]
    refused = run_in_process(*args)
    assert refused.returncode == 2 and "holds no annotation to score" in refused.stderr, refused.stderr
    assert run_in_process(*args, "--no-accuracy").returncode == 0  # timing needs no ground truth


@requires_coco
def test_a_missing_image_of_ones_own_dataset_is_not_told_to_fetch_coco(tmp_path):
    data, info = _first_sample()
    annotations = [a for a in data["annotations"] if a["image_id"] == info["id"]]
    (tmp_path / "mine.json").write_text(json.dumps({**data, "images": [info], "annotations": annotations}))
    with pytest.raises(UsageError, match=f"put the image files in {tmp_path}") as err:
        CocoDataset.from_path(str(tmp_path / "mine.json")).variant("sample")
    assert "fetch coco" not in str(err.value)


def test_classes_a_category_cannot_be_told_apart_by_are_refused():
    # two model classes of one name: which one scores as the category is not the harness's guess
    with pytest.raises(UsageError, match=r"2 classes named 'person' \(labels 0, 2\).*by its index"):
        match_classes("m", ("person", "car", "Person"), {1: "person", 3: "car"})
    # mapped by index, one of them: fine, and the other scores as nothing
    assert match_classes("m", ("person", "car", "Person"), {1: "person", 3: "car"},
                         ClassMap("f", {"person": "2"})) == (-1, 3, 1)
    # an index that is no class of the model (torchvision's background, an unused id) is not a class to map to
    with pytest.raises(UsageError, match="'pedestrian' \\(id 1\\) -> '0': no class of m"):
        match_classes("m", (None, "person", "car"), {1: "pedestrian", 3: "car"}, ClassMap("f", {"pedestrian": "0"}))


def test_a_negative_class_index_in_a_class_map_is_refused(tmp_path):
    path = tmp_path / "map.yaml"
    path.write_text("human: -1\n")
    with pytest.raises(UsageError, match="`human: -1` is no class index"):
        ClassMap.read(str(path))


@pytest.mark.parametrize("kind", ["mpo", "png"])
def test_the_orientation_of_a_phones_mpo_and_of_a_png_counts_as_cv2_applies_it(tmp_path, kind):
    """A phone's multi-picture JPEG (Pillow calls it MPO) and a PNG with an EXIF block: cv2 turns both; the size
    check reads their orientation as cv2 applies it (independent truth: cv2's decode)."""
    exif = Image.Exif()
    exif[0x0112] = ROTATE_90_CW
    stored = Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 100, 3), dtype=np.uint8))
    path = tmp_path / f"phone.{'jpg' if kind == 'mpo' else 'png'}"
    if kind == "mpo":
        stored.save(path, format="MPO", save_all=True, append_images=[stored.copy()], exif=exif.tobytes())
        assert Image.open(path).format == "MPO"
    else:
        stored.save(path, exif=exif.tobytes())
    height, width = cv2.imread(str(path)).shape[:2]
    assert (width, height) == (40, 100)  # cv2 turned it
    assert decoded_size(path) == (width, height, ROTATE_90_CW)


def test_the_header_of_a_very_large_image_is_read_without_pillows_bomb_limit(tmp_path):
    path = tmp_path / "huge.png"
    Image.new("1", (15000, 15000)).save(path)  # 225 M pixels: Pillow refuses to open it by default
    assert decoded_size(path) == (15000, 15000, 1)
    assert Image.MAX_IMAGE_PIXELS is not None  # the limit is back for everything else


def test_decoded_size_of_a_png_is_its_header(tmp_path):
    path = tmp_path / "a.png"
    Image.new("RGB", (31, 17)).save(path)
    assert decoded_size(path) == (31, 17, 1)
    buffer = io.BytesIO()
    Image.new("RGB", (5, 4)).save(buffer, format="PNG")
    (tmp_path / "b.png").write_bytes(buffer.getvalue())
    assert decoded_size(tmp_path / "b.png") == (5, 4, 1)
