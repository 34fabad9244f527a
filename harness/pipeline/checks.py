"""Checks of what a model core and its decoder return: a NaN or infinity in the raw output, or a decoder's output
against the contract (xyxy boxes in input-tensor pixels, probabilities, class indices), fails the cell with one
line, instead of turning into silently dropped candidates (NaN scores never pass a threshold), boxes clamped to
zero area, or a plugin's xywh boxes scored as xyxy: a wrong mAP published with exit 0."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from harness.errors import VaBenchError


class ModelOutputError(VaBenchError):
    """The core produced non-finite numbers, or its decoder something the contract does not allow."""


def check_finite(raw: Sequence[torch.Tensor], image_ids: Sequence[int]) -> None:
    """Raise ModelOutputError if any raw output holds NaN or inf. One sum per output (a NaN or inf
    anywhere makes the sum non-finite): ~0.3 ms for YOLOX's [8, 3549, 85] on one core, where a full
    isfinite() pass costs ~20 ms; the details are computed only when something is wrong."""
    for k, out in enumerate(raw):
        if not out.is_floating_point() or torch.isfinite(out.sum()):
            continue
        bad = ~torch.isfinite(out)
        if not bad.any():  # finite values whose sum overflowed: not an error of the model
            continue
        kind = "NaN" if torch.isnan(out).any() else "inf"
        per_image = bad.reshape(out.shape[0], -1).any(dim=1).nonzero().flatten().tolist() if out.dim() else []
        ids = ", ".join(str(image_ids[i]) for i in per_image[:5] if i < len(image_ids))
        more = f" (+{len(per_image) - 5} more)" if len(per_image) > 5 else ""
        raise ModelOutputError(f"model output {k} {list(out.shape)} has {kind} values (images {ids}{more}); "
                               "the weights or the export are broken")


def check_decoded(decoded, n_images: int, input_size: tuple[int, int], logits: bool, trained: bool = True) -> None:
    """A decoder's output as harness/detector/protocol.py defines it (one Candidates per image, or a
    DenseCandidates of the batch; boxes xyxy in input-tensor pixels; scores probabilities, or logits where the
    family's spec says `activation: sigmoid`; labels integer class indices, whose range every image's detections
    are checked for when written: records.py), else ModelOutputError naming
    the field and the fix. Run on a pipeline's first batch: a plugin's systematic mistake shows there. The boxes are
    judged by the confident candidates of trained weights only (random weights, and a trained model's background
    anchors, give boxes of any shape)."""
    from harness.detector.protocol import Candidates, DenseCandidates

    fix = "see harness/detector/protocol.py (Candidates, DenseCandidates)"
    if isinstance(decoded, DenseCandidates):
        boxes, scores = decoded.boxes, decoded.scores
        if boxes.dim() != 3 or boxes.shape[0] != n_images or boxes.shape[2] != 4 or scores.dim() != 3 \
                or scores.shape[:2] != boxes.shape[:2]:
            raise ModelOutputError(f"decode() gave DenseCandidates of boxes {list(boxes.shape)} and scores "
                                   f"{list(scores.shape)} for a batch of {n_images}: they must be [B, K, 4] and "
                                   f"[B, K, C]; {fix}")
        confidence = (scores.sigmoid() if logits else scores).amax(dim=2).reshape(-1)
        boxes, scores = boxes.reshape(-1, 4), scores.reshape(-1)
    elif isinstance(decoded, (list, tuple)) and all(isinstance(c, Candidates) for c in decoded):
        if len(decoded) != n_images:
            raise ModelOutputError(f"decode() gave Candidates of {len(decoded)} images for a batch of {n_images}: "
                                   f"one per image, in batch order; {fix}")
        for c in decoded:
            k = c.scores.shape[0] if c.scores.dim() == 1 else -1
            if c.boxes.shape != (k, 4) or c.labels.shape != (k,):
                raise ModelOutputError(f"decode() gave Candidates of boxes {list(c.boxes.shape)}, scores "
                                       f"{list(c.scores.shape)}, labels {list(c.labels.shape)}: they must be [K, 4], "
                                       f"[K] and [K]; {fix}")
            if c.labels.is_floating_point() or c.labels.dtype == torch.bool:
                raise ModelOutputError(f"decode() gave Candidates.labels of {c.labels.dtype}: class indices, an "
                                       f"integer tensor (labels.long()); {fix}")
        boxes = torch.cat([c.boxes for c in decoded]) if decoded else torch.zeros(0, 4)
        scores = torch.cat([c.scores for c in decoded]) if decoded else torch.zeros(0)
        logits = False  # the spec's activation applies to DenseCandidates only: a Candidates score is a probability
        confidence = scores
    else:
        raise ModelOutputError(f"decode() gave {type(decoded).__name__}: one Candidates per image, or a "
                               f"DenseCandidates of the batch; {fix}")
    _check_scores(scores.float(), logits, fix)
    if trained:
        _check_boxes(boxes.float()[confidence.float() >= CONFIDENT], input_size, fix)


CONFIDENT = 0.05  # the candidates whose boxes are judged: a trained model's detections, not its background


def _check_scores(scores: torch.Tensor, logits: bool, fix: str) -> None:
    if torch.isnan(scores).any():
        raise ModelOutputError(f"decode() gave NaN scores: they would never pass a threshold; {fix}")
    if not logits and scores.numel() and (float(scores.min()) < -1e-3 or float(scores.max()) > 1 + 1e-3):
        raise ModelOutputError(f"decode() gave scores from {float(scores.min()):.3g} to {float(scores.max()):.3g}: "
                               "they must be probabilities in [0, 1] (logits? apply the sigmoid, or give "
                               f"DenseCandidates with the spec's activation: sigmoid); {fix}")


def _check_boxes(boxes: torch.Tensor, input_size: tuple[int, int], fix: str) -> None:
    if boxes.shape[0] < 10 or not torch.isfinite(boxes).all():  # too few to judge; non-finite: said when written
        return
    inverted = float(((boxes[:, 2] < boxes[:, 0]) | (boxes[:, 3] < boxes[:, 1])).float().mean())
    if inverted > 0.5:
        raise ModelOutputError(f"decode() gave boxes of which {100 * inverted:.0f} % have x2 < x1 or y2 < y1: they "
                               f"must be xyxy (x1, y1, x2, y2), not xywh or cxcywh; {fix}")
    if float(boxes.abs().max()) <= 1.5 and min(input_size) >= 32:
        raise ModelOutputError(f"decode() gave boxes whose every coordinate is within 0..1.5 on a "
                               f"{input_size[0]}x{input_size[1]} input: they must be in input-tensor pixels, not "
                               f"normalised; {fix}")
