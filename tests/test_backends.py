"""The backend registry: families describe a core (CoreSource), backends run it; exports of torch cores
are cached by weights hash and refused when they disagree with PyTorch at batch 1/2/4."""

import re
import warnings

import onnx
import pytest
import torch
from conftest import YOLOX_NANO, load_source
from torch import nn

from harness.backends import _registry, backend_names, register_backend
from harness.backends.export import export_path, state_dict_sha256
from harness.detector.graph import make_batch_dynamic
from harness.detector.source import CoreSource
from harness.errors import UsageError
from harness.measure.device import parse_device

CPU = parse_device("cpu")
SIZE = (32, 32)


class Head(nn.Module):
    """A small conv 'detector core' returning two raw tensors, batch-independent."""

    def __init__(self, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.box = nn.Conv2d(8, 4, 1)

    def forward(self, x):
        f = torch.relu(self.conv(x))
        return self.box(f).flatten(2), f.mean(dim=(2, 3))


class BakedBatch(Head):
    """Reshapes with the batch size as a Python int: tracing freezes the traced batch (2) into the graph."""

    def forward(self, x):
        f = torch.relu(self.conv(x))
        return (self.box(f).reshape(int(x.shape[0]), 4, -1),)


class MixesBatch(Head):
    """Each output row depends on the other images of the batch (batch statistics)."""

    def forward(self, x):
        return (self.conv(x) - self.conv(x).mean(dim=0, keepdim=True),)


@pytest.fixture(autouse=True)
def _weights_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VA_BENCH_WEIGHTS", str(tmp_path))


def test_sources_pick_their_backends():
    torch_only = CoreSource("t", torch_module=Head)
    converting = ("openvino", "ncnn", "tflite")  # runtimes that convert the ONNX graph (an export of a torch core)
    assert backend_names(torch_only) == ("pytorch", "onnxruntime", *converting, "torchscript")
    # a core the tracer cannot export (data-dependent control flow) cannot be traced for TorchScript either
    assert backend_names(CoreSource("t", torch_module=Head, exportable=False)) == ("pytorch",)
    onnx_only = CoreSource("o", onnx_model=lambda: onnx.ModelProto())
    # pytorch and torchscript through onnx2torch
    assert backend_names(onnx_only) == ("pytorch", "onnxruntime", *converting, "torchscript")
    with pytest.raises(UsageError, match="unknown backend 'tensorflow'"):
        load_source(torch_only, "tensorflow", CPU, "fp32", SIZE)
    with pytest.raises(UsageError, match="cannot run on onnxruntime .*because"):
        load_source(CoreSource("t", torch_module=Head, exportable=False, export_note="because"), "onnxruntime", CPU,
                  "fp32", SIZE)
    with pytest.raises(UsageError, match="fp16"):
        load_source(torch_only, "pytorch", CPU, "fp16", SIZE)


def test_a_new_backend_plugs_in_without_touching_families():
    class Doubling:
        name = "doubling-test"

        def supports(self, source):
            return source.torch_module is not None

        def load(self, source, device, precision, input_size, threads, options):
            module = source.torch_module().eval()
            return lambda x: [2 * t for t in module(x)]

    register_backend(Doubling())
    try:
        source = CoreSource("t", torch_module=Head)
        assert "doubling-test" in backend_names(source)
        x = torch.rand(2, 3, *SIZE)
        with torch.no_grad():
            assert torch.equal(load_source(source, "doubling-test", CPU, "fp32", SIZE)(x)[0], 2 * Head()(x)[0])
    finally:  # the registry is process-wide: later tests must not see the test backend
        _registry().pop("doubling-test", None)


def test_export_matches_torch_and_is_cached_by_weights_hash():
    source = CoreSource("tiny-head", torch_module=Head)
    core = load_source(source, "onnxruntime", CPU, "fp32", SIZE)
    info = core.info()["exported_from_pytorch"]
    assert info["checked_batches"] == [1, 2, 4] and info["max_relative_diff"] < 1e-5
    path = export_path("tiny-head", state_dict_sha256(Head()), SIZE)
    assert info["file"] == str(path) and path.is_file()
    x = torch.rand(3, 3, *SIZE)  # a batch size the export was not traced at
    with torch.no_grad():
        for got, want in zip(core(x), Head()(x), strict=True):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    mtime = path.stat().st_mtime_ns
    load_source(source, "onnxruntime", CPU, "fp32", SIZE)
    assert path.stat().st_mtime_ns == mtime  # served from the cache
    other = export_path("tiny-head", state_dict_sha256(Head(seed=1)), SIZE)
    assert other != path  # other weights, other file


def test_export_that_bakes_the_batch_is_refused_and_not_kept():
    source = CoreSource("baked", torch_module=BakedBatch)
    with pytest.raises(UsageError, match="disagrees with PyTorch at batch 1") as err:
        load_source(source, "onnxruntime", CPU, "fp32", SIZE)
    assert "\n" not in str(err.value) and "--backend pytorch" in str(err.value)
    assert not export_path("baked", state_dict_sha256(BakedBatch()), SIZE).exists()


class EditedHead(Head):
    """Head's weights, its forward edited since Head was exported: the export cache (keyed by the weights) holds
    the old computation."""

    def forward(self, x):
        box, pooled = super().forward(x)
        return box * 0.5, pooled


@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_a_converting_runtime_never_converts_an_export_of_the_modules_old_code(precision):
    """Refused for good at fp32 ("use --backend pytorch", the stale export kept), the old code run silently at fp16
    (its conversion is not checked against the module): the cached export is checked and exported again."""
    load_source(CoreSource("tiny-head", torch_module=Head), "onnxruntime", CPU, "fp32", SIZE)  # Head's export cached
    core = load_source(CoreSource("tiny-head", torch_module=EditedHead), "openvino", CPU, precision, SIZE)
    x = torch.rand(2, 3, *SIZE)
    with torch.no_grad():
        want = EditedHead()(x)[0]
    assert float((core(x)[0] - want).abs().max()) < 0.01 * float(want.abs().max())


def test_a_conversion_of_other_output_shapes_says_so():
    """A converter that transposed an output (onnx2tf's NHWC) was "max relative difference inf": what differs is
    the shapes, which the line now names."""
    from harness.backends.export import check_export

    def transposed(x):
        with torch.no_grad():
            box, pooled = Head()(x)
        return [box.transpose(1, 2), pooled]

    with pytest.raises(UsageError, match=re.escape("(outputs of shapes [[1, 1024, 4], [1, 8]] where the reference "
                                                   "gives [[1, 4, 1024], [1, 8]])")):
        check_export("head", Head().eval(), transposed, SIZE, None, runtime="LiteRT")


class CachesGrid(Head):
    """Caches a tensor made in its forward (as detectors cache anchor grids per input shape)."""

    def __init__(self):
        super().__init__()
        self.grid = None

    def forward(self, x):
        if self.grid is None or self.grid.shape[-1] != x.shape[-2] * x.shape[-1]:
            self.grid = torch.arange(x.shape[-2] * x.shape[-1], dtype=x.dtype)
        box, pooled = super().forward(x)
        return box * self.grid, pooled  # a product: autograd would save the cached tensor


def test_a_module_that_ran_under_inference_mode_still_exports():
    """A PyTorch row runs the shared module under inference mode first: the tensor it cached then is an inference
    tensor, which the ONNX tracer cannot use; the export traces a copy."""
    module = CachesGrid()
    with torch.inference_mode():
        module(torch.rand(1, 3, *SIZE))
    core = load_source(CoreSource("caches-grid", torch_module=lambda: module), "onnxruntime", CPU, "fp32", SIZE)
    assert core.info()["exported_from_pytorch"]["max_relative_diff"] < 1e-5


def test_state_dict_hash_follows_the_weights():
    assert state_dict_sha256(Head()) == state_dict_sha256(Head())
    changed = Head()
    with torch.no_grad():
        changed.conv.bias[0] += 1e-3
    assert state_dict_sha256(changed) != state_dict_sha256(Head())


def _onnx(module, path, dynamic=True):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), (torch.rand(1, 3, *SIZE),), str(path), input_names=["images"],
                          opset_version=17, dynamo=False, dynamic_axes={"images": {0: "batch"}} if dynamic else None)
    return onnx.load(str(path))


def test_onnx_source_batch_rows_are_checked(tmp_path):
    good = make_batch_dynamic(_onnx(Head(), tmp_path / "good.onnx", dynamic=False))
    for backend in ("onnxruntime", "pytorch"):
        load_source(CoreSource("good", onnx_model=lambda: good, check_batches=(1, 2)), backend, CPU, "fp32", SIZE)
    mixed = _onnx(MixesBatch(), tmp_path / "mixed.onnx")
    with pytest.raises(UsageError, match="at batch 2 the graph does not give each image's own output"):
        load_source(CoreSource("mixed", onnx_model=lambda: mixed, check_batches=(1, 2)), "onnxruntime", CPU, "fp32",
                  SIZE)


def test_onnx2torch_gaps_are_one_line(tmp_path):
    class ClampMax(nn.Module):  # Clip with only a max: onnx2torch cannot read the empty optional input
        def forward(self, x):
            return x.clamp(max=0.5)

    model = _onnx(ClampMax(), tmp_path / "clip.onnx")
    with pytest.raises(UsageError, match="onnx2torch cannot convert this ONNX graph.*--backend onnxruntime"):
        load_source(CoreSource("clip", onnx_model=lambda: model), "pytorch", CPU, "fp32", SIZE)


def test_torch_core_moves_a_copy_never_the_family_module(monkeypatch):
    """The family's module is shared (FLOPs, the ONNX export, the next group): loading on another device
    must leave it where it was."""
    from harness.backends.pytorch import TorchCore
    from harness.measure.device import Device

    module = torch.nn.Conv2d(3, 4, 3)
    assert TorchCore(module, Device("cpu")).torch_module is module  # already there: no copy
    monkeypatch.setattr(Device, "torch_device", property(lambda self: torch.device("meta")))
    core = TorchCore(module, Device("cpu"))
    assert core.torch_module is not module and core.torch_module.weight.device.type == "meta"
    assert module.weight.device.type == "cpu"


@pytest.mark.skipif(not YOLOX_NANO.is_file(), reason="yolox_nano.onnx missing")
def test_flop_count_is_cached_per_graph_and_input_size(monkeypatch, tmp_path):
    """The count is a pure function of the graph and the input size: the second run reads it, a damaged
    cache file is counted again, another input size is its own entry."""
    import harness.detector.graph as graph_tools
    from harness.detector.graph import onnx_model_stats

    monkeypatch.setenv("VA_BENCH_WEIGHTS", str(tmp_path))
    graph = onnx.load(str(YOLOX_NANO))
    first = onnx_model_stats(graph, (416, 416))
    # YOLOX's README: 1.08 GFLOPs at 416 (thop also counts BN/activations: within 5 %, as test_inspect checks)
    assert abs(first.gflops - 1.08) / 1.08 < 0.05
    counted = []
    real = graph_tools.count_flops
    monkeypatch.setattr(graph_tools, "count_flops", lambda *a: counted.append(a) or real(*a))
    assert onnx_model_stats(graph, (416, 416)).gflops == first.gflops and counted == []
    (cache,) = (tmp_path / "model-stats").glob("*__416x416__v*.json")
    cache.write_text("{not json")
    assert onnx_model_stats(graph, (416, 416)).gflops == first.gflops and len(counted) == 1
    assert onnx_model_stats(graph, (320, 320)).gflops < first.gflops and len(counted) == 2
    assert not list((tmp_path / "model-stats").glob(".*"))  # no temporary file left


def _conv_gflops_by_hand(size: int) -> float:
    """YOLOX-Nano's FLOPs (2 x MAC) at size x size counted from its ONNX graph alone: ONNX shape inference gives each
    Conv's output shape, its weight's shape gives the MACs per output value (its other ops do no multiply-adds)."""
    from onnx import shape_inference

    model = onnx.load(str(YOLOX_NANO))
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[2].dim_value = dims[3].dim_value = size
    del model.graph.value_info[:]
    for output in model.graph.output:  # inferred again at this size
        for dim in output.type.tensor_type.shape.dim:
            dim.Clear()
    model = shape_inference.infer_shapes(model)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in model.graph.value_info}
    weights = {i.name: list(i.dims) for i in model.graph.initializer}
    assert {n.op_type for n in model.graph.node} & {"MatMul", "Gemm", "ConvTranspose", "Einsum"} == set()
    total = 0
    for node in (n for n in model.graph.node if n.op_type == "Conv"):
        n, c_out, h, w = shapes[node.output[0]]
        _, c_in_per_group, kh, kw = weights[node.input[1]]
        total += 2 * n * c_out * h * w * c_in_per_group * kh * kw
    return total / 1e9


@pytest.mark.skipif(not YOLOX_NANO.is_file(), reason="yolox_nano.onnx missing")
@pytest.mark.parametrize("size", [320, 416, 640])
def test_gflops_at_each_input_size_are_the_graphs_convolutions_counted_by_hand(monkeypatch, tmp_path, size):
    from harness.detector.graph import onnx_model_stats

    monkeypatch.setenv("VA_BENCH_WEIGHTS", str(tmp_path))
    assert onnx_model_stats(onnx.load(str(YOLOX_NANO)), (size, size)).gflops == round(_conv_gflops_by_hand(size), 4)


def test_batch_row_check_feeds_a_device_core_on_its_device_and_fails_in_one_line():
    """check_batch_rows (Ultralytics graphs on PyTorch) hands a core that takes device tensors its batch on
    that device (a CPU batch into CUDA weights is a crash on a GPU); a core that cannot run at all is one line."""
    from types import SimpleNamespace

    from harness.detector.graph import check_batch_rows

    class RowWise:  # each output row from its own input row: passes the check
        takes_device_tensors = True
        device = SimpleNamespace(torch_device=torch.device("meta"))

        def __init__(self):
            self.devices = set()

        def __call__(self, batch):
            self.devices.add(batch.device.type)
            return [torch.ones(batch.shape[0], 5)]

    core = RowWise()
    check_batch_rows("m", core, (32, 32), (1, 2, 4))
    assert core.devices == {"meta"}
    host = RowWise()
    host.takes_device_tensors = False
    check_batch_rows("m", host, (32, 32), (1, 2))
    assert host.devices == {"cpu"}

    def broken(batch):
        raise RuntimeError("Input type (torch.FloatTensor) and weight type (torch.cuda.FloatTensor) should be the same")

    with pytest.raises(UsageError, match=r"^m: the graph does not run at batch 1 \(RuntimeError: Input type"):
        check_batch_rows("m", broken, (32, 32), (1, 2))


def test_the_dry_run_says_what_each_runtime_loads_of_a_torch_only_core():
    """A torch-only family (the libreyolo ones) on OpenVINO is an ONNX export of its torch core, converted: the
    plan said "its torch core" for every runtime but ONNX Runtime."""
    from harness.backends.support import BUILTINS, what_loads

    assert what_loads("openvino", True, False) == ("an ONNX export of its torch core (cached by content), converted "
                                                   "for openvino")
    assert what_loads("onnxruntime", True, False) == "an ONNX export of its torch core (cached by content)"
    assert what_loads("pytorch", True, False) == what_loads("torchscript", True, True) == "its torch core"
    assert what_loads("pytorch", False, True) == "onnx2torch of its ONNX graph"
    assert what_loads("tflite", False, True) == "its ONNX graph, converted for tflite"
    assert {e.reads for e in BUILTINS.values()} == {"torch", "onnx", "converted"}
    assert what_loads("mine", True, True) == "what the mine backend makes of its core"  # a plugged-in runtime


def test_the_backend_option_names_every_built_in_runtime():
    """`--backend`'s help is written in config.py, which sits below the backends: this holds it to BUILTINS."""
    from harness.backends.support import BUILTINS
    from harness.config import RunConfig

    described = RunConfig.model_fields["backends"].description
    assert [name for name in BUILTINS if name not in described] == []
