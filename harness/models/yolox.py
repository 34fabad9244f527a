"""YOLOX family: official ONNX exports, run by any backend (ONNX Runtime as is, PyTorch via onnx2torch),
or a TensorRT engine built from one (`--backend tensorrt --weights x.engine`: same pre/post-processing).

Raw output [B, N, 85] per anchor point at strides 8/16/32: (dx, dy, log w, log h) in grid units,
objectness and 80 class probabilities (already sigmoid). Input: BGR, 0-255, no normalisation,
aspect-preserving resize with top-left padding of value 114 (YOLOX's ValTransform, legacy=False).
"""

from __future__ import annotations

import math
import os
from functools import cached_property
from pathlib import Path

import onnx
import torch

from harness.build_info import source_tree
from harness.catalogue import YOLOX_VARIANTS
from harness.data.categories import COCO80_TO_91
from harness.detector.engine import (
    engine_core_source,
    engine_model_stats,
    engine_weights,
    is_engine_file,
    probe_outputs,
)
from harness.detector.graph import make_batch_dynamic, onnx_model_stats, onnx_param_count
from harness.detector.protocol import (
    RANDOM_WEIGHTS,
    Candidates,
    ModelStats,
    PostprocessSpec,
    PreprocessSpec,
    WeightsInfo,
)
from harness.detector.source import CoreSource
from harness.detector.weights import weights_dir
from harness.errors import UsageError, path_problem
from harness.files import file_sha256

# variant -> native input size (the official release's export size)
VARIANTS = YOLOX_VARIANTS
RELEASE_URL = "https://github.com/Megvii-BaseDetection/YOLOX/releases/download/0.1.1rc0/yolox_{variant}.onnx"
# the release files' SHA-256 where known here (nano: the offline asset, the release's file): a download of another
# file is refused; the other variants' are checked for their parameter count only
RELEASE_SHA256 = {"nano": "695e750a5d5754bb5a8d5325643b59282191a7e7a564e435a415fd3c578eab14"}
STRIDES = (8, 16, 32)
# Parameters of each variant (millions; YOLOX's model zoo table). Adjacent variants differ 1.8x or more, so a
# graph outside [0.75, 1.33] of its variant's count is another variant, whatever the file is called
PARAMS_MILLIONS = {"nano": 0.91, "tiny": 5.06, "s": 9.0, "m": 25.3, "l": 54.2, "x": 99.1}
QUANTIZED_OPS = {"QuantizeLinear", "DequantizeLinear", "QLinearConv", "QLinearMatMul", "ConvInteger",
                 "MatMulInteger", "DynamicQuantizeLinear"}
_CHECKOUT = source_tree()
# the offline assets beside the harness's checkout (none for an installed package)
OFFLINE_DIR = None if _CHECKOUT is None else _CHECKOUT.parent / "shared" / "assets" / "onnx"


def weight_candidates(variant: str) -> list[Path]:
    """Where yolox-<variant> weights are looked for, in order."""
    filename = f"yolox_{variant}.onnx"
    candidates = []
    env = os.environ.get(f"VA_BENCH_YOLOX_{variant.upper()}")
    if env:
        candidates.append(Path(env))
    candidates.append(weights_dir() / filename)
    if OFFLINE_DIR is not None:
        candidates.append(OFFLINE_DIR / filename)
    return candidates


def anchor_count(input_size: tuple[int, int]) -> int:
    """Anchor points of a YOLOX head at this input size: one per grid cell at each stride."""
    return sum((input_size[0] // s) * (input_size[1] // s) for s in STRIDES)


def anchor_mismatch(anchors: int, input_size: tuple[int, int]) -> str | None:
    """What is wrong when a head's anchor count does not fit the input size (None when it does)."""
    expected = anchor_count(input_size)
    if anchors == expected:
        return None
    return (f"the model's output has {anchors} anchors where the input size {input_size[0]}x{input_size[1]} "
            f"implies {expected} (one per grid cell at strides {'/'.join(map(str, STRIDES))})")


def _declared_dims(value: onnx.ValueInfoProto) -> list[int | str | None] | None:
    """A graph input's or output's declared shape (ints, symbolic names, None where unknown); None if it has none."""
    tensor = value.type.tensor_type
    if not tensor.HasField("shape"):
        return None
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim]


def check_yolox_outputs(model: onnx.ModelProto, path: Path) -> None:
    """Refuse, in one UsageError line, an ONNX file that is not a COCO YOLOX export: one output [B, N, 85]
    whose N is the anchor count of the declared input size (checked where both are static). An output
    declared without a shape gets ONNX's own shape inference first (some exporters leave it out)."""
    def refuse(problem: str, fix: str) -> UsageError:
        return UsageError(f"{path_problem('ONNX model', path, problem)}; {fix}")

    outputs = model.graph.output
    if len(outputs) != 1:
        raise refuse(f"it has {len(outputs)} outputs ({', '.join(o.name for o in outputs)}), not a COCO YOLOX "
                     "export's one [B, N, 85]", "pass a YOLOX ONNX export")
    name, dims = outputs[0].name, _declared_dims(outputs[0])
    if dims is None or (len(dims) == 3 and dims[2] is None):
        try:
            dims = _declared_dims(onnx.shape_inference.infer_shapes(model).graph.output[0])
        except Exception:  # onnx's InferenceError and friends: the shape stays unknown
            dims = None
    if dims is None or (len(dims) == 3 and dims[2] is None):
        raise refuse(f"its output {name!r} has no shape information (not even from ONNX shape inference), so it "
                     "cannot be checked as YOLOX's [B, N, 85]", "export it with output shapes (torch.onnx.export "
                     "records them), or pass the official YOLOX export")
    if len(dims) != 3 or dims[2] != 85:
        shown = ", ".join("?" if d is None else str(d) for d in dims)
        raise refuse(f"its output {name!r} is [{shown}], not YOLOX's [B, N, 85] (80 classes + box + objectness): "
                     "it is not a COCO YOLOX detector", "pass a YOLOX ONNX export, or run another model as a "
                     "plugin (--model path/to/file.py:factory)")
    inputs = _declared_dims(model.graph.input[0]) if model.graph.input else None
    spatial = tuple(inputs[2:4]) if inputs and len(inputs) == 4 else ()
    if isinstance(dims[1], int) and len(spatial) == 2 and all(isinstance(d, int) and d > 0 for d in spatial):
        problem = anchor_mismatch(dims[1], spatial)
        if problem:
            raise refuse(problem.replace("the input size", "its input size"), "its head is not YOLOX's at that "
                         "size: re-export the model at the input size it declares, or pass another export")


class YoloxHeadDecoder:
    """YOLOX's head decode (boxes from each anchor's grid cell and stride, score = objectness x best class),
    without the model: picklable, its grids made again where it is unpickled (host processes run it). The official
    ONNX export and libreyolo's YOLOX share it."""

    def __init__(self, model_id: str):
        self.model_id = model_id
        self._grids: dict[tuple, torch.Tensor] = {}

    def __getstate__(self) -> dict:
        return {"model_id": self.model_id}  # not the grids: they may be on a GPU

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["model_id"])

    def _grid(self, input_size: tuple[int, int], device, dtype) -> torch.Tensor:
        """[anchors, 3]: grid x, grid y and stride of every anchor, in the head's order."""
        key = (input_size, str(device), dtype)
        if key not in self._grids:
            cells = []
            for stride in STRIDES:
                h, w = input_size[0] // stride, input_size[1] // stride
                ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
                cells.append(torch.stack((xs, ys, torch.full_like(xs, stride)), -1).reshape(-1, 3))
            self._grids[key] = torch.cat(cells).to(device, dtype)
        return self._grids[key]

    def __call__(self, raw: list[torch.Tensor], input_size: tuple[int, int], conf: float) -> list[Candidates]:
        out = raw[0]
        batch, anchors, width = out.shape
        grid = self._grid(input_size, out.device, out.dtype)
        if anchors != grid.shape[0]:  # an export with symbolic shapes, so not caught at load
            raise UsageError(f"{self.model_id}: {anchor_mismatch(anchors, input_size)}; the export's head does not "
                             "fit this input size: run it at the size it was exported for, or re-export it")
        # score = objectness x best class probability <= objectness, so anchors whose objectness is
        # already below `conf` can never pass: skip their 80-class max (most of the decode cost).
        # One set of tensor ops for the whole batch, then split per image.
        flat = out.reshape(batch * anchors, width)
        hits = (flat[:, 4] >= conf).nonzero().squeeze(1)
        rows = flat.index_select(0, hits)
        class_prob, labels = rows[:, 5:].max(dim=1)
        box = rows[:, :5].contiguous()  # contiguous, so exp below takes the vectorised path
        scores = box[:, 4] * class_prob
        cell = grid.index_select(0, hits % anchors)  # (x, y, stride) of each hit's anchor
        xy = (box[:, 0:2] + cell[:, 0:2]) * cell[:, 2:3]
        half_wh = torch.exp(box[:, 2:4]) * cell[:, 2:3] / 2
        boxes = torch.cat((xy - half_wh, xy + half_wh), dim=1)
        counts = torch.bincount(hits // anchors, minlength=batch).tolist()
        return [Candidates(boxes=b, scores=s, labels=lab)
                for b, s, lab in zip(boxes.split(counts), scores.split(counts), labels.split(counts), strict=True)]


class YoloxDetector:
    """A YOLOX model from an ONNX file, or from a serialized TensorRT engine of one (`self.engine`): the
    engine's graph cannot be read here, so its input size is the variant's native one (or --input-size)
    and its head is checked with one zero batch at load."""

    family = "yolox"
    class_map = COCO80_TO_91
    # single-label (score = objectness x best class, as YOLOX's own postprocess), the site's thresholds
    postprocess = PostprocessSpec(kind="nms", conf=0.001, iou=0.6, max_det=300, multi_label=False)
    defaults = postprocess.defaults

    def __init__(self, variant: str, weights: str | Path | None = None):
        if variant not in VARIANTS:
            raise UsageError(f"unknown YOLOX variant {variant!r}; known: {', '.join(VARIANTS)}")
        self.variant = variant
        self.model_id = f"yolox-{variant}"
        self.path = self._resolve(weights)
        self.engine = is_engine_file(self.path)
        if self.engine:
            self.weights = engine_weights(self.path)
            self._raw_model = None
            size = (VARIANTS[variant],) * 2
        else:
            self.weights = WeightsInfo(
                file=self.path.name,
                sha256=file_sha256(self.path),
                source="--weights" if weights else "official YOLOX release (ONNX export)",
            )
            self._raw_model = self._load(self.path)
            self._check_variant()
            size = self._native_input_size()
        self.preprocess = PreprocessSpec(input_size=size, resize="letterbox", pad_position="top-left",
                                         pad_value=114, channel_order="BGR", scale=1.0)
        self.host_decoder = YoloxHeadDecoder(self.model_id)

    def _resolve(self, weights: str | Path | None) -> Path:
        if weights == RANDOM_WEIGHTS:
            raise UsageError(f"--weights random needs a torch-defined model; {self.model_id} is defined by its "
                             "ONNX export (pass --weights FILE.onnx, or use a libreyolo YOLOX for random weights)")
        if weights is not None:
            path = Path(weights)
            if not path.is_file():
                raise UsageError(f"--weights {path}: no such file")
            return path
        named = os.environ.get(f"VA_BENCH_YOLOX_{self.variant.upper()}")
        if named and not Path(named).is_file():  # a mistyped path would have run the cached weights in silence
            raise UsageError(path_problem(f"${'VA_BENCH_YOLOX_' + self.variant.upper()}", named, "no such file")
                             + f"; point it at {self.model_id}'s ONNX file, or unset it to use the weights cache")
        for candidate in weight_candidates(self.variant):
            if candidate.is_file():
                return candidate
        raise UsageError(
            f"weights for {self.model_id} not found (looked in "
            f"{', '.join(str(c) for c in weight_candidates(self.variant))}); run "
            f"`va-bench models fetch {self.model_id}`, pass --weights PATH (or --weights random to time and inspect "
            f"the architecture), or set VA_BENCH_YOLOX_{self.variant.upper()} to the file"
        )

    def _check_variant(self) -> None:
        """One line when the graph's parameter count is another variant's: a submission would name the wrong model.
        A quantized graph (its weights integers, which the float count leaves out) is not judged so."""
        if any(node.op_type in QUANTIZED_OPS for node in self._raw_model.graph.node):
            return
        params = onnx_param_count(self._raw_model) / 1e6
        want = PARAMS_MILLIONS[self.variant]
        if params and not 0.75 <= params / want <= 1.33:
            near = min(PARAMS_MILLIONS, key=lambda v: abs(math.log(params / PARAMS_MILLIONS[v])))
            looks = (f"it looks like yolox-{near}; run it as --model yolox-{near}" if near != self.variant
                     else "it is no YOLOX release's")
            raise UsageError(f"{self.path} has {params:.2f} M parameters, YOLOX-{self.variant} {want} M: {looks}, or "
                             f"pass {self.model_id}'s own weights")

    @staticmethod
    def _load(path: Path) -> onnx.ModelProto:
        try:
            model = onnx.load(str(path))
        except Exception as exc:  # onnx raises DecodeError and friends
            raise UsageError(f"{path} is not a readable ONNX model ({exc})") from exc
        check_yolox_outputs(model, path)
        return model

    @cached_property
    def onnx_model(self) -> onnx.ModelProto:
        """The export with symbolic batch/height/width (see make_batch_dynamic)."""
        return make_batch_dynamic(self._raw_model)

    def _native_input_size(self) -> tuple[int, int]:
        dims = self._raw_model.graph.input[0].type.tensor_type.shape.dim
        h, w = dims[2].dim_value, dims[3].dim_value
        return (h, w) if h and w else (VARIANTS[self.variant],) * 2

    @property
    def core_source(self) -> CoreSource:
        """The ONNX export as it is (`pytorch` runs its onnx2torch conversion), or the engine."""
        if self.engine:
            return engine_core_source(self.model_id, self.path)
        return CoreSource(self.model_id, onnx_model=lambda: self.onnx_model)

    def check_core(self, core, input_size: tuple[int, int]) -> None:
        """An engine's outputs (one zero batch) must be YOLOX's single [1, anchors, 85] at this input size."""
        if not self.engine:
            return
        anchors = anchor_count(input_size)
        shapes = probe_outputs(core, input_size)
        if shapes != [(1, anchors, 85)]:
            raise UsageError(f"{self.path.name}: the engine's outputs at {input_size[0]}x{input_size[1]} are "
                             f"{[list(s) for s in shapes]}, not YOLOX's one [1, {anchors}, 85]; build it from a YOLOX "
                             "ONNX export (and run it at the input size it was built for)")

    def decode(self, raw: list[torch.Tensor], input_size: tuple[int, int], conf: float) -> list[Candidates]:
        return self.host_decoder(raw, input_size, conf)

    def model_stats(self, input_size: tuple[int, int]) -> ModelStats:
        return engine_model_stats() if self.engine else onnx_model_stats(self.onnx_model, input_size)
