"""Preprocessing conventions of the PreprocessSpec against references written here or the libraries'
own transforms: torchvision's GeneralizedRCNNTransform, PIL's resize, a YOLO-NAS-style long side to 636
centre-padded to 640, per-channel pad values."""

import numpy as np
import pytest
import torch
from PIL import Image

from harness.models.protocol import PreprocessSpec
from harness.pipeline.preprocess import preprocess_batch

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _images():
    rng = np.random.default_rng(5)
    return [rng.integers(0, 256, shape, dtype=np.uint8) for shape in ((300, 500, 3), (480, 290, 3), (256, 256, 3))]


@pytest.mark.parametrize("resize", ["letterbox", "stretch"])
def test_torch_library_reproduces_torchvision_transform(resize):
    """library "torch" = GeneralizedRCNNTransform with min_size = max_size = S and size_divisible = S
    (letterbox), or fixed_size (S, S) (stretch, SSDLite's)."""
    from torchvision.models.detection.transform import GeneralizedRCNNTransform

    size = 320
    spec = PreprocessSpec(input_size=(size, size), resize=resize, pad_value=tuple(m * 255 for m in MEAN),
                          channel_order="RGB", scale=1 / 255, mean=MEAN, std=STD, library="torch", box_scale="size")
    transform = GeneralizedRCNNTransform(size, size, list(MEAN), list(STD), size_divisible=size,
                                         fixed_size=(size, size) if resize == "stretch" else None)
    images = _images()
    ours, transforms = preprocess_batch(images, spec)
    theirs, _ = transform([torch.from_numpy(img[:, :, ::-1].copy()).permute(2, 0, 1).float() / 255 for img in images])
    assert theirs.tensors.shape == ours.shape
    torch.testing.assert_close(ours, theirs.tensors, rtol=0, atol=2e-5)
    for t, (h, w) in zip(transforms, theirs.image_sizes, strict=True):  # torchvision's resize_boxes ratios
        assert t.ratio == pytest.approx((w / t.orig_size[1], h / t.orig_size[0]), rel=1e-12)


def test_pil_library_is_pil_resize():
    spec = PreprocessSpec(input_size=(320, 320), resize="letterbox", library="pil", channel_order="RGB")
    images = _images()
    batch, transforms = preprocess_batch(images, spec)
    for image, got, t in zip(images, batch, transforms, strict=True):
        h, w = image.shape[:2]
        r = min(320 / h, 320 / w)
        new = (int(w * r), int(h * r))
        want = np.full((320, 320, 3), 114, np.uint8)
        want[:new[1], :new[0]] = np.asarray(Image.fromarray(image[:, :, ::-1].copy()).resize(new, Image.BILINEAR))
        assert np.array_equal(got.permute(1, 2, 0).numpy(), want.astype(np.float32))
        assert t.ratio == (r, r) and t.pad == (0.0, 0.0)


def test_long_side_then_centre_pad_with_per_channel_pad():
    """YOLO-NAS: the long side to 636 (rounded), centre padding to 640; pad given per channel (RGB)."""
    import cv2

    spec = PreprocessSpec(input_size=(640, 640), fit_margin=4, size_rounding="round", pad_position="center",
                          pad_value=(10, 20, 30), channel_order="RGB")
    images = _images()
    batch, transforms = preprocess_batch(images, spec)
    for image, got, t in zip(images, batch, transforms, strict=True):
        h, w = image.shape[:2]
        r = min(636 / h, 636 / w)
        nw, nh = round(w * r), round(h * r)
        top, left = (640 - nh) // 2, (640 - nw) // 2
        want = np.empty((640, 640, 3), np.uint8)
        want[:] = (10, 20, 30)
        want[top:top + nh, left:left + nw] = cv2.resize(image, (nw, nh), interpolation=cv2.INTER_LINEAR)[:, :, ::-1]
        assert np.array_equal(got.permute(1, 2, 0).numpy(), want.astype(np.float32))
        assert max(nh, nw) == 636 and t.pad == (float(left), float(top)) and t.ratio == (r, r)


def test_spec_is_recorded_as_plain_json():
    spec = PreprocessSpec(input_size=(640, 640), mean=(1.0, 2.0, 3.0))
    d = spec.to_dict()
    assert d["input_size"] == [640, 640] and d["mean"] == [1.0, 2.0, 3.0] and d["library"] == "cv2"
    assert spec.with_input_size(320).input_size == (320, 320) and spec.with_input_size(320).mean == spec.mean
