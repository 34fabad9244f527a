"""Batched preprocessing: decode, resize/letterbox into one uint8 buffer, collate to [B,3,H,W]."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import torch

from harness.errors import UsageError
from harness.models.protocol import PreprocessSpec


@dataclass(frozen=True)
class ImageTransform:
    """How one original image maps into the input tensor: x_in = x_orig * ratio + pad."""

    ratio: tuple[float, float]  # (x, y)
    pad: tuple[float, float]  # (x, y) offset of the image inside the canvas
    orig_size: tuple[int, int]  # (height, width)


def decode_image(path: Path) -> np.ndarray:
    """Read and decode an image to an HxWx3 uint8 BGR array (OpenCV's order)."""
    data = np.fromfile(str(path), dtype=np.uint8)
    image = cv2.imdecode(data, cv2.IMREAD_COLOR)
    if image is None:
        raise UsageError(f"{path} could not be decoded as an image; re-download it")
    return image


def _resize_into(image: np.ndarray, target: np.ndarray) -> None:
    """Bilinear resize of `image` into the view `target`, in place where OpenCV can write to the view."""
    h, w = target.shape[:2]
    resized = cv2.resize(image, (w, h), dst=target, interpolation=cv2.INTER_LINEAR)
    if resized.ctypes.data != target.ctypes.data:  # this OpenCV allocated a new image instead
        target[:] = resized


def _place(image: np.ndarray, slot: np.ndarray, spec: PreprocessSpec) -> ImageTransform:
    """Resize one BGR image straight into its canvas slot [H,W,3] and fill the rest with the pad value.

    cv2.resize writes into the slot's view (no intermediate image), and only the pad area is filled:
    this stage is memory-bound, and its memory traffic costs most right after a forward (measured:
    the whole letterbox + collate 5.9 -> 5.2 ms per batch of 8 there, output identical)."""
    h, w = image.shape[:2]
    in_h, in_w = spec.input_size
    if spec.resize == "stretch":
        _resize_into(image, slot)
        return ImageTransform((in_w / w, in_h / h), (0.0, 0.0), (h, w))
    r = min(in_h / h, in_w / w)
    new_h, new_w = int(h * r), int(w * r)  # truncation, as YOLOX's reference transform does
    top, left = ((in_h - new_h) // 2, (in_w - new_w) // 2) if spec.pad_position == "center" else (0, 0)
    _resize_into(image, slot[top:top + new_h, left:left + new_w])
    slot[:top] = spec.pad_value
    slot[top + new_h:] = spec.pad_value
    slot[top:top + new_h, :left] = spec.pad_value
    slot[top:top + new_h, left + new_w:] = spec.pad_value
    return ImageTransform((r, r), (float(left), float(top)), (h, w))


def preprocess_batch(images: list[np.ndarray], spec: PreprocessSpec) -> tuple[torch.Tensor, list[ImageTransform]]:
    """Letterbox/resize each BGR image into one uint8 buffer, then one conversion to float [B,3,H,W]."""
    in_h, in_w = spec.input_size
    canvas = np.empty((len(images), in_h, in_w, 3), dtype=np.uint8)
    transforms = [_place(image, canvas[i], spec) for i, image in enumerate(images)]
    hwc = torch.from_numpy(canvas)
    if spec.channel_order == "RGB":
        hwc = hwc.flip(-1)
    batch = torch.empty((len(images), 3, in_h, in_w), dtype=torch.float32)
    batch.copy_(hwc.permute(0, 3, 1, 2))  # one pass: uint8 NHWC -> float32 NCHW
    if spec.scale != 1.0:
        batch.mul_(spec.scale)
    if spec.mean is not None:
        batch.sub_(torch.tensor(spec.mean).view(1, 3, 1, 1))
    if spec.std is not None:
        batch.div_(torch.tensor(spec.std).view(1, 3, 1, 1))
    return batch, transforms
