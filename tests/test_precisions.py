"""Precisions: what each (backend, device, precision) runs, refusals before any model loads,
the TF32 policy, and bf16 on the CPU end to end (mAP within 0.01 of fp32 on the same images)."""

from __future__ import annotations

import sys

import onnx
import pytest
import torch
from conftest import COCO_DIR, YOLOX_NANO, requires_coco, requires_yolox, run_benchmark

from harness.backends.support import check_support, cpu_bf16_supported, fp16_converter_installed
from harness.errors import UsageError


def run_cli(monkeypatch, capsys, *args) -> tuple[int, str]:
    """`va-bench run ...` in this process (so fakes apply): (exit code, stderr)."""
    from harness import cli

    monkeypatch.setattr(sys, "argv", ["va-bench", "run", "--coco-dir", str(COCO_DIR), *args])
    with pytest.raises(SystemExit) as exc:
        cli.main()
    return exc.value.code, capsys.readouterr().err


def never_load(monkeypatch) -> list:
    """Make every core load fail the test loudly; returns the list of attempted loads (must stay empty)."""
    import harness.backends as backends

    calls = []

    def refuse(*args, **kwargs):
        calls.append(args)
        raise AssertionError("a model core was loaded before the precision check")

    monkeypatch.setattr(backends, "load_core", refuse)  # every detector's core loads through it
    return calls


@pytest.mark.parametrize("backend, device, precision, expect", [
    ("pytorch", "cpu", "fp16", "use --precision bf16 or fp32"),
    ("onnxruntime", "cpu", "fp16", "CPU provider"),
    ("onnxruntime", "cpu", "bf16", "not supported by the onnxruntime backend"),
    ("pytorch", "cpu", "int8", "not supported by the pytorch backend; use --backend openvino or tflite"),
    ("onnxruntime", "cpu", "int8", "not supported by the onnxruntime backend; use --backend openvino or tflite"),
    ("pytorch", "cpu", "int4", "unknown precision"),
    ("openvino", "cuda", "fp32", "runs on cpu only; use --device cpu"),
    ("ncnn", "cpu", "int8", "not supported by the ncnn backend on cpu; use fp32, fp16"),
    ("torchscript", "cpu", "fp16", "not supported by the torchscript backend on cpu; use fp32"),
    ("my-backend", "cpu", "fp16", "use fp32"),
])
def test_unsupported_combinations_are_one_line_refusals(backend, device, precision, expect):
    with pytest.raises(UsageError, match=expect) as exc:
        check_support(backend, device, precision)
    assert "\n" not in str(exc.value)


def test_supported_combinations_pass():
    check_support("pytorch", "cpu", "fp32")
    check_support("onnxruntime", "cpu", "fp32")
    if cpu_bf16_supported():
        check_support("pytorch", "cpu", "bf16")


@requires_coco
@requires_yolox
@pytest.mark.parametrize("args, expect", [
    (["--backend", "pytorch", "--precision", "fp16"], "fp16 on the CPU"),
    (["--backend", "onnxruntime", "--precision", "bf16"], "bf16 is not supported by the onnxruntime"),
    (["--backend", "onnxruntime", "--precision", "fp32", "fp16"], "CPU provider"),
    (["--ort-provider", "tensorrt"], "add --device cuda"),
])
def test_refused_before_any_model_is_loaded(monkeypatch, capsys, tmp_path, args, expect):
    loads = never_load(monkeypatch)
    code, err = run_cli(monkeypatch, capsys, "--output-dir", str(tmp_path / "o"), *args)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and expect in lines[0], err
    assert "Traceback" not in err
    assert loads == []
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


def test_tf32_default_is_off_and_pinned():
    from harness.config import RunConfig
    from harness.measure.env import apply_tf32, tf32_state

    assert RunConfig().tf32 == "off"
    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.get_float32_matmul_precision())
    try:
        torch.backends.cudnn.allow_tf32 = True  # torch's own default: must not survive "off"
        apply_tf32("off")
        state = tf32_state("off")
        assert state == {**state, "matmul_allow_tf32": False, "cudnn_allow_tf32": False,
                         "float32_matmul_precision": "highest", "mode": "off"}
        apply_tf32("on")
        state = tf32_state("on")
        assert state["matmul_allow_tf32"] and state["cudnn_allow_tf32"] and state["mode"] == "on"
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
        torch.set_float32_matmul_precision(saved[2])


def test_tf32_default_goes_back_to_what_the_process_found(monkeypatch):
    """A fleet node runs job after job in one process: a job of --tf32 default after one of --tf32 on gets torch's
    defaults as the process found them, not the last job's TF32."""
    from harness.measure import env

    saved = (torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32,
             torch.get_float32_matmul_precision())
    monkeypatch.setattr(env, "_TF32_AS_FOUND", None)
    try:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = False, True  # torch's own defaults
        torch.set_float32_matmul_precision("highest")
        env.apply_tf32("on")
        env.apply_tf32("default")
        state = env.tf32_state("default")
        assert (state["matmul_allow_tf32"], state["cudnn_allow_tf32"], state["float32_matmul_precision"]) == \
            (False, True, "highest")
        env.apply_tf32("off")
        env.apply_tf32("default")
        assert env.tf32_state("default")["cudnn_allow_tf32"] is True
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved[:2]
        torch.set_float32_matmul_precision(saved[2])


@requires_yolox
@pytest.mark.skipif(not fp16_converter_installed(), reason="onnxconverter-common not installed (va-bench[gpu])")
def test_onnx_fp16_conversion_keeps_fp32_io():
    """The ORT CUDA fp16 graph: weights fp16 (onnxconverter-common), inputs/outputs still fp32."""
    from harness.backends.onnxruntime import to_fp16

    model = onnx.load(str(YOLOX_NANO))
    converted, how = to_fp16(model)
    f16, f32 = onnx.TensorProto.FLOAT16, onnx.TensorProto.FLOAT
    weights = [init.data_type for init in converted.graph.initializer if len(init.dims) == 4]
    assert weights and all(t == f16 for t in weights)
    assert [i.type.tensor_type.elem_type for i in converted.graph.input] == [f32]
    assert [o.type.tensor_type.elem_type for o in converted.graph.output] == [f32]
    assert "onnxconverter-common" in how


@requires_coco
@requires_yolox
@pytest.mark.skipif(not cpu_bf16_supported(), reason="this torch build has no CPU bf16 convolution")
def test_bf16_on_cpu_end_to_end_matches_fp32(tmp_path_factory):
    """yolox-nano, PyTorch, the same 16 images in fp32 and bf16: mAP within 0.01, recorded in runtime."""
    _, records = run_benchmark(tmp_path_factory, "bf16", backends=["pytorch"], precisions=["fp32", "bf16"],
                               limit=16, batch_sizes=[8], warmup_batches=1, min_timed_batches=2, layers=False,
                               profile=False, energy=False, draw_images=0)
    by_precision = {r.cell.load.precision: r for r in records}
    assert set(by_precision) == {"fp32", "bf16"}
    fp32, bf16 = (by_precision[p].accuracy.stats["mAP_50_95"] for p in ("fp32", "bf16"))
    assert fp32 > 0.2 and abs(bf16 - fp32) <= 0.01
    assert by_precision["bf16"].runtime["precision_mode"] == "torch.autocast(torch.bfloat16)"
    assert by_precision["fp32"].runtime["precision_mode"] == "fp32 (IEEE)"
