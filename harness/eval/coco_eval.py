"""COCO bbox evaluation of detections on a dataset variant: pycocotools (reference) or faster-coco-eval."""

from __future__ import annotations

import contextlib
import copy
import io

import numpy as np
from pycocotools.coco import COCO

EVALUATORS = ("pycocotools", "faster-coco-eval")
# COCOeval.stats order -> the site's accuracy field names
STAT_NAMES = ("mAP_50_95", "mAP_50", "mAP_75", "mAP_small", "mAP_medium", "mAP_large",
              "AR1", "AR10", "AR100", "AR_small", "AR_medium", "AR_large")


def evaluator_version(name: str) -> str:
    from importlib.metadata import version

    return f"{name} {version(name)}"


def evaluate_bbox(coco_gt: COCO, detections: list[dict], image_ids: list[int],
                  evaluator: str = "pycocotools") -> dict[str, float]:
    """The 12 COCO bbox statistics over exactly `image_ids` (max_dets 1/10/100, as COCO defines)."""
    if evaluator == "pycocotools":
        from pycocotools.cocoeval import COCOeval
    elif evaluator == "faster-coco-eval":
        from faster_coco_eval import COCOeval_faster as COCOeval
    else:
        raise ValueError(f"unknown evaluator {evaluator!r}; use one of {EVALUATORS}")
    if not detections:  # loadRes rejects an empty list; no detections scores 0 by definition
        return dict.fromkeys(STAT_NAMES, 0.0)
    with contextlib.redirect_stdout(io.StringIO()):
        if evaluator == "pycocotools":
            coco_dt = coco_gt.loadRes(copy.deepcopy(detections))  # loadRes mutates its input
            coco_eval = COCOeval(coco_gt, coco_dt, "bbox")
        else:
            from faster_coco_eval import COCO as FasterCOCO

            gt = FasterCOCO(copy.deepcopy(coco_gt.dataset))
            coco_eval = COCOeval(gt, gt.loadRes(copy.deepcopy(detections)), "bbox")
        coco_eval.params.imgIds = sorted(image_ids)
        coco_eval.evaluate()
        coco_eval.accumulate()
        coco_eval.summarize()
    stats = np.asarray(coco_eval.stats[: len(STAT_NAMES)], dtype=float)
    return {name: float(value) for name, value in zip(STAT_NAMES, stats, strict=True)}
