"""`va-bench parity preprocess` (seed 003): the report's arithmetic against hand-computed values, the
pixel statistics against a straightforward loop, and the command on real images: tables with the noise
floor, exit 0 within --tolerance and 1 beyond it, JSON written, bad --impls one line with exit 2."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
from conftest import COCO_DIR, YOLOX_NANO, requires_coco, requires_yolox, run_in_process

from harness.eval.coco_eval import STAT_NAMES
from harness.eval.detection_diff import DetectionDiff
from harness.eval.parity import Candidate, ParityReport, PixelStats


def _metrics(value: float, **over: float) -> dict[str, float]:
    return {k: over.get(k, value) for k in STAT_NAMES}


def _diff() -> DetectionDiff:
    return DetectionDiff(images=1, conf=0.4, iou=0.5, detections_a=2, detections_b=2, matched=2, conf_deltas=(0, 0))


def test_report_deltas_noise_floor_and_verdict():
    ref = _metrics(0.30)
    again = Candidate("cv2 (again)", True, _metrics(0.30, mAP_50=0.3005), _diff(), None)
    torch_ = Candidate("torch", False, _metrics(0.30, mAP_50_95=0.3015, mAP_small=0.25), _diff(), PixelStats())
    report = ParityReport("cv2", ref, [again, torch_], tolerance=0.002)
    assert abs(report.deltas(torch_)["mAP_50_95"] - 0.0015) < 1e-12
    assert abs(report.noise_floor() - 0.0005) < 1e-12
    assert report.failures() == [] and report.exit_code == 0  # mAP_small -0.05 is shown, not gated
    tight = ParityReport("cv2", ref, [again, torch_], tolerance=0.001)
    assert tight.failures() == ["torch: mAP_50_95 +0.0015 exceeds the tolerance 0.001"]
    assert tight.exit_code == 1
    assert json.loads(json.dumps(tight.to_dict()))["exit_code"] == 1
    # a verdict on a handful of images says how little they tell; on the whole sample, nothing
    assert ParityReport("cv2", ref, [again], 0.002, setup={"images": 8}).notes()[0].startswith("8 images: ")
    assert ParityReport("cv2", ref, [again], 0.002, setup={"images": 206}).notes() == []


def test_a_reference_that_does_not_reproduce_itself_fails():
    ref = _metrics(0.30)
    drift = Candidate("cv2 (batch 1)", True, _metrics(0.30, mAP_75=0.31), _diff(), None)
    assert ParityReport("cv2", ref, [drift], tolerance=0.002).exit_code == 1


def test_pixel_stats_against_a_plain_loop():
    rng = np.random.default_rng(0)
    pairs = [(rng.normal(size=(3, 4, 5)).astype(np.float32), rng.normal(size=(3, 4, 5)).astype(np.float32))
             for _ in range(3)]
    stats = PixelStats()
    for a, b in pairs:
        stats.add(a, b)
    values = [abs(float(x) - float(y)) for a, b in pairs for x, y in zip(a.ravel(), b.ravel(), strict=True)]
    assert stats.count == len(values)
    assert abs(stats.max_abs - max(values)) < 1e-12
    assert abs(stats.mean_abs - sum(values) / len(values)) < 1e-12


def _parity(*args: str) -> subprocess.CompletedProcess:
    return run_in_process("parity", "preprocess", "--coco-dir", str(COCO_DIR), *args)


@pytest.mark.parametrize("args, expected", [
    (("--impls", "cv2", "opencv"), "--impls cv2 opencv: 'opencv' is not an implementation"),
    (("--impls", "cv2", "cv2"), "--impls cv2 cv2: cv2 given twice"),  # the reference against nothing
    (("--weights", "random"), "random weights have none"),  # mAP 0 against 0 would pass every gate
    # ncnn runs batch 1 only: refused before any pass, with parity's flags (the noise floor's default at batch 1 is 2)
    (("--backend", "ncnn"), "use --batch-size 1 --noise-batch-size 1"),
    (("--backend", "ncnn", "--batch-size", "1"), "use --batch-size 1 --noise-batch-size 1"),
    # a folder the permission bits allow but where no file can be made: said before the study, not after it
    (("--json-out", "/proc/parity.json"), "--json-out"),
])
def test_bad_parity_options_are_one_line_exit_2(args, expected):
    out = _parity(*args)
    assert out.returncode == 2
    assert expected in out.stderr and "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1


@requires_coco
@requires_yolox
def test_parity_command_exit_codes_and_tables(tmp_path):
    """Real images, real detector: cv2 (reference) vs torch. A loose tolerance exits 0; a zero tolerance
    exits 1 because torch's input differs from cv2's (pixels measured), so its metrics move a little."""
    common = ("--limit", "6", "--batch-size", "3", "--impls", "cv2", "torch", "--threads", "1")
    loose = _parity(*common, "--tolerance", "0.5", "--json-out", str(tmp_path / "p.json"))
    assert loose.returncode == 0, loose.stderr
    passes = [line for line in loose.stderr.splitlines() if "parity: " in line]  # each pass shown on stderr
    assert [p.split("parity: ")[1].split(":")[0] for p in passes] == ["cv2 (reference)", "cv2 (again)",
                                                                      "cv2 (batch 1)", "torch"]
    assert all("6/6 done" in p for p in passes)
    for text in ("noise floor", "mAP_50_95", "cv2 (again)", "cv2 (batch 1)", "matched", "max |Δ|", "OK"):
        assert text in loose.stdout
    # the verdict is the last line (what tools/gpu_check reads), after the note that 6 images tell little
    assert loose.stdout.strip().splitlines()[-1].startswith("OK every gated delta") and "6 images: " in loose.stdout
    report = json.loads((tmp_path / "p.json").read_text())
    assert report["exit_code"] == 0 and report["noise_floor"] == 0.0  # ORT on CPU reproduces itself exactly
    torch_row = next(c for c in report["candidates"] if c["name"] == "torch")
    assert 0 < torch_row["pixels"]["max_abs"] < 2  # float resize vs uint8 rounding: under 2 pixel units
    assert torch_row["detections"]["matched_share"] > 0.9
    strict = _parity(*common, "--tolerance", "0")
    assert strict.returncode == 1
    assert "FAIL torch" in strict.stdout
    # --weights as a run takes it (the model's refusals name it): the same file given explicitly, the same report
    named = _parity(*common, "--tolerance", "0.5", "--weights", str(YOLOX_NANO), "--json")
    assert named.returncode == 0, named.stderr
    assert json.loads(named.stdout)["candidates"] == report["candidates"]
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"not a model")
    refused = _parity(*common, "--weights", str(junk))  # the file given is the one loaded
    assert refused.returncode == 2 and str(junk) in refused.stderr, refused.stderr
