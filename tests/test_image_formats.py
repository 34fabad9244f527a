"""Images in WebP, BMP and TIFF beside JPEG and PNG: checked whole before a run, decoded by cv2 on the host for every
implementation, scored as the JPEGs they were converted from. The truths: Pillow's decoders with its own EXIF
transpose, and the same run on the JPEG originals."""

from __future__ import annotations

import io
import json
import os

import cv2
import numpy as np
import pytest
from conftest import COCO_DIR, requires_coco, requires_yolox, run_in_process
from PIL import Image, ImageOps
from yolo_datasets import sample_annotations, yolo_dataset

from harness.data.images import decoded_size, image_file_problem
from harness.errors import UsageError
from harness.pipeline.preprocess import decode_bytes, decode_tensor

ORIENTATION = 0x0112
ROTATE_90_CW = 6

# format -> Pillow's save options; every one of them lossless but the lossy WebP and the JPEG-compressed TIFF
SAVES = {"png": ("PNG", {}), "webp": ("WEBP", {"lossless": True}), "lossy.webp": ("WEBP", {"quality": 80}),
         "bmp": ("BMP", {}), "tif": ("TIFF", {}), "lzw.tif": ("TIFF", {"compression": "tiff_lzw"}),
         "jpeg.tif": ("TIFF", {"compression": "jpeg"})}


def _first_sample_image() -> Image.Image:
    keep, _, _ = sample_annotations(1)
    return Image.open(COCO_DIR / "val2017" / keep[0]["file_name"]).convert("RGB")


def _encoded(image: Image.Image, kind: str, orientation: int | None = None) -> bytes:
    fmt, options = SAVES[kind]
    if orientation is not None:
        exif = Image.Exif()
        exif[ORIENTATION] = orientation
        options = {**options, "exif": exif.tobytes()}
    out = io.BytesIO()
    image.save(out, fmt, **options)
    return out.getvalue()


def _pillow_rgb(data: bytes) -> np.ndarray:
    """Pillow's decode, turned upright by its own EXIF transpose: the truth for both of the harness's decoders."""
    with Image.open(io.BytesIO(data)) as image:
        return np.asarray(ImageOps.exif_transpose(image).convert("RGB"))


@requires_coco
@pytest.mark.parametrize("kind, orientation", [(kind, orientation) for kind in sorted(SAVES)
                                                for orientation in (None, ROTATE_90_CW)
                                                if not (kind == "bmp" and orientation)])  # a BMP carries no EXIF
def test_each_format_decodes_to_pillows_pixels_on_both_paths(tmp_path, kind, orientation):
    image = _first_sample_image()
    data = _encoded(image, kind, orientation)
    path = tmp_path / f"image.{kind}"
    path.write_bytes(data)
    truth = _pillow_rgb(data)
    assert image_file_problem(path) is None
    cv2_rgb = decode_bytes(data, path)[..., ::-1]
    torch_rgb = decode_tensor(data, path).permute(1, 2, 0).numpy()
    assert cv2_rgb.shape == torch_rgb.shape == truth.shape
    if kind.startswith(("lossy", "jpeg")):  # lossy: Pillow's libwebp/libjpeg build may round otherwise
        assert np.abs(cv2_rgb.astype(int) - truth).max() <= 2
    else:
        assert (cv2_rgb == truth).all()
    assert (torch_rgb == cv2_rgb).all()
    width, height = image.size
    expected = (height, width, orientation) if orientation else (width, height, 1)
    assert decoded_size(path) == expected


@requires_coco
@pytest.mark.parametrize("kind", ["webp", "lossy.webp", "bmp", "tif", "lzw.tif", "jpeg.tif"])
def test_a_file_cut_short_is_truncated(tmp_path, kind):
    data = _encoded(_first_sample_image(), kind)
    path = tmp_path / f"cut.{kind}"
    for keep in (len(data) - 1, len(data) // 2):
        path.write_bytes(data[:keep])
        problem = image_file_problem(path)
        assert problem is not None and ("truncated" in problem or "not a whole TIFF" in problem), (keep, problem)
        assert cv2.imdecode(np.frombuffer(data[:keep], np.uint8), cv2.IMREAD_COLOR) is None or kind == "lossy.webp" \
            or keep == len(data) - 1  # what the check spares the run: a decode that fails half-way through


def test_formats_no_decoder_reads_as_cv2_does_are_refused(tmp_path):
    heic = tmp_path / "a.heic"
    heic.write_bytes(b"\x00\x00\x00\x18ftypheic" + bytes(100))
    assert "is not a JPEG, PNG, WebP, BMP or TIFF image (starts with 00 00 00 18)" in image_file_problem(heic)
    # a camera raw is a TIFF whose first image is its preview: cv2 would score the preview
    image = Image.new("RGB", (64, 48))
    dng = tmp_path / "a.dng"
    image.save(dng, "TIFF")
    assert "camera raw (DNG)" in image_file_problem(dng)
    preview = tmp_path / "preview.tif"
    image.save(preview, "TIFF", tiffinfo={254: 1})
    assert "first image is a preview" in image_file_problem(preview)
    bmp = tmp_path / "zero-size.bmp"
    data = bytearray(_encoded(image, "bmp"))
    data[2:6] = bytes(4)  # writers may leave the file size 0: the pixels' offset still shows a file cut short
    bmp.write_bytes(bytes(data))
    assert image_file_problem(bmp) is None
    bmp.write_bytes(bytes(data[:40]))
    assert "truncated" in image_file_problem(bmp)


@requires_coco
def test_check_image_files_names_a_truncated_webp(tmp_path):
    from harness.data.images import check_image_files

    path = tmp_path / "cut.webp"
    path.write_bytes(_encoded(_first_sample_image(), "webp")[:5000])
    with pytest.raises(UsageError, match=r"cut.webp is truncated \(5000 of the \d+ bytes its WebP header gives\); "
                                         r"replace it with a whole JPEG, PNG, WebP, BMP or TIFF file"):
        check_image_files([path])


IMAGES = 8
MIXED = ("png", "webp", "bmp", "lzw.tif")


def _convert(yaml_path, kinds) -> None:
    """Each image of the YOLO dataset (a link to a sample JPEG) replaced by the pixels cv2 decodes from it, written by
    Pillow as kinds[i % len(kinds)] under the same stem (so its label file stays its own)."""
    images = sorted((yaml_path.parent / "images" / "val").iterdir())
    for i, link in enumerate(images):
        rgb = Image.fromarray(cv2.imread(str(link))[..., ::-1].copy())
        kind = kinds[i % len(kinds)]
        # x.tif, not x.lzw.tif: a label file is the image's name less its last suffix (x.lzw.txt is not x.txt)
        link.with_suffix("." + kind.rsplit(".", 1)[-1]).write_bytes(_encoded(rgb, kind))
        os.unlink(link)


def _detections(tmp_path, name, yaml_path, preprocess):
    out = tmp_path / name
    result = run_in_process("run", "--dataset", str(yaml_path), "--model", "yolox-nano", "--backend", "onnxruntime",
                            "--batch-sizes", "4", "--preprocess", preprocess, "--warmup-batches", "0",
                            "--warmup-seconds", "0", "--min-timed-batches", "1", "--no-energy", "--draw-images", "0",
                            "--output-dir", str(out), "--json")
    assert result.returncode == 0, result.stderr
    (run_dir,) = out.iterdir()
    (submission,) = (run_dir / "submissions").glob("*.json")
    decode = json.loads(submission.read_text())["runtime"]["preprocess"]["decode_detail"]
    detections = json.loads(next((run_dir / "detections").glob("*.json")).read_text())
    return sorted((d["image_id"], d["category_id"], d["score"], *d["bbox"]) for d in detections), decode


@requires_coco
@requires_yolox
def test_converted_images_score_as_their_sources(tmp_path):
    """The sample's JPEGs, their decoded pixels written as PNG, WebP, BMP and TIFF: the JPEGs' very detections, with
    --preprocess cv2 and with torch (its float letterbox of the same pixels)."""
    jpeg = yolo_dataset(tmp_path / "jpeg", images=IMAGES)
    mixed = yolo_dataset(tmp_path / "mixed", images=IMAGES)
    _convert(mixed, MIXED)
    assert {p.suffix for p in (mixed.parent / "images" / "val").iterdir()} == {".png", ".webp", ".bmp", ".tif"}
    checked = run_in_process("data", "check", "--dataset", str(mixed), "--json")
    assert checked.returncode == 0, checked.stderr
    summary = json.loads(checked.stdout)
    assert summary["image_formats"] == {"BMP": 2, "PNG": 2, "TIFF": 2, "WebP": 2}  # two of each, by their bytes
    assert summary["image_dir"] == str((mixed.parent / "images" / "val").resolve())
    sources = json.loads(run_in_process("data", "check", "--dataset", str(jpeg), "--json").stdout)
    assert (summary["objects"], summary["images_with_objects"]) == (sources["objects"], sources["images_with_objects"])
    from_jpeg, decode = _detections(tmp_path, "jpeg-cv2", jpeg, "cv2")
    assert from_jpeg and decode.startswith("cv2.imdecode")
    assert _detections(tmp_path, "mixed-cv2", mixed, "cv2")[0] == from_jpeg
    from_jpeg, decode = _detections(tmp_path, "jpeg-torch", jpeg, "torch")
    assert decode.startswith("cv2.imdecode")  # the torch implementation's host decoder too
    assert _detections(tmp_path, "mixed-torch", mixed, "torch")[0] == from_jpeg

