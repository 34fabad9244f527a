"""The bootstrap interval of mAP over the evaluated images: each resample's mAP against pycocotools on a dataset that
holds each drawn image as many times as it was drawn (built image by image, re-keyed), the evaluation's own figures
when every image is drawn once, and a run's record of the interval."""

from __future__ import annotations

import contextlib
import io
import json

import numpy as np
import pytest
from conftest import SUBSET_ANNOTATIONS, coco_from, requires_coco

from harness.eval.bootstrap import COCO_IOUS, ImageBootstrap
from harness.eval.coco_eval import cell_bootstrap, evaluate_cell_file


@pytest.fixture(scope="module")
def subset() -> dict:
    if not SUBSET_ANNOTATIONS.is_file():
        pytest.skip("COCO sample missing")
    return json.loads(SUBSET_ANNOTATIONS.read_text())


def _detections(coco, image_ids: list[int], seed: int, grid: float | None = None) -> list[dict]:
    """Two jittered copies of most objects and a few boxes of the image's classes; continuous scores (no two
    equal) unless `grid` rounds them."""
    rng = np.random.default_rng(seed)
    out = []
    for image_id in image_ids:
        info = coco.imgs[image_id]
        for ann in coco.imgToAnns[image_id]:
            x, y, w, h = ann["bbox"]
            for _ in range(2):
                if rng.uniform() < 0.7:
                    out.append({"image_id": image_id, "category_id": ann["category_id"],
                                "score": float(rng.uniform(0.1, 1.0)),
                                "bbox": [x + rng.normal(0, 3), y + rng.normal(0, 3), w * rng.uniform(0.8, 1.2),
                                         h * rng.uniform(0.8, 1.2)]})
        present = sorted({a["category_id"] for a in coco.imgToAnns[image_id]}) or [1]
        for _ in range(6):
            w, h = rng.uniform(5, info["width"] / 3), rng.uniform(5, info["height"] / 3)
            out.append({"image_id": image_id, "category_id": int(rng.choice(present)),
                        "score": float(rng.uniform(0.0, 0.9)),
                        "bbox": [rng.uniform(0, info["width"] - w), rng.uniform(0, info["height"] - h), w, h]})
    if grid:
        for d in out:
            d["score"] = round(round(d["score"] / grid) * grid, 6)
    return out


def _pycocotools(coco, detections: list[dict], image_ids: list[int]) -> tuple[float, float]:
    from pycocotools.cocoeval import COCOeval

    with contextlib.redirect_stdout(io.StringIO()):
        ev = COCOeval(coco, coco.loadRes(json.loads(json.dumps(detections))), "bbox")
        ev.params.imgIds = image_ids
        ev.evaluate(), ev.accumulate(), ev.summarize()
    return ev.stats[0], ev.stats[1]


def _repeated(dataset: dict, detections: list[dict], image_ids: list[int], times: np.ndarray):
    """The dataset and detections with image k held times[k] times, each copy under an id of its own (ids ascending
    with k, so COCOeval meets the copies in the bootstrap's order)."""
    images, annotations, results = [], [], []
    by_id = {i["id"]: i for i in dataset["images"]}
    anns = {}
    for a in dataset["annotations"]:
        anns.setdefault(a["image_id"], []).append(a)
    dets = {}
    for d in detections:
        dets.setdefault(d["image_id"], []).append(d)
    for k, image_id in enumerate(image_ids):
        for copy in range(int(times[k])):
            new = 1 + k * 100 + copy
            images.append({**by_id[image_id], "id": new})
            for a in anns.get(image_id, []):
                annotations.append({**a, "id": len(annotations) + 1, "image_id": new})
            results += [{**d, "image_id": new} for d in dets.get(image_id, [])]
    return coco_from({**dataset, "images": images, "annotations": annotations}), results, [i["id"] for i in images]


def _bootstrap(coco, detections, image_ids, tmp_path, evaluator: str = "pycocotools") -> ImageBootstrap:
    """The per-image matches of `detections` as a cell's evaluation keeps them for resampling."""
    path = tmp_path / "dets.json"
    path.write_text(json.dumps(detections))
    return cell_bootstrap(coco, path, image_ids, evaluator, 100)


@requires_coco
@pytest.mark.parametrize("evaluator", ["pycocotools", "faster-coco-eval"])
def test_every_image_once_is_the_evaluations_own_map(subset, tmp_path, evaluator):
    """All images drawn once: pycocotools' mAP 50:95 and mAP 50, crowd regions and tied scores included."""
    coco = coco_from(subset)
    image_ids = sorted(coco.imgs)[:60]
    detections = _detections(coco, image_ids, seed=1, grid=0.05)
    boot = _bootstrap(coco, detections, image_ids, tmp_path, evaluator)
    assert boot.of(np.ones(len(image_ids), dtype=np.int64)) == pytest.approx(_pycocotools(coco, detections, image_ids),
                                                                            abs=1e-12)


@requires_coco
def test_each_resample_is_pycocotools_on_the_images_drawn(subset, tmp_path):
    """Three draws with replacement (images absent, once, several times): each resample's mAP is pycocotools' on a
    dataset holding every drawn image as many times as it was drawn."""
    coco = coco_from(subset)
    image_ids = sorted(coco.imgs)[:40]
    detections = _detections(coco, image_ids, seed=2)
    boot = _bootstrap(coco, detections, image_ids, tmp_path)
    rng = np.random.default_rng(7)
    for _ in range(3):
        times = np.bincount(rng.integers(0, len(image_ids), len(image_ids)), minlength=len(image_ids))
        assert times.max() > 1 and (times == 0).any()
        repeated, results, ids = _repeated(subset, detections, image_ids, times)
        assert boot.of(times) == pytest.approx(_pycocotools(repeated, results, ids), abs=1e-12)


@requires_coco
def test_a_cells_interval_is_recorded_and_reproducible(subset, tmp_path):
    """evaluate_cell_file(resamples=N): the interval holds the cell's mAP, is the same on a second scoring (seeded)
    and under either evaluator, and says what it is."""
    coco = coco_from(subset)
    image_ids = sorted(coco.imgs)[:50]
    path = tmp_path / "dets.json"
    path.write_text(json.dumps(_detections(coco, image_ids, seed=3)))
    first = evaluate_cell_file(coco, path, image_ids, "pycocotools", 100, resamples=200)
    again = evaluate_cell_file(coco, path, image_ids, "faster-coco-eval", 100, resamples=200)
    interval = first.primary.map_interval
    assert interval == again.primary.map_interval
    assert interval["resamples"] == 200 and interval["images"] == 50 and "BCa" in interval["method"]
    for key in ("mAP_50_95", "mAP_50"):
        lo, hi = interval[key]
        assert lo < first.stats[key] < hi and hi - lo < 0.2
        assert 0.025 <= interval[f"{key}_draws_above"] <= 0.975
    assert evaluate_cell_file(coco, path, image_ids, "pycocotools", 100).primary.map_interval is None
    assert len(COCO_IOUS) == 10


@requires_coco
def test_a_run_with_map_ci_records_the_interval_the_schema_accepts(tmp_path):
    """`run --map-ci 100` on 12 sample images: each cell's eval.map_ci holds its mAP, validate finds nothing wrong
    with it; fewer than 100 resamples is refused (exit 2, no folder)."""
    from conftest import YOLOX_NANO, run_in_process

    from harness.results.validate import validate_paths

    if not YOLOX_NANO.is_file():
        pytest.skip("yolox_nano.onnx missing")
    out = tmp_path / "runs"
    done = run_in_process("run", "--model", "yolox-nano", "--backend", "onnxruntime", "--subset", "sample",
                          "--limit", "12", "--batch-sizes", "1", "--map-ci", "100", "--no-energy",
                          "--output-dir", str(out), "--run-id", "ci")
    assert done.returncode == 0, done.stderr
    (path,) = (out / "ci" / "submissions").glob("*.json")
    doc = json.loads(path.read_text())
    lo, hi = doc["eval"]["map_ci"]["mAP_50_95"]
    assert lo <= doc["accuracy"]["mAP_50_95"] <= hi and doc["eval"]["map_ci"]["images"] == 12
    # the run's own summary shows it: a line under the table, and the cell's map_ci in --json
    assert f"yolox-nano onnxruntime fp32 416 b1: mAP 95 % CI {lo:.4f}-{hi:.4f} (12 images)" in done.stdout
    again = run_in_process("run", "--model", "yolox-nano", "--backend", "onnxruntime", "--subset", "sample",
                           "--limit", "12", "--batch-sizes", "1", "--map-ci", "100", "--no-energy",
                           "--output-dir", str(out), "--json")
    (cell,) = json.loads(again.stdout)["cells"]
    assert cell["map_ci"] == doc["eval"]["map_ci"]
    (report,) = validate_paths([path], None).reports
    assert not [f for f in report.findings if "map_ci" in f.path or f.rule == "schema"], report.findings
    refused = run_in_process("run", "--subset", "sample", "--limit", "12", "--map-ci", "50",
                             "--output-dir", str(tmp_path / "no"))
    assert refused.returncode == 2 and "at least 100" in refused.stderr and not (tmp_path / "no").exists()


@requires_coco
def test_each_resample_is_pycocotools_when_an_images_scores_tie(subset, tmp_path):
    """Scores on a 0.05 grid (ties within an image's class, as fp16 and int8 outputs give): pycocotools meets a
    drawn-twice image's tied detections copy by copy (d1 d2 d1 d2), not each detection twice (d1 d1 d2 d2), so
    weighting each detection by its image's draws is not enough where scores tie within an image."""
    coco = coco_from(subset)
    image_ids = sorted(coco.imgs)[:40]
    detections = _detections(coco, image_ids, seed=2, grid=0.05)
    boot = _bootstrap(coco, detections, image_ids, tmp_path)
    rng = np.random.default_rng(7)
    for _ in range(3):
        times = np.bincount(rng.integers(0, len(image_ids), len(image_ids)), minlength=len(image_ids))
        repeated, results, ids = _repeated(subset, detections, image_ids, times)
        assert boot.of(times) == pytest.approx(_pycocotools(repeated, results, ids), abs=1e-12)


@requires_coco
def test_the_interval_holds_the_cells_own_map_on_a_dense_cell(subset, tmp_path):
    """206 images, many low-score false positives over every class (as a detector at conf 0.001 writes): the
    resampled mAP is biased upward (classes on one or two images drop out of a draw's mean; duplicated images lift
    the precision envelope), and a plain percentile interval then missed the evaluation's own mAP. Where the bias is
    that large no interval is given, and the record says why; otherwise the (BCa) interval holds the figure."""
    coco = coco_from(subset)
    image_ids = sorted(coco.imgs)
    rng = np.random.default_rng(0)
    categories = sorted(coco.cats)
    detections = []
    for image_id in image_ids:
        info = coco.imgs[image_id]
        for ann in coco.imgToAnns[image_id]:
            x, y, w, h = ann["bbox"]
            for _ in range(8):
                detections.append({"image_id": image_id, "category_id": ann["category_id"],
                                   "score": float(rng.uniform(0.001, 1)),
                                   "bbox": [x + rng.normal(0, 0.1 * w + 1), y + rng.normal(0, 0.1 * h + 1),
                                            w * rng.uniform(0.7, 1.3), h * rng.uniform(0.7, 1.3)]})
        for _ in range(60):
            w, h = rng.uniform(5, info["width"] / 3), rng.uniform(5, info["height"] / 3)
            detections.append({"image_id": image_id, "category_id": int(rng.choice(categories)),
                               "score": float(rng.uniform(0.001, 0.3)),
                               "bbox": [rng.uniform(0, info["width"] - w), rng.uniform(0, info["height"] - h), w, h]})
    path = tmp_path / "dets.json"
    path.write_text(json.dumps(detections))
    cell = evaluate_cell_file(coco, path, image_ids, "faster-coco-eval", 100, resamples=100)
    interval = cell.primary.map_interval
    for key in ("mAP_50_95", "mAP_50"):
        if interval[key] is None:
            assert interval[f"{key}_draws_above"] > 0.975 and f"{key}: " in interval["reason"]
            assert "above the cell's own figure" in interval["reason"]
        else:
            lo, hi = interval[key]
            assert lo <= cell.stats[key] <= hi, (key, cell.stats[key], lo, hi)
    assert interval["mAP_50_95_bias"] > 0


@requires_coco
@pytest.mark.parametrize("grid", [0.1, 1 / 256])
def test_tied_copies_are_met_as_pycocotools_meets_them(subset, tmp_path, grid):
    """Scores on a 0.1 grid (runs of equal scores spanning images) and on a 1/256 grid (few ties: most classes on
    the untied path): an image drawn 3 and 4 times, images drawn 0 times, against pycocotools on the re-keyed
    repeated dataset; with 0.1, weighting each detection by its draws (d1 d1 d2 d2) would not be pycocotools."""
    coco = coco_from(subset)
    image_ids = sorted(coco.imgs)[:24]
    detections = _detections(coco, image_ids, seed=4, grid=grid)
    boot = _bootstrap(coco, detections, image_ids, tmp_path)
    assert any(c.tie_run is None for c in boot.classes) and any(c.tie_run is not None for c in boot.classes)
    times = np.ones(len(image_ids), dtype=np.int64)
    times[:6] = [3, 0, 4, 0, 2, 0]
    repeated, results, ids = _repeated(subset, detections, image_ids, times)
    expected = _pycocotools(repeated, results, ids)
    assert boot.of(times) == pytest.approx(expected, abs=1e-12)
    if grid == 0.1:
        for c in boot.classes:
            c.tie_run = None  # each detection's copies consecutive: not COCOeval's order where an image's scores tie
        assert abs(boot.of(times)[0] - expected[0]) > 1e-6


class _Shaped(ImageBootstrap):
    """An ImageBootstrap whose figure over a multiset of images is given: `shift(times)` from (0.5, 0.6)."""

    def __init__(self, images: int, shift):
        self.images, self.shift = images, shift

    def of(self, times):
        d = self.shift(np.asarray(times))
        return 0.5 + d, 0.6 + d


def _reason_of(interval: dict, key: str) -> str:
    return next(part for part in interval.get("reason", "").split("; ") if part.startswith(f"{key}:"))


@pytest.mark.parametrize("sign", [1, -1])
def test_draws_all_on_one_side_say_so_not_too_few_images(sign):
    """Every draw above (or below) the figure: BCa's bias correction is infinite and its bounds NaN. The record must
    give the one-sided draws as the reason, not 'all equal, or a draw without ground truth: too few images'."""
    weights = np.linspace(1e-3, 2e-3, 40)
    boot = _Shaped(40, lambda t: sign * float(weights @ (t - 1.0) ** 2))
    interval = boot.interval(100)
    for key in ("mAP_50_95", "mAP_50"):
        assert interval[key] is None
        assert interval[f"{key}_draws_above"] == (1.0 if sign > 0 else 0.0)
        assert "too few images" not in _reason_of(interval, key), interval["reason"]
        assert "draws are above" in _reason_of(interval, key)


def test_every_draw_equal_gives_no_interval_and_a_reason():
    """A detector without a true positive: mAP 0 on every draw. Null bounds, no draw above, no bias, a reason."""
    interval = _Shaped(12, lambda t: 0.0).interval(100)
    for key in ("mAP_50_95", "mAP_50"):
        assert interval[key] is None and interval[f"{key}_draws_above"] == 0.0 and interval[f"{key}_bias"] == 0.0
        assert _reason_of(interval, key)


@requires_coco
def test_a_single_scored_image_is_no_error(subset, tmp_path):
    """--limit 1 --map-ci: one image cannot be resampled (scipy's bootstrap refuses a sample of one), but the
    cell is scored: its interval is null with a reason, or the degenerate one holding the figure."""
    coco = coco_from(subset)
    image_ids = sorted(coco.imgs)[:1]
    path = tmp_path / "dets.json"
    path.write_text(json.dumps(_detections(coco, image_ids, seed=3)))
    cell = evaluate_cell_file(coco, path, image_ids, "pycocotools", 100, resamples=100)
    interval = cell.primary.map_interval
    for key in ("mAP_50_95", "mAP_50"):
        if interval[key] is None:
            assert interval.get("reason")
        else:
            assert interval[key][0] <= cell.stats[key] <= interval[key][1]


def test_the_interval_works_with_the_oldest_scipy_allowed(monkeypatch):
    """pyproject allows scipy >= 1.11.2; `bootstrap(rng=...)` exists only from 1.15 (before: random_state). A
    bootstrap taking random_state alone (as 1.11-1.14) gives the same, seeded interval."""
    import re
    from pathlib import Path

    import scipy.stats

    pin = re.search(r'"scipy>=([0-9.]+)"', (Path(__file__).parents[1] / "pyproject.toml").read_text())
    if pin and tuple(int(p) for p in pin.group(1).split(".")[:2]) >= (1, 15):
        pytest.skip("scipy >= 1.15 required: rng= is there")
    weights = np.random.default_rng(0).normal(0, 1e-3, 30)
    boot = _Shaped(30, lambda t: float(weights @ (t - 1.0)))
    real = scipy.stats.bootstrap

    def before_1_15(*args, random_state=None, **kwargs):
        if "rng" in kwargs:
            raise TypeError("bootstrap() got an unexpected keyword argument 'rng'")
        return real(*args, random_state=random_state, **kwargs)

    monkeypatch.setattr(scipy.stats, "bootstrap", before_1_15)
    first = boot.interval(100)
    assert first == boot.interval(100) and first["mAP_50_95"] is not None


def test_the_schema_declares_the_intervals_fields():
    """eval.map_ci as written (bounds or null, the share of draws above, the bias, the reason) is valid, and a
    malformed one is not."""
    import jsonschema

    from harness.results.validate import EXTENDED_SCHEMA

    schema = json.loads(EXTENDED_SCHEMA.read_text())["properties"]["eval"]["properties"]["map_ci"]
    written = {"level": 0.95, "resamples": 100, "seed": 0, "images": 206, "method": "BCa bootstrap",
               "mAP_50_95_draws_above": 0.99, "mAP_50_95_bias": 0.019, "mAP_50_95": None,
               "mAP_50_draws_above": None, "mAP_50_bias": None, "mAP_50": [0.4, 0.5], "reason": "mAP_50_95: ..."}
    jsonschema.validate(written, schema)
    for bad in ({"mAP_50_95_draws_above": "most"}, {"mAP_50_95_draws_above": 1.5}, {"mAP_50_bias": [0.1]},
                {"reason": 5}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({**written, **bad}, schema)


def test_the_report_shows_a_null_interval_as_a_dash():
    from harness.report.sections import _interval

    assert _interval({"mAP_50_95": None, "reason": "mAP_50_95: ..."}).startswith("-")
    assert _interval({"mAP_50_95": [0.25, 0.3], "resamples": 100}) == "0.2500-0.3000 (100 resamples)"
