"""COCO segm evaluation (instance masks) against pycocotools called directly on the same RLEs.

Independent truth: the sample's own ground-truth masks fed back as detections score segm AP 1.000; the same
masks eroded by a known amount score exactly what a plain pycocotools COCOeval gives for them (written here
with pycocotools' own API, not through the harness)."""

from __future__ import annotations

import contextlib
import copy
import io
import json

import cv2
import numpy as np
import pytest
from conftest import COCO_DIR, requires_coco
from pycocotools import mask as mask_utils
from pycocotools.cocoeval import COCOeval

from harness.eval.coco_eval import evaluate_masks_file

IMAGES = 24


@pytest.fixture(scope="module")
def coco():
    from harness.data.coco import CocoDataset

    return CocoDataset(COCO_DIR).coco


def _results(coco, image_ids, erode: int = 0) -> list[dict]:
    """Every non-crowd ground-truth object as a detection: its mask (optionally eroded by `erode` pixels) as a
    Fortran-ordered uint8 RLE, its own box, a score that orders them."""
    out = []
    for image_id in image_ids:
        for k, ann in enumerate(coco.loadAnns(coco.getAnnIds(imgIds=image_id, iscrowd=False))):
            mask = coco.annToMask(ann)
            if erode:
                mask = cv2.erode(mask, np.ones((2 * erode + 1, 2 * erode + 1), np.uint8))
            rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
            rle["counts"] = rle["counts"].decode("ascii")
            out.append({"image_id": image_id, "category_id": ann["category_id"], "bbox": list(ann["bbox"]),
                        "score": 1.0 - 0.001 * k, "segmentation": rle})
    return out


def _plain_pycocotools_eval(coco, results, image_ids, iou_type) -> COCOeval:
    with contextlib.redirect_stdout(io.StringIO()):
        evaluator = COCOeval(coco, coco.loadRes(copy.deepcopy(results)), iou_type)
        evaluator.params.imgIds = sorted(image_ids)
        evaluator.evaluate()
        evaluator.accumulate()
        evaluator.summarize()
    return evaluator


def _plain_pycocotools(coco, results, image_ids, iou_type) -> float:
    return float(_plain_pycocotools_eval(coco, results, image_ids, iou_type).stats[0])


@requires_coco
def test_ground_truth_masks_score_one(coco, tmp_path):
    image_ids = sorted(coco.getImgIds())[:IMAGES]
    path = tmp_path / "gt.json"
    path.write_text(json.dumps(_results(coco, image_ids)))
    stats = evaluate_masks_file(coco, path, image_ids)
    assert stats["segm"]["mAP_50_95"] == pytest.approx(1.0, abs=1e-9)
    assert stats["bbox"]["mAP_50_95"] == pytest.approx(1.0, abs=1e-9)


@requires_coco
@pytest.mark.parametrize("evaluator", ["pycocotools", "faster-coco-eval"])
def test_eroded_masks_score_what_pycocotools_gives(coco, tmp_path, evaluator):
    image_ids = sorted(coco.getImgIds())[:IMAGES]
    results = _results(coco, image_ids, erode=3)
    path = tmp_path / "eroded.json"
    path.write_text(json.dumps(results))
    stats = evaluate_masks_file(coco, path, image_ids, evaluator)
    want_segm = _plain_pycocotools(coco, results, image_ids, "segm")
    assert 0.05 < want_segm < 0.95  # eroding 3 px is a real, partial loss
    assert stats["segm"]["mAP_50_95"] == pytest.approx(want_segm, abs=1e-12)  # both evaluators, to the last digit
    # the boxes are the predicted (ground-truth) ones, not the eroded masks' bounding boxes
    assert stats["bbox"]["mAP_50_95"] == pytest.approx(1.0, abs=1e-9)


@requires_coco
def test_a_result_without_a_mask_is_refused(coco, tmp_path):
    path = tmp_path / "boxes.json"
    path.write_text(json.dumps([{"image_id": 139, "category_id": 1, "bbox": [0, 0, 5, 5], "score": 0.5}]))
    with pytest.raises(ValueError, match="result 0 has no COCO RLE segmentation"):
        evaluate_masks_file(coco, path, [139])


@requires_coco
def test_masks_are_evaluated_a_group_of_categories_at_a_time_with_the_same_numbers(coco, tmp_path):
    """Bounded memory: the file is read one result at a time and the categories evaluated in groups; groups of
    two categories' pairs give what one group gives, and both what a direct pycocotools call gives."""
    from harness.eval.coco_eval import evaluate_masks_file_per_class

    image_ids = sorted(coco.getImgIds())[:IMAGES]
    results = _results(coco, image_ids, erode=2)
    path = tmp_path / "eroded.json"
    path.write_text(json.dumps(results))
    whole, per_class = evaluate_masks_file_per_class(coco, path, image_ids)
    grouped, grouped_per_class = evaluate_masks_file_per_class(coco, path, image_ids, pairs_per_chunk=2 * IMAGES)
    assert grouped == whole and grouped_per_class == per_class and len(per_class) == 80
    assert whole["segm"]["mAP_50_95"] == pytest.approx(_plain_pycocotools(coco, results, image_ids, "segm"), abs=1e-12)


@requires_coco
@pytest.mark.parametrize("evaluator", ["pycocotools", "faster-coco-eval"])
def test_a_segmentation_cells_figures_are_the_masks_its_bbox_keys_the_boxes(coco, tmp_path, evaluator):
    """evaluate_cell_file(task "segment"): the plain keys are pycocotools' segm figures, bbox_<key> its bbox figures
    of the same results, per-class AP the masks' own (pycocotools' precision array, category by category). Masks
    eroded and boxes shrunk by different amounts, so the two evaluations differ everywhere."""
    from harness.eval.coco_eval import SITE_BBOX_KEYS, STAT_NAMES, evaluate_cell_file

    image_ids = sorted(coco.getImgIds())[:IMAGES]
    results = _results(coco, image_ids, erode=2)
    for r in results:  # each box shrunk to 92 % about its centre: box IoU 0.846, a match up to 0.8
        x, y, w, h = r["bbox"]
        r["bbox"] = [x + 0.04 * w, y + 0.04 * h, 0.92 * w, 0.92 * h]
    path = tmp_path / "cell.json"
    path.write_text(json.dumps(results))
    evaluation = evaluate_cell_file(coco, path, image_ids, evaluator, 100, task="segment")
    stats, per_class = evaluation.stats, evaluation.primary.per_class
    assert evaluation.iou_types == ["segm", "bbox"]
    segm, bbox = (_plain_pycocotools_eval(coco, results, image_ids, t) for t in ("segm", "bbox"))
    assert [stats[k] for k in STAT_NAMES] == pytest.approx(list(segm.stats), abs=1e-12)
    assert [stats[f"bbox_{k}"] for k in SITE_BBOX_KEYS] == pytest.approx(list(bbox.stats[:6]), abs=1e-12)
    assert abs(stats["mAP_50_95"] - stats["bbox_mAP_50_95"]) > 0.05  # two different evaluations
    for k, category in enumerate(segm.params.catIds):
        p = segm.eval["precision"][:, :, k, 0, 2]
        want = float(np.mean(p[p > -1])) if (p > -1).any() else -1.0
        assert per_class[category]["AP"] == pytest.approx(want, abs=1e-12), category
        at50 = p[0]
        assert per_class[category]["AP50"] == pytest.approx(
            float(np.mean(at50[at50 > -1])) if (at50 > -1).any() else -1.0, abs=1e-12), category
    assert sum(v["AP"] >= 0 for v in per_class.values()) >= 10
