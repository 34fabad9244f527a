"""A run at the speed of its work: image-bytes cache, detections streamed to disk, start-up recorded apart,
each cell scored on its own detections, and the tools of `make bench-run` / `make bench-memory`."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import COCO_DIR, REPO, YOLOX_NANO, requires_coco, requires_yolox, run_benchmark

from harness.bench.synthetic_coco import FIRST_ID, build_tree
from harness.data.cache import ImageBytes
from harness.data.coco import CocoDataset
from harness.errors import UsageError
from harness.eval.coco_eval import evaluate_bbox, evaluate_bbox_file
from harness.files import JsonArrayWriter, NonFiniteNumberError
from harness.results.submission import build_submission

PLUGIN = Path(__file__).parent / "plugins" / "batch_dependent_detector.py"
FAST = dict(warmup_batches=1, warmup_seconds=0.0, min_timed_batches=2, layers=False, profile=False, energy=False,
            draw_images=0, limit=16)


@pytest.fixture(scope="module")
def cache_runs(tmp_path_factory):
    """yolox-nano on ONNX Runtime, 16 images, batch 8: once decoding from memory, once from disk."""
    if not (COCO_DIR.is_dir() and YOLOX_NANO.is_file()):
        pytest.skip("offline assets missing (../shared/assets)")
    return {mode: run_benchmark(tmp_path_factory, f"cache-{mode}", backends=["onnxruntime"], batch_sizes=[8],
                                cache_images=mode, **FAST) for mode in ("auto", "off")}


def test_cached_images_give_identical_detections(cache_runs):
    files = {}
    for mode, (plan, records) in cache_runs.items():
        (record,) = records
        assert record.environment["images"]["decode_from"] == ("memory" if mode == "auto" else "disk")
        files[mode] = (plan.run_dir / record.accuracy.detections_file).read_bytes()
    assert len(json.loads(files["auto"])) > 100  # a real detector's detections, not an empty file
    assert files["auto"] == files["off"]


def test_startup_is_recorded_apart_from_the_timings(cache_runs):
    plan, (record,) = cache_runs["auto"]
    startup = record.environment["startup"]
    for key in ("imports_s", "process_start_to_load_s", "image_cache_s", "model_load_s", "model_stats_s"):
        assert isinstance(startup[key], float) and startup[key] >= 0, key
    assert startup["process_start_to_load_s"] >= startup["imports_s"] > 0
    doc = build_submission(record)
    assert doc["environment"]["startup"] == startup and doc["environment"]["images"]["cache_images"] == "auto"


def test_detections_file_is_what_was_scored(cache_runs):
    """The streamed file is valid COCO results JSON, and pycocotools on it gives the cell's accuracy block."""
    plan, (record,) = cache_runs["off"]
    detections = json.loads((plan.run_dir / record.accuracy.detections_file).read_text())
    assert len(detections) == record.accuracy.num_detections
    ids = list(plan.variant.image_ids)
    assert evaluate_bbox(plan.dataset.coco, detections, ids, plan.config.evaluator) == record.accuracy.stats
    # and pycocotools', the reference, to the last bits of a float mean
    assert evaluate_bbox(plan.dataset.coco, detections, ids) == pytest.approx(record.accuracy.stats, abs=1e-12)


@pytest.mark.parametrize("images", [16, 5])
def test_evaluation_by_category_groups_is_pycocotools_exactly(cache_runs, images, tmp_path):
    """Bounded-memory evaluation (categories a few at a time, the file parsed object by object) gives
    bit-identical statistics to one pycocotools pass over the whole list, also over a subset of images
    and with a group that has no detections at all."""
    plan, (record,) = cache_runs["off"]
    path = plan.run_dir / record.accuracy.detections_file
    ids = list(plan.variant.image_ids)[:images]
    detections = [d for d in json.loads(path.read_text()) if d["image_id"] in ids]
    reference = evaluate_bbox(plan.dataset.coco, detections, ids)
    assert reference["mAP_50_95"] > 0.1
    for pairs in (None, images * 3, 1):  # one group; 3 categories per group; one category per group
        assert evaluate_bbox_file(plan.dataset.coco, path, ids, pairs_per_chunk=pairs) == reference
        # faster-coco-eval, in the same groups: pycocotools' numbers (its default evaluator's proof)
        faster = evaluate_bbox_file(plan.dataset.coco, path, ids, "faster-coco-eval", pairs_per_chunk=pairs)
        assert faster == pytest.approx(reference, abs=1e-12)
    (tmp_path / "empty.json").write_text("[]")
    assert set(evaluate_bbox_file(plan.dataset.coco, tmp_path / "empty.json", ids).values()) == {0.0}
    for bad, why in (('[{"image_id": 1}]', "result 0 is not a bbox result"),
                     ('[{"image_id": 1, "category_id": 1, "bbox": [1, 2, 3, 4], "score": 0.5}, '
                      '{"image_id": 1, "category_id": 1, "bbox": [1, 2, 3], "score": 0.5}]',
                      "result 1 is not a bbox result .bbox has 3 numbers"),
                     ('{"annotations": []}', "is not a COCO results array")):
        (tmp_path / "bad.json").write_text(bad)
        with pytest.raises(ValueError, match=why):
            evaluate_bbox_file(plan.dataset.coco, tmp_path / "bad.json", ids)


@requires_coco
def test_each_cell_is_scored_on_its_own_detections(tmp_path_factory):
    """A plugin whose boxes depend on the batch size: each cell's accuracy is pycocotools on its own file."""
    plan, records = run_benchmark(tmp_path_factory, "own-batch", models=[f"{PLUGIN}:make"], backends=["pytorch"],
                                  batch_sizes=[1, 2], **FAST)
    by_batch = {r.cell.batch_size: r for r in records}
    ids = list(plan.variant.image_ids)
    for size, record in by_batch.items():
        acc = record.accuracy
        assert acc.batch_size == size and f"b{size}" in acc.detections_file
        detections = json.loads((plan.run_dir / acc.detections_file).read_text())
        assert evaluate_bbox(plan.dataset.coco, detections, ids) == acc.stats
        whole = [d["bbox"] == [0.0, 0.0, plan.dataset.coco.imgs[d["image_id"]]["width"],
                               plan.dataset.coco.imgs[d["image_id"]]["height"]] for d in detections]
        assert all(whole) if size == 1 else not any(whole)
    assert by_batch[1].accuracy.stats != by_batch[2].accuracy.stats
    assert by_batch[2].accuracy.same_detections_as is None  # other detections: scored anew


def test_json_array_writer_streams_and_is_atomic(tmp_path):
    path = tmp_path / "d" / "dets.json"
    with JsonArrayWriter(path) as out:
        out.extend([{"a": 1}, {"a": 2}])
        out.extend([])
        out.extend([{"a": 3}])
        assert not path.exists()  # only under its final name once complete
    assert json.loads(path.read_text()) == [{"a": 1}, {"a": 2}, {"a": 3}] and out.count == 3
    with JsonArrayWriter(tmp_path / "empty.json"):
        pass
    assert json.loads((tmp_path / "empty.json").read_text()) == []
    with pytest.raises(NonFiniteNumberError), JsonArrayWriter(tmp_path / "nan.json") as out:
        out.extend([{"score": float("nan")}])
    with pytest.raises(RuntimeError), JsonArrayWriter(tmp_path / "broken.json") as out:
        out.extend([{"a": 1}])
        raise RuntimeError("killed mid-cell")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "empty.json"]  # no partial or temp file left


def test_detections_encoded_directly_read_back_as_to_coco():
    """The cell's detections file is written from arrays without building a dict per result: every result must
    read back equal to `to_coco`'s (json.dumps), with classes mapped to no category left out and NaN refused."""
    from harness.records import ImageDetections, coco_json_texts

    rng = np.random.default_rng(7)
    xy = rng.uniform(-5, 700, (300, 2)).astype(np.float32)
    boxes = np.concatenate([xy, xy + rng.exponential(40, (300, 2)).astype(np.float32)], 1)
    boxes[:3] = [[0.0, 0.0, 0.0, 0.0], [1e-4, 2.0004999, 1e-7, 3.0], [123.45650, 0.0005, 640.0, 480.0]]
    scores = rng.uniform(0, 1, 300).astype(np.float32)
    scores[:2] = [1e-7, 0.9999996]
    det = ImageDetections(139, boxes, scores, rng.integers(0, 4, 300))
    class_map = (1, -1, 7, 90)
    texts = coco_json_texts(det, class_map)
    assert [json.loads(t) for t in texts] == json.loads(json.dumps(det.to_coco(class_map)))
    assert len(texts) == int((det.labels != 1).sum())
    with_masks = ImageDetections(5, boxes[:2], scores[:2], np.array([0, 2]),
                                 masks=[{"size": [4, 4], "counts": "04"}] * 2)
    assert [json.loads(t) for t in coco_json_texts(with_masks, class_map)] == with_masks.to_coco(class_map)
    boxes[5, 2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        coco_json_texts(det, class_map)


def test_a_category_id_0_is_written_and_a_box_is_its_corner_and_size():
    """Dataset category ids are 0 or more (a dataset of one's own may number its classes from 0): a class mapped
    to category 0 is written, one mapped to a negative id is not, by both writers, masks or none; each box
    [x1, y1, x2, y2] is written [x1, y1, x2 - x1, y2 - y1] (by hand below)."""
    from dataclasses import replace

    from harness.records import ImageDetections, coco_json_texts

    det = ImageDetections(3, np.array([[10.0, 20.0, 50.5, 80.25], [1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 105.0, 56.0]],
                                      np.float32), np.array([0.5, 0.25, 0.125], np.float32), np.array([0, 1, 2]))
    class_map = (0, -1, 4)
    want = [{"image_id": 3, "category_id": 0, "bbox": [10.0, 20.0, 40.5, 60.25], "score": 0.5},
            {"image_id": 3, "category_id": 4, "bbox": [5.0, 6.0, 100.0, 50.0], "score": 0.125}]
    assert [json.loads(t) for t in coco_json_texts(det, class_map)] == want
    assert det.to_coco(class_map) == want
    masks = [{"size": [90, 120], "counts": f"{k}"} for k in range(3)]
    with_masks = [{**want[0], "segmentation": masks[0]}, {**want[1], "segmentation": masks[2]}]
    assert [json.loads(t) for t in coco_json_texts(replace(det, masks=masks), class_map)] == with_masks
    assert replace(det, masks=masks).to_coco(class_map) == with_masks


def test_detections_digest_changes_with_anything_the_file_would_hold():
    """A cell whose detections have an earlier cell's digest copies that cell's file: equal digests must mean equal
    encodings, and any change to what the file holds (id, a box, a score, a label, a dtype, a mask) a new digest."""
    from dataclasses import replace

    from harness.records import ImageDetections, coco_json_texts, detections_digest

    rng = np.random.default_rng(3)
    boxes = rng.uniform(0, 600, (40, 4)).astype(np.float32)
    det = ImageDetections(7, boxes, rng.uniform(0, 1, 40).astype(np.float32), rng.integers(0, 4, 40))
    same = ImageDetections(7, boxes.copy(), det.scores.copy(), det.labels.copy())
    assert detections_digest([det]) == detections_digest([same])
    assert coco_json_texts(det, (1, 2, 3, 4)) == coco_json_texts(same, (1, 2, 3, 4))
    nudged = boxes.copy()
    nudged[39, 3] = np.nextafter(nudged[39, 3], np.float32(1e9))
    masked = [{"size": [4, 4], "counts": "04"}] * 40
    variants = [replace(det, image_id=8), replace(det, boxes=nudged), replace(det, scores=det.scores * 0.5),
                replace(det, labels=(det.labels + 1) % 4), replace(det, boxes=boxes.astype(np.float64)),
                replace(det, masks=masked), replace(det, masks=[{"size": [4, 4], "counts": "05"}] * 40)]
    digests = {detections_digest([v]) for v in variants}
    assert len(digests) == len(variants) and detections_digest([det]) not in digests
    assert detections_digest([det, same]) != detections_digest([det])


@requires_coco
@requires_yolox
def test_an_onnx_runtime_run_never_imports_torchvision_and_its_nms_is_torchvisions(tmp_path):
    """torchvision's package import costs ~2 s of a run's start (torch._dynamo); the NMS kernel is loaded alone.
    In a fresh process: a real run leaves torchvision unimported, and the kernel it used keeps the same boxes as
    `torchvision.ops.nms` imported afterwards."""
    script = f"""
import sys, runpy, torch
import harness.process_exit
harness.process_exit.leave = sys.exit  # the CLI's fast exit would end this script before its checks
sys.argv = ["va-bench", "run", "--batch-sizes", "8", "--subset", "sample", "--limit", "8", "--no-layers",
            "--no-profile", "--no-energy", "--draw-images", "0", "--warmup-batches", "1", "--warmup-seconds", "0",
            "--min-timed-batches", "2", "--output-dir", {str(tmp_path)!r}]
try:
    runpy.run_module("harness", run_name="__main__")
except SystemExit as exc:
    assert not exc.code, exc.code
assert "torchvision" not in sys.modules and "torch._dynamo" not in sys.modules, "torchvision was imported"
from harness.pipeline.nms_kernel import nms
g = torch.Generator().manual_seed(0)
xy = torch.rand(2000, 2, generator=g) * 400
boxes = torch.cat([xy, xy + torch.rand(2000, 2, generator=g) * 80], 1)
scores = torch.rand(2000, generator=g)
ours = nms(boxes, scores, 0.45)
import torchvision.ops
assert torch.equal(ours, torchvision.ops.nms(boxes, scores, 0.45)) and 50 < len(ours) < 2000
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-2000:]


@requires_coco
def test_image_bytes_cache_follows_its_budget(tmp_path):
    dataset = CocoDataset(COCO_DIR)
    records = dataset.records(dataset.variant("sample", 4))
    total = sum(r.path.stat().st_size for r in records)
    cached = ImageBytes(records, "auto", budget_bytes=total)
    assert cached.decision.decode_from == "memory"
    over = ImageBytes(records, "auto", budget_bytes=total - 1)
    assert over.decision.decode_from == "disk" and "exceed the cache budget" in over.decision.reason
    off = ImageBytes(records, "off")
    assert off.decision.decode_from == "disk" and off.decision.reason == "--cache-images off"
    for r in records:
        assert cached.read(r) == over.read(r) == off.read(r) == r.path.read_bytes()


@requires_coco
def test_synthetic_tree_repeats_the_sample_under_new_ids(tmp_path):
    tree = build_tree(tmp_path / "tree", 300, COCO_DIR)
    source = json.loads((COCO_DIR / "annotations" / "instances_val2017_subset.json").read_text())
    doc = json.loads((tree / "annotations" / "instances_val2017.json").read_text())
    assert [img["id"] for img in doc["images"]] == list(range(FIRST_ID, FIRST_ID + 300))
    originals = sorted(source["images"], key=lambda img: img["id"])
    per_image = {}
    for ann in source["annotations"]:
        per_image[ann["image_id"]] = per_image.get(ann["image_id"], 0) + 1
    assert len(doc["annotations"]) == sum(per_image.get(originals[k % len(originals)]["id"], 0) for k in range(300))
    assert len({a["id"] for a in doc["annotations"]}) == len(doc["annotations"])
    first, again = doc["images"][0], doc["images"][len(originals)]  # the same picture under two ids
    assert (tree / "val2017" / first["file_name"]).read_bytes() == (tree / "val2017" / again["file_name"]).read_bytes()
    assert (first["width"], first["height"]) == (again["width"], again["height"])
    dataset = CocoDataset(tree)
    assert dataset.variant("sample").num_images == 300 and dataset.variant("sample", 40).name == "subset40"
    with pytest.raises(UsageError, match="inside the repository"):
        build_tree(REPO / "harness" / "synthetic", 3, COCO_DIR)


def test_plain_loop_shares_no_code_with_the_harness():
    tree = ast.parse((REPO / "harness" / "bench" / "plain_loop.py").read_text())
    modules = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not any(m.split(".")[0] == "harness" for m in modules), modules


@requires_yolox
def test_plain_loop_agrees_with_the_run_on_map(cache_runs):
    """The yardstick of `make bench-run` does the same accuracy work: same mAP on the same 16 images."""
    plan, (record,) = cache_runs["auto"]
    result = subprocess.run([sys.executable, "-m", "harness.bench.plain_loop", "--limit", "16", "--coco-dir",
                             str(COCO_DIR), "--onnx", str(YOLOX_NANO)], capture_output=True, text=True, cwd=REPO,
                            timeout=600)
    assert result.returncode == 0, result.stderr
    loop = json.loads(result.stdout.strip().splitlines()[-1])
    assert loop["images"] == 16
    assert abs(loop["mAP_50_95"] - record.accuracy.stats["mAP_50_95"]) <= 0.001
    assert abs(loop["mAP_50"] - record.accuracy.stats["mAP_50"]) <= 0.001


def test_validate_does_not_import_torch(tmp_path):
    """`va-bench validate` through the real CLI entry point loads neither torch nor the pipeline."""
    (tmp_path / "x.json").write_text("{}")
    code = ("import sys\nfrom harness.cli import main\nsys.argv = ['va-bench', 'validate', sys.argv[1]]\n"
            "try:\n    main()\nexcept SystemExit as exc:\n    code = exc.code\n"
            "bad = [m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'torchvision', 'onnxruntime', "
            "'harness.pipeline', 'harness.models', 'harness.run.scheduler', 'harness.run.executor'))]\n"
            "print(code, bad)\nsys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code, str(tmp_path / "x.json")], capture_output=True, text=True,
                            cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.splitlines()[-1] == "1 []"  # validate ran, found the empty submission wanting


@requires_coco
@requires_yolox
@pytest.mark.parametrize("decode", ["in-path", "pre-decoded"])
def test_overhead_bench_decodes_inside_the_timed_path_when_asked(decode):
    """`make bench-overhead DEVICE=cuda` decodes inside the timed path (auto on CUDA); the CPU default hands
    the pipeline decoded images. What each measured is recorded; a decode substep only where it was timed."""
    from harness.bench.overhead import measure

    result = measure("yolox-nano", "onnxruntime", 2, rounds=1, iterations=2, device_spec="cpu", workers=[1],
                     decode=decode, preprocess="torch")
    assert result["decode"].startswith("in the timed path" if decode == "in-path" else "pre-decoded")
    assert result["preprocess"]["implementation"] == "torch"
    assert ("preprocess.decode" in result["latency_mode"]["stages_ms_p50"]) is (decode == "in-path")
    assert result["forward_images_per_s"] > 0 and result["overlapped_mode"]["images_per_s"] > 0
    spent = result["overlapped_mode"]["forward_thread"]  # where the forward's thread spent the overlapped streams
    assert spent["ms_per_batch_p50"]["forward"] > 0 and spent["forward_vs_alone"] > 0


def test_overhead_bench_refuses_a_finishing_bound_below_one(capsys):
    from harness.bench.overhead import main

    with pytest.raises(SystemExit) as exit_info:
        main(["--finishes-in-flight", "0"])
    assert exit_info.value.code == 2
    assert "--finishes-in-flight 0: use a positive number of batches" in capsys.readouterr().err
