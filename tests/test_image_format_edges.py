"""The edges of WebP/BMP/TIFF support and of an annotation file's image folder: the size check (decoded_size, Pillow)
agrees with what cv2 decodes (orientations cv2 does not apply are not counted), a file accepted before the run
decodes, a file every path reads is not refused, and an annotation file's image folder depends neither on where a
link to it points nor on its first listed image alone."""

from __future__ import annotations

import io
import json
import os
import struct

import cv2
import numpy as np
import pytest
from conftest import COCO_DIR, SUBSET_ANNOTATIONS, requires_coco
from PIL import Image

from harness.data.images import decoded_size, image_file_problem
from harness.pipeline.preprocess import decode_bytes, decode_tensor

ORIENTATION = 0x0112
XMP_ORIENTATION_6 = (b'<?xpacket begin="" id="W5M0MpCehiHzreSzNTczkc9d"?><x:xmpmeta xmlns:x="adobe:ns:meta/"><rdf:RDF '
                     b'xmlns:rdf="http://www.w3.org/1999/02/22-rdf-syntax-ns#"><rdf:Description rdf:about="" '
                     b'xmlns:tiff="http://ns.adobe.com/tiff/1.0/" tiff:Orientation="6"/></rdf:RDF></x:xmpmeta>'
                     b'<?xpacket end="w"?>')


def _picture(width: int = 160, height: int = 120) -> Image.Image:
    """A picture whose every turn and mirror differs (a gradient and a corner mark)."""
    y, x = np.mgrid[0:height, 0:width]
    rgb = np.dstack([x * 255 // width, y * 255 // height, (x + y) % 256]).astype(np.uint8)
    rgb[:10, :20] = (255, 0, 0)
    return Image.fromarray(rgb)


def _exif(orientation: int) -> bytes:
    exif = Image.Exif()
    exif[ORIENTATION] = orientation
    return exif.tobytes()


def _with_prefixed_exif_chunk(webp: bytes) -> bytes:
    """The WebP with its EXIF chunk's payload preceded by "Exif\\0\\0", as Pillow < 9.3 (im.save(..., exif=
    jpeg.info["exif"])) and other writers left it: Pillow reads its orientation, cv2 does not."""
    at = webp.find(b"EXIF")
    length = int.from_bytes(webp[at + 4:at + 8], "little")
    payload = b"Exif\x00\x00" + webp[at + 8:at + 8 + length]
    chunk = b"EXIF" + struct.pack("<I", len(payload)) + payload + b"\x00" * (len(payload) % 2)
    out = webp[:at] + chunk + webp[at + 8 + length + length % 2:]
    return out[:4] + struct.pack("<I", len(out) - 8) + out[8:]


def _webp(image: Image.Image, **options) -> bytes:
    out = io.BytesIO()
    image.save(out, "WEBP", lossless=True, **options)
    return out.getvalue()


def _webp_cases() -> dict[str, bytes]:
    image = _picture()
    animated = io.BytesIO()
    image.save(animated, "WEBP", save_all=True, append_images=[image.rotate(180)], lossless=True, duration=100,
               exif=_exif(6))
    return {"exif-chunk-with-Exif-prefix": _with_prefixed_exif_chunk(_webp(image, exif=_exif(6))),
            "xmp-orientation-only": _webp(image, xmp=XMP_ORIENTATION_6),
            "animated-with-exif": animated.getvalue()}


@pytest.mark.parametrize("case", sorted(_webp_cases()))
def test_decoded_size_agrees_with_what_the_decoders_give(tmp_path, case):
    """The size check's (width, height) is the one cv2 (and decode_tensor) decode to: otherwise annotations of the
    upright view pass the check while the picture is scored unturned (a silent wrong mAP)."""
    data = _webp_cases()[case]
    path = tmp_path / "image.webp"
    path.write_bytes(data)
    assert image_file_problem(path) is None
    height, width = decode_bytes(data, path).shape[:2]
    assert tuple(decode_tensor(data, path).shape[1:]) == (height, width)
    assert decoded_size(path)[:2] == (width, height)


def test_a_tiffs_xmp_orientation_is_not_taken_for_its_exif_one(tmp_path):
    path = tmp_path / "xmp.tif"
    _picture().save(path, "TIFF", tiffinfo={700: XMP_ORIENTATION_6})
    height, width = decode_bytes(path.read_bytes(), path).shape[:2]
    assert decoded_size(path)[:2] == (width, height)


def _tiled_tiff(rgb: np.ndarray, orientation: int, tile: int = 32) -> bytes:
    """An uncompressed, chunky RGB TIFF in tile x tile tiles (as GDAL and tifffile write them) with an orientation."""
    height, width = rgb.shape[:2]
    across, down = -(-width // tile), -(-height // tile)
    tiles = []
    for ty in range(down):
        for tx in range(across):
            block = np.zeros((tile, tile, 3), np.uint8)
            part = rgb[ty * tile:(ty + 1) * tile, tx * tile:(tx + 1) * tile]
            block[:part.shape[0], :part.shape[1]] = part
            tiles.append(block.tobytes())
    entries = [(256, 3, 1, width), (257, 3, 1, height), (258, 3, 3, None), (259, 3, 1, 1), (262, 3, 1, 2),
               (274, 3, 1, orientation), (277, 3, 1, 3), (284, 3, 1, 1), (322, 3, 1, tile), (323, 3, 1, tile),
               (324, 4, len(tiles), None), (325, 4, len(tiles), None)]
    ifd_at = 8
    extra_at = ifd_at + 2 + 12 * len(entries) + 4
    bits_at, offsets_at = extra_at, extra_at + 6
    counts_at = offsets_at + 4 * len(tiles)
    data_at = counts_at + 4 * len(tiles)
    offsets = [data_at + i * len(tiles[0]) for i in range(len(tiles))]
    out = bytearray(b"II*\x00" + struct.pack("<I", ifd_at) + struct.pack("<H", len(entries)))
    for tag, kind, count, value in entries:
        if tag == 258:
            value = bits_at
        elif tag == 324:
            value = offsets_at
        elif tag == 325:
            value = counts_at
        packed = struct.pack("<HI", value, 0)[:4] if kind == 3 and count == 1 else struct.pack("<I", value)
        out += struct.pack("<HHI", tag, kind, count) + packed
    out += struct.pack("<I", 0) + struct.pack("<HHH", 8, 8, 8)
    out += b"".join(struct.pack("<I", o) for o in offsets) + b"".join(struct.pack("<I", len(t)) for t in tiles)
    return bytes(out) + b"".join(tiles)


UPRIGHT = {2: lambda a: a[:, ::-1], 3: lambda a: a[::-1, ::-1], 6: lambda a: np.rot90(a, -1),
           7: lambda a: np.rot90(a, -1)[::-1]}


@pytest.mark.parametrize("orientation", sorted(UPRIGHT))
def test_a_tiled_tiffs_orientation_is_applied_or_the_file_refused(tmp_path, orientation):
    """cv2 (OpenCV 5.0) turns a tiled TIFF by orientations 2, 3, 6 and 7 into a picture of mirrored tile columns:
    a file the check accepts must decode to its upright view."""
    rgb = np.asarray(_picture(128, 96))
    path = tmp_path / "tiled.tif"
    path.write_bytes(_tiled_tiff(rgb, orientation))
    if image_file_problem(path) is not None:
        return
    decoded = decode_bytes(path.read_bytes(), path)[..., ::-1]
    assert (decoded == UPRIGHT[orientation](rgb)).all()


@pytest.mark.parametrize("mode", ["F", "I"])
def test_a_tiff_accepted_before_the_run_decodes(tmp_path, mode):
    """A 32-bit float or integer TIFF (a thermal or depth frame): cv2 cannot decode it, so a run failed in its first
    cell ("could not be decoded") after the check had passed it."""
    path = tmp_path / f"{mode}.tif"
    Image.fromarray(np.asarray(_picture().convert("L")).astype(np.float32 if mode == "F" else np.int32), mode).save(
        path, "TIFF")
    if image_file_problem(path) is None:
        assert cv2.imdecode(np.fromfile(path, np.uint8), cv2.IMREAD_COLOR) is not None


def test_a_bigtiff_every_path_reads_is_not_refused(tmp_path):
    path = tmp_path / "big.tif"
    _picture().save(path, "TIFF", big_tiff=True)
    assert decode_bytes(path.read_bytes(), path).shape == (120, 160, 3)
    assert image_file_problem(path) is None


def test_a_tiff_above_pillows_pixel_limit_is_not_refused_as_broken(tmp_path):
    """9500 x 9500 (an aerial tile): cv2 reads up to 2**30 pixels and a PNG of that size passes; Pillow's
    DecompressionBombWarning is not a broken file."""
    path = tmp_path / "large.tif"
    limit, Image.MAX_IMAGE_PIXELS = Image.MAX_IMAGE_PIXELS, None
    try:
        Image.new("L", (9500, 9500)).save(path, "TIFF", compression="tiff_adobe_deflate")
    finally:
        Image.MAX_IMAGE_PIXELS = limit
    assert image_file_problem(path) is None


def _coco_layout(root, drop_first_listed: bool = False):
    source = json.loads(SUBSET_ANNOTATIONS.read_text())
    images = source["images"][:4]
    keep = {i["id"] for i in images}
    (root / "annotations").mkdir(parents=True)
    (root / "val").mkdir()
    for k, image in enumerate(images):
        if not (drop_first_listed and k == 0):
            os.symlink(COCO_DIR / "val2017" / image["file_name"], root / "val" / image["file_name"])
    (root / "annotations" / "instances_val.json").write_text(json.dumps(
        {**source, "images": images, "annotations": [a for a in source["annotations"] if a["image_id"] in keep]}))
    return root / "annotations" / "instances_val.json", images


@requires_coco
def test_a_missing_first_listed_image_does_not_hide_the_folder_holding_the_rest(tmp_path):
    """The first image the file lists is missing, the others are in root/val/: the folder is root/val/ (a --limit
    of present images runs; the refusal counts one missing image, not all)."""
    from harness.data.coco import CocoDataset
    from harness.errors import UsageError

    annotations, images = _coco_layout(tmp_path / "mine", drop_first_listed=True)
    dataset = CocoDataset.from_path(str(annotations))
    assert dataset.image_dir == (tmp_path / "mine" / "val").resolve()
    with pytest.raises(UsageError, match=r"but 1 are missing"):
        dataset.variant("sample")


@requires_coco
def test_a_linked_annotation_file_finds_the_images_beside_the_link(tmp_path):
    """An annotation file that is a symbolic link (git-annex, DVC's symlink cache, a shared annotations store): its
    images/ folder is the one beside the link."""
    from harness.data.coco import CocoDataset

    annotations, images = _coco_layout(tmp_path / "store")
    project = tmp_path / "project"
    (project / "images").mkdir(parents=True)
    for image in images:
        os.symlink(COCO_DIR / "val2017" / image["file_name"], project / "images" / image["file_name"])
    os.symlink(annotations, project / "labels.json")
    (tmp_path / "store" / "val").rename(tmp_path / "store" / "elsewhere")
    dataset = CocoDataset.from_path(str(project / "labels.json"))
    assert dataset.variant("sample").num_images == 4
    assert dataset.identity == ("project", "labels")
    # the path a run records (run.json's annotation_file, which compare opens again) finds the same images
    again = CocoDataset.from_path(str(dataset.annotation_file))
    assert again.image_dir == dataset.image_dir and again.identity == dataset.identity


@pytest.mark.parametrize("compression", ["zstd", "tiff_lzw"])
def test_a_tiff_compression_cv2_lacks_is_refused_before_the_run(tmp_path, compression):
    path = tmp_path / f"{compression}.tif"
    try:
        _picture().save(path, "TIFF", compression=compression)
    except (OSError, ValueError):
        pytest.skip(f"this Pillow cannot write {compression}")
    decodes = cv2.imdecode(np.fromfile(path, np.uint8), cv2.IMREAD_COLOR) is not None
    problem = image_file_problem(path)
    assert (problem is None) == decodes, (compression, problem)
    if not decodes:
        assert "uses TIFF compression 50000, which OpenCV's libtiff does not decode" in problem


@pytest.mark.parametrize("fmt", ["JPEG", "PNG"])
def test_an_xmp_orientation_alone_is_not_counted(tmp_path, fmt):
    """Pillow's getexif() falls back to an XMP tiff:Orientation; cv2 (and torchvision) apply the EXIF one only."""
    path = tmp_path / f"xmp.{fmt.lower()}"
    options = {"xmp": XMP_ORIENTATION_6} if fmt == "JPEG" else {"pnginfo": _xmp_png_info()}
    _picture().save(path, fmt, **options)
    assert Image.open(path).getexif().get(ORIENTATION) == 6  # what the size check must not take
    height, width = decode_bytes(path.read_bytes(), path).shape[:2]
    assert tuple(decode_tensor(path.read_bytes(), path).shape[1:]) == (height, width)
    assert decoded_size(path) == (width, height, 1)


def _xmp_png_info():
    from PIL import PngImagePlugin

    info = PngImagePlugin.PngInfo()
    info.add_itxt("XML:com.adobe.xmp", XMP_ORIENTATION_6.decode())
    return info


def test_a_text_file_starting_with_bm_is_no_bmp(tmp_path):
    path = tmp_path / "notes.bmp"
    path.write_bytes(b"BM is how this text begins, and it goes on for a while" * 20)
    assert "is not a JPEG, PNG, WebP, BMP or TIFF image (starts with 42 4d 20 69)" in image_file_problem(path)
