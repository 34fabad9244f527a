"""The real pipeline end to end: YOLOX-Nano on the 206 genuine COCO images, both backends."""

import csv
import json

import numpy as np
import pytest
from coco_results import detections_from_coco
from conftest import CORPUS, YOLOX_NANO, requires_corpus
from reference_yolox import coco_detections

from harness.data.categories import COCO80_TO_91
from harness.eval.coco_eval import evaluate_bbox
from harness.eval.matching import match_detections
from harness.results.site_rules import schema_findings, site_findings


def _by_batch(records):
    return {r.cell.batch_size: r for r in records}


def test_map_equals_independent_batch1_reference(ort_run):
    plan, records = ort_run
    ids = list(plan.variant.image_ids)
    reference = coco_detections(YOLOX_NANO, [(r.image_id, r.path) for r in plan.records], COCO80_TO_91)
    ref_stats = evaluate_bbox(plan.dataset.coco, reference, ids)
    ours = _by_batch(records)[1].accuracy.stats
    assert ref_stats["mAP_50_95"] > 0.25  # a real detector on real images
    assert abs(ours["mAP_50_95"] - ref_stats["mAP_50_95"]) <= 0.003
    assert abs(ours["mAP_50"] - ref_stats["mAP_50"]) <= 0.003


def test_accuracy_is_pycocotools_on_the_written_detections(ort_run):
    plan, records = ort_run
    acc = _by_batch(records)[1].accuracy
    detections = json.loads((plan.run_dir / acc.detections_file).read_text())
    assert len(detections) == acc.num_detections
    ids = list(plan.variant.image_ids)
    assert evaluate_bbox(plan.dataset.coco, detections, ids, plan.config.evaluator) == acc.stats
    # and pycocotools', the reference, to the last bits of a float mean
    assert evaluate_bbox(plan.dataset.coco, detections, ids) == pytest.approx(acc.stats, abs=1e-12)


def test_a_cell_with_an_earlier_cells_detections_takes_its_evaluation(ort_run):
    """Identical detections files score the same: the later cell says whose evaluation it took, and its statistics
    are still pycocotools' on its own file."""
    import hashlib

    plan, records = ort_run
    ids, seen = list(plan.variant.image_ids), {}
    for record in sorted(records, key=lambda r: r.cell.batch_size):
        acc = record.accuracy
        raw = (plan.run_dir / acc.detections_file).read_bytes()
        assert acc.detections_sha256 == hashlib.sha256(raw).hexdigest()
        assert acc.same_detections_as == seen.get(acc.detections_sha256)
        seen.setdefault(acc.detections_sha256, record.cell.label)
        if acc.same_detections_as:  # a cell scored anew is checked against pycocotools by the test above
            assert evaluate_bbox(plan.dataset.coco, json.loads(raw), ids) == pytest.approx(acc.stats, abs=1e-12)
    assert len(seen) < len(records)  # ONNX Runtime on the CPU: batch 8 gives batch 1's detections, byte for byte
    # the same detections are one file under two names (a hard link here), not a second copy
    files = [plan.run_dir / r.accuracy.detections_file for r in records]
    assert len({f.stat().st_ino for f in files}) == len(seen)
    assert all(f.stat().st_nlink >= 2 for r, f in zip(records, files, strict=True) if r.accuracy.same_detections_as)


def test_faster_coco_eval_is_bit_identical_to_pycocotools(ort_run):
    plan, records = ort_run
    detections = json.loads((plan.run_dir / _by_batch(records)[1].accuracy.detections_file).read_text())
    ids = list(plan.variant.image_ids)
    assert (evaluate_bbox(plan.dataset.coco, detections, ids, "faster-coco-eval")
            == pytest.approx(evaluate_bbox(plan.dataset.coco, detections, ids, "pycocotools"), abs=1e-12))


def test_backends_agree_on_map(ort_run, torch_run):
    ort_ap = ort_run[1][0].accuracy.stats["mAP_50_95"]
    torch_ap = torch_run[1][0].accuracy.stats["mAP_50_95"]
    assert abs(ort_ap - torch_ap) <= 0.001


def test_batch8_detections_match_batch1(ort_run):
    """Each cell is scored on its own detections; batch 8 is checked against batch 1 (the reference)."""
    by_batch = _by_batch(ort_run[1])
    assert by_batch[1].invariance.report is None and by_batch[1].invariance.reference_batch_size == 1
    inv = by_batch[8].invariance.report
    assert inv.images == 206 and inv.match_rate >= 0.99, inv.to_dict()
    # independent of our matcher: pycocotools scores both cells' own detections equally
    b1, b8 = by_batch[1].accuracy.stats, by_batch[8].accuracy.stats
    assert abs(b1["mAP_50_95"] - b8["mAP_50_95"]) <= 0.0005
    assert by_batch[8].accuracy.batch_size == 8 and by_batch[8].accuracy.num_images == 206


def test_a_cell_scores_every_image_once(ort_run):
    """The scored pass covers the whole variant (full batches + the short last batch), warm-up excluded."""
    plan, records = ort_run
    for r in records:
        detections = json.loads((plan.run_dir / r.accuracy.detections_file).read_text())
        assert {d["image_id"] for d in detections} <= set(plan.variant.image_ids)
        assert r.accuracy.num_images == len(plan.variant.image_ids)
        assert len(detections) == r.accuracy.num_detections


def test_short_last_batch_is_recorded_not_mixed(ort_run):
    b8 = _by_batch(ort_run[1])[8].timing
    assert b8.short_batch["size"] == 206 % 8
    assert b8.batch_ms.count == b8.timed_batches == 206 // 8
    assert b8.timed_images == 8 * (206 // 8)


def test_stage_times_add_up_to_the_batch_total(ort_run, torch_run):
    for _, records in (ort_run, torch_run):
        for r in records:
            t = r.timing
            stages = sum(t.stages_ms[s].mean for s in ("preprocess", "transfer", "forward", "postprocess"))
            assert stages == pytest.approx(t.batch_ms.mean, rel=0.05)
            assert t.stages_ms["preprocess.decode"].mean <= t.stages_ms["preprocess"].mean
            assert t.stages_ms["postprocess.nms"].mean <= t.stages_ms["postprocess"].mean


def test_run_artifacts(ort_run):
    plan, records = ort_run
    run = json.loads((plan.run_dir / "run.json").read_text())
    assert [c["status"] for c in run["cells"]] == ["ok", "ok"]
    rows = list(csv.DictReader((plan.run_dir / "steps_timer.csv").read_text().splitlines()))
    assert {"total", "preprocess", "preprocess.decode", "forward", "postprocess", "postprocess.nms"} <= {
        r["stage"] for r in rows}
    assert list(rows[0]) == ["model", "backend", "precision", "input_size", "batch_size", "stage", "total", "count",
                             "avg", "std", "min", "max", "total_pct"]
    assert len(list((plan.run_dir / "images").glob("*.jpg"))) == 1
    assert len(list((plan.run_dir / "submissions").glob("*.json"))) == 2
    assert not list(plan.run_dir.rglob("*.tmp"))


def test_submission_latency_figures_are_numpys_of_its_batch_samples(ort_run):
    """Each submission's total_ms (per image) is numpy's of timing.batch_samples_ms / batch size, and its fps the
    site's 1000 / that mean (fps_p50: / its median); within the files' rounding (4 and 3 decimals)."""
    plan, _ = ort_run
    for path in sorted((plan.run_dir / "submissions").glob("*.json")):
        doc = json.loads(path.read_text())
        timing = doc["timing"]
        per_image = np.asarray(timing["batch_samples_ms"]) / timing["batch_size"]
        assert timing["mode"] == "latency" and len(per_image) == timing["timed_batches"] >= 10
        total = timing["total_ms"]
        assert total["mean"] == pytest.approx(per_image.mean(), abs=2e-4), path.name
        assert total["std"] == pytest.approx(per_image.std(ddof=1), abs=2e-4), path.name
        for q in (50, 95, 99):
            assert total[f"p{q}"] == pytest.approx(np.percentile(per_image, q), abs=2e-4), (path.name, q)
        assert doc["throughput"]["fps_mean"] == pytest.approx(1000 / per_image.mean(), abs=2e-3), path.name
        assert doc["throughput"]["fps_p50"] == pytest.approx(1000 / np.median(per_image), abs=2e-3), path.name
        # the tail's upper bounds: the order statistic scipy's binomial quantile names, null where too few batches
        from scipy.stats import binom

        for q in (90, 95, 99):
            tail = timing["tail"][f"p{q}"]
            k = int(binom.ppf(0.95, len(per_image), q / 100))
            assert tail["samples"] == len(per_image)
            assert tail["value"] == pytest.approx(np.percentile(per_image, q), abs=2e-4), (path.name, q)
            if 1 - (q / 100) ** len(per_image) < 0.95:
                assert tail["upper95"] is None and tail["samples_needed"] > len(per_image)
            else:
                assert tail["upper95"] == pytest.approx(np.sort(per_image)[k], abs=2e-4), (path.name, q)


def test_steps_timer_csv_is_seconds_and_percent_of_the_batch_time(ort_run):
    """steps_timer.csv, per cell: the total row is the batch samples' sum, mean, min and max in seconds and 100 %
    of the time; each stage row its summed time in seconds and that as a percentage of the batches' sum."""
    plan, records = ort_run
    rows = list(csv.DictReader((plan.run_dir / "steps_timer.csv").read_text().splitlines()))
    for record in records:
        samples = np.asarray(record.timing.batch_samples_ms)
        mine = {r["stage"]: r for r in rows if int(r["batch_size"]) == record.cell.batch_size}
        total = mine["total"]
        assert int(total["count"]) == len(samples)
        assert float(total["total"]) == pytest.approx(samples.sum() / 1e3, abs=2e-5)
        assert float(total["avg"]) == pytest.approx(samples.mean() / 1e3, abs=2e-6)
        assert (float(total["min"]), float(total["max"])) == pytest.approx((samples.min() / 1e3, samples.max() / 1e3),
                                                                           abs=2e-6)
        assert float(total["total_pct"]) == 100.0
        assert {"preprocess", "forward", "postprocess"} <= set(mine)
        for stage, summary in record.timing.stages_ms.items():
            stage_ms = summary.mean * summary.count
            assert float(mine[stage]["total"]) == pytest.approx(stage_ms / 1e3, abs=2e-6), stage
            assert float(mine[stage]["total_pct"]) == pytest.approx(100 * stage_ms / samples.sum(), abs=2e-3), stage


@requires_corpus
def test_submissions_pass_the_site_schema_and_rules(ort_run, torch_run):
    schema = json.loads((CORPUS / "schemas" / "submission.v1.json").read_text())
    support = json.loads((CORPUS / "support-matrix.json").read_text())
    seen = set()
    for plan, _ in (ort_run, torch_run):
        for path in (plan.run_dir / "submissions").glob("*.json"):
            doc = json.loads(path.read_text())
            assert schema_findings(doc, schema) == []
            assert site_findings(doc, support) == [], path.name
            assert doc["submission_id"] not in seen
            seen.add(doc["submission_id"])
            assert doc["dataset"]["variant"] == "sample" and doc["dataset"]["num_images"] == 206
            assert doc["repro"]["dataset"]["image_id_sha256"] == plan.variant.image_id_sha256
            assert doc["hardware"]["id"] and doc["runtime"]["tf32"]["float32_matmul_precision"]
            assert doc["runtime"]["format"] in ("onnx", "pytorch") and doc["runtime"]["provider"] == "cpu"
            inv = doc["batch_invariance"]
            assert inv is None or inv.get("is_reference") or inv["match_rate"] >= 0.99
            assert doc["memory"]["peak_ram_mb"] != 0
            warmup = doc["timing"]["warmup"]  # --warmup-seconds 0: the minimum, unless it settled by then
            assert warmup["batches"] == 2 and warmup["ended"].startswith(("stable", "cap"))
            # each warm-up batch's time, the cold one first: parts of the warm-up's own wall time
            assert len(warmup["samples_ms"]) == 2 and min(warmup["samples_ms"]) > 0
            assert sum(warmup["samples_ms"]) / 1000 <= warmup["seconds"] + 1e-3


def test_site_rules_catch_a_broken_submission(ort_run):
    plan, _ = ort_run
    doc = json.loads(next((plan.run_dir / "submissions").glob("*.json")).read_text())
    doc["runtime"]["format"] = "onnx"
    doc["runtime"]["provider"] = "hailort"
    doc["timing"]["total_ms"]["p50"] = -1
    del doc["config"]["iou"]
    doc["created_at"] = "yesterday"
    support = {"models": ["yolox-nano"], "runtimes": [{"backend": "onnx", "providers": ["cpu"],
                                                        "precisions": ["fp32"]}]}
    rules = {f.path for f in site_findings(doc, support)}
    assert rules == {"runtime.provider", "timing.total_ms.p50", "config.iou", "created_at"}


def test_cross_backend_detections_match(ort_run, torch_run):
    """PyTorch (onnx2torch) at batch 8 reproduces ONNX Runtime at batch 1, image by image."""
    ort_dets = detections_from_coco(json.loads((ort_run[0].run_dir / ort_run[1][0].accuracy.detections_file)
                                               .read_text()))
    torch_dets = detections_from_coco(json.loads((torch_run[0].run_dir / torch_run[1][0].accuracy.detections_file)
                                                 .read_text()))
    report = match_detections(ort_dets, torch_dets, iou_threshold=0.99, score_tolerance=1e-3)
    assert report.images == 206 and report.match_rate >= 0.99, report.to_dict()


def test_model_stats_match_the_published_yolox_nano_figures(ort_run):
    """YOLOX's model zoo lists YOLOX-Nano at 0.91 M parameters and 1.08 GFLOPs (416x416)."""
    stats = ort_run[1][0].model_stats
    assert stats["params_millions"] == pytest.approx(0.91, rel=0.02)
    assert stats["gflops"] == pytest.approx(1.08, rel=0.05)


def test_throughput_is_consistent_with_the_batch_latencies(ort_run):
    for record in ort_run[1]:
        t = record.timing
        assert t.images_per_s == pytest.approx(t.batch_size * 1000 / t.batch_ms.mean, rel=1e-9)
        assert t.image_ms.mean == pytest.approx(t.batch_ms.mean / t.batch_size, rel=1e-9)
