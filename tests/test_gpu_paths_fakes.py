"""GPU code paths on a CPU machine: CUDA, ONNX Runtime's CUDA/TensorRT providers and TensorRT
engines are replaced by fakes, to test what is selected, what is refused (never a fallback) and what is
recorded. The real providers need onnxruntime-gpu and a GPU; these fakes stand in for them only."""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import importlib.machinery
import json
import sys
import threading
import time
import types
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from conftest import (
    COCO_DIR,
    YOLOX_NANO,
    backend_options,
    load_core_of,
    load_source,
    requires_coco,
    requires_yolox,
    run_in_process,
)
from test_precisions import never_load, run_cli

from harness.backends import detector_backends
from harness.backends.onnxruntime import OnnxRuntimeBackend, OnnxRuntimeCore
from harness.backends.support import check_support, fp16_converter_installed
from harness.detector.engine import check_engine_weights
from harness.errors import UsageError
from harness.measure.device import Device
from harness.models.registry import get_detector  # imported before never_load patches harness.backends.load_core
from harness.results.submission import runtime_block

GPU_NAME = "NVIDIA H100 80GB HBM3"
ALL_PROVIDERS = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]


@pytest.fixture
def fake_cuda(monkeypatch):
    """torch sees one CUDA device (nothing is ever run on it in these tests)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index=0: GPU_NAME)
    monkeypatch.setattr(torch.cuda, "get_device_properties",  # an H100: compute capability 9.0
                        lambda index=0: SimpleNamespace(name=GPU_NAME, total_memory=80 * 2**30, major=9, minor=0))


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
    monkeypatch.setattr(torch.cuda, "get_device_properties",  # a V100: 7.0, bf16 only emulated
                        lambda index=0: SimpleNamespace(name="Tesla V100", total_memory=16 * 2**30, major=7, minor=0))
    with pytest.raises(UsageError, match=expect):
        check_support(backend, "cuda", precision, provider)


def test_bf16_is_checked_on_the_gpu_asked_for_without_emulation(monkeypatch, fake_cuda):
    """cuda:0 an A100 (8.0), cuda:1 a T4 (7.5, where torch.cuda.is_bf16_supported() still says True:
    it counts emulation)."""
    majors = {0: 8, 1: 7}
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda index=0: SimpleNamespace(name="gpu", total_memory=2**34, major=majors[index], minor=0))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    check_support("pytorch", "cuda", "bf16", device_index=0)
    with pytest.raises(UsageError, match="no bf16 support"):
        check_support("pytorch", "cuda", "bf16", device_index=1)


@pytest.mark.skipif(not fp16_converter_installed(), reason="onnxconverter-common not installed (va-bench[gpu])")
def test_gpu_precisions_accepted(fake_ort, fake_cuda):
    for backend, precision, provider in [("pytorch", "fp16", "auto"), ("pytorch", "bf16", "auto"),
                                         ("onnxruntime", "fp16", "cuda"), ("onnxruntime", "fp16", "tensorrt"),
                                         ("onnxruntime", "fp32", "tensorrt")]:
        check_support(backend, "cuda", precision, provider)


# ------------------------------------------------------------------------------ selection and recording

def test_ort_cuda_session_records_the_provider_it_runs(fake_ort, fake_cuda, yolox_graph):
    core = OnnxRuntimeCore(yolox_graph, Device("cuda"), threads=None, options=backend_options())
    assert [name for name, _ in fake_ort.made[0].providers] == ["CUDAExecutionProvider", "CPUExecutionProvider"]
    info = core.info()
    assert (core.format, core.provider, info["execution_provider"]) == ("onnx", "cuda", "CUDAExecutionProvider")
    assert info["device_name"] == f"cuda:0 {GPU_NAME}" and info["precision_mode"] == "fp32 (IEEE)"


def test_ort_gpu_providers_run_on_the_device_index_asked_for(fake_ort, fake_cuda, yolox_graph):
    OnnxRuntimeCore(yolox_graph, Device("cuda", 1), threads=None, options=backend_options())
    OnnxRuntimeCore(yolox_graph, Device("cuda", 1), threads=None, options=backend_options(ort_provider="tensorrt"))
    assert [s.providers[0][1]["device_id"] for s in fake_ort.made] == [1, 1]
    assert fake_ort.made[1].providers[1] == ("CUDAExecutionProvider", {"device_id": 1, "use_tf32": 0})


def test_ort_provider_silently_dropped_is_an_error(fake_ort, fake_cuda, yolox_graph):
    fake_ort.drop = {"CUDAExecutionProvider"}
    with pytest.raises(UsageError, match="dropped the requested CUDAExecutionProvider"):
        OnnxRuntimeCore(yolox_graph, Device("cuda"), threads=None, options=backend_options())


@pytest.mark.skipif(not fp16_converter_installed(), reason="onnxconverter-common not installed (va-bench[gpu])")
def test_ort_cuda_fp16_runs_the_converted_graph(fake_ort, fake_cuda, yolox_graph):
    core = OnnxRuntimeCore(yolox_graph, Device("cuda"), threads=None, precision="fp16", options=backend_options())
    given = fake_ort.made[0].model
    conv_weights = [i.data_type for i in given.graph.initializer if len(i.dims) == 4]
    assert conv_weights and set(conv_weights) == {onnx.TensorProto.FLOAT16}
    assert given.graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.FLOAT
    assert "onnxconverter-common" in core.info()["precision_mode"]


def test_tensorrt_provider_options_and_engine_build_recorded(fake_ort, fake_cuda, yolox_graph, tmp_path):
    from harness.detector.source import CoreSource

    core = OnnxRuntimeBackend().load(CoreSource("yolox-nano", onnx_model=lambda: yolox_graph), Device("cuda"),
                                     "fp16", (416, 416), threads=None,
                                     options=backend_options(ort_provider="tensorrt", trt_workspace_mb=512,
                                                             trt_cache_dir=str(tmp_path / "trt"), batch_sizes=[1, 8]))
    session = fake_ort.made[-1]
    name, options = session.providers[0]
    assert name == "TensorrtExecutionProvider"
    # what TensorRT does not take runs on CUDA, not the CPU (ORT's TensorRT EP docs register both)
    assert session.providers[1:] == [("CUDAExecutionProvider", {"device_id": 0, "use_tf32": 0}),
                                 ("CPUExecutionProvider", {})]
    # one engine folder per graph: ORT keys a cached engine on names only (another model of the same names, or
    # retrained weights, would run this one's engine)
    graph_folder = tmp_path / "trt" / hashlib.sha256(session.model.SerializeToString()).hexdigest()[:16]
    assert options == {"device_id": 0, "trt_fp16_enable": True, "trt_engine_cache_enable": True,
                       "trt_engine_cache_path": str(graph_folder), "trt_max_workspace_size": 512 * 2**20}
    assert [shape[0] for shape in session.runs] == [1, 8]  # engines built at load, not in a timed batch
    info = core.info()
    assert (core.format, core.provider) == ("tensorrt", "cuda")  # the site's format/provider for TensorRT
    assert info["execution_provider"] == "TensorrtExecutionProvider"
    assert info["provider_options"]["TensorrtExecutionProvider"]["trt_fp16_enable"] is True
    assert isinstance(info["engine_build_seconds"], float)
    # the graph itself stays fp32: TensorRT lowers precision itself with trt_fp16_enable
    assert session.model.graph.initializer[0].data_type == onnx.TensorProto.FLOAT


class GpuLikeSession:
    """onnxruntime.InferenceSession where the CPU provider is the real one and the GPU providers run the graph on
    the CPU too, off by 1 % where the GPU would not be IEEE fp32 (an fp16 graph, or TF32 allowed)."""

    real = onnxruntime.InferenceSession
    made: list[GpuLikeSession] = []

    def __init__(self, model_bytes, options, providers):
        self.providers, self.model = providers, onnx.load_from_string(model_bytes)
        gpu = providers[0][0] != "CPUExecutionProvider"
        fp16 = any(i.data_type == onnx.TensorProto.FLOAT16 for i in self.model.graph.initializer)
        graph = _fp32_graph(self.model).SerializeToString() if fp16 else model_bytes
        self.session = self.real(graph, options, providers=["CPUExecutionProvider"])
        self.noise = 0.01 if gpu and (fp16 or providers[0][1].get("use_tf32") != 0) else 0.0
        GpuLikeSession.made.append(self)

    def get_providers(self):
        return [name for name, _ in self.providers]

    def get_inputs(self):
        return self.session.get_inputs()

    def run(self, names, feeds, *args):
        return [o * (1 + self.noise) for o in self.session.run(names, feeds, *args)]


def _fp32_graph(model: onnx.ModelProto) -> onnx.ModelProto:
    """An fp16-converted graph back in fp32 (what the CPU provider runs in place of a GPU's fp16 kernels)."""
    from onnx import numpy_helper

    model = onnx.ModelProto.FromString(model.SerializeToString())
    for init in model.graph.initializer:
        if init.data_type == onnx.TensorProto.FLOAT16:
            init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float32), init.name))
    for node in model.graph.node:
        for attr in node.attribute:
            if node.op_type == "Cast" and attr.name == "to" and attr.i == onnx.TensorProto.FLOAT16:
                attr.i = onnx.TensorProto.FLOAT
            if node.op_type == "Constant" and attr.name == "value" and attr.t.data_type == onnx.TensorProto.FLOAT16:
                attr.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(attr.t).astype(np.float32)))
    for value in [*model.graph.value_info]:
        model.graph.value_info.remove(value)
    return model


@pytest.mark.skipif(not fp16_converter_installed(), reason="onnxconverter-common not installed (va-bench[gpu])")
@pytest.mark.parametrize("precision, tf32, checked_on", [("fp32", "off", "this session"),
                                                         ("fp32", "on", "ONNX Runtime CPU, fp32"),
                                                         ("fp16", "off", "ONNX Runtime CPU, fp32")])
def test_a_torch_core_s_export_is_checked_in_ieee_fp32_whatever_the_gpu_row_runs(
        monkeypatch, fake_cuda, tmp_path, precision, tf32, checked_on):
    """An fp16 or TF32 session differs from the module by more than the export check's tolerance: the export is
    checked on the CPU provider instead, and the export itself stays cached."""
    from test_backends import Head

    from harness.backends.export import export_path, state_dict_sha256
    from harness.detector.source import CoreSource

    monkeypatch.setenv("VA_BENCH_WEIGHTS", str(tmp_path))
    GpuLikeSession.made = []
    monkeypatch.setattr(onnxruntime, "InferenceSession", GpuLikeSession)
    monkeypatch.setattr(onnxruntime, "get_available_providers", lambda: list(ALL_PROVIDERS))
    core = load_source(CoreSource("tiny-head", torch_module=Head), "onnxruntime", Device("cuda"), precision,
                       (32, 32), tf32=tf32)
    info = core.info()
    assert info["exported_from_pytorch"]["checked_on"] == checked_on
    assert info["provider_options"]["CUDAExecutionProvider"]["use_tf32"] == (tf32 == "on")
    assert export_path("tiny-head", state_dict_sha256(Head()), (32, 32)).is_file()


def test_ort_cuda_provider_s_tf32_follows_the_tf32_option(fake_ort, fake_cuda, yolox_graph):
    """The CUDA provider runs fp32 in TF32 unless told otherwise: --tf32 off (the default) must say so."""
    for mode, want in [("off", {"use_tf32": 0}), ("on", {"use_tf32": 1}), ("default", {})]:
        OnnxRuntimeCore(yolox_graph, Device("cuda"), threads=None, options=backend_options(tf32=mode, device="cuda"))
        assert fake_ort.made[-1].providers[0] == ("CUDAExecutionProvider", {"device_id": 0, **want})


@requires_coco
@requires_yolox
def test_tensorrt_provider_fp32_with_tf32_off_is_refused(monkeypatch, capsys, fake_ort, fake_cuda, tmp_path):
    loads = never_load(monkeypatch)
    out = tmp_path / "o"
    code, err = run_cli(monkeypatch, capsys, "--device", "cuda", "--ort-provider", "tensorrt", "--output-dir",
                        str(out))
    assert code == 2 and "--tf32 on" in err and len(err.strip().splitlines()) == 1, err
    assert loads == [] and not out.exists()
    from harness.config import RunConfig
    from harness.run.plan import check_runtimes

    for fields in ({"precisions": ["fp16"]}, {"tf32": "on"}, {"tf32": "default"}):  # what the refusal advises
        check_runtimes(RunConfig(device="cuda", ort_provider="tensorrt", **fields))


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
    monkeypatch.setattr("harness.detector.engine.tensorrt_installed", lambda: False)
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


# ------------------------------------------------------------------------------ execution modes

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
    from harness.detector.graph import make_batch_dynamic, onnx_to_torch

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
    # a short final batch is compiled before it is timed, once; dynamo may never fall back to eager silently
    import torch._dynamo.config as dynamo_config

    assert dynamo_config.recompile_limit >= 2 * 2 + 2 and dynamo_config.fail_on_recompile_limit_hit
    compiled.prepare_shape((3, 3, 32, 32))
    compiled.prepare_shape((3, 3, 32, 32))
    compiled.prepare_shape((2, 3, 32, 32))  # compiled at load already
    assert compiled.info()["compiled_before_short_batch"] == [3]
    short = torch.rand(3, 3, 32, 32)
    torch.testing.assert_close(compiled(short)[0], eager(short)[0], rtol=1e-5, atol=1e-6)


def test_max_autotune_outputs_are_cloned_out_of_inductors_cuda_graphs(cuda_on_cpu, monkeypatch):
    """--compile max-autotune on CUDA replays inductor's CUDA graphs, whose outputs the next replay overwrites
    (overlapped mode post-processes batch k-1 while batch k runs): the core hands out copies. Faked: the
    compiled forward returns one buffer it owns and overwrites, as a replay does."""
    from harness.backends.pytorch import TorchCore

    owned = torch.zeros(2, 4)
    modes, calls = [], []

    def fake_compile(module, mode=None, dynamic=None):
        modes.append(mode)

        def replay(batch):
            calls.append(tuple(batch.shape))
            owned.fill_(float(batch.sum()))
            return owned
        return replay

    monkeypatch.setattr(torch, "compile", fake_compile)
    core = TorchCore(torch.nn.Conv2d(3, 4, 1), Device("cuda"))
    core.prepare("max-autotune", False, (8, 8), (2,))
    first = core(torch.ones(2, 3, 8, 8))[0]
    second = core(torch.full((2, 3, 8, 8), 2.0))[0]
    assert modes == ["max-autotune"] and first.data_ptr() != owned.data_ptr()
    assert float(first[0, 0]) == 2 * 3 * 8 * 8 and float(second[0, 0]) == 2 * 2 * 3 * 8 * 8
    calls.clear()
    core.prepare_shape((1, 3, 8, 8))  # a short batch: inductor's CUDA graphs warm up, then record, untimed
    assert calls == [(1, 3, 8, 8)] * 2
    monkeypatch.setattr(torch, "autocast", lambda *args, **kwargs: contextlib.nullcontext())  # no CUDA here
    low = TorchCore(torch.nn.Conv2d(3, 4, 1), Device("cuda"), "bf16")  # `.float()` of an fp32 output is itself
    low.prepare("max-autotune", False, (8, 8), (2,))
    assert low(torch.ones(2, 3, 8, 8))[0].data_ptr() != owned.data_ptr()
    plain = TorchCore(torch.nn.Conv2d(3, 4, 1), Device("cuda"))
    plain.prepare("max-autotune", True, (8, 8), ())  # with our own CUDA graphs inductor adds none: no copy here
    assert modes[-1] == "max-autotune-no-cudagraphs" and not plain._clone_outputs


# ------------------------------------------------------------------------------ --backend tensorrt, end to end
# A fake `tensorrt` package: its "engine" file is FAKE_ENGINE + a JSON header line (input shape, profile) + an
# ONNX graph, which the fake runs with ONNX Runtime on CPU tensors, reading and writing the buffers at the
# addresses the core hands it (as TensorRT does with device pointers). Torch's CUDA calls are faked too; the
# tensors stay on the CPU. What this proves: selection, refusals, that the engine's outputs reach the shared
# post-processing unchanged, and what the submission records. It proves nothing about real TensorRT.

FAKE_ENGINE = b"FAKE-TRT-ENGINE\n"
DYNAMIC_PROFILE = {"shape": [-1, 3, -1, -1], "profile": [[1, 3, 32, 32], [8, 3, 416, 416], [16, 3, 1024, 1024]]}


class FakeExecutionContext:
    def __init__(self, engine: FakeEngine):
        self.engine, self.shapes, self.addresses = engine, {}, {}

    def set_input_shape(self, name, shape) -> bool:
        low, _, high = self.engine.get_tensor_profile_shape(name, 0)
        if not all(lo <= s <= hi for lo, s, hi in zip(low, shape, high, strict=True)):
            return False
        self.shapes[name] = tuple(shape)
        if shape not in self.engine.output_shapes:  # what TensorRT's shape inference would say: ask the graph
            zeros = np.zeros(shape, np.float32)
            self.engine.output_shapes[shape] = [o.shape for o in self.engine.session.run(None, {name: zeros})]
        for out, out_shape in zip(self.engine.outputs, self.engine.output_shapes[shape], strict=True):
            self.shapes[out] = tuple(out_shape)
        return True

    def get_tensor_shape(self, name):
        return self.shapes[name]

    def set_tensor_address(self, name, address):
        self.addresses[name] = address

    def _buffer(self, name) -> np.ndarray:
        shape = self.shapes[name]
        count = int(np.prod(shape))
        return np.ctypeslib.as_array((ctypes.c_float * count).from_address(self.addresses[name])).reshape(shape)

    def execute_async_v3(self, stream) -> bool:
        name = self.engine.inputs[0]
        outputs = self.engine.session.run(None, {name: self._buffer(name).copy()})
        for out, value in zip(self.engine.outputs, outputs, strict=True):
            self._buffer(out)[...] = value
        self.engine.executed.append(self.shapes[name])
        self.engine.streams.append(stream)
        return True


class FakeEngine:
    executed: list[tuple[int, ...]] = []  # input shapes of every execution, across engines (cleared per test)
    streams: list[int] = []  # the stream handle of every execution

    def __init__(self, header: dict, graph: bytes):
        self.session = onnxruntime.InferenceSession(graph, providers=["CPUExecutionProvider"])
        self.inputs = [i.name for i in self.session.get_inputs()]
        self.outputs = [o.name for o in self.session.get_outputs()]
        self.header, self.output_shapes = header, {}
        self.num_io_tensors = len(self.inputs) + len(self.outputs)

    def get_tensor_name(self, index):
        return (self.inputs + self.outputs)[index]

    def get_tensor_mode(self, name):
        return "INPUT" if name in self.inputs else "OUTPUT"

    def get_tensor_dtype(self, name):
        return self.header.get("dtype", "float32")

    def get_tensor_shape(self, name):
        return tuple(self.header["shape"]) if name in self.inputs else (-1, -1, -1)

    def get_tensor_profile_shape(self, name, profile):
        return self.header.get("profile") or [self.header["shape"]] * 3

    def create_execution_context(self):
        return FakeExecutionContext(self)


def fake_tensorrt() -> types.ModuleType:
    trt = types.ModuleType("tensorrt")
    trt.__spec__ = importlib.machinery.ModuleSpec("tensorrt", None)
    trt.__version__ = "10.13.0-fake"
    trt.float32, trt.float16, trt.int32, trt.int64, trt.bfloat16 = "float32", "float16", "int32", "int64", "bfloat16"
    trt.TensorIOMode = SimpleNamespace(INPUT="INPUT", OUTPUT="OUTPUT")
    trt.Logger = type("Logger", (), {"WARNING": 2, "__init__": lambda self, level: None})

    class Runtime:
        def __init__(self, logger):
            pass

        def deserialize_cuda_engine(self, data: bytes):
            if not data.startswith(FAKE_ENGINE):
                return None  # as TensorRT answers an engine of another version or GPU
            header, graph = data[len(FAKE_ENGINE):].split(b"\n", 1)
            return FakeEngine(json.loads(header), graph)

    trt.Runtime = Runtime
    return trt


@pytest.fixture
def fake_trt(monkeypatch):
    """`import tensorrt` gives the fake; find_spec sees it installed."""
    FakeEngine.executed, FakeEngine.streams = [], []
    monkeypatch.setitem(sys.modules, "tensorrt", fake_tensorrt())
    return FakeEngine


class FakeStream:
    """torch.cuda.Stream stand-in: counts its synchronize() calls; `make_current` is torch.cuda.stream(s)."""

    default: FakeStream
    made: list[FakeStream] = []

    def __init__(self, device=None, priority=0):
        self.cuda_stream, self.synced = len(FakeStream.made) + 1, 0
        FakeStream.made.append(self)

    def synchronize(self):
        self.synced += 1

    def wait_stream(self, other):
        self.waited_for = getattr(self, "waited_for", []) + [other]

    entered: list[tuple[str, FakeStream]] = []  # (thread name, stream) of each make_current

    @staticmethod
    @contextlib.contextmanager
    def make_current(stream):
        FakeStream.entered.append((threading.current_thread().name, stream))
        yield stream


FakeStream.default = FakeStream()
FakeStream.default.cuda_stream = 0


class CurrentDevice:
    """torch.cuda.device(index) stand-in: the indices made current, in order (CurrentDevice.entered)."""

    entered: list[int] = []

    def __init__(self, index):
        self.index = index

    def __enter__(self):
        CurrentDevice.entered.append(self.index)

    def __exit__(self, *exc):
        return False


@pytest.fixture
def cuda_on_cpu(monkeypatch, fake_cuda):
    """Device("cuda") tensors live on the CPU; torch's CUDA sync, events, streams and properties are stand-ins."""
    from harness.measure.device import Device as DeviceClass

    class Event:  # wall time between records, so the forward's "GPU time" is a real (host) interval
        def __init__(self, enable_timing=False):
            self.at = None

        def record(self, stream=None):
            self.at = time.perf_counter()

        def synchronize(self):
            pass

        def elapsed_time(self, end):
            return (end.at - self.at) * 1e3

    monkeypatch.setattr(DeviceClass, "torch_device", property(lambda self: torch.device("cpu")))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    monkeypatch.setattr(torch.cuda, "device", CurrentDevice)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: FakeStream.default)
    monkeypatch.setattr(torch.cuda, "Stream", FakeStream)
    monkeypatch.setattr(torch.cuda, "stream", FakeStream.make_current)
    monkeypatch.setattr(torch.cuda, "Event", Event)
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda index=0: SimpleNamespace(name=GPU_NAME, total_memory=80 * 2**30, major=9, minor=0))


def write_engine(path: Path, graph: onnx.ModelProto, command: str | None = "trtexec --onnx=m.onnx --fp16",
                 header: dict | None = None, sidecar: dict | None = None) -> Path:
    """A fake engine of `graph` and its sidecar (`command`, or the whole `sidecar` dict; None: no sidecar)."""
    path.write_bytes(FAKE_ENGINE + json.dumps(header or DYNAMIC_PROFILE).encode() + b"\n" + graph.SerializeToString())
    if sidecar is not None or command is not None:
        sidecar = sidecar if sidecar is not None else {"command": command, "tensorrt_version": "10.13.0"}
        path.with_name(path.name + ".json").write_text(json.dumps(sidecar))
    return path


@pytest.fixture(scope="module")
def dynamic_yolox(yolox_graph):
    from harness.detector.graph import make_batch_dynamic

    return make_batch_dynamic(yolox_graph)  # what trtexec --minShapes/--maxShapes would be given


@pytest.fixture
def yolox_engine(tmp_path, dynamic_yolox):
    return write_engine(tmp_path / "yolox_nano.engine", dynamic_yolox)


def test_an_engine_selects_the_tensorrt_backend_and_is_the_weights_identity(yolox_engine):
    detector = get_detector("yolox-nano", str(yolox_engine))
    assert type(detector).__name__ == "YoloxDetector"  # the ONNX family, not libreyolo's yolox-nano
    assert detector_backends(detector) == ("tensorrt",) and detector.core_source.engine_file == yolox_engine
    assert detector.weights.sha256 == hashlib.sha256(yolox_engine.read_bytes()).hexdigest()
    assert detector.preprocess.input_size == (416, 416) and detector.postprocess.iou == 0.6
    stats = detector.model_stats((416, 416)).to_dict()
    assert stats["params_millions"] is None and "TensorRT engine" in stats["unavailable"]["gflops"]
    for model_id, sidecar_layout, layout in [("yolov8n", None, "dense"), ("yolo26n", None, "end2end"),
                                             ("yolo26n", "dense", "dense")]:
        sidecar = {"command": "trtexec --fp16", **({"layout": sidecar_layout} if sidecar_layout else {})}
        engine = write_engine(yolox_engine.with_name(f"{model_id}.engine"), onnx.ModelProto(), sidecar=sidecar)
        ultralytics = get_detector(model_id, str(engine))
        assert detector_backends(ultralytics) == ("tensorrt",) and ultralytics.layout == layout
    with pytest.raises(UsageError, match="does not run TensorRT engines"):
        get_detector("ssdlite320_mobilenet_v3_large", str(yolox_engine))


@requires_coco
@requires_yolox
@pytest.mark.parametrize("case, args, expect", [
    ("other backend", [], "runs on --backend tensorrt only, not onnxruntime"),
    ("no engine", ["--backend", "tensorrt"], "pass --weights MODEL.engine"),
    ("no GPU", ["--backend", "tensorrt", "--device", "cpu"], "GPU only; add --device cuda"),
    ("no package", ["--backend", "tensorrt"], "`tensorrt` package is not installed; pip install tensorrt"),
    ("no sidecar", ["--backend", "tensorrt"], "no JSON sidecar"),
    ("sidecar not JSON", ["--backend", "tensorrt"], "not a readable JSON sidecar"),
    ("sidecar without command", ["--backend", "tensorrt"], "command: Field required"),
    ("int8 engine", ["--backend", "tensorrt"], "built with --int8"),
    ("sidecar contradicts command", ["--backend", "tensorrt"], "\"precision\" is fp32, but its command builds fp16"),
    ("wrong precision", ["--backend", "tensorrt", "--precision", "fp32"], "built fp16 (its sidecar's command); "
                                                                          "drop --precision"),
    ("fp32 engine allowing TF32", ["--backend", "tensorrt", "--tf32", "off"], "rebuild it with --noTF32, or drop "
                                                                             "--tf32"),
    ("layers", ["--backend", "tensorrt", "--layers"], "drop --layers"),
])
def test_engine_refusals_are_one_line_before_loading(monkeypatch, tmp_path, fake_trt, fake_cuda, yolox_engine,
                                                     case, args, expect):
    sidecar = yolox_engine.with_name(yolox_engine.name + ".json")
    if case == "no package":
        monkeypatch.setitem(sys.modules, "tensorrt", None)
        monkeypatch.setattr("harness.detector.engine.tensorrt_installed", lambda: False)
    edits = {"no sidecar": None, "sidecar not JSON": "{not json", "sidecar without command": {"precision": "fp16"},
             "int8 engine": {"command": "trtexec --onnx=m.onnx --int8 --fp16"},
             "sidecar contradicts command": {"command": "trtexec --fp16", "precision": "fp32"},
             "fp32 engine allowing TF32": {"command": "trtexec --onnx=m.onnx --saveEngine=m.engine"}}
    if case in edits:
        sidecar.unlink()
        if edits[case] is not None:
            sidecar.write_text(edits[case] if isinstance(edits[case], str) else json.dumps(edits[case]))
    if case in ("no sidecar", "sidecar not JSON", "sidecar without command", "int8 engine",
                "sidecar contradicts command", "fp32 engine allowing TF32"):
        args = [*args, "--precision", "fp32" if case == "fp32 engine allowing TF32" else "fp16"]
    weights = str(YOLOX_NANO) if case == "no engine" else str(yolox_engine)
    loads = never_load(monkeypatch)
    out = tmp_path / "o"
    device = [] if "--device" in args else ["--device", "cuda"]
    result = run_in_process("run", "--coco-dir", str(COCO_DIR), "--weights", weights, *device, *args,
                            "--output-dir", str(out))
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and expect in lines[0], (case, result.stderr)
    assert loads == [] and not out.exists()


def test_precision_and_tf32_not_given_are_the_engines(tmp_path, dynamic_yolox):
    from harness.config import load_config
    from harness.run.plan import engine_defaults

    def resolved(command: str, **given):
        engine = write_engine(tmp_path / "m.engine", dynamic_yolox, command=command)
        config = engine_defaults(load_config(None, {"weights": str(engine), "backends": ["tensorrt"], **given}))
        return config.precisions, config.tf32

    assert resolved("trtexec --onnx=m.onnx --fp16") == (["fp16"], "off")
    assert resolved("trtexec --onnx=m.onnx") == (["fp32"], "on")  # trtexec allows TF32 unless --noTF32
    assert resolved("trtexec --onnx=m.onnx --noTF32") == (["fp32"], "off")
    assert resolved("trtexec --onnx=m.onnx", precisions=["fp16"], tf32="off") == (["fp16"], "off")  # kept, then
    assert resolved("trtexec --bf16", tf32="default", device="cuda") == (["bf16"], "default")  # refused later
    # (by check_engine_run)


def test_engine_shapes_and_precision_are_checked_at_load(fake_trt, cuda_on_cpu, tmp_path, dynamic_yolox):
    from harness.backends.tensorrt import TensorRTEngineCore
    from harness.detector.source import CoreSource

    static = write_engine(tmp_path / "static.engine", dynamic_yolox, header={"shape": [1, 3, 416, 416]})
    with pytest.raises(UsageError, match="takes images from 1x3x416x416 to 1x3x416x416, not 8x3x416x416"):
        load_source(CoreSource("yolox-nano", engine_file=static), "tensorrt", Device("cuda"), "fp16", (416, 416),
                    batch_sizes=[1, 8])
    assert load_source(CoreSource("yolox-nano", engine_file=static), "tensorrt", Device("cuda"), "fp16",
                       (416, 416)).info()["engine_io"]["images"]["shape"] == [1, 3, 416, 416]
    with pytest.raises(UsageError, match="built fp16 \\(its sidecar\\), not fp32"):
        TensorRTEngineCore(static, Device("cuda"), "fp32")
    int8_io = write_engine(tmp_path / "int8_io.engine", dynamic_yolox, header={**DYNAMIC_PROFILE, "dtype": "int8"})
    with pytest.raises(UsageError, match="images \\(int8\\), output \\(int8\\).*--inputIOFormats"):
        TensorRTEngineCore(int8_io, Device("cuda"), "fp16")
    other = write_engine(tmp_path / "other.engine", dynamic_yolox)
    other.write_bytes(b"an engine of another TensorRT")
    with pytest.raises(UsageError, match="could not deserialize it"):
        TensorRTEngineCore(other, Device("cuda"), "fp16")


def test_engine_head_is_checked_against_the_family_at_load(fake_trt, cuda_on_cpu, yolox_engine):
    """A YOLOX engine given as yolov8n: its [1, 3549, 85] output is not the dense layout's [1, 84, N]."""
    detector = get_detector("yolov8n", str(yolox_engine))
    with pytest.raises(UsageError, match=r"outputs are \[\[1, 3549, 85\]\], not the dense layout's one \[1, 84, N\]"):
        load_core_of(detector, "tensorrt", Device("cuda"), "fp16", (416, 416))
    core = load_core_of(get_detector("yolox-nano", str(yolox_engine)), "tensorrt", Device("cuda"), "fp16", (416, 416))
    assert core.info()["engine_precision"] == "fp16" and fake_trt.executed == [(1, 3, 416, 416)] * 2


@requires_coco
@requires_yolox
def test_engine_run_detections_equal_the_onnx_run_and_the_submission_records_the_engine(
        fake_trt, cuda_on_cpu, yolox_engine, tmp_path):
    """`va-bench run --backend tensorrt --weights x.engine` on a (faked) GPU against the same graph on ONNX
    Runtime (CPU): every detection identical, so the engine's outputs reach the shared decode/NMS unchanged."""
    common = ["run", "--coco-dir", str(COCO_DIR), "--model", "yolox-nano", "--limit", "16", "--batch-sizes", "4",
              "--preprocess", "cv2", "--warmup-batches", "1", "--warmup-seconds", "0", "--min-timed-batches", "2",
              "--no-layers", "--no-profile", "--no-energy", "--no-memory", "--draw-images", "0",
              "--output-dir", str(tmp_path / "o")]
    trt = run_in_process(*common, "--run-id", "trt", "--backend", "tensorrt", "--weights", str(yolox_engine),
                         "--device", "cuda")  # no --precision: the engine's (fp16, its sidecar's command)
    assert trt.returncode == 0, trt.stderr[-3000:]
    assert (4, 3, 416, 416) in fake_trt.executed  # the timed batches ran the engine
    ort = run_in_process(*common, "--run-id", "ort", "--backend", "onnxruntime", "--device", "cpu")
    assert ort.returncode == 0, ort.stderr[-3000:]

    def only(run_id: str, folder: str):
        files = list((tmp_path / "o" / run_id / folder).glob("*.json"))
        assert len(files) == 1, files
        return json.loads(files[0].read_text())

    engine_detections, onnx_detections = only("trt", "detections"), only("ort", "detections")
    assert len(engine_detections) > 100 and engine_detections == onnx_detections
    doc = only("trt", "submissions")
    runtime = doc["runtime"]
    assert (runtime["format"], runtime["provider"], runtime["device"], runtime["precision"]) == \
        ("tensorrt", "cuda", "gpu", "fp16")
    assert runtime["backend"] == "tensorrt" and runtime["tensorrt"] == "10.13.0-fake"
    assert runtime["engine_manifest"] == {"command": "trtexec --onnx=m.onnx --fp16", "tensorrt_version": "10.13.0"}
    assert runtime["engine_precision"] == "fp16" and runtime["device_name"] == f"cuda:0 {GPU_NAME}"
    sha = hashlib.sha256(yolox_engine.read_bytes()).hexdigest()
    assert doc["repro"]["weights"]["sha256"] == sha and doc["repro"]["weights"]["file"] == "yolox_nano.engine"
    assert doc["model"]["weights"] == "yolox_nano.engine" and doc["model"]["id"] == "yolox-nano"
    assert doc["model_stats"]["params_millions"] is None and "TensorRT engine" in doc["model_stats"]["unavailable"][
        "params_millions"]
    assert "tensorrt core allocates outside torch" in doc["memory"]["vram_reason"]
    assert doc["hardware"]["gpu"] == GPU_NAME and doc["accuracy"]["mAP_50_95"] == only("ort", "submissions")[
        "accuracy"]["mAP_50_95"]


def onnx_core_behind_a_gpu_core(takes_device_tensors: bool = True):
    """(detector, core, the faked cuda:0 device, the sample's records): the real ONNX core runs on the CPU behind a
    core that takes device tensors (as a torch or TensorRT core does) or host memory (as ONNX Runtime does)."""
    from harness.data.coco import CocoDataset

    detector = get_detector("yolox-nano")
    real = load_core_of(detector, "onnxruntime", Device("cpu"), "fp32", (416, 416))
    core = type("Core", (), {"backend": "x", "takes_device_tensors": takes_device_tensors,
                             "__call__": lambda self, batch: real(batch)})()
    dataset = CocoDataset(COCO_DIR)
    return detector, core, Device("cuda", 0), dataset.records(dataset.variant("sample"))


@requires_coco
@requires_yolox
@pytest.mark.parametrize("takes_device_tensors", [True, False])
def test_forward_gpu_is_timed_only_for_cores_on_torchs_stream(cuda_on_cpu, takes_device_tensors):
    """A torch or TensorRT-engine core runs on torch's current stream, which the CUDA events bracket:
    forward_gpu. ONNX Runtime (host memory in) launches on a stream of its own: no forward_gpu, never a
    near-zero figure. The real ONNX core runs on the CPU behind both stand-ins."""
    from harness.pipeline.pipeline import DetectorPipeline, Thresholds
    from harness.pipeline.stage_timer import StageTimer

    detector, core, device, records = onnx_core_behind_a_gpu_core(takes_device_tensors)
    pipeline = DetectorPipeline(detector, core, device, detector.preprocess, Thresholds(0.001, 0.65, 100))
    records = records[:2]
    timer = StageTimer(device)
    detections = pipeline.run_batch(records, timer)
    assert len(detections) == 2
    assert ("forward_gpu" in timer.batches[0].stages) is takes_device_tensors


@requires_yolox
def test_engine_on_cuda_n_loads_and_runs_with_that_device_current(fake_trt, cuda_on_cpu, yolox_engine):
    """TensorRT (runtime, context, enqueue) works on the current CUDA device, which is device 0 unless set:
    an engine run on cuda:1 makes cuda:1 current around each of them."""
    CurrentDevice.entered = []
    core = load_core_of(get_detector("yolox-nano", str(yolox_engine)), "tensorrt", Device("cuda", 1), "fp16",
                       (416, 416))
    core(torch.zeros(1, 3, 416, 416))
    assert len(CurrentDevice.entered) >= 3 and set(CurrentDevice.entered) == {1}
    # enqueued on the core's own stream (not the legacy default stream, handle 0), joined to the caller's
    assert fake_trt.streams and set(fake_trt.streams) == {core.stream.cuda_stream} and core.stream.cuda_stream != 0
    assert core.stream.waited_for == [FakeStream.default] * len(fake_trt.streams)
    assert FakeStream.default.waited_for[-1] is core.stream


@requires_coco
@requires_yolox
def test_overlapped_mode_on_cuda_prepares_each_batch_on_its_own_stream(cuda_on_cpu, monkeypatch):
    """Overlapped mode on a (faked) GPU: each batch is prepared on a stream of its own and waited for there,
    the forward waits for its own stream only (never a device-wide sync, which would also wait for the
    workers' preprocessing), and the detections equal latency mode's. The real ONNX core runs on the CPU
    behind a core that takes device tensors (as a torch or TensorRT core does)."""
    from harness.pipeline.pipeline import DetectorPipeline, Thresholds
    from harness.pipeline.stage_timer import StageTimer

    detector, core, device, records = onnx_core_behind_a_gpu_core()
    records = records[:12]
    batches = [records[i:i + 4] for i in range(0, 12, 4)]
    latency = DetectorPipeline(detector, core, device, detector.preprocess, Thresholds(0.001, 0.65, 100))
    expected = [latency.run_batch(b, StageTimer(device)) for b in batches]
    device_syncs = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: device_syncs.append(device))
    FakeStream.made, FakeStream.entered, FakeStream.default.synced = [], [], 0
    overlapped = DetectorPipeline(detector, core, device, detector.preprocess, Thresholds(0.001, 0.65, 100),
                                  stream_workers=2)
    got = [detections for detections, _ in overlapped.run_overlapped(batches)]
    flat = lambda runs: [(d.image_id, d.boxes.tobytes(), d.scores.tobytes(), d.labels.tobytes())  # noqa: E731
                         for run in runs for d in run]
    assert flat(got) == flat(expected) and len(flat(got)) == 12
    worker_streams = FakeStream.made
    assert 1 <= len(worker_streams) <= 2  # one per worker thread, made once; it prepares and finishes there
    assert sum(s.synced for s in worker_streams) == 3  # each batch's preparation waited for on its worker's stream
    # each batch prepared and finished on a worker's own stream, entered on that worker's thread, never the default
    assert len(FakeStream.entered) == 6
    assert all(name.startswith("va-stream") and stream in worker_streams for name, stream in FakeStream.entered)
    assert FakeStream.default.synced == 3 and device_syncs == []  # the forward's stream, once per batch


@requires_coco
@requires_yolox
def test_selection_on_the_host_gives_the_devices_detections_and_says_where_it_ran(cuda_on_cpu, monkeypatch):
    """`--nms-on host` on a (faked) GPU: the candidates are copied once (the `copy` substep), the selection runs
    there, the detections equal the device placement's, and the record says where the selection ran."""
    from harness.pipeline import postprocess
    from harness.pipeline.pipeline import DetectorPipeline, Thresholds
    from harness.pipeline.stage_timer import StageTimer

    copies = []
    real_copy = postprocess.BatchCandidates.host_copy
    monkeypatch.setattr(postprocess.BatchCandidates, "host_copy", lambda self: copies.append(1) or real_copy(self))
    monkeypatch.setattr(postprocess.BatchCandidates, "to",  # tensors of the faked GPU live on the CPU: always copy
                        lambda self, device: self.host_copy() if device.type == "cpu" else self)
    detector, core, device, records = onnx_core_behind_a_gpu_core()
    records = records[:4]
    runs = {}
    for where in ("device", "host"):
        pipeline = DetectorPipeline(detector, core, device, detector.preprocess, Thresholds(0.001, 0.65, 100),
                                    nms_on=where)
        timer = StageTimer(device)
        runs[where] = (pipeline.run_batch(records, timer), timer.batches[0].stages, pipeline.host_info(False))
    flat = lambda run: [(d.image_id, d.boxes.tobytes(), d.scores.tobytes(), d.labels.tobytes())  # noqa: E731
                        for d in run]
    assert flat(runs["host"][0]) == flat(runs["device"][0]) and sum(len(d.scores) for d in runs["host"][0]) > 0
    assert copies == [1]  # the host placement only, one copy per batch
    assert "postprocess.copy" in runs["host"][1] and "postprocess.copy" not in runs["device"][1]
    assert runs["host"][2]["selection_on"].startswith("host") and runs["device"][2]["selection_on"] == "cpu"
    # on a GPU the device's selection is the whole batch's NMS at once, the host's torchvision's per image
    assert runs["device"][2]["nms"].startswith("the whole batch") and runs["host"][2]["nms"].startswith("torchvision")
    with pytest.raises(ValueError, match="nms_on"):
        DetectorPipeline(detector, core, device, detector.preprocess, Thresholds(0.001, 0.65, 100), nms_on="gpu")


@requires_coco
@requires_yolox
def test_host_processes_on_a_gpu_give_the_threads_detections(cuda_on_cpu):
    """`--host-processes` on a (faked) GPU with the selection on the host: the canvas comes up from the process's
    shared memory, the raw outputs go down to it and each image's detections come back; the detections equal the
    workers' threads' (which decode on the device and copy the candidates)."""
    from harness.pipeline.pipeline import DetectorPipeline, Thresholds
    from harness.pipeline.stage_timer import StageTimer

    detector, core, device, records = onnx_core_behind_a_gpu_core()
    batches = [records[i:i + 4] for i in range(0, 8, 4)]
    runs = {}
    for processes in (0, 1):
        pipeline = DetectorPipeline(detector, core, device, detector.preprocess, Thresholds(0.001, 0.65, 100),
                                    stream_workers=2, nms_on="host", host_processes=processes)
        timer = StageTimer(device)
        runs[processes] = [d for out in pipeline.run_stream(batches, timer, overlap=True) for d in out]
    flat = lambda run: [(d.image_id, d.boxes.tobytes(), d.scores.tobytes(), d.labels.tobytes())  # noqa: E731
                        for d in run]
    assert flat(runs[1]) == flat(runs[0]) and sum(len(d.scores) for d in runs[1]) > 0
    host = pipeline.host_info(True)["host_processes"]
    assert host["processes"] == 1 and "the head decode" in host["runs"]
    assert pipeline.selection_on == "host (one copy of the raw outputs)"
    assert pipeline.preprocess_info()["host_processes"] == 1
