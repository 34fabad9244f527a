"""What a new user trips on first: the site's backend name, devices that are not supported, a typo in a model id,
which models `models fetch` can get, and where COCO comes from."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import COCO_DIR, REPO, requires_coco, requires_yolox, run_in_process


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
    # what aggregate reads of each id, for a script that plans a sweep: its published size and its size order
    from harness.catalogue import size_ranks

    assert rows["yolox-nano"]["input_size"] == 416 and rows["yolov8s"]["size_order"] == {"family": "yolov8", "rank": 1}
    assert all(r["size_order"] == ({"family": size_ranks()[i][0], "rank": size_ranks()[i][1]} if i in size_ranks()
                                   else None) for i, r in rows.items())
    table = run_in_process("models", "list", "--family", "yolov8").stdout
    assert "(va-bench models fetch)" not in table
    refused = run_in_process("models", "fetch", "yolov8n")
    assert refused.returncode == 2 and "no download of its own" in refused.stderr
    narrow = run_in_process("models", "list", env={"COLUMNS": "80"}).stdout  # every id whole, the table in 80
    lines = narrow.splitlines()
    assert max(len(line) for line in lines) <= 80 and "…" not in narrow
    assert set(rows) <= {line.split()[0] for line in lines if line.strip()}
    none = run_in_process("models", "list", "--family", "yolox", "--task", "segment")
    assert none.returncode == 0 and none.stdout.startswith("no segment model in the yolox family")


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
    openvino = run_in_process("run", "--dry-run", "--output-dir", str(out), "--backend", "openvino", *args)
    assert [g["loads"] for g in json.loads(openvino.stdout)["groups"]] == ["its ONNX graph, converted for openvino"]
    cells = {c["cell"]: c for g in plan["groups"] for c in g["cells"]}
    assert plan["num_cells"] == 2 and {c["batch_size"] for c in cells.values()} == {1, 4}
    assert cells["yolox-nano onnxruntime fp32 416 b4"]["short_batch"] == 2
    assert {g["loads"] for g in plan["groups"]} == {"its ONNX graph"}
    (out / "taken").mkdir(parents=True)  # a run folder of that name: the real run would refuse it, so does the plan
    refused = run_in_process("run", "--dry-run", "--output-dir", str(out), "--run-id", "taken", *args)
    assert refused.returncode == 2 and "already has a run taken" in refused.stderr
    text = run_in_process("run", "--dry-run", "--output-dir", str(out), *args[:-1])  # the seconds are a cap
    assert "warm-up: >= 1 batches, then until the batch times settle\n  or 0.0 s since it began" in text.stdout, \
        text.stdout
    assert plan["warnings"] == [] and "warning" not in text.stdout
    # a --limit above the variant's size: all of it is scored, under its own name, and the plan says so
    above = run_in_process("run", "--dry-run", "--output-dir", str(out), *args[:-1], "--limit", "5000")
    assert "sample (206 images)" in above.stdout, above.stdout
    assert "warning: --limit 5000: the sample variant has 206 images; all of them are scored" in above.stdout
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


@requires_coco
@requires_yolox
def test_target_ci_times_until_the_interval_is_reached_or_says_why_not(tmp_path_factory):
    """--target-ci: the recorded extent (the CI's farther end from the median) is the one scipy's bootstrap gives on
    the timed batches (their block means where they drift together); a reachable
    target is met (more batches than one pass), an unreachable one stops at --max-seconds with a warning; either
    way every image is scored exactly once."""
    import numpy as np
    import pytest
    from conftest import run_benchmark
    from scipy.stats import bootstrap

    from harness.measure.stats import autocorrelated, block_means

    quiet = dict(limit=16, batch_sizes=[1], min_timed_batches=5, accuracy=False, energy=False, memory=False,
                 draw_images=0)
    _, (met,) = run_benchmark(tmp_path_factory, "target-ci-met", target_ci=25.0, max_seconds=120, **quiet)
    # two images: past --min-timed-batches and through the images more than once within 2 s on a slow machine too
    _, (short,) = run_benchmark(tmp_path_factory, "target-ci-short", target_ci=0.001, max_seconds=2,
                                **{**quiet, "limit": 2})
    for record, images in ((met, 16), (short, 2)):
        samples = np.asarray(record.timing.batch_samples_ms)
        if autocorrelated(samples):  # this box's batch times often drift together: judged on their block means
            samples = block_means(samples)
        low, high = bootstrap((samples,), np.median, method="percentile", n_resamples=2000, vectorized=True,
                              random_state=np.random.default_rng(0)).confidence_interval
        median = np.median(samples)
        truth = 100 * max(median - low, high - median) / median  # the farther end: both within the target
        # the recorded samples are rounded to 1e-4 ms: two such units of the median (in %) beside the record's own
        # rounding, which matter where a batch takes a fraction of a millisecond
        assert record.timing.target_ci["extent_pct"] == pytest.approx(truth, abs=1e-3 + 200 * 1e-4 / median)
        assert record.timing.short_batch is None and record.timing.timed_images >= images
    assert met.timing.target_ci["met"] and met.timing.target_ci["extent_pct"] <= 25.0
    assert not short.timing.target_ci["met"] and short.timing.target_ci["stopped"] == "--max-seconds"
    assert short.timing.timed_batches > 5 and any("--target-ci 0.001" in w for w in short.timing.warnings)


@requires_coco
@requires_yolox
def test_min_seconds_times_each_cell_for_that_long_and_scores_each_image_once(tmp_path_factory):
    """--min-seconds: latency mode and an overlapped stream alike time batches until that long has passed (the
    variant cycled past one pass, the stream told to stop starting batches then); the detections file holds each
    of the 2 images once."""
    import pytest
    from conftest import run_benchmark

    # two images: cycled past one pass within 1.5 s on a slow machine too
    quiet = dict(limit=2, batch_sizes=[1], min_timed_batches=2, energy=False, memory=False, draw_images=0)
    plan, (latency,) = run_benchmark(tmp_path_factory, "min-seconds", min_seconds=1.5, **quiet)
    overlapped_plan, (overlapped,) = run_benchmark(tmp_path_factory, "min-seconds-overlap", min_seconds=1.5,
                                                   overlap=True, **quiet)
    assert latency.timing.timed_seconds >= 1.5 and latency.timing.timed_batches > 2
    # the timed batches' own times add up to no more than the pass's wall time
    assert sum(latency.timing.batch_samples_ms) / 1000 <= latency.timing.timed_seconds + 1e-3
    assert overlapped.timing.timed_seconds >= 1.5 and overlapped.timing.timed_batches > 2
    assert sum(overlapped.timing.interval_samples_ms) / 1000 == pytest.approx(overlapped.timing.timed_seconds,
                                                                              abs=2e-3)
    for run_plan, record in ((plan, latency), (overlapped_plan, overlapped)):
        detections = json.loads((run_plan.run_dir / record.artifacts["detections"]).read_text())
        # scored once: a second pass over an image would repeat each of its detections exactly
        keys = [(d["image_id"], d["category_id"], tuple(d["bbox"]), d["score"]) for d in detections]
        assert len(set(keys)) == len(keys) and len({k[0] for k in keys}) <= 2
        assert record.timing.timed_images > 2


def test_min_seconds_refuses_a_batch_cap_and_a_longer_minimum_than_the_target_cis_maximum():
    import pytest

    from harness.config import RunConfig
    from harness.errors import UsageError
    from harness.run.plan import check_runtimes

    for options, why in ((dict(max_timed_batches=5), "give one of them"),
                         (dict(target_ci=2.0, max_seconds=10), "longer than --max-seconds 10")):
        with pytest.raises(UsageError, match=why):
            check_runtimes(RunConfig(min_seconds=20, **options))
    refused = run_in_process("run", "--min-seconds", "0")
    assert refused.returncode == 2 and "--min-seconds" in refused.stderr


def test_scenario_names_the_modes_and_target_ci_refuses_a_batch_cap():
    from harness.config import RunConfig
    from harness.errors import UsageError
    from harness.run.plan import check_runtimes

    assert RunConfig(scenario="offline").overlap and not RunConfig(scenario="single-stream").overlap
    clash = run_in_process("run", "--scenario", "offline", "--no-overlap")
    assert clash.returncode == 2 and "contradicts --no-overlap" in clash.stderr
    for clash, why in ((dict(max_timed_batches=5), "give one of them"), (dict(overlap=True), "drop --overlap")):
        try:
            check_runtimes(RunConfig(target_ci=2.0, **clash))
        except UsageError as exc:
            assert why in str(exc)
        else:
            raise AssertionError(f"--target-ci with {clash} was not refused")
    assert RunConfig.model_validate({"min_timed_batches": 7}).min_timed_batches == 7
    iterations = run_in_process("run", "--iterations", "0")  # an alias: the same field, the same check
    assert iterations.returncode == 2 and "min" in iterations.stderr.lower(), iterations.stderr


@requires_yolox
def test_synthetic_input_times_a_model_with_no_dataset_anywhere(tmp_path):
    """`--input synthetic`: no COCO folder exists, yet both cells run the whole pipeline on generated images (no
    decode substep, said in the record), batch 4 reproduces batch 1 on them, nothing is scored, and the
    submissions are refused for publication (validate exit 1, aggregate leaves them out)."""
    env = {"VA_BENCH_COCO": str(tmp_path / "no-such-coco"), "VA_BENCH_DATASETS": str(tmp_path / "none")}
    result = run_in_process("run", "--input", "synthetic", "--limit", "8", "--batch-sizes", "1", "4",
                            "--warmup-batches", "1", "--warmup-seconds", "0", "--min-timed-batches", "2",
                            "--no-energy", "--output-dir", str(tmp_path), "--run-id", "synthetic", env=env)
    assert result.returncode == 0, result.stderr
    run = json.loads((tmp_path / "synthetic" / "run.json").read_text())
    assert run["dataset"]["id"] == "synthetic" and run["dataset"]["root"] is None
    subs = [json.loads(p.read_text()) for p in sorted((tmp_path / "synthetic" / "submissions").glob("*.json"))]
    assert len(subs) == 2
    for sub in subs:
        assert sub["dataset"]["variant"] == "synthetic8" and sub["runtime"]["preprocess"]["decode"] == "skipped"
        assert "preprocess.decode" not in sub["timing"]["stages_ms"] and "forward" in sub["timing"]["stages_ms"]
        assert sub["accuracy"]["status"] == "unavailable" and "synthetic input" in sub["accuracy"]["reason"]
        # its detections are written, unscored, and the submission says where
        assert (tmp_path / "synthetic" / sub["artifacts"]["detections"]).is_file() and sub["eval"]["detections"] is None
    b4 = next(s for s in subs if s["config"]["batch_size"] == 4)
    assert b4["batch_invariance"]["match_rate"] == 1.0 and b4["batch_invariance"]["detections_reference"] > 0
    checked = run_in_process("validate", str(tmp_path / "synthetic" / "submissions"))
    assert checked.returncode == 1 and "synthetic-input" in checked.stdout
    assert "(schema)" not in checked.stdout, checked.stdout  # refused for what it is, and only for that
    from harness.results.aggregate import aggregate
    from harness.results.validate import validate_paths

    board = aggregate(validate_paths([tmp_path / "synthetic" / "submissions"], None).reports)
    assert board["counts"]["excluded"] == 2 and not board["cube"]
    refused = run_in_process("run", "--input", "synthetic", "--dataset", str(tmp_path))
    assert refused.returncode == 2 and "--dataset does not apply" in refused.stderr
    # options of the scoring where nothing is scored: refused on the command line, recorded at their default
    # (what ran) from a preset, never recorded as if they had been applied
    for args, words in ((["--input", "synthetic", "--map-ci", "1000"], "--map-ci applies to --input dataset only"),
                        (["--no-accuracy", "--eval-max-det", "300"], "--eval-max-det applies to --accuracy only")):
        refused = run_in_process("run", "--dry-run", *args)
        assert refused.returncode == 2 and words in refused.stderr, refused.stderr
    from harness.config import build_config

    unscored = build_config({"map_ci": 1000, "eval_max_det": 300, "accuracy": False})
    assert (unscored.map_ci, unscored.eval_max_det) == (0, 100)


def test_synthetic_images_are_made_once_before_anything_is_timed(monkeypatch):
    """Making noise is not preprocessing: every distinct image is generated at the first one asked for (the
    warm-up's) and reused in turn past 64; no later batch generates any."""
    import numpy as np

    from harness.data.synthetic import SyntheticDataset

    dataset = SyntheticDataset((32, 48))
    records = dataset.records(dataset.variant("synthetic", 100))
    made = []
    generate = dataset._generate
    monkeypatch.setattr(dataset, "_generate", lambda k: made.append(k) or generate(k))
    first = dataset.image(records[0])
    assert made == list(range(1, 65)) and first.shape == (32, 48, 3)
    assert all(dataset.image(r) is dataset.image(records[i % 64]) for i, r in enumerate(records))
    assert len(made) == 64 and not np.array_equal(dataset.image(records[0]), dataset.image(records[1]))
    assert dataset.describe()["generator"]["distinct_images"] == 64
    small = SyntheticDataset((8, 8))
    small.variant("synthetic", 8)
    assert small.describe()["generator"]["distinct_images"] == 8


@requires_coco
@requires_yolox
def test_repeats_measure_each_cell_in_fresh_processes(tmp_path):
    """--repeats 2: the run's own median and a fresh process's (its own run folder under repeats/, read back
    here) in timing.repeats, with their spread; the extra process's files are not the run's submissions."""
    # from a folder holding another `harness` package (another checkout): the extra process imported that one
    decoy = tmp_path / "elsewhere" / "harness"
    decoy.mkdir(parents=True)
    (decoy / "__init__.py").write_text("raise SystemExit('error: the harness of another checkout')\n")
    result = run_in_process("run", "--repeats", "2", "--limit", "8", "--warmup-batches", "1", "--warmup-seconds",
                            "0", "--min-timed-batches", "3", "--no-energy", "--draw-images", "0", "--coco-dir",
                            str(COCO_DIR), "--output-dir", str(tmp_path), "--run-id", "repeated", cwd=decoy.parent)
    assert result.returncode == 0, result.stderr
    run = tmp_path / "repeated"
    (path,) = list((run / "submissions").glob("*.json"))
    sub = json.loads(path.read_text())
    block = sub["timing"]["repeats"]
    (child,) = list((run / "repeats" / "process-2" / "submissions").glob("*.json"))
    other = json.loads(child.read_text())
    assert block["batch_ms_p50"] == [round(sub["timing"]["batch_ms"]["p50"], 4),
                                     round(other["timing"]["batch_ms"]["p50"], 4)]
    low, high = sorted(block["batch_ms_p50"])
    assert block["spread_pct"] == round(100 * (high - low) / ((low + high) / 2), 3)
    assert other["accuracy"]["status"] == "unavailable" and "processes" in result.stdout
    from harness.results.reader import collect_files

    files, _ = collect_files([run])
    assert files == [path]  # the run's one submission; the extra process's are its working files


@requires_coco
def test_a_failed_extra_process_fails_the_run_and_says_so_in_json(tmp_path):
    """Its samples are missing from the cell's figure the user asked for: exit 1 and a --json warning, not only a
    line on stderr while the run went on."""
    plugin = f"{REPO / 'tests' / 'plugins' / 'synthetic_detector.py'}:make_detector_not_in_extra_processes"
    result = run_in_process("run", "--model", plugin, "--backend", "pytorch", "--repeats", "2", "--limit", "4",
                            "--warmup-batches", "1", "--warmup-seconds", "0", "--min-timed-batches", "2", "--no-energy",
                            "--draw-images", "0", "--coco-dir", str(COCO_DIR), "--output-dir", str(tmp_path), "--json",
                            env={"VA_BENCH_TEST_FORWARD_MS": "1"})
    assert result.returncode == 1, result.stderr
    summary = json.loads(result.stdout)
    assert summary["counts"] == {"ok": 1}
    (warning,) = [w for w in summary["warnings"] if w.startswith("--repeats")]
    assert "process 2:" in warning and "does not load in an extra process" in warning
    assert warning.endswith(": its samples are missing")


def test_three_processes_medians_are_summarised_by_their_median(tmp_path, monkeypatch):
    """--repeats 3 with a cell whose own median batch time is 10 ms and whose fresh processes measure 14 and 11 ms:
    timing.repeats lists [10, 14, 11], their median 11 (not the mean 11.67 or the middle entry 14) and the spread
    (14 - 10) / 11."""
    import contextlib
    import subprocess
    from types import SimpleNamespace

    from harness.run import repeats

    coords = {"model": "m", "backend": "onnxruntime", "precision": "fp32", "input_size": [416, 416], "batch_size": 4}

    def write_run(folder, p50):
        (folder / "submissions").mkdir(parents=True)
        (folder / "submissions" / "c.json").write_text(json.dumps({"timing": {"batch_ms": {"p50": p50}}}))
        (folder / "run.json").write_text(json.dumps({"config": {}, "cells": [
            {"cell": "m b4", **coords, "status": "ok", "submission": "submissions/c.json"}]}))

    run = tmp_path / "run"
    write_run(run, 10.0)
    child_p50 = {"process-2": 14.0, "process-3": 11.0}

    def fresh_process(cmd, **kwargs):  # what `va-bench run --run-id process-k` leaves in its run folder
        run_id = cmd[cmd.index("--run-id") + 1]
        write_run(Path(cmd[cmd.index("--output-dir") + 1]) / run_id, child_p50[run_id])
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(repeats, "subprocess", SimpleNamespace(run=fresh_process))
    config = SimpleNamespace(repeats=3, model_dump=lambda mode: {"models": ["m"]})
    progress = SimpleNamespace(task=lambda *a: contextlib.nullcontext(), log=lambda *a: None)
    blocks = repeats.repeat_in_fresh_processes(config, run, {"m b4": "submissions/c.json"}, progress)
    block = json.loads((run / "submissions" / "c.json").read_text())["timing"]["repeats"]
    assert block == blocks["m b4"]
    assert block["batch_ms_p50"] == [10.0, 14.0, 11.0] and block["processes"] == 3
    assert block["median_of_processes_ms"] == 11.0
    assert block["spread_pct"] == round(100 * 4 / 11, 3)



def test_one_process_left_has_no_spread_rather_than_a_spread_of_zero(tmp_path, monkeypatch):
    """--repeats 2 whose extra process failed: one median is left, and one value has no spread between processes
    (null, with why), not a spread of 0 % (which read as processes that agreed exactly); the summary says so."""
    import contextlib
    import subprocess
    from types import SimpleNamespace

    from harness.run import repeats
    from harness.views.tables import repeats_line

    coords = {"model": "m", "backend": "onnxruntime", "precision": "fp32", "input_size": [416, 416], "batch_size": 1}
    run = tmp_path / "run"
    (run / "submissions").mkdir(parents=True)
    (run / "submissions" / "c.json").write_text(json.dumps({"timing": {"batch_ms": {"p50": 16.1654}}}))
    (run / "run.json").write_text(json.dumps({"config": {}, "cells": [
        {"cell": "m b1", **coords, "status": "ok", "submission": "submissions/c.json"}]}))
    monkeypatch.setattr(repeats, "subprocess", SimpleNamespace(
        run=lambda cmd, **kwargs: subprocess.CompletedProcess(cmd, 1, "", "error: the plugin failed\n")))
    config = SimpleNamespace(repeats=2, model_dump=lambda mode: {"models": ["m"]})
    progress = SimpleNamespace(task=lambda *a: contextlib.nullcontext(), log=lambda *a: None)
    block = repeats.repeat_in_fresh_processes(config, run, {"m b1": "submissions/c.json"}, progress)["m b1"]
    assert block["processes"] == 1 and block["batch_ms_p50"] == [16.1654]
    assert block["spread_pct"] is None and "one process" in block["spread_reason"]
    assert block["failed"] == ["process 2: error: the plugin failed"]
    assert repeats_line("m b1", block) == ("m b1: p50 ms/batch in 1 processes: 16.17 (no spread: one process "
                                           "measured the cell (the others failed): no spread between processes)")


def test_an_extra_process_does_not_take_its_run_for_another_gpu_tenant(monkeypatch):
    import os

    from harness.measure.hygiene import own_pids
    from harness.run.repeats import repeat_parent

    monkeypatch.delenv("VA_BENCH_REPEAT_OF", raising=False)
    assert repeat_parent() is None and os.getppid() not in own_pids(parent=repeat_parent())
    monkeypatch.setenv("VA_BENCH_REPEAT_OF", str(os.getppid()))
    monkeypatch.setenv("VA_BENCH_REPEAT_GPU_PIDS", "91200,x")
    assert {os.getpid(), os.getppid(), 91200} <= own_pids(parent=repeat_parent())
    monkeypatch.setenv("VA_BENCH_REPEAT_OF", "1")  # a stale or forged value names no parent
    assert os.getppid() == 1 or repeat_parent() is None


def test_compare_tests_significance_across_process_medians():
    """When both sides were measured in enough processes, the verdict is across the process medians (Mann-Whitney
    on them); with too few to reach p < 0.05 it comes from the batches of one process, as without --repeats."""
    from pathlib import Path

    import numpy as np

    from harness.results.compare import Comparison, Entry, _cell_delta

    def entry(medians):
        doc = {"timing": {"batch_samples_ms": [10.0] * 50, "total_ms": {"p50": 10.0, "p95": 11.0},
                          "repeats": {"batch_ms_p50": medians}}, "throughput": {"images_per_s": 100.0}}
        return Entry(Path("x.json"), doc, {"batch_size": 1}, Path("."), None, None, None)

    slower = _cell_delta("c", {}, entry([10.0, 10.1, 9.9, 10.05, 9.95]), entry([12.0, 12.2, 11.9, 12.1, 12.05]), 0.05)
    assert slower.significance.verdict == "slower" and slower.significance.basis == "processes"
    assert slower.significance.ratio == np.median([12.0, 12.2, 11.9, 12.1, 12.05]) / 10.0
    few = _cell_delta("c", {}, entry([10.0, 10.1, 9.9]), entry([12.0, 12.2, 11.9]), 0.05)
    assert few.significance.basis == "batches"  # 3 a side cannot reach p < 0.05: one process's batches decide
    # the footer says what each kind of verdict weighs
    from rich.console import Console

    from harness.views.compare_view import _performance

    def footer(cells):
        console = Console(record=True, width=200)
        for part in _performance(Comparison("A", "B", cells=cells)):
            console.print(part)
        return console.export_text()

    assert "drift between processes included" in footer([slower]) and "batch samples" not in footer([slower])
    assert "batch samples" in footer([few]) and "drift between processes included" not in footer([few])


@requires_coco
@requires_yolox
def test_cpu_affinity_pins_every_thread_of_the_run_and_restores_them(tmp_path):
    import os

    cores = sorted(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    result = run_in_process("run", "--cpu-affinity", str(cores[0]), "--limit", "2", "--warmup-batches", "1",
                            "--warmup-seconds", "0", "--min-timed-batches", "1", "--no-energy", "--draw-images", "0",
                            "--coco-dir", str(COCO_DIR), "--output-dir", str(tmp_path), "--run-id", "pinned")
    assert result.returncode == 0, result.stderr
    sub = json.loads(next((tmp_path / "pinned" / "submissions").glob("*.json")).read_text())
    pinned = sub["environment"]["cpu_affinity"]
    assert pinned["cores"] == [cores[0]] and pinned["threads_pinned"] == pinned["threads"] > 1
    assert sub["environment"]["threads"]["torch_intra_op"] == 1  # threads follow the pinned cores
    assert os.sched_getaffinity(0) == before  # the process gets its own mask back
    bad = run_in_process("run", "--cpu-affinity", "4096")
    assert bad.returncode == 2 and "not a core this process may use" in bad.stderr
