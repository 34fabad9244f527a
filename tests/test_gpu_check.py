"""The GPU acceptance script's plumbing, run on the CPU: every check gives a figure, a goal and a result, or
says why it did not run; the JSON and Markdown reports are written."""

import json

import pytest
from conftest import requires_coco, requires_yolox

from harness.bench.gpu_check import main


@requires_coco
@requires_yolox
def test_gpu_check_runs_its_checks_on_the_cpu_and_reports_them(tmp_path):
    code = main(["--device", "cpu", "--limit", "8", "--out", str(tmp_path),
                 "--checks", "env", "reference", "fp32", "precisions", "postprocess", "runtimes"])
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["env"]["data"]["torch"] and checks["env"]["data"]["device"] == "cpu"
    assert checks["reference"]["status"] == "ok" and "mAP" in checks["reference"]["figure"]
    # the same CPU PyTorch core at batch 1 and 8: the checks' own goals hold
    assert checks["fp32.map_vs_cpu"]["passed"] and checks["fp32.batch8_vs_1"]["passed"], checks
    assert all(checks[f"fp32.stage_sum_b{b}"]["status"] in ("ok", "failed") for b in (1, 8))
    assert "fp32.stage_sum_b32" not in checks  # 8 images: no batch of 32
    assert checks["fp32.energy_b8"]["figure"].startswith("unavailable")
    hygiene = checks["fp32.hygiene"]
    assert hygiene["passed"] and hygiene["data"]["samples"] >= 1 and hygiene["data"]["throttled"] is None  # no signal
    assert hygiene["data"]["gpu_hygiene"] == {"status": "not a CUDA run", "locked_clocks": None}
    assert checks["precisions"] == {**checks["precisions"], "status": "not run", "reason": "needs a CUDA device"}
    where = checks["postprocess.where"]  # on a CPU the three variants are the same work, and agree
    assert set(where["data"]["variants"]) == {"device", "device-serial", "host"}
    assert all(v["matched_vs_device"] == 1.0 for v in where["data"]["variants"].values()), where
    assert checks["tensorrt"]["status"] == "not run" and "64 MiB" in checks["tensorrt"]["reason"]
    # TorchScript (in torch: on the lent machine too) against eager fp32; fp16 only on a GPU
    assert checks["torchscript.fp32"]["passed"], checks["torchscript.fp32"]
    assert "torchscript.fp16" not in checks
    markdown = (tmp_path / "gpu_check.md").read_text()
    assert markdown.count("\n| ") == len(report["checks"]) + 1  # header + a row per check
    assert code == (1 if any(c["status"] == "failed" for c in report["checks"]) else 0)


@pytest.mark.heavy
@requires_coco
@requires_yolox
def test_gpu_check_overhead_step_gives_every_row_on_the_cpu(tmp_path):
    # the plumbing of the step the next GPU call runs first: every row measured (none lost to a bad option), the
    # judged rows judged, each with the forward thread's account, and the lock holders found by py-spy
    main(["--device", "cpu", "--limit", "2", "--out", str(tmp_path), "--checks", "overhead"])
    checks = {c["name"]: c for c in json.loads((tmp_path / "gpu_check.json").read_text())["checks"]}
    rows = ["overhead.b2", "overhead.b2.finishes_2", "overhead.b2.cv2", "overhead.b2.combined"]
    assert set(rows) | {"overhead.b2.lock_holders"} == set(checks), sorted(checks)
    judged = {"overhead.b2", "overhead.b2.combined"}  # a judged row fails when its ratio misses the goal
    for name in rows:
        row = checks[name]
        assert row["status"] == ("ok" if name not in judged or row["passed"] else "failed"), row
        assert "its forward" in row["figure"] and row["data"]["batch_size"] == 2
        assert (row["goal"], row["passed"] is None) == ((">= 0.9", False) if name in judged else ("", True)), row
    combined = checks["overhead.b2.combined"]["data"]
    assert combined["finishes_in_flight"] == 2 and combined["cuda_graphs"] is False
    assert combined["preprocess"]["implementation"] == "cv2"  # auto on a CPU: the family's own library
    holders = checks["overhead.b2.lock_holders"]
    if holders["status"] == "ok":  # py-spy is in the dev extra; a box that forbids ptrace says "not run"
        assert "MainThread" in holders["data"]["by_thread"], holders
    else:
        assert holders["status"] == "not run" and holders["reason"], holders
