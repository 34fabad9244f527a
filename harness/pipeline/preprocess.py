"""Batched preprocessing: decode, resize/letterbox into one buffer, collate to [B,3,H,W].

Every convention a family needs is in its PreprocessSpec (harness/detector/protocol.py): letterbox,
stretch or fit-then-stretch, fit margin (long side then pad), rounding, pad position/value, channel order,
scale/mean/std, and the resize library (cv2, PIL, torch) with its interpolation.

Implementations (`--preprocess`): "cv2" and "pil" resize uint8 BGR arrays decoded by cv2; "torch" takes RGB CHW
uint8 tensors (cv2's pixels on the host, nvJPEG's on CUDA) and letterboxes in float with
F.interpolate on whatever device the images are on (harness/pipeline/gpu.py keeps them on the GPU)."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import cv2
import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from harness.data.images import HOW_TO_FIX
from harness.detector.protocol import PreprocessSpec
from harness.errors import UsageError
from harness.pipeline.scratch import HOST_BYTES


@dataclass(frozen=True)
class ImageTransform:
    """How one original image maps into the input tensor: x_in = x_orig * ratio + pad."""

    ratio: tuple[float, float]  # (x, y)
    pad: tuple[float, float]  # (x, y) offset of the image inside the canvas
    orig_size: tuple[int, int]  # (height, width)
    resized: tuple[int, int] | None = None  # (height, width) of the image inside the canvas, as resized

def decode_image(path: Path) -> np.ndarray:
    """Read and decode an image to an HxWx3 uint8 BGR array (OpenCV's order)."""
    return decode_bytes(np.fromfile(str(path), dtype=np.uint8), path)


def decode_bytes(data: bytes | np.ndarray, path: Path) -> np.ndarray:
    """Decode an image file's bytes (already in memory) to HxWx3 uint8 BGR; `path` names it in errors."""
    image = cv2.imdecode(np.frombuffer(data, dtype=np.uint8), cv2.IMREAD_COLOR)
    if image is None:
        raise UsageError(f"image {path} could not be decoded by cv2; {HOW_TO_FIX}")
    return image


def decode_tensor(data: bytes | np.ndarray, path: Path) -> torch.Tensor:
    """Decode an image file's bytes on the host to the torch implementation's 3xHxW uint8 RGB tensor: cv2's pixels
    (`decode_bytes`), channels in RGB order. One host decoder for every implementation: TorchCodec's and torchvision's
    tensor decoders differ from cv2 on files the dataset check passes (the orientation of a JPEG whose XMP block comes
    before its EXIF one, a CMYK JPEG by a unit, an APNG's default image; torchvision's PNG decoder crashes the process
    on corrupt pixel data), and torchvision's is deprecated from 0.29; the torch implementation's own work is its
    float letterbox, and on CUDA nvJPEG (gpu.py)."""
    return torch.from_numpy(np.ascontiguousarray(decode_bytes(data, path)[..., ::-1].transpose(2, 0, 1)))


IMPLEMENTATIONS = ("cv2", "torch", "pil")
PREPROCESS_CHOICES = ("auto", *IMPLEMENTATIONS)


def resolve_implementation(spec: PreprocessSpec, choice: str, cuda: bool) -> PreprocessSpec:
    """The spec with the resize library `--preprocess` asks for. "auto": torch on CUDA (the device-resident
    path), else the family's own library (cv2 for most; torchvision families are defined with torch)."""
    if choice not in PREPROCESS_CHOICES:
        raise UsageError(f"--preprocess {choice!r}: use one of {', '.join(PREPROCESS_CHOICES)}")
    library = ("torch" if cuda else spec.library) if choice == "auto" else choice
    return replace(spec, library=library)


CV2_INTERPOLATION = {"linear": cv2.INTER_LINEAR, "area": cv2.INTER_AREA, "cubic": cv2.INTER_CUBIC,
                     "nearest": cv2.INTER_NEAREST}
PIL_RESAMPLE = {"linear": Image.Resampling.BILINEAR, "area": Image.Resampling.BOX, "cubic": Image.Resampling.BICUBIC,
                "nearest": Image.Resampling.NEAREST}
TORCH_MODE = {"linear": "bilinear", "area": "area", "cubic": "bicubic", "nearest": "nearest"}
ROUNDING = {"floor": math.floor, "round": round, "ceil": math.ceil}


@dataclass(frozen=True)
class _Geometry:
    """Where one image goes in the canvas and how it is resized: `resizes` in order, each (height, width,
    interpolation); the last one is (new_h, new_w). A resize to the size the image already has is a no-op."""

    new_h: int
    new_w: int
    top: int
    left: int
    transform: ImageTransform
    resizes: tuple[tuple[int, int, str], ...]


def _interpolation(spec: PreprocessSpec, src: tuple[int, int], dst: tuple[int, int]) -> str:
    shrinks = dst[0] < src[0] or dst[1] < src[1]
    return spec.downscale_interpolation if shrinks and spec.downscale_interpolation else spec.interpolation


def _fit(h: int, w: int, spec: PreprocessSpec) -> tuple[int, int, float]:
    """The aspect-kept size in the fit box (H - margin, W - margin), and its scale r."""
    fit_h, fit_w = spec.input_size[0] - spec.fit_margin, spec.input_size[1] - spec.fit_margin
    r = min(fit_h / h, fit_w / w)
    rounding = ROUNDING[spec.size_rounding]  # floor is int(h * r), as YOLOX's reference transform does
    # at least one pixel: an image far wider than high (1 x 700 at 640) would round to none, which no resize takes
    return (max(1, min(int(rounding(h * r)), fit_h)), max(1, min(int(rounding(w * r)), fit_w)), r)


def _geometry(h: int, w: int, spec: PreprocessSpec) -> _Geometry:
    in_h, in_w = spec.input_size
    if spec.resize in ("stretch", "fit_stretch"):
        new_h, new_w, top, left = in_h, in_w, 0, 0
        # a fit then a stretch compose to input / original per axis: each resize maps x to x * dst / src
        ratio = (in_w / w, in_h / h)
        sizes = [(in_h, in_w)]
        if spec.resize == "fit_stretch":
            sizes.insert(0, _fit(h, w, spec)[:2])
    else:
        new_h, new_w, r = _fit(h, w, spec)
        top, left = ((in_h - new_h) // 2, (in_w - new_w) // 2) if spec.pad_position == "center" else (0, 0)
        ratio = (r, r) if spec.box_scale == "ratio" else (new_w / w, new_h / h)
        sizes = [(new_h, new_w)]
    resizes, src = [], (h, w)
    for dst in sizes:
        resizes.append((*dst, _interpolation(spec, src, dst)))
        src = dst
    return _Geometry(new_h, new_w, top, left, ImageTransform(ratio, (float(left), float(top)), (h, w), (new_h, new_w)),
                     tuple(resizes))


def _pad_per_channel(spec: PreprocessSpec) -> np.ndarray:
    """The pad value per channel, in the spec's channel order."""
    return np.broadcast_to(np.asarray(spec.pad_value, dtype=np.float64), (3,))


def _resize_into(image: np.ndarray, target: np.ndarray, library: str, interpolation: str) -> None:
    """Resize `image` into the view `target`, in place where OpenCV can write to the view."""
    h, w = target.shape[:2]
    if library == "pil":
        # PIL resamples each channel alone, so the BGR array can go in as it is
        target[:] = np.asarray(Image.fromarray(image).resize((w, h), PIL_RESAMPLE[interpolation]))
        return
    resized = cv2.resize(image, (w, h), dst=target, interpolation=CV2_INTERPOLATION[interpolation])
    if resized.ctypes.data != target.ctypes.data:  # this OpenCV allocated a new image instead
        target[:] = resized


def _place(image: np.ndarray, slot: np.ndarray, spec: PreprocessSpec, pad_bgr: np.ndarray) -> ImageTransform:
    """Resize one BGR image straight into its canvas slot [H,W,3] and fill the rest with the pad value.

    cv2.resize writes into the slot's view (no intermediate image), and only the pad area is filled:
    this stage is memory-bound, and its memory traffic costs most right after a forward (measured:
    the whole letterbox + collate 5.9 -> 5.2 ms per batch of 8 there, output identical)."""
    g = _geometry(*image.shape[:2], spec)
    top, left, new_h, new_w = g.top, g.left, g.new_h, g.new_w
    *first, (_, _, last) = g.resizes
    for h, w, interpolation in first:  # fit_stretch's fit: a uint8 image of its own, as libreyolo's dataset makes
        if (h, w) != image.shape[:2]:
            fitted = np.empty((h, w, 3), dtype=np.uint8)
            _resize_into(image, fitted, spec.library, interpolation)
            image = fitted
    _resize_into(image, slot[top:top + new_h, left:left + new_w], spec.library, last)
    slot[:top] = pad_bgr
    slot[top + new_h:] = pad_bgr
    slot[top:top + new_h, :left] = pad_bgr
    slot[top:top + new_h, left + new_w:] = pad_bgr
    return g.transform


def _as_rgb_chw(image: np.ndarray | torch.Tensor) -> torch.Tensor:
    """A cv2-decoded HxWx3 BGR array, or a torchvision-decoded 3xHxW RGB tensor -> 3xHxW RGB uint8 tensor."""
    if isinstance(image, torch.Tensor):
        return image
    return torch.from_numpy(image).permute(2, 0, 1).flip(0)


def preprocess_tensors(images: list[np.ndarray | torch.Tensor], spec: PreprocessSpec,
                       device: torch.device | None = None, whole_batch: bool = False,
                       scratch: int = HOST_BYTES) -> tuple[torch.Tensor, list[ImageTransform]]:
    """library "torch": resize in float with F.interpolate (bilinear: antialias off, align_corners off; no
    uint8 rounding), as torchvision's GeneralizedRCNNTransform does, into a canvas filled with the pad value,
    on `device` (default: the first image's). Every spec field applies: geometry, pad, channel order,
    scale/mean/std. Bilinear weights sum to 1, so resizing before or after normalising differs only by float
    rounding. Images on the GPU (nvJPEG) stay there: this is the device-resident letterbox.

    `whole_batch` (where `whole_batch_letterbox` allows the spec): the same bilinear resize for all images in a fixed
    number of tensor operations (letterbox_whole_batch) instead of a handful per image, in chunks of images whose
    temporaries fit `scratch` bytes (scratch.scratch_bytes)."""
    in_h, in_w = spec.input_size
    rgb = [_as_rgb_chw(image) for image in images]
    device = device if device is not None else (rgb[0].device if rgb else torch.device("cpu"))
    geometries = [_geometry(*chw.shape[1:], spec) for chw in rgb]
    transforms = [g.transform for g in geometries]
    if whole_batch and rgb and whole_batch_letterbox(spec):
        rgb = [chw.to(device, non_blocking=True) for chw in rgb]
        per_chunk = max(1, scratch // (LETTERBOX_BYTES_PER_ENTRY * 3 * in_h * in_w))
        parts = [letterbox_whole_batch(rgb[i:i + per_chunk], geometries[i:i + per_chunk], spec)
                 for i in range(0, len(rgb), per_chunk)]
        batch = parts[0] if len(parts) == 1 else torch.cat(parts)
        _normalise(batch, spec)
        return batch, transforms
    batch = torch.empty((len(images), 3, in_h, in_w), dtype=torch.float32, device=device)
    # the pad value everywhere at once, then each image's area written over it: one fill per batch, not per image
    batch[:] = torch.tensor(_pad_per_channel(spec).astype(np.float32), device=device).view(3, 1, 1)
    for i, (chw, g) in enumerate(zip(rgb, geometries, strict=True)):
        chw = chw.to(device, non_blocking=True)
        if spec.channel_order == "BGR":
            chw = chw.flip(0)
        pixels = chw.float()
        for h, w, interpolation in g.resizes:  # fit_stretch: both resizes in float (no uint8 rounding between)
            if (h, w) != tuple(pixels.shape[1:]):
                mode = TORCH_MODE[interpolation]
                pixels = F.interpolate(pixels[None], size=(h, w), mode=mode, antialias=False,
                                       align_corners=False if mode in ("bilinear", "bicubic") else None)[0]
        batch[i, :, g.top:g.top + g.new_h, g.left:g.left + g.new_w] = pixels
    _normalise(batch, spec)
    return batch, transforms


# Scratch bytes per canvas entry of the whole-batch letterbox: a corner's index (int32), its pixels (uint8, then
# float32), and the two weighted rows (float32)
LETTERBOX_BYTES_PER_ENTRY = 16


def whole_batch_letterbox(spec: PreprocessSpec) -> bool:
    """Whether letterbox_whole_batch does this spec's resize: one bilinear resize per image (letterbox or stretch)."""
    return spec.resize != "fit_stretch" and spec.interpolation == "linear" and \
        spec.downscale_interpolation in (None, "linear")


def _bilinear_axis(canvas: int, offset: np.ndarray, new: np.ndarray, source: np.ndarray):
    """Along one axis, for each image (rows) and canvas position (columns): the two source indices, the second's
    weight, and whether the position is inside the resized image. F.interpolate's bilinear rule (align_corners off),
    in float32 as its kernels compute it: source = (position + 0.5) * (source_size / new_size) - 0.5, at least 0,
    the last index repeated at the edge."""
    position = np.arange(canvas)[None, :] - offset[:, None]
    inside = (position >= 0) & (position < new[:, None])
    scale = source.astype(np.float32) / new.astype(np.float32)
    real = np.maximum(scale[:, None] * (position.astype(np.float32) + np.float32(0.5)) - np.float32(0.5),
                      np.float32(0))
    last = (source - 1)[:, None]
    first = np.minimum(real.astype(np.int64), last)  # truncation is the floor: real >= 0
    weight = np.clip(real - first.astype(np.float32), 0, 1, dtype=np.float32)
    return first, np.minimum(first + 1, last), weight, inside


def letterbox_whole_batch(images: list[torch.Tensor], geometries: list[_Geometry],
                          spec: PreprocessSpec) -> torch.Tensor:
    """Every image (3xHxW uint8 RGB, on one device) resized bilinearly into its place in the float canvas
    [B,3,H,W], the rest the pad value, not yet normalised: F.interpolate's rule per image (to float rounding), in some
    forty tensor operations and a view per image. On a GPU the per-image way costs a handful of kernel launches
    and Python calls an image, each taking the interpreter lock that the forward's launches need too; no kept library
    resizes images of different sizes in one call (torchvision and kornia resize one size at a time).

    The images go into one flat buffer; each output pixel reads its four source pixels from it by index. The
    indices and weights along each axis are worked out on the host (numpy: small tables, no tensor call) and go up
    in two copies; the temporaries are about LETTERBOX_BYTES_PER_ENTRY bytes per canvas entry (0.6 GB for 32 images
    at 640: a GPU's memory and compute, not a CPU's, so the host path resizes image by image)."""
    device, (in_h, in_w), count = images[0].device, spec.input_size, len(images)
    flat = torch.cat([image.reshape(-1) for image in images])
    height = np.array([image.shape[1] for image in images])
    width = np.array([image.shape[2] for image in images])
    new_h, new_w = np.array([g.new_h for g in geometries]), np.array([g.new_w for g in geometries])
    top, left = np.array([g.top for g in geometries]), np.array([g.left for g in geometries])
    y0, y1, wy, inside_y = _bilinear_axis(in_h, top, new_h, height)
    x0, x1, wx, inside_x = _bilinear_axis(in_w, left, new_w, width)
    plane = height * width
    start = np.cumsum(plane * 3) - plane * 3
    channel = np.array([2, 1, 0] if spec.channel_order == "BGR" else [0, 1, 2])  # RGB images
    # one integer table [B, 3 + 2H + 2W] (each output channel's plane start, the two source rows' starts, the two
    # source columns) and one float32 table [B, 2H + 2W] (the weights, and 1 / 0 for inside / outside the image)
    indices = np.concatenate([start[:, None] + channel[None, :] * plane[:, None], y0 * width[:, None],
                              y1 * width[:, None], x0, x1], axis=1)
    # int32 indices (half the memory of int64) while the flat buffer's positions fit them
    indices = indices.astype(np.int32 if flat.numel() < 2**31 else np.int64)
    weights = np.concatenate([wy, wx, inside_y, inside_x], axis=1, dtype=np.float32)
    indices, weights = (torch.from_numpy(t).to(device, non_blocking=True) for t in (indices, weights))
    planes, rows0, rows1, cols0, cols1 = indices.split([3, in_h, in_h, in_w, in_w], dim=1)
    wy, wx, inside_y, inside_x = weights.split([in_h, in_w, in_h, in_w], dim=1)
    planes, rows0, rows1 = planes.view(count, 3, 1, 1), rows0.view(count, 1, in_h, 1), rows1.view(count, 1, in_h, 1)
    cols0, cols1, wx = cols0.view(count, 1, 1, in_w), cols1.view(count, 1, 1, in_w), wx.view(count, 1, 1, in_w)
    wy = wy.view(count, 1, in_h, 1)

    rows0, rows1 = planes + rows0, planes + rows1  # [B, 3, H, 1]: where each output row reads, per channel

    def pixels(rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        index = rows + cols
        return flat.index_select(0, index.view(-1)).view(index.shape).float()

    # the CUDA kernel's order: each row's two columns weighted, then the two rows
    upper = pixels(rows0, cols0).mul_(1 - wx).add_(pixels(rows0, cols1).mul_(wx))
    lower = pixels(rows1, cols0).mul_(1 - wx).add_(pixels(rows1, cols1).mul_(wx))
    batch = upper.mul_(1 - wy).add_(lower.mul_(wy))
    inside = inside_y.view(count, 1, in_h, 1) * inside_x.view(count, 1, 1, in_w)  # 1 inside, 0 in the pad
    pad = torch.from_numpy(_pad_per_channel(spec).astype(np.float32)).to(device, non_blocking=True).view(1, 3, 1, 1)
    return torch.where(inside.bool(), batch, pad)


def _normalise(batch: torch.Tensor, spec: PreprocessSpec) -> None:
    divisor = 1 / spec.scale
    if spec.scale != 1.0 and abs(divisor - round(divisor)) < 1e-9:
        # x / 255, not x * float32(1/255) (1 ulp apart on half the pixel values): the references (libreyolo,
        # ToTensor) divide, and a DETR's query selection on near-tied scores can flip on 1 ulp of its input
        batch.div_(round(divisor))
    elif spec.scale != 1.0:
        batch.mul_(spec.scale)
    if spec.mean is not None:
        batch.sub_(torch.tensor(spec.mean, device=batch.device).view(1, 3, 1, 1))
    if spec.std is not None:
        batch.div_(torch.tensor(spec.std, device=batch.device).view(1, 3, 1, 1))


def preprocess_batch(images: list[np.ndarray], spec: PreprocessSpec) -> tuple[torch.Tensor, list[ImageTransform]]:
    """Resize each BGR image as the spec says into one buffer, then one conversion to float [B,3,H,W].

    cv2/PIL resize uint8 images into one uint8 canvas (letterbox_canvas) and convert it (canvas_to_batch);
    "torch" resizes in float (see preprocess_tensors) and also takes torchvision-decoded RGB tensors."""
    if spec.library == "torch":
        return preprocess_tensors(images, spec)
    canvas, transforms = letterbox_canvas(images, spec)
    return canvas_to_batch(canvas, spec), transforms


def letterbox_canvas(images: list[np.ndarray], spec: PreprocessSpec, pinned: bool = False,
                     out: torch.Tensor | None = None) -> tuple[torch.Tensor, list[ImageTransform]]:
    """cv2/PIL: each BGR image resized as the spec says straight into its slot of one uint8 canvas [B,H,W,3] (BGR,
    padded), in page-locked memory with `pinned` (a GPU copies it without staging, while the host goes on), or into
    `out` (a host uint8 tensor of that shape, e.g. in shared memory)."""
    in_h, in_w = spec.input_size
    shape = (len(images), in_h, in_w, 3)
    if out is not None and (tuple(out.shape) != shape or out.dtype != torch.uint8 or not out.is_contiguous()):
        raise ValueError(f"out must be a contiguous uint8 tensor of shape {list(shape)}, not {list(out.shape)} "
                         f"{out.dtype}")
    canvas = out if out is not None else torch.empty(shape, dtype=torch.uint8, pin_memory=pinned)
    slots = canvas.numpy()  # the same memory: cv2 writes into its views
    pad = _pad_per_channel(spec)
    pad_bgr = np.rint(pad[::-1] if spec.channel_order == "RGB" else pad).astype(np.uint8)  # the canvas is BGR
    transforms = [_place(image, slots[i], spec, pad_bgr) for i, image in enumerate(images)]
    return canvas, transforms


def canvas_to_batch(canvas: torch.Tensor, spec: PreprocessSpec) -> torch.Tensor:
    """A letterboxed uint8 canvas [B,H,W,3] (BGR) -> the float [B,3,H,W] model input, in the spec's channel order
    and scaled/normalised, on the canvas's device: one pass uint8 NHWC -> float32 NCHW, then in place."""
    hwc = canvas.flip(-1) if spec.channel_order == "RGB" else canvas
    batch = torch.empty((canvas.shape[0], 3, *canvas.shape[1:3]), dtype=torch.float32, device=canvas.device)
    batch.copy_(hwc.permute(0, 3, 1, 2))
    _normalise(batch, spec)
    return batch
