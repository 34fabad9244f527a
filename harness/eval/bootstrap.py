"""How much a cell's mAP owes to which images were scored: a bootstrap over the evaluated images (scipy's BCa
interval), and the paired one of two cells' difference.

mini500 and the sample are subsets: a model's mAP on them moves with the images drawn, and two models 0.005 apart on
500 images may not be apart on 5000. Each resample draws as many images as were scored, with replacement, and
recomputes mAP 50:95 and mAP 50 exactly as COCOeval's accumulate would on a dataset holding each drawn image as
many times as it was drawn (tested against pycocotools on such a dataset, built image by image). The matches are
the evaluation's own (`precision_recall.MatchCollector` at COCO's ten IoU thresholds), so a resample costs a
re-accumulation, not a re-evaluation: each class's detections are sorted once, and a drawn image's detections count
as many times as it was drawn. Written by hand: no COCO evaluator resamples images (pycocotools evaluates each image
id once), and resampling whole evaluations would cost a COCOeval per resample; the interval itself is scipy's.
"""

from __future__ import annotations

import warnings
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
    # [n] which run of equal scores on one image each detection is in, or None where no two are: COCOeval meets a
    # drawn-twice image's tied detections copy by copy (d1 d2 d1 d2), not each twice (d1 d1 d2 d2)
    tie_run: np.ndarray | None


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
                scores = scores[order]
                new_run = np.ones(len(scores), dtype=bool)
                new_run[1:] = (scores[1:] != scores[:-1]) | (image[1:] != image[:-1])
                tie_run = None if new_run.all() else np.cumsum(new_run)
            else:
                image, tie_run = np.zeros(0, dtype=np.int64), None
                tp = counted = np.zeros((len(collector.thresholds), 0), dtype=bool)
            self.classes.append(_SortedClass(image, tp, counted & ~tp, ground_truths, tie_run))

    def of(self, times: np.ndarray) -> tuple[float, float]:
        """(mAP 50:95, mAP 50) with image k counted times[k] times (all ones: the evaluation's own figures); NaN
        where no class has a ground truth among the drawn images."""
        per_class = []
        for c in self.classes:
            objects = int(times @ c.ground_truths)
            if objects == 0:  # the class is absent from the draw: -1 in accumulate's precision, out of the mean
                continue
            weight = times[c.image]
            if c.tie_run is None or weight.max() <= 1:  # each detection's copies are consecutive: one weighted step
                drawn = weight > 0
                tp = np.cumsum(c.true_positive[:, drawn] * weight[drawn], axis=1, dtype=np.float64)
                fp = np.cumsum(c.false_positive[:, drawn] * weight[drawn], axis=1, dtype=np.float64)
            else:  # every copy in COCOeval's order: by score run, then copy, then the image's own order
                rows = np.repeat(np.arange(len(weight)), weight)
                copy = np.arange(len(rows)) - np.repeat(np.cumsum(weight) - weight, weight)
                rows = rows[np.lexsort((rows, copy, c.tie_run[rows]))]
                tp = np.cumsum(c.true_positive[:, rows], axis=1, dtype=np.float64)
                fp = np.cumsum(c.false_positive[:, rows], axis=1, dtype=np.float64)
            per_class.append(_average_precision(tp, fp, objects))
        if not per_class:
            return float("nan"), float("nan")
        ap = np.asarray(per_class)  # [classes, T]
        return float(ap.mean()), float(ap[:, self.row50].mean())

    def interval(self, resamples: int, level: float = LEVEL, seed: int = SEED) -> dict:
        """The bias-corrected and accelerated (BCa) bootstrap interval of mAP 50:95 and mAP 50 (scipy's) over
        `resamples` draws of as many images as were evaluated, with replacement. mAP over a draw is biased upward
        (a class on one or two images drops out of a draw's mean; a repeated image lifts the precision envelope), so
        a plain percentile interval can miss the evaluation's own figure: BCa corrects for the bias and the skew.
        Its acceleration takes one leave-one-image-out evaluation per image. Null bounds, with the reason, where the
        draws give no interval (`_bca`)."""
        return _bca(lambda times: np.asarray(self.of(times)), self.images, resamples, level, seed,
                    "BCa bootstrap over the evaluated images (scipy.stats.bootstrap)", "the cell's own figure")


def paired_interval(a: ImageBootstrap, b: ImageBootstrap, resamples: int, level: float = LEVEL,
                    seed: int = SEED) -> dict:
    """The BCa interval of B's mAP 50:95 and mAP 50 minus A's over the same draws of the images both scored (a
    paired bootstrap: each draw scores both sides on the same images, so what the images share cancels). Where it
    excludes 0, the difference is not an accident of the images drawn."""
    if a.images != b.images:
        raise ValueError("a paired bootstrap needs the same scored images on both sides")
    return _bca(lambda times: np.asarray(b.of(times)) - np.asarray(a.of(times)), a.images, resamples, level, seed,
                "paired BCa bootstrap over the images both sides scored (scipy.stats.bootstrap): B - A",
                "the delta itself")


def _bca(statistic, images: int, resamples: int, level: float, seed: int, method: str, figure: str) -> dict:
    """scipy's BCa interval of the two-valued `statistic` (mAP 50:95, mAP 50 of a draw, given as each image's count),
    with each value's bias and share of draws above the figure. Null bounds, with the reason, where the draws give no
    interval: one image, every draw the same figure, a draw without ground truth, or draws biased past the figure
    (fewer than 2.5 % of them on one side of it: BCa's corrected percentiles then sit at the extreme draws, a narrow
    interval that means nothing)."""
    from scipy.stats import bootstrap

    names = ("mAP_50_95", "mAP_50")
    estimate = statistic(np.ones(images, dtype=np.int64))
    out = {"level": level, "resamples": resamples, "seed": seed, "images": images, "method": method}
    if images < 2:  # one image has no other to draw (and scipy refuses a sample of one)
        out.update({f"{name}{part}": None for name in names for part in ("", "_draws_above", "_bias")})
        out["reason"] = "one scored image: nothing to resample"
        return out
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a degenerate or undefined draw: said below as a null interval
        # random_state: scipy 1.11-1.14 (allowed by pyproject) have no rng= yet
        result = bootstrap((np.arange(images),), lambda sample: statistic(np.bincount(sample, minlength=images)),
                           n_resamples=resamples, method="BCa", vectorized=False, confidence_level=level,
                           random_state=np.random.default_rng(seed))
    draws = np.asarray(result.bootstrap_distribution)  # [2, resamples]
    tail = (1 - level) / 2
    reasons = []
    for k, name in enumerate(names):
        bounds = (result.confidence_interval.low[k], result.confidence_interval.high[k])
        finite = bool(np.isfinite(draws[k]).all())
        above = float(np.mean(draws[k] > estimate[k])) if finite else None
        below = float(np.mean(draws[k] < estimate[k])) if finite else None
        out[f"{name}_draws_above"] = None if above is None else round(above, 4)
        out[f"{name}_bias"] = round(float(draws[k].mean() - estimate[k]), 6) if finite else None
        out[name] = None
        if not finite or np.ptp(draws[k]) == 0:
            reasons.append(f"{name}: the draws give no interval (every draw the same figure, or a draw without "
                           "ground truth: too few images)")
        elif above < tail or below < tail:
            reasons.append(f"{name}: {100 * above:.1f} % of the draws are above {figure} (their mean "
                           f"{out[f'{name}_bias']:+.4f} from it): resampling these images biases it past the "
                           "figure, and no interval is drawn from them")
        elif not np.all(np.isfinite(bounds)):
            reasons.append(f"{name}: the bias-corrected percentiles are undefined for these draws")
        else:
            out[name] = [round(float(v), 6) for v in bounds]
    if reasons:
        out["reason"] = "; ".join(reasons)
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
