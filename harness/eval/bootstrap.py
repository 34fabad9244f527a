"""How much a cell's mAP owes to which images were scored: a percentile bootstrap over the evaluated images.

mini500 and the sample are subsets: a model's mAP on them moves with the images drawn, and two models 0.005 apart on
500 images may not be apart on 5000. Each resample draws as many images as were scored, with replacement, and
recomputes mAP 50:95 and mAP 50 exactly as COCOeval's accumulate would on a dataset holding each drawn image as
many times as it was drawn (tested against pycocotools on such a dataset, built image by image). The matches are
the evaluation's own (`precision_recall.MatchCollector` at COCO's ten IoU thresholds), so a resample costs a
re-accumulation, not a re-evaluation: each class's detections are sorted once, and a drawn image's detections count
as many times as it was drawn. Written by hand: no COCO evaluator resamples images (pycocotools evaluates each image
id once), and resampling whole evaluations would cost a COCOeval per resample.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from harness.eval.precision_recall import IOU, MatchCollector

COCO_IOUS = tuple(np.linspace(0.5, 0.95, 10))  # COCOeval's iouThrs
RECALL_POINTS = np.linspace(0.0, 1.0, 101)  # COCOeval's recThrs
LEVEL = 0.95
SEED = 0  # resamples are drawn from this seed: a cell's interval is the same each time it is scored


@dataclass
class _SortedClass:
    """One class's counted and ignored detections in accumulate's order, with each one's image position."""

    image: np.ndarray  # [n] position of the detection's image in the evaluated images
    true_positive: np.ndarray  # [T, n]
    false_positive: np.ndarray  # [T, n]: neither matched nor ignored
    ground_truths: np.ndarray  # [I] the class's non-crowd ground truths on each evaluated image


class ImageBootstrap:
    """mAP 50:95 and mAP 50 of any multiset of the evaluated images (`of`), and their bootstrap interval."""

    def __init__(self, collector: MatchCollector, image_ids: list[int]):
        if not np.allclose(collector.thresholds, COCO_IOUS):
            raise ValueError("the bootstrap needs the matches at COCO's ten IoU thresholds")
        self.images = len(image_ids)
        position = {image: k for k, image in enumerate(image_ids)}
        self.row50 = collector.row(IOU)
        self.classes = []
        for matches in collector.classes.values():
            ground_truths = np.zeros(self.images, dtype=np.int64)
            for image, count in matches.by_image.items():
                ground_truths[position[image]] = count
            if not ground_truths.any():
                continue  # a class without ground truth is no class of COCO's mean, whatever is drawn
            if matches.scores:
                scores = np.concatenate(matches.scores)
                order = np.argsort(-scores, kind="mergesort")  # accumulate's order: stable over image order
                image = np.asarray([position[i] for i in np.concatenate(matches.images).tolist()])[order]
                tp = np.concatenate(matches.true_positive, axis=1)[:, order]
                counted = np.concatenate(matches.counted, axis=1)[:, order]
            else:
                image, tp, counted = np.zeros(0, dtype=np.int64), np.zeros((10, 0), bool), np.zeros((10, 0), bool)
            self.classes.append(_SortedClass(image, tp, counted & ~tp, ground_truths))

    def of(self, times: np.ndarray) -> tuple[float, float]:
        """(mAP 50:95, mAP 50) with image k counted times[k] times (all ones: the evaluation's own figures); NaN
        where no class has a ground truth among the drawn images."""
        per_class = []
        for c in self.classes:
            objects = int(times @ c.ground_truths)
            if objects == 0:  # the class is absent from the draw: -1 in accumulate's precision, out of the mean
                continue
            weight = times[c.image]
            drawn = weight > 0
            weight = weight[drawn]
            tp = np.cumsum(c.true_positive[:, drawn] * weight, axis=1, dtype=np.float64)
            fp = np.cumsum(c.false_positive[:, drawn] * weight, axis=1, dtype=np.float64)
            per_class.append(_average_precision(tp, fp, objects))
        if not per_class:
            return float("nan"), float("nan")
        ap = np.asarray(per_class)  # [classes, T]
        return float(ap.mean()), float(ap[:, self.row50].mean())

    def interval(self, resamples: int, level: float = LEVEL, seed: int = SEED) -> dict:
        """The percentile bootstrap interval of mAP 50:95 and mAP 50 over `resamples` draws of as many images as
        were evaluated, with replacement."""
        rng = np.random.default_rng(seed)
        draws = np.asarray([self.of(np.bincount(rng.integers(0, self.images, self.images), minlength=self.images))
                            for _ in range(resamples)])
        defined = draws[~np.isnan(draws[:, 0])]
        tails = [100 * (1 - level) / 2, 100 * (1 + level) / 2]
        out = {"level": level, "resamples": resamples, "resamples_defined": len(defined), "seed": seed,
               "images": self.images, "method": "percentile bootstrap over the evaluated images"}
        for k, name in enumerate(("mAP_50_95", "mAP_50")):
            out[name] = [round(float(v), 6) for v in np.percentile(defined[:, k], tails)] if len(defined) else None
        return out


def _average_precision(tp: np.ndarray, fp: np.ndarray, objects: int) -> np.ndarray:
    """[T] COCO's AP of one class from its cumulative true and false positives ([T, n]): precision made
    non-increasing from the right, read at the 101 recall points (0 past the last recall reached)."""
    ap = np.zeros(tp.shape[0])
    if tp.shape[1] == 0:
        return ap
    recall = tp / objects
    precision = tp / (tp + fp + np.spacing(1))
    envelope = np.maximum.accumulate(precision[:, ::-1], axis=1)[:, ::-1]
    for t in range(tp.shape[0]):  # one search per row: shifting the rows into one array would round the recalls
        at = np.searchsorted(recall[t], RECALL_POINTS, side="left")
        ap[t] = envelope[t, at[at < tp.shape[1]]].sum() / len(RECALL_POINTS)
    return ap
