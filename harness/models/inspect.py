"""`va-bench inspect`: static metrics of a model: parameters, FLOPs, per-layer table,
weight sparsity, ONNX graph metrics.

One code path per source:
* a torch module (`inspect_module`): parameters from `named_parameters`, FLOPs from
  torch.utils.flop_counter.FlopCounterMode over one batch-1 forward at the input size, each layer's
  FLOPs as the counter's growth across that layer's call (forward pre/post hooks on every leaf);
* an ONNX graph (`onnx_graph_info`): nodes by op type, opset, initialisers, weights and their zeros
  from the initialisers themselves; the per-layer table and FLOPs come from its onnx2torch
  conversion (the same conversion the pytorch backend runs), and the two parameter counts are
  cross-checked.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import onnx
import torch
from onnx import numpy_helper

from harness.detector.graph import onnx_problem
from harness.detector.protocol import FLOP_CONVENTION
from harness.errors import UsageError, path_problem

FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE, onnx.TensorProto.BFLOAT16}
OUTSIDE = "(outside leaf modules)"


@dataclass(frozen=True)
class LayerRow:
    """One module that ran in the forward or holds parameters of its own."""

    name: str
    type: str
    output_shape: str
    params: int  # its own parameters (not its children's)
    zeros: int  # exact zeros among them
    flops: int  # over all its calls in the batch-1 forward
    calls: int

    @property
    def sparsity(self) -> float | None:
        return self.zeros / self.params if self.params else None


@dataclass(frozen=True)
class TensorRow:
    """One ONNX initialiser."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    size: int
    zeros: int
    weight: bool  # a float tensor feeding a differentiable input (not a shape, scale or index)


@dataclass
class OnnxGraphInfo:
    """Graph-level metrics of an ONNX model."""

    ir_version: int
    opset: dict[str, int]
    producer: str
    nodes: int
    nodes_by_op: dict[str, int]
    initializers: int
    weights: int  # elements of weight initialisers
    weight_zeros: int
    inputs: dict[str, list]
    outputs: dict[str, list]
    file_bytes: int | None
    tensors: list[TensorRow] = field(default_factory=list)


@dataclass
class InspectReport:
    """Everything `va-bench inspect` prints."""

    model: str
    source: str  # pytorch | onnx
    input_size: tuple[int, int]
    params_total: int | None = None
    params_used: int | None = None  # of params_total, those the batch-1 forward reads (a branch never run is not)
    params_trainable: int | None = None
    params_by_type: dict[str, int] = field(default_factory=dict)
    zeros_total: int | None = None
    flops_total: int | None = None
    flops_by_type: dict[str, int] = field(default_factory=dict)
    layers: list[LayerRow] = field(default_factory=list)
    onnx: OnnxGraphInfo | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def sparsity(self) -> float | None:
        return self.zeros_total / self.params_total if self.params_total else None

    def to_dict(self) -> dict:
        out = asdict(self)
        out["input_size"] = list(self.input_size)
        out["sparsity"] = self.sparsity
        out["flops_convention"] = FLOP_CONVENTION  # the submission's model_stats key
        out["layers"] = [{**asdict(r), "sparsity": r.sparsity} for r in self.layers]
        return out

    def csv_rows(self) -> tuple[list[str], list[list]]:
        """The per-layer table (header, rows)."""
        header = ["name", "type", "output_shape", "params", "zeros", "sparsity", "flops", "calls"]
        rows = [[r.name, r.type, r.output_shape, r.params, r.zeros, "" if r.sparsity is None else r.sparsity,
                 r.flops, r.calls] for r in self.layers]
        return header, rows


# ------------------------------------------------------------------------------------ torch --
def _shape(value) -> str:
    if isinstance(value, torch.Tensor):
        return "x".join(map(str, value.shape)) or "scalar"
    if isinstance(value, (list, tuple)):
        return ", ".join(_shape(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_shape(v)}" for k, v in value.items())
    return type(value).__name__


class ForwardFailed(UsageError):
    """The batch-1 forward that counts FLOPs failed: what the module is still stands (an ONNX graph's metrics)."""


def inspect_module(module: torch.nn.Module, input_size: tuple[int, int], name: str,
                   source: str = "pytorch", native: tuple[int, int] | None = None) -> InspectReport:
    """Parameters, sparsity, FLOPs and the per-layer table of a torch module (batch-1 forward); `native`: the
    model's own input size, suggested when another one was asked for and the forward failed."""
    from torch.utils.flop_counter import FlopCounterMode

    from harness.detector.graph import TensorsRead, flop_counting

    module = module.eval()
    report = InspectReport(name, source, tuple(input_size))
    params = list(module.parameters())  # deduplicated (tied weights count once)
    report.params_total = sum(p.numel() for p in params)
    report.params_trainable = sum(p.numel() for p in params if p.requires_grad)
    report.zeros_total = sum(int((p == 0).sum()) for p in params)
    layers = {n: m for n, m in module.named_modules()
              if not any(True for _ in m.children()) or any(True for _ in m.parameters(recurse=False))}
    counter, read = FlopCounterMode(display=False), TensorsRead()
    flops: dict[str, int] = dict.fromkeys(layers, 0)
    calls: dict[str, int] = dict.fromkeys(layers, 0)
    shapes: dict[str, str] = {}
    leaves = {n for n, m in layers.items() if not any(True for _ in m.children())}
    started: dict[str, list[int]] = {n: [] for n in leaves}
    nested: list[int] = []  # per open leaf call, the FLOPs of leaf calls made inside it (credited to those)

    def leaf_start(n: str) -> None:
        started[n].append(counter.get_total_flops())
        nested.append(0)

    def leaf_done(n: str, out) -> None:
        grown = counter.get_total_flops() - started[n].pop()
        flops[n] += grown - nested.pop()  # a leaf that calls another (held outside its children) keeps its own
        if nested:
            nested[-1] += grown
        calls[n] += 1
        shapes[n] = _shape(out)

    handles = []
    for n in leaves:  # a leaf's FLOPs: the counter's growth across its call
        m = layers[n]
        handles.append(m.register_forward_pre_hook(lambda _m, _i, n=n: leaf_start(n)))
        handles.append(m.register_forward_hook(lambda _m, _i, out, n=n: leaf_done(n, out)))
    try:
        with flop_counting(module), counter, read:
            module(torch.zeros(1, 3, *input_size))
    except Exception as exc:
        hint = (f"; try its native --input-size {native[0]}" if native and tuple(native) != tuple(input_size)
                else "")
        raise ForwardFailed(f"{name}: a batch-1 float32 forward at {input_size[0]}x{input_size[1]} failed "
                            f"({type(exc).__name__}: {str(exc)[:160]}){hint}") from exc
    finally:
        for h in handles:
            h.remove()
    report.flops_total = int(counter.get_total_flops())
    report.params_used = sum(p.numel() for p in params if p.untyped_storage().data_ptr() in read.storages)
    unused = report.params_total - report.params_used
    if unused:  # a RepVGG block's merged convolution before fusion, a training-only head: built, never run
        report.notes.append(f"{unused:,} of the parameters are in modules the forward never runs (e.g. a "
                            "re-parameterisable block's merged convolution before fusion, or a training-only "
                            "branch): the model as it runs has the parameters 'used'")
    by_type_params: Counter[str] = Counter()
    by_type_flops: Counter[str] = Counter()
    counted: set[int] = set()  # a tied parameter counts in the first row that holds it, as in the total
    for n, m in layers.items():
        own = [p for p in m.parameters(recurse=False) if id(p) not in counted]
        counted.update(id(p) for p in own)
        n_params = sum(p.numel() for p in own)
        if not n_params and not calls[n]:
            continue  # a container of constants that never ran (e.g. onnx2torch's initializers)
        kind = type(m).__name__
        report.layers.append(LayerRow(n or "(root)", kind, shapes.get(n, "-"), n_params,
                                      sum(int((p == 0).sum()) for p in own), flops[n], calls[n]))
        by_type_params[kind] += n_params
        by_type_flops[kind] += flops[n]
    outside = report.flops_total - sum(r.flops for r in report.layers)
    if outside:  # ops a parent module runs itself (e.g. a matmul in a GraphModule's own code)
        report.layers.append(LayerRow(OUTSIDE, "-", "-", 0, 0, outside, 0))
        by_type_flops["-"] += outside
    report.params_by_type = dict(by_type_params.most_common())
    report.flops_by_type = dict(by_type_flops.most_common())
    return report


# ------------------------------------------------------------------------------------- onnx --
def _all_nodes(graph: onnx.GraphProto):
    """Every node, including those of subgraphs (If/Loop/Scan bodies)."""
    for node in graph.node:
        yield node
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                yield from _all_nodes(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    yield from _all_nodes(g)


def _differentiable_slot(op_type: str, domain: str, position: int) -> bool:
    """Whether input `position` of an op is a differentiable operand per the ONNX schema (the latest
    one: old opsets say "Unknown"). Shapes, scales, indices are not; an op without a schema counts."""
    try:
        schema = onnx.defs.get_schema(op_type, domain=domain)
    except onnx.defs.SchemaError:
        return True
    if not schema.inputs:
        return True
    formal = schema.inputs[min(position, len(schema.inputs) - 1)]  # the last formal may be variadic
    return formal.differentiation_category != onnx.defs.OpSchema.DifferentiationCategory.NonDifferentiable


def _weight_names(model: onnx.ModelProto) -> set[str]:
    """Float initialisers used at least once as a differentiable operand: the model's weights."""
    floats = {i.name for i in model.graph.initializer if i.data_type in FLOAT_TYPES}
    weights = set()
    for node in _all_nodes(model.graph):
        for position, name in enumerate(node.input):
            if name in floats and name not in weights and _differentiable_slot(node.op_type, node.domain, position):
                weights.add(name)
    return weights


def _value_dims(values) -> dict[str, list]:
    return {v.name: [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim] for v in values}


def onnx_graph_info(model: onnx.ModelProto, file_bytes: int | None = None) -> OnnxGraphInfo:
    """Nodes by op type, opset, initialisers, weights and their exact zeros."""
    graph = model.graph
    ops: Counter[str] = Counter()
    for node in _all_nodes(graph):
        ops[node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"] += 1
    weights = _weight_names(model)
    tensors = []
    for init in graph.initializer:
        array = numpy_helper.to_array(init)
        tensors.append(TensorRow(init.name, onnx.helper.tensor_dtype_to_np_dtype(init.data_type).name,
                                 tuple(int(d) for d in init.dims), int(array.size), int(np.count_nonzero(array == 0)),
                                 init.name in weights))
    initialized = {i.name for i in graph.initializer}
    return OnnxGraphInfo(
        ir_version=model.ir_version,
        opset={(o.domain or "ai.onnx"): o.version for o in model.opset_import},
        producer=f"{model.producer_name} {model.producer_version}".strip(),
        nodes=sum(ops.values()), nodes_by_op=dict(ops.most_common()), initializers=len(tensors),
        weights=sum(t.size for t in tensors if t.weight), weight_zeros=sum(t.zeros for t in tensors if t.weight),
        inputs=_value_dims(v for v in graph.input if v.name not in initialized), outputs=_value_dims(graph.output),
        file_bytes=file_bytes, tensors=tensors)


def _static_size(model: onnx.ModelProto) -> tuple[int, int] | None:
    initialized = {i.name for i in model.graph.initializer}
    inputs = [v for v in model.graph.input if v.name not in initialized]
    dims = inputs[0].type.tensor_type.shape.dim if inputs else []
    if len(dims) == 4 and dims[2].dim_value and dims[3].dim_value:
        return dims[2].dim_value, dims[3].dim_value
    return None


def inspect_onnx(model: onnx.ModelProto, input_size: tuple[int, int] | None, name: str,
                 file_bytes: int | None = None) -> InspectReport:
    """Graph metrics from the ONNX graph; layers and FLOPs from its onnx2torch conversion."""
    from harness.detector.graph import make_batch_dynamic, onnx_to_torch

    graph = onnx_graph_info(model, file_bytes)
    static = _static_size(model)
    size = tuple(input_size) if input_size else static
    if size is None:
        raise UsageError(f"{name}: the graph's input size is not fixed; pass --input-size N")
    notes = []
    if static and static != size:  # bake-in of the export size: make H, W (and the batch) symbolic
        model = make_batch_dynamic(model)
        notes.append(f"input made dynamic ({static[0]}x{static[1]} export inspected at {size[0]}x{size[1]})")
    def graph_only(why: str) -> InspectReport:  # the graph metrics stand without a converted forward
        report = InspectReport(name, "onnx", size, params_total=graph.weights, zeros_total=graph.weight_zeros,
                               onnx=graph)
        report.notes += [*notes, f"FLOPs and per-layer table unavailable: {why}"]
        return report

    try:
        module = onnx_to_torch(model)
    except Exception as exc:  # an op onnx2torch does not convert
        return graph_only(f"onnx2torch cannot convert the graph ({type(exc).__name__}: {str(exc)[:160]})")
    try:
        report = inspect_module(module, size, name, source="onnx", native=static)
    except ForwardFailed as exc:  # fp16 inputs, a fixed batch other than 1, a second input (RT-DETR's sizes)
        return graph_only(str(exc))
    report.onnx = graph
    report.notes += notes
    if report.params_total != graph.weights:
        report.notes.append(f"parameters differ: {graph.weights} in the ONNX weights, {report.params_total} in "
                            "the onnx2torch conversion")
    return report


def _load_onnx(path: Path) -> onnx.ModelProto:
    if not path.is_file():
        raise UsageError(path_problem("--weights", path, "not a file" if path.exists() else "no such file"))
    if path.suffix.lower() != ".onnx":
        raise UsageError(f"--weights {path}: inspect reads ONNX files; for a PyTorch model pass its registry id "
                         "or a plugin path/to/file.py:factory")
    problem = onnx_problem(path)  # unreadable, or (an empty file parses as one) a model without a graph
    if problem:
        raise UsageError(f"--weights {path} {problem}; pass the model's ONNX export")
    return onnx.load(str(path))


def _plugin_module(detector, size: tuple[int, int]) -> torch.nn.Module:
    from harness.measure.device import Device

    if "pytorch" not in detector.backends:
        raise UsageError(f"{detector.model_id}: no core_source and no pytorch backend; nothing to inspect")
    # the Detector contract's whole call: a plugin may take every argument as required
    module = getattr(detector.load_core("pytorch", Device("cpu"), "fp32", size, None), "torch_module", None)
    if not isinstance(module, torch.nn.Module):
        raise UsageError(f"{detector.model_id}: its pytorch core exposes no torch_module; nothing to inspect")
    return module


def inspect_model(model: str | None, weights: str | Path | None = None,
                  input_size: int | None = None) -> InspectReport:
    """A registry id / plugin spec (with optional --weights), or a bare ONNX file."""
    size = (input_size, input_size) if input_size else None
    if input_size is not None and (input_size < 32 or input_size % 32):
        raise UsageError(f"--input-size {input_size}: use a positive multiple of 32")
    if model is None:
        if weights is None:
            raise UsageError("give a MODEL (registry id or path/to/file.py:factory) or --weights FILE.onnx")
        path = Path(weights)
        return inspect_onnx(_load_onnx(path), size, path.name, path.stat().st_size)
    from harness.models.registry import get_detector

    detector = get_detector(model, str(weights) if weights else None, fetch=False)  # the architecture: no download
    report = _inspect_detector(detector, model, size)
    if getattr(detector.weights, "source", None) == "random":
        report.notes.append("--weights random: parameters and FLOPs are the architecture's; zeros and sparsity are a "
                            "seeded random build's, not the trained model's")
    return report


def _inspect_detector(detector, model: str, size: tuple[int, int] | None) -> InspectReport:
    size = size or tuple(detector.preprocess.input_size)
    source = getattr(detector, "core_source", None)
    native = tuple(detector.preprocess.input_size)
    if source is None:  # a plugin with only the Detector protocol: its pytorch core's module
        return inspect_module(_plugin_module(detector, size), size, detector.model_id, native=native)
    if source.torch_module is not None:  # a torch-defined core: inspect it as it is
        report = inspect_module(source.torch_module(), size, detector.model_id, native=native)
        if getattr(detector, "flops_note", None):  # e.g. Faster R-CNN's proposal-dependent RoI head
            report.notes.append(detector.flops_note)
        if getattr(detector, "weights_missing", False):
            report.notes.append("its weights are not downloaded (inspect fetches none): parameters and FLOPs are the "
                                "architecture's, but trainable counts, zeros and sparsity are an untrained build's; "
                                "a run downloads them")
        return report
    if source.onnx_model is not None:
        path = getattr(detector, "path", None)
        # the file as it is (its own input and output shapes), not the core's copy with symbolic axes:
        # inspect_onnx makes the axes symbolic itself when asked for another size
        graph = onnx.load(str(path)) if isinstance(path, Path) and path.suffix == ".onnx" else source.onnx_model()
        return inspect_onnx(graph, size, detector.model_id, path.stat().st_size if isinstance(path, Path) else None)
    raise UsageError(f"{model}: its core_source has neither a torch module nor an ONNX graph")
