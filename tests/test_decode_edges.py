"""Files on which tensor decoders (TorchCodec, torchvision.io) and cv2 part ways, decoded on the host as cv2 decodes
them for every implementation, with the size check seeing what cv2 applies; and an annotation file's image folder
found the same from a relative path."""

from __future__ import annotations

import io
import os
import struct
import zlib

import cv2
import numpy as np
import pytest
from conftest import requires_coco
from test_image_format_edges import _coco_layout, _picture

from harness.data.images import decoded_size
from harness.errors import UsageError
from harness.pipeline.preprocess import decode_bytes, decode_tensor

ORIENTATION = 0x0112


def _exif(orientation: int) -> bytes:
    from PIL import Image

    exif = Image.Exif()
    exif[ORIENTATION] = orientation
    return exif.tobytes()  # b"Exif\0\0" + the TIFF block


def _app1(payload: bytes) -> bytes:
    return b"\xff\xe1" + struct.pack(">H", len(payload) + 2) + payload


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)


def _encoded(fmt: str, **options) -> bytes:
    out = io.BytesIO()
    _picture().save(out, fmt, **options)
    return out.getvalue()


def _jpeg_xmp_then_exif() -> bytes:
    """An XMP APP1 segment before the EXIF one (orientation 6): cv2 finds the EXIF block, both tensor decoders look
    at the first APP1 only."""
    jpeg = _encoded("JPEG", quality=90)
    xmp = b"http://ns.adobe.com/xap/1.0/\x00<x:xmpmeta xmlns:x='adobe:ns:meta/'/>"
    return jpeg[:2] + _app1(xmp) + _app1(_exif(6)) + jpeg[2:]


def _png_exif_after_idat() -> bytes:
    """A PNG whose eXIf chunk (orientation 6) follows IDAT, which libpng reads: cv2 turns the picture."""
    png = _encoded("PNG")
    at = png.rindex(b"IEND") - 4
    return png[:at] + _chunk(b"eXIf", _exif(6)[6:]) + png[at:]


def _apng_with_default_image() -> bytes:
    """An APNG whose IDAT is a default image outside the animation: cv2 gives the first frame, the tensor decoders
    the default image."""
    picture = _picture()
    out = io.BytesIO()
    picture.save(out, "PNG", save_all=True, append_images=[picture.rotate(180), picture], duration=100,
                 default_image=True)
    return out.getvalue()


CASES = {"jpeg-xmp-before-exif": _jpeg_xmp_then_exif, "png-exif-after-idat": _png_exif_after_idat,
         "apng-default-image": _apng_with_default_image,
         "jpeg-cmyk": lambda: (lambda b: (_picture().convert("CMYK").save(b, "JPEG", quality=90), b.getvalue())[1])(
             io.BytesIO())}


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_torch_implementations_host_decode_gives_cv2s_pixels_exactly(tmp_path, case):
    data = CASES[case]()
    expected = decode_bytes(data, "x")[..., ::-1]
    ours = decode_tensor(data, "x").permute(1, 2, 0).numpy()
    assert ours.shape == expected.shape
    assert np.array_equal(ours, expected)


@pytest.mark.parametrize("case", ["png-exif-after-idat", "jpeg-xmp-before-exif"])
def test_the_size_check_sees_the_orientation_cv2_applies(tmp_path, case):
    """An eXIf chunk after IDAT (Pillow reads it only once the pixels load) and an EXIF block behind an XMP one: the
    size check's orientation is the one cv2 applies, so annotations of the wrong view are refused, not scored."""
    path = tmp_path / "image.png"
    path.write_bytes(CASES[case]())
    height, width = cv2.imdecode(np.fromfile(path, np.uint8), cv2.IMREAD_COLOR).shape[:2]
    assert decoded_size(path)[:2] == (width, height)


def test_a_png_with_corrupt_pixel_data_is_one_line(tmp_path):
    """torchvision.io's PNG decoder crashed the process (SIGSEGV) on a corrupt IDAT that still ends in IEND."""
    png = bytearray(_encoded("PNG"))
    at = png.index(b"IDAT") + 20
    png[at:at + 10] = bytes(10)
    with pytest.raises(UsageError, match="image bad.png could not be decoded by cv2; replace it with a whole"):
        decode_tensor(bytes(png), "bad.png")


@requires_coco
def test_a_relative_annotation_path_with_dotdot_finds_the_same_folder_and_identity(tmp_path, monkeypatch):
    """`--dataset ../instances_val.json` from a folder below annotations/ is the same file as the absolute path: the
    same image folder and the same (dataset id, split)."""
    from harness.data.coco import CocoDataset

    annotations, _ = _coco_layout(tmp_path / "mine")
    given = CocoDataset.from_path(str(annotations))
    (tmp_path / "mine" / "annotations" / "tools").mkdir()
    monkeypatch.chdir(tmp_path / "mine" / "annotations" / "tools")
    relative = CocoDataset.from_path("../instances_val.json")
    assert relative.image_dir == given.image_dir
    assert relative.identity == given.identity == ("mine", "val")


@requires_coco
def test_an_annotation_file_given_from_its_image_folder_keeps_its_identity(tmp_path, monkeypatch):
    from harness.data.coco import CocoDataset

    annotations, images = _coco_layout(tmp_path / "project")
    flat = tmp_path / "project" / "annotations"
    (flat / "images").mkdir()
    for image in images:
        os.symlink(tmp_path / "project" / "val" / image["file_name"], flat / "images" / image["file_name"])
    given = CocoDataset.from_path(str(annotations))
    monkeypatch.chdir(flat / "images")
    relative = CocoDataset.from_path("../instances_val.json")
    assert relative.image_dir == given.image_dir
    assert relative.identity == given.identity
