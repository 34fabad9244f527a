"""COCO evaluation of detections on a dataset variant (bbox; segm and bbox together for instance masks):
pycocotools (reference) or faster-coco-eval."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import weakref
from array import array
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from pycocotools.coco import COCO

from harness.errors import json_problem
from harness.eval.bootstrap import COCO_IOUS, ImageBootstrap
from harness.eval.confusion import ConfusionMatrix, confusion_matrix
from harness.eval.precision_recall import IOU, MatchCollector, OperatingPoint, operating_point, pr_curves
from harness.json_stream import NotAJsonArray, iter_json_array, read_json_text
from harness.records import COCO_MAX_DETS, ImageDetections

EVALUATORS = ("pycocotools", "faster-coco-eval")
# COCOeval.stats order -> the site's accuracy field names
STAT_NAMES = ("mAP_50_95", "mAP_50", "mAP_75", "mAP_small", "mAP_medium", "mAP_large",
              "AR1", "AR10", "AR100", "AR_small", "AR_medium", "AR_large")


def max_dets_for(cap: int) -> list[int]:
    """COCOeval's maxDets for an evaluation cap: sorted({1, 10, 100, cap}) (RF100-VL: [1, 10, 100, 500])."""
    return sorted({1, 10, 100, cap})


def summarize(coco_eval, cap: int = COCO_MAX_DETS) -> dict[str, float]:
    """The COCO statistics from an accumulated COCOeval, with AP and the area-range ARs read at `cap` (and
    `AR_max_det`, the AR at the cap, when the cap is not 100). For cap 100 these are pycocotools'
    `summarize()` figures (tested); pycocotools reads AP at maxDets[2] whatever the cap, so it cannot give
    them at another cap. -1 where undefined, as pycocotools."""
    params, ev = coco_eval.params, coco_eval.eval
    iou_thrs = np.asarray(params.iouThrs)
    area = list(params.areaRngLbl).index
    m = list(params.maxDets).index

    def mean(values) -> float:
        valid = values[values > -1]
        return float(np.mean(valid)) if valid.size else -1.0

    def ap(iou=None, rng="all", dets=cap):
        p = ev["precision"][:, :, :, area(rng), m(dets)]
        return mean(p if iou is None else p[np.where(np.isclose(iou_thrs, iou))[0]])

    def ar(rng="all", dets=cap):
        return mean(ev["recall"][:, :, area(rng), m(dets)])

    stats = {"mAP_50_95": ap(), "mAP_50": ap(0.5), "mAP_75": ap(0.75), "mAP_small": ap(rng="small"),
             "mAP_medium": ap(rng="medium"), "mAP_large": ap(rng="large"), "AR1": ar(dets=1), "AR10": ar(dets=10),
             "AR100": ar(dets=100), "AR_small": ar("small"), "AR_medium": ar("medium"), "AR_large": ar("large")}
    if cap != COCO_MAX_DETS:
        stats["AR_max_det"] = ar()
    return stats


def per_class_ap(coco_eval, cap: int = COCO_MAX_DETS) -> dict[int, dict[str, float]]:
    """Category id -> AP 50:95 and AP 50 (area all, at the cap); -1 where the category has no ground truth."""
    params, ev = coco_eval.params, coco_eval.eval
    iou_thrs = np.asarray(params.iouThrs)
    a, m = list(params.areaRngLbl).index("all"), list(params.maxDets).index(cap)
    out = {}
    for k, category in enumerate(params.catIds):
        p = ev["precision"][:, :, k, a, m]
        at50 = p[np.where(np.isclose(iou_thrs, 0.5))[0]]
        out[int(category)] = {"AP": float(np.mean(p[p > -1])) if (p > -1).any() else -1.0,
                              "AP50": float(np.mean(at50[at50 > -1])) if (at50 > -1).any() else -1.0}
    return out


def evaluator_version(name: str) -> str:
    """The evaluator package and its installed version, as a submission records it."""
    from importlib.metadata import version

    return f"{name} {version(name)}"


def evaluate_bbox(coco_gt: COCO, detections: list[dict], image_ids: list[int],
                  evaluator: str = "pycocotools", cap: int = COCO_MAX_DETS) -> dict[str, float]:
    """The 12 COCO bbox statistics over exactly `image_ids` (max_dets 1/10/100, as COCO defines; with another
    evaluation `cap`, AP read at it and `AR_max_det`: `summarize`)."""
    return _evaluate(coco_gt, copy.deepcopy(detections), image_ids, evaluator, cap)[0]  # loadRes mutates its input


def evaluate_bbox_file(coco_gt: COCO, path: str | Path, image_ids: list[int], evaluator: str = "pycocotools",
                       pairs_per_chunk: int | None = None, cap: int = COCO_MAX_DETS) -> dict[str, float]:
    """`evaluate_bbox` of a COCO results file; `evaluate_bbox_file_per_class` also gives each category's AP."""
    return evaluate_bbox_file_per_class(coco_gt, path, image_ids, evaluator, pairs_per_chunk, cap)[0]


def evaluate_bbox_file_per_class(coco_gt: COCO, path: str | Path, image_ids: list[int],
                                 evaluator: str = "pycocotools", pairs_per_chunk: int | None = None,
                                 cap: int = COCO_MAX_DETS) -> tuple[dict[str, float], dict[int, dict[str, float]]]:
    """(statistics, per-category AP) of a COCO results file (a run's detections/<cell>.json) in bounded memory.

    pycocotools holds a dict per detection (loadRes adds a polygon to each) and a record per image,
    category and area range: measured, 1.6 GB more at 5000 images than at 500. Its AP is computed per
    category and then averaged, so the categories can be evaluated a group at a time with identical
    results: groups of consecutive categories holding at most CHUNK_PAIRS (image, category) pairs and
    CHUNK_DETECTIONS detections (a category over that is a group of its own), each on the images that hold its
    categories (`_category_groups`), i.e. a single group up to mini500; the file is parsed into arrays one object
    at a time. faster-coco-eval is evaluated the same way (its C++ core behind the same COCOeval interface): the
    same numbers, in the same bounded memory."""
    evaluation = _evaluate_grouped(coco_gt, read_results(Path(path)), image_ids, evaluator, pairs_per_chunk, cap,
                                   "bbox")
    return evaluation.stats, evaluation.per_class


@dataclass
class Evaluation:
    """One COCOeval of a results file: the statistics, each category's AP, the averaged precision-recall curves and
    the best-F1 operating point (`precision_recall`)."""

    stats: dict[str, float]
    per_class: dict[int, dict[str, float]]
    pr_curve: dict
    operating_point: OperatingPoint | None  # None: no ground truth (`operating_point_unavailable` says so)
    operating_point_unavailable: str | None = None
    map_interval: dict | None = None  # the bootstrap interval over the images (`bootstrap.ImageBootstrap`), if asked
    bootstrap: ImageBootstrap | None = field(default=None, repr=False)  # its per-image matches, where collected


def _evaluate_grouped(coco_gt: COCO, columns: ResultColumns, image_ids: list[int], evaluator: str,
                      pairs_per_chunk: int | None, cap: int, iou_type: str, resampled: bool = False) -> Evaluation:
    """COCOeval of `iou_type` a group of categories at a time (see evaluate_bbox_file_per_class), the groups'
    accumulated arrays joined into one evaluation, each group's matches at IoU 0.50 kept for the operating point
    (`resampled`: at COCO's ten thresholds, for resampling the images: the evaluation's `bootstrap`)."""
    COCOeval, gt = _library(coco_gt, evaluator)
    image_ids = sorted(image_ids)
    categories = sorted(coco_gt.getCatIds())
    parts = []
    matches = MatchCollector(COCO_IOUS if resampled else (IOU,))
    ground_truths = _ground_truth_counts(coco_gt, image_ids)
    evaluated = _evaluated_detections(columns, image_ids)
    with contextlib.redirect_stdout(io.StringIO()):
        for chunk, chunk_images in _category_groups(categories, columns, coco_gt, image_ids,
                                                    pairs_per_chunk or CHUNK_PAIRS):
            coco_eval = COCOeval(gt, _results_of(gt, columns, chunk, iou_type), iou_type)
            coco_eval.params.imgIds, coco_eval.params.catIds = chunk_images, chunk
            coco_eval.params.maxDets = max_dets_for(cap)
            coco_eval.evaluate()
            coco_eval.accumulate()
            parts.append(coco_eval.eval)
            matches.add(coco_eval, _detections_of(evaluated, chunk), {c: ground_truths.get(c, {}) for c in chunk},
                        cap)
            del coco_eval  # this group's per-image records go before the next group's are built
        coco_eval = COCOeval(gt, _results_of(gt, columns, [], iou_type), iou_type)
        coco_eval.params.imgIds, coco_eval.params.catIds = image_ids, categories
        coco_eval.params.maxDets = max_dets_for(cap)
        coco_eval.eval = {"params": coco_eval.params, "counts": [*parts[0]["counts"][:2], len(categories),
                                                                 *parts[0]["counts"][3:]],
                          "precision": np.concatenate([e["precision"] for e in parts], axis=2),
                          "recall": np.concatenate([e["recall"] for e in parts], axis=1),
                          "scores": np.concatenate([e["scores"] for e in parts], axis=2)}
    point = operating_point(matches)
    unavailable = "no ground-truth object among the evaluated images" if point is None else None
    return Evaluation(summarize(coco_eval, cap), per_class_ap(coco_eval, cap),
                      pr_curves(coco_eval.eval, coco_eval.params, cap), point, unavailable,
                      bootstrap=ImageBootstrap(matches, image_ids) if resampled else None)


def evaluate_masks_file(coco_gt: COCO, path: str | Path, image_ids: list[int], evaluator: str = "pycocotools",
                        cap: int = COCO_MAX_DETS) -> dict[str, dict[str, float]]:
    """Instance segmentation: COCO `segm` and `bbox` statistics of one results file, on the same detections
    (each result has a `segmentation` COCO RLE at the source image's height x width and its predicted `bbox`).
    Returns {"segm": stats, "bbox": stats}; the ground truth's polygons and RLEs both count (pycocotools'
    annToRLE converts the polygons)."""
    return evaluate_masks_file_per_class(coco_gt, path, image_ids, evaluator, cap)[0]


def evaluate_masks_file_per_class(coco_gt: COCO, path: str | Path, image_ids: list[int],
                                  evaluator: str = "pycocotools", cap: int = COCO_MAX_DETS,
                                  pairs_per_chunk: int | None = None,
                                  ) -> tuple[dict[str, dict[str, float]], dict[int, dict[str, float]]]:
    """`evaluate_masks_file` and each category's mask AP, in bounded memory as the box evaluation: the file parsed
    one result at a time (the masks kept as their RLEs), categories evaluated a group at a time.

    Each result keeps its predicted box (loadRes takes its bbox branch when a box is there, as with libreyolo's
    results: a detection's area, for the area ranges, is its box's). The box pass reads the results without their
    masks: exactly what a detection file of the same boxes is scored on."""
    segm, bbox = _evaluate_masks(coco_gt, read_results(Path(path), masks=True), image_ids, evaluator, cap,
                                 pairs_per_chunk)
    return {"segm": segm.stats, "bbox": bbox.stats}, segm.per_class


def _evaluate_masks(coco_gt: COCO, columns: ResultColumns, image_ids: list[int], evaluator: str, cap: int,
                    pairs_per_chunk: int | None = None, resampled: bool = False) -> tuple[Evaluation, Evaluation]:
    """The segm and the bbox evaluation of one segmentation results file's columns (`resampled`: the masks')."""
    return (_evaluate_grouped(coco_gt, columns, image_ids, evaluator, pairs_per_chunk, cap, "segm", resampled),
            _evaluate_grouped(coco_gt, columns, image_ids, evaluator, pairs_per_chunk, cap, "bbox"))


# The box statistics a segmentation submission carries beside its mask ones, as bbox_<key> (the site's shape)
SITE_BBOX_KEYS = ("mAP_50_95", "mAP_50", "mAP_75", "mAP_small", "mAP_medium", "mAP_large")


@dataclass
class CellEvaluation:
    """What a cell's detections file is scored as: the task's primary evaluation (`Evaluation`: segm for masks) with
    the statistics as a submission carries them (a segmentation cell's box ones beside, as bbox_<key>), the
    iouTypes evaluated, and a detection cell's confusion matrix at its operating point."""

    stats: dict[str, float]
    primary: Evaluation
    iou_types: list[str]
    confusion: ConfusionMatrix | None = None


def evaluate_cell_file(coco_gt: COCO, path: str | Path, image_ids: list[int], evaluator: str, cap: int,
                       task: str = "detect", resamples: int = 0) -> CellEvaluation:
    """The evaluation a cell's detections file gets. "detect": bbox; "segment": segm and bbox on the same
    detections, the mask statistics under the plain keys and the box ones as bbox_mAP_50_95 ... (SITE_BBOX_KEYS),
    per-category AP, curves and operating point of the masks. `resamples`: the bootstrap interval of the primary
    mAP over the images (0: none)."""
    if task == "segment":
        segm, bbox = _evaluate_masks(coco_gt, read_results(Path(path), masks=True), image_ids, evaluator, cap,
                                     resampled=resamples > 0)
        cell = CellEvaluation({**segm.stats, **{f"bbox_{k}": bbox.stats[k] for k in SITE_BBOX_KEYS}}, segm,
                              ["segm", "bbox"])
    else:
        columns = read_results(Path(path))
        evaluation = _evaluate_grouped(coco_gt, columns, image_ids, evaluator, None, cap, "bbox",
                                       resampled=resamples > 0)
        point = evaluation.operating_point
        confusion = None if point is None or point.confidence is None else confusion_matrix(
            coco_gt, columns.image_id, columns.category_id, columns.bbox, columns.score, image_ids, point.confidence,
            cap)
        cell = CellEvaluation(evaluation.stats, evaluation, ["bbox"], confusion)
    if resamples:
        cell.primary.map_interval = cell.primary.bootstrap.interval(resamples)
    return cell


def cell_bootstrap(coco_gt: COCO, path: str | Path, image_ids: list[int], evaluator: str, cap: int,
                   task: str = "detect") -> ImageBootstrap:
    """A cell's detections file evaluated as its cell was (segm for a segmentation file), its per-image matches
    kept for resampling (`bootstrap.paired_interval` of two cells)."""
    segment = task == "segment"
    columns = read_results(Path(path), masks=segment)
    return _evaluate_grouped(coco_gt, columns, image_ids, evaluator, None, cap, "segm" if segment else "bbox",
                             resampled=True).bootstrap


def operating_point_summary(evaluation: Evaluation) -> dict:
    """The operating point as a submission's `eval.operating_point` carries it: the confidence and the classes' mean
    precision, recall and F1 there, or unavailable with the reason."""
    if evaluation.operating_point is None:
        return {"status": "unavailable", "reason": evaluation.operating_point_unavailable}
    return evaluation.operating_point.to_dict()


def per_class_document(evaluation: CellEvaluation, names: dict[int, str], cap: int) -> dict:
    """A cell's per_class file: each category's AP 50:95 and AP 50 (null where it has no ground truth) and its
    precision, recall and F1 at the operating point (null where it is not averaged), the operating point itself,
    the averaged precision-recall curves and the classes' mean precision, recall and F1 against the confidence."""
    primary = evaluation.primary
    at_point = primary.operating_point.per_class if primary.operating_point is not None else {}
    return {"eval_max_det": cap, "iou_type": evaluation.iou_types[0], "categories": [
        {"id": c, "name": names.get(c), **{k: (None if v < 0 else round(v, 6)) for k, v in ap.items()},
         **{k: (round(at_point[c][k], 6) if c in at_point else None) for k in ("precision", "recall", "F1")}}
        for c, ap in sorted(primary.per_class.items())],
        "operating_point": operating_point_summary(primary), "pr_curve": primary.pr_curve,
        "confidence_curve": primary.operating_point.confidence_curve if primary.operating_point else {},
        **({"confusion_matrix": evaluation.confusion.to_dict()} if evaluation.confusion is not None else {})}


# What evaluate_bbox_file evaluates at once: mini500's (image, category) pairs and about its detections
CHUNK_PAIRS = 500 * 80
CHUNK_DETECTIONS = 100_000


def _category_groups(categories: list[int], columns: ResultColumns, coco_gt: COCO, image_ids: list[int],
                     max_pairs: int) -> list[tuple[list[int], list[int]]]:
    """Consecutive categories, greedily grouped under max_pairs (image, category) pairs and CHUNK_DETECTIONS
    detections, each with the images it is scored on: those of `image_ids` (sorted) holding a ground-truth
    annotation or a detection of one of its categories. COCOeval leaves every other (image, category) pair out
    (evaluateImg gives None), so the statistics are those over all images; and a group costs what its own images
    do, where every group over every image made many classes on many images quadratic. A group with no such image
    is scored on the first image alone (nothing there either: undefined, as over all; an empty image list would
    mean every image to pycocotools' annotation lookup)."""
    wanted = np.asarray(image_ids, dtype=np.int64)
    order = np.lexsort((columns.image_id, columns.category_id))
    detected_images, detected_categories = columns.image_id[order], columns.category_id[order]
    groups: list[tuple[list[int], np.ndarray]] = []
    covered, detections = np.zeros(len(wanted), dtype=bool), 0
    for category in categories:
        lo, hi = np.searchsorted(detected_categories, [category, category + 1])
        images = np.union1d(detected_images[lo:hi], np.asarray(coco_gt.catToImgs.get(category, []), dtype=np.int64))
        positions = np.searchsorted(wanted, images[np.isin(images, wanted)])
        if groups:
            grown = covered.copy()
            grown[positions] = True
            if int(grown.sum()) * (len(groups[-1][0]) + 1) <= max_pairs and detections + (hi - lo) <= CHUNK_DETECTIONS:
                groups[-1][0].append(category)
                covered, detections = grown, detections + (hi - lo)
                groups[-1] = (groups[-1][0], covered)
                continue
        covered = np.zeros(len(wanted), dtype=bool)
        covered[positions] = True
        detections = hi - lo
        groups.append(([category], covered))
    return [(chunk, wanted[mask].tolist() if mask.any() else wanted[:1].tolist()) for chunk, mask in groups]


def _ground_truth_counts(coco_gt: COCO, image_ids: list[int]) -> dict[int, dict[int, int]]:
    """Category id -> image id -> its non-crowd ground truths there, on `image_ids` (what recall divides by)."""
    counts: dict[int, dict[int, int]] = {}
    for image_id in image_ids:
        for ann in coco_gt.imgToAnns.get(image_id, ()):
            if not ann.get("iscrowd", 0):
                per_image = counts.setdefault(ann["category_id"], {})
                per_image[image_id] = per_image.get(image_id, 0) + 1
    return counts


def _evaluated_detections(columns: ResultColumns, image_ids: list[int]) -> tuple[np.ndarray, ...]:
    """(category, image, score) of the detections on `image_ids`, sorted by category: a group of consecutive
    categories is a slice (`_detections_of`)."""
    rows = np.isin(columns.image_id, image_ids)
    order = np.argsort(columns.category_id[rows], kind="stable")
    return columns.category_id[rows][order], columns.image_id[rows][order], columns.score[rows][order]


def _detections_of(detections: tuple[np.ndarray, ...], categories: list[int]) -> tuple[np.ndarray, ...]:
    """The part of `_evaluated_detections` of a group of consecutive categories."""
    lo = np.searchsorted(detections[0], categories[0], side="left")
    hi = np.searchsorted(detections[0], categories[-1], side="right")
    return tuple(a[lo:hi] for a in detections)


@dataclass
class ResultColumns:
    """A COCO results file as columns, in file order."""

    image_id: np.ndarray  # [N] int64
    category_id: np.ndarray  # [N] int64
    bbox: np.ndarray  # [N, 4] float64, xywh as written
    score: np.ndarray  # [N] float64
    segmentation: list[dict] | None = None  # [N] COCO RLEs, for a segmentation file

    def per_image(self) -> list[ImageDetections]:
        """Each image's results, in file order within it, boxes as xyxy; labels are the COCO category ids (the
        masks too, for a segmentation file). One sort of the columns, no object per result."""
        if not self.image_id.size:
            return []
        order = np.argsort(self.image_id, kind="stable")
        ids = self.image_id[order]
        image_ids, starts = np.unique(ids, return_index=True)
        xyxy = np.concatenate([self.bbox[:, :2], self.bbox[:, :2] + self.bbox[:, 2:]], axis=1)[order]
        out = []
        for image_id, rows, boxes, scores, labels in zip(
                image_ids.tolist(), np.split(order, starts[1:]), np.split(xyxy, starts[1:]),
                np.split(self.score[order], starts[1:]), np.split(self.category_id[order], starts[1:]), strict=True):
            masks = None if self.segmentation is None else [self.segmentation[i] for i in rows.tolist()]
            out.append(ImageDetections(image_id, boxes, scores, labels, masks))
        return out


def read_results(path: Path, masks: bool = False) -> ResultColumns:
    """Parse a COCO results array one object at a time (json.loads would build every dict at once); an empty
    array is no detections, evaluated as such (a statistic without ground truth stays undefined). Raises
    ValueError for anything but an array of result objects (with `masks`, each with a COCO RLE segmentation)."""
    text = read_json_text(path)
    # typed arrays: 8 bytes a number, where lists of Python floats would take ~4x that
    ids, cats, boxes, scores = array("q"), array("q"), array("d"), array("d")
    rles: list[dict] = []
    try:
        for k, item in enumerate(iter_json_array(text)):  # k: the result's index, for the messages
            if masks:
                rle = item.get("segmentation") if isinstance(item, dict) else None
                if not (isinstance(rle, dict) and isinstance(rle.get("counts"), (str, list))
                        and len(rle.get("size", ())) == 2):
                    raise ValueError(f"{path}: result {k} has no COCO RLE segmentation (size [h, w], counts)")
                rles.append({"size": rle["size"], "counts": rle["counts"]})
            try:
                ids.append(int(item["image_id"]))
                cats.append(int(item["category_id"]))
                scores.append(float(item["score"]))
                box = [float(v) for v in item["bbox"]]
                if len(box) != 4:
                    raise ValueError(f"bbox has {len(box)} numbers")
                boxes.extend(box)
            except (TypeError, KeyError, ValueError) as exc:
                raise ValueError(f"{path}: result {k} is not a bbox result ({exc})") from exc
    except NotAJsonArray as exc:
        raise ValueError(f"{path} is not a COCO results array") from exc
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path} is not valid JSON ({json_problem(exc)})") from exc
    return ResultColumns(np.frombuffer(ids, dtype=np.int64), np.frombuffer(cats, dtype=np.int64),
                         np.frombuffer(boxes, dtype=np.float64).reshape(-1, 4),
                         np.frombuffer(scores, dtype=np.float64), rles if masks else None)


def _results_of(coco_gt: COCO, columns: ResultColumns, categories: list[int], iou_type: str = "bbox") -> COCO:
    """pycocotools' results object (loadRes) of the detections of `categories`, in file order: within an
    (image, category) pair the order is the file's, which is what breaks pycocotools' score ties. For "segm" each
    result carries its mask beside its box."""
    rows = np.isin(columns.category_id, categories).nonzero()[0]
    if len(rows) == 0:  # loadRes rejects an empty list: an empty results set over the same images
        empty = type(coco_gt)()
        empty.dataset = {"images": list(coco_gt.dataset["images"]), "annotations": [],
                         "categories": copy.deepcopy(coco_gt.dataset["categories"])}
        empty.createIndex()
        return empty
    anns = [{"image_id": i, "category_id": c, "bbox": b, "score": s} for i, c, b, s in
            zip(columns.image_id[rows].tolist(), columns.category_id[rows].tolist(), columns.bbox[rows].tolist(),
                columns.score[rows].tolist(), strict=True)]
    if iou_type == "segm":
        for ann, row in zip(anns, rows.tolist(), strict=True):
            ann["segmentation"] = dict(columns.segmentation[row])  # loadRes writes into it: a copy
    return coco_gt.loadRes(anns)


_FASTER_GT: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # the GT index per dataset, built once


def _library(coco_gt: COCO, evaluator: str):
    """(COCOeval class, ground truth in that library's COCO) of an evaluator; faster-coco-eval's index of a
    dataset is built once."""
    if evaluator == "pycocotools":
        from pycocotools.cocoeval import COCOeval

        return COCOeval, coco_gt
    if evaluator == "faster-coco-eval":
        from faster_coco_eval import COCO as FasterCOCO
        from faster_coco_eval import COCOeval_faster

        gt = _FASTER_GT.get(coco_gt)
        if gt is None:
            with contextlib.redirect_stdout(io.StringIO()):
                gt = _FASTER_GT[coco_gt] = FasterCOCO(copy.deepcopy(coco_gt.dataset))
        return COCOeval_faster, gt
    raise ValueError(f"unknown evaluator {evaluator!r}; use one of {EVALUATORS}")


def _evaluate(coco_gt: COCO, detections: list[dict], image_ids: list[int], evaluator: str,
              cap: int = COCO_MAX_DETS, iou_type: str = "bbox") -> tuple[dict[str, float], dict[int, dict[str, float]]]:
    if not detections:  # loadRes rejects an empty list: the empty set through the grouped evaluation
        empty = ResultColumns(*(np.zeros(0, dtype=np.int64),) * 2, np.zeros((0, 4)), np.zeros(0), [])
        evaluation = _evaluate_grouped(coco_gt, empty, image_ids, evaluator, None, cap, iou_type)
        return evaluation.stats, evaluation.per_class
    COCOeval, gt = _library(coco_gt, evaluator)
    with contextlib.redirect_stdout(io.StringIO()):
        coco_eval = COCOeval(gt, gt.loadRes(detections), iou_type)
        coco_eval.params.imgIds = sorted(image_ids)
        coco_eval.params.maxDets = max_dets_for(cap)
        coco_eval.evaluate()
        coco_eval.accumulate()
    return summarize(coco_eval, cap), per_class_ap(coco_eval, cap)


def defined_stats(stats: dict[str, float]) -> dict:
    """COCOeval's statistics with its -1 ("no ground truth in this area range", small subsets) as null and the
    reason under `unavailable`: -1 is not a score."""
    missing = sorted(k for k, v in stats.items() if v < 0)
    out: dict = {k: (None if k in missing else v) for k, v in stats.items()}
    if missing:
        out["unavailable"] = {k: "no ground-truth object in this area range among the variant's images"
                              for k in missing}
    return out
