"""Instance masks of a segment detector: one binary mask per kept detection at the source image's resolution,
encoded as COCO RLE (pycocotools' encoder; counts as ASCII, as COCO results files and libreyolo's evaluator
hold them).

The family's MaskSpec (harness/detector/protocol.py) says what its maps hold and how they are resized; the
work runs on the device the head's tensors are on, one image and at most CHUNK detections at a time: each
chunk's maps are resized, thresholded and copied to the host as bytes, then encoded. A batch never holds
full-resolution masks of more than CHUNK detections (300 masks of one 640x480 image are 92 MB as bytes,
four times that as floats).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from pycocotools import mask as mask_utils

from harness.detector.protocol import MaskMaps, MaskSpec
from harness.pipeline.postprocess import BatchCandidates
from harness.pipeline.preprocess import ImageTransform

CHUNK = 32  # detections whose full-resolution masks exist at once


def batch_masks(maps: MaskMaps, spec: MaskSpec, kept: BatchCandidates, source_boxes: torch.Tensor,
                transforms: Sequence[ImageTransform], input_size: tuple[int, int]) -> list[list[dict]]:
    """Each image's masks (COCO RLE dicts at its source height x width), in the order of its kept detections.
    `kept.boxes` are in input pixels, `source_boxes` the same boxes in source pixels."""
    if kept.rows is None:
        raise ValueError("the segment detector's candidates carry no mask rows (Candidates.rows)")
    out, start = [], 0
    for image, (transform, count) in enumerate(zip(transforms, kept.counts, strict=True)):
        rles: list[dict] = []
        for first in range(start, start + count, CHUNK):
            chunk = slice(first, min(first + CHUNK, start + count))
            on = image_masks(maps, spec, image, kept.rows[chunk], kept.boxes[chunk], source_boxes[chunk],
                             transform, input_size)
            rles += encode(on)
        out.append(rles)
        start += count
    return out


def image_masks(maps: MaskMaps, spec: MaskSpec, image: int, rows: torch.Tensor, input_boxes: torch.Tensor,
                source_boxes: torch.Tensor, transform: ImageTransform, input_size: tuple[int, int]) -> torch.Tensor:
    """Binary masks [n, H, W] (bool, source resolution) of one image's detections at `rows` of its mask head."""
    values = _values(maps, spec, image, rows)
    height, width = transform.orig_size
    # the resized image's place in the input: what is left once the letterbox padding is cropped
    x0, y0 = round(transform.pad[0]), round(transform.pad[1])
    h_in, w_in = transform.resized or (round(height * transform.ratio[1]), round(width * transform.ratio[0]))
    padded = (x0, y0, h_in, w_in) != (0, 0, *input_size)
    if spec.resize == "via_input" or spec.crop_to_box == "input" or padded:
        values = _resize(values, input_size)
        if spec.crop_to_box == "input":
            values = values * inside(input_boxes.to(values.device), input_size).to(values.dtype)
        values = values[:, y0:y0 + h_in, x0:x0 + w_in]
    values = _resize(values, (height, width))
    on = values > 0 if spec.values == "logits" else values >= 0.5
    if spec.crop_to_box == "source":
        on &= inside(source_boxes.to(on.device), (height, width))
    return on


def _values(maps: MaskMaps, spec: MaskSpec, image: int, rows: torch.Tensor) -> torch.Tensor:
    """The maps of `rows` at the head's resolution [n, h, w], float32: logits or probabilities (MaskSpec.values)."""
    if spec.kind == "query":
        return maps.maps[image, rows.to(maps.maps.device)].float()
    if maps.coefficients is None:
        raise ValueError("prototype masks need each box row's coefficients (MaskMaps.coefficients)")
    prototypes = maps.maps[image].float()  # [P, h, w]
    coefficients = maps.coefficients[image, rows.to(maps.coefficients.device)].float()  # [n, P]
    return (coefficients @ prototypes.flatten(1)).sigmoid().view(-1, *prototypes.shape[1:])


def _resize(values: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """Bilinear, half-pixel centres (align_corners=False, no antialiasing): libreyolo's and Ultralytics' resize."""
    if tuple(values.shape[-2:]) == tuple(size):
        return values
    return F.interpolate(values[:, None], size=tuple(size), mode="bilinear", align_corners=False)[:, 0]


def inside(boxes: torch.Tensor, size: tuple[int, int]) -> torch.Tensor:
    """[n, h, w] bool: pixel (x, y) of an h x w grid lies in its row's xyxy box (x1 <= x < x2, y1 <= y < y2)."""
    h, w = size
    ys = torch.arange(h, device=boxes.device, dtype=boxes.dtype)[None, :, None]
    xs = torch.arange(w, device=boxes.device, dtype=boxes.dtype)[None, None, :]
    x1, y1, x2, y2 = (boxes[:, k, None, None] for k in range(4))
    return (xs >= x1) & (xs < x2) & (ys >= y1) & (ys < y2)


def encode(on: torch.Tensor) -> list[dict]:
    """COCO RLE of binary masks [n, H, W]: pycocotools' encoder on a Fortran-ordered uint8 [H, W, n] array."""
    if on.shape[0] == 0:
        return []
    # [n, W, H] contiguous, seen as [H, W, n], is Fortran order: no copy on the host
    fortran = on.transpose(1, 2).to(torch.uint8).contiguous().cpu().numpy().transpose(2, 1, 0)
    rles = mask_utils.encode(np.asfortranarray(fortran))
    for rle in rles:
        rle["counts"] = rle["counts"].decode("ascii")
    return rles
