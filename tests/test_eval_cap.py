"""The evaluation cap (COCOeval's maxDets, separate from the NMS max_det) and per-class AP, against
pycocotools' own summarize on the same detections."""

from __future__ import annotations

import contextlib
import functools
import io
import json

import numpy as np
import pytest
from conftest import SUBSET_ANNOTATIONS, requires_coco

from harness.eval.coco_eval import STAT_NAMES, evaluate_bbox, evaluate_bbox_file_per_class, max_dets_for


def _noisy_detections(coco, per_image: int = 200, seed: int = 0) -> list[dict]:
    """Every ground-truth box jittered (the true class, low scores), plus random boxes of the image's own classes
    scoring higher: pycocotools caps detections per image and category, and there true positives rank past 100,
    so a cap of 100 and one of 500 give different figures."""
    rng = np.random.default_rng(seed)
    categories = coco.getCatIds()
    out = []
    for image_id in sorted(coco.imgs):
        info = coco.imgs[image_id]
        for ann in coco.imgToAnns[image_id]:
            x, y, w, h = ann["bbox"]
            for _ in range(3):
                out.append({"image_id": image_id, "category_id": ann["category_id"],
                            "score": float(rng.uniform(0.0, 0.6)),
                            "bbox": [x + rng.normal(0, 2), y + rng.normal(0, 2), w * rng.uniform(0.9, 1.1),
                                     h * rng.uniform(0.9, 1.1)]})
        present = sorted({a["category_id"] for a in coco.imgToAnns[image_id]}) or categories
        for _ in range(per_image):
            w, h = rng.uniform(5, info["width"] / 2), rng.uniform(5, info["height"] / 2)
            out.append({"image_id": image_id, "category_id": int(rng.choice(present)),
                        "score": float(rng.uniform(0.3, 1.0)),
                        "bbox": [rng.uniform(0, info["width"] - w), rng.uniform(0, info["height"] - h), w, h]})
    return out


@pytest.fixture(scope="module")
def sample():
    if not SUBSET_ANNOTATIONS.is_file():
        pytest.skip("COCO sample missing")
    from pycocotools.coco import COCO

    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO(str(SUBSET_ANNOTATIONS))
    ids = sorted(coco.imgs)[:60]
    dets = [d for d in _noisy_detections(coco) if d["image_id"] in set(ids)]
    return coco, ids, dets


def _pycocotools(coco, dets, ids, max_dets):
    from pycocotools.cocoeval import COCOeval

    with contextlib.redirect_stdout(io.StringIO()):
        ev = COCOeval(coco, coco.loadRes(json.loads(json.dumps(dets))), "bbox")
        ev.params.imgIds, ev.params.maxDets = ids, max_dets
        ev.evaluate(), ev.accumulate(), ev.summarize()
    return ev


@pytest.fixture(scope="module")
def pycocotools_of_sample(sample):
    """pycocotools' own COCOeval of the sample's detections at the maxDets given (a tuple), each evaluated once for
    the module's tests (~2-4 s each: pure Python); callers only read it."""
    coco, ids, dets = sample
    return functools.cache(lambda max_dets: _pycocotools(coco, dets, ids, list(max_dets)))


@requires_coco
def test_cap_100_is_pycocotools_summarize(sample, pycocotools_of_sample):
    coco, ids, dets = sample
    ours = evaluate_bbox(coco, dets, ids)
    theirs = pycocotools_of_sample((1, 10, 100)).stats
    assert list(ours) == list(STAT_NAMES)
    assert [ours[k] for k in STAT_NAMES] == pytest.approx(list(theirs), abs=1e-12)


@requires_coco
@pytest.mark.parametrize("evaluator", ["pycocotools", "faster-coco-eval"])
def test_cap_500_reads_ap_at_the_cap(sample, pycocotools_of_sample, evaluator, tmp_path):
    """pycocotools' summarize reads mAP_50..mAP_large and the area ARs at maxDets[2]: with maxDets [1, 10, 500]
    that is the cap, an independent value for ours at [1, 10, 100, 500] (its mAP_50_95 is read at a literal 100,
    so that one is the mean of pycocotools' own precision array at the cap); AR1/AR10/AR100 at their own caps
    (pycocotools with [1, 10, 100])."""
    coco, ids, dets = sample
    path = tmp_path / "dets.json"
    path.write_text(json.dumps(dets))
    ours, per_class = evaluate_bbox_file_per_class(coco, path, ids, evaluator, cap=500)
    at_cap = pycocotools_of_sample((1, 10, 500)).stats
    at_100 = pycocotools_of_sample((1, 10, 100)).stats
    assert max_dets_for(500) == [1, 10, 100, 500]
    for i, key in enumerate(("mAP_50", "mAP_75", "mAP_small", "mAP_medium", "mAP_large"), start=1):
        assert ours[key] == pytest.approx(at_cap[i], abs=1e-12), key
    ref = pycocotools_of_sample((1, 10, 100, 500))
    everything = ref.eval["precision"][:, :, :, 0, 3]
    assert ours["mAP_50_95"] == pytest.approx(float(np.mean(everything[everything > -1])), abs=1e-12)
    assert [ours["AR_small"], ours["AR_medium"], ours["AR_large"]] == pytest.approx(list(at_cap[9:12]), abs=1e-12)
    assert ours["AR_max_det"] == pytest.approx(at_cap[8], abs=1e-12)
    assert [ours["AR1"], ours["AR10"], ours["AR100"]] == pytest.approx(list(at_100[6:9]), abs=1e-12)
    assert ours["AR_max_det"] > ours["AR100"] and ours["mAP_50_95"] != pytest.approx(at_100[0], abs=1e-6)
    # per-class AP: pycocotools' own precision array, category by category
    k = ref.params.catIds.index(1)  # person
    p = ref.eval["precision"][:, :, k, 0, 3]
    assert per_class[1]["AP"] == pytest.approx(float(np.mean(p[p > -1])), abs=1e-12)
    with_gt = {a["category_id"] for i in ids for a in coco.imgToAnns[i]}
    assert {c for c, v in per_class.items() if v["AP"] >= 0} == with_gt


@requires_coco
@pytest.mark.parametrize("evaluator", ["pycocotools", "faster-coco-eval"])
def test_the_evaluator_named_is_the_one_that_runs(sample, evaluator, tmp_path, monkeypatch):
    """A submission records its evaluator by name: the figures must come from that library (faster-coco-eval's
    COCOeval_faster, or pycocotools' COCOeval), whichever path the detections take (a list or a results file)."""
    import faster_coco_eval
    import pycocotools.cocoeval

    calls = []
    for module, name in ((faster_coco_eval, "COCOeval_faster"), (pycocotools.cocoeval, "COCOeval")):
        cls = getattr(module, name)
        original = cls.accumulate

        def accumulate(self, *args, _original=original, _library=module.__name__.split(".")[0], **kwargs):
            calls.append(_library)
            return _original(self, *args, **kwargs)
        monkeypatch.setattr(cls, "accumulate", accumulate)
    coco, ids, dets = sample
    path = tmp_path / "dets.json"
    path.write_text(json.dumps(dets))
    evaluate_bbox(coco, dets, ids, evaluator)
    evaluate_bbox_file_per_class(coco, path, ids, evaluator)
    library = {"pycocotools": "pycocotools", "faster-coco-eval": "faster_coco_eval"}[evaluator]
    assert calls and set(calls) == {library}, calls


@requires_coco
def test_no_detections_is_zero_only_where_there_is_something_to_find(sample):
    coco, ids, _ = sample
    assert set(evaluate_bbox(coco, [], ids).values()) == {0.0}
    empty = [i for i in sorted(coco.imgs) if not coco.imgToAnns.get(i)]
    if empty:  # an image without ground truth: nothing to find, every statistic undefined (-1, as COCOeval)
        assert set(evaluate_bbox(coco, [], empty[:1]).values()) == {-1.0}


def _coco(images: list[dict], annotations: list[dict], categories: list[dict]):
    from pycocotools.coco import COCO

    coco = COCO()
    coco.dataset = {"images": images, "annotations": annotations, "categories": categories}
    with contextlib.redirect_stdout(io.StringIO()):
        coco.createIndex()
    return coco


@pytest.mark.parametrize("evaluator", ["pycocotools", "faster-coco-eval"])
def test_no_detections_are_scored_as_cocoeval_scores_an_empty_result_set(tmp_path, evaluator):
    """A cell that detected nothing: 0 where there was something to find, undefined (-1) where the images hold no
    ground truth of that size (only large boxes here), as pycocotools' COCOeval says of an empty result set."""
    from pycocotools.cocoeval import COCOeval

    images = [{"id": i, "width": 320, "height": 240, "file_name": f"{i}.jpg"} for i in (1, 2, 3)]
    annotations = [{"id": 1, "image_id": 1, "category_id": 1, "bbox": [10, 10, 200, 150], "area": 30000,
                    "iscrowd": 0},
                   {"id": 2, "image_id": 2, "category_id": 2, "bbox": [5, 5, 250, 200], "area": 50000,
                    "iscrowd": 0}]
    categories = [{"id": 1, "name": "gadget"}, {"id": 2, "name": "widget"}, {"id": 7, "name": "unused"}]
    gt = _coco(images, annotations, categories)
    empty = _coco(images, [], categories)  # loadRes refuses an empty list: the empty result set built directly
    with contextlib.redirect_stdout(io.StringIO()):
        reference = COCOeval(gt, empty, "bbox")
        reference.evaluate()
        reference.accumulate()
        reference.summarize()
    path = tmp_path / "none.json"
    path.write_text("[]")
    stats, per_class = evaluate_bbox_file_per_class(gt, path, [1, 2, 3], evaluator)
    assert [stats[name] for name in STAT_NAMES] == pytest.approx(list(reference.stats), abs=0)
    assert stats["mAP_small"] == -1 and stats["mAP_50_95"] == 0
    assert per_class[1]["AP"] == 0 and per_class[2]["AP"] == 0 and per_class[7]["AP"] == -1
    assert evaluate_bbox(gt, [], [1, 2, 3], evaluator) == {name: stats[name] for name in STAT_NAMES}


@pytest.mark.parametrize("evaluator", ["pycocotools", "faster-coco-eval"])
def test_many_classes_grouped_on_their_own_images_score_as_one_cocoeval(tmp_path, evaluator):
    """A dataset of many classes evaluated a group of categories at a time, each group on the images holding its
    categories (ground truth or detections), scores exactly as one pycocotools COCOeval over every image and class:
    crowd boxes, classes with ground truth and no detection, detections of a class with no ground truth, a class with
    neither, and images outside the evaluated ones included."""
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    from harness.eval.coco_eval import STAT_NAMES, _category_groups, per_class_ap, read_results

    rng = np.random.default_rng(7)
    n_images, n_classes = 120, 40
    images = [{"id": i, "file_name": f"{i}.jpg", "width": 640, "height": 480} for i in range(1, n_images + 1)]
    annotations, results = [], []
    for image in range(1, n_images + 1):
        for _ in range(int(rng.integers(0, 5))):
            xy, wh = rng.uniform(0, 400, 2), rng.uniform(4, 200, 2)
            category = int(rng.integers(1, n_classes - 4))  # the last classes: no ground truth
            annotations.append({"id": len(annotations) + 1, "image_id": image, "category_id": category,
                                "bbox": [*xy.tolist(), *wh.tolist()], "area": float(wh.prod()),
                                "iscrowd": int(rng.random() < 0.05)})
            if rng.random() < 0.8:  # found, a little off
                results.append({"image_id": image, "category_id": category, "score": float(rng.uniform(0.3, 1)),
                                "bbox": (np.r_[xy, wh] + rng.normal(0, 3, 4)).tolist()})
        for _ in range(int(rng.integers(0, 4))):  # false positives, some of a class with no ground truth
            category = int(rng.integers(1, n_classes)) if rng.random() < 0.7 else n_classes - 2
            results.append({"image_id": image, "category_id": category, "score": float(rng.uniform(0.01, 0.6)),
                            "bbox": [*rng.uniform(0, 400, 2).tolist(), *rng.uniform(4, 200, 2).tolist()]})
    gt = COCO()
    gt.dataset = {"images": images, "annotations": annotations,
                  "categories": [{"id": c, "name": f"c{c}"} for c in range(1, n_classes + 1)]}  # n_classes: none
    with contextlib.redirect_stdout(io.StringIO()):
        gt.createIndex()
    path = tmp_path / "dets.json"
    path.write_text(json.dumps(results))
    evaluated = list(range(1, n_images + 1, 2)) + [2, 4]  # images outside these hold ground truth and detections

    with contextlib.redirect_stdout(io.StringIO()):
        whole = COCOeval(gt, gt.loadRes(str(path)), "bbox")
        whole.params.imgIds = sorted(evaluated)
        whole.evaluate()
        whole.accumulate()
        whole.summarize()
    groups = _category_groups(sorted(gt.getCatIds()), read_results(path), gt, sorted(evaluated), 200)
    assert len(groups) > 5 and max(len(images) for _, images in groups) < len(evaluated)  # grouped, on fewer images
    stats, per_class = evaluate_bbox_file_per_class(gt, path, evaluated, evaluator, pairs_per_chunk=200)
    assert [stats[k] for k in STAT_NAMES] == pytest.approx(list(whole.stats), abs=1e-12)
    reference = per_class_ap(whole)
    assert per_class.keys() == reference.keys()
    for category, aps in reference.items():
        assert per_class[category] == pytest.approx(aps, abs=1e-12), category


@requires_coco
def test_a_results_file_read_per_image_is_its_plain_reading(sample, tmp_path):
    """ResultColumns.per_image (one sort of the columns) gives each image's results as json.loads and a dict per
    result do: same images, boxes (xyxy), scores, category ids, in file order within an image."""
    from coco_results import detections_from_coco

    from harness.eval.coco_eval import read_results

    rng = np.random.default_rng(1)
    ids = sample[1][:40]
    results = [{"image_id": int(rng.choice(ids)), "category_id": int(rng.integers(1, 91)),
                "bbox": [round(float(v), 2) for v in rng.uniform(1, 300, 4)], "score": round(float(rng.random()), 5)}
               for _ in range(500)]
    path = tmp_path / "r.json"
    path.write_text(json.dumps(results))
    plain = {d.image_id: d for d in detections_from_coco(json.loads(path.read_text()))}
    mine = {d.image_id: d for d in read_results(path).per_image()}
    assert mine.keys() == plain.keys()
    for image_id, d in plain.items():
        assert np.array_equal(mine[image_id].boxes, d.boxes) and np.array_equal(mine[image_id].scores, d.scores)
        assert np.array_equal(mine[image_id].labels, d.labels) and mine[image_id].masks is None
    (tmp_path / "none.json").write_text("[]")  # a model that found nothing: no image, and no error
    assert read_results(tmp_path / "none.json").per_image() == []
    for encoding, bom in (("utf-8", "\ufeff"), ("utf-16", ""), ("utf-32-le", "")):  # what json.loads reads, read
        path.write_bytes((bom + json.dumps(results[:5])).encode(encoding))
        assert read_results(path).score.tolist() == [r["score"] for r in results[:5]], encoding
