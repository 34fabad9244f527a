"""Ultralytics-format ONNX exports (yolov8 / yolo11 / yolov5u / yolo26) as generic ONNX families.

No Ultralytics code is imported (AGPL): the harness reads the exported graph's output layout.

- "dense" layout (yolov8, yolo11, yolov5u; yolo26 exported with end2end=False): one output
  [B, 4 + C, N], per anchor point cx, cy, w, h in input pixels then C class scores (sigmoid applied).
  Post-processing as Ultralytics' validator does it: multi-label NMS (every class whose score passes),
  the 30000 best candidates kept before NMS (its max_nms), class-aware NMS.
- "end2end" layout (yolo26's default, NMS-free): one output [B, K, 6] = x1, y1, x2, y2, score, class
  in input pixels. Post-processing kind "topk": each image's best max_det rows with score >= conf.
- "segment" layout (the `-seg` ids: yolov8n-seg, yolo11n-seg, ...): two outputs, [B, 4 + C + P, N] (the
  dense layout plus P mask coefficients per anchor) and the prototypes [B, P, h, w]. Boxes as "dense"; each
  kept detection's mask is sigmoid(coefficients @ prototypes) at prototype resolution, upsampled to the input
  size, cropped to its box, the letterbox padding cropped, resized to the source image, on at >= 0.5
  (MaskSpec "prototypes", harness/pipeline/masks.py).
Thresholds: conf 0.001, iou 0.7, max_det 300 (Ultralytics' validation defaults; the leaderboard's
submissions for these families use them).

Preprocessing is Ultralytics' validation transform (its data/base.py load_image, 8.3): the long side resized to
the input size (size rounded up; cv2 INTER_LINEAR, shrinking or enlarging), centre padding with 114, RGB, /255.
Its val loader pads each batch to its own rectangle (`rect`); a square canvas here, as its exports run.
Boxes go back by the scale factor r (Ultralytics divides by its y gain, equal to r up to rounding).

Ultralytics' default exports are static (batch 1, fixed size): the batch axis is made symbolic
(harness/detector/graph.py: make_batch_dynamic) and each output row is checked against its image
run alone at load; a graph exported at a fixed size runs at that size only.

A TensorRT engine built from such an export (`--backend tensorrt --weights x.engine`, harness/backends/
tensorrt.py) gets the same pre/post-processing. Its graph cannot be read here, so its layout is the
family's default export's (end2end for yolo26, dense otherwise) unless its sidecar says `"layout":
"dense"` or `"end2end"`, and its outputs are checked against that layout with one zero batch at load.
"""

from __future__ import annotations

import ast
import math
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import onnx
import torch

from harness.catalogue import ULTRALYTICS_INPUT_SIZE, ULTRALYTICS_MODEL_IDS, ULTRALYTICS_SEGMENT_IDS
from harness.data.categories import COCO80_TO_91, COCO_NAMES_BY_ID
from harness.detector.engine import (
    engine_core_source,
    engine_model_stats,
    engine_weights,
    is_engine_file,
    probe_outputs,
    read_manifest,
)
from harness.detector.graph import make_batch_dynamic, onnx_model_stats
from harness.detector.protocol import (
    RANDOM_WEIGHTS,
    Candidates,
    DenseCandidates,
    MaskMaps,
    MaskSpec,
    ModelStats,
    PostprocessSpec,
    PreprocessSpec,
    WeightsInfo,
)
from harness.detector.source import CoreSource
from harness.detector.weights import weights_dir
from harness.errors import UsageError
from harness.files import file_sha256

MODEL_IDS = ULTRALYTICS_MODEL_IDS
SEGMENT_IDS = ULTRALYTICS_SEGMENT_IDS
PROTOTYPE_MASKS = MaskSpec(kind="prototypes", values="probabilities", resize="via_input", crop_to_box="input")
MAX_NMS = 30000  # Ultralytics' pre-NMS candidate cap
BATCH_CHECK = (1, 2)
DENSE_POST = PostprocessSpec(kind="nms", conf=0.001, iou=0.7, max_det=300, multi_label=True, pre_nms_topk=MAX_NMS)
END2END_POST = PostprocessSpec(kind="topk", conf=0.001, max_det=300)
LAYOUTS = ("dense", "end2end")  # an engine's; an ONNX export may also be "segment"


def postprocess_kind(family: str) -> str:
    """The kind a family's default export has (yolo26 exports end-to-end unless told otherwise)."""
    return END2END_POST.kind if family == "yolo26" else DENSE_POST.kind


def cached_weights(model_id: str) -> Path | None:
    """The user's export in the weights cache (<weights dir>/<id>.onnx), if present."""
    path = weights_dir() / f"{model_id}.onnx"
    return path if path.is_file() else None


COCO80_NAMES = tuple(COCO_NAMES_BY_ID[category] for category in COCO80_TO_91)


def export_class_names(model: onnx.ModelProto, num_classes: int | None, path: Path) -> tuple[str, ...] | None:
    """An export's class names: its `names` metadata (Ultralytics writes a dict literal {index: name}), read as a
    literal, never executed; `num_classes` is the count its output shape gives (None: an end-to-end export, whose
    shape does not say). Without the metadata: None for 80 classes or an unknown count (a COCO-trained export, as
    the model id says), class_0 ... otherwise. One line when the names disagree with the outputs."""
    raw = next((p.value for p in model.metadata_props if p.key == "names"), None)
    if raw is None:
        return None if num_classes in (None, len(COCO80_TO_91)) else tuple(f"class_{i}" for i in range(num_classes))
    try:
        names = ast.literal_eval(raw)
    except (ValueError, SyntaxError, MemoryError, RecursionError) as exc:
        raise UsageError(f"{path}: its `names` metadata is not a {{index: name}} literal ({type(exc).__name__}); "
                         "re-export it, or remove the entry to use class_0 ... and a --class-map by index") from exc
    count = num_classes if num_classes is not None else len(names) if isinstance(names, dict) else 0
    if not (isinstance(names, dict) and count and all(type(k) is int for k in names)
            and sorted(names) == list(range(count))
            and all(isinstance(v, str) for v in names.values())):
        outputs = f"the output has {num_classes} classes" if num_classes is not None else "numbered from 0"
        raise UsageError(f"{path}: its `names` metadata does not name classes 0..{max(count, 1) - 1} ({outputs}); "
                         "re-export it")
    return tuple(names[i] for i in range(count))


def _dims(value: onnx.ValueInfoProto) -> list[int | None]:
    """Static dims as ints, symbolic ones as None."""
    return [d.dim_value if d.HasField("dim_value") else None for d in value.type.tensor_type.shape.dim]


@dataclass(frozen=True)
class UltralyticsHeadDecoder:
    """An Ultralytics export's head decode: `layout` "end2end" (boxes, score and class per row, selected by the model)
    or the dense [B, 4 + C (+ P), N] head (cx, cy, w, h, class scores, then `coefficients` mask coefficients)."""

    layout: str
    coefficients: int

    def __call__(self, raw: list[torch.Tensor], input_size: tuple[int, int],
                 conf: float) -> DenseCandidates | list[Candidates]:
        out = raw[0]
        if self.layout == "end2end":
            return [Candidates(boxes=o[:, :4], scores=o[:, 4], labels=o[:, 5].long()) for o in out]
        pred = out.transpose(1, 2)  # [B, N, 4 + C (+ P)]
        xy, half = pred[..., 0:2], pred[..., 2:4] / 2
        scores = pred[..., 4:pred.shape[-1] - self.coefficients] if self.coefficients else pred[..., 4:]
        return DenseCandidates(boxes=torch.cat((xy - half, xy + half), dim=-1), scores=scores)


class UltralyticsOnnxDetector:
    """An Ultralytics-format ONNX export, the layout (dense or end-to-end) read from the graph; or a TensorRT
    engine built from one (`self.engine`, layout as the module docstring says)."""

    class_map = COCO80_TO_91

    def __init__(self, model_id: str, weights: str | Path | None = None):
        if model_id not in MODEL_IDS:
            raise UsageError(f"unknown Ultralytics-format model {model_id!r}; known: {', '.join(MODEL_IDS)}")
        self.model_id, self.family = model_id, MODEL_IDS[model_id]
        self.variant = model_id.removesuffix("-seg").removesuffix("u")[-1]  # the size letter: n, s, m, l, x
        self.task = "segment" if model_id in SEGMENT_IDS else "detect"
        if self.task == "segment":
            self.mask_spec = PROTOTYPE_MASKS
        if weights == RANDOM_WEIGHTS:
            raise UsageError(f"--weights random needs a torch-defined model; {model_id} is defined by its "
                             "ONNX export (pass --weights FILE.onnx)")
        self.path = self._resolve(weights)
        self.engine = is_engine_file(self.path)
        if self.engine and self.task == "segment":
            raise UsageError(f"{model_id}: segmentation runs on onnxruntime and pytorch from its ONNX export, not from "
                             "a TensorRT engine; pass --weights FILE.onnx")
        if self.engine:
            self._raw_model, self.fixed_size, self.coefficients = None, None, 0  # shapes are checked at load
            self.layout = self._engine_layout()
            self.weights = engine_weights(self.path)
        else:
            self._raw_model = self._load(self.path)
            self.layout, num_classes, self.coefficients = self._layout()
            if (self.layout == "segment") != (self.task == "segment"):
                other = f"{model_id}-seg" if self.task == "detect" else model_id.removesuffix("-seg")
                kind = "segmentation" if self.layout == "segment" else "detection"
                raise UsageError(f"{self.path} is an Ultralytics {kind} export; run it as --model {other}")
            names = export_class_names(self._raw_model, num_classes, self.path)
            if names is not None and tuple(n.lower() for n in names) != COCO80_NAMES:
                # a fine-tuned export (of any layout, even one of 80 classes): its own classes, named by its metadata
                # (counted from its output shape); matched to a dataset's categories by name (or by index with
                # --class-map), never as COCO's
                self.class_names = names
                self.class_map = tuple(range(len(names)))
            self.weights = WeightsInfo(file=self.path.name, sha256=file_sha256(self.path),
                                       source="--weights" if weights else "weights cache")
            dims = _dims(self._raw_model.graph.input[0])
            self.fixed_size = (dims[2], dims[3]) if len(dims) == 4 and dims[2] and dims[3] else None
        self.postprocess = END2END_POST if self.layout == "end2end" else DENSE_POST
        self.defaults = self.postprocess.defaults
        self.preprocess = PreprocessSpec(
            input_size=self.fixed_size or (ULTRALYTICS_INPUT_SIZE, ULTRALYTICS_INPUT_SIZE), resize="letterbox",
            pad_position="center", pad_value=114, channel_order="RGB", scale=1 / 255, size_rounding="ceil",
            interpolation="linear", box_scale="ratio")

    def _resolve(self, weights: str | Path | None) -> Path:
        if weights is not None:
            path = Path(weights)
            if not path.is_file():
                raise UsageError(f"--weights {path}: no such file")
            return path
        cached = cached_weights(self.model_id)
        if cached is None:
            raise UsageError(f"no weights for {self.model_id}: export it with Ultralytics (`yolo export "
                             f"model={self.model_id}.pt format=onnx`) and pass --weights {self.model_id}.onnx, "
                             f"or put it at {weights_dir() / (self.model_id + '.onnx')}")
        return cached

    @staticmethod
    def _load(path: Path) -> onnx.ModelProto:
        try:
            return onnx.load(str(path))
        except Exception as exc:  # onnx raises DecodeError and friends
            raise UsageError(f"{path} is not a readable ONNX model ({type(exc).__name__})") from exc

    def _layout(self) -> tuple[str, int | None, int]:
        """(layout, classes, mask coefficients): ("end2end", None, 0) for [B, K, 6]; ("dense", C, 0) for
        [B, 4 + C, N]; ("segment", C, P) for [B, 4 + C + P, N] and prototypes [B, P, h, w]; one line otherwise."""
        outputs = self._raw_model.graph.output
        shapes = [_dims(o) for o in outputs]
        dims = shapes[0] if shapes else []
        if len(shapes) == 2 and len(dims) == 3 and len(shapes[1]) == 4 and shapes[1][1] and dims[1] \
                and dims[1] > 4 + shapes[1][1]:
            return "segment", dims[1] - 4 - shapes[1][1], shapes[1][1]
        if len(shapes) == 1 and len(dims) == 3 and dims[2] == 6:
            return "end2end", None, 0
        if len(shapes) == 1 and len(dims) == 3 and dims[1] and dims[1] != dims[2] and dims[1] == self._anchors():
            # Ultralytics puts a box's values along axis 1 and its anchors along axis 2: one row per anchor is
            # another family's export read the wrong way round (YOLOX-Nano's read as 3545 classes)
            raise UsageError(f"{self.path}: its output {dims} holds {dims[1]} rows of {dims[2]} values, one row per "
                             "anchor, which is not an Ultralytics export's [B, 4+C, N] (another family's, as YOLOX's "
                             "[B, anchors, 5+C]); run it with its own family's id (`va-bench models list`)")
        if len(shapes) == 1 and len(dims) == 3 and dims[1] and dims[1] > 4:
            return "dense", dims[1] - 4, 0
        raise UsageError(f"{self.path} does not look like an Ultralytics-format export: want one output "
                         f"[B, 4+C, N] or [B, K, 6], or a segmentation export's [B, 4+C+P, N] and [B, P, h, w]; "
                         f"found {shapes}")

    def _anchors(self) -> int | None:
        """The anchor points of a stride-8/16/32 head at the graph's input size (None where it is not fixed)."""
        dims = _dims(self._raw_model.graph.input[0]) if self._raw_model.graph.input else []
        if len(dims) != 4 or not dims[2] or not dims[3]:
            return None
        return sum(math.ceil(dims[2] / s) * math.ceil(dims[3] / s) for s in (8, 16, 32))

    def _engine_layout(self) -> str:
        """An engine's layout: its sidecar's "layout", else the family's default export's."""
        default = "end2end" if postprocess_kind(self.family) == END2END_POST.kind else "dense"
        layout = read_manifest(self.path).get("layout", default)
        if layout not in LAYOUTS:
            raise UsageError(f"{self.path.name}: its sidecar's \"layout\" is {layout!r}; use \"dense\" ([B, 4+C, N]) "
                             "or \"end2end\" ([B, K, 6])")
        return layout

    def _check_engine_head(self, core, input_size: tuple[int, int]) -> None:
        """One zero batch: the engine's outputs must be the layout's one [1, 84, N] or [1, K, 6]."""
        shapes = probe_outputs(core, input_size)
        want = "[1, K, 6]" if self.layout == "end2end" else f"[1, {4 + len(COCO80_TO_91)}, N]"
        ok = len(shapes) == 1 and len(shapes[0]) == 3 and shapes[0][0] == 1 and (
            shapes[0][2] == 6 if self.layout == "end2end" else shapes[0][1] == 4 + len(COCO80_TO_91))
        if not ok:
            raise UsageError(f"{self.path.name}: the engine's outputs are {[list(s) for s in shapes]}, not the "
                             f"{self.layout} layout's one {want}; set \"layout\" in its sidecar, or build it from an "
                             "80-class Ultralytics ONNX export")

    @cached_property
    def onnx_model(self) -> onnx.ModelProto:
        """The export with a symbolic batch axis (and symbolic H, W where it was exported dynamic)."""
        return make_batch_dynamic(self._raw_model, spatial_dynamic=self.fixed_size is None)

    @cached_property
    def core_source(self) -> CoreSource:
        if self.engine:
            return engine_core_source(self.model_id, self.path)
        return CoreSource(self.model_id, onnx_model=lambda: self.onnx_model, check_batches=BATCH_CHECK)

    def check_input_size(self, input_size: tuple[int, int]) -> None:
        """A fixed-size export runs at its size only (checked before its core is loaded)."""
        if self.fixed_size is not None and tuple(input_size) != self.fixed_size:
            raise UsageError(f"{self.path} was exported at {self.fixed_size[0]}x{self.fixed_size[1]} and runs at "
                             f"that size only; drop --input-size or export with dynamic=True")

    def check_core(self, core, input_size: tuple[int, int]) -> None:
        """An engine's outputs must be this head's."""
        if self.engine:
            self._check_engine_head(core, input_size)

    @property
    def host_decoder(self) -> UltralyticsHeadDecoder:
        """The decode without the model (picklable: host processes run it)."""
        return UltralyticsHeadDecoder(self.layout, self.coefficients)

    def decode(self, raw: list[torch.Tensor], input_size: tuple[int, int],
               conf: float) -> DenseCandidates | list[Candidates]:
        return self.host_decoder(raw, input_size, conf)

    def mask_maps(self, raw: list[torch.Tensor]) -> MaskMaps:
        """A segmentation export's prototypes [B, P, h, w] and each anchor's coefficients [B, N, P]."""
        return MaskMaps(raw[1], coefficients=raw[0].transpose(1, 2)[..., -self.coefficients:])

    def model_stats(self, input_size: tuple[int, int]) -> ModelStats:
        return engine_model_stats() if self.engine else onnx_model_stats(self.onnx_model, input_size)
