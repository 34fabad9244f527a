"""GPU code paths on a CPU machine (issue 11): CUDA, ONNX Runtime's CUDA/TensorRT providers and TensorRT
engines are replaced by fakes, to test what is selected, what is refused (never a fallback) and what is
recorded. The real providers need onnxruntime-gpu and a GPU; these fakes stand in for them only."""

from __future__ import annotations

import importlib.machinery
import json
import sys
import types
from types import SimpleNamespace

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from conftest import YOLOX_NANO, requires_coco, requires_yolox
from test_precisions import never_load, run_cli

from harness.backends import BackendOptions, set_options
from harness.backends.onnxruntime import OnnxRuntimeBackend, OnnxRuntimeCore
from harness.backends.support import check_support, fp16_converter_installed
from harness.backends.tensorrt import check_engine_weights
from harness.errors import UsageError
from harness.measure.device import Device
from harness.results.submission import runtime_block

GPU_NAME = "NVIDIA H100 80GB HBM3"
ALL_PROVIDERS = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch sees one CUDA device (nothing is ever run on it in these tests)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: GPU_NAME)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)


@pytest.fixture(autouse=True)
def _reset_backend_options():
    yield
    set_options(BackendOptions())


class FakeSession:
    """Stands in for onnxruntime.InferenceSession: keeps what it was given, runs nothing real."""

    made: list[FakeSession] = []
    drop: set[str] = set()  # providers this fake ORT silently drops (as ORT does when CUDA libs are missing)

    def __init__(self, model_bytes, options, providers):
        self.model = onnx.load_from_string(model_bytes)
        self.providers = providers
        self.runs: list[tuple[int, ...]] = []
        FakeSession.made.append(self)

    def get_providers(self):
        return [name for name, _ in self.providers if name not in FakeSession.drop] or ["CPUExecutionProvider"]

    def get_inputs(self):
        return [SimpleNamespace(name="images")]

    def run(self, names, feeds):
        x = feeds["images"]
        self.runs.append(x.shape)
        return [np.zeros((x.shape[0], 3549, 85), np.float32)]


@pytest.fixture
def fake_ort(monkeypatch):
    FakeSession.made, FakeSession.drop = [], set()
    monkeypatch.setattr(onnxruntime, "InferenceSession", FakeSession)
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: list(ALL_PROVIDERS))
    return FakeSession


@pytest.fixture(scope="module")
def yolox_graph():
    if not YOLOX_NANO.is_file():
        pytest.skip("yolox_nano.onnx missing")
    return onnx.load(str(YOLOX_NANO))


# ------------------------------------------------------------------------------ refusals (before loading)

@requires_coco
@requires_yolox
def test_ort_cuda_without_cuda_provider_is_exit_2_with_install_line(monkeypatch, capsys, tmp_path, fake_cuda):
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: ["CPUExecutionProvider"])
    loads = never_load(monkeypatch)
    out = tmp_path / "o"
    code, err = run_cli(monkeypatch, capsys, "--backend", "onnxruntime", "--device", "cuda", "--output-dir", str(out))
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1, err
    assert "CUDAExecutionProvider" in lines[0] and "pip install 'va-bench[gpu]'" in lines[0]
    assert loads == [] and not out.exists()


@requires_coco
@requires_yolox
def test_device_cuda_without_a_gpu_is_exit_2(monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, err = run_cli(monkeypatch, capsys, "--device", "cuda", "--output-dir", str(tmp_path / "o"))
    assert code == 2 and "no CUDA device" in err and not (tmp_path / "o").exists()


def test_tensorrt_provider_missing_is_refused(monkeypatch):
    monkeypatch.setattr(onnxruntime, "get_available_providers",
                        lambda: ["CUDAExecutionProvider", "CPUExecutionProvider"])
    with pytest.raises(UsageError, match="TensorrtExecutionProvider.*va-bench\\[gpu\\]"):
        check_support("onnxruntime", "cuda", "fp16", "tensorrt")


@pytest.mark.parametrize("backend, precision, provider, expect", [
    ("onnxruntime", "bf16", "tensorrt", "bf16 is not supported by the onnxruntime"),
    ("onnxruntime", "fp32", "cpu", "under a GPU label"),
    ("pytorch", "bf16", "auto", "no bf16 support"),
])
def test_gpu_refusals(monkeypatch, fake_ort, fake_cuda, backend, precision, provider, expect):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    with pytest.raises(UsageError, match=expect):
        check_support(backend, "cuda", precision, provider)


@pytest.mark.skipif(not fp16_converter_installed(), reason="onnxconverter-common not installed (va-bench[gpu])")
def test_gpu_precisions_accepted(fake_ort, fake_cuda):
    for backend, precision, provider in [("pytorch", "fp16", "auto"), ("pytorch", "bf16", "auto"),
                                         ("onnxruntime", "fp16", "cuda"), ("onnxruntime", "fp16", "tensorrt"),
                                         ("onnxruntime", "fp32", "tensorrt")]:
        check_support(backend, "cuda", precision, provider)


# ------------------------------------------------------------------------------ selection and recording

def test_ort_cuda_session_records_the_provider_it_runs(fake_ort, fake_cuda, yolox_graph):
    core = OnnxRuntimeCore(yolox_graph, Device("cuda"), threads=None)
    assert [name for name, _ in fake_ort.made[0].providers] == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    info = core.info()
    assert (core.format, core.provider, info["execution_provider"]) == ("onnx", "cuda", "CUDAExecutionProvider")
    assert info["device_name"] == f"cuda:0 {GPU_NAME}" and info["precision_mode"] == "fp32 (IEEE)"


def test_ort_gpu_providers_run_on_the_device_index_asked_for(fake_ort, fake_cuda, yolox_graph):
    OnnxRuntimeCore(yolox_graph, Device("cuda", 1), threads=None)
    set_options(BackendOptions(ort_provider="tensorrt"))
    OnnxRuntimeCore(yolox_graph, Device("cuda", 1), threads=None)
    assert [s.providers[0][1]["device_id"] for s in fake_ort.made] == [1, 1]


def test_ort_provider_silently_dropped_is_an_error(fake_ort, fake_cuda, yolox_graph):
    fake_ort.drop = {"CUDAExecutionProvider"}
    with pytest.raises(UsageError, match="dropped the requested CUDAExecutionProvider"):
        OnnxRuntimeCore(yolox_graph, Device("cuda"), threads=None)


@pytest.mark.skipif(not fp16_converter_installed(), reason="onnxconverter-common not installed (va-bench[gpu])")
def test_ort_cuda_fp16_runs_the_converted_graph(fake_ort, fake_cuda, yolox_graph):
    core = OnnxRuntimeCore(yolox_graph, Device("cuda"), threads=None, precision="fp16")
    given = fake_ort.made[0].model
    conv_weights = [i.data_type for i in given.graph.initializer if len(i.dims) == 4]
    assert conv_weights and set(conv_weights) == {onnx.TensorProto.FLOAT16}
    assert given.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert "onnxconverter-common" in core.info()["precision_mode"]


def test_tensorrt_provider_options_and_engine_build_recorded(fake_ort, fake_cuda, yolox_graph, tmp_path):
    set_options(BackendOptions(ort_provider="tensorrt", trt_cache_dir=str(tmp_path / "trt"), trt_workspace_mb=512,
                               max_batch=8))
    from harness.backends import CoreSource

    core = OnnxRuntimeBackend().load(CoreSource("yolox-nano", onnx_model=lambda: yolox_graph), Device("cuda"),
                                     "fp16", (416, 416), threads=None)
    session = fake_ort.made[-1]
    name, options = session.providers[0]
    assert name == "TensorrtExecutionProvider"
    assert options == {"device_id": 0, "trt_fp16_enable": True, "trt_engine_cache_enable": True,
                       "trt_engine_cache_path": str(tmp_path / "trt"), "trt_max_workspace_size": 512 * 2**20}
    assert [shape[0] for shape in session.runs] == [1, 8]  # engines built at load, not in a timed batch
    info = core.info()
    assert (core.format, core.provider) == ("tensorrt", "cuda")  # the site's format/provider for TensorRT
    assert info["execution_provider"] == "TensorrtExecutionProvider"
    assert info["provider_options"]["TensorrtExecutionProvider"]["trt_fp16_enable"] is True
    assert isinstance(info["engine_build_seconds"], float)
    # the graph itself stays fp32: TensorRT lowers precision itself with trt_fp16_enable
    assert session.model.graph.initializer[0].data_type == onnx.TensorProto.FLOAT


def test_runtime_block_uses_site_vocabulary_and_keeps_the_exact_device():
    tf32 = {"mode": "off"}
    for runtime, env_device, device, name in [
        ({"device": "cuda:0"}, "cuda:0", "gpu", "cuda:0"),  # an old record: TorchCore wrote cuda:0 there
        ({"device": "gpu", "device_name": f"cuda:0 {GPU_NAME}"}, "cuda:0", "gpu", f"cuda:0 {GPU_NAME}"),
        ({"device": "cpu", "device_name": "cpu"}, "cpu", "cpu", "cpu"),
    ]:
        record = SimpleNamespace(runtime=runtime, environment={"device": env_device, "tf32": tf32})
        block = runtime_block(record)
        assert (block["device"], block["device_name"], block["tf32"]) == (device, name, tf32)


# ------------------------------------------------------------------------------ serialized TensorRT engines

@pytest.fixture
def engine_file(tmp_path):
    path = tmp_path / "yolox_nano.engine"
    path.write_bytes(b"not really an engine")
    return path


def test_engine_without_tensorrt_package_is_refused(monkeypatch, engine_file):
    monkeypatch.setitem(sys.modules, "tensorrt", None)  # import (and find_spec) of tensorrt fails
    monkeypatch.setattr("harness.backends.tensorrt.tensorrt_installed", lambda: False)
    with pytest.raises(UsageError, match="`tensorrt` package is not installed; pip install tensorrt"):
        check_engine_weights(str(engine_file), "cuda")
    with pytest.raises(UsageError, match="GPU only"):
        check_engine_weights(str(engine_file), "cpu")


def test_engine_needs_its_json_sidecar(monkeypatch, engine_file):
    fake = types.ModuleType("tensorrt")
    fake.__spec__ = importlib.machinery.ModuleSpec("tensorrt", None)
    monkeypatch.setitem(sys.modules, "tensorrt", fake)
    with pytest.raises(UsageError, match="no JSON sidecar"):
        check_engine_weights(str(engine_file), "cuda")
    sidecar = engine_file.with_name(engine_file.name + ".json")
    sidecar.write_text("{not json")
    with pytest.raises(UsageError, match="not a readable JSON sidecar"):
        check_engine_weights(str(engine_file), "cuda")
    sidecar.write_text(json.dumps({"command": "trtexec --onnx=yolox_nano.onnx --fp16", "tensorrt_version": "10.13"}))
    check_engine_weights(str(engine_file), "cuda")


# ------------------------------------------------------------------------------ execution modes (issue 11, item 3)

@requires_coco
@requires_yolox
@pytest.mark.parametrize("args, expect", [
    (["--backend", "pytorch", "--cuda-graphs"], "--cuda-graphs needs --device cuda"),
    (["--backend", "onnxruntime", "--compile", "default"], "not for --backend onnxruntime"),
    (["--backend", "pytorch", "--compile", "default", "--layers"], "drop --layers"),
])
def test_execution_modes_refused_before_loading(monkeypatch, capsys, tmp_path, args, expect):
    loads = never_load(monkeypatch)
    code, err = run_cli(monkeypatch, capsys, "--output-dir", str(tmp_path / "o"), *args)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and expect in lines[0], err
    assert loads == [] and not (tmp_path / "o").exists()


def test_shape_constants_stay_on_the_host_and_the_forward_is_unchanged(yolox_graph):
    """onnx2torch's Slice/Reshape/Resize constants: resolved on the host (no device->host copy per forward,
    capturable), and the yolox-nano forward is bit-identical to onnx2torch's own."""
    from harness.backends.capturable import HostConstantCall, StaticSlice, keep_shape_constants_on_host
    from harness.backends.export import make_batch_dynamic
    from harness.backends.pytorch import onnx_to_torch

    graph = make_batch_dynamic(yolox_graph)
    reference, module = onnx_to_torch(graph).eval(), onnx_to_torch(graph).eval()
    assert keep_shape_constants_on_host(module) == 13  # yolox-nano: 8 Slice, 3 Reshape, 2 Resize
    kinds = [type(m).__name__ for m in module.modules()]
    assert kinds.count("StaticSlice") == 8 and kinds.count("StaticReshape") == 3
    assert kinds.count("HostConstantCall") == 2  # Resize: its scales stay host tensors
    assert not any(type(m).__name__ in ("OnnxSlice", "OnnxReshape") for m in module.modules())
    module.to(torch.float64)  # .to() moves buffers and parameters, never the host constants
    hosts = [c for m in module.modules() if isinstance(m, HostConstantCall) for c in m.host_constants
             if c is not None]
    assert hosts and all(c.device.type == "cpu" and c.dtype != torch.float64 for c in hosts)
    assert all(isinstance(s, slice | type(Ellipsis)) for m in module.modules() if isinstance(m, StaticSlice)
               for s in m.slices)
    module.to(torch.float32)
    x = torch.rand(2, 3, 416, 416) * 255
    with torch.inference_mode():
        assert torch.equal(reference(x), module(x))


def test_compile_happens_at_load_and_is_recorded():
    """torch.compile (static shapes): compiled by one forward per batch size at load, timed apart, same outputs."""
    from harness.backends.pytorch import TorchCore

    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.Sigmoid())
    eager = TorchCore(module, Device("cpu"))
    compiled = TorchCore(torch.nn.Sequential(*module), Device("cpu"))
    compiled.prepare("default", False, (32, 32), (1, 2))
    info = compiled.info()
    assert info["compile"] == "default" and info["compile_seconds"] > 0 and "dynamic=False" in info["compile_note"]
    assert info["cuda_graphs"] is False and eager.info()["compile"] == "none"
    x = torch.rand(2, 3, 32, 32)
    torch.testing.assert_close(compiled(x)[0], eager(x)[0], rtol=1e-5, atol=1e-6)
