"""torchvision detectors on the shared pipeline: SSDLite, Faster R-CNN, RetinaNet, FCOS.

torchvision's own `model(images)` resizes inside forward (GeneralizedRCNNTransform), runs the network
and post-processes. Here the pieces are split as docs/families-and-backends.md says:

- preprocessing = its transform, done by the harness: RGB / 255, the model's mean/std, a float bilinear
  resize (`library="torch"`), boxes rescaled per axis by resized / original size. SSDLite stretches to a
  fixed size, as torchvision does. The others keep the aspect ratio: the long side goes to the input
  size S, the image sits top-left on an S x S canvas padded with the mean (0 after normalisation). That
  is exactly torchvision's transform with min_size = max_size = S and size_divisible = S (the parity
  tests configure it so). torchvision's default instead scales the short side to min_size (800, or 320
  for the mobile Faster R-CNN) and pads each batch to its own largest image: not a fixed input size, so
  not what a per-input-size benchmark can run. The default S is the long side torchvision gives a 4:3
  COCO image, rounded up to a multiple of 32 (1067 -> 1088, 427 -> 448).
- core = backbone + head (a batched [B,3,H,W] tensor in, raw head tensors out), on any backend.
- decode = the model's own box coder and anchors (its anchor generator, run once per input size), and
  its own pre-NMS selection (per class top-k for SSD, per level top-k for RetinaNet/FCOS, softmax over
  classes for SSD and Faster R-CNN). Then the shared post-processing: kind "nms", multi-label, boxes
  clipped to the image before NMS, class-aware NMS, max_det: torchvision's own thresholds.
- Faster R-CNN is two-stage: proposals (RPN: top-k + NMS) decide which regions the second stage pools,
  so no data-independent core boundary exists inside it. Its core is the whole network minus the
  transform and minus the final box post-processing: backbone, RPN (with its NMS) and RoI box head,
  returning class logits, box deltas and the proposals per image. The RPN clips proposals to each
  image's area, as torchvision's does; the core sees only the batch tensor and reads the areas from
  the padding (`image_areas`). Its outputs have a data-dependent length, so it runs on `pytorch` only
  (no export with a dynamic batch).

Labels are torchvision's: the COCO category id itself (91 entries, 0 = background), so `class_map` is
the identity. Weights: torchvision's own download/cache (`$TORCH_HOME`), a state_dict file
(`--weights PATH`, loaded with weights_only=True), or `--weights random` (timing only: seeded init, see
`_randomise`).
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import sys
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch
from torch import nn

from harness.detector.graph import count_flops
from harness.detector.ops import top_k_per_group
from harness.detector.protocol import (
    RANDOM_WEIGHTS,
    Candidates,
    ModelStats,
    PostprocessSpec,
    PreprocessSpec,
    WeightsInfo,
)
from harness.detector.source import CoreSource
from harness.errors import UsageError
from harness.files import file_sha256

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
RANDOM_SEED = 0
# |normalised value| of the mean padding: 0 on a float canvas (torch), but a uint8 canvas (cv2, pil) rounds the
# mean (123.675, 116.28, 103.53) to whole levels, up to half a level off: 0.5 / 255 / std, 0.0088 at most
PAD_TOLERANCE = 0.5 / 255 / min(IMAGENET_STD) + 1e-6
CALIBRATION_SIZE = 256  # --weights random: BatchNorm statistics from noise images of this size


@dataclass(frozen=True)
class TorchvisionModel:
    """One torchvision detector: its builder, architecture kind and torchvision's own eval settings."""

    kind: str  # ssd | retinanet | fcos | fasterrcnn
    input_size: int
    resize: str  # stretch (SSDLite's fixed size) | letterbox
    mean: tuple[float, float, float]
    std: tuple[float, float, float]
    postprocess: PostprocessSpec  # torchvision's score_thresh, nms_thresh, detections_per_img
    topk_candidates: int | None = None  # pre-NMS top-k: per class (SSD) or per level (RetinaNet/FCOS)
    random_prior: float | None = None  # --weights random: sigmoid classification prior that yields detections
    random_background_logit: float | None = None  # --weights random: softmax background bias (see _randomise)
    # torchvision builds the backbone with FrozenBatchNorm2d (statistics and affine as buffers) when it is given
    # weights: a build without them (--weights random or a state_dict) is given the same layers
    frozen_backbone_bn: bool = False


MODELS: dict[str, TorchvisionModel] = {
    "ssdlite320_mobilenet_v3_large": TorchvisionModel(
        "ssd", 320, "stretch", (0.5, 0.5, 0.5), (0.5, 0.5, 0.5),
        PostprocessSpec("nms", conf=0.001, iou=0.55, max_det=300, multi_label=True, clip_before_nms=True),
        topk_candidates=300, random_background_logit=8.0),
    "fasterrcnn_mobilenet_v3_large_320_fpn": TorchvisionModel(
        "fasterrcnn", 448, "letterbox", IMAGENET_MEAN, IMAGENET_STD,
        PostprocessSpec("nms", conf=0.05, iou=0.5, max_det=100, multi_label=True, clip_before_nms=True,
                        min_box_size=1e-2), frozen_backbone_bn=True),
    "retinanet_resnet50_fpn_v2": TorchvisionModel(
        "retinanet", 1088, "letterbox", IMAGENET_MEAN, IMAGENET_STD,
        PostprocessSpec("nms", conf=0.05, iou=0.5, max_det=300, multi_label=True, clip_before_nms=True),
        topk_candidates=1000),
    "fcos_resnet50_fpn": TorchvisionModel(
        "fcos", 1088, "letterbox", IMAGENET_MEAN, IMAGENET_STD,
        PostprocessSpec("nms", conf=0.2, iou=0.6, max_det=100, multi_label=True, clip_before_nms=True),
        topk_candidates=1000, random_prior=0.08, frozen_backbone_bn=True),
}
HEAD_OUTPUTS = {"ssd": ("bbox_regression", "cls_logits"), "retinanet": ("cls_logits", "bbox_regression"),
                "fcos": ("cls_logits", "bbox_regression", "bbox_ctrness")}


class DenseHeadCore(nn.Module):
    """Backbone + head of a one-stage torchvision detector: raw head tensors [B, anchors, ...]."""

    def __init__(self, model: nn.Module, outputs: tuple[str, ...]):
        super().__init__()
        self.backbone, self.head, self.outputs = model.backbone, model.head, outputs

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        features = self.backbone(x)
        head = self.head(list(features.values()))
        return tuple(head[k] for k in self.outputs)


class TwoStageCore(nn.Module):
    """Faster R-CNN minus transform and final post-processing (see the module docstring).

    Returns class logits [P, C], box deltas [P, C*4] and proposals [P, 4] (input pixels) of the P
    proposals of all images together, in image order, and the proposal count of each image [B]."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.backbone, self.rpn, self.roi_heads = model.backbone, model.rpn, model.roi_heads

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        from torchvision.models.detection.image_list import ImageList

        canvas = [(x.shape[-2], x.shape[-1])] * x.shape[0]
        features = self.backbone(x)
        proposals, _ = self.rpn(ImageList(x, image_areas(x)), features)
        # RoI pooling infers each level's scale from the image size: the canvas gives the exact stride
        pooled = self.roi_heads.box_roi_pool(features, proposals, canvas)
        class_logits, box_deltas = self.roi_heads.box_predictor(self.roi_heads.box_head(pooled))
        counts = torch.tensor([p.shape[0] for p in proposals], device=x.device)
        return class_logits, box_deltas, torch.cat(proposals), counts


def image_areas(x: torch.Tensor) -> list[tuple[int, int]]:
    """Each image's (height, width) inside a top-left letterboxed batch, read from the padding.

    The RPN clips proposals to each image, as torchvision does with its transform's image sizes; the
    core gets only the batch tensor, but the padding is the mean, 0 after normalisation (up to float
    rounding, or a uint8 canvas's rounding of the mean: < PAD_TOLERANCE), and an image row or column is not: every
    pixel of it, in all three channels, would have to be the mean (124, 116, 104) to the level; so the last row
    and column with a value off 0 bound the image."""
    filled = (x.abs() > PAD_TOLERANCE).any(dim=1)  # [B, H, W]
    rows, cols = filled.any(dim=2), filled.any(dim=1)
    height = rows.shape[1] - rows.flip(1).to(torch.uint8).argmax(dim=1)
    width = cols.shape[1] - cols.flip(1).to(torch.uint8).argmax(dim=1)
    return [(int(h), int(w)) for h, w in zip(height.tolist(), width.tolist(), strict=True)]


def _checkpoint_path(weights: Any) -> Path:
    """Where torch.hub keeps a torchvision weights file."""
    return Path(torch.hub.get_dir()) / "checkpoints" / os.path.basename(urlparse(weights.url).path)


def cached_weights(name: str) -> Path | None:
    """torchvision's DEFAULT weights file for this model in the torch.hub cache, if present."""
    from torchvision.models import get_model_weights

    path = _checkpoint_path(get_model_weights(name).DEFAULT)
    return path if path.is_file() else None


class TorchvisionDetector:
    """A torchvision detector; `weights` None (torchvision's DEFAULT), a state_dict path, or "random". `fetch`
    False: the DEFAULT weights are not downloaded when torchvision's cache lacks them (the architecture alone, for a
    dry run or inspect)."""

    family = "torchvision"
    weights_missing = False  # built without fetching its weights (fetch=False): the architecture alone

    def __init__(self, name: str, weights: str | Path | None = None, fetch: bool = True):
        if name not in MODELS:
            raise UsageError(f"unknown torchvision detector {name!r}; known: {', '.join(MODELS)}")
        self.model_id = self.variant = name
        self.config = MODELS[name]
        self.postprocess = self.config.postprocess
        self.defaults = self.postprocess.defaults
        self.class_map = tuple(range(91))
        size = (self.config.input_size,) * 2
        mean255 = tuple(m * 255.0 for m in self.config.mean)  # pads to 0 after normalisation, as torchvision
        self.preprocess = PreprocessSpec(
            input_size=size, resize=self.config.resize, pad_position="top-left", pad_value=mean255,
            channel_order="RGB", scale=1 / 255, mean=self.config.mean, std=self.config.std, library="torch",
            interpolation="linear", box_scale="size")
        self.model, self.weights = self._build(weights, fetch)
        self._anchors: dict[tuple[int, int], tuple[torch.Tensor, list[int]]] = {}

    def _build(self, weights: str | Path | None, fetch: bool = True) -> tuple[nn.Module, WeightsInfo]:
        from torchvision.models import detection, get_model_weights

        builder = getattr(detection, self.model_id)
        if weights == RANDOM_WEIGHTS:
            torch.manual_seed(RANDOM_SEED)
            model = builder(weights=None, weights_backbone=None).eval()
            self._randomise(model)
            return self._as_official(model), WeightsInfo(file=RANDOM_WEIGHTS, sha256=None, source=RANDOM_WEIGHTS)
        if weights is not None:
            path = Path(weights)
            if not path.is_file():
                raise UsageError(f"--weights {path}: no such file")
            try:
                state = torch.load(path, map_location="cpu", weights_only=True)
                model = self._as_official(builder(weights=None, weights_backbone=None))
                model.load_state_dict(state)
            except Exception as exc:  # unpickling refused, wrong keys or shapes
                raise UsageError(f"--weights {path} is not a state_dict of {self.model_id} "
                                 f"({type(exc).__name__}: {str(exc).splitlines()[0][:160]})") from exc
            return model.eval(), WeightsInfo(file=path.name, sha256=file_sha256(path), source="--weights")
        official = get_model_weights(self.model_id).DEFAULT
        if not fetch and not _checkpoint_path(official).is_file():
            self.weights_missing = True
            model = self._as_official(builder(weights=None, weights_backbone=None))
            return model.eval(), WeightsInfo(file=_checkpoint_path(official).name, sha256=None,
                                             source=f"torchvision {official} ({official.url}; not downloaded yet)")
        said = io.StringIO()
        try:
            # torchvision's own download + cache (torch.hub), whose "Downloading: ..." line goes to stdout: to stderr
            # once it worked (a failed one is the error's line alone), so that --json output stays JSON only
            with contextlib.redirect_stdout(said):
                model = builder(weights=official)
            sys.stderr.write(said.getvalue())
        except OSError as exc:  # URLError is an OSError
            raise UsageError(f"{self.model_id}: torchvision could not download its weights ({exc}); connect to the "
                             f"internet, put the file at {_checkpoint_path(official)}, or use --weights random "
                             "for a timing-only run") from exc
        path = _checkpoint_path(official)
        return model.eval(), WeightsInfo(file=path.name, sha256=file_sha256(path) if path.is_file() else None,
                                         source=f"torchvision {official} ({official.url})")

    def _as_official(self, model: nn.Module) -> nn.Module:
        """The layers torchvision's weighted build has: its backbone's BatchNorm2d as FrozenBatchNorm2d (values
        kept), so that parameter counts match torchvision's `num_params` whichever way the weights came."""
        if not self.config.frozen_backbone_bn:
            return model
        from torchvision.ops.misc import FrozenBatchNorm2d

        def freeze(parent: nn.Module) -> None:
            for name, child in parent.named_children():
                if type(child) is nn.BatchNorm2d:
                    frozen = FrozenBatchNorm2d(child.num_features, eps=child.eps)
                    for key in ("weight", "bias", "running_mean", "running_var"):
                        getattr(frozen, key).copy_(getattr(child, key).detach())
                    setattr(parent, name, frozen)
                else:
                    freeze(child)

        freeze(model.backbone)
        return model

    def _randomise(self, model: nn.Module) -> None:
        """Random weights that still detect: default init alone gives none (the activations of the randomly
        initialised MobileNet/ResNet vanish through BatchNorm's identity running statistics). So BatchNorm's
        running statistics are computed on seeded noise images (unit variance, as normalised images are);
        where the classification prior keeps every score below the family's threshold (FCOS) the prior is
        raised, SSD's background class dominates, and Faster R-CNN's RPN objectness is spread out.
        Deterministic: same seed, same weights. The post-processing work still differs from trained
        weights' (no weights here to compare with): timing-only runs say so by their label."""
        core = self._core_module(model)  # (in eval mode: only BatchNorm is switched to training below)
        norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
        for bn in norms:
            bn.reset_running_stats()
            bn.momentum = None  # cumulative average over the calibration batches
            bn.train()
        generator = torch.Generator().manual_seed(RANDOM_SEED)
        with torch.no_grad():
            for _ in range(2):
                core(torch.randn(2, 3, CALIBRATION_SIZE, CALIBRATION_SIZE, generator=generator))
        for bn in norms:
            bn.eval()
        if self.config.kind == "fasterrcnn":  # spread the RPN's objectness: near-equal scores make its top-k a lottery
            nn.init.normal_(model.rpn.head.cls_logits.weight, std=0.1)
        if self.config.random_prior is not None:
            prior = self.config.random_prior
            nn.init.constant_(model.head.classification_head.cls_logits.bias, -math.log((1 - prior) / prior))
        if self.config.random_background_logit is not None:
            # A flat softmax puts every (anchor, class) above conf 0.001 (27000 candidates per image after
            # the per-class top-300, an NMS no trained SSD needs); a dominant background, as in a trained
            # model, leaves 0.5k-25k per image on the COCO sample.
            for layer in model.head.classification_head.module_list:
                conv = layer[-1] if isinstance(layer, nn.Sequential) else layer
                with torch.no_grad():
                    conv.bias.view(-1, len(self.class_map))[:, 0] = self.config.random_background_logit

    def _core_module(self, model: nn.Module) -> nn.Module:
        if self.config.kind == "fasterrcnn":
            return TwoStageCore(model).eval()
        return DenseHeadCore(model, HEAD_OUTPUTS[self.config.kind]).eval()

    @cached_property
    def core_source(self) -> CoreSource:
        two_stage = self.config.kind == "fasterrcnn"
        return CoreSource(self.model_id, torch_module=lambda: self._core_module(self.model),
                          exportable=not two_stage,
                          export_note="its proposals have a data-dependent count per image, so no ONNX export "
                                      "with a dynamic batch" if two_stage else "")

    def check_core(self, core, input_size: tuple[int, int]) -> None:
        """Build this input size's anchors before the first timed batch."""
        if self.config.kind != "fasterrcnn":
            self._anchors_for(input_size)

    def _anchors_for(self, input_size: tuple[int, int]) -> tuple[torch.Tensor, list[int]]:
        """The model's own anchors for this input size (its anchor generator on a blank image), and how
        many belong to each feature level."""
        key = (int(input_size[0]), int(input_size[1]))
        if key not in self._anchors:
            from torchvision.models.detection.image_list import ImageList

            x = torch.zeros(1, 3, *key, device=next(self.model.parameters()).device)
            with torch.no_grad():
                features = list(self.model.backbone(x).values())
                anchors = self.model.anchor_generator(ImageList(x, [key]), features)[0]
            per_level = [f.shape[-2] * f.shape[-1] for f in features]
            per_level = [n * anchors.shape[0] // sum(per_level) for n in per_level]  # x anchors per location
            self._anchors[key] = (anchors, per_level)
        return self._anchors[key]

    def decode(self, raw: list[torch.Tensor], input_size: tuple[int, int], conf: float) -> list[Candidates]:
        """Raw head tensors -> candidates per image, as torchvision's postprocess_detections selects them
        before its batched_nms (the harness then clips, filters and runs NMS)."""
        if self.config.kind == "fasterrcnn":
            return self._decode_two_stage(raw, conf)
        batch = raw[0].shape[0]
        anchors, per_level = self._anchors_for(input_size)
        anchors = anchors.to(raw[0].device)
        if self.config.kind == "ssd":
            deltas, logits = raw
            probs = torch.softmax(logits, dim=-1)
            image, box, label = (probs[..., 1:] > conf).nonzero(as_tuple=True)
            label = label + 1  # class 0 is the background
            scores = probs[image, box, label]
            groups = image * probs.shape[-1] + label  # top-k per (image, class)
        else:
            logits, deltas = raw[0], raw[1]
            probs = torch.sigmoid(logits)
            if self.config.kind == "fcos":
                probs = torch.sqrt(probs * torch.sigmoid(raw[2]))
            image, box, label = (probs > conf).nonzero(as_tuple=True)
            scores = probs[image, box, label]
            level = torch.bucketize(box, torch.tensor(per_level, device=box.device).cumsum(0), right=True)
            groups = image * len(per_level) + level  # top-k per (image, feature level)
        keep = top_k_per_group(scores, groups, self.config.topk_candidates)
        image, box, label, scores = image[keep], box[keep], label[keep], scores[keep]
        coder = self.model.box_coder
        boxes = (coder.decode(deltas[image, box], anchors[box]) if self.config.kind == "fcos"
                 else coder.decode_single(deltas[image, box], anchors[box]))
        return _per_image(boxes, scores, label, image, batch)

    def _decode_two_stage(self, raw: list[torch.Tensor], conf: float) -> list[Candidates]:
        """Faster R-CNN's roi_heads.postprocess_detections up to its batched_nms: softmax, per-class boxes."""
        class_logits, deltas, proposals, counts = raw
        image = torch.repeat_interleave(torch.arange(counts.numel(), device=counts.device), counts)
        boxes = self.model.roi_heads.box_coder.decode(deltas, [proposals])  # [P, C, 4]
        probs = torch.softmax(class_logits, dim=-1)
        proposal, label = (probs[:, 1:] > conf).nonzero(as_tuple=True)
        label = label + 1
        return _per_image(boxes[proposal, label], probs[proposal, label], label, image[proposal], counts.numel())

    def model_stats(self, input_size: tuple[int, int]) -> ModelStats:
        module = self._core_module(self.model)
        stats = ModelStats(params_millions=round(sum(p.numel() for p in self.model.parameters()) / 1e6, 4))
        try:
            stats.gflops = round(count_flops(module, input_size)[0] / 1e9, 4)
        except Exception as exc:  # a counter gap must not sink the benchmark; say why
            stats.notes["gflops"] = f"FLOP count failed: {exc}"
        if self.flops_note:
            stats.notes["gflops_scope"] = self.flops_note
        return stats

    @property
    def flops_note(self) -> str | None:
        """What a FLOP count of this model does not say (`inspect` prints it too)."""
        if self.config.kind == "fasterrcnn":
            return "RoI head FLOPs depend on the proposal count (counted on a blank image)"
        return None


def _per_image(boxes: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor, image: torch.Tensor,
               batch: int) -> list[Candidates]:
    """Split candidates grouped by image into one Candidates per image."""
    order = torch.argsort(image, stable=True)
    counts = torch.bincount(image, minlength=batch).tolist()
    return [Candidates(boxes=b, scores=s, labels=lab) for b, s, lab in
            zip(boxes[order].split(counts), scores[order].split(counts), labels[order].split(counts), strict=True)]
