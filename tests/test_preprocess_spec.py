"""Preprocessing conventions of the PreprocessSpec against references written here or the libraries'
own transforms: torchvision's GeneralizedRCNNTransform, PIL's resize, a YOLO-NAS-style long side to 636
centre-padded to 640, per-channel pad values."""

import numpy as np
import pytest
import torch
from PIL import Image

from harness.detector.protocol import PreprocessSpec
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


# ------------------------------------------------------------------------------ fit then stretch

FIT_STRETCH_CASES = [  # (input size, image shape): shrink, upscale (230 -> 320 long side), portrait, non-square input
    ((320, 320), (300, 500, 3)), ((320, 320), (230, 176, 3)), ((320, 320), (480, 290, 3)), ((320, 384), (300, 500, 3)),
    ((320, 320), (320, 213, 3)),  # long side = input size: the fit is a copy
]


def _fit_size(shape, input_size):
    """libreyolo's COCO dataset fit (ImageCacheMixin._resize_decoded): r = min(H/h, W/w), size int(x * r)."""
    (h, w), (in_h, in_w) = shape[:2], input_size
    r = min(in_h / h, in_w / w)
    return int(h * r), int(w * r)


@pytest.mark.parametrize("library", ["cv2", "pil"])
@pytest.mark.parametrize("input_size, shape", FIT_STRETCH_CASES)
def test_fit_stretch_is_a_fit_then_a_stretch(library, input_size, shape):
    """resize "fit_stretch" = the long side fitted (aspect kept, size floored, uint8) then that image stretched
    to the input size, each with the spec's library; written here with cv2 / PIL directly."""
    import cv2

    rng = np.random.default_rng(11)
    image = rng.integers(0, 256, shape, dtype=np.uint8)
    spec = PreprocessSpec(input_size=input_size, resize="fit_stretch", channel_order="RGB", library=library)
    (got,), (t,) = preprocess_batch([image], spec)
    fh, fw = _fit_size(shape, input_size)
    in_h, in_w = input_size
    if library == "cv2":
        fitted = cv2.resize(image, (fw, fh), interpolation=cv2.INTER_LINEAR)
        want = cv2.resize(fitted, (in_w, in_h), interpolation=cv2.INTER_LINEAR)[:, :, ::-1]
    else:
        fitted = Image.fromarray(image[:, :, ::-1].copy()).resize((fw, fh), Image.BILINEAR)
        want = np.asarray(fitted.resize((in_w, in_h), Image.BILINEAR))
    assert np.array_equal(got.permute(1, 2, 0).numpy(), want.astype(np.float32))
    assert t.ratio == (in_w / shape[1], in_h / shape[0]) and t.pad == (0.0, 0.0) and t.orig_size == shape[:2]
    if (fh, fw) != shape[:2]:  # the fit is a real step: a single stretch gives other pixels
        single, _ = preprocess_batch([image], PreprocessSpec(input_size=input_size, resize="stretch",
                                                              channel_order="RGB", library=library))
        assert not torch.equal(single[0], got)


@pytest.mark.parametrize("input_size, shape", FIT_STRETCH_CASES)
def test_fit_stretch_torch_path_is_cv2_within_two_pixel_units(input_size, shape):
    """The torch path resizes twice in float (no uint8 rounding between the two resizes, nor cv2's fixed-point
    weights): the same geometry, pixels within 2 units of the cv2 path, which rounds twice; on noise the mean
    |delta| of two independent roundings is ~1/3 unit (measured 0.31), hence mean <= 0.4."""
    from harness.pipeline.preprocess import preprocess_tensors

    rng = np.random.default_rng(12)
    smooth = np.broadcast_to(np.linspace(0, 255, shape[1])[None, :, None], shape).astype(np.uint8)
    images = [rng.integers(0, 256, shape, dtype=np.uint8), smooth]
    spec = PreprocessSpec(input_size=input_size, resize="fit_stretch", channel_order="RGB", scale=1 / 255,
                          mean=MEAN, std=STD)
    ref, ref_t = preprocess_batch(images, spec)
    ours, ours_t = preprocess_tensors(images, spec)
    assert ours_t == ref_t
    pixel_units = ((ours - ref) * torch.tensor(STD).view(1, 3, 1, 1) * 255).abs()
    assert pixel_units.max().item() <= 2
    assert pixel_units.mean().item() <= 0.4


# the ramp image's values are its coordinates: sides <= 256 (upscale, shrink, portrait, non-square, one resize)
RAMP_CASES = [((256, 256), (150, 200, 3)), ((160, 160), (240, 250, 3)), ((160, 192), (250, 180, 3)),
              ((256, 256), (256, 170, 3))]


@pytest.mark.parametrize("input_size, shape", RAMP_CASES)
def test_fit_stretch_boxes_map_back_to_the_original_image(input_size, shape):
    """The inverse (ImageTransform + the pipeline's to_original) against the pixels themselves: an image whose
    value is its own column (and row) index, resized twice in float by the torch path, puts at input pixel j
    the value of original coordinate x = (j + 0.5) / ratio (pixel centres; bilinear reproduces a linear ramp),
    so the transform is where the pixels came from. Boxes then go back as libreyolo maps a stretched
    DETR box (normalised x original size), and a box carried through both resizes' own scales comes back."""
    from harness.pipeline.postprocess import BatchCandidates, to_original
    from harness.pipeline.preprocess import preprocess_tensors

    h, w = shape[:2]
    rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
    image = np.stack([cols, rows, np.zeros_like(cols)], axis=-1).astype(np.uint8)  # BGR: blue = column
    spec = PreprocessSpec(input_size=input_size, resize="fit_stretch", library="torch")
    (got,), (t,) = preprocess_tensors([image], spec)
    (in_h, in_w), (rx, ry) = input_size, t.ratio
    x = (np.arange(in_w) + 0.5) / rx  # original coordinate of each input column's centre
    y = (np.arange(in_h) + 0.5) / ry
    inner_x, inner_y = (x > 2) & (x < w - 2), (y > 2) & (y < h - 2)  # away from the edge clamping
    np.testing.assert_allclose(got[0].numpy()[inner_y][:, inner_x], np.broadcast_to(x[inner_x] - 0.5, (
        inner_y.sum(), inner_x.sum())), atol=2e-3)
    np.testing.assert_allclose(got[1].numpy()[inner_y][:, inner_x].T, np.broadcast_to(y[inner_y] - 0.5, (
        inner_x.sum(), inner_y.sum())), atol=2e-3)

    fh, fw = _fit_size(shape, input_size)
    original = torch.tensor([[0.0, 0.0, w, h], [w * 0.25, h * 0.1, w * 0.6, h * 0.9], [3.5, 7.25, 11.0, 19.5]],
                            dtype=torch.float64)
    step = torch.tensor([fw / w, fh / h] * 2, dtype=torch.float64) * torch.tensor([in_w / fw, in_h / fh] * 2,
                                                                                   dtype=torch.float64)
    boxes = original * step  # through the fit's scale, then the stretch's
    cands = BatchCandidates(boxes, torch.ones(3), torch.zeros(3, dtype=torch.long), torch.zeros(3, dtype=torch.long),
                            [3])
    back = to_original(cands, [t])
    torch.testing.assert_close(back, original, rtol=0, atol=1e-9)
    normalised = boxes / torch.tensor([in_w, in_h] * 2, dtype=torch.float64)  # libreyolo: box_norm x original size
    torch.testing.assert_close(back, normalised * torch.tensor([w, h] * 2, dtype=torch.float64), rtol=0, atol=1e-9)


def test_scale_by_a_reciprocal_divides_bit_for_bit():
    """scale 1/255 is x / 255 as numpy (and libreyolo's validator, ToTensor) compute it, not x * float32(1/255),
    which is 1 ulp off on 126 of the 256 pixel values; mean/std then as numpy does them in float32."""
    image = np.arange(256 * 3, dtype=np.uint16).reshape(16, 16, 3).astype(np.uint8)  # every value, each channel
    spec = PreprocessSpec(input_size=(16, 16), resize="stretch", channel_order="RGB", scale=1 / 255, mean=MEAN,
                          std=STD)
    got, _ = preprocess_batch([image], spec)
    chw = image[:, :, ::-1].transpose(2, 0, 1).astype(np.float32) / 255.0
    want = (chw - np.float32(MEAN).reshape(3, 1, 1)) / np.float32(STD).reshape(3, 1, 1)
    assert np.array_equal(got[0].numpy(), want)


@pytest.mark.parametrize("shape", [(525, 300, 3), (300, 525, 3)])
def test_a_size_that_rounds_up_past_the_input_is_the_input_size(shape):
    """Ultralytics' long-side resize rounds up (ceil) and clamps to the input: 525 x (640 / 525) is a hair over
    640 in floating point, so ceil gives 641 unclamped. The image must fill the long side exactly (640, centre
    padded along the other), as Ultralytics' own `min(ceil(w0 * r), 640)` puts it."""
    import math

    import cv2

    spec = PreprocessSpec(input_size=(640, 640), resize="letterbox", pad_position="center", channel_order="RGB",
                          size_rounding="ceil")
    image = np.random.default_rng(3).integers(0, 256, shape, dtype=np.uint8)
    (got,), (t,) = preprocess_batch([image], spec)
    h, w = shape[:2]
    r = 640 / max(h, w)
    assert math.ceil(max(h, w) * r) == 641  # the float hair this case is about
    nh, nw = min(math.ceil(h * r), 640), min(math.ceil(w * r), 640)
    top, left = (640 - nh) // 2, (640 - nw) // 2
    want = np.full((640, 640, 3), 114, np.uint8)
    want[top:top + nh, left:left + nw] = cv2.resize(image, (nw, nh), interpolation=cv2.INTER_LINEAR)[:, :, ::-1]
    assert t.resized == (nh, nw) and t.pad == (float(left), float(top)) and t.ratio == (r, r)
    assert np.array_equal(got.permute(1, 2, 0).numpy(), want.astype(np.float32))
