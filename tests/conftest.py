"""Shared fixtures. Tests that need the offline assets (../shared) skip with the reason if absent."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Absolute: the Makefile exports these relative to the checkout (../shared/...), and tests symlink to them.
SHARED = Path(os.environ.get("VA_BENCH_SHARED", REPO.parent / "shared")).resolve()
COCO_DIR = Path(os.environ.get("VA_BENCH_COCO", SHARED / "assets" / "coco")).resolve()
YOLOX_NANO = Path(os.environ.get("VA_BENCH_YOLOX_NANO", SHARED / "assets" / "onnx" / "yolox_nano.onnx")).resolve()
CORPUS = Path(os.environ.get("VA_BENCH_CORPUS", SHARED / "corpus" / "vision-analysis")).resolve()
SUBSET_ANNOTATIONS = COCO_DIR / "annotations" / "instances_val2017_subset.json"
VAL_INDEX = COCO_DIR / "annotations" / "val2017_image_index.json"

requires_coco = pytest.mark.skipif(not SUBSET_ANNOTATIONS.is_file(),
                                   reason=f"COCO sample not found at {COCO_DIR}: set VA_BENCH_COCO")
requires_yolox = pytest.mark.skipif(not YOLOX_NANO.is_file(),
                                    reason=f"yolox_nano.onnx not found at {YOLOX_NANO}: set VA_BENCH_YOLOX_NANO")
requires_corpus = pytest.mark.skipif(not (CORPUS / "submissions").is_dir(),
                                     reason=f"vision-analysis corpus not found at {CORPUS}: set VA_BENCH_CORPUS")


@pytest.fixture(autouse=True, scope="session")
def _asset_env():
    """Point the harness at the offline assets (what the Makefile exports)."""
    os.environ["VA_BENCH_COCO"] = str(COCO_DIR)
    os.environ["VA_BENCH_YOLOX_NANO"] = str(YOLOX_NANO)
    yield


def run_benchmark(tmp_path_factory, name: str, **overrides):
    """Run the real pipeline through the library entry points; returns (plan, records)."""
    from harness.config import RunConfig
    from harness.run.scheduler import Scheduler, prepare

    settings = dict(models=["yolox-nano"], subset="sample", warmup_batches=2, warmup_seconds=0.0,
                    min_timed_batches=10, output_dir=str(tmp_path_factory.mktemp(name)), draw_images=1,
                    coco_dir=str(COCO_DIR))
    settings.update(overrides)
    plan = prepare(RunConfig(**settings))
    return plan, Scheduler(plan, ["run", "--test", name]).run().records


@pytest.fixture(scope="session")
def ort_run(tmp_path_factory):
    """yolox-nano on ONNX Runtime, batch 1 and 8, the whole local sample (206 images)."""
    if not (SUBSET_ANNOTATIONS.is_file() and YOLOX_NANO.is_file()):
        pytest.skip("offline assets missing (../shared/assets)")
    return run_benchmark(tmp_path_factory, "ort", backends=["onnxruntime"], batch_sizes=[1, 8], layers=True,
                         profile=True)


@pytest.fixture(scope="session")
def torch_run(tmp_path_factory):
    """yolox-nano on PyTorch (onnx2torch), batch 8, the whole local sample."""
    if not (SUBSET_ANNOTATIONS.is_file() and YOLOX_NANO.is_file()):
        pytest.skip("offline assets missing (../shared/assets)")
    return run_benchmark(tmp_path_factory, "torch", backends=["pytorch"], batch_sizes=[8],
                         min_timed_batches=5, layers=True, profile=True)
