"""Post-processing shared by every family: candidate selection of the family's kind (class-aware NMS,
or NMS-free top-k), rescale to the original image, COCO ids.

Everything but the NMS kernel runs once per batch on the concatenated candidates of all images, so
the only per-image work is one `torchvision.ops.nms` call, which releases the GIL and can therefore
run on a thread pool. (Fewer tensor ops alone did not measurably shorten the stage on a CPU: its time is in
the NMS kernel and in the decode's large reductions.) On a GPU, where each call takes the interpreter lock and
waits for the device, the NMS of the whole batch runs at once instead (batch_nms, `select(whole_batch=True)`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, replace

import numpy as np
import torch

from harness.detector.ops import top_k_per_group
from harness.detector.protocol import Candidates, DenseCandidates, PostprocessSpec
from harness.pipeline.batch_nms import nms_whole_batch
from harness.pipeline.nms_kernel import nms
from harness.pipeline.preprocess import ImageTransform
from harness.pipeline.scratch import HOST_BYTES
from harness.records import ImageDetections


@dataclass
class BatchCandidates:
    """The candidates of every image of a batch, concatenated, grouped by image in batch order."""

    boxes: torch.Tensor  # [N, 4] xyxy, input-tensor pixels
    scores: torch.Tensor  # [N]
    labels: torch.Tensor  # [N] contiguous class index
    image: torch.Tensor  # [N] index of the image in the batch
    counts: list[int]  # candidates per image
    rows: torch.Tensor | None = None  # [N] each candidate's row in its image's mask head (segment detectors)

    def take(self, keep: torch.Tensor) -> BatchCandidates:
        """The candidates at `keep` (indices, in the order given: keep them grouped by image)."""
        image = self.image[keep]
        return BatchCandidates(self.boxes[keep], self.scores[keep], self.labels[keep], image,
                               torch.bincount(image, minlength=len(self.counts)).tolist(),
                               None if self.rows is None else self.rows[keep])

    def to(self, device: torch.device) -> BatchCandidates:
        """The candidates on `device`; to the host in one transfer (`host_copy`)."""
        if self.boxes.device == device:
            return self
        if device.type == "cpu":
            return self.host_copy()
        return BatchCandidates(self.boxes.to(device), self.scores.to(device), self.labels.to(device),
                               self.image.to(device), list(self.counts),
                               None if self.rows is None else self.rows.to(device))

    def host_copy(self) -> BatchCandidates:
        """The candidates on the host in one device-to-host copy (each copy from a GPU synchronises): packed as
        float64 rows, which hold float32 values and indices exactly, then unpacked to the original dtypes."""
        columns = [self.boxes.double(), self.scores[:, None].double(), self.labels[:, None].double(),
                   self.image[:, None].double()] + ([] if self.rows is None else [self.rows[:, None].double()])
        packed = torch.cat(columns, 1).cpu()
        return BatchCandidates(packed[:, :4].to(self.boxes.dtype), packed[:, 4].to(self.scores.dtype),
                               packed[:, 5].to(self.labels.dtype), packed[:, 6].to(self.image.dtype), list(self.counts),
                               None if self.rows is None else packed[:, 7].to(self.rows.dtype))

    @classmethod
    def from_images(cls, candidates: Sequence[Candidates], conf: float) -> BatchCandidates:
        """Concatenate per-image candidates and apply the score threshold."""
        boxes = torch.cat([c.boxes for c in candidates]).float()
        scores = torch.cat([c.scores for c in candidates]).float()
        labels = torch.cat([c.labels for c in candidates])
        rows = torch.cat([c.rows for c in candidates]) if all(c.rows is not None for c in candidates) else None
        sizes = torch.tensor([c.scores.shape[0] for c in candidates], device=boxes.device)
        image = torch.repeat_interleave(torch.arange(len(candidates), device=boxes.device), sizes)
        every = cls(boxes, scores, labels, image, [0] * len(candidates), rows)  # counts: take() recounts
        return every.take((scores >= conf).nonzero().squeeze(1))

    @classmethod
    def from_dense(cls, dense: DenseCandidates, spec: PostprocessSpec, conf: float, max_det: int) -> BatchCandidates:
        """Labels picked from per-class scores: kind "nms" keeps (box, best class) or, multi-label, every
        (box, class) with score >= conf; kind "topk" keeps each image's `max_det` best (box, class) pairs
        with score >= conf, best first. `rows` is each candidate's box index in its image."""
        n_images, n_boxes, n_classes = dense.scores.shape
        if spec.kind == "topk":
            flat = dense.scores.reshape(n_images, n_boxes * n_classes)
            scores, index = flat.topk(min(max_det, flat.shape[1]), dim=1)  # sorted, best first
            if spec.activation == "sigmoid":  # monotonic: top-k of the logits is top-k of the probabilities
                scores = scores.sigmoid()
            image = torch.arange(n_images, device=scores.device)[:, None].expand_as(index)
            keep = scores >= conf  # row-major: stays grouped by image, best first
            image, index, scores = image[keep], index[keep], scores[keep]
            box = torch.div(index, n_classes, rounding_mode="floor")
            labels = index % n_classes
        else:
            probs = dense.scores.sigmoid() if spec.activation == "sigmoid" else dense.scores
            if spec.multi_label:
                image, box, labels = (probs >= conf).nonzero(as_tuple=True)
                scores = probs[image, box, labels]
            else:
                best, best_label = probs.max(dim=2)
                image, box = (best >= conf).nonzero(as_tuple=True)
                scores, labels = best[image, box], best_label[image, box]
        boxes = dense.boxes.reshape(n_images * n_boxes, 4)[image * n_boxes + box].float()
        return cls(boxes, scores.float(), labels, image, torch.bincount(image, minlength=n_images).tolist(), box)


def best_per_image(cands: BatchCandidates, k: int) -> BatchCandidates:
    """Each image's `k` best candidates, best first."""
    return cands.take(top_k_per_group(cands.scores, cands.image, k))


def clip_to_images(cands: BatchCandidates, transforms: Sequence[ImageTransform]) -> BatchCandidates:
    """Clip boxes to each image's area inside the input tensor (torchvision's clip_boxes_to_image on the
    resized image, which starts at the letterbox offset)."""
    table = torch.tensor([[t.pad[0], t.pad[1], t.pad[0] + t.orig_size[1] * t.ratio[0],
                           t.pad[1] + t.orig_size[0] * t.ratio[1]] for t in transforms],
                         dtype=cands.boxes.dtype, device=cands.boxes.device)
    rows = table[cands.image]
    low, high = rows[:, 0:2].repeat(1, 2), rows[:, 2:4].repeat(1, 2)
    return replace(cands, boxes=torch.minimum(torch.maximum(cands.boxes, low), high))


def drop_small(cands: BatchCandidates, min_size: float) -> BatchCandidates:
    """Drop boxes narrower or lower than `min_size` (torchvision's remove_small_boxes)."""
    wh = cands.boxes[:, 2:] - cands.boxes[:, :2]
    return cands.take(((wh[:, 0] >= min_size) & (wh[:, 1] >= min_size)).nonzero().squeeze(1))


def gather_candidates(decoded: Sequence[Candidates] | DenseCandidates, spec: PostprocessSpec, conf: float,
                      max_det: int) -> BatchCandidates:
    """A decoder's output (per-image Candidates or batch DenseCandidates) as one BatchCandidates,
    score threshold applied and labels picked."""
    if isinstance(decoded, DenseCandidates):
        return BatchCandidates.from_dense(decoded, spec, conf, max_det)
    return BatchCandidates.from_images(decoded, conf)


def select(cands: BatchCandidates, spec: PostprocessSpec, iou: float, max_det: int,
           transforms: Sequence[ImageTransform], executor: Executor | None = None,
           whole_batch: bool = False, scratch: int = HOST_BYTES) -> BatchCandidates:
    """The family's post-processing kind on thresholded candidates: "nms" (optional pre-NMS top-k,
    clip and small-box filter, then class-aware NMS per image; with `whole_batch`, every image's at once:
    batch_nms, its temporaries within `scratch` bytes) or "topk" (each image's best max_det)."""
    if spec.kind == "topk":
        return best_per_image(cands, max_det)
    if spec.pre_nms_topk is not None:
        cands = best_per_image(cands, spec.pre_nms_topk)
    if spec.clip_before_nms:
        cands = clip_to_images(cands, transforms)
    if spec.min_box_size > 0:
        cands = drop_small(cands, spec.min_box_size)
    if whole_batch:
        return cands.take(nms_whole_batch(cands.boxes, cands.scores, cands.labels, cands.counts, iou, max_det,
                                          scratch))
    return nms_batch(cands, iou, max_det, executor)


# Above this many candidates, an image's NMS on a CPU runs class by class. One kernel over every class costs about
# (boxes kept) x (candidates); a trained model's images stay under ~2,000 candidates, where the single call is
# faster (the sample's crowded scenes: 11 ms a batch of 16 against 24 class by class), but an untrained model's
# near-even scores put thousands of every class above the threshold (30,000 candidates: 1.33 s an image against
# 0.10 s class by class).
CLASS_BY_CLASS_ABOVE = 4000


def nms_class_by_class(boxes: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor, iou: float) -> torch.Tensor:
    """Class-aware NMS as one kernel call per class present (torchvision's batched_nms above 1000 boxes on a CPU,
    here on the kernel alone, without importing torchvision's Python package): the indices kept, by decreasing
    score, equal scores in index order as the kernel orders them."""
    kept = torch.zeros_like(scores, dtype=torch.bool)
    for c in torch.unique(labels).tolist():
        members = torch.where(labels == c)[0]
        kept[members[nms(boxes[members], scores[members], iou)]] = True
    keep = torch.where(kept)[0]
    return keep[scores[keep].sort(descending=True, stable=True).indices]


def nms_batch(cands: BatchCandidates, iou: float, max_det: int, executor: Executor | None = None) -> BatchCandidates:
    """Class-aware NMS per image, each image's best `max_det` kept, best first.

    Same result as `torchvision.ops.batched_nms` on each image: its coordinate trick (boxes of
    class c shifted by c x (that image's largest coordinate + 1), then one `torchvision.ops.nms`),
    with the shifts computed for the whole batch at once; on a CPU, an image of more than
    CLASS_BY_CLASS_ABOVE candidates class by class instead (batched_nms itself loops over classes above 1000
    boxes on a CPU, which is slower below that, and its loop holds the GIL).
    With an executor, images' NMS kernels run in parallel (the kernel releases the GIL).
    """
    n_images = len(cands.counts)
    if cands.scores.numel() == 0:
        return cands
    per_box_max = cands.boxes.max(dim=1).values
    image_max = torch.zeros(n_images, dtype=per_box_max.dtype, device=per_box_max.device)
    image_max.scatter_reduce_(0, cands.image, per_box_max, reduce="amax", include_self=False)
    offsets = cands.labels.to(cands.boxes) * (image_max + torch.tensor(1).to(cands.boxes))[cands.image]
    shifted = cands.boxes + offsets[:, None]
    starts = np.concatenate(([0], np.cumsum(cands.counts)[:-1])).tolist()

    on_cpu = cands.boxes.device.type == "cpu"

    def one(i: int) -> torch.Tensor:
        start, count = starts[i], cands.counts[i]
        if on_cpu and count > CLASS_BY_CLASS_ABOVE:
            part = slice(start, start + count)
            return nms_class_by_class(cands.boxes[part], cands.scores[part], cands.labels[part], iou)[:max_det] + start
        return nms(shifted[start:start + count], cands.scores[start:start + count], iou)[:max_det] + start

    images = [i for i in range(n_images) if cands.counts[i]]
    if executor is not None and len(images) > 1:
        by_size = sorted(images, key=lambda i: -cands.counts[i])  # most crowded first: workers finish together
        kept = dict(zip(by_size, executor.map(one, by_size), strict=True))
        keep = torch.cat([kept[i] for i in images])
    else:
        keep = torch.cat([one(i) for i in images])
    return cands.take(keep)


def to_original(cands: BatchCandidates, transforms: Sequence[ImageTransform]) -> torch.Tensor:
    """Undo each image's letterbox/resize and clip to it: torchvision's clip_boxes_to_image per image,
    written as one clamp with per-box limits so the whole batch is two tensor ops."""
    table = torch.tensor([[t.pad[0], t.pad[1], t.ratio[0], t.ratio[1], t.orig_size[1], t.orig_size[0]]
                          for t in transforms], dtype=cands.boxes.dtype, device=cands.boxes.device)
    rows = table[cands.image]
    pad, ratio, limit = rows[:, 0:2].repeat(1, 2), rows[:, 2:4].repeat(1, 2), rows[:, 4:6].repeat(1, 2)
    return torch.minimum(((cands.boxes - pad) / ratio).clamp_(min=0), limit)


def _numpy_dtype(t: torch.Tensor) -> np.dtype:
    return torch.empty(0, dtype=t.dtype).numpy().dtype


def split_by_image(cands: BatchCandidates, boxes: torch.Tensor, image_ids: Sequence[int]) -> list[ImageDetections]:
    """One ImageDetections per image of the batch (host numpy arrays)."""
    return per_image(batch_arrays(cands, boxes), image_ids)


@dataclass(frozen=True)
class BatchArrays:
    """A batch's detections as host arrays: boxes [N,4], scores [N] and labels [N] (all images', grouped by image in
    batch order) and each image's count. The form in which they cross from a host process: a few arrays to unpickle
    under the interpreter lock, not one object and three arrays per image."""

    boxes: np.ndarray
    scores: np.ndarray
    labels: np.ndarray
    counts: list[int]


def batch_arrays(cands: BatchCandidates, boxes: torch.Tensor) -> BatchArrays:
    """The kept candidates' boxes (in original pixels), scores and labels on the host, in their own dtypes."""
    # One device->host copy per batch (on CUDA each .cpu() is a synchronising copy): boxes, score and label
    # packed as float64 rows, which hold float32 values and class indices exactly; then the original dtypes.
    rows = torch.cat([boxes.double(), cands.scores[:, None].double(), cands.labels[:, None].double()], 1).cpu()
    rows = rows.numpy()
    return BatchArrays(rows[:, :4].astype(_numpy_dtype(boxes)), rows[:, 4].astype(_numpy_dtype(cands.scores)),
                       rows[:, 5].astype(_numpy_dtype(cands.labels)), list(cands.counts))


def per_image(arrays: BatchArrays, image_ids: Sequence[int]) -> list[ImageDetections]:
    """One ImageDetections per image (views into the batch's arrays; slices, which cost half of np.split's)."""
    ends = list(itertools.accumulate(arrays.counts))
    boxes, scores, labels = arrays.boxes, arrays.scores, arrays.labels
    return [ImageDetections(image_id, boxes[start:end], scores[start:end], labels[start:end])
            for image_id, start, end in zip(image_ids, [0, *ends][:len(ends)], ends, strict=True)]
