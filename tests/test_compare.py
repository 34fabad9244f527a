"""`va-bench compare`: pairing, accuracy deltas, the detection diff, the latency verdict and the gates,
checked against the files' own numbers, a brute-force permutation test, the torch matcher of
harness/eval/matching.py, and real ONNX Runtime / PyTorch runs of yolox-nano."""

import itertools
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import REPO, SUBSET_ANNOTATIONS, YOLOX_NANO, run_benchmark, run_in_process
from rich.console import Console

from harness.errors import UsageError
from harness.eval.coco_eval import STAT_NAMES
from harness.eval.detection_diff import DetectionFileError, diff_detections, parse_coco_detections
from harness.measure.stats import autocorrelated, block_means
from harness.results.compare import compare_paths, compare_sides, latency_significance, load_side
from harness.results.compare_gates import check_gate, parse_gate
from harness.views.compare_view import render_comparison

SHA = "0" * 64


def va_bench(*args):
    return run_in_process(*args)


def write_submission(run_dir: Path, samples_ms, batch: int = 1, backend: str = "onnx", accuracy: dict | None = None,
                     detections: str | None = None, variant: str = "subset16", name: str | None = None) -> Path:
    """A minimal va.submission.v1 whose figures are computed from its own per-batch samples."""
    per_image = np.asarray(samples_ms, dtype=float) / batch
    doc = {"schema_version": "va.submission.v1", "submission_id": f"{backend}-b{batch}",
           "created_at": "2026-11-22T00:00:00Z",
           "model": {"id": "toy", "family": "toy", "variant": "t", "input_size": 416},
           "config": {"batch_size": batch, "input_size": 416},
           "hardware": {"id": "box", "gpu": "none", "cpu": "cpu", "ram_gb": 1},
           "runtime": {"format": backend, "provider": "cpu", "precision": "fp32", "device": "cpu"},
           "dataset": {"id": "coco2017", "num_images": 16, "variant": variant, "image_id_sha256": SHA},
           "accuracy": accuracy or {"status": "unavailable", "reason": "accuracy pass skipped (--no-accuracy)"},
           "timing": {"batch_size": batch, "mode": "latency", "batch_samples_ms": list(map(float, samples_ms)),
                      "total_ms": {"p50": float(np.percentile(per_image, 50)),
                                   "p95": float(np.percentile(per_image, 95))}},
           "throughput": {"images_per_s": 1000.0 / float(per_image.mean())},
           "artifacts": {"detections": detections} if detections else {}}
    path = run_dir / "submissions" / (name or f"toy__{backend}__b{batch}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(doc))
    return path


def lognormal(seed: int, median_ms: float, n: int = 30, sigma: float = 0.05) -> np.ndarray:
    return np.random.default_rng(seed).lognormal(math.log(median_ms), sigma, n)


# ------------------------------------------------------------------------------ significance --
def test_a_20_percent_shift_is_significant_and_one_distribution_is_not():
    shifted = [latency_significance(lognormal(s, 50), lognormal(1000 + s, 60)) for s in range(20)]
    assert all(v.verdict == "slower" for v in shifted)
    assert all(v.ci95[0] < 1.2 < v.ci95[1] or abs(v.ratio - 1.2) < 0.05 for v in shifted)
    same = [latency_significance(lognormal(s, 50), lognormal(1000 + s, 50)) for s in range(20)]
    false_alarms = sum(v.verdict != "no significant change" for v in same)
    assert false_alarms <= 3  # alpha = 0.05: about one in 20 expected
    faster = latency_significance(lognormal(1, 60), lognormal(2, 50))
    assert faster.verdict == "faster" and faster.ratio < 1


def ar1_latencies(rng: np.random.Generator, n: int, phi: float, median_ms: float = 10.0) -> np.ndarray:
    """Batch times whose log follows an AR(1) process (5 % spread): each batch drifts with the one before, as on a
    shared host whose load comes and goes."""
    noise = rng.normal(0, 0.05 * math.sqrt(1 - phi**2), n)
    x = np.empty(n)
    x[0] = rng.normal(0, 0.05)
    for i in range(1, n):
        x[i] = phi * x[i - 1] + noise[i]
    return median_ms * np.exp(x)


def test_drifting_batch_times_are_not_called_a_change_more_often_than_alpha_says():
    """A/A by simulation: both sides drawn from one autocorrelated process, so every 'slower'/'faster' is a false
    alarm. Tested as independent draws they are called a change far more often than alpha (0.05); the verdict on
    block means keeps to it, and still finds a real 5 % change in independent batches as often as before."""
    from harness.results.compare import batch_significance

    rng = np.random.default_rng(7)
    trials = [(ar1_latencies(rng, 50, 0.5), ar1_latencies(rng, 50, 0.5)) for _ in range(200)]
    as_independent = np.mean([latency_significance(a, b).verdict != "no significant change" for a, b in trials])
    aware = [batch_significance(a, b) for a, b in trials]
    assert as_independent > 0.12  # the problem is real: about three times alpha
    assert np.mean([s.verdict != "no significant change" for s in aware]) <= 0.08
    assert sum(s.basis == "batch means" for s in aware) > 150
    independent = [(lognormal(s, 50, n=50), lognormal(500 + s, 52.5, n=50)) for s in range(100)]
    found = [batch_significance(a, b).verdict == "slower" for a, b in independent]
    # a few independent series cross the autocorrelation bound by chance (5 % by its construction)
    assert abs(np.mean(found) - np.mean([latency_significance(a, b).verdict == "slower" for a, b in independent])) \
        <= 0.05
    assert np.mean(found) > 0.8
    assert not autocorrelated(lognormal(3, 50, n=50))
    ramp = np.linspace(12, 10, 9)  # 9 batches getting faster: lag-1 autocorrelation 0.67 (of their ranks too)
    short = batch_significance(ramp, 2 * ramp)
    assert short.verdict == "too few samples" and "block means" in short.reason
    assert "--min-timed-batches 16" in short.reason  # 4 vs 4 blocks is the fewest that can reach p < 0.05
    assert 2 / math.comb(8, 4) < 0.05 <= 2 / math.comb(6, 3)
    # sides of different lengths are cut into blocks of one length: medians of 8-batch and of 20-batch means of
    # skewed times (3 % of batches at 3x) are different quantities, and were called a change a quarter of the time
    def skewed(n):
        x = ar1_latencies(rng, n, 0.5)
        return np.where(rng.random(n) < 0.03, 3 * x, x)
    uneven = [batch_significance(skewed(64), skewed(400)) for _ in range(150)]
    assert np.mean([s.verdict != "no significant change" for s in uneven]) <= 0.1


def test_a_shift_the_medians_cannot_settle_is_said_not_called_noise_silently():
    """Two modes (9 and 11 ms, half each) shifted by 5 %: the rank test sees it, the medians' ratio (a median in
    the gap between the modes) does not settle; the verdict stays 'no significant change' and says why."""
    rng = np.random.default_rng(2)
    a = np.where(rng.random(200) < 0.5, 9.0, 11.0) * rng.lognormal(0, 0.01, 200)
    b = 1.05 * np.where(rng.random(200) < 0.5, 9.0, 11.0) * rng.lognormal(0, 0.01, 200)
    sig = latency_significance(a, b)
    assert sig.p_value < 0.001 and sig.ci95[0] <= 1.0 <= sig.ci95[1]
    assert sig.verdict == "no significant change" and "unsettled" in sig.reason and "several modes" in sig.reason
    assert latency_significance(lognormal(1, 50), lognormal(2, 50)).reason is None


def test_a_verdicts_reason_names_its_cells():
    from harness.results.compare import CellDelta, Comparison, Significance

    unsettled = Significance("no significant change", 1.0, (0.98, 1.04), 0.001, 200, 200, reason="modes?")
    cells = [CellDelta(label, {}, 1.0, 1.0, None, None, 1.0, 1.0, sig) for label, sig in
             (("b1", unsettled), ("b4", Significance("unavailable", reason="no samples")),
              ("b8", Significance("unavailable", reason="no samples")))]
    console = Console(record=True, width=80)
    console.print(render_comparison(Comparison("A", "B", cells=cells)))
    text = console.export_text()
    assert "verdict b1: modes?" in text and "verdict b4, b8: no samples" in text


def test_verdict_numbers_against_brute_force():
    a = np.array([10.0, 12.0, 11.0, 13.0, 10.5])
    b = np.array([14.0, 15.5, 13.5, 16.0, 15.0])
    sig = latency_significance(a, b)
    assert sig.ratio == statistics.median(b.tolist()) / statistics.median(a.tolist())

    # exact two-sided permutation test of the rank-sum statistic, by enumeration
    pooled = np.concatenate([a, b])
    def u_stat(idx):
        x = pooled[list(idx)]
        y = np.delete(pooled, list(idx))
        return sum((xi > yi) + 0.5 * (xi == yi) for xi in x for yi in y)
    u_obs = u_stat(range(5))
    mean_u = 5 * 5 / 2
    splits = list(itertools.combinations(range(10), 5))
    p = sum(abs(u_stat(s) - mean_u) >= abs(u_obs - mean_u) for s in splits) / len(splits)
    assert sig.p_value == pytest.approx(p)
    assert sig.verdict == "slower"


def test_too_few_samples_cannot_be_significant():
    sig = latency_significance(np.array([10.0, 10.1, 10.2]), np.array([20.0, 20.1, 20.2]))
    assert sig.verdict == "too few samples" and sig.ratio is None


def test_the_ratio_ci_is_scipys_bootstrap_of_median_b_over_median_a():
    """The verdict's CI is scipy's percentile bootstrap of median(B) / median(A), each side resampled on its own."""
    from scipy import stats as scipy_stats

    a, b = lognormal(11, 50, n=40), lognormal(12, 56, n=35)
    sig = latency_significance(a, b)
    expected = scipy_stats.bootstrap(
        (a, b), lambda x, y, axis=-1: np.median(y, axis=axis) / np.median(x, axis=axis), paired=False,
        vectorized=True, method="percentile", n_resamples=2000, confidence_level=0.95,
        random_state=np.random.default_rng(0)).confidence_interval
    assert sig.ci95 == pytest.approx((expected.low, expected.high), rel=1e-12, abs=0)
    assert sig.ratio == statistics.median(b.tolist()) / statistics.median(a.tolist())
    assert sig.ci95[0] < sig.ratio < sig.ci95[1] and sig.ci95[0] > 1 and sig.verdict == "slower"


def test_three_against_four_samples_cannot_reach_alpha_but_four_against_four_can():
    """Fully separated samples: the exact two-sided Mann-Whitney p is 2 / C(n_a + n_b, n_a), 2/35 = 0.057 for 3 vs
    4 (never below 0.05: too few samples) and 2/70 = 0.029 for 4 vs 4 (a verdict)."""
    from scipy import stats as scipy_stats

    a3, a4, b4 = [10.0, 10.2, 10.1], [10.0, 10.2, 10.1, 10.3], [20.0, 20.4, 20.2, 20.3]
    assert scipy_stats.mannwhitneyu(a3, b4, alternative="two-sided", method="exact").pvalue == \
        pytest.approx(2 / math.comb(7, 3))
    few = latency_significance(np.array(a3), np.array(b4))
    assert few.verdict == "too few samples" and few.ratio is None and (few.n_a, few.n_b) == (3, 4)
    enough = latency_significance(np.array(a4), np.array(b4))
    assert enough.p_value == pytest.approx(2 / math.comb(8, 4)) and enough.verdict == "slower"
    assert enough.ratio == pytest.approx(statistics.median(b4) / statistics.median(a4))


# ------------------------------------------------------------------------ synthetic runs ------
def test_synthetic_pair_cells_deltas_and_geomean(tmp_path):
    a_dir, b_dir = tmp_path / "a", tmp_path / "b"
    a1, a4 = lognormal(1, 50), lognormal(2, 160)
    b1, b4 = lognormal(3, 60), lognormal(4, 162)
    write_submission(a_dir, a1, 1)
    write_submission(a_dir, a4, 4)
    write_submission(a_dir, lognormal(5, 300), 8)  # no counterpart in B
    write_submission(b_dir, b1, 1)
    write_submission(b_dir, b4, 4)
    c = compare_paths(a_dir, [b_dir])[0]
    assert c.differ == {} and c.only_a == ["b8"] and c.only_b == []
    cells = {cell.label: cell for cell in c.cells}
    assert set(cells) == {"b1", "b4"}
    assert cells["b1"].significance.verdict == "slower"
    assert cells["b4"].significance.verdict == "no significant change"
    for label, a, b, batch in (("b1", a1, b1, 1), ("b4", a4, b4, 4)):
        pa, pb = np.percentile(a / batch, 50), np.percentile(b / batch, 50)
        assert cells[label].change("p50") == pytest.approx(pb / pa - 1)
        assert cells[label].change("ips") == pytest.approx(np.mean(a) / np.mean(b) - 1)
    ratios = [np.percentile(b1, 50) / np.percentile(a1, 50), np.percentile(b4, 50) / np.percentile(a4, 50)]
    assert c.geomean()["p50"] == pytest.approx(math.exp(sum(map(math.log, ratios)) / 2))
    assert c.geomean_cells()["p50"] == 2
    assert [a.unavailable for a in c.accuracy] == ["A toy__onnx__b1.json: accuracy pass skipped (--no-accuracy); "
                                                   "B toy__onnx__b1.json: accuracy pass skipped (--no-accuracy)"]


def test_the_geometric_mean_says_how_many_cells_it_is_over():
    from harness.results.compare import CellDelta, Comparison, Significance

    def cell(label, p50_a, p50_b, ips_a, ips_b):
        return CellDelta(label, {}, p50_a, p50_b, None, None, ips_a, ips_b, Significance("unavailable"))

    c = Comparison("A", "B", cells=[cell("b1", 1.0, 2.0, 10.0, 5.0), cell("b2", 1.0, 1.0, 0.0, 8.0),
                                   cell("b4", None, 3.0, 10.0, 0.0)])
    assert c.geomean()["p50"] == pytest.approx(math.sqrt(2.0 * 1.0)) and c.geomean_cells()["p50"] == 2
    assert c.geomean()["ips"] == pytest.approx(0.5) and c.geomean_cells()["ips"] == 1  # a rate of 0: no figure
    console = Console(record=True, width=80)
    console.print(render_comparison(c))
    assert "latency p50 ×1.414 over 2 cells, images/s ×0.500 over 1" in console.export_text()


def test_backend_is_the_treatment_when_each_side_has_one(tmp_path):
    write_submission(tmp_path / "a", lognormal(1, 50), 1, backend="onnx")
    write_submission(tmp_path / "b", lognormal(2, 50), 1, backend="pytorch")
    c = compare_paths(tmp_path / "a", [tmp_path / "b"])[0]
    assert c.differ == {"backend": ("onnx/cpu", "pytorch/cpu")}
    assert len(c.cells) == 1 and c.same["model"] == "toy"


def test_batch_size_is_the_treatment_when_each_side_has_one(tmp_path):
    # a run at b1 against a run at b2: the per-image latencies compared, the cell named by the treatment
    write_submission(tmp_path / "a", lognormal(1, 50), 1)
    write_submission(tmp_path / "b", lognormal(2, 80), 2)
    c = compare_paths(tmp_path / "a", [tmp_path / "b"])[0]
    assert c.differ == {"batch_size": (1, 2)} and len(c.cells) == 1
    assert c.cells[0].label == "b1 vs b2"
    result = va_bench("compare", str(tmp_path / "a"), str(tmp_path / "b"), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["comparisons"][0]["differ"] == {"batch_size": [1, 2]}


def test_two_cells_of_one_run_named_from_inside_its_submissions_folder(tmp_path, monkeypatch):
    """`compare x__b1.json x__b2.json` run inside submissions/: the artifacts resolve against the run folder (the
    file's parent is "." there), and the accuracy and detection rows are named by the treatment as the cell is."""
    run = tmp_path / "run"
    (run / "detections").mkdir(parents=True)
    (run / "run.json").write_text("{}")
    box = {"image_id": 1, "category_id": 1, "bbox": [10.0, 10.0, 50.0, 50.0], "score": 0.9}
    accuracy = {"mAP_50_95": 0.5, "mAP_50": 0.7}
    for batch in (1, 2):
        (run / "detections" / f"b{batch}.json").write_text(json.dumps([box]))
        write_submission(run, lognormal(batch, 50 * batch), batch, accuracy=accuracy,
                         detections=f"detections/b{batch}.json")
    monkeypatch.chdir(run / "submissions")
    c = compare_paths("toy__onnx__b1.json", ["toy__onnx__b2.json"])[0]
    assert [d.label for d in c.detections] == ["b1 vs b2"] and c.detections[0].diff is not None, c.detections
    assert [a.label for a in c.accuracy] == ["b1 vs b2"]


def test_an_overlapped_cells_verdict_is_of_its_intervals_not_its_latencies(tmp_path):
    # overlapped: each batch's sample is its end-to-end latency (queueing included), total_ms the interval between
    # completions; the verdict must be of what the p50 shows (here: 14 % faster, although latencies doubled)
    write_submission(tmp_path / "a", lognormal(1, 128), 4)  # latency mode: 32 ms per image
    path = write_submission(tmp_path / "b", lognormal(2, 256), 4)
    doc = json.loads(path.read_text())
    intervals = lognormal(3, 27.5)
    doc["timing"].update(mode="overlapped", interval_samples_ms=list(map(float, intervals)),
                         total_ms={"p50": float(np.median(intervals)), "p95": float(np.percentile(intervals, 95))})
    path.write_text(json.dumps(doc))
    (cell,) = compare_paths(tmp_path / "a", [tmp_path / "b"])[0].cells
    assert cell.p50_b < cell.p50_a and cell.significance.verdict.startswith("faster"), cell
    del doc["timing"]["interval_samples_ms"]  # a file written before the intervals were recorded
    path.write_text(json.dumps(doc))
    (cell,) = compare_paths(tmp_path / "a", [tmp_path / "b"])[0].cells
    assert cell.significance.verdict == "unavailable" and "interval_samples_ms" in cell.significance.reason


@pytest.mark.parametrize("kind", ["latency", "overlapped", "repeats"])
def test_per_image_samples_compare_a_batch_of_four_with_a_batch_of_one(tmp_path, kind):
    """A at batch 1 (50 ms per image) against B at batch 4: the verdict and ratio are of per-image times, by hand:
    latency mode B's batch times / 4 (120 ms per batch: 30 ms per image, faster); overlapped mode B's intervals as
    they are (already per image: 60 ms, slower, although its batch latencies are 256 ms); --repeats each
    process's median batch time / 4 (faster)."""
    a = lognormal(1, 50)
    a_path = write_submission(tmp_path / "a", a, 1)
    b_batches = lognormal(2, 256 if kind == "overlapped" else 120)
    path = write_submission(tmp_path / "b", b_batches, 4)
    per_image = b_batches / 4
    a_per_image, basis = a, "batches"
    if kind == "overlapped":
        doc = json.loads(path.read_text())
        per_image = lognormal(3, 60)
        doc["timing"].update(mode="overlapped", interval_samples_ms=list(map(float, per_image)))
        path.write_text(json.dumps(doc))
    elif kind == "repeats":
        a_medians, b_medians = [50.0, 50.5, 49.5, 51.0, 49.0], [120.0, 121.0, 119.0, 122.0, 118.0]
        for p, medians in ((a_path, a_medians), (path, b_medians)):
            doc = json.loads(p.read_text())
            doc["timing"]["repeats"] = {"batch_ms_p50": medians}
            p.write_text(json.dumps(doc))
        a_per_image, per_image, basis = np.array(a_medians), np.array(b_medians) / 4, "processes"
    (cell,) = compare_paths(tmp_path / "a", [tmp_path / "b"])[0].cells
    sig = cell.significance
    assert sig.basis == basis and (sig.n_a, sig.n_b) == (len(a_per_image), len(per_image))
    assert sig.ratio == pytest.approx(statistics.median(per_image.tolist()) / statistics.median(a_per_image.tolist()),
                                      rel=1e-12)
    assert sig.verdict == ("slower" if kind == "overlapped" else "faster"), sig


def test_missing_samples_make_the_verdict_unavailable(tmp_path):
    path = write_submission(tmp_path / "a", lognormal(1, 50))
    doc = json.loads(path.read_text())
    del doc["timing"]["batch_samples_ms"]
    path.write_text(json.dumps(doc))
    c = compare_paths(path, [path])[0]
    sig = c.cells[0].significance
    assert sig.verdict == "unavailable" and "no timing.batch_samples_ms" in sig.reason
    assert c.cells[0].change("p50") == 0


def test_gates(tmp_path):
    acc_a = dict.fromkeys(STAT_NAMES, 0.30)
    acc_b = {**acc_a, "mAP_50_95": 0.29}
    a = write_submission(tmp_path / "a", lognormal(1, 50), accuracy=acc_a)
    b = write_submission(tmp_path / "b", lognormal(2, 60), accuracy=acc_b)
    noise = write_submission(tmp_path / "n", lognormal(3, 50), accuracy=acc_a)
    c = compare_paths(a, [b])[0]
    from harness.results.compare_gates import check_gate

    status = {spec: check_gate(parse_gate(spec), c).status for spec in
              ("map:-0.005", "map:-0.02", "map:-5%", "ar100:-0.001", "latency:+10%", "latency:+30%",
               "throughput:-10%", "latency_p95:+50%")}
    assert status == {"map:-0.005": "failed", "map:-0.02": "ok", "map:-5%": "ok", "ar100:-0.001": "ok",
                      "latency:+10%": "failed", "latency:+30%": "ok", "throughput:-10%": "failed",
                      "latency_p95:+50%": "ok"}
    same = compare_paths(a, [noise])[0]
    assert same.cells[0].significance.is_noise
    assert check_gate(parse_gate("latency:+0.1%"), same).status == "ok"  # noise never fails a gate
    no_acc = compare_paths(write_submission(tmp_path / "x", lognormal(1, 50)), [a])[0]
    assert check_gate(parse_gate("map:-0.005"), no_acc).status == "unchecked"
    for bad in ("map", "map:0.005", "map:+0", "speed:+10%", "latency:+ten%", "latency:10%"):
        with pytest.raises(UsageError):
            parse_gate(bad)


def test_accuracy_and_per_class_deltas_are_b_minus_a(tmp_path):
    """mAP 0.30 -> 0.29 is a delta of -0.01; each class's is its AP in B's per_class file minus A's, largest |delta|
    first, and a class only one side scored is left out."""
    ap = {"a": {1: 0.50, 2: 0.20, 3: 0.40, 4: 0.10}, "b": {1: 0.45, 2: 0.23, 3: 0.40, 5: 0.70}}
    paths = {}
    for side, m in (("a", 0.30), ("b", 0.29)):
        paths[side] = write_submission(tmp_path / side, lognormal(1, 50), accuracy={**dict.fromkeys(STAT_NAMES, 0.5),
                                                                                   "mAP_50_95": m})
        (tmp_path / side / "per_class").mkdir()
        (tmp_path / side / "per_class" / "toy.json").write_text(json.dumps({"categories": [
            {"id": k, "name": f"class{k}", "AP": v, "AP50": v} for k, v in ap[side].items()]}))
        doc = json.loads(paths[side].read_text())
        doc["eval"] = {"per_class": "per_class/toy.json"}
        paths[side].write_text(json.dumps(doc))
    (acc,) = compare_paths(paths["a"], [paths["b"]])[0].accuracy
    assert acc.unavailable is None and acc.per_class_unavailable is None
    assert acc.delta("mAP_50_95") == pytest.approx(0.29 - 0.30, abs=1e-12) and acc.delta("mAP_50") == 0
    assert acc.to_dict()["metrics"]["mAP_50_95"] == {"a": 0.30, "b": 0.29, "delta": acc.delta("mAP_50_95")}
    assert [(r["id"], r["a"], r["b"]) for r in acc.per_class] == [(1, 0.50, 0.45), (2, 0.20, 0.23), (3, 0.40, 0.40)]
    assert [r["delta"] for r in acc.per_class] == pytest.approx([-0.05, 0.03, 0.0], abs=1e-12)


def test_an_unreadable_per_class_file_is_named_with_its_problem(tmp_path):
    """A per_class file cut short (a full disk, an interrupted copy): the classes are not compared, and the reason
    says what is wrong with the file in words, never the repr of the reader's finding."""
    paths = {}
    for side in ("a", "b"):
        paths[side] = write_submission(tmp_path / side, lognormal(1, 50), accuracy=dict.fromkeys(STAT_NAMES, 0.5))
        (tmp_path / side / "per_class").mkdir()
        (tmp_path / side / "per_class" / "toy.json").write_text('{"categories": [{"id": 1, "AP"')
        doc = json.loads(paths[side].read_text())
        doc["eval"] = {"per_class": "per_class/toy.json"}
        paths[side].write_text(json.dumps(doc))
    (acc,) = compare_paths(paths["a"], [paths["b"]])[0].accuracy
    assert acc.per_class == [] and "per_class file 'per_class/toy.json' is not readable (not valid JSON: " \
        in acc.per_class_unavailable, acc.per_class_unavailable
    assert "Finding(" not in acc.per_class_unavailable and "rule=" not in acc.per_class_unavailable


def test_operating_points_are_compared_beside_the_statistics(tmp_path):
    """eval.operating_point's confidence, precision, recall and F1 are rows of the accuracy table (B − A); a side
    whose point is unavailable shows none for it, and a side without one (a site file) adds no rows."""
    points = {"a": {"confidence": 0.25, "precision": 0.6, "recall": 0.5, "F1": 0.52, "classes": 80},
              "b": {"status": "unavailable", "reason": "no ground-truth object among the evaluated images"}}
    paths = {}
    for side in ("a", "b", "c"):
        paths[side] = write_submission(tmp_path / side, lognormal(1, 50), accuracy=dict.fromkeys(STAT_NAMES, 0.5))
        doc = json.loads(paths[side].read_text())
        if side in points:
            doc["eval"] = {"operating_point": points[side]}
        paths[side].write_text(json.dumps(doc))
    (acc,) = compare_paths(paths["a"], [paths["b"]])[0].accuracy
    assert acc.names[-4:] == ("op_confidence", "op_precision", "op_recall", "op_F1")
    assert acc.a["op_F1"] == 0.52 and "op_F1" not in acc.b and acc.delta("op_F1") is None
    points["b"] = {**points["a"], "F1": 0.55, "recall": 0.56}
    doc = json.loads(paths["b"].read_text())
    doc["eval"] = {"operating_point": points["b"]}
    paths["b"].write_text(json.dumps(doc))
    (acc,) = compare_paths(paths["a"], [paths["b"]])[0].accuracy
    assert acc.delta("op_F1") == pytest.approx(0.03) and acc.delta("op_recall") == pytest.approx(0.06)
    assert acc.to_dict()["metrics"]["op_precision"] == {"a": 0.6, "b": 0.6, "delta": 0.0}
    console = Console(record=True, width=80)
    console.print(render_comparison(compare_paths(paths["a"], [paths["b"]])[0]))
    assert "op_F1" in console.export_text()
    (plain,) = compare_paths(paths["c"], [paths["c"]])[0].accuracy
    assert plain.names == tuple(STAT_NAMES)
    comparison = compare_paths(paths["a"], [paths["b"]])[0]
    assert check_gate(parse_gate("f1:+0.02"), comparison).status == "failed"  # a rise of 0.03 crosses +0.02
    assert check_gate(parse_gate("op_recall:-0.01"), comparison).status == "ok"
    assert check_gate(parse_gate("f1:-0.01"), compare_paths(paths["c"], [paths["c"]])[0]).status == "unchecked"


def test_relative_gates_are_the_change_over_a(tmp_path):
    """latency:+10% is crossed by 50 -> 55.5 ms (+11.0 % of A, though only 9.9 % of B); map:-10% by 0.30 -> 0.20
    (-33.3 % of A)."""
    from harness.results.compare_gates import check_gate

    factors = np.random.default_rng(5).permutation(np.exp(np.linspace(-0.02, 0.02, 31)))  # median exactly 1
    a = write_submission(tmp_path / "a", 50.0 * factors, accuracy=dict.fromkeys(STAT_NAMES, 0.30))
    b = write_submission(tmp_path / "b", 55.5 * factors[::-1], accuracy=dict.fromkeys(STAT_NAMES, 0.20))
    c = compare_paths(a, [b])[0]
    (cell,) = c.cells
    assert (cell.p50_a, cell.p50_b) == (50.0, 55.5) and cell.significance.verdict == "slower"
    latency = check_gate(parse_gate("latency:+10%"), c)
    assert latency.status == "failed" and "+11.0%" in latency.detail, latency.detail
    assert check_gate(parse_gate("latency:+12%"), c).status == "ok"
    accuracy = check_gate(parse_gate("map:-10%"), c)
    assert accuracy.status == "failed" and "-33.3%" in accuracy.detail, accuracy.detail
    assert check_gate(parse_gate("map:-34%"), c).status == "ok"


def test_cli_exit_codes_and_json(tmp_path):
    a = write_submission(tmp_path / "a", lognormal(1, 50))
    b = write_submission(tmp_path / "b", lognormal(2, 60))
    ok = va_bench("compare", str(a), str(a), "--fail-on", "latency:+10%", "--json")
    assert ok.returncode == 0, ok.stderr
    report = json.loads(ok.stdout)
    assert report["failed"] is False
    assert report["comparisons"][0]["performance"]["cells"][0]["significance"]["verdict"] == "no significant change"
    bad = va_bench("compare", str(a), str(b), "--fail-on", "latency:+10%")
    assert bad.returncode == 1 and "FAILED" in bad.stdout
    many = va_bench("compare", "--baseline", str(a), str(a), str(b), "--json")
    assert many.returncode == 0 and len(json.loads(many.stdout)["comparisons"]) == 2
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    for args, expect in ((["compare", str(a)], "two runs"), (["compare", str(a), str(tmp_path / "nope")],
                                                               "no such file or folder"),
                         (["compare", str(a), str(fifo)], "neither a file nor a folder (a FIFO"),
                         (["compare", str(a), str(tmp_path)], "run folder(s) (a, b), not one run"),
                         (["compare", str(a), str(a), "--fail-on", "map"], "want METRIC"),
                         (["compare", str(a), str(a), "--pair-iou", "0"], "--pair-iou")):
        result = va_bench(*args)
        assert result.returncode == 2, (args, result.stderr)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and expect in lines[0] and "Traceback" not in result.stderr


def test_a_folder_inside_that_cannot_be_entered_is_passed_over_and_named(tmp_path, monkeypatch):
    # as root a chmod 000 folder can still be entered: the error its stat gives a user is made here
    outputs = tmp_path / "outputs"
    locked = outputs / "lost+found"
    locked.mkdir(parents=True)
    real_is_dir = Path.is_dir

    def is_dir(self):
        if self.parent == locked:
            raise PermissionError(13, "Permission denied", str(self))
        return real_is_dir(self)

    monkeypatch.setattr(Path, "is_dir", is_dir)
    with pytest.raises(UsageError, match=r"no submissions .* \(1 folder\(s\) inside could not be read: lost\+found\)"):
        load_side(outputs)
    write_submission(outputs / "run", lognormal(1, 50))  # the runs beside it are still named
    with pytest.raises(UsageError, match=r"holds 1 run folder\(s\) \(run\), not one run"):
        load_side(outputs)


def test_not_a_submission_is_a_usage_error(tmp_path):
    junk = tmp_path / "junk.json"
    junk.write_text('{"hello": 1}')
    with pytest.raises(UsageError, match="not a va.submission.v1"):
        load_side(junk)
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError, match="no submissions"):
        load_side(tmp_path / "empty")
    det = tmp_path / "det.json"
    det.write_text("[]")
    with pytest.raises(UsageError, match="detections file with another"):
        compare_sides(load_side(det), load_side(write_submission(tmp_path / "a", lognormal(1, 50))))


def test_another_dataset_under_the_same_variant_name_is_said(tmp_path):
    """Two runs whose variants are both `subset16` but of different datasets (or, same names, other images):
    the dataset differs, and the accuracy deltas are said to mix model and data."""
    a = write_submission(tmp_path / "a", lognormal(1, 50))
    b = write_submission(tmp_path / "b", lognormal(2, 50))
    doc = json.loads(b.read_text())
    doc["dataset"]["id"] = "my-parts"
    b.write_text(json.dumps(doc))
    out = compare_sides(load_side(a), load_side(b))
    assert out.differ["variant"] == ("coco2017 subset16", "my-parts subset16")
    assert any("different image sets" in n for n in out.notes)
    doc["dataset"].update(id="coco2017", image_id_sha256="f" * 64)  # the same names, another image set
    b.write_text(json.dumps(doc))
    out = compare_sides(load_side(a), load_side(b))
    assert "variant" not in out.differ and any("different image sets" in n for n in out.notes)
    # another name (its folder's) for the same ground truth and images: the same data, no note
    for path, truth in ((a, "a" * 64), (b, "a" * 64)):
        d = json.loads(path.read_text())
        d["dataset"]["image_id_sha256"] = "e" * 64
        d.setdefault("repro", {}).setdefault("dataset", {})["annotations_sha256"] = truth
        d["dataset"]["id"] = "cars" if path == a else "cars-copy"
        path.write_text(json.dumps(d))
    out = compare_sides(load_side(a), load_side(b))
    assert not any("different image sets" in n for n in out.notes), out.notes


def test_names_from_files_reach_the_terminal_escaped(tmp_path):
    a = write_submission(tmp_path / "a", lognormal(1, 50))
    doc = json.loads(a.read_text())
    doc["model"]["id"] = "toy\x1b[2Jnano"
    a.write_text(json.dumps(doc))
    b = write_submission(tmp_path / "b", lognormal(2, 50))
    console = Console(record=True, width=80, force_terminal=True)
    console.print(render_comparison(compare_sides(load_side(a), load_side(b))))
    text = console.export_text(styles=False)
    assert "\x1b[2J" not in text and "toy\\x1b[2Jnano" in text


def test_compare_stays_torch_free():
    code = ("import sys, harness.results.compare, harness.eval.detection_diff, harness.views.compare_view; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "False"


# ------------------------------------------------------------------------- detection diff -----
def _dets(rows):
    return [{"image_id": i, "category_id": c, "bbox": list(b), "score": s} for i, c, b, s in rows]


def test_detection_diff_counts_a_known_perturbation():
    a = _dets([(1, 1, (0, 0, 10, 10), 0.9), (1, 1, (20, 20, 10, 10), 0.8), (1, 2, (0, 0, 10, 10), 0.7),
               (2, 1, (5, 5, 10, 10), 0.6), (2, 3, (50, 50, 5, 5), 0.5), (3, 1, (0, 0, 4, 4), 0.1)])
    b = _dets([(1, 1, (0, 0, 10, 10), 0.85),  # pairs with A0, |Δ| 0.05
               (1, 1, (22, 20, 10, 10), 0.8),  # IoU 80/120 = 0.67 with A1: pairs, |Δ| 0
               (1, 5, (0, 0, 10, 10), 0.7),  # other class: A2 unmatched, this unmatched
               (2, 1, (10, 5, 10, 10), 0.62),  # IoU 50/150 = 0.33 with A3: unmatched both
               (2, 3, (50, 50, 5, 5), 0.45),  # pairs with A4, |Δ| 0.05
               (4, 1, (0, 0, 1, 1), 0.9)])  # an image A has no detection for
    d = diff_detections(parse_coco_detections(a), parse_coco_detections(b), iou=0.5, conf=0.3)
    assert (d.images, d.detections_a, d.detections_b, d.matched) == (4, 5, 6, 3)
    assert (d.unmatched_a, d.unmatched_b) == (2, 3)
    assert d.matched_share == 3 / 6
    s = d.conf_delta_stats()
    assert s["max"] == pytest.approx(0.05) and s["mean"] == pytest.approx(0.1 / 3)
    # the 0.33-IoU pair pairs once the threshold is under it
    assert diff_detections(parse_coco_detections(a), parse_coco_detections(b), iou=0.3, conf=0.3).matched == 4


def test_detection_diff_conf_delta_figures_are_numpys():
    """20 boxes found by both files (one per image), each score moved by a known amount: the mean, p95 and max of
    |delta conf| are numpy's of those amounts."""
    deltas = np.random.default_rng(6).uniform(0.0, 0.2, 20).round(4)
    a = _dets([(i, 1, (0, 0, 10, 10), 0.3) for i in range(20)])
    b = _dets([(i, 1, (0, 0, 10, 10), 0.3 + float(d)) for i, d in enumerate(deltas)])
    diff = diff_detections(parse_coco_detections(a), parse_coco_detections(b), iou=0.5, conf=0.0)
    assert diff.matched == 20
    stats = diff.conf_delta_stats()
    assert stats["mean"] == pytest.approx(np.mean(deltas), abs=1e-9)
    assert stats["p95"] == pytest.approx(np.percentile(deltas, 95), abs=1e-9)
    assert stats["max"] == pytest.approx(np.max(deltas), abs=1e-9)
    assert stats["p95"] < stats["max"]


def test_greedy_pairs_by_score_then_iou():
    # one B box overlapping two A boxes: the higher-scoring A takes it, even though the other overlaps more
    a = _dets([(1, 1, (0, 0, 10, 10), 0.9), (1, 1, (1, 0, 10, 10), 0.8)])
    b = _dets([(1, 1, (1, 0, 10, 10), 0.85)])
    d = diff_detections(parse_coco_detections(a), parse_coco_detections(b), iou=0.5, conf=0.0)
    assert d.matched == 1 and d.conf_deltas == pytest.approx((0.05,))


def test_hostile_detection_files_are_refused():
    for bad, why in (({"a": 1}, "JSON list"), ([1], "not an object"), ([{"image_id": 1}], "has no"),
                     ([{"image_id": 1, "category_id": 1, "bbox": [0, 0, 1], "score": 1}], "bbox"),
                     ([{"image_id": "1", "category_id": 1, "bbox": [0, 0, 1, 1], "score": 1}], "integer"),
                     ([{"image_id": 1, "category_id": 1, "bbox": [0, 0, 1, 1], "score": None}], "finite")):
        with pytest.raises(DetectionFileError, match=why):
            parse_coco_detections(bad)


def test_a_detections_file_python_cannot_parse_is_named(tmp_path):
    from harness.eval.detection_diff import load_coco_detections

    huge = tmp_path / "huge.json"
    huge.write_text('[{"image_id": ' + "9" * 5000 + ', "category_id": 1, "bbox": [0, 0, 1, 1], "score": 1}]')
    nan = tmp_path / "nan.json"
    nan.write_text('[{"image_id": 1, "category_id": 1, "bbox": [0, 0, 1, 1], "score": NaN}]')
    with pytest.raises(DetectionFileError, match="huge.json is not valid JSON"):
        load_coco_detections(huge)
    with pytest.raises(DetectionFileError, match="^NaN is not a JSON number"):
        load_coco_detections(nan)


@pytest.mark.parametrize("text", [
    "[]", " [ ]\n", '[{"image_id": 1, "category_id": 2, "bbox": [1, 2, 3, 4], "score": 0.5}]',
    '[{"image_id": 1, "category_id": 2, "bbox": [1, 2, 3, 4], "score": 0.5} ,\n'
    ' {"image_id": 2, "category_id": 3, "bbox": [1.5, 2, 3, 4], "score": 0.25}]\n',
    '[{"image_id": 1, "category_id": 2, "bbox": [1, 2, 3, 4], "score": 0.5},]', "[,]", "[1]", '{"a": 1}', "",
    '[{"image_id": 1, "category_id": 2, "bbox": [1, 2, 3, 4], "score": 0.5}] x',
    '[{"image_id": 1, "category_id": 2, "bbox": [1, 2, 3, 4], "score": 0.5}',
    '[{"image_id": 1, "category_id": 2, "bbox": [1, 2, 3, 4], "score": 0.5}\x0b]'])
def test_a_detections_file_read_a_result_at_a_time_is_what_json_loads_reads(tmp_path, text):
    """load_coco_detections parses one result at a time: what json.loads and the same checks accept, it accepts with
    the same columns; what they refuse (a trailing comma, extra data, an unclosed array, a non-JSON space), it
    refuses."""
    from harness.eval.detection_diff import load_coco_detections

    path = tmp_path / "d.json"
    path.write_text(text)
    try:
        expected = parse_coco_detections(json.loads(text))
    except (ValueError, DetectionFileError):
        with pytest.raises(DetectionFileError):
            load_coco_detections(path)
        return
    got = load_coco_detections(path)
    for column in ("image_ids", "category_ids", "boxes", "scores"):
        assert np.array_equal(getattr(got, column), getattr(expected, column)), column


def test_identical_detection_files_are_read_and_diffed_once_and_let_go(tmp_path, monkeypatch):
    """Cells whose detections are one file under two names (a batch-invariant sweep) are read once a side and
    diffed once; each file is let go after the last diff that reads it."""
    from harness.results import compare

    loads = []
    real = compare.load_coco_detections
    monkeypatch.setattr(compare, "load_coco_detections", lambda path: loads.append(path.name) or real(path))
    for side in ("a", "b"):
        run = tmp_path / side
        (run / "detections").mkdir(parents=True)
        (run / "detections" / "b1.json").write_text(json.dumps(_dets([(1, 1, (0, 0, 10, 10), 0.9)])))
        os.link(run / "detections" / "b1.json", run / "detections" / "b4.json")
        for batch in (1, 4):
            write_submission(run, lognormal(1, 50), batch=batch, name=f"b{batch}.json",
                             detections=f"detections/b{batch}.json")
    c = compare_paths(tmp_path / "a", [tmp_path / "b"])[0]
    assert len(c.cells) == 2 and all(r.diff is not None and r.diff.matched == 1 for r in c.detections)
    assert sorted(loads) in (["b1.json", "b1.json"], ["b1.json", "b4.json"], ["b4.json", "b4.json"])
    cache = compare._DetectionCache([tmp_path / "a/detections/b1.json", tmp_path / "b/detections/b1.json"])
    cache.diff(tmp_path / "a/detections/b1.json", tmp_path / "b/detections/b1.json", 0.5, 0.4)
    assert cache._sets == {}


def test_detection_files_relative_absolute_moved_and_missing(tmp_path):
    dets = _dets([(1, 1, (0, 0, 10, 10), 0.9)])
    run = tmp_path / "run"
    (run / "detections").mkdir(parents=True)
    (run / "detections" / "d.json").write_text(json.dumps(dets))
    write_submission(run, lognormal(1, 50), name="rel.json", detections="detections/d.json")
    c = compare_paths(run, [run])[0]
    assert c.detections[0].diff.matched == 1 and c.detections[0].diff.matched_share == 1
    # absolute, then the run folder moved: found by name under the new folder, and said so
    write_submission(run, lognormal(1, 50), name="rel.json", detections=str(run / "detections" / "d.json"))
    moved = tmp_path / "moved"
    shutil.move(run, moved)
    c = compare_paths(moved, [moved])[0]
    assert c.detections[0].diff.matched == 1 and any("run folder moved" in n for n in c.notes)
    (moved / "detections" / "d.json").unlink()
    c = compare_paths(moved, [moved])[0]
    assert c.detections[0].diff is None and "no such file" in c.detections[0].unavailable
    write_submission(moved, lognormal(1, 50), name="rel.json", detections="../../etc/passwd")
    c = compare_paths(moved, [moved])[0]
    assert "outside the run folder" in c.detections[0].unavailable


def test_detection_files_compared_directly(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_dets([(1, 1, (0, 0, 10, 10), 0.9), (2, 1, (0, 0, 10, 10), 0.9)])))
    b.write_text(json.dumps(_dets([(1, 1, (0, 0, 10, 10), 0.8)])))
    c = compare_paths(a, [b])[0]
    d = c.detections[0].diff
    assert (d.matched, d.unmatched_a, d.unmatched_b, d.images) == (1, 1, 0, 2)
    assert not c.cells and not c.accuracy


def test_a_file_compared_directly_that_holds_no_detections_is_bad_input(tmp_path):
    """Two files given as detections files are all the comparison has: one that is not a list of COCO detections is
    refused in one line naming it (exit 2), never an "unavailable" diff that exits 0."""
    good, bad = tmp_path / "a.json", tmp_path / "b.json"
    good.write_text(json.dumps(_dets([(1, 1, (0, 0, 10, 10), 0.9)])))
    bad.write_text("[1, 2]")
    with pytest.raises(UsageError, match=r"b\.json: detection 0 is int, not an object; pass two COCO detections"):
        compare_paths(good, [bad])
    result = va_bench("compare", str(bad), str(good), "--json")
    assert result.returncode == 2 and result.stdout == "", result.stdout
    assert "a.json" not in result.stderr and "b.json: detection 0 is int" in result.stderr, result.stderr


# ------------------------------------------------------------------------------- real runs ----
@pytest.fixture(scope="module")
def real_runs(tmp_path_factory):
    """yolox-nano on ONNX Runtime and on PyTorch, 16 images, batch 1 and 4."""
    if not (SUBSET_ANNOTATIONS.is_file() and YOLOX_NANO.is_file()):
        pytest.skip("offline assets missing (../shared/assets)")
    small = dict(limit=16, batch_sizes=[1, 4], warmup_batches=1, warmup_seconds=0.0, min_timed_batches=2,
                 layers=False, profile=False, draw_images=0, energy=False, memory=False)
    ort, _ = run_benchmark(tmp_path_factory, "cmp_ort", backends=["onnxruntime"], **small)
    pt, _ = run_benchmark(tmp_path_factory, "cmp_pt", backends=["pytorch"], **small)
    return ort.run_dir, pt.run_dir


def test_real_run_against_itself(real_runs):
    ort, _ = real_runs
    c = compare_paths(ort, [ort])[0]
    assert c.differ == {} and not c.only_a and not c.only_b
    assert len(c.cells) == 2
    for cell in c.cells:
        assert cell.change("p50") == cell.change("p95") == cell.change("ips") == 0
        assert cell.significance.verdict == "no significant change"
    assert c.geomean() == {"p50": 1.0, "p95": 1.0, "ips": 1.0}
    assert c.accuracy and all(acc.delta(n) == 0 for acc in c.accuracy for n in STAT_NAMES)
    assert c.detections and all(r.diff.matched_share == 1.0 and r.diff.detections_a > 0 for r in c.detections)
    assert all(r.diff.conf_delta_stats()["max"] == 0 for r in c.detections)
    console = Console(record=True, width=80)
    console.print(render_comparison(c))
    assert "no class changed (of 80)" in console.export_text()  # not ten unchanged classes as "largest changes"


def test_a_side_without_per_class_files_says_the_classes_were_not_compared(real_runs, tmp_path):
    """A run made before per_class files were written (or with them removed): said, not silently left out."""
    ort, _ = real_runs
    old = tmp_path / ort.name
    shutil.copytree(ort, old)
    shutil.rmtree(old / "per_class")
    c = compare_paths(old, [ort])[0]
    assert c.accuracy and all(not acc.per_class for acc in c.accuracy)
    assert all(acc.per_class_unavailable.startswith("A has no per_class file 'per_class/") for acc in c.accuracy), \
        [acc.per_class_unavailable for acc in c.accuracy]
    console = Console(record=True, width=80)
    console.print(render_comparison(c))
    text = console.export_text()
    assert "per class AP 50:95" in text and "not compared (A has no per_class file" in text.replace("\n", " ")
    acc = c.accuracy[0]
    assert json.loads(json.dumps(acc.to_dict()))["per_class_unavailable"] == acc.per_class_unavailable


def test_real_ort_vs_pytorch_shows_the_measured_deltas(real_runs):
    from coco_results import detections_from_coco

    from harness.eval.matching import match_detections

    ort, pt = real_runs
    c = compare_paths(ort, [pt], conf=0.001)[0]
    assert c.differ == {"backend": ("onnx/cpu", "pytorch/cpu")}
    assert {cell.label for cell in c.cells} == {"b1", "b4"}
    subs = {}
    for side, run in (("a", ort), ("b", pt)):
        for f in (run / "submissions").glob("*.json"):
            doc = json.loads(f.read_text())
            subs[side, doc["config"]["batch_size"]] = doc
    for cell in c.cells:
        batch = cell.coords["batch_size"]
        a, b = subs["a", batch], subs["b", batch]
        assert cell.p50_a == a["timing"]["total_ms"]["p50"] and cell.p50_b == b["timing"]["total_ms"]["p50"]
        assert cell.change("ips") == pytest.approx(b["throughput"]["images_per_s"] / a["throughput"]["images_per_s"]
                                                   - 1)
        assert cell.significance.verdict in ("slower", "faster", "no significant change")
        samples = np.asarray(a["timing"]["batch_samples_ms"])
        if cell.significance.basis == "batch means":  # this box's batch times drift together: blocks were tested
            assert autocorrelated(samples) or autocorrelated(np.asarray(b["timing"]["batch_samples_ms"]))
            samples = block_means(samples)
        assert cell.significance.n_a == len(samples)
    for acc in c.accuracy:
        a, b = subs["a", 1]["accuracy"], subs["b", 1]["accuracy"]
        assert all(acc.delta(n) == pytest.approx(b[n] - a[n], abs=1e-12) for n in STAT_NAMES)
        # per-class deltas: each the difference of the two cells' own per_class files, the largest first
        files = [json.loads((run / subs[side, 1]["eval"]["per_class"]).read_text())["categories"]
                 for side, run in (("a", ort), ("b", pt))]
        ap = [{c["id"]: c["AP"] for c in f} for f in files]
        assert len(acc.per_class) == len(ap[0]) and abs(acc.per_class[0]["delta"]) == max(
            abs(ap[1][k] - ap[0][k]) for k in ap[0] if ap[0][k] is not None and ap[1][k] is not None)
        for row in acc.per_class:
            assert row["delta"] is None or row["delta"] == pytest.approx(ap[1][row["id"]] - ap[0][row["id"]])
    # the detection diff agrees with the torch matcher the run itself uses (any score difference allowed)
    for row in c.detections:
        batch = int(row.label.removeprefix("b"))
        files = [run / subs[side, batch]["artifacts"]["detections"] for side, run in (("a", ort), ("b", pt))]
        sets = [detections_from_coco(json.loads(f.read_text())) for f in files]
        reference = match_detections(sets[0], sets[1], iou_threshold=0.5, score_tolerance=1.0)
        assert row.diff.matched == reference.matched
        assert (row.diff.detections_a, row.diff.detections_b) == (reference.detections_a, reference.detections_b)
        assert row.diff.matched_share > 0.99
    # the table a user reads shows those numbers, in 80 columns
    console = Console(width=80, record=True, color_system=None)
    console.print(render_comparison(c))
    text = console.export_text()
    assert max(map(len, text.splitlines())) <= 80 and "…" not in text
    assert "differ  backend: onnx/cpu → pytorch/cpu" in text and "per class AP 50:95" in text
    assert f"{c.cells[0].p50_b:.2f}" in text and f"{subs['a', 1]['accuracy']['mAP_50_95']:.4f}" in text
    cli = va_bench("compare", str(ort), str(pt), "--json")
    assert cli.returncode == 0 and json.loads(cli.stdout)["comparisons"][0]["differ"] == {
        "backend": ["onnx/cpu", "pytorch/cpu"]}


def test_a_figure_next_to_its_threshold_is_printed_with_the_digits_that_tell_them_apart():
    """p = 0.0499 is significant at alpha 0.05 and must not print as p=0.050; a gate delta of 0.3004 points over a
    0.3 tolerance, or a larger variant 10.002 % faster under a "> 10 %" heading, likewise."""
    from rich.console import Console

    from harness.figures import shown_apart
    from harness.results.compare import Significance
    from harness.views.compare_view import _verdict
    from harness.views.leaderboard import gate_table, size_order_table

    assert (shown_apart(0.049883, 0.05, 3), shown_apart(0.3004, 0.3, 2), shown_apart(10.002, 10, 0)) == \
        ("0.0499", "0.3004", "10.002")
    assert (shown_apart(0.012, 0.05, 3), shown_apart(0.3, 0.3, 2), shown_apart(12.4, 10, 0)) == ("0.012", "0.30", "12")

    class Cell:
        significance = Significance("slower", ratio=1.13, ci95=(1.01, 1.18), p_value=0.049883, n_a=8, n_b=8)

    assert "p=0.0499" in _verdict(Cell())
    Cell.significance = Significance("slower", ratio=1.13, ci95=(1.01, 1.18), p_value=0.00995, n_a=8, n_b=8,
                                     alpha=0.01)  # --alpha 0.01
    assert "p=0.00995" in _verdict(Cell())
    gate = {"model": "m", "dataset_variant": "full", "precision": "fp32", "canonical": 0.3, "canonical_hardware": "a",
            "other": 0.297, "other_hardware": "b", "other_format": "onnx", "delta_points": -0.3004}
    finding = {"hardware": "h", "format": "onnx", "provider": "cpu", "precision": "fp32", "input_size": 640,
               "batch_size": 1, "smaller": {"model": "m-s", "latency_ms_p50": 13.747},
               "larger": {"model": "m-l", "latency_ms_p50": 12.372}, "faster_pct": 10.002}
    console = Console(record=True, width=120)
    console.print(gate_table({"agreement_gate": [gate], "policy": {"tolerance_points": 0.3}}))
    console.print(size_order_table({"size_order": [finding]}))
    text = console.export_text()
    assert "-0.3004" in text and "10.002%" in text


def test_latencies_past_floating_points_range_make_no_verdict_and_no_nan_in_json():
    """Samples of 1e308 ms (finite numbers a file may hold): their ratio is not a number, so the verdict is
    unavailable with why, and `--json` never writes NaN or Infinity (JSON has neither; other parsers refuse them)."""
    import warnings

    from rich.console import Console

    from harness.errors import NonFiniteNumberError
    from harness.views.output import print_json

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # and no numpy overflow warning on stderr
        sig = latency_significance(np.array([0.5, 0.6, 0.55, 0.52, 0.58]), np.full(5, 1e308))
    assert sig.verdict == "unavailable" and "not a finite number" in sig.reason and sig.ratio is None
    console = Console(record=True)
    print_json(console, sig.to_dict())
    with pytest.raises(NonFiniteNumberError, match=r"refusing to write stdout: x is inf"):
        print_json(console, {"x": float("inf")})


def test_a_difference_in_thresholds_or_evaluation_cap_is_a_difference(tmp_path):
    """--iou 0.5 --eval-max-det 500 against the protocol: compare printed `same` for every coordinate and the mAP
    deltas as the model's, where aggregate keys such rows apart."""
    from conftest import CORPUS

    from harness.results.compare import compare_paths

    if not CORPUS.is_dir():
        pytest.skip("no corpus")
    doc = json.loads(next((CORPUS / "submissions").glob("yolox-s__pytorch__cuda__*.json")).read_text())
    other = json.loads(json.dumps(doc))
    other["config"]["iou"], other["submission_id"] = 0.5, doc["submission_id"] + "-b"
    other["eval"] = {**(other.get("eval") or {}), "maxDets": [1, 10, 100, 500]}
    for name, d in (("a", doc), ("b", other)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "s.json").write_text(json.dumps(d))
    (comparison,) = compare_paths(tmp_path / "a", [tmp_path / "b"])
    assert comparison.differ["protocol"] == ("conf 0.001, iou 0.6, max_det 300, AP at 100 detections",
                                             "conf 0.001, iou 0.5, max_det 300, AP at 500 detections")
    (same,) = compare_paths(tmp_path / "a", [tmp_path / "a"])
    assert "protocol" not in same.differ and same.same["protocol"].startswith("conf 0.001, iou 0.6")


def test_per_class_rows_pair_a_class_by_its_id_and_name(monkeypatch):
    """Two datasets' numberings (COCO ids against a YOLO dataset's indices): B's chair (id 3) was shown as A's car."""
    from types import SimpleNamespace

    from harness.results import compare

    files = {"a": {"3": {"name": "car", "AP": 0.5}, "1": {"name": "person", "AP": 0.4}},
             "b": {"3": {"name": "chair", "AP": 0.2}, "1": {"name": "person", "AP": 0.3}}}
    sides = {k: SimpleNamespace(side=k) for k in files}
    per_class = {k: ({int(c): v for c, v in f.items()}, None) for k, f in files.items()}
    monkeypatch.setattr(compare, "_per_class", lambda entry: per_class[entry.side])
    rows, why = compare._per_class_deltas(sides["a"], sides["b"])
    assert [(r["id"], r["name"]) for r in rows] == [(1, "person")]
    assert rows[0]["delta"] == pytest.approx(-0.1)
    assert why == "1 categories share an id but not a name (id 3: car in A, chair in B)"


def test_thresholds_that_are_each_familys_own_still_pair_its_cells(tmp_path):
    """A run of YOLOX (iou 0.6) and an Ultralytics family (iou 0.7) against one at max_det 100: the protocol varies
    within each side and differs between them, and nothing paired on it. The cells pair on the rest, each pair's
    change said."""
    from conftest import CORPUS

    from harness.results.compare import compare_paths

    if not CORPUS.is_dir():
        pytest.skip("no corpus")
    docs = [json.loads(next((CORPUS / "submissions").glob(f"{m}__pytorch__cuda__*5070_ti*.json")).read_text())
            for m in ("yolox-s", "yolov9s")]
    docs[1]["config"]["iou"] = 0.7  # a family whose own NMS IoU is another
    for name, max_det in (("a", None), ("b", 100)):
        (tmp_path / name).mkdir()
        for k, doc in enumerate(docs):
            doc = json.loads(json.dumps(doc))
            if max_det:
                doc["config"]["max_det"], doc["submission_id"] = max_det, doc["submission_id"] + "-b"
            (tmp_path / name / f"{k}.json").write_text(json.dumps(doc))
    (comparison,) = compare_paths(tmp_path / "a", [tmp_path / "b"])
    assert len(comparison.cells) == 2 and not comparison.only_a and not comparison.only_b
    changed = [n for n in comparison.notes if "scored at another protocol" in n]
    assert len(changed) == 2 and all("max_det 300" in n and "max_det 100" in n for n in changed), comparison.notes


def test_report_gate_names_are_the_same_figures_in_compare(ort_run):
    """`--fail-on images_per_s:-5%` gates the figure `report --gates` calls images_per_s (and so for the per-image
    latencies), read from a real run's submission."""
    from harness.report.gates import METRICS
    from harness.results.compare_gates import PERF_ALIASES, PERF_GATES

    plan, _ = ort_run
    path = next((plan.run_dir / "submissions").glob("*.json"))
    doc = json.loads(path.read_text())
    (cell,) = compare_paths(path, [path])[0].cells
    for name, metric in PERF_ALIASES.items():
        assert parse_gate(f"{name}:+5%").metric == metric
        value = doc
        for part in METRICS[name][0].split("."):
            value = value[part]
        assert getattr(cell, PERF_GATES[metric][0]) == value, name
    with pytest.raises(UsageError, match="image_p50_ms"):
        parse_gate("fps:-5%")


def test_a_run_compared_with_itself_says_a_gate_cannot_fail(tmp_path):
    a = write_submission(tmp_path / "a", lognormal(1, 50))
    same = compare_paths(a, [a])[0]
    assert any("A and B are the same submission files" in n for n in same.notes)
    other = compare_paths(a, [write_submission(tmp_path / "b", lognormal(2, 50))])[0]
    assert not any("same submission files" in n for n in other.notes)


def test_a_gate_with_no_paired_cell_says_so(tmp_path):
    """Cells that do not pair (another batch size) left the gate saying no mAP was measured on both sides, though
    both had one."""
    from harness.results.compare_gates import check_gate

    accuracy = dict.fromkeys(STAT_NAMES, 0.3)
    for backend in ("onnx", "pytorch"):  # two runtimes in A, two others in B: no cell has a counterpart
        write_submission(tmp_path / "a", lognormal(1, 50), backend=backend, accuracy=accuracy)
    for backend in ("openvino", "tflite"):
        write_submission(tmp_path / "b", lognormal(2, 50), backend=backend, accuracy=accuracy)
    c = compare_paths(tmp_path / "a", [tmp_path / "b"])[0]
    result = check_gate(parse_gate("map:-0.01"), c)
    assert result.status == "unchecked" and result.detail == "no cell of A pairs with one of B (see only in A / only " \
                                                             "in B)", (result, c.only_a, c.only_b, c.cells)


def test_long_cell_labels_of_the_detections_table_fold_and_are_never_cut():
    """At 80 columns the detections table cut its labels ("openvin…", "torchsc…")."""
    from types import SimpleNamespace

    from harness.results.compare import Comparison, DetectionRow

    diff = SimpleNamespace(images=32, conf=0.4, iou=0.5, iou_type="bbox", detections_a=144, detections_b=144,
                           matched_share=1.0, unmatched_a=0, unmatched_b=0,
                           conf_delta_stats=lambda: {"mean": 5.7e-7, "p95": 2.4e-3, "max": 6.8e-3})
    labels = ["openvino/cpu fp16 b1", "torchscript/cpu fp32 b1", "tflite/cpu int8 b2"]
    c = Comparison("A", "B", detections=[DetectionRow(label, diff, None) for label in labels])
    console = Console(record=True, width=80)
    console.print(render_comparison(c))
    text = console.export_text()
    assert "…" not in text and all(len(line) <= 80 for line in text.splitlines())
    assert all(f"{v:.1e}" in text for v in (5.7e-7, 2.4e-3, 6.8e-3))
    words = text.split()
    assert all(word in words for label in labels for word in label.split())  # whole, on one line or folded


def test_a_cell_b_lost_fails_every_gate_and_its_status_is_named(tmp_path):
    """Tonight's run lost a cell (out of memory): yesterday's b8 had no counterpart, and the gates checked the
    cells that were left and passed; B's run.json said why and compare never read it."""
    from harness.results.compare_gates import check_gate

    accuracy = dict.fromkeys(STAT_NAMES, 0.3)
    for batch in (1, 8):
        write_submission(tmp_path / "a", lognormal(batch, 50), batch, accuracy=accuracy)
    write_submission(tmp_path / "b", lognormal(3, 50), 1, accuracy=accuracy)
    cells = [{"cell": "m onnxruntime fp32 640 b1", "status": "ok"},
             {"cell": "m onnxruntime fp32 640 b8", "status": "oom"}]
    (tmp_path / "b" / "run.json").write_text(json.dumps({"cells": cells}))
    c = compare_paths(tmp_path / "a", [tmp_path / "b"])[0]
    assert c.only_a == ["b8"]
    assert f"{tmp_path / 'b'}: 1 cell(s) of its run did not end ok: m onnxruntime fp32 640 b8 (oom)" in c.notes
    for spec in ("latency:+50%", "map:-0.01"):
        result = check_gate(parse_gate(spec), c)
        assert result.status == "failed" and "1 cell(s) of A have no counterpart in B" in result.detail, result
        assert result.detail.endswith(": b8")


def test_a_latency_verdict_carries_the_timing_warnings_of_each_sides_run(tmp_path):
    """Two nights of the same code: "slower x2.34, p=0.002", while both runs had warned that other processes were
    busy; compare said nothing of it."""
    write_submission(tmp_path / "a", lognormal(1, 50), 4)
    path = write_submission(tmp_path / "b", lognormal(2, 110), 4)
    doc = json.loads(path.read_text())
    doc["timing"]["warnings"] = ["other processes busy during the timed pass: python (pid 7, 55% CPU)",
                                 "high variation: CV 19.8% > 10%"]
    path.write_text(json.dumps(doc))
    (c,) = compare_paths(tmp_path / "a", [tmp_path / "b"])
    (cell,) = c.cells
    assert cell.significance.verdict == "slower" and cell.to_dict()["timing_warnings"]["a"] == []
    assert cell.to_dict()["timing_warnings"]["b"] == doc["timing"]["warnings"]
    assert (f"{tmp_path / 'b'}: its run warned of its timing, so a latency verdict there may be the machine's, not the "
            "change's: other processes busy during the timed pass (b4); high variation (b4)") in c.notes
    assert not any(n.startswith(f"{tmp_path / 'a'}: its run warned") for n in c.notes)
