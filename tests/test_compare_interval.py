"""compare --map-ci: the paired bootstrap interval of each mAP delta over the images both cells scored. Each
draw's figures are COCO's on the drawn images (tests/test_bootstrap.py holds them against pycocotools); here: the
interval of two real runs holds their delta, the reasons where there is none, and the command's refusals."""

from __future__ import annotations

import pytest
from conftest import COCO_DIR, requires_coco, requires_yolox, run_in_process

from harness.results.compare import ImageSets, compare_paths


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """yolox-nano on 40 sample images at 416 and at 320 (other detections, the same images), and at 416 on 30."""
    out = tmp_path_factory.mktemp("runs")
    for run_id, extra in (("a", ["--limit", "40"]), ("b", ["--limit", "40", "--input-size", "320"]),
                          ("c", ["--limit", "30"])):
        done = run_in_process("run", "--model", "yolox-nano", "--backend", "onnxruntime", "--subset", "sample",
                              "--batch-sizes", "1", "--no-energy", "--output-dir", str(out), "--run-id", run_id,
                              *extra)
        assert done.returncode == 0, done.stderr
    return out


@requires_coco
@requires_yolox
def test_the_paired_interval_holds_the_delta_of_two_real_runs(runs):
    (comparison,) = compare_paths(runs / "a", [runs / "b"], intervals=ImageSets(200, COCO_DIR))
    (acc,) = comparison.accuracy
    ci = acc.delta_interval
    assert acc.delta_interval_unavailable is None and ci["images"] == 40 and ci["resamples"] == 200
    assert "paired" in ci["method"]
    for name in ("mAP_50_95", "mAP_50"):
        if ci[name] is None:  # draws biased past the figure: said, not drawn
            assert f"{name}:" in ci["reason"]
            continue
        lo, hi = ci[name]
        assert lo <= acc.delta(name) <= hi, (name, acc.delta(name), ci[name])
    assert acc.to_dict()["delta_interval"] == ci


@requires_coco
@requires_yolox
def test_no_interval_without_the_same_images_or_their_annotations(runs, tmp_path):
    """Other images (40 against 30): none, and why; annotations that are not the run's: none, and why."""
    (other,) = compare_paths(runs / "a", [runs / "c"], intervals=ImageSets(200, COCO_DIR))[0].accuracy
    assert other.delta_interval is None and "same recorded images" in other.delta_interval_unavailable
    (lost,) = compare_paths(runs / "a", [runs / "b"], intervals=ImageSets(200, tmp_path))[0].accuracy
    assert lost.delta_interval is None and "could not be found" in lost.delta_interval_unavailable
    (plain,) = compare_paths(runs / "a", [runs / "b"])[0].accuracy
    assert plain.delta_interval is None and plain.delta_interval_unavailable is None
    assert "delta_interval" not in plain.to_dict()


@requires_coco
@requires_yolox
def test_the_command_prints_the_interval_and_refuses_what_it_cannot_do(runs):
    done = run_in_process("compare", str(runs / "a"), str(runs / "b"), "--map-ci", "100")
    assert done.returncode == 0, done.stderr
    assert "ΔmAP_50_95 " in done.stdout and "over 40 images" in done.stdout
    assert all(len(line) <= 80 for line in done.stdout.splitlines() if line.startswith("ΔmAP"))
    few = run_in_process("compare", str(runs / "a"), str(runs / "b"), "--map-ci", "50")
    assert few.returncode == 2 and "at least 100" in few.stderr
    stray = run_in_process("compare", str(runs / "a"), str(runs / "b"), "--coco-dir", str(COCO_DIR))
    assert stray.returncode == 2 and "add --map-ci" in stray.stderr
