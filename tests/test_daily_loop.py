"""What a new user trips on first: the site's backend name, devices that are not supported, a typo in a model id,
which models `models fetch` can get, and where COCO comes from."""

from __future__ import annotations

import json

from conftest import COCO_DIR, requires_coco, requires_yolox, run_in_process


@requires_coco
@requires_yolox
def test_the_sites_backend_name_onnx_runs_onnxruntime(tmp_path):
    result = run_in_process("run", "--backend", "onnx", "--limit", "2", "--warmup-batches", "1", "--warmup-seconds",
                            "0", "--min-timed-batches", "1", "--no-energy", "--draw-images", "0", "--coco-dir",
                            str(COCO_DIR), "--output-dir", str(tmp_path), "--json")
    assert result.returncode == 0, result.stderr
    run = json.loads(next(tmp_path.glob("*/run.json")).read_text())
    assert run["config"]["backends"] == ["onnxruntime"]
    sub = json.loads(next(tmp_path.glob("*/submissions/*.json")).read_text())
    assert sub["runtime"]["format"] == "onnx"


def test_refusals_say_what_exists():
    backend = run_in_process("run", "--backend", "tensorflow")
    assert backend.returncode == 2 and "use pytorch, onnxruntime" in backend.stderr and "tensorrt" in backend.stderr
    mps = run_in_process("run", "--device", "mps")
    assert mps.returncode == 2 and "--device mps (Apple GPUs) is not supported yet" in mps.stderr
    typo = run_in_process("run", "--model", "yolox-nan")
    assert typo.returncode == 2 and "did you mean yolox-nano" in typo.stderr
    assert "ssdlite" not in typo.stderr  # no wall of ids: the list command is named instead
    assert "`va-bench models list`" in typo.stderr


def test_models_list_offers_fetch_only_where_models_fetch_can():
    rows = {r["id"]: r for r in json.loads(run_in_process("models", "list", "--json").stdout)}
    assert rows["yolov8n"]["fetch"] is False and rows["yolox-s"]["fetch"] is True and rows["dfine-n"]["fetch"] is True
    table = run_in_process("models", "list", "--family", "yolov8").stdout
    assert "(va-bench models fetch)" not in table
    refused = run_in_process("models", "fetch", "yolov8n")
    assert refused.returncode == 2 and "no download of its own" in refused.stderr


@requires_coco
@requires_yolox
def test_dry_run_writes_nothing_and_plans_what_the_run_does(tmp_path):
    args = ("--limit", "18", "--batch-sizes", "1", "4", "--min-timed-batches", "3", "--warmup-batches", "1",
            "--warmup-seconds", "0", "--no-energy", "--draw-images", "0", "--coco-dir", str(COCO_DIR), "--json")
    out = tmp_path / "out"
    planned = run_in_process("run", "--dry-run", "--output-dir", str(out), *args)
    assert planned.returncode == 0, planned.stderr
    assert not out.exists()
    plan = json.loads(planned.stdout)
    cells = {c["cell"]: c for g in plan["groups"] for c in g["cells"]}
    assert plan["cells"] == 2 and {c["batch_size"] for c in cells.values()} == {1, 4}
    assert cells["yolox-nano onnxruntime fp32 416 b4"]["short_batch"] == 2
    ran = run_in_process("run", "--output-dir", str(out), *args)
    assert ran.returncode == 0, ran.stderr
    for path in out.glob("*/submissions/*.json"):
        sub = json.loads(path.read_text())
        cell = cells[f"yolox-nano onnxruntime fp32 416 b{sub['config']['batch_size']}"]
        assert sub["timing"]["timed_batches"] == cell["timed_batches"]
        assert (sub["timing"]["short_batch"] or {}).get("size") == cell["short_batch"]


def test_memory_timeline_reads_back_with_memory_profilers_own_reader(ort_run):
    """memory.mprof.dat is what `mprof plot` reads: memory-profiler's reader gives memory.csv's samples back."""
    import csv

    mprof = __import__("mprof")
    plan, _ = ort_run
    content = mprof.read_mprofile_file(str(plan.run_dir / "memory.mprof.dat"))
    rows = list(csv.DictReader((plan.run_dir / "memory.csv").open()))
    assert content["mem_usage"] == [round(float(r["rss_mb"]), 4) for r in rows]
    assert content["timestamp"] == [round(float(r["timestamp"]), 4) for r in rows]
    tags = {r["tag"].replace(" ", "_") for r in rows}
    assert set(content["func_timestamp"]) == tags and any(t.startswith("timing_") for t in tags)


@requires_coco
@requires_yolox
def test_a_run_under_the_default_allocator_says_so(tmp_path, monkeypatch):
    args = ("run", "--limit", "2", "--warmup-batches", "1", "--warmup-seconds", "0", "--min-timed-batches", "1",
            "--no-energy", "--draw-images", "0", "--coco-dir", str(COCO_DIR))
    monkeypatch.delenv("GLIBC_TUNABLES", raising=False)
    monkeypatch.delenv("LD_PRELOAD", raising=False)
    default = run_in_process(*args, "--output-dir", str(tmp_path / "a"))
    assert default.returncode == 0 and "glibc malloc with its default thresholds" in default.stderr
    tuned = run_in_process(*args, "--output-dir", str(tmp_path / "b"),
                           env={"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=4294967296"})
    assert tuned.returncode == 0 and "glibc malloc with its default" not in tuned.stderr
    sub = json.loads(next((tmp_path / "a").glob("*/submissions/*.json")).read_text())
    assert sub["environment"]["memory_allocator"]["allocator"] == "glibc (default)"
