"""Tools over a core's graph that families and backends share: ONNX batch-axis rewriting, onnx2torch
conversion, parameter and FLOP counts, and the agreement checks between two runs of a core (batch rows,
query rows compared as a set)."""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import warnings
from contextlib import contextmanager
from typing import Any

import numpy as np
import onnx
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from harness.detector.protocol import ModelStats
from harness.detector.weights import weights_dir
from harness.errors import UsageError
from harness.files import write_cache_file

# Agreement required between backends, relative to the output's magnitude: float32 kernels that fuse or
# reorder operations differ by ~1e-6 relative; a baked batch or a wrong graph differs by orders more.
RELATIVE_TOLERANCE = 1e-3


def make_batch_dynamic(model: onnx.ModelProto, spatial_dynamic: bool = True) -> onnx.ModelProto:
    """Return a copy whose batch axis (and optionally H, W) is symbolic.

    Exporters often bake the traced batch into Reshape targets (YOLOX: [1, 85, -1]); a 0 there
    means "copy this dim from the input", which makes the graph batch-agnostic.
    """
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    for value in list(graph.input) + list(graph.output):
        dims = value.type.tensor_type.shape.dim
        if dims:
            dims[0].dim_param = "batch"
        if spatial_dynamic and value in graph.input and len(dims) == 4:
            dims[2].dim_param, dims[3].dim_param = "height", "width"
    reshape_shapes = {node.input[1] for node in graph.node if node.op_type == "Reshape"}
    for init in graph.initializer:
        if init.name in reshape_shapes:
            shape = onnx.numpy_helper.to_array(init)
            if shape.ndim == 1 and shape.size > 1 and shape[0] == 1:
                fixed = shape.copy()
                fixed[0] = 0
                init.CopyFrom(onnx.numpy_helper.from_array(fixed, init.name))
    for node in graph.node:  # the same constants may come as Constant nodes
        if node.op_type == "Constant" and node.output[0] in reshape_shapes:
            for attr in node.attribute:
                if attr.name == "value":
                    shape = onnx.numpy_helper.to_array(attr.t)
                    if shape.ndim == 1 and shape.size > 1 and shape[0] == 1:
                        fixed = shape.copy()
                        fixed[0] = 0
                        attr.t.CopyFrom(onnx.numpy_helper.from_array(fixed))
    del graph.value_info[:]  # stale static shapes of intermediates would contradict the new dims
    return model


def onnx_param_count(model: onnx.ModelProto) -> int:
    """Number of weights stored in the graph (float initializers)."""
    total = 0
    for init in model.graph.initializer:
        if init.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE):
            total += int(np.prod(init.dims)) if init.dims else 1
    return total


def onnx_problem(path: str | os.PathLike) -> str | None:
    """Why the file at `path` is no ONNX model (unreadable as one, or a graph without nodes); None when it is one."""
    try:
        model = onnx.load(str(path))
    except Exception as exc:  # onnx raises DecodeError and friends for what is not a model
        return f"is not an ONNX model ({type(exc).__name__})"
    return None if model.graph.node else "is an ONNX file without a graph"


def onnx_model_stats(model: onnx.ModelProto, input_size: tuple[int, int]) -> ModelStats:
    """Parameters stored in the graph and FLOPs of its onnx2torch conversion (None with the reason when
    the conversion or the count fails).

    The FLOP count converts the graph and runs a batch-1 forward (~0.4 s and ~70 MB for YOLOX-Nano): it is
    a pure function of the graph's bytes and the input size, so it is kept in the weights cache
    (`model-stats/<sha256 of the graph>__HxW__v<FLOP_COUNT_VERSION>.json`) and the next run of the same graph reads
    it."""
    stats = ModelStats(params_millions=round(onnx_param_count(model) / 1e6, 4))
    h, w = input_size
    digest = hashlib.sha256(model.SerializeToString()).hexdigest()
    cache = weights_dir() / "model-stats" / f"{digest}__{h}x{w}__v{FLOP_COUNT_VERSION}.json"
    try:
        stats.gflops = float(json.loads(cache.read_text(encoding="utf-8"))["gflops"])
        return stats
    except (OSError, ValueError, KeyError, TypeError):  # absent or unreadable: count again
        pass
    try:
        stats.gflops = round(count_flops(onnx_to_torch(model), input_size)[0] / 1e9, 4)
    except Exception as exc:  # a converter gap must not sink the benchmark; say why
        stats.notes["gflops"] = f"FLOP count failed: {exc}"
        return stats
    write_cache_file(cache, json.dumps({"gflops": stats.gflops, "input_size": [h, w]}).encode())
    return stats


def onnx_to_torch(model: onnx.ModelProto) -> torch.nn.Module:
    """Convert an ONNX graph into a real torch module (onnx2torch): hooks/profiler see real layers."""
    from onnx2torch import convert

    # onnx2torch's Slice indexes with a list (deprecated in torch); harmless, but noisy at every forward.
    warnings.filterwarnings("ignore", message="Using a non-tuple sequence", category=UserWarning)

    buffer = io.BytesIO(model.SerializeToString())
    return convert(onnx.load_model(buffer))


# Bumped when what count_flops counts changes: cached counts of an older convention are counted again.
FLOP_COUNT_VERSION = 2


@contextmanager
def flop_counting(module: torch.nn.Module):
    """The conditions of a forward whose FLOPs FlopCounterMode can see whole: attention through its plain math
    (the fused CPU kernels of scaled_dot_product_attention and of nn.MultiheadAttention's fast path have no
    formula there and counted 0: 47 % of ec-s), and no parameter asking for gradients (the counter's autograd
    bookkeeping asserts on a module input that needs one under no_grad: LW-DETR and RF-DETR failed). The
    parameters' flags are restored after; no inference tensors are left in a module that caches one."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    fast_path = torch.backends.mha.get_fastpath_enabled()
    try:
        torch.backends.mha.set_fastpath_enabled(False)
        with asking_no_gradient(module), sdpa_kernel([SDPBackend.MATH]), torch.no_grad():
            yield
    finally:
        torch.backends.mha.set_fastpath_enabled(fast_path)


@contextmanager
def asking_no_gradient(module: torch.nn.Module):
    """The module's parameters ask for no gradient inside the block, and their flags are as they were after."""
    wanted = [(p, p.requires_grad) for p in module.parameters()]
    try:
        module.requires_grad_(False)
        yield
    finally:
        for p, flag in wanted:
            p.requires_grad_(flag)


class TensorsRead(TorchDispatchMode):
    """The storages of every tensor an operation reads or writes while the mode is on: a parameter whose storage
    is among them is one the forward uses."""

    def __init__(self):
        super().__init__()
        self.storages: set[int] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        for value in tree_leaves((args, kwargs)):
            if isinstance(value, torch.Tensor) and value.device.type != "meta":
                self.storages.add(value.untyped_storage().data_ptr())
        return func(*args, **kwargs)


def count_flops(module: torch.nn.Module, input_size: tuple[int, int]) -> tuple[int, int]:
    """FLOPs of one batch-1 forward (FlopCounterMode: 2 x MACs of conv/linear/matmul, attention included), and how
    many of the module's parameters that forward reads (a branch built but never run, such as a RepVGG block's
    merged convolution before its branches are fused, or a training-only head, is not part of the model that runs)."""
    from torch.utils.flop_counter import FlopCounterMode

    x = torch.zeros(1, 3, *input_size)
    counter, read = FlopCounterMode(display=False), TensorsRead()
    with flop_counting(module), counter, read:
        module(x)
    used = sum(p.numel() for p in module.parameters() if p.untyped_storage().data_ptr() in read.storages)
    return int(counter.get_total_flops()), used


def output_list(out: Any) -> list[torch.Tensor]:
    """A torch core's forward result as the list of raw outputs: a tensor, or a tuple or list of tensors (their
    order is the raw outputs' on every backend); anything else (a dict, torchvision-style) is a TypeError saying so,
    where `list()` would have taken a dict's keys for outputs."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)) and all(isinstance(o, torch.Tensor) for o in out):
        return list(out)
    got = type(out).__name__ + (f" of {', '.join(sorted({type(o).__name__ for o in out}))}"
                                if isinstance(out, (tuple, list)) else "")
    raise TypeError(f"a core's forward must return a tensor or a tuple of tensors, not a {got}: return the head's "
                    "tensors in a fixed order (e.g. tuple(out[k] for k in KEYS))")


def module_outputs(module: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """A torch core's outputs as a list, without autograd. Not under inference mode: a module that caches a tensor
    made in its forward (an anchor grid) would keep an inference tensor, which a later ONNX trace cannot use."""
    with torch.no_grad():
        out = module(x)
    return output_list(out)


def _scale(want: torch.Tensor) -> float:
    """An output's magnitude (at least 1): what its differences are relative to."""
    return max(1.0, float(want.abs().max())) if want.numel() else 1.0


def _elementwise_diff(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    worst = 0.0
    for g, w in zip(got, want, strict=True):
        if g.shape != w.shape:
            return float("inf")
        if not w.numel():
            continue
        diff = float((g.float() - w.float()).abs().max()) / _scale(w)
        if math.isnan(diff):  # a NaN on either side is no agreement (max() would skip it)
            return float("inf")
        worst = max(worst, diff)
    return worst


def _query_rows(outputs: list[torch.Tensor], scales: list[float]) -> torch.Tensor | None:
    """The outputs of a DETR-style core as one row per (image, query): [B, N, sum K] when every output is
    [B, N, K_i] (or [B, N, h, w], a query's mask, flattened) with the same B and N, each output divided by its
    own scale (a box error is not hidden by the logits' magnitude); None otherwise."""
    if not outputs or any(o.dim() < 3 or o.shape[:2] != outputs[0].shape[:2] for o in outputs):
        return None
    return torch.cat([o.float().flatten(2) / scale for o, scale in zip(outputs, scales, strict=True)], dim=2)


def shape_mismatch(got: list[torch.Tensor], want: list[torch.Tensor]) -> str | None:
    """What differs when two cores' outputs are not of the same count and shapes (their difference is then
    infinite, which says nothing of why); None when they are."""
    shapes = [[list(t.shape) for t in outputs] for outputs in (got, want)]
    if shapes[0] == shapes[1]:
        return None
    return f"outputs of shapes {shapes[0]} where the reference gives {shapes[1]}"


def max_relative_diff(got: list[torch.Tensor], want: list[torch.Tensor], rows_as_set: bool = False) -> float:
    """The largest |got - want| of any output, relative to that output's magnitude (at least 1); infinite where
    either side holds a NaN.

    `rows_as_set` (a DETR-style core, CoreSource.query_rows): its top-k query selection orders near-equal
    encoder scores differently from one runtime (or kernel) to another. When the outputs differ element by
    element but are all [B, N, K_i], each image's rows (every output's row of a query side by side, so a
    query's logits stay paired with its box) are compared as a set: the best one-to-one pairing of the rows
    (`_set_distance`), then element by element."""
    diff = _elementwise_diff(got, want)
    if diff <= RELATIVE_TOLERANCE or not rows_as_set or math.isinf(diff):
        return diff
    scales = [_scale(w) for w in want]
    g, w = _query_rows(got, scales), _query_rows(want, scales)
    if g is None or w is None or g.shape != w.shape:
        return diff
    worst = max((_set_distance(gi, wi) for gi, wi in zip(g, w, strict=True)), default=0.0)
    return min(diff, worst)


def _set_distance(got: torch.Tensor, want: torch.Tensor) -> float:
    """The largest element difference between two sets of rows ([N, K] each) under their best one-to-one pairing
    (the bottleneck assignment: no pairing has a smaller largest difference).

    Sorting both sets and comparing in order paired the wrong rows whenever two rows' leading values were nearer
    than the runtimes' rounding (they then sort either way). Usually every row's nearest counterpart (max norm) is
    a different row, and that pairing is the best; otherwise the smallest threshold at which a perfect matching
    exists is searched (scipy's maximum bipartite matching, imported only then)."""
    if got.numel() == 0:
        return 0.0
    distance = torch.cdist(got.double()[None], want.double()[None], p=float("inf"))[0]
    nearest = distance.argmin(dim=1)
    if len(set(nearest.tolist())) == len(nearest):  # the usual case: a one-to-one pairing already
        return float(distance[torch.arange(len(nearest)), nearest].max())
    from scipy.sparse import csr_matrix
    from scipy.sparse.csgraph import maximum_bipartite_matching

    d = distance.cpu().numpy()
    floor = max(d.min(axis=1).max(), d.min(axis=0).max())  # no pairing does better than every row's nearest
    thresholds = np.unique(d[d >= floor])
    low, high = 0, len(thresholds) - 1  # a perfect matching exists at the largest distance
    while low < high:
        middle = (low + high) // 2
        matched = maximum_bipartite_matching(csr_matrix(d <= thresholds[middle]), perm_type="column")
        if (matched >= 0).all():
            high = middle
        else:
            low = middle + 1
    return float(thresholds[low])


def check_batch_rows(name: str, core: Any, input_size: tuple[int, int], batches: tuple[int, ...],
                     rows_as_set: bool = False) -> None:
    """Each output row of a batch must equal its image run alone (a graph whose batch axis was made
    dynamic after export may still bake batch 1 somewhere); one line when it does not."""
    torch.manual_seed(0)
    x = torch.rand(max(batches), 3, *input_size)
    if getattr(core, "takes_device_tensors", False):  # a torch core on a GPU reads a batch on its device
        x = x.to(core.device.torch_device)
    try:
        alone = [core(x[i:i + 1].contiguous()) for i in range(max(batches))]
    except Exception as exc:
        raise UsageError(f"{name}: the graph does not run at batch 1 ({type(exc).__name__}: "
                         f"{str(exc).splitlines()[0][:160]})") from exc
    for b in batches:
        try:
            got = core(x[:b].contiguous())
            want = [torch.cat([alone[i][k] for i in range(b)]) for k in range(len(alone[0]))]
            diff = max_relative_diff(got, want, rows_as_set)
        except Exception as exc:
            diff = float("inf")
            detail = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
        else:
            detail = f"max relative difference {diff:.2e}"
        if not diff <= RELATIVE_TOLERANCE:
            raise UsageError(f"{name}: at batch {b} the graph does not give each image's own output ({detail}); "
                             "re-export it with a dynamic batch axis")
