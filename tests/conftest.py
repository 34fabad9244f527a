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
    from harness.run.plan import prepare
    from harness.run.scheduler import Scheduler

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


def run_in_process(*args: str, env: dict[str, str] | None = None, cwd: Path = REPO):
    """`va-bench ARGS` run in this process, returned as the subprocess would be (exit code, stdout, stderr).

    A subprocess pays ~5 s of imports (torch, onnxruntime, cv2) per call; most CLI tests need one call each.
    What a command changes process-wide is restored: cwd, environment, argv, torch's thread count, the
    backend options, signal handlers. Warnings go to stderr as in a fresh interpreter (Python's default
    filters, each shown once), not to pytest's recorder. Tests of signals and of killed processes keep a
    real subprocess."""
    import contextlib
    import io
    import signal
    import subprocess
    import sys
    import warnings

    import torch

    from harness import cli

    out, err = io.StringIO(), io.StringIO()
    saved_env, saved_cwd, saved_argv = dict(os.environ), os.getcwd(), sys.argv
    saved_threads = torch.get_num_threads()
    saved_signals = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    code = 0
    try:
        os.environ.update(env or {})
        os.chdir(cwd)
        sys.argv = ["va-bench", *map(str, args)]
        with warnings.catch_warnings(), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            warnings.resetwarnings()  # a fresh interpreter's filters (resetting also forgets "already shown")
            warnings.simplefilter("default")
            for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
                warnings.simplefilter("ignore", category)
            warnings.showwarning = lambda message, category, filename, lineno, file=None, line=None: \
                sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))
            try:
                cli.main()
            except SystemExit as exc:  # as the interpreter does: a string code is printed and means 1
                if isinstance(exc.code, str):
                    err.write(exc.code + "\n")
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        os.chdir(saved_cwd)
        sys.argv = saved_argv
        torch.set_num_threads(saved_threads)
        for s, handler in saved_signals.items():
            signal.signal(s, handler)
    return subprocess.CompletedProcess(["va-bench", *args], code, out.getvalue(), err.getvalue())


def backend_options(**fields):
    """A run's backend options: RunConfig's defaults with `fields` of RunConfig changed (batch_sizes=[1, 4], ...)."""
    from harness.backends import BackendOptions
    from harness.config import RunConfig

    return BackendOptions.from_config(RunConfig(**fields))


def load_core_of(detector, backend, device, precision, input_size, threads=None, **fields):
    """A detector's core on a backend, as a run with RunConfig `fields` would load it (on that device)."""
    from harness.backends import load_detector_core

    fields.setdefault("device", "cuda" if getattr(device, "is_cuda", False) else "cpu")

    return load_detector_core(detector, backend, device, precision, input_size, options=backend_options(**fields),
                              threads=threads)


def load_source(source, backend, device, precision, input_size, threads=None, **fields):
    """A CoreSource loaded on a backend, as a run with RunConfig `fields` would load it (on that device)."""
    from harness.backends import load_core

    fields.setdefault("device", "cuda" if getattr(device, "is_cuda", False) else "cpu")

    return load_core(source, backend, device, precision, input_size, options=backend_options(**fields),
                     threads=threads)


def coco_from(dataset: dict):
    """A pycocotools COCO index of a dataset dict (quietly: COCO prints its progress)."""
    import contextlib
    import io

    from pycocotools.coco import COCO

    coco = COCO()
    coco.dataset = dataset
    with contextlib.redirect_stdout(io.StringIO()):
        coco.createIndex()
    return coco
