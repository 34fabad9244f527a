"""The operating point (best mean F1) and the averaged precision-recall curves of a cell's evaluation, against
truths that do not come from the harness: faster-coco-eval's `extended_metrics` where its counting is sound (no
crowd regions, at most one candidate per object), a plain matching loop with COCO's rules (crowd regions, duplicates)
and pycocotools' own summarize for the curves."""

from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pytest
from conftest import SUBSET_ANNOTATIONS, coco_from, requires_coco

from harness.eval.coco_eval import _evaluate_grouped, evaluate_cell_file, per_class_document, read_results


@pytest.fixture(scope="module")
def subset() -> dict:
    if not SUBSET_ANNOTATIONS.is_file():
        pytest.skip("COCO sample missing")
    return json.loads(SUBSET_ANNOTATIONS.read_text())


def _detections(coco, seed: int, jitters: int, random_boxes: int) -> list[dict]:
    """`jitters` jittered copies of most ground-truth boxes (the true class) and `random_boxes` boxes of the image's
    own classes per image; scores on a 1e-4 grid, so that ties across classes and images happen."""
    rng = np.random.default_rng(seed)
    out = []
    for image_id in sorted(coco.imgs):
        info = coco.imgs[image_id]
        for ann in coco.imgToAnns[image_id]:
            x, y, w, h = ann["bbox"]
            for _ in range(jitters):
                if rng.uniform() < 0.75:
                    out.append({"image_id": image_id, "category_id": ann["category_id"],
                                "score": round(float(rng.uniform(0.2, 1.0)), 4),
                                "bbox": [x + rng.normal(0, 2), y + rng.normal(0, 2), w * rng.uniform(0.85, 1.15),
                                         h * rng.uniform(0.85, 1.15)]})
        present = sorted({a["category_id"] for a in coco.imgToAnns[image_id]}) or [1]
        for _ in range(random_boxes):
            w, h = rng.uniform(5, info["width"] / 3), rng.uniform(5, info["height"] / 3)
            out.append({"image_id": image_id, "category_id": int(rng.choice(present)),
                        "score": round(float(rng.uniform(0.0, 0.9)), 4),
                        "bbox": [rng.uniform(0, info["width"] - w), rng.uniform(0, info["height"] - h), w, h]})
    return out


def _iou(box, gt, crowd: bool) -> float:
    """Box IoU; against a crowd region, the intersection over the detection's own area (COCO's rule)."""
    ax, ay, aw, ah = box
    bx, by, bw, bh = gt
    iw = max(0.0, min(ax + aw, bx + bw) - max(ax, bx))
    ih = max(0.0, min(ay + ah, by + bh) - max(ay, by))
    inter = iw * ih
    union = aw * ah if crowd else aw * ah + bw * bh - inter
    return inter / union if union > 0 else 0.0


def _reference(coco, detections: list[dict], image_ids: list[int]):
    """The operating point by a plain loop: each image and class's detections, highest score first (file order at a
    tie), take the unmatched non-crowd ground truth of highest IoU >= 0.5, else a crowd region of IoU >= 0.5
    (ignored: neither true nor false), else count as a false positive; then every distinct score as a threshold,
    each class's precision and recall there, the first threshold (ascending) of the highest mean F1. Returns (that
    threshold, each class's precision and recall there, the function giving every class's P, R, F1 at a
    threshold)."""
    marks: dict[int, list[tuple[float, bool]]] = {}  # class -> (score, true positive) of counted detections
    ground_truths: dict[int, int] = {}
    for image_id in image_ids:
        anns = coco.imgToAnns[image_id]
        for c in {a["category_id"] for a in anns} | {d["category_id"] for d in detections if d["image_id"] == image_id}:
            gts = [a for a in anns if a["category_id"] == c]
            ground_truths[c] = ground_truths.get(c, 0) + sum(1 for g in gts if not g["iscrowd"])
            dts = [d for d in detections if d["image_id"] == image_id and d["category_id"] == c]
            dts = sorted(dts, key=lambda d: -d["score"])[:100]
            taken = set()
            for d in dts:
                best, best_iou = None, 0.5 - 1e-12
                for g in gts:
                    if g["iscrowd"] or g["id"] in taken:
                        continue
                    iou = _iou(d["bbox"], g["bbox"], False)
                    if iou >= best_iou:
                        best, best_iou = g, iou
                if best is not None:
                    taken.add(best["id"])
                    marks.setdefault(c, []).append((d["score"], True))
                elif any(_iou(d["bbox"], g["bbox"], True) >= 0.5 for g in gts if g["iscrowd"]):
                    continue
                else:
                    marks.setdefault(c, []).append((d["score"], False))
    classes = sorted(c for c, n in ground_truths.items() if n > 0)

    def at(threshold: float) -> dict[int, tuple[float, float, float]]:
        out = {}
        for c in classes:
            kept = [tp for s, tp in marks.get(c, []) if s >= threshold]
            tp = sum(kept)
            p, r = (tp / len(kept) if kept else 0.0), tp / ground_truths[c]
            out[c] = (p, r, 2 * p * r / (p + r) if p + r else 0.0)
        return out

    scores = sorted({s for rows in marks.values() for s, _ in rows})
    f1 = [np.mean([v[2] for v in at(t).values()]) for t in scores]
    best = scores[int(np.argmax(f1))]
    return best, {c: v[:2] for c, v in at(best).items()}, at


@requires_coco
@pytest.mark.parametrize("groups", [None, 300])
def test_operating_point_matches_a_plain_loop_with_crowds_and_duplicates(subset, tmp_path, groups):
    """Crowd regions, three candidates per object and classes scored a group at a time (300 (image, class) pairs a
    group): the confidence and each class's precision and recall equal the plain loop's."""
    coco = coco_from(subset)
    image_ids = sorted(coco.imgs)[:50]
    assert any(a["iscrowd"] for i in image_ids for a in coco.imgToAnns[i])  # the crowd rule is exercised
    detections = [d for d in _detections(coco, seed=3, jitters=3, random_boxes=12) if d["image_id"] in image_ids]
    path = tmp_path / "dets.json"
    path.write_text(json.dumps(detections))
    point = _evaluate_grouped(coco, read_results(path), image_ids, "pycocotools", groups, 100, "bbox").operating_point
    confidence, per_class, at = _reference(coco, detections, image_ids)
    assert point.confidence == pytest.approx(confidence, abs=1e-12)
    curve = point.confidence_curve
    for k in (0, 30, 50, 77, 100):  # the classes' means at the curve's confidences
        values = np.asarray(list(at(curve["confidence"][k]).values()))
        assert [curve[name][k] for name in ("precision", "recall", "F1")] == \
            pytest.approx(values.mean(axis=0).tolist(), abs=1e-6), k
    assert max(curve["F1"]) <= point.f1 + 1e-6  # no confidence of the grid beats the operating point
    assert set(point.per_class) == set(per_class) and point.classes == len(per_class)
    for c, (p, r) in per_class.items():
        assert (point.per_class[c]["precision"], point.per_class[c]["recall"]) == pytest.approx((p, r), abs=1e-12), c
    assert point.precision == pytest.approx(np.mean([v[0] for v in per_class.values()]), abs=1e-12)
    assert point.recall == pytest.approx(np.mean([v[1] for v in per_class.values()]), abs=1e-12)


@requires_coco
def test_operating_point_equals_faster_coco_eval_extended_metrics(subset, tmp_path):
    """faster-coco-eval's own best-F1 precision and recall (its `extended_metrics`), on images without crowd regions
    and one candidate per object (where its counting, over every ground truth of the file and every matched
    detection, agrees with COCO's)."""
    from faster_coco_eval import COCO as FasterCOCO
    from faster_coco_eval import COCOeval_faster

    crowded = {a["image_id"] for a in subset["annotations"] if a["iscrowd"]}
    images = [i for i in subset["images"] if i["id"] not in crowded][:80]
    kept = {i["id"] for i in images}
    dataset = {**subset, "images": images, "annotations": [a for a in subset["annotations"] if a["image_id"] in kept]}
    coco = coco_from(dataset)
    detections = _detections(coco, seed=5, jitters=1, random_boxes=10)
    (tmp_path / "gt.json").write_text(json.dumps(dataset))
    path = tmp_path / "dets.json"
    path.write_text(json.dumps(detections))
    point = evaluate_cell_file(coco, path, sorted(kept), "pycocotools", 100).primary.operating_point
    with contextlib.redirect_stdout(io.StringIO()):
        gt = FasterCOCO(str(tmp_path / "gt.json"))
        theirs = COCOeval_faster(gt, gt.loadRes(str(path)), "bbox", extra_calc=True)
        theirs.evaluate(), theirs.accumulate(), theirs.summarize()
    metrics = theirs.extended_metrics
    assert (point.precision, point.recall) == pytest.approx((metrics["precision"], metrics["recall"]), abs=1e-12)
    names = {c["id"]: c["name"] for c in dataset["categories"]}
    rows = {row["class"]: row for row in metrics["class_map"][:-1]}
    assert len(rows) == point.classes
    for c, values in point.per_class.items():
        assert values["precision"] == pytest.approx(rows[names[c]]["precision"], abs=1e-12)
        assert values["recall"] == pytest.approx(rows[names[c]]["recall"], abs=1e-12)


@requires_coco
@pytest.mark.parametrize("evaluator", ["pycocotools", "faster-coco-eval"])
def test_curves_average_to_pycocotools_summarize(subset, tmp_path, evaluator):
    """Each averaged curve's mean over COCO's 101 recall points is pycocotools' own mAP (summarize's stats 0, 1, 2),
    from either evaluator's precision array."""
    from pycocotools.cocoeval import COCOeval

    coco = coco_from(subset)
    image_ids = sorted(coco.imgs)[:60]
    detections = [d for d in _detections(coco, seed=7, jitters=2, random_boxes=15) if d["image_id"] in image_ids]
    path = tmp_path / "dets.json"
    path.write_text(json.dumps(detections))
    evaluation = evaluate_cell_file(coco, path, image_ids, evaluator, 100)
    with contextlib.redirect_stdout(io.StringIO()):
        ref = COCOeval(coco, coco.loadRes(str(path)), "bbox")
        ref.params.imgIds = image_ids
        ref.evaluate(), ref.accumulate(), ref.summarize()
    curve = evaluation.primary.pr_curve
    assert curve["recall"][0] == 0.0 and curve["recall"][-1] == 1.0 and len(curve["recall"]) == 101
    for key, stat in (("0.50:0.95", 0), ("0.50", 1), ("0.75", 2)):
        assert np.mean(curve["precision"][key]) == pytest.approx(ref.stats[stat], abs=1e-5), key
        assert np.all(np.diff(curve["precision"][key]) <= 1e-9)  # COCO's precision envelope does not rise


@requires_coco
def test_per_class_document_and_no_ground_truth(subset, tmp_path):
    """The per_class file: AP and the operating point's precision/recall/F1 per category (null for a category that
    has no ground truth among the images), the point and the curves; with no ground truth at all the point is
    unavailable, with the reason."""
    coco = coco_from(subset)
    image_ids = sorted(coco.imgs)[:20]
    detections = [d for d in _detections(coco, seed=9, jitters=1, random_boxes=5) if d["image_id"] in image_ids]
    path = tmp_path / "dets.json"
    path.write_text(json.dumps(detections))
    evaluation = evaluate_cell_file(coco, path, image_ids, "pycocotools", 100)
    document = per_class_document(evaluation, {c["id"]: c["name"] for c in subset["categories"]}, 100)
    with_gt = {a["category_id"] for i in image_ids for a in coco.imgToAnns[i] if not a["iscrowd"]}
    rows = {row["id"]: row for row in document["categories"]}
    assert {c for c, row in rows.items() if row["F1"] is not None} == with_gt
    assert all(row["AP"] is None and row["precision"] is None for c, row in rows.items() if c not in with_gt
               and not any(a["category_id"] == c for i in image_ids for a in coco.imgToAnns[i]))
    point = document["operating_point"]
    assert 0 < point["F1"] <= 1 and point["classes"] == len(with_gt)
    assert point["F1"] == pytest.approx(np.mean([rows[c]["F1"] for c in with_gt]), abs=1e-5)
    empty = {**subset, "annotations": []}
    none = evaluate_cell_file(coco_from(empty), path, image_ids, "pycocotools", 100).primary
    assert none.operating_point is None and "no ground-truth" in none.operating_point_unavailable
    assert none.pr_curve == {}


def _from_pycocotools_matches(coco, path, image_ids: list[int], iou_type: str = "bbox"):
    """The operating point from pycocotools' own per-image matches (evalImgs' dtMatches, dtIgnore and gtIgnore at
    IoU 0.50, area all): the matching done by the library, the threshold sweep by `operating_point`."""
    from pycocotools.cocoeval import COCOeval

    from harness.eval.precision_recall import ClassMatches, MatchCollector, operating_point

    with contextlib.redirect_stdout(io.StringIO()):
        ref = COCOeval(coco, coco.loadRes(str(path)), iou_type)
        ref.params.imgIds = image_ids
        ref.evaluate()
    collector, images = MatchCollector(), len(image_ids)
    for k, category in enumerate(ref.params.catIds):
        matches = collector.classes.setdefault(category, ClassMatches())
        for entry in ref.evalImgs[k * 4 * images:k * 4 * images + images]:  # area "all" is the first range
            if entry is None:
                continue
            matches.by_image[entry["image_id"]] = int(np.count_nonzero(np.asarray(entry["gtIgnore"]) == 0))
            if entry["dtScores"]:
                ignored = entry["dtIgnore"][:1].astype(bool)
                matches.scores.append(np.asarray(entry["dtScores"]))
                matches.true_positive.append((entry["dtMatches"][:1] > 0) & ~ignored)
                matches.counted.append(~ignored)
    return operating_point(collector)


@requires_coco
@pytest.mark.parametrize("evaluator", ["pycocotools", "faster-coco-eval"])
def test_matching_is_pycocotools_own_with_ties_crowds_and_masks(subset, tmp_path, evaluator):
    """Scores on a 0.1 grid (ties within an image everywhere), crowd regions, several candidates per object: each
    evaluator's operating point equals the one from pycocotools' own per-image matches, for boxes and for masks."""
    from pycocotools import mask as mask_utils

    coco = coco_from(subset)
    image_ids = sorted(coco.imgs)[:40]
    detections = [{**d, "score": round(d["score"], 1)} for d in _detections(coco, seed=11, jitters=3, random_boxes=8)
                  if d["image_id"] in image_ids]
    for d in detections:  # each box as a mask, so that the segm pass has the same objects
        info = coco.imgs[d["image_id"]]
        x, y, w, h = d["bbox"]
        rle = mask_utils.frPyObjects([[x, y, x + w, y, x + w, y + h, x, y + h]], info["height"], info["width"])[0]
        d["segmentation"] = {"size": rle["size"], "counts": rle["counts"].decode()}
    path = tmp_path / "dets.json"
    path.write_text(json.dumps(detections))
    boxes = evaluate_cell_file(coco, path, image_ids, evaluator, 100).primary.operating_point
    masks = evaluate_cell_file(coco, path, image_ids, evaluator, 100, task="segment").primary.operating_point
    for ours, iou_type in ((boxes, "bbox"), (masks, "segm")):
        theirs = _from_pycocotools_matches(coco, path, image_ids, iou_type)
        assert ours.confidence == theirs.confidence, iou_type
        assert ours.per_class == {int(c): v for c, v in theirs.per_class.items()}, iou_type
    assert masks.per_class != boxes.per_class  # the mask pass matched masks, not the boxes again


def test_a_tie_takes_the_lowest_score_and_no_detection_is_no_threshold():
    """Four objects, detections 0.9 TP, 0.8 TP, 0.7 FP, 0.6 FP, 0.5 TP: F1 2/3 at 0.8 and again at 0.5 (precision 1
    and 0.6, recall 0.5 and 0.75); the lower keeps more objects. A class with no detection: no threshold at all."""
    from harness.eval.precision_recall import ClassMatches, MatchCollector, operating_point

    collector = MatchCollector()
    collector.classes[1] = ClassMatches([np.array([0.9, 0.8, 0.7]), np.array([0.6, 0.5])], [],
                                        [np.array([[True, True, False]]), np.array([[False, True]])],
                                        [np.ones((1, 3), dtype=bool), np.ones((1, 2), dtype=bool)], by_image={7: 4})
    point = operating_point(collector)
    assert point.confidence == 0.5
    assert (point.precision, point.recall, point.f1) == pytest.approx((0.6, 0.75, 2 / 3))
    empty = MatchCollector()
    empty.classes[2] = ClassMatches(by_image={7: 3})
    none = operating_point(empty)
    assert none.confidence is None and (none.precision, none.recall, none.f1, none.classes) == (0.0, 0.0, 0.0, 1)


def _tiny(tmp_path, detections: list[dict], gts: list[list[float]]):
    """One 200x200 image, one category, `gts` boxes: the COCO index and the detections file."""
    dataset = {"images": [{"id": 1, "width": 200, "height": 200, "file_name": "1.jpg"}],
               "categories": [{"id": 1, "name": "thing"}],
               "annotations": [{"id": k + 1, "image_id": 1, "category_id": 1, "bbox": box, "area": box[2] * box[3],
                                "iscrowd": 0} for k, box in enumerate(gts)]}
    path = tmp_path / "dets.json"
    path.write_text(json.dumps([{"image_id": 1, "category_id": 1, **d} for d in detections]))
    return coco_from(dataset), path


@pytest.mark.parametrize("evaluator", ["pycocotools", "faster-coco-eval"])
def test_an_iou_of_exactly_one_half_and_equal_ious_match_as_pycocotools_matches(tmp_path, evaluator):
    """IoU exactly 0.50 is a match (COCO's `< iou: continue`), and of two ground truths at equal IoU the later one is
    taken (so the next detection finds the earlier one free): per-class figures equal pycocotools' own matches."""
    gts = [[0, 0, 10, 10], [0, 10, 10, 10], [100, 100, 20, 20]]
    detections = [{"bbox": [0, 5, 10, 10], "score": 0.9},  # IoU 1/3 with both of the first two: no match
                  {"bbox": [0, 0, 10, 20], "score": 0.8},  # IoU exactly 0.5 with the first two: takes the second
                  {"bbox": [0, 0, 10, 11], "score": 0.7},  # IoU 10/11 with the first only: free under COCO's rule
                  {"bbox": [100, 100, 20, 40], "score": 0.6}]  # IoU exactly 0.5 with the third
    coco, path = _tiny(tmp_path, detections, gts)
    ours = evaluate_cell_file(coco, path, [1], evaluator, 100).primary.operating_point
    theirs = _from_pycocotools_matches(coco, path, [1])
    assert ours.per_class == {int(c): v for c, v in theirs.per_class.items()}
    assert ours.per_class[1]["recall"] == 1.0 and ours.confidence == theirs.confidence == 0.6


@pytest.mark.parametrize("evaluator", ["pycocotools", "faster-coco-eval"])
@pytest.mark.parametrize("cap", [10, 100])
def test_detections_past_the_cap_are_not_matched(tmp_path, evaluator, cap):
    """`cap` false positives above the one detection on the object: that detection is cut by the cap (10: below
    COCOeval's largest maxDets) as pycocotools' accumulate cuts it at that maxDets, so the class recalls nothing."""
    from pycocotools.cocoeval import COCOeval

    detections = [{"bbox": [150, 150, 10, 10], "score": round(0.99 - 0.001 * k, 4)} for k in range(cap)]
    detections.append({"bbox": [0, 0, 10, 10], "score": 0.5})
    coco, path = _tiny(tmp_path, detections, [[0, 0, 10, 10]])
    ours = evaluate_cell_file(coco, path, [1], evaluator, cap).primary.operating_point
    with contextlib.redirect_stdout(io.StringIO()):
        ref = COCOeval(coco, coco.loadRes(str(path)), "bbox")
        ref.params.imgIds = [1]
        ref.evaluate(), ref.accumulate()
    assert ref.eval["recall"][0, 0, 0, list(ref.params.maxDets).index(cap)] == 0  # IoU 0.50, class 1, area all
    assert ours.per_class[1]["recall"] == 0.0 and ours.per_class[1]["F1"] == 0.0


@requires_coco
def test_curves_are_pycocotools_precision_point_by_point(subset, tmp_path):
    """Each averaged curve at each recall point is pycocotools' own precision array (area all, 100 detections)
    averaged over the classes with ground truth (and over the ten IoUs for 0.50:0.95), not only on average."""
    from pycocotools.cocoeval import COCOeval

    coco = coco_from(subset)
    image_ids = sorted(coco.imgs)[:30]
    detections = [d for d in _detections(coco, seed=13, jitters=2, random_boxes=10) if d["image_id"] in image_ids]
    path = tmp_path / "dets.json"
    path.write_text(json.dumps(detections))
    curve = evaluate_cell_file(coco, path, image_ids, "pycocotools", 100).primary.pr_curve
    with contextlib.redirect_stdout(io.StringIO()):
        ref = COCOeval(coco, coco.loadRes(str(path)), "bbox")
        ref.params.imgIds = image_ids
        ref.evaluate(), ref.accumulate()
    precision = ref.eval["precision"][:, :, :, 0, 2]  # [T, R, K]
    valid = (precision > -1).all(axis=(0, 1))
    expected = {"0.50": precision[0][:, valid].mean(axis=1), "0.75": precision[5][:, valid].mean(axis=1),
                "0.50:0.95": precision[:, :, valid].mean(axis=(0, 2))}
    assert curve["classes"] == int(valid.sum())
    for key, values in expected.items():
        assert curve["precision"][key] == pytest.approx(values.tolist(), abs=1e-6), key
