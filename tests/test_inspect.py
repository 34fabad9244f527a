"""`va-bench inspect`: parameters, FLOPs, per-layer table, sparsity and ONNX graph metrics, checked
against published figures, hand-computed formulas and models built with known contents."""

import csv
import json
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from conftest import YOLOX_NANO, requires_yolox, run_in_process
from onnx import TensorProto, helper, numpy_helper

from harness.errors import UsageError
from harness.models.inspect import OUTSIDE, inspect_model, inspect_module, inspect_onnx, onnx_graph_info

# YOLOX's README (Megvii-BaseDetection/YOLOX, "Light Models"): YOLOX-Nano 0.91 M params, 1.08 GFLOPs at 416;
# its FLOPs are 2 x the MACs thop counts (yolox/utils/model_utils.py: get_model_info)
YOLOX_NANO_PARAMS = 0.91e6
YOLOX_NANO_FLOPS = 1.08e9


def va_bench(*args):
    return run_in_process(*args)


def conv_flops(c_in: int, c_out: int, k: int, h_out: int, w_out: int, groups: int = 1) -> int:
    """2 x MACs of a convolution, the textbook formula."""
    return 2 * c_out * h_out * w_out * (c_in // groups) * k * k


@pytest.fixture(scope="module")
def nano():
    if not YOLOX_NANO.is_file():
        pytest.skip(f"yolox_nano.onnx not found at {YOLOX_NANO}")
    return inspect_model("yolox-nano")


@requires_yolox
def test_yolox_nano_matches_the_published_figures(nano):
    assert nano.input_size == (416, 416)
    assert abs(nano.params_total - YOLOX_NANO_PARAMS) / YOLOX_NANO_PARAMS < 0.01, nano.params_total
    assert abs(nano.flops_total - YOLOX_NANO_FLOPS) / YOLOX_NANO_FLOPS < 0.05, nano.flops_total
    assert not nano.notes, nano.notes  # no parameter disagreement, no conversion gap


@requires_yolox
def test_yolox_nano_layers_add_up_and_the_graph_is_described(nano):
    assert sum(r.params for r in nano.layers) == nano.params_total
    assert sum(r.flops for r in nano.layers) == nano.flops_total
    assert sum(nano.flops_by_type.values()) == nano.flops_total
    assert sum(nano.params_by_type.values()) == nano.params_total
    convs = [r for r in nano.layers if r.type == "Conv2d"]
    graph = onnx.load(str(YOLOX_NANO))
    assert len(convs) == sum(1 for n in graph.graph.node if n.op_type == "Conv") == nano.onnx.nodes_by_op["Conv"]
    assert nano.onnx.nodes == len(graph.graph.node)
    assert nano.onnx.opset == {"ai.onnx": graph.opset_import[0].version}
    assert nano.onnx.initializers == len(graph.graph.initializer)
    # the stem conv (Focus: 12 -> 16 channels, 3x3, stride 1 on 208x208) by the textbook formula
    stem = max(convs, key=lambda r: r.flops)
    assert stem.output_shape == "1x16x208x208"
    assert stem.flops == conv_flops(12, 16, 3, 208, 208)


@requires_yolox
def test_onnx_and_its_torch_conversion_report_the_same_params():
    from harness.detector.graph import make_batch_dynamic, onnx_to_torch

    model = onnx.load(str(YOLOX_NANO))
    graph = onnx_graph_info(model)
    module = onnx_to_torch(make_batch_dynamic(model))
    torch_report = inspect_module(module, (416, 416), "converted")
    assert graph.weights == torch_report.params_total == sum(p.numel() for p in module.parameters())
    assert graph.weight_zeros == torch_report.zeros_total
    # the float initialisers that are not weights are exactly the Resize roi/scales operands
    not_weights = {t.name for t in graph.tensors if t.dtype == "float32" and not t.weight}
    resize_operands = {name for n in model.graph.node if n.op_type == "Resize" for name in n.input[1:] if name}
    assert not_weights and not_weights == resize_operands & {i.name for i in model.graph.initializer}


def test_torchvision_model_matches_its_published_metadata():
    """torchvision's weights metadata: num_params, and _ops in GFLOPS that are multiply-accumulates."""
    from torchvision.models.detection import SSDLite320_MobileNet_V3_Large_Weights, ssdlite320_mobilenet_v3_large

    meta = SSDLite320_MobileNet_V3_Large_Weights.COCO_V1.meta
    torch.manual_seed(0)
    model = ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None)
    r = inspect_module(model, (320, 320), "ssdlite")
    assert r.params_total == meta["num_params"]
    assert r.flops_total / 2 / 1e9 == pytest.approx(meta["_ops"], rel=0.01)
    assert r.zeros_total == sum(int((p == 0).sum()) for p in model.parameters())


def test_sparsity_and_flops_of_a_module_with_known_zeros():
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(),
                                 torch.nn.Conv2d(8, 4, 1, bias=False), torch.nn.Flatten(), torch.nn.Linear(1024, 10))
    with torch.no_grad():
        for p in module.parameters():
            p.fill_(0.5)
        module[0].weight[:3] = 0  # 3 of 8 filters: 81 of 216 weights
        module[0].bias[:2] = 0  # 2 of 8 biases
        module[2].weight[0, :4] = 0  # 4 of 32 weights
        module[4].weight[:, :100] = 0  # 1000 of 10240
        module[4].requires_grad_(False)
    r = inspect_module(module, (16, 16), "toy")
    rows = {row.name: row for row in r.layers}
    assert (rows["0"].params, rows["0"].zeros) == (224, 83)
    assert (rows["2"].params, rows["2"].zeros) == (32, 4)
    assert (rows["4"].params, rows["4"].zeros) == (10250, 1000)
    assert (rows["1"].params, rows["1"].zeros, rows["1"].sparsity) == (0, 0, None)
    assert r.params_total == 224 + 32 + 10250 and r.zeros_total == 83 + 4 + 1000
    assert r.sparsity == pytest.approx(1087 / 10506)
    assert r.params_trainable == 224 + 32
    assert rows["0"].flops == conv_flops(3, 8, 3, 16, 16)
    assert rows["2"].flops == conv_flops(8, 4, 1, 16, 16)
    assert rows["4"].flops == 2 * 1024 * 10
    assert r.flops_total == sum(row.flops for row in r.layers)
    assert rows["0"].output_shape == "1x8x16x16" and rows["4"].output_shape == "1x10"
    assert r.params_by_type == {"Linear": 10250, "Conv2d": 256, "ReLU": 0, "Flatten": 0}


def test_a_tied_parameter_counts_once_in_the_rows_as_in_the_total():
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 3, 1), torch.nn.Conv2d(3, 3, 1))
    module[1].weight = module[0].weight  # tied: 9 weights held twice
    r = inspect_module(module, (8, 8), "tied")
    assert r.params_total == 9 + 3 + 3 == sum(row.params for row in r.layers) == sum(r.params_by_type.values())


def test_a_leaf_calling_another_leaf_counts_each_flop_once():
    """A module without children that calls a module registered elsewhere (held in a plain list): the inner call's
    FLOPs are the inner row's, never counted twice nor made negative outside the leaves."""
    conv = torch.nn.Conv2d(3, 2, 1, bias=False)

    class CallsHeld(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.held = [conv]  # not a child: this module is a leaf

        def forward(self, x):
            return self.held[0](x) @ torch.ones(8, 4)

    class Root(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.add_module("0", conv)
            self.add_module("1", CallsHeld())

        def forward(self, x):
            return getattr(self, "0")(x).sum() + getattr(self, "1")(x).sum()

    r = inspect_module(Root(), (8, 8), "nested")
    rows = {row.name: row for row in r.layers}
    assert rows["0"].flops == 2 * conv_flops(3, 2, 1, 8, 8) and rows["0"].calls == 2  # its own call and the held one
    assert rows["1"].flops == 2 * 2 * 8 * 8 * 4  # the matmul only
    assert OUTSIDE not in rows and r.flops_total == sum(row.flops for row in r.layers)


def test_flops_outside_leaf_modules_are_kept():
    class MatmulInForward(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = torch.nn.Conv2d(3, 2, 1, bias=False)

        def forward(self, x):
            y = self.conv(x).flatten(1)  # [1, 2*8*8]
            return y @ torch.ones(128, 5)

    r = inspect_module(MatmulInForward(), (8, 8), "m")
    rows = {row.name: row for row in r.layers}
    assert rows["conv"].flops == conv_flops(3, 2, 1, 8, 8)
    assert rows[OUTSIDE].flops == 2 * 128 * 5
    assert r.flops_total == rows["conv"].flops + rows[OUTSIDE].flops


def _tiny_onnx() -> onnx.ModelProto:
    """Conv (weight with 4 zeros, bias) -> Relu -> Resize (float scales) -> Reshape (int64 shape)."""
    weight = np.ones((2, 3, 1, 1), dtype=np.float32)
    weight[0, :2] = 0
    weight[1, 0, 0, 0] = 0
    bias = np.array([0.0, 1.0], dtype=np.float32)
    inits = [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b"),
             numpy_helper.from_array(np.array([1, 1, 2, 2], dtype=np.float32), "scales"),
             numpy_helper.from_array(np.array([1, -1], dtype=np.int64), "shape")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"]), helper.make_node("Relu", ["c"], ["r"]),
             helper.make_node("Resize", ["r", "", "scales"], ["u"], mode="nearest", nearest_mode="floor",
                              coordinate_transformation_mode="asymmetric"),
             helper.make_node("Reshape", ["u", "shape"], ["y"])]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 128])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], producer_name="test")


def test_onnx_graph_metrics_of_a_known_graph():
    g = onnx_graph_info(_tiny_onnx())
    assert g.nodes == 4 and g.nodes_by_op == {"Conv": 1, "Relu": 1, "Resize": 1, "Reshape": 1}
    assert g.opset == {"ai.onnx": 13} and g.producer == "test"
    assert g.initializers == 4
    assert g.weights == 6 + 2  # conv weight + bias; the Resize scales and Reshape shape are not weights
    assert g.weight_zeros == 3 + 1
    assert g.inputs == {"x": [1, 3, 4, 4]}
    r = inspect_onnx(_tiny_onnx(), None, "tiny")  # size from the graph; layers from onnx2torch
    assert r.input_size == (4, 4) and r.params_total == 8 and r.zeros_total == 4 and not r.notes
    assert r.flops_total == conv_flops(3, 2, 1, 4, 4)


def test_attention_is_counted_whichever_kernel_would_run():
    """Fused attention kernels have no formula in torch's FLOP counter (it counted 0 for them): the count runs
    attention through its plain math. Truth: 2 x MACs by hand."""
    from harness.detector.graph import count_flops

    class Sdpa(torch.nn.Module):
        def forward(self, x):  # q = k = v: 4 heads of 256 tokens x 64
            q = torch.zeros(1, 4, 256, 64) + x.mean()
            return torch.nn.functional.scaled_dot_product_attention(q, q, q)

    assert count_flops(Sdpa(), (32, 32))[0] == 2 * (2 * 4 * 256 * 256 * 64)  # QK^T and AV

    class Mha(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = torch.nn.MultiheadAttention(64, 4, batch_first=True)

        def forward(self, x):  # 100 tokens of 64: the eval fast path would run fused
            tokens = x.flatten(1)[:, :6400].reshape(1, 100, 64)
            return self.attn(tokens, tokens, tokens, need_weights=False)[0]

    mha = Mha().eval()
    in_proj, attention, out_proj = 2 * 100 * 64 * 192, 2 * (2 * 4 * 100 * 100 * 16), 2 * 100 * 64 * 64
    assert count_flops(mha, (48, 48))[0] == in_proj + attention + out_proj
    assert torch.backends.mha.get_fastpath_enabled()  # restored


def test_a_parameter_fed_to_a_submodule_is_counted_and_its_flag_restored():
    """DETR queries are parameters passed into a submodule; the counter's bookkeeping asserted on them."""
    from harness.detector.graph import count_flops

    class Queries(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.query = torch.nn.Parameter(torch.ones(100, 6))
            self.head = torch.nn.Linear(4, 8)
            self.frozen = torch.nn.Linear(3, 3).requires_grad_(False)

        def forward(self, x):
            return self.head(self.query[:, :4]) + x.mean()  # a view made under no_grad: needs grad, no grad_fn

    module = Queries()
    assert count_flops(module, (32, 32))[0] == 2 * 100 * 4 * 8
    report = inspect_module(module, (32, 32), "queries")
    assert report.flops_total == 2 * 100 * 4 * 8 and report.params_trainable == 100 * 6 + 4 * 8 + 8
    assert module.query.requires_grad and not module.frozen.weight.requires_grad


def test_an_onnx_graph_whose_forward_fails_keeps_its_graph_figures():
    """A second input (RT-DETR's image sizes): the graph is still described, FLOPs say why they are missing."""
    model = _tiny_onnx()
    model.graph.input.append(helper.make_tensor_value_info("sizes", TensorProto.INT64, [1, 2]))
    model.graph.output.append(helper.make_tensor_value_info("sizes_out", TensorProto.INT64, [1, 2]))
    model.graph.node.append(helper.make_node("Identity", ["sizes"], ["sizes_out"]))
    r = inspect_onnx(model, None, "two-inputs")
    assert r.params_total == 8 and r.flops_total is None and r.layers == []
    assert r.notes and r.notes[0].startswith("FLOPs and per-layer table unavailable: two-inputs: a batch-1 float32")
    assert "native" not in r.notes[0]  # asked at the graph's own size: no size to suggest


def test_bad_sources_are_usage_errors(tmp_path):
    with pytest.raises(UsageError, match="give a MODEL"):
        inspect_model(None)
    with pytest.raises(UsageError, match="no such file"):
        inspect_model(None, tmp_path / "missing.onnx")
    fifo = tmp_path / "fifo.onnx"
    os.mkfifo(fifo)
    for there in (fifo, tmp_path):  # there, but no file to read
        with pytest.raises(UsageError, match="not a file"):
            inspect_model(None, there)
    from harness.models.registry import load_plugin

    with pytest.raises(UsageError, match="model plugin .*: not a file"):
        load_plugin(str(tmp_path), "factory")
    raising = tmp_path / "raising.py"
    raising.write_text("def make():\n    raise RuntimeError('boom')\n")
    with pytest.raises(UsageError, match=r"model plugin .*raising.py:make\(\) failed: RuntimeError: boom; fix"):
        load_plugin(str(raising), "make")
    exiting = tmp_path / "exiting.py"
    exiting.write_text("import sys\n\ndef make():\n    sys.exit(3)\n")
    with pytest.raises(UsageError, match=r"exiting.py:make\(\) failed: SystemExit: 3; fix"):
        load_plugin(str(exiting), "make")
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x00not a protobuf\xff" * 10)
    with pytest.raises(UsageError, match="is not an ONNX model"):
        inspect_model(None, junk)
    empty = tmp_path / "empty.onnx"
    empty.write_bytes(b"")  # parses as a model with no graph: not a model of 0 parameters
    with pytest.raises(UsageError, match="is an ONNX file without a graph"):
        inspect_model(None, empty, input_size=32)
    pickle_like = tmp_path / "model.pt"
    pickle_like.write_bytes(b"x")
    with pytest.raises(UsageError, match="reads ONNX files"):
        inspect_model(None, pickle_like)
    with pytest.raises(UsageError, match="multiple of 32"):
        inspect_model("yolox-nano", input_size=100)
    with pytest.raises(UsageError, match="unknown model"):
        inspect_model("yolox-huge")


@requires_yolox
def test_cli_json_and_csv(tmp_path):
    out = tmp_path / "layers.csv"
    result = va_bench("inspect", "yolox-nano", "--json", "--csv", str(out))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["flops_convention"].startswith("FLOP = 2 x MAC")
    with out.open() as fh:
        rows = list(csv.DictReader(fh))
    assert len(rows) == len(report["layers"])
    assert sum(int(r["flops"]) for r in rows) == report["flops_total"]
    assert sum(int(r["params"]) for r in rows) == report["params_total"]


def test_cli_bad_input_is_one_line(tmp_path):
    result = va_bench("inspect", "--weights", str(tmp_path / "nope.onnx"))
    assert result.returncode == 2
    assert [line for line in result.stderr.splitlines() if line.strip()] == [
        f"error: --weights {tmp_path / 'nope.onnx'}: no such file"]


def test_a_plugin_whose_load_core_takes_every_argument_as_the_contract_says_is_inspected(tmp_path):
    """The Detector contract's load_core(backend, device, precision, input_size, threads): a plugin that makes
    threads required is loaded by inspect as by a run."""
    source = (Path(__file__).parent / "plugins" / "synthetic_detector.py").read_text()
    assert "input_size, threads=None):" in source
    strict = tmp_path / "strict_plugin.py"
    strict.write_text(source.replace("input_size, threads=None):", "input_size, threads):"))
    report = inspect_model(f"{strict}:make_detector")
    assert report.model == "synthetic-sleepy" and report.source == "pytorch" and len(report.layers) == 1


def test_parameters_of_a_branch_that_never_runs_are_not_counted_as_used():
    """A re-parameterisable block before fusion holds its merged convolution unused (YOLO-NAS: 6.2 M of yolonas-s's
    19.1 M): the parameters the forward reads are told apart, by a plain sum over what it reads here, a weight read
    through a functional call and a tied weight included."""
    from harness.detector.graph import count_flops
    from harness.models.inspect import inspect_module

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.branch = torch.nn.Conv2d(3, 8, 3, padding=1)
            self.merged = torch.nn.Conv2d(3, 8, 3, padding=1)  # built, never run
            self.scale = torch.nn.Parameter(torch.ones(8))  # read by the block's own code
            self.head = torch.nn.Linear(8, 4)
            self.tied = torch.nn.Linear(8, 4)
            self.tied.weight = self.head.weight  # counted once, read

        def forward(self, x):
            y = self.branch(x) * self.scale[None, :, None, None]
            pooled = y.mean((2, 3))
            return torch.nn.functional.linear(pooled, self.tied.weight) + self.head.bias

    block = Block().eval()
    total = sum(p.numel() for p in block.parameters())
    read = (3 * 8 * 9 + 8) + 8 + (8 * 4 + 4)  # branch, scale, head's weight and bias (tied's bias is never read)
    assert count_flops(block, (16, 16))[1] == read
    report = inspect_module(block, (16, 16), "block")
    assert (report.params_total, report.params_used) == (total, read)
    assert any(f"{total - read:,} of the parameters are in modules the forward never runs" in n for n in report.notes)


def test_random_weights_say_their_zeros_are_not_the_trained_models():
    report = inspect_model("yolox-nano", "random")
    assert report.params_total > 800_000
    assert any(n.startswith("--weights random: parameters and FLOPs are the architecture's") for n in report.notes)


@requires_yolox
def test_layer_types_the_convention_does_not_count_show_no_zero(tmp_path):
    """Sigmoid, Concat and the like printed FLOPs 0, which reads as measured; they are not counted."""
    result = run_in_process("inspect", "yolox-nano", env={"COLUMNS": "120"})
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line.split() for line in result.stdout.splitlines() if line.strip()
            and line.split()[0] in ("Conv2d", "Sigmoid", "OnnxConcat")}
    assert rows["Conv2d"][3:5] == ["1.045", "G"] and rows["Sigmoid"][-2:] == ["-", "-"], rows
    assert "-: not counted (see the convention above)" in result.stdout
