"""The ncnn backend (CPU): the family's ONNX graph (or its torch core's export) converted by pnnx.

- Conversion: pnnx's own binary (shipped in the `pnnx` package) run on the ONNX file with the input shape,
  `fp16=0` for an fp32 row (pnnx stores fp16 weights by default). Cached by the graph's SHA-256, the pnnx
  version, the input size and the weight precision.
- fp16 weights: pnnx's fp16 writer (ncnn's float32_to_float16) flushes every weight below fp16's normal range
  (2^-14) to zero and truncates the rest. YOLOX's stem convolution sees raw 0-255 pixels and 17 % of its weights
  are that small: flushing them alone moves the boxes ~23x more than rounding every weight to fp16 does (mean box
  error 0.080 vs 0.0034 px at the input size, ONNX Runtime on both weight sets) and cost 0.012 mAP. So pnnx
  writes fp32 weights and `fp16_weights_file` writes the fp16 file itself: each weight blob rounded to the
  nearest fp16 value, subnormals kept (ncnn reads them back exactly), a blob that would overflow fp16 kept
  fp32 (ncnn's format tags each blob). Graphs with a layer type it does not know use pnnx's own writer,
  recorded in the conversion block.
- Precision: ncnn's Python runtime turns fp16 storage *and arithmetic* on by default, so an "fp32" row would
  run fp16. fp32 turns every fp16/bf16 option off; fp16 stores weights and blobs in fp16 and computes in
  fp16 only where the CPU has fp16 arithmetic (ARMv8.2 asimdhp), else fp32. What ran is recorded as
  `compute_precision`.
- One image per extractor call: ncnn has no batch axis, so batch sizes above 1 are refused.
- Strided slices: ncnn's Crop has no step, so pnnx leaves the space-to-depth stem of YOLOX/YOLOv5 ("Focus":
  four `x[..., i::2, j::2]` concatenated) unconverted. Before conversion that pattern is rewritten into the
  equivalent SpaceToDepth + Split + Concat (checked equal in ONNX Runtime by the tests), and pnnx's
  translation of SpaceToDepth into ncnn's Reorg is given Reorg's mode 1 (SpaceToDepth's depth-column-row
  order; pnnx writes mode 0, pixel_unshuffle's channel-major order, which reorders the channels).
Every conversion is checked against ONNX Runtime on the source graph (or the torch module) before use.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import torch

from harness.backends import BackendOptions
from harness.backends.onnx_graph import check_against_source, has_onnx_graph, load_checked, onnx_graph
from harness.backends.support import check_batch_sizes
from harness.detector.source import CoreSource
from harness.detector.weights import weights_dir
from harness.errors import UsageError
from harness.files import atomic_folder, safe_name
from harness.measure.device import Device
from harness.storage import cache_writes

CONVERT_TIMEOUT_S = 600
# A converted model is first run in a child process: ncnn crashes (SIGSEGV) on some graphs pnnx writes, and a
# crash there costs one cell a one-line refusal instead of the whole sweep.
PROBE = """
import json, resource, sys, ncnn, numpy as np
limit = int(sys.argv[5])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
net = ncnn.Net()
net.opt.use_fp16_storage = net.opt.use_fp16_packed = net.opt.use_fp16_arithmetic = False
net.opt.num_threads = 1
if net.load_param(sys.argv[1]) != 0 or net.load_model(sys.argv[2]) != 0:  # not assert: python -O drops those
    sys.exit("load failed")
ex = net.create_extractor()
image = np.zeros((3, int(sys.argv[3]), int(sys.argv[4])), np.float32)  # ncnn.Mat wraps it: keep it alive
ex.input(net.input_names()[0], ncnn.Mat(image))
sizes = {}
for name in net.output_names():
    code, mat = ex.extract(name)
    if code != 0:
        sys.exit(f"extract({name}) returned {code}")
    sizes[name] = int(np.array(mat).size)
print(json.dumps(sizes))
"""
PROBE_MEMORY_BYTES = 6 << 30  # the child's address space: a mis-converted broadcast fails there, not the machine


def _cache_dir(name: str, graph_sha: str, input_size: tuple[int, int], weights: str) -> Path:
    safe = safe_name(name, "core")
    h, w = input_size
    return weights_dir() / "ncnn" / f"{safe}__{graph_sha[:16]}__pnnx{version('pnnx')}__{h}x{w}__{weights}"


CONVERSION_FILE = "conversion.json"
CACHED_FILES = ("model.ncnn.param", "model.ncnn.bin", CONVERSION_FILE)


def convert_with_pnnx(name: str, graph_bytes: bytes, input_size: tuple[int, int],
                      fp16_weights: bool) -> tuple[Path, dict]:
    """The ncnn param/bin of this ONNX graph (from the cache, else converted by pnnx); returns the folder and
    what was done, for the record. One UsageError line when pnnx fails (its last lines name the op)."""
    sha = hashlib.sha256(graph_bytes).hexdigest()
    folder = _cache_dir(name, sha, input_size, "fp16-nearest" if fp16_weights else "fp32")
    info = {"converter": "pnnx (ONNX -> ncnn)", "pnnx": version("pnnx"), "source_sha256": sha,
            "folder": str(folder), "weights": "fp16" if fp16_weights else "fp32"}
    if all((folder / f).is_file() for f in CACHED_FILES):
        try:
            # the folder this run used (the entry may have been moved); the conversion's seconds are its own, then
            stored = json.loads((folder / CONVERSION_FILE).read_text(encoding="utf-8"))
            converted_in = stored.pop("seconds", None)
            return folder, {**stored, "folder": str(folder), "cached": True, "seconds_when_converted": converted_in}
        except (OSError, ValueError):  # a damaged cache entry: converted again below, replacing it
            pass
    shutil.rmtree(folder, ignore_errors=True)  # a damaged or partial entry goes before the new one takes its place
    clock = time.perf_counter()
    with atomic_folder(folder) as tmp, cache_writes(folder, tmp):
        model, focus = rewrite_focus(onnx.ModelProto.FromString(graph_bytes))
        model.ir_version = min(model.ir_version, 8)  # pnnx's own ONNX reader refuses newer IR versions
        info["rewrites"] = {"focus_to_space_to_depth": focus}
        (tmp / "model.onnx").write_bytes(model.SerializeToString())
        _run_pnnx(name, tmp, input_size, fp16=False)
        if fp16_weights:
            try:
                data, kept_fp32 = fp16_weights_file((tmp / "model.ncnn.param").read_text(encoding="utf-8"),
                                                    (tmp / "model.ncnn.bin").read_bytes())
            except ValueError as exc:  # a layer it does not know, or a .bin it cannot walk: pnnx's own writer
                _run_pnnx(name, tmp, input_size, fp16=True)
                info["fp16_writer"] = f"pnnx's (values below fp16's normal range become 0; {exc})"
            else:
                (tmp / "model.ncnn.bin").write_bytes(data)
                info["fp16_writer"] = "va-bench: round to nearest, subnormals kept"
                info["fp32_blobs_past_fp16_range"] = kept_fp32
        if focus:
            info["rewrites"]["reorg_mode_1"] = _reorg_as_space_to_depth(tmp / "model.ncnn.param", focus)
        unsupported = _unsupported_layers(tmp / "model.ncnn.param")
        if unsupported:
            raise UsageError(f"{name}: pnnx left operators ncnn cannot run ({', '.join(unsupported)}); "
                             "use --backend onnxruntime")
        _probe(name, tmp, input_size, output_sizes(model, input_size))
        info["seconds"] = round(time.perf_counter() - clock, 3)
        (tmp / CONVERSION_FILE).write_text(json.dumps(info, indent=2))  # what a cached copy says it is
        for leftover in tmp.iterdir():
            if leftover.name not in CACHED_FILES:
                leftover.unlink()
    return folder, {**info, "cached": False}


def _run_pnnx(name: str, folder: Path, input_size: tuple[int, int], fp16: bool) -> None:
    """pnnx on folder/model.onnx, writing model.ncnn.param/.bin there; one UsageError line when it fails."""
    import pnnx

    h, w = input_size
    # pnnx writes its intermediate files beside the input; the arguments are a list, never a shell string
    command = [pnnx.EXEC_PATH, "model.onnx", f"inputshape=[1,3,{h},{w}]f32", f"fp16={int(fp16)}",
               "ncnnparam=model.ncnn.param", "ncnnbin=model.ncnn.bin"]
    done = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=CONVERT_TIMEOUT_S)
    if done.returncode != 0 or not (folder / "model.ncnn.param").is_file():
        tail = [line for line in (done.stderr + done.stdout).splitlines() if line.strip()][-2:]
        raise UsageError(f"{name}: pnnx cannot convert this graph to ncnn (exit {done.returncode}: "
                         f"{' / '.join(tail)[:300]}); use --backend onnxruntime")


class UnknownLayer(ValueError):
    """A layer whose weights fp16_weights_file cannot locate in the .bin."""


FP16_TAG = 0x01306B47  # ncnn's ModelBin: the blob that follows is fp16 (0: raw fp32)


@dataclass(frozen=True)
class WeightParams:
    """Where a layer's .param line says what its weights are: the param ids of the weight count, the bias flag,
    the output count (the bias is raw fp32, one per output), and of the flags that mean no plain weights in the
    .bin (dynamic weights, given as an input; int8 scales)."""

    count: str
    bias: str
    outputs: str
    dynamic: str | None
    int8: str | None


# Layers whose weights ncnn loads tagged (mb.load(n, 0)), from each layer's load_param/load_model in ncnn's src/layer
TAGGED_WEIGHTS = {
    **{t: WeightParams("6", "5", "0", "19", "8") for t in ("Convolution", "ConvolutionDepthWise")},
    "Convolution1D": WeightParams("6", "5", "0", "19", None),
    "Convolution3D": WeightParams("6", "5", "0", None, None),
    **{t: WeightParams("6", "5", "0", "28", None) for t in ("Deconvolution", "DeconvolutionDepthWise",
                                                             "Deconvolution1D", "Deconvolution3D")},
    "InnerProduct": WeightParams("2", "1", "0", None, "8"),
}
WEIGHTLESS = {"Input", "BinaryOp", "Concat", "Interp", "Permute", "Pooling", "Pooling1D", "Pooling3D", "Reorg",
              "Reshape", "Sigmoid", "Slice", "Split", "Swish", "ReLU", "Clip", "Crop", "Softmax", "Flatten",
              "Eltwise", "UnaryOp", "HardSwish", "HardSigmoid", "Mish", "Noop", "Squeeze",
              "ExpandDims", "PixelShuffle", "TanH", "ELU", "GELU", "Dropout", "Reduction", "Tile", "Cast",
              "Flip", "Erf", "ShuffleChannel", "CopyTo"}


def _layer_params(line: str) -> tuple[str, dict[str, str]]:
    """(type, {param id: value}) of one .param layer line (array params, negative ids, are left out)."""
    fields = line.split()
    n_in, n_out = int(fields[2]), int(fields[3])
    params = dict(f.split("=", 1) for f in fields[4 + n_in + n_out:] if "=" in f and not f.startswith("-"))
    return fields[0], params


def fp16_weights_file(param_text: str, fp32_bin: bytes) -> tuple[bytes, int]:
    """The .bin of pnnx's fp32 conversion with every tagged weight blob in fp16, rounded to nearest with
    subnormals kept (numpy's IEEE conversion); a blob with a value past fp16's range stays fp32. Returns the
    bytes and how many blobs stayed fp32. UnknownLayer when a layer type's weights cannot be located; a
    ValueError when the walk does not end exactly at the end of the file."""
    out, pos, kept = bytearray(), 0, 0
    for line in param_text.splitlines()[2:]:
        if not line.strip():
            continue
        kind, params = _layer_params(line)
        if kind in WEIGHTLESS:
            continue
        if kind not in TAGGED_WEIGHTS:
            raise UnknownLayer(f"layer type {kind}")
        ids = TAGGED_WEIGHTS[kind]
        if any(flag is not None and params.get(flag, "0") != "0" for flag in (ids.dynamic, ids.int8)):
            raise UnknownLayer(f"{kind} with dynamic weights or int8 scales")
        count = int(params.get(ids.count, "0"))
        tag = int.from_bytes(fp32_bin[pos:pos + 4], "little")
        if tag != 0:
            raise ValueError(f"the fp32 .bin has tag {tag:#x} at byte {pos}, not a raw fp32 blob")
        values = np.frombuffer(fp32_bin, np.float32, count, pos + 4)
        pos += 4 + 4 * count
        if np.all(np.abs(values) <= np.finfo(np.float16).max):
            half = values.astype(np.float16).tobytes()
            out += FP16_TAG.to_bytes(4, "little") + half + b"\0" * (-len(half) % 4)
        else:
            out += fp32_bin[pos - 4 - 4 * count:pos]
            kept += 1
        if params.get(ids.bias, "0") != "0":
            bias = 4 * int(params.get(ids.outputs, "0"))
            out += fp32_bin[pos:pos + bias]
            pos += bias
    if pos != len(fp32_bin):
        raise ValueError(f"the layers account for {pos} of the .bin's {len(fp32_bin)} bytes")
    return bytes(out), kept


def output_shapes(model: onnx.ModelProto, input_size: tuple[int, int]) -> list[list[int]]:
    """Each graph output's shape at batch 1 and this input size (0 where it is not known statically).

    From ONNX shape inference on the graph with its input fixed to [1, 3, H, W]: a graph whose height and width
    were made symbolic still declares the outputs of the size it was exported at."""
    fixed = onnx.ModelProto.FromString(model.SerializeToString())
    dims = fixed.graph.input[0].type.tensor_type.shape.dim
    if len(dims) == 4:
        for dim, value in zip(dims, (1, 3, *input_size), strict=True):
            dim.dim_value = value
    for out in fixed.graph.output:
        for dim in out.type.tensor_type.shape.dim:
            dim.Clear()
    try:
        outputs = onnx.shape_inference.infer_shapes(fixed, data_prop=True).graph.output
    except Exception:  # onnx's own error types: the declared shapes hold where the graph is of this size only
        declared_size = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim][2:]
        outputs = model.graph.output if declared_size == list(input_size) else fixed.graph.output
    return [[1] + [d.dim_value for d in out.type.tensor_type.shape.dim][1:] for out in outputs]


def output_sizes(model: onnx.ModelProto, input_size: tuple[int, int]) -> list[int]:
    """Each graph output's element count at batch 1 and this input size; empty when a dimension is not known
    statically."""
    shapes = output_shapes(model, input_size)
    return [int(np.prod(s)) for s in shapes] if all(all(s) for s in shapes) else []


def _probe(name: str, folder: Path, input_size: tuple[int, int], sizes: list[int]) -> None:
    """Run the converted model once in a child process (address space capped) and compare each output's
    element count with the graph's; one UsageError line when ncnn fails, crashes or returns other shapes."""
    command = [sys.executable, "-c", PROBE, "model.ncnn.param", "model.ncnn.bin", *map(str, input_size),
               str(PROBE_MEMORY_BYTES)]
    done = subprocess.run(command, cwd=folder, capture_output=True, text=True, timeout=CONVERT_TIMEOUT_S)
    if done.returncode != 0:
        why = (f"crashed with signal {signal.Signals(-done.returncode).name}" if done.returncode < 0
               else f"failed in a child process capped at {PROBE_MEMORY_BYTES >> 30} GiB (exit {done.returncode}: "
                    f"{(done.stderr.strip().splitlines() or ['?'])[-1][:160]}; a mis-converted operator can blow up "
                    "a shape)")
        raise UsageError(f"{name}: ncnn {version('ncnn')} {why} running the model pnnx converted; "
                         "use --backend onnxruntime")
    got = [n for _, n in sorted(json.loads(done.stdout.strip().splitlines()[-1]).items(),
                                key=lambda kv: (len(kv[0]), kv[0]))]
    if sizes and got != sizes:
        raise UsageError(f"{name}: the model pnnx converted gives outputs of {got} values where the graph gives "
                         f"{sizes} (a mis-converted operator); use --backend onnxruntime")


def _constants(graph: onnx.GraphProto) -> dict[str, np.ndarray]:
    values = {init.name: onnx.numpy_helper.to_array(init) for init in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant":
            for attr in node.attribute:
                if attr.name == "value":
                    values[node.output[0]] = onnx.numpy_helper.to_array(attr.t)
    return values


def _focus_offsets(graph: onnx.GraphProto, concat: onnx.NodeProto, values: dict, producer: dict) -> tuple | None:
    """(root tensor, [(row, col) offset of each concat input]) when `concat` joins the four stride-2 slices of
    one tensor along axes 2 and 3 (the Focus stem); None otherwise."""
    if concat.op_type != "Concat" or len(concat.input) != 4 or \
            next((a.i for a in concat.attribute if a.name == "axis"), None) != 1:
        return None
    roots, offsets = set(), []
    for name in concat.input:
        steps: dict[int, tuple[int, int]] = {}
        while name in producer and producer[name].op_type == "Slice":
            node = producer[name]
            if len(node.input) < 5 or any(x not in values for x in node.input[1:5]):
                return None
            starts, _, axes, strides = (values[x].tolist() for x in node.input[1:5])
            for start, axis, stride in zip(starts, axes, strides, strict=True):
                steps[axis % 4] = (start, stride)
            name = node.input[0]
        if set(steps) != {2, 3} or any(stride != 2 or start not in (0, 1) for start, stride in steps.values()):
            return None
        roots.add(name)
        offsets.append((steps[2][0], steps[3][0]))
    if len(roots) != 1 or sorted(offsets) != [(0, 0), (0, 1), (1, 0), (1, 1)]:
        return None
    return roots.pop(), offsets


def rewrite_focus(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """A copy whose Focus stems (see the module docstring) are SpaceToDepth + Split + Concat, and how many
    were rewritten. The same values in ONNX semantics; ncnn can run it (strided slices it cannot)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    values = _constants(graph)
    producer = {out: node for node in graph.node for out in node.output}
    channels = {v.name: v.type.tensor_type.shape.dim[1].dim_value for v in graph.input
                if len(v.type.tensor_type.shape.dim) == 4}
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 17)
    rewritten = 0
    for concat in list(graph.node):
        found = _focus_offsets(graph, concat, values, producer)
        if found is None or not channels.get(found[0]):
            continue
        root, offsets = found
        c = channels[root]
        base = f"{concat.output[0]}__space_to_depth"
        parts = [f"{base}_{k}" for k in range(4)]  # SpaceToDepth's channel blocks: offset (i, j) is block 2i + j
        if opset >= 13:
            graph.initializer.append(onnx.numpy_helper.from_array(np.array([c] * 4, dtype=np.int64), f"{base}_sizes"))
            split = onnx.helper.make_node("Split", [base, f"{base}_sizes"], parts, axis=1)
        else:
            split = onnx.helper.make_node("Split", [base], parts, axis=1, split=[c] * 4)
        nodes = [onnx.helper.make_node("SpaceToDepth", [root], [base], blocksize=2), split,
                 onnx.helper.make_node("Concat", [parts[2 * i + j] for i, j in offsets], list(concat.output), axis=1)]
        at = list(graph.node).index(concat)
        graph.node.remove(concat)
        for k, node in enumerate(nodes):
            graph.node.insert(at + k, node)
        rewritten += 1
    while rewritten:  # drop the slices nobody reads any more
        used = {i for node in graph.node for i in node.input} | {o.name for o in graph.output}
        dead = [node for node in graph.node if not any(out in used for out in node.output)]
        if not dead:
            break
        for node in dead:
            graph.node.remove(node)
    return model, rewritten


def _reorg_as_space_to_depth(param: Path, expected: int) -> int:
    """Give the Reorg layers pnnx made of ONNX SpaceToDepth nodes SpaceToDepth's order (mode 1)."""
    lines = param.read_text(encoding="utf-8").splitlines()
    reorg = [k for k, line in enumerate(lines) if line.split()[:1] == ["Reorg"]]
    if len(reorg) != expected:  # not the layers made of our SpaceToDepth nodes: their order would be wrong
        raise UsageError(f"pnnx wrote {len(reorg)} Reorg layers for {expected} SpaceToDepth nodes; this graph's "
                         "space-to-depth cannot be given the right channel order: use --backend onnxruntime")
    for k in reorg:
        lines[k] = re.sub(r"(?<= )1=0\b", "1=1", lines[k]) if " 1=" in lines[k] else lines[k] + " 1=1"
    param.write_text("\n".join(lines) + "\n")
    return len(reorg)


def _unsupported_layers(param: Path) -> list[str]:
    """Layer types pnnx writes when it has no ncnn equivalent (they fail only at load or at run time)."""
    types = {line.split()[0] for line in param.read_text(encoding="utf-8").splitlines()[2:] if line.strip()}
    return sorted(t for t in types if "." in t or t.startswith(("pnnx", "torch", "F.", "Tensor")))


class NcnnCore:
    """An ncnn net on the CPU, one image per extractor call (batch 1 only)."""

    backend = "ncnn"
    format = "ncnn"
    provider = "cpu"
    takes_device_tensors = False
    torch_module = None

    def __init__(self, name: str, graph: onnx.ModelProto, device: Device, threads: int | None, precision: str,
                 input_size: tuple[int, int]):
        self.precision, self.device, self.input_size = precision, device, input_size
        fp16 = precision == "fp16"
        folder, self.conversion = convert_with_pnnx(name, graph.SerializeToString(), input_size, fp16)
        if not self._load(folder, threads, fp16, required=None if self.conversion["cached"] else name):
            shutil.rmtree(folder, ignore_errors=True)  # a damaged cache entry: convert again, once
            folder, self.conversion = convert_with_pnnx(name, graph.SerializeToString(), input_size, fp16)
            self._load(folder, threads, fp16, required=name)
        # pnnx names the graph's outputs out0, out1, ... in the ONNX graph's order: the order of the raw outputs
        self.inputs = list(self.net.input_names())
        self.outputs = sorted(self.net.output_names(), key=lambda n: (len(n), n))
        # ncnn's blobs have no batch axis and drop leading unit axes: each output goes back to the graph's shape
        self.output_shapes = output_shapes(graph, input_size)

    def _load(self, folder: Path, threads: int | None, fp16: bool, required: str | None = None) -> bool:
        """Load the param/bin with the row's options; False (or, with `required`, one UsageError line naming
        the model) when ncnn cannot read them."""
        import ncnn

        self.net = ncnn.Net()
        opt = self.net.opt
        arithmetic = fp16 and bool(ncnn.cpu_support_arm_asimdhp())
        opt.use_fp16_storage = opt.use_fp16_packed = fp16
        opt.use_fp16_arithmetic = arithmetic
        opt.use_bf16_storage = opt.use_bf16_packed = False
        opt.use_vulkan_compute = False
        opt.num_threads = threads or ncnn.get_big_cpu_count()
        self.compute_precision = "fp16" if arithmetic else "fp32"
        self.options = {"use_fp16_storage": bool(opt.use_fp16_storage), "use_fp16_packed": bool(opt.use_fp16_packed),
                        "use_fp16_arithmetic": bool(opt.use_fp16_arithmetic),
                        "use_bf16_storage": bool(opt.use_bf16_storage), "num_threads": int(opt.num_threads),
                        "use_vulkan_compute": bool(opt.use_vulkan_compute),
                        # ms its OpenMP threads spin after each parallel region: its default, recorded (a busy
                        # machine's warning names it)
                        "openmp_blocktime": int(opt.openmp_blocktime)}
        loaded = (self.net.load_param(str(folder / "model.ncnn.param")) == 0
                  and self.net.load_model(str(folder / "model.ncnn.bin")) == 0)
        if not loaded and required:
            raise UsageError(f"{required}: ncnn cannot load the model pnnx converted in {folder}; use --backend "
                             "onnxruntime")
        return loaded

    def __call__(self, batch: torch.Tensor) -> list[torch.Tensor]:
        import ncnn

        if batch.shape[0] != 1:
            raise UsageError("ncnn runs one image per call; use --batch-sizes 1")
        image = np.ascontiguousarray(batch[0].numpy())  # ncnn.Mat wraps this memory without a copy: keep it alive
        with self.net.create_extractor() as ex:
            ex.input(self.inputs[0], ncnn.Mat(image))
            outputs = []
            for name in self.outputs:
                code, mat = ex.extract(name)
                if code != 0:
                    raise RuntimeError(f"ncnn extract({name}) failed with {code}")
                array, shape = np.array(mat), self.output_shapes[len(outputs)]
                if not all(shape):  # a symbolic dimension: ncnn's own shape, the batch axis put back
                    outputs.append(torch.from_numpy(array[None]))
                elif array.size == int(np.prod(shape)):
                    outputs.append(torch.from_numpy(array.reshape(shape)))
                else:
                    raise RuntimeError(f"ncnn output {name} has {array.size} values where the graph's {shape} has "
                                       f"{int(np.prod(shape))}")
        return outputs

    def info(self) -> dict[str, Any]:
        return {"backend": self.backend, "ncnn": version("ncnn"), "device_name": "cpu",
                "compute_precision": self.compute_precision,
                "precision_mode": ("fp32 weights and arithmetic (ncnn's fp16/bf16 options off)"
                                   if self.precision == "fp32"
                                   else f"fp16 weights and storage, {self.compute_precision} arithmetic"),
                "options": self.options, "conversion": self.conversion,
                "layers_unavailable": "ncnn's Python runtime exposes no per-layer timing"}


class NcnnBackend:
    """ncnn on the CPU: fp32 and fp16, batch 1 (one image per extractor call)."""

    name = "ncnn"

    def supports(self, source: CoreSource) -> bool:
        return has_onnx_graph(source)

    def load(self, source: CoreSource, device: Device, precision: str, input_size: tuple[int, int],
             threads: int | None, options: BackendOptions) -> NcnnCore:
        check_batch_sizes(self.name, [options.max_batch], "use --batch-sizes 1 with --backend ncnn")
        graph, module = onnx_graph(source, input_size)

        def make_core() -> NcnnCore:
            return NcnnCore(source.name, graph, device, threads, precision, input_size)

        if precision != "fp32":  # fp16 storage differs from the source by more than the check's tolerance
            return make_core()
        return load_checked(make_core, lambda core: check_against_source(source, graph, module, core, input_size,
                                                                         "ncnn", batches=(1,)),
                            lambda core: Path(core.conversion["folder"]))
