"""Make an onnx2torch module capturable: shape constants stay on the host.

onnx2torch keeps the constant inputs of Slice (starts/ends/axes/steps), Reshape (shape) and Resize
(roi/scales/sizes) as buffers, and reads them back with `.cpu()`/`.tolist()` at every forward. Once
the module is moved to a GPU that is a device->host copy per op per batch: a sync in the timed
forward, and an error inside CUDA graph capture ("Cannot copy between CPU and CUDA tensors during
CUDA graph capture"). onnx2torch has no option for this, so this pass rebinds those constant inputs
as plain host tensors of a wrapper (a plain attribute, which `.to(device)` leaves on the host): the
op reads them without touching the device, and the forward is the same computation. Slices and
reshapes are resolved to Python values once (StaticSlice, StaticReshape), which also removes
torch.compile's graph breaks there.
"""

from __future__ import annotations

import torch
from torch import fx, nn

HOST_SHAPE_OPS = ("OnnxSlice", "OnnxReshape", "OnnxResize")


class HostConstantCall(nn.Module):
    """`op(x, *constants)` with the constants held on the host (not buffers: never moved to the device)."""

    def __init__(self, op: nn.Module, constants: list[torch.Tensor | None]):
        super().__init__()
        self.op = op
        self.host_constants = [None if c is None else c.detach().cpu() for c in constants]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.op(x, *self.host_constants)


class StaticSlice(nn.Module):
    """onnx2torch's Slice with constant starts/ends/axes/steps resolved once, at load, into Python slices
    (the same `_get_slices`/`_do_slice` onnx2torch runs each forward): no host reads, no graph break."""

    def __init__(self, starts: torch.Tensor, ends: torch.Tensor, axes: torch.Tensor | None,
                 steps: torch.Tensor | None):
        super().__init__()
        from onnx2torch.node_converters.slice import _get_slices

        flip, pos, neg = _get_slices(starts.cpu().tolist(), ends.cpu().tolist(), axes, steps)
        self.flip_dims = [int(d) for d in flip]
        self.slices = tuple(s if s is Ellipsis else slice(*(None if v is None else int(v)
                                                             for v in (s.start, s.stop, s.step)))
                            for s in (*pos, *neg))
        self.split = len(pos)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from onnx2torch.node_converters.slice import _do_slice

        return _do_slice(x, self.flip_dims, list(self.slices[:self.split]), list(self.slices[self.split:]))


class StaticReshape(nn.Module):
    """onnx2torch's Reshape with a constant shape, as Python ints resolved at load (ONNX: 0 keeps that dim)."""

    def __init__(self, shape: torch.Tensor):
        super().__init__()
        self.shape = [int(v) for v in shape.cpu().tolist()]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.reshape(x, [x.shape[i] if d == 0 else d for i, d in enumerate(self.shape)])


def _constant(module: fx.GraphModule, node: object) -> torch.Tensor | None:
    if node is None:
        return None
    value = module
    for part in node.target.split("."):
        value = getattr(value, part)
    return value


def keep_shape_constants_on_host(module: nn.Module) -> int:
    """Rewrite `module` (an onnx2torch fx.GraphModule) in place; returns how many ops were rebound."""
    if not isinstance(module, fx.GraphModule):
        return 0
    count = 0
    for node in list(module.graph.nodes):
        if node.op != "call_module" or type(module.get_submodule(node.target)).__name__ not in HOST_SHAPE_OPS:
            continue
        rest = node.args[1:]
        if not all(a is None or (isinstance(a, fx.Node) and a.op == "get_attr") for a in rest):
            continue  # a shape computed at run time: left as it is
        op, constants = module.get_submodule(node.target), [_constant(module, a) for a in rest]
        if type(op).__name__ == "OnnxSlice":
            host = [None if c is None else c.detach().cpu() for c in constants] + [None] * (4 - len(constants))
            module.add_submodule(node.target, StaticSlice(*host))
        elif type(op).__name__ == "OnnxReshape":
            module.add_submodule(node.target, StaticReshape(constants[0]))
        else:
            module.add_submodule(node.target, HostConstantCall(op, constants))
        node.args = node.args[:1]
        count += 1
    module.graph.eliminate_dead_code()
    module.delete_all_unused_submodules()
    module.recompile()
    return count
