"""The runtimes that convert the family's graph: OpenVINO (fp32/fp16/int8), ncnn (fp32/fp16, batch 1) and
TorchScript, checked against ONNX Runtime on the real yolox-nano and the sample's real images.

Independent truths: ONNX Runtime's detections and pycocotools' mAP on the same images; libreyolo's seeded
families on ONNX Runtime. With `CI=true` a runtime that is not installed fails these tests instead of
skipping them (`make setup` installs every one).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from conftest import (
    COCO_DIR,
    CORPUS,
    YOLOX_NANO,
    load_core_of,
    load_source,
    requires_coco,
    requires_yolox,
    run_benchmark,
)

from harness.errors import UsageError
from harness.measure.device import parse_device

RUNTIMES = {"openvino": ("openvino", "nncf"), "ncnn": ("ncnn", "pnnx"), "tflite": ("ai_edge_litert", "onnx2tf")}
CPU = parse_device("cpu")


def need(backend: str) -> None:
    """Skip (or, with CI=true, fail) when the runtime's packages are not installed."""
    missing = [m for m in RUNTIMES.get(backend, ()) if importlib.util.find_spec(m) is None]
    if missing:
        message = f"{backend} needs {', '.join(missing)}: pip install 'va-bench[edge]'"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)


@pytest.fixture(autouse=True)
def _weights_cache(tmp_path_factory, monkeypatch):
    """One conversion cache for the module's tests (conversions are what the cache tests look at)."""
    monkeypatch.setenv("VA_BENCH_WEIGHTS", str(tmp_path_factory.getbasetemp() / "edge-weights"))


def _by_cell(records) -> dict[tuple[str, str, int], object]:
    return {(r.cell.load.backend, r.cell.load.precision, r.cell.batch_size): r for r in records}


def _edge_cells(tmp_path_factory, runs, limit: int) -> dict:
    for backend in RUNTIMES:
        need(backend)
    if not (YOLOX_NANO.is_file() and (COCO_DIR / "annotations").is_dir()):
        pytest.skip("offline assets missing (../shared/assets)")
    with pytest.MonkeyPatch.context() as env:  # the module's conversion cache, for this fixture only
        env.setenv("VA_BENCH_WEIGHTS", str(tmp_path_factory.getbasetemp() / "edge-weights"))
        cells = {}
        for backends, precisions in runs:
            plan, records = run_benchmark(tmp_path_factory, f"edge-{limit}-" + "-".join(precisions), backends=backends,
                                          precisions=precisions, batch_sizes=[1], limit=limit, min_timed_batches=1,
                                          warmup_batches=1, energy=False, draw_images=0)
            cells |= {key: (plan, r) for key, r in _by_cell(records).items()}
    return cells


@pytest.fixture(scope="module")
def fp32_cells(tmp_path_factory):
    """yolox-nano fp32, batch 1, the first 32 sample images: ONNX Runtime beside OpenVINO, ncnn, LiteRT and
    TorchScript (`make test`; the 106-image acceptance with fp16 and int8 is `first_106`, in `make test-slow`)."""
    return _edge_cells(tmp_path_factory, [(["onnxruntime", "openvino", "ncnn", "tflite", "torchscript"], ["fp32"])],
                       32)


@pytest.fixture(scope="module")
def first_106(tmp_path_factory):
    """yolox-nano, batch 1, on the first 106 sample images (sorted ids): ONNX Runtime fp32 beside OpenVINO
    fp32/fp16/int8, ncnn fp32/fp16, LiteRT fp32/fp16 and TorchScript fp32; int8 calibrated on the other 100."""
    return _edge_cells(tmp_path_factory, [(["onnxruntime", "openvino", "ncnn", "tflite", "torchscript"], ["fp32"]),
                                          (["openvino", "ncnn", "tflite"], ["fp16"]), (["openvino"], ["int8"])], 106)


def _fp32_agrees(cells) -> None:
    """fp32 on OpenVINO, ncnn, LiteRT and TorchScript: mAP within 0.002 of ONNX Runtime's, detections >= 99 %
    matched, the runtime's own vocabulary and compute precision in the record."""
    from coco_results import detections_from_coco

    from harness.eval.matching import match_detections

    plan, reference = cells[("onnxruntime", "fp32", 1)]
    want = json.loads((plan.run_dir / reference.accuracy.detections_file).read_text())
    for backend in ("openvino", "ncnn", "tflite", "torchscript"):
        plan_b, record = cells[(backend, "fp32", 1)]
        assert abs(record.accuracy.stats["mAP_50_95"] - reference.accuracy.stats["mAP_50_95"]) <= 0.002, backend
        got = json.loads((plan_b.run_dir / record.accuracy.detections_file).read_text())
        match = match_detections(detections_from_coco(want), detections_from_coco(got), 0.99, 1e-3)
        assert match.match_rate >= 0.99, (backend, match)
        assert record.runtime["format"] == backend and record.runtime["provider"] == "cpu"
        assert record.runtime["compute_precision"] == "fp32"


@requires_coco
@requires_yolox
@pytest.mark.slow
def test_fp32_runtimes_match_onnxruntime_on_32_images(fp32_cells):
    _fp32_agrees(fp32_cells)


@requires_coco
@requires_yolox
@pytest.mark.heavy
def test_fp32_runtimes_match_onnxruntime_on_106_images(first_106):
    _fp32_agrees(first_106)


@requires_coco
@requires_yolox
@pytest.mark.heavy
def test_openvino_and_litert_fp16_keep_accuracy_and_say_what_they_compute(first_106):
    _, reference = first_106[("onnxruntime", "fp32", 1)]
    _, litert = first_106[("tflite", "fp16", 1)]
    assert abs(litert.accuracy.stats["mAP_50_95"] - reference.accuracy.stats["mAP_50_95"]) <= 0.005
    assert litert.runtime["conversion"]["file"].endswith("model_float16.tflite")
    assert litert.runtime["tensor_types"].get("float16", 0) > 0  # the model holds fp16 weights (read back)
    _, record = first_106[("openvino", "fp16", 1)]
    assert abs(record.accuracy.stats["mAP_50_95"] - reference.accuracy.stats["mAP_50_95"]) <= 0.005
    runtime = record.runtime
    assert runtime["conversion"]["weights"].startswith("fp16")
    # this CPU has no native fp16: the plugin widens fp16 weights and computes f32 (read back, not assumed)
    assert runtime["compute_precision"] in ("fp32", "fp16")
    assert runtime["read_back"]["INFERENCE_PRECISION_HINT"] in ("<Type: 'float32'>", "<Type: 'float16'>")


@requires_coco
@requires_yolox
@pytest.mark.heavy
def test_ncnn_fp16_stores_fp16_weights_and_reports_its_accuracy(first_106):
    """ncnn fp16 stores fp16 weights (rounded to nearest, subnormals kept) and keeps fp32's mAP within 0.005;
    never silently fp32."""
    import ncnn

    _, fp32 = first_106[("ncnn", "fp32", 1)]
    _, fp16 = first_106[("ncnn", "fp16", 1)]
    assert fp16.runtime["conversion"]["weights"] == "fp16" and fp16.runtime["options"]["use_bf16_storage"] is False
    assert fp32.runtime["options"]["use_fp16_storage"] is False and fp32.runtime["options"]["use_fp16_arithmetic"] \
        is False
    assert fp32.runtime["options"]["openmp_blocktime"] == ncnn.Option().openmp_blocktime  # ncnn's own default
    assert fp16.runtime["conversion"]["fp16_writer"] == "va-bench: round to nearest, subnormals kept"
    assert abs(fp16.accuracy.stats["mAP_50_95"] - fp32.accuracy.stats["mAP_50_95"]) <= 0.005


@requires_coco
@requires_yolox
@pytest.mark.heavy
def test_openvino_int8_keeps_99_percent_calibrated_on_other_images(first_106):
    plan, record = first_106[("openvino", "int8", 1)]
    verdict = record.accuracy.reference
    fp32_map = first_106[("openvino", "fp32", 1)][1].accuracy.stats["mAP_50_95"]
    assert verdict["mAP_50_95"] == pytest.approx(fp32_map, abs=1e-6)  # the reference pass: the same fp32 core
    assert verdict["int8_mAP_50_95"] == record.accuracy.stats["mAP_50_95"]
    assert verdict["kept"] == pytest.approx(record.accuracy.stats["mAP_50_95"] / fp32_map, abs=1e-4)
    # both figures of the verdict as pycocotools gives them from the detections files the run wrote
    import contextlib
    import io

    from pycocotools.cocoeval import COCOeval

    truth = {}
    for name, rel in (("fp32", verdict["detections_file"]), ("int8", record.accuracy.detections_file)):
        with contextlib.redirect_stdout(io.StringIO()):
            coco_eval = COCOeval(plan.dataset.coco, plan.dataset.coco.loadRes(str(plan.run_dir / rel)), "bbox")
            coco_eval.params.imgIds = sorted(plan.variant.image_ids)
            coco_eval.evaluate(), coco_eval.accumulate(), coco_eval.summarize()
        truth[name] = coco_eval.stats[0]
    assert verdict["mAP_50_95"] == pytest.approx(truth["fp32"], abs=1e-6)
    assert verdict["int8_mAP_50_95"] == pytest.approx(truth["int8"], abs=1e-6)
    assert verdict["kept"] == pytest.approx(truth["int8"] / truth["fp32"], abs=1e-4)
    assert verdict["passed"] is (verdict["kept"] >= 0.99) and verdict["passed"]
    quantization = record.runtime["quantization"]
    assert quantization["calibration_images"] == 100 and quantization["calibration_disjoint_from_evaluated"]
    evaluated = set(plan.variant.image_ids)
    assert len(evaluated) == 106 and not evaluated & {r.image_id for r in plan.calibration.records}
    doc = json.loads(next((plan.run_dir / "submissions").glob("*.json")).read_text())
    assert doc["runtime"]["precision"] == "int8" and doc["eval"]["int8_vs_fp32"]["passed"] is True


@requires_coco
@requires_yolox
@pytest.mark.heavy
def test_validate_marks_a_failing_or_unchecked_int8_row(first_106, tmp_path):
    from harness.results.validate import validate_paths

    plan, _ = first_106[("openvino", "int8", 1)]
    doc = json.loads(next((plan.run_dir / "submissions").glob("*.json")).read_text())
    doc["eval"]["int8_vs_fp32"].update(kept=0.9, passed=False)
    (tmp_path / "failing.json").write_text(json.dumps(doc))
    doc["eval"]["int8_vs_fp32"] = {"status": "unavailable", "reason": "the fp32 reference could not be scored",
                                   "passed": None}
    (tmp_path / "not_compared.json").write_text(json.dumps(doc))
    del doc["eval"]["int8_vs_fp32"]
    (tmp_path / "unchecked.json").write_text(json.dumps(doc))
    report = validate_paths([tmp_path], None)
    found = {Path(r.path).name: [(f.rule, f.severity) for f in r.findings if f.rule == "int8-accuracy"]
             for r in report.reports}
    # a row the run could not compare was marked failing by it; a row with no comparison at all (another
    # harness's) is a warning
    assert found == {"failing.json": [("int8-accuracy", "error")], "not_compared.json": [("int8-accuracy", "error")],
                     "unchecked.json": [("int8-accuracy", "warning")]}


@requires_coco
@requires_yolox
@pytest.mark.slow
def test_submissions_of_every_runtime_pass_the_sites_rules(fp32_cells):
    from harness.results.validate import load_support_matrix, validate_paths

    dirs = {plan.run_dir / "submissions" for plan, _ in fp32_cells.values()}
    support = CORPUS / "support-matrix.json"
    report = validate_paths(sorted(dirs), load_support_matrix(support) if support.is_file() else None)
    errors = [f.to_dict() for r in report.reports for f in r.findings if f.severity == "error"]
    assert not errors, errors


@requires_coco
@requires_yolox
@pytest.mark.slow
def test_batched_runtimes_give_each_image_its_own_detections(tmp_path_factory):
    """OpenVINO, LiteRT and TorchScript run a real batch: batch 4 matches batch 1 (>= 99 %); OpenVINO's layer pass
    is its own performance counters."""
    need("openvino")
    need("tflite")
    _, records = run_benchmark(tmp_path_factory, "edge-batch", backends=["openvino", "tflite", "torchscript"],
                               batch_sizes=[1, 4], limit=12, min_timed_batches=1, warmup_batches=1, energy=False,
                               draw_images=0, layers=True, layer_batches=2)
    cells = _by_cell(records)
    for backend in ("openvino", "tflite", "torchscript"):
        assert cells[(backend, "fp32", 4)].invariance.report.match_rate >= 0.99, backend
    layers = cells[("openvino", "fp32", 4)].layers
    assert "OpenVINO performance counters" in layers["method"]
    assert any(t["layer_type"] == "Convolution" for t in layers["by_type_top"])
    assert [4, 3, 416, 416] in cells[("openvino", "fp32", 4)].runtime["compiled_shapes"]  # static shape per batch


# ------------------------------------------------------------------------------------ refusals, checks


def test_a_missing_runtime_is_one_line_with_the_pip_command(monkeypatch):
    from harness.backends import support

    real = importlib.util.find_spec
    monkeypatch.setattr(support.importlib.util, "find_spec", lambda name: None if name == "nncf" else real(name))
    with pytest.raises(UsageError) as err:
        support.check_support("openvino", "cpu", "int8")
    assert "needs the Python package nncf" in str(err.value) and "pip install 'va-bench[openvino]'" in str(err.value)
    assert "\n" not in str(err.value)


def test_ncnn_refuses_batches_above_one():
    need("ncnn")
    from harness.detector.source import CoreSource

    with pytest.raises(UsageError, match="ncnn runs one image per call .*--batch-sizes 1"):
        load_source(CoreSource("m", onnx_model=lambda: onnx.load(str(YOLOX_NANO))), "ncnn", CPU, "fp32", (416, 416),
                    batch_sizes=[1, 4])


@requires_yolox
def test_ncnn_runs_a_graph_made_spatially_dynamic_at_another_input_size():
    """yolox-nano's ONNX declares its 416 output ([batch, 3549, 85]); at 320 ncnn's output is the 320 one."""
    need("ncnn")
    from harness.models.registry import get_detector

    det = get_detector("yolox-nano")
    core = load_core_of(det, "ncnn", CPU, "fp32", (320, 320))
    assert core.conversion["checked"]["checked_batches"] == [1]
    assert [tuple(o.shape) for o in core(torch.rand(1, 3, 320, 320))] == [(1, 2100, 85)]


@pytest.mark.parametrize("backend, precision", [("openvino", "fp16"), ("openvino", "int8"), ("tflite", "fp16"),
                                                ("tflite", "int8")])
def test_batch_rows_are_checked_at_every_precision(tmp_path, backend, precision):
    """fp16 and int8 rows are not checked against their source (they differ by more than its tolerance); a graph
    whose batch axis was made dynamic after export still has each output row checked against its image alone."""
    need(backend)
    from test_backends import SIZE, MixesBatch, _onnx

    from harness.detector.source import CoreSource

    mixed = _onnx(MixesBatch(), tmp_path / "mixed.onnx")
    with pytest.raises(UsageError, match="at batch 2 the graph does not give each image's own output"):
        load_source(CoreSource("mixed", onnx_model=lambda: mixed, check_batches=(1, 2)), backend, CPU, precision,
                    SIZE, batch_sizes=[1, 2])


def test_a_good_graph_s_rows_checked_at_fp16_are_recorded(tmp_path):
    need("openvino")
    from test_backends import SIZE, Head, _onnx

    from harness.detector.graph import make_batch_dynamic
    from harness.detector.source import CoreSource

    good = make_batch_dynamic(_onnx(Head(), tmp_path / "good.onnx", dynamic=False))
    core = load_source(CoreSource("good", onnx_model=lambda: good, check_batches=(1, 2)), "openvino", CPU, "fp16",
                       SIZE, batch_sizes=[1, 2])
    assert core.conversion["checked"]["checked_batches"] == [1, 2]


class _Compiled:
    """A compiled model that reports the compute precision it was given (what a bf16 CPU plugin does)."""

    def __init__(self, hint):
        self.hint = hint

    def get_property(self, key):
        return self.hint if key == "INFERENCE_PRECISION_HINT" else "1"


def test_an_fp32_row_computing_in_bf16_is_refused():
    need("openvino")
    from harness.backends.openvino import OpenVinoCore

    core = OpenVinoCore.__new__(OpenVinoCore)
    core.precision, core.properties = "fp32", {"INFERENCE_PRECISION_HINT": "f32"}
    with pytest.raises(UsageError, match="compiled the fp32 model to compute in bf16"):
        core._check_read_back(_Compiled("bf16"))
    core._check_read_back(_Compiled("f32"))
    assert core.compute_precision == "fp32"
    core.precision = "fp16"
    core._check_read_back(_Compiled("f16"))
    assert core.compute_precision == "fp16"
    with pytest.raises(UsageError, match="compute in bf16"):  # bf16 has fewer mantissa bits than fp16
        core._check_read_back(_Compiled("bf16"))


@requires_yolox
def test_the_conversion_cache_is_reused_and_a_damaged_entry_converted_again(tmp_path, monkeypatch):
    need("openvino")
    from harness.detector.source import CoreSource

    monkeypatch.setenv("VA_BENCH_WEIGHTS", str(tmp_path))
    source = CoreSource("yolox-nano", onnx_model=lambda: _dynamic_yolox())
    first = load_source(source, "openvino", CPU, "fp32", (416, 416))
    again = load_source(source, "openvino", CPU, "fp32", (416, 416))
    assert first.conversion["cached"] is False and again.conversion["cached"] is True
    xml = Path(again.conversion["ir_file"])
    xml.write_text("<net broken")  # a damaged cache entry (a crash while writing elsewhere, a full disk)
    third = load_source(source, "openvino", CPU, "fp32", (416, 416))
    assert third.conversion["cached"] is False and xml.is_file()
    x = np.random.default_rng(0).random((1, 3, 416, 416), dtype=np.float32)
    import torch

    assert np.allclose(third(torch.from_numpy(x))[0].numpy(), first(torch.from_numpy(x))[0].numpy())
    # weights damaged on disk that still load: the check against the source finds it, the entry is converted again
    # (before, every later run was refused with the converter blamed)
    weights = xml.with_suffix(".bin")
    data = bytearray(weights.read_bytes())
    data[len(data) // 3: len(data) // 3 + len(data) // 20] = bytes(len(data) // 20)
    weights.write_bytes(bytes(data))
    fourth = load_source(source, "openvino", CPU, "fp32", (416, 416))
    assert "disagreed with its source: removed" in fourth.conversion["converted_again"]
    assert fourth.conversion["cached"] is False and fourth.conversion["checked"]["max_relative_diff"] < 1e-3
    assert np.allclose(fourth(torch.from_numpy(x))[0].numpy(), first(torch.from_numpy(x))[0].numpy())


# Run in a fresh interpreter: with the fault it guards against, the signal kills the process that receives it.
CROSSED_LIFETIMES = """
import ctypes, os, signal, sys, threading, time
# a test run started as a background job ignores SIGINT, and so would this child: Python's own handler, as a terminal's
signal.signal(signal.SIGINT, signal.default_int_handler)
sys.path.insert(0, sys.argv[1])
from conftest import load_source
from harness.detector.graph import make_batch_dynamic
from harness.detector.source import CoreSource
from harness.measure.device import parse_device
import onnx

class Stack(ctypes.Structure):
    _fields_ = [("sp", ctypes.c_void_p), ("flags", ctypes.c_int), ("size", ctypes.c_size_t)]

def signal_stack_mapped():
    stack = Stack()
    ctypes.CDLL(None).sigaltstack(None, ctypes.byref(stack))
    if stack.flags & 2:  # SS_DISABLE: the thread's own stack serves
        return True
    for line in open("/proc/self/maps"):
        low, high = (int(x, 16) for x in line.split()[0].split("-"))
        if low <= stack.sp and stack.sp + stack.size <= high:
            return True
    return False

graph = make_batch_dynamic(onnx.load(os.environ["VA_BENCH_YOLOX_NANO"]))
source = CoreSource("yolox-nano", onnx_model=lambda: graph)
load = lambda: load_source(source, "openvino", parse_device("cpu"), "fp32", (416, 416))
first = load()
second = load()  # loaded while the first lives, as a cache entry converted again is
del first
third = load()
del second, third
assert signal_stack_mapped(), "the main thread's signal stack points at unmapped memory"
try:
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
    time.sleep(5)
except KeyboardInterrupt:
    print("interrupted cleanly")
"""


@requires_yolox
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="sigaltstack and /proc/self/maps are Linux's")
def test_openvino_cores_with_crossing_lifetimes_leave_ctrl_c_a_clean_stop(tmp_path):
    # OpenVINO's CPU plugin swaps the loading thread's signal stack and puts the old one back when it goes: cores
    # of their own, freed out of order, left it unmapped, and Ctrl-C was a segmentation fault
    need("openvino")
    env = {**os.environ, "VA_BENCH_WEIGHTS": str(tmp_path), "VA_BENCH_YOLOX_NANO": str(YOLOX_NANO)}
    done = subprocess.run([sys.executable, "-c", CROSSED_LIFETIMES, str(Path(__file__).parent)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "interrupted cleanly" in done.stdout, (done.returncode, done.stderr[-800:])


@requires_yolox
def test_a_trace_is_cached_per_graph_not_per_weights(tmp_path, monkeypatch):
    # the same weights with the upsampling changed (nearest -> linear): another computation, so another trace
    from harness.detector.source import CoreSource

    monkeypatch.setenv("VA_BENCH_WEIGHTS", str(tmp_path))
    nearest = _dynamic_yolox()
    linear = onnx.ModelProto()
    linear.CopyFrom(nearest)
    for node in linear.graph.node:
        if node.op_type == "Resize":
            for attribute in node.attribute:
                if attribute.name == "mode":
                    attribute.s = b"linear"
    first = load_source(CoreSource("yolox-nano", onnx_model=lambda: nearest), "torchscript", CPU, "fp32", (416, 416))
    other = load_source(CoreSource("yolox-nano", onnx_model=lambda: linear), "torchscript", CPU, "fp32", (416, 416))
    assert first.conversion["file"] != other.conversion["file"] and other.conversion["cached"] is False
    again = load_source(CoreSource("yolox-nano", onnx_model=lambda: nearest), "torchscript", CPU, "fp32", (416, 416))
    assert again.conversion["file"] == first.conversion["file"] and again.conversion["cached"] is True


def test_a_cached_trace_that_disagrees_is_traced_again(tmp_path, monkeypatch):
    """A cached trace that loads but computes something else (left by a broken tracer, or damaged) is removed and
    traced once more in the same run, as the other runtimes' conversions are, never refused for good."""
    import torch
    from test_backends import SIZE, Head

    from harness.detector.source import CoreSource

    monkeypatch.setenv("VA_BENCH_WEIGHTS", str(tmp_path))
    source = CoreSource("tiny-head", torch_module=Head)
    first = load_source(source, "torchscript", CPU, "fp32", SIZE)
    path = Path(first.conversion["file"])
    with torch.no_grad():  # a valid trace of other weights, under this entry's name
        torch.jit.save(torch.jit.trace(Head(seed=1).eval(), torch.rand(2, 3, *SIZE)), str(path))
    again = load_source(source, "torchscript", CPU, "fp32", SIZE)
    assert "disagreed with its source: removed" in again.conversion["converted_again"]
    assert again.conversion["cached"] is False and again.conversion["checked"]["max_relative_diff"] < 1e-3
    x = torch.rand(3, 3, *SIZE)
    with torch.no_grad():
        torch.testing.assert_close(again(x)[0], Head()(x)[0], rtol=1e-5, atol=1e-5)


TINY_CORE = """
import torch


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 4, 3, stride=8)

    def forward(self, x):
        return [self.conv(x).flatten(2).transpose(1, 2) * SCALE]
"""


def _tiny_core_class(folder: Path, scale: str):
    """TINY_CORE's class, its file written (again) in `folder` with this scale: an edit of its forward."""
    import importlib.util

    path = folder / "tiny_core.py"
    path.write_text(TINY_CORE.replace("SCALE", scale))
    spec = importlib.util.spec_from_file_location("tiny_core", path)
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded.Tiny


def test_a_trace_of_a_torch_module_is_of_its_code_too(tmp_path, monkeypatch):
    """The same weights and structure with the forward edited: another trace, not the cached one of the old code
    (an fp16 trace is not checked against the module)."""
    from harness.detector.source import CoreSource

    monkeypatch.setenv("VA_BENCH_WEIGHTS", str(tmp_path / "cache"))
    files = []
    for scale in ("1.0", "1.0", "2.0"):
        tiny = _tiny_core_class(tmp_path, scale)
        core = load_source(CoreSource("tiny", torch_module=tiny), "torchscript", CPU, "fp32", (64, 64))
        files.append((core.conversion["file"], core.conversion["cached"]))
    assert files[1] == (files[0][0], True) and files[2][0] != files[0][0] and files[2][1] is False, files


def test_a_modules_code_key_covers_an_inherited_forward(tmp_path):
    """A module class that inherits its forward from a base class of another file: editing that file is a new key."""
    import torch

    from harness.backends.export import module_code_sha256

    def head_of(scale: str):
        class Head(_tiny_core_class(tmp_path, scale)):  # its own file is this test's, unchanged; its forward the base's
            def __init__(self):
                super().__init__()
                self.extra = torch.nn.Identity()

        return Head()

    assert module_code_sha256(head_of("1.0")) == module_code_sha256(head_of("1.0"))
    assert module_code_sha256(head_of("1.0")) != module_code_sha256(head_of("2.0"))


def _dynamic_yolox() -> onnx.ModelProto:
    from harness.detector.graph import make_batch_dynamic

    return make_batch_dynamic(onnx.load(str(YOLOX_NANO)))


@requires_yolox
def test_the_focus_rewrite_is_the_same_graph_in_onnxruntime():
    need("ncnn")
    import onnxruntime as ort

    from harness.backends.ncnn import rewrite_focus

    model = onnx.load(str(YOLOX_NANO))
    rewritten, count = rewrite_focus(model)
    assert count == 1 and not any(n.op_type == "Slice" for n in rewritten.graph.node[:8])
    x = np.random.default_rng(1).random((1, 3, 416, 416), dtype=np.float32) * 255
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"images": x})[0]
    got = ort.InferenceSession(rewritten.SerializeToString()).run(None, {"images": x})[0]
    assert np.array_equal(want, got)


def _bin_blob(values, dtype) -> bytes:
    return np.asarray(values, dtype).tobytes()


def test_the_fp16_weights_file_rounds_to_nearest_keeps_subnormals_and_fp32_past_the_range():
    from harness.backends.ncnn import FP16_TAG, UnknownLayer, fp16_weights_file

    param = ("7767517\n4 4\nInput in0 0 1 in0\n"
             "Convolution conv 1 1 in0 a 0=2 1=1 5=1 6=3\n"
             "Swish act 1 1 a b\n"
             "InnerProduct fc 1 1 b out 0=1 1=0 2=2\n")
    conv, bias, fc = [1.0, 1e-6, 1.0 + 2 ** -11 + 2 ** -20], [0.5, -2.0], [70000.0, 1.0]
    fp32_bin = (b"\0\0\0\0" + _bin_blob(conv, np.float32) + _bin_blob(bias, np.float32)
                + b"\0\0\0\0" + _bin_blob(fc, np.float32))
    data, kept = fp16_weights_file(param, fp32_bin)
    # IEEE binary16 by hand: 1.0 = 0x3c00; 1e-6 = 17 * 2^-24, the subnormal 0x0011 (ncnn's writer makes it 0);
    # 1 + 2^-11 + 2^-20 rounds up to 1 + 2^-10 = 0x3c01 (truncation gives 0x3c00); 3 halfs pad to 8 bytes
    halfs = bytes.fromhex("003c" "1100" "013c" "0000")
    assert data == (FP16_TAG.to_bytes(4, "little") + halfs + _bin_blob(bias, np.float32)
                    + b"\0\0\0\0" + _bin_blob(fc, np.float32))  # 70000 > 65504: that blob stays fp32
    assert kept == 1
    with pytest.raises(ValueError, match="account for"):
        fp16_weights_file(param, fp32_bin + b"\0\0\0\0")
    with pytest.raises(UnknownLayer, match="MemoryData"):
        fp16_weights_file(param + "MemoryData c 0 1 c 0=4\n", fp32_bin)
    # a transposed convolution's 19 is an output padding (its weights are in the .bin); its 28 is dynamic weights
    deconv = "7767517\n2 2\nInput in0 0 1 in0\nDeconvolution up 1 1 in0 out 0=1 1=1 5=0 6=2 19=1 {}\n"
    blob = b"\0\0\0\0" + _bin_blob([0.5, 0.25], np.float32)
    assert fp16_weights_file(deconv.format(""), blob)[0] == FP16_TAG.to_bytes(4, "little") + bytes.fromhex("00380034")
    with pytest.raises(UnknownLayer, match="dynamic weights"):
        fp16_weights_file(deconv.format("28=1"), blob)


@requires_coco
@requires_yolox
def test_ncnn_fp16_runs_the_graph_with_its_weights_rounded_where_pnnx_s_writer_moves_the_boxes(tmp_path):
    """ncnn on the fp16 file equals ONNX Runtime on the same graph with every weight rounded to fp16 (to fp32
    arithmetic's noise); pnnx's own fp16 file, which flushes the stem's small weights, is far off."""
    need("ncnn")
    import cv2
    import ncnn
    import onnxruntime as ort
    from onnx import numpy_helper

    from harness.backends.ncnn import _run_pnnx, convert_with_pnnx, rewrite_focus

    model = onnx.load(str(YOLOX_NANO))
    folder, info = convert_with_pnnx("yolox-nano", model.SerializeToString(), (416, 416), True)
    assert info["fp16_writer"].startswith("va-bench") and info["fp32_blobs_past_fp16_range"] == 0
    again = convert_with_pnnx("yolox-nano", model.SerializeToString(), (416, 416), True)[1]
    assert again["cached"] and again["fp16_writer"] == info["fp16_writer"]  # a cached copy says how it was made
    rewritten, _ = rewrite_focus(model)
    rewritten.ir_version = min(rewritten.ir_version, 8)
    (tmp_path / "model.onnx").write_bytes(rewritten.SerializeToString())
    _run_pnnx("yolox-nano", tmp_path, (416, 416), fp16=True)
    shutil.copy(folder / "model.ncnn.param", tmp_path / "model.ncnn.param")  # the Reorg mode fixed, same layers
    rounded = onnx.load(str(YOLOX_NANO))
    for i, init in enumerate(rounded.graph.initializer):
        if init.data_type == onnx.TensorProto.FLOAT:
            values = numpy_helper.to_array(init).astype(np.float16).astype(np.float32)
            rounded.graph.initializer[i].CopyFrom(numpy_helper.from_array(values, init.name))
    session = ort.InferenceSession(rounded.SerializeToString(), providers=["CPUExecutionProvider"])
    errors: dict[str, list[float]] = {"ours": [], "pnnx": []}
    for image in sorted((COCO_DIR / "val2017").glob("*.jpg"))[:2]:
        x = np.ascontiguousarray(cv2.resize(cv2.imread(str(image)), (416, 416)).astype(np.float32).transpose(2, 0, 1))
        want = session.run(None, {"images": x[None]})[0][0]
        for which, bin_folder in (("ours", folder), ("pnnx", tmp_path)):
            net = ncnn.Net()
            net.opt.use_fp16_storage = net.opt.use_fp16_packed = net.opt.use_fp16_arithmetic = False
            net.opt.use_bf16_storage = False
            net.load_param(str(folder / "model.ncnn.param"))
            net.load_model(str(bin_folder / "model.ncnn.bin"))
            extractor = net.create_extractor()
            extractor.input(net.input_names()[0], ncnn.Mat(x))
            got = np.array(extractor.extract(net.output_names()[0])[1])
            errors[which].append(float(np.abs(got[..., :4] - want[..., :4]).mean()))
    assert max(errors["ours"]) < 0.01, errors  # measured ~5e-4 px
    assert min(errors["pnnx"]) > 10 * max(errors["ours"]), errors  # measured ~0.07 px


@requires_coco
def test_calibration_images_are_never_evaluated_ones(tmp_path):
    from harness.data.calibration import calibration_set
    from harness.data.coco import CocoDataset

    dataset = CocoDataset(COCO_DIR)
    variant = dataset.variant("sample", 106)
    evaluated = dataset.records(variant)
    default = calibration_set(dataset, evaluated, None, 300)
    assert len(default.records) == len(dataset.coco.imgs) - 106
    assert not {r.image_id for r in default.records} & set(variant.image_ids)
    # fewer than asked for (206 - 106 of 300): recorded, and the run warns of it with the way to more
    assert default.describe()["calibration_images_requested"] == 300
    assert default.describe()["calibration_shortfall"].startswith("int8 calibrated on 100 images, not the 300 asked")
    ten = calibration_set(dataset, evaluated, None, 10)
    assert len(ten.records) == 10 and ten.shortfall is None and "calibration_shortfall" not in ten.describe()
    everything = dataset.records(dataset.variant("sample"))
    with pytest.raises(UsageError, match="every image of the dataset is evaluated; evaluate fewer"):
        calibration_set(dataset, everything, None, 300)
    folder = tmp_path / "calibration"
    folder.mkdir()
    shutil.copy(evaluated[5].path, folder / "renamed.jpg")  # the same image under another name
    shutil.copy(default.records[0].path, folder / "other.jpg")
    with pytest.raises(UsageError, match=r"1 of its images are also evaluated \(e.g. renamed.jpg is image"):
        calibration_set(dataset, evaluated, str(folder), 300)
    (folder / "renamed.jpg").unlink()
    given = calibration_set(dataset, evaluated, str(folder), 300)
    assert len(given.records) == 1 and given.describe()["calibration_source"].startswith("--calibration")
    assert f"there are no more image files in {folder}; put more images in {folder}" in given.shortfall
    with pytest.raises(UsageError, match="--calibration .* not a folder"):
        calibration_set(dataset, evaluated, str(tmp_path / "absent"), 300)
    # a broken file is refused when the run is planned (it failed the first int8 cell, inside a run folder)
    # a photo with data after its JPEG (a phone's motion photo) decodes: it is no broken file
    (folder / "motion.jpg").write_bytes((folder / "other.jpg").read_bytes() + b"\x00appended video" * 200)
    assert len(calibration_set(dataset, evaluated, str(folder), 300).records) == 2
    (folder / "broken.jpg").write_bytes(b"garbage\n")
    with pytest.raises(UsageError, match=r"--calibration .*: broken.jpg cannot be decoded as an image.*; replace "
                                         r"or remove the broken files"):
        calibration_set(dataset, evaluated, str(folder), 300)


@requires_coco
@requires_yolox
def test_int8_overlap_is_refused_before_anything_runs(tmp_path):
    from conftest import run_in_process

    folder = tmp_path / "calibration"
    folder.mkdir()
    shutil.copy(COCO_DIR / "val2017" / "000000000139.jpg", folder / "a.jpg")
    done = run_in_process("run", "--backend", "openvino", "--precision", "int8", "--limit", "8",
                          "--calibration", str(folder), "--output-dir", str(tmp_path / "out"))
    assert done.returncode == 2 and "also evaluated" in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").iterdir())


# ----------------------------------------------------------------------------------------- families

# YOLOv9 gets more calibration images than the parity tests use: with two, some of its BatchNorm variances are so
# small that float reordering alone moves an out-of-image box by a pixel, past the export check's tolerance.
FAMILY_CALIBRATION = {"yolov9t": (552775, 553664, 555009, 555705, 557172, 560256, 565607, 565778)}
# What ncnn cannot run, by the line it says (the refusals docs/families-and-backends.md lists)
NCNN_REFUSALS = {"yolov9t": "capped at", "rtdetr-r18": "pnnx left operators ncnn cannot run (Tensor.reshape"}


@requires_coco
@pytest.mark.catalogue
@pytest.mark.parametrize("model_id", ["yolov9t", "rtdetr-r18"])
def test_seeded_families_on_every_converting_runtime(model_id, monkeypatch):
    """Seeded, BatchNorm-calibrated weights on 3 real images: OpenVINO and TorchScript detections >= 99 % matched to
    ONNX Runtime's; ncnn runs them or refuses in one line saying why."""
    for backend in RUNTIMES:
        need(backend)
    import test_libreyolo_families as parity

    from harness.data.coco import CocoDataset
    from harness.eval.matching import match_detections
    from harness.pipeline.pipeline import DetectorPipeline, Thresholds
    from harness.pipeline.stage_timer import StageTimer

    monkeypatch.setattr(parity, "CALIBRATION_IMAGES", FAMILY_CALIBRATION.get(model_id, parity.CALIBRATION_IMAGES))
    coco = CocoDataset(COCO_DIR)
    det = parity.calibrated(model_id, coco)
    records = [coco.record(i) for i in parity.PARITY_IMAGES]
    post = det.postprocess
    detections = {}
    for backend in ("onnxruntime", "openvino", "torchscript", "ncnn"):
        try:
            core = load_core_of(det, backend, CPU, "fp32", det.preprocess.input_size)
        except UsageError as exc:
            assert backend == "ncnn" and NCNN_REFUSALS[model_id] in str(exc) and "\n" not in str(exc), str(exc)
            continue
        pipeline = DetectorPipeline(det, core, CPU, det.preprocess, Thresholds(post.conf, post.iou, post.max_det))
        timer = StageTimer(CPU)
        detections[backend] = [d for r in records for d in pipeline.run_batch([r], timer)]
    assert sum(len(d.scores) for d in detections["onnxruntime"]) > 0
    for backend in ("openvino", "torchscript"):
        match = match_detections(detections["onnxruntime"], detections[backend], 0.99, 1e-3)
        assert match.match_rate >= 0.99, (backend, match)


@requires_coco
@requires_yolox
def test_openvino_throughput_mode_keeps_its_streams_busy_and_gives_the_latency_modes_detections():
    """Overlapped mode on OpenVINO: the THROUGHPUT hint, as many forwards in flight as OpenVINO says are optimal
    (started async, collected in order); every batch's detections >= 99 % matched to the latency core's, in the
    records' order."""
    need("openvino")
    from harness.data.coco import CocoDataset
    from harness.eval.matching import match_detections
    from harness.models.registry import get_detector
    from harness.pipeline.pipeline import DetectorPipeline, Thresholds
    from harness.pipeline.stage_timer import StageTimer

    det = get_detector("yolox-nano")
    coco = CocoDataset(COCO_DIR)
    records = coco.records(coco.variant("sample", 12))
    batches = [records[i:i + 2] for i in range(0, len(records), 2)]
    post = det.postprocess
    thresholds = Thresholds(post.conf, post.iou, post.max_det)
    latency = load_core_of(det, "openvino", CPU, "fp32", (416, 416), threads=2, batch_sizes=[2])
    throughput = load_core_of(det, "openvino", CPU, "fp32", (416, 416), threads=2, batch_sizes=[2], overlap=True)
    assert latency.async_slots == 1 and latency.read_back["PERFORMANCE_HINT"] == "LATENCY"
    assert throughput.read_back["PERFORMANCE_HINT"] == "THROUGHPUT"
    assert throughput.async_slots == int(throughput.read_back["OPTIMAL_NUMBER_OF_INFER_REQUESTS"]) >= 1
    want = DetectorPipeline(det, latency, CPU, det.preprocess, thresholds)
    got = DetectorPipeline(det, throughput, CPU, det.preprocess, thresholds)
    counts = {"started": 0, "collected": 0, "most_in_flight": 0}
    start, collect = throughput.start, throughput.collect

    def counted_start(batch):
        counts["started"] += 1
        counts["most_in_flight"] = max(counts["most_in_flight"], counts["started"] - counts["collected"])
        return start(batch)

    def counted_collect(ticket):
        counts["collected"] += 1
        return collect(ticket)

    throughput.start, throughput.collect = counted_start, counted_collect
    timer = StageTimer(CPU, stage_sync=False, batch_sync=False)
    streamed = list(got.run_stream(batches, timer, overlap=True))
    assert counts["started"] == counts["collected"] == len(batches) == len(timer.batches)
    assert counts["most_in_flight"] == throughput.async_slots  # measured: 2 streams, 2 requests on 2 cores
    assert all(t.stages["forward"] > 0 for t in timer.batches)
    expected = [want.run_batch(b, StageTimer(CPU)) for b in batches]
    for mine, theirs, batch in zip(streamed, expected, batches, strict=True):
        assert [d.image_id for d in mine] == [r.image_id for r in batch]
        assert match_detections(theirs, mine, 0.99, 1e-3).match_rate >= 0.99


@requires_coco
@requires_yolox
def test_openvino_forward_is_its_own_infer_and_its_outputs_are_copied_out_in_the_transfer_stage():
    """The forward stage is OpenVINO's own time for each `infer()` (its request's `latency`, what benchmark_app
    reports); the rest of the call's wall time and the outputs' copy out are transfer. Its outputs are the request's
    buffers (the next forward overwrites them), so the pipeline copies them out at once and `__call__` hands out
    copies. Either way, latency and overlapped mode give the detections of a core without the borrowed forward."""
    need("openvino")
    import torch

    from harness.data.coco import CocoDataset
    from harness.models.registry import get_detector
    from harness.pipeline.pipeline import DetectorPipeline, Thresholds
    from harness.pipeline.stage_timer import StageTimer

    det = get_detector("yolox-nano")
    core = load_core_of(det, "openvino", CPU, "fp32", (416, 416), threads=2, batch_sizes=[2])
    a, b = torch.zeros(2, 3, 416, 416), torch.full((2, 3, 416, 416), 114.0)
    borrowed = core.forward_borrowed(a)[0][0]
    of_a = borrowed.clone()
    owned = core(a)[0]
    assert torch.equal(owned, of_a)
    core.forward_borrowed(b)
    assert not torch.equal(borrowed, of_a)  # the request's buffer now holds b's outputs
    assert torch.equal(owned, of_a)  # a copy of the caller's own
    from harness.bench.overhead import runtime_own_loop

    own = runtime_own_loop(core, a, CPU)  # bench-overhead's yardstick: OpenVINO's own sync infer() on the same model
    own()
    assert "infer()" in own.what

    class CopyingCore:  # the same runtime behind `__call__` only
        def __init__(self, inner):
            self.inner, self.backend, self.format, self.provider = inner, inner.backend, inner.format, inner.provider
            self.precision, self.takes_device_tensors = inner.precision, False

        def __call__(self, batch):
            return self.inner(batch)

        def info(self):
            return self.inner.info()

    coco = CocoDataset(COCO_DIR)
    records = coco.records(coco.variant("sample", 12))
    batches = [records[i:i + 2] for i in range(0, len(records), 2)]
    post = det.postprocess
    thresholds = Thresholds(post.conf, post.iou, post.max_det)
    plain = DetectorPipeline(det, CopyingCore(core), CPU, det.preprocess, thresholds)
    expected = [plain.run_batch(batch, StageTimer(CPU)) for batch in batches]
    pipeline = DetectorPipeline(det, core, CPU, det.preprocess, thresholds)
    timer = StageTimer(CPU)
    calls = []  # each forward's wall time around the core's call and OpenVINO's latency, read off its request
    inner = core.forward_borrowed

    def watched(batch):
        start = time.perf_counter_ns()
        out = inner(batch)
        calls.append((time.perf_counter_ns() - start, core._compiled_for(tuple(batch.shape))[1].latency))
        return out

    core.forward_borrowed = watched
    for overlap in (False, True):
        streamed = list(pipeline.run_stream(batches, timer, overlap=overlap))
        for mine, theirs in zip(streamed, expected, strict=True):
            for d, e in zip(mine, theirs, strict=True):
                assert d.image_id == e.image_id and np.array_equal(d.boxes, e.boxes)
                assert np.array_equal(d.scores, e.scores) and np.array_equal(d.labels, e.labels)
    assert all(t.stages["transfer"] > 0 and t.stages["forward"] > 0 for t in timer.batches)
    for t, (wall_ns, latency_ms) in zip(timer.batches, calls, strict=True):
        assert abs(t.stages["forward"] / 1e6 - latency_ms) < 1e-3  # OpenVINO's clock, not the call's wall time
        assert t.stages["forward"] < wall_ns < t.stages["forward"] + t.stages["transfer"]


@requires_yolox
def test_the_control_loop_of_bench_runtimes_runs_the_harness_ir_with_its_properties():
    """`make bench-runtimes`'s control: OpenVINO's sync infer() in a plain loop on the IR and properties a core
    uses, its median by OpenVINO's own clock, in the line format benchmark_app prints."""
    need("openvino")
    from harness.bench.openvino_loop import LOOP_STARTS
    from harness.bench.runtimes import MEDIAN_LINE
    from harness.models.registry import get_detector

    core = load_core_of(get_detector("yolox-nano"), "openvino", CPU, "fp32", (416, 416), threads=2, batch_sizes=[1])
    done = subprocess.run([sys.executable, "-m", "harness.bench.openvino_loop", core.conversion["ir_file"],
                           "--properties", json.dumps(core.properties), "--shape", "1", "3", "416", "416",
                           "--iterations", "3", "--warmup", "1"], capture_output=True, text=True, check=True)
    lines = done.stdout.splitlines()
    assert lines[0] == LOOP_STARTS
    assert float(MEDIAN_LINE.search(lines[1]).group(1)) > 0


@requires_coco
@requires_yolox
def test_openvino_throughput_mode_submission_splits_the_interval_between_its_forwards_in_flight(tmp_path_factory):
    """A real overlapped OpenVINO run: each forward is OpenVINO's own time for it, the submission's inference
    share is that over the forwards in flight, and the site's three parts add up to the per-image interval."""
    need("openvino")
    from conftest import run_benchmark

    from harness.results.submission import build_submission

    _, records = run_benchmark(tmp_path_factory, "ov-overlap", backends=["openvino"], limit=16, batch_sizes=[2],
                               overlap=True, warmup_batches=1, min_timed_batches=8, layers=False, profile=False,
                               energy=False, accuracy=False, draw_images=0)
    doc = build_submission(records[0])
    in_flight = doc["runtime"]["host"]["forwards_in_flight"]
    assert in_flight == min(doc["runtime"]["async_requests"].values()) >= 1
    total = doc["timing"]["total_ms"]
    stages = doc["timing"]["stages_ms"]
    # inference is the forward and the input's transfer (per batch of 2), as the site's split defines it
    forward_per_image = (stages["forward"]["mean"] + (stages.get("transfer") or {}).get("mean", 0.0)) / 2
    assert total["inference_ms"] == pytest.approx(min(forward_per_image / in_flight, total["mean"]), abs=1e-3)
    parts = total["preprocess_ms"] + total["inference_ms"] + total["postprocess_ms"]
    assert parts == pytest.approx(total["mean"], abs=1e-3)


def test_a_raspberry_pi_gets_the_boards_hardware_block(monkeypatch, tmp_path):
    """On a Raspberry Pi the hardware block is what the leaderboard's rpi5 rows hold: the board's name as `gpu`,
    id rpi5 (from /proc/device-tree/model, NUL-terminated)."""
    from harness.measure import env

    (tmp_path / "proc" / "device-tree").mkdir(parents=True)
    (tmp_path / "proc" / "device-tree" / "model").write_bytes(b"Raspberry Pi 5 Model B Rev 1.1\x00")
    read = env.board_model
    assert read(tmp_path) == "Raspberry Pi 5 Model B Rev 1.1" and read(tmp_path / "absent") is None
    monkeypatch.setattr(env, "board_model", lambda: read(tmp_path))
    monkeypatch.setattr(env, "_nvml_gpu", lambda nvml=None: None)  # a Raspberry Pi has no NVIDIA GPU
    block = env.hardware_block(CPU, None)
    assert block["id"] == "rpi5" and block["gpu"] == "Raspberry Pi 5 Model B Rev 1.1"
    assert block["gpu_memory_gb"] is None and block["driver_version"] == "N/A"


@requires_coco
@requires_yolox
@pytest.mark.heavy
def test_litert_int8_is_scored_beside_fp32_and_marked_when_it_fails(tmp_path_factory):
    """LiteRT int8 (onnx2tf's integer quantisation, ~2 min of calibration here): its cell keeps its own mAP and the
    fp32 one; on yolox-nano the quantised head loses most of it, and the row says so (both numbers, failing)."""
    need("tflite")
    _, records = run_benchmark(tmp_path_factory, "edge-tflite-int8", backends=["tflite"], precisions=["int8"],
                               batch_sizes=[1], limit=106, min_timed_batches=1, warmup_batches=1, energy=False,
                               draw_images=0)
    record = records[0]
    verdict = record.accuracy.reference
    assert verdict["int8_mAP_50_95"] == record.accuracy.stats["mAP_50_95"] and verdict["mAP_50_95"] > 0.25
    assert verdict["passed"] is (verdict["kept"] >= 0.99)
    if not verdict["passed"]:
        assert "marked failing" in verdict["failing"] and f"{verdict['mAP_50_95']:.4f}" in verdict["failing"]
    assert record.runtime["tensor_types"].get("int8", 0) > 0  # quantised tensors, read back from the model
    assert record.runtime["quantization"]["calibration_images"] == 100


@requires_yolox
@pytest.mark.parametrize("backend, damage", [
    ("ncnn", "model.ncnn.param"),
    pytest.param("tflite", "model_float32.tflite", marks=pytest.mark.heavy),  # two onnx2tf conversions: ~40 s
])
def test_a_damaged_cache_entry_is_converted_again(backend, damage, tmp_path, monkeypatch):
    """A cache entry cut short (a crash, a full disk) is converted again, not an error or a wrong model."""
    need(backend)
    import torch

    from harness.detector.source import CoreSource

    monkeypatch.setenv("VA_BENCH_WEIGHTS", str(tmp_path))
    source = CoreSource("yolox-nano", onnx_model=_dynamic_yolox)
    x = torch.from_numpy(np.random.default_rng(2).random((1, 3, 416, 416), dtype=np.float32) * 255)
    first = load_source(source, backend, CPU, "fp32", (416, 416))
    want = first(x)[0]
    folder = Path(first.conversion["file"]).parent if backend == "tflite" else Path(first.conversion["folder"])
    del first  # LiteRT maps its model file: cutting that file short under a live interpreter is a SIGBUS
    (folder / damage).write_bytes(b"7767517\n" if backend == "ncnn" else b"not a flatbuffer")
    again = load_source(source, backend, CPU, "fp32", (416, 416))
    assert again.conversion["cached"] is False
    assert torch.allclose(again(x)[0], want)


@requires_coco
@requires_yolox
def test_layers_on_a_runtime_without_a_profiler_is_unavailable_with_the_reason(tmp_path):
    """`--layers` with ncnn: the cell runs and says why there is no per-layer table (not a failure, not zeros)."""
    need("ncnn")
    from conftest import run_in_process

    done = run_in_process("run", "--backend", "ncnn", "--limit", "2", "--layers", "--no-energy", "--draw-images", "0",
                          "--output-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert "per-layer timing unavailable" in done.stdout + done.stderr
    doc = json.loads(next(tmp_path.glob("*/submissions/*.json")).read_text())
    assert doc["layers"]["status"] == "unavailable" and "ncnn" in doc["layers"]["reason"]


@requires_coco
@requires_yolox
def test_ncnn_with_a_batch_above_one_is_refused_before_anything_loads(tmp_path):
    from conftest import run_in_process

    done = run_in_process("run", "--backend", "ncnn", "--batch-sizes", "1", "4", "--limit", "8",
                          "--output-dir", str(tmp_path / "out"))
    assert done.returncode == 2 and "ncnn runs one image per call" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "out").exists()


def test_query_rows_compare_as_a_set_only_where_the_source_says_so():
    """Rows in another order: equal for a DETR-style source's query set, a disagreement for any other output
    (a YOLO head's channels or anchors in another order are a wrong model)."""
    import torch

    from harness.detector.graph import max_relative_diff

    torch.manual_seed(0)
    logits, boxes = torch.rand(1, 6, 3), torch.rand(1, 6, 4)
    order = torch.tensor([3, 1, 0, 5, 2, 4])
    swapped = [logits[:, order], boxes[:, order]]
    assert max_relative_diff(swapped, [logits, boxes], rows_as_set=True) == 0.0
    assert max_relative_diff(swapped, [logits, boxes]) > 0.1
    unpaired = [logits[:, order], boxes]  # each output a permutation of its own, the pairs broken
    assert max_relative_diff(unpaired, [logits, boxes], rows_as_set=True) > 0.1


def test_query_rows_pair_with_their_nearest_counterpart_not_by_sort_order():
    """Rows whose leading values differ by less than the runtimes' rounding sorted either way, and a sorted
    comparison then paired a row with its neighbour's counterpart (a converted DETR refused for rounding). The rows
    are paired at their best; the figure is checked against the best one-to-one pairing found by trying every
    permutation (also where rows claim the same nearest counterpart), and a row with no counterpart is still a
    disagreement."""
    import itertools

    import torch

    from harness.detector.graph import max_relative_diff

    permutations = np.array(list(itertools.permutations(range(6))))  # all 720, as rows of column indices

    def best_pairing(got, want) -> float:
        """The smallest worst row difference over every one-to-one pairing (brute force, all 720 permutations):
        the 6 x 6 row differences once, then each permutation's worst pair, vectorised."""
        rows_g, rows_w = got[0].double().numpy(), want[0].double().numpy()
        diff = np.abs(rows_g[:, None, :] - rows_w[None, :, :]).max(axis=-1)  # [row of got, row of want]
        return float(diff[np.arange(6), permutations].max(axis=1).min())

    torch.manual_seed(1)
    for trial in range(50):
        want = torch.rand(1, 6, 5)
        want[0, :3, 0] = 0.5  # three rows share their leading value: only rounding orders them
        got = want + (torch.rand_like(want) - 0.5) * 2e-6  # a runtime's rounding
        got = got[:, torch.randperm(6)]
        best = best_pairing(got, want)
        assert max_relative_diff([got], [want], rows_as_set=True) == pytest.approx(best, abs=1e-12), trial
        assert best < 1e-5
    other = want.clone()
    other[0, 4] = torch.rand(5)  # one query the other runtime did not select
    assert max_relative_diff([other], [want], rows_as_set=True) > 0.01
    for trial in range(200):  # coarse rows: many claim the same nearest counterpart, and nearest-first is not best
        want = torch.randint(0, 4, (1, 6, 2)).float() / 8
        got = want[:, torch.randperm(6)] + torch.randint(-1, 2, (1, 6, 2)).float() / 16
        best = best_pairing(got, want)
        elementwise = float((got - want).abs().max())
        assert max_relative_diff([got], [want], rows_as_set=True) == pytest.approx(min(best, elementwise)), trial


def test_each_output_of_a_query_row_is_compared_at_its_own_scale():
    """Logits of magnitude 15 beside boxes in [0, 1]: a box error of 5e-3 is 5e-3 of the boxes, whatever the
    logits' size, in the set comparison as element by element; a NaN is never agreement."""
    import torch

    from harness.detector.graph import max_relative_diff

    torch.manual_seed(2)
    logits, boxes = torch.randn(1, 8, 3) * 15, torch.rand(1, 8, 4)
    order = torch.randperm(8)
    moved = [logits[:, order], boxes[:, order] + 5e-3]
    assert max_relative_diff(moved, [logits, boxes], rows_as_set=True) == pytest.approx(5e-3, rel=1e-4)
    nan = boxes.clone()
    nan[0, 0, 0] = float("nan")
    assert max_relative_diff([logits, nan], [logits, boxes]) == float("inf")
    assert max_relative_diff([logits, nan], [logits, boxes], rows_as_set=True) == float("inf")
