"""The confusion matrix at the operating point: COCO's own true positives on its diagonal (pycocotools' evalImgs),
what COCO scored as errors matched across classes off it, and each class's recall and precision read back from it
equal to the per_class file's."""

from __future__ import annotations

import contextlib
import functools
import io
import json

import numpy as np
import pytest
import torch
from conftest import coco_from
from torchvision.ops import box_iou

from harness.eval.coco_eval import evaluate_cell_file, per_class_document
from harness.eval.confusion import confusion_matrix


def _matrix(document: dict) -> tuple[list[int], np.ndarray]:
    ids = sorted(c["id"] for c in document["categories"])
    at = {c: k for k, c in enumerate(ids)}
    counts = np.zeros((len(ids) + 1, len(ids) + 1), dtype=np.int64)
    for truth, detected, count in document["confusion_matrix"]["cells"]:
        counts[len(ids) if truth is None else at[truth], len(ids) if detected is None else at[detected]] = count
    return ids, counts


def test_a_hand_made_image():
    """One image: a person found (diagonal), a dog detected as a person (a confusion), a person missed (background
    column), a dog box on nothing (background row), a person box on a crowd of people (ignored, as COCO ignores it)
    and a dog below the confidence (not kept)."""
    gt = coco_from({"images": [{"id": 1, "width": 200, "height": 100}],
                    "categories": [{"id": 1, "name": "person"}, {"id": 18, "name": "dog"}],
                    "annotations": [
                        {"id": 1, "image_id": 1, "category_id": 1, "bbox": [0, 0, 20, 40], "area": 800, "iscrowd": 0},
                        {"id": 2, "image_id": 1, "category_id": 18, "bbox": [50, 50, 30, 20], "area": 600,
                         "iscrowd": 0},
                        {"id": 3, "image_id": 1, "category_id": 1, "bbox": [100, 0, 20, 40], "area": 800,
                         "iscrowd": 0},
                        {"id": 4, "image_id": 1, "category_id": 1, "bbox": [140, 0, 60, 60], "area": 3600,
                         "iscrowd": 1}]})
    image = np.ones(5, dtype=np.int64)
    category = np.array([1, 1, 18, 1, 18])
    boxes = np.array([[1, 1, 20, 40], [51, 50, 30, 20], [0, 70, 20, 20], [150, 10, 20, 20], [100, 0, 20, 40]],
                     dtype=np.float64)
    score = np.array([0.9, 0.8, 0.7, 0.6, 0.1])
    matrix = confusion_matrix(gt, image, category, boxes, score, [1], confidence=0.5, cap=100)
    person, dog, background = 0, 1, 2
    expected = np.zeros((3, 3), dtype=np.int64)
    expected[person, person] = 1
    expected[dog, person] = 1
    expected[person, background] = 1
    expected[background, dog] = 1
    np.testing.assert_array_equal(matrix.counts, expected)
    assert matrix.to_dict()["cells"] == [[1, 1, 1], [1, None, 1], [18, 1, 1], [None, 18, 1]]
    # the cap, per image and category as COCOeval keeps detections: with one per category the dog-as-person box
    # (the second person box by score) is no longer kept
    capped = confusion_matrix(gt, image, category, boxes, score, [1], confidence=0.5, cap=1)
    assert capped.counts[dog, person] == 0 and capped.counts[dog, background] == 1


def _pycocotools_reference(coco_gt, detections: list[dict], image_ids: list[int], confidence: float,
                           cap: int) -> tuple[list[int], np.ndarray]:
    """The matrix from pycocotools' own per-image matching (evalImgs at IoU 0.50, area all, the cap): its true
    positives among the detections >= confidence on the diagonal, the ground truths they found; then the leftovers
    paired across classes by a plain loop over torchvision's box IoU, highest first."""
    from pycocotools.cocoeval import COCOeval

    with contextlib.redirect_stdout(io.StringIO()):
        coco_eval = COCOeval(coco_gt, coco_gt.loadRes(detections), "bbox")
        coco_eval.params.imgIds, coco_eval.params.iouThrs = image_ids, np.array([0.5])
        coco_eval.params.maxDets, coco_eval.params.areaRng, coco_eval.params.areaRngLbl = [cap], [[0, 1e10]], ["all"]
        coco_eval.evaluate()
    dts = coco_eval.cocoDt.anns
    ids = sorted(coco_gt.getCatIds())
    at = {c: k for k, c in enumerate(ids)}
    counts = np.zeros((len(ids) + 1, len(ids) + 1), dtype=np.int64)
    found, true_positive, ignored = set(), set(), set()
    for record in coco_eval.evalImgs:
        if record is None:
            continue
        for d, matched, skip in zip(record["dtIds"], record["dtMatches"][0], record["dtIgnore"][0], strict=True):
            if dts[d]["score"] >= confidence:
                if skip:
                    ignored.add(d)
                elif matched:
                    true_positive.add(d)
                    found.add(int(matched))
    for d in true_positive:
        counts[at[dts[d]["category_id"]], at[dts[d]["category_id"]]] += 1
    for image in image_ids:
        kept = {d for d in coco_eval.cocoDt.getAnnIds(imgIds=[image])}
        # the cap: each category's best `cap` (all evaluated records list them; the others are dropped)
        evaluated = {d for r in coco_eval.evalImgs if r is not None and r["image_id"] == image for d in r["dtIds"]}
        left = [d for d in sorted(kept & evaluated, key=lambda d: (-dts[d]["score"], d))
                if dts[d]["score"] >= confidence and d not in true_positive and d not in ignored]
        missed = [g["id"] for g in coco_gt.imgToAnns.get(image, []) if not g["iscrowd"] and g["id"] not in found]
        if left and missed:
            xyxy = [[x, y, x + w, y + h] for x, y, w, h in ([dts[d]["bbox"] for d in left])]
            truth = [[x, y, x + w, y + h] for x, y, w, h in (coco_gt.anns[g]["bbox"] for g in missed)]
            ious = box_iou(torch.tensor(xyxy, dtype=torch.float64), torch.tensor(truth, dtype=torch.float64)).numpy()
            pairs = sorted(((ious[i, j], -dts[left[i]]["score"], j, i) for i in range(len(left))
                            for j in range(len(missed)) if ious[i, j] >= 0.5), key=lambda p: (-p[0], p[1], p[2]))
            taken_d, taken_g = set(), set()
            for _, _, j, i in pairs:
                if i not in taken_d and j not in taken_g:
                    taken_d.add(i)
                    taken_g.add(j)
                    counts[at[coco_gt.anns[missed[j]]["category_id"]], at[dts[left[i]]["category_id"]]] += 1
            left = [d for i, d in enumerate(left) if i not in taken_d]
            missed = [g for j, g in enumerate(missed) if j not in taken_g]
        for g in missed:
            counts[at[coco_gt.anns[g]["category_id"]], len(ids)] += 1
        for d in left:
            counts[len(ids), at[dts[d]["category_id"]]] += 1
    return ids, counts


@pytest.fixture(scope="module")
def reference_of_cell(ort_run):
    """`_pycocotools_reference` of the sample run's batch-8 cell at (confidence, cap), each computed once for the
    module's tests (both evaluators' operating points are the same confidence); callers only read it."""
    plan, _ = ort_run
    detections = json.loads(next(plan.run_dir.glob("detections/*__b8.json")).read_text())
    image_ids = list(plan.variant.image_ids)
    return functools.cache(lambda confidence, cap: _pycocotools_reference(plan.dataset.coco, detections, image_ids,
                                                                          confidence, cap))


@pytest.mark.parametrize("evaluator", ["pycocotools", "faster-coco-eval"])
def test_a_real_cell_against_pycocotools_matches_and_its_own_operating_point(ort_run, reference_of_cell, evaluator):
    """yolox-nano on the sample: the matrix equals the one built from pycocotools' evalImgs, cell for cell, also
    under a cap of 3 (the evaluation's, which applies per image and category); each class's diagonal over its row
    and its column is the per_class file's recall and precision at the operating point."""
    plan, _ = ort_run
    path = next(plan.run_dir.glob("detections/*__b8.json"))
    coco_gt, image_ids = plan.dataset.coco, list(plan.variant.image_ids)
    for cap in (100, 3):
        evaluation = evaluate_cell_file(coco_gt, path, image_ids, evaluator, cap)
        document = per_class_document(evaluation, plan.dataset.categories, cap)
        ids, counts = _matrix(document)
        confidence = evaluation.primary.operating_point.confidence
        assert document["confusion_matrix"]["confidence"] == round(confidence, 6)
        expected_ids, expected = reference_of_cell(confidence, cap)
        assert ids == expected_ids
        np.testing.assert_array_equal(counts, expected)
        assert counts.trace() > 500 and counts[:-1, :-1].sum() - counts[:-1, :-1].trace() > 20  # real confusions
        for k, category in enumerate(document["categories"]):
            if category["recall"] is None:
                continue
            row, column = counts[k].sum(), counts[:, k].sum()
            assert counts[k, k] / row == pytest.approx(category["recall"], abs=1e-6)
            assert (counts[k, k] / column if column else 0.0) == pytest.approx(category["precision"], abs=1e-6)


def test_a_run_writes_the_matrix_of_its_own_evaluation(ort_run):
    """The per_class file a run writes carries the matrix its evaluation gives (the run's evaluator, the cap)."""
    plan, _ = ort_run
    for written_path in plan.run_dir.glob("per_class/*.json"):
        written = json.loads(written_path.read_text())
        evaluation = evaluate_cell_file(plan.dataset.coco, plan.run_dir / "detections" / written_path.name,
                                        list(plan.variant.image_ids), plan.config.evaluator, written["eval_max_det"])
        again = per_class_document(evaluation, plan.dataset.categories, written["eval_max_det"])["confusion_matrix"]
        assert again == written["confusion_matrix"] and len(again["cells"]) > 100


def _drawn(monkeypatch, cells: list, categories: list[dict]):
    """The confusion plot of one cell whose per_class file holds `cells` (the run's files stubbed out)."""
    from harness.report import plots

    document = {"categories": categories, "confusion_matrix": {"confidence": 0.5, "cells": cells}}
    monkeypatch.setattr(plots, "_evaluations", lambda run, key: {"cell b1": document})
    return plots.confusion(None)


def test_the_plot_of_a_cell_without_errors_still_draws_its_classes(monkeypatch):
    """Every object found, no false positive: the diagonal is the whole matrix. The plot picks its classes by their
    errors only, so it draws a lone empty 'background' square and none of the 7 true positives."""
    plot = _drawn(monkeypatch, [[1, 1, 5], [2, 2, 2]], [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}])
    assert plot.data["classes"] == [1, 2]
    assert np.trace(np.asarray(plot.data["counts"])) == 7


def test_the_plot_draws_a_class_without_errors_when_there_is_room(monkeypatch):
    """Three classes, 'a' found perfectly, 'b' confused with 'c': far fewer than 20 classes, yet 'a' is left out."""
    plot = _drawn(monkeypatch, [[1, 1, 5], [2, 3, 2], [3, 3, 4]],
                  [{"id": 1, "name": "a"}, {"id": 2, "name": "b"}, {"id": 3, "name": "c"}])
    assert 1 in plot.data["classes"]


def test_a_detection_of_a_category_the_dataset_lacks_is_left_out_as_cocoeval_leaves_it():
    """COCOeval scores only the ground truth's categories (evaluate_bbox_file takes such a file); the matrix raised
    KeyError on the unknown category instead."""
    gt = coco_from({"images": [{"id": 1, "width": 100, "height": 100}], "categories": [{"id": 1, "name": "a"}],
                    "annotations": [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [10, 10, 20, 20], "area": 400,
                                     "iscrowd": 0}]})
    matrix = confusion_matrix(gt, np.array([1, 1]), np.array([1, 7]), np.array([[10, 10, 20, 20], [50, 50, 20, 20]],
                                                                               dtype=np.float64),
                              np.array([0.9, 0.95]), [1], confidence=0.5, cap=100)
    assert matrix.counts.tolist() == [[1, 0], [0, 0]]
