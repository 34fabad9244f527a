"""The Detector protocol: what every model family provides to the shared pipeline.

A detector is split in four (docs/families-and-backends.md): a *core* (float tensor [B,3,H,W] -> raw head tensors), a
*preprocessing spec* the harness applies, a *decoder* (raw head tensors -> candidate boxes and
scores) and a *post-processing spec* (which kind of selection the harness applies to those
candidates, with the family's own thresholds). Selection (NMS or top-k), rescaling and COCO mapping
are harness code shared by all; backends (harness/backends) run the core.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch

Interpolation = Literal["linear", "area", "cubic", "nearest"]


@dataclass(frozen=True)
class PreprocessSpec:
    """How decoded images (BGR uint8) become the model's input tensor [B,3,H,W].

    - `resize`: "letterbox" keeps the aspect ratio (scale r = the largest that fits the fit box,
      the rest is padding); "stretch" resizes to the input size exactly; "fit_stretch" resizes twice:
      first as the letterbox would (aspect kept, into the fit box, no padding), then that image is
      stretched to the input size. It is libreyolo's validation path for RT-DETR, RT-DETRv4, D-FINE,
      DEIM and EC (its COCO dataset fits the long side, then the family's stretch preprocessor
      resizes again); boxes go back as for a stretch (the two scales compose to input / original).
    - `fit_margin`: letterbox (or fit) into (H - margin, W - margin), then pad to (H, W): YOLO-NAS
      fits the long side to 636 and centre-pads to 640 (margin 4).
    - `size_rounding`: how the resized (fitted) size is rounded from size x r (YOLOX, torchvision,
      libreyolo's dataset fit: floor; Ultralytics' long-side resize: ceil).
    - `pad_position`: "top-left" (image at the origin) or "center" (top = (H - h) // 2, which is also
      Ultralytics' round(dh - 0.1)); `pad_value` in pixel units (0-255), one value or one per channel
      in `channel_order`.
    - `library`: "cv2" (uint8 resize, the CPU reference), "pil" (PIL's resampling filters, uint8),
      "torch" (float `F.interpolate`, antialias off: torchvision's GeneralizedRCNNTransform).
      `interpolation` is used for every resize, `downscale_interpolation` (if set) for one that shrinks.
    - then `channel_order`, x `scale`, - `mean`, / `std` (per channel, in channel order, after scaling).
    - `box_scale` (letterbox): how boxes go back to the original image: "ratio" divides by r (YOLOX,
      Ultralytics), "size" by resized / original size per axis (torchvision's resize_boxes). A
      stretch or fit_stretch always divides by input / original size per axis.
    """

    input_size: tuple[int, int]  # (height, width)
    resize: Literal["letterbox", "stretch", "fit_stretch"] = "letterbox"
    pad_position: Literal["top-left", "center"] = "top-left"
    pad_value: float | tuple[float, float, float] = 114
    channel_order: Literal["BGR", "RGB"] = "BGR"
    scale: float = 1.0  # multiply pixel values (0-255) by this
    mean: tuple[float, float, float] | None = None  # after scaling, per channel in channel_order
    std: tuple[float, float, float] | None = None
    fit_margin: int = 0
    size_rounding: Literal["floor", "round", "ceil"] = "floor"
    library: Literal["cv2", "pil", "torch"] = "cv2"
    interpolation: Interpolation = "linear"
    downscale_interpolation: Interpolation | None = None
    box_scale: Literal["ratio", "size"] = "ratio"

    def with_input_size(self, size: int | tuple[int, int]) -> PreprocessSpec:
        hw = (size, size) if isinstance(size, int) else tuple(size)
        return replace(self, input_size=hw)

    def to_dict(self) -> dict[str, Any]:
        """For the record (runtime.preprocess)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


@dataclass(frozen=True)
class PostprocessSpec:
    """How candidates become detections: the family's post-processing kind and its thresholds.

    - kind "nms": keep candidates with score >= conf, (optionally) each image's `pre_nms_topk` best,
      class-aware NMS at `iou` per image, each image's best `max_det`. `multi_label`: a box may be
      kept for every class whose score >= conf (else only its best class). For a decoder that returns
      `DenseCandidates` the harness applies it; a decoder that returns `Candidates` has resolved labels
      itself and must do what `multi_label` says. `clip_before_nms` clips boxes to each image's area in
      the input (torchvision does, before NMS); `min_box_size` then drops boxes narrower or lower than
      that many input pixels (torchvision's remove_small_boxes).
    - kind "topk": NMS-free (DETR-style): per image, the `max_det` best (query, class) pairs, then
      score >= conf. With `activation` "sigmoid" the scores are logits and are passed through a
      sigmoid (top-k is taken on the logits: the sigmoid is monotonic). `iou` is not used.
    conf / iou / max_det are the family's defaults for the site's protocol; `--conf` etc. override them.
    """

    kind: Literal["nms", "topk"] = "nms"
    conf: float = 0.001
    iou: float = 0.6
    max_det: int = 300
    multi_label: bool = False
    pre_nms_topk: int | None = None
    clip_before_nms: bool = False
    min_box_size: float = 0.0
    activation: Literal["none", "sigmoid"] = "none"

    def __post_init__(self):
        if self.kind not in ("nms", "topk"):
            raise ValueError(f"unknown post-processing kind {self.kind!r}")

    @property
    def defaults(self) -> ProtocolDefaults:
        """The thresholds alone (the runner's view)."""
        return ProtocolDefaults(self.conf, self.iou, self.max_det)

    def to_dict(self) -> dict[str, Any]:
        """For the record: the kind and what it means, without fields that do not apply to it."""
        out = asdict(self)
        if self.kind == "topk":
            for key in ("iou", "multi_label", "pre_nms_topk", "clip_before_nms", "min_box_size"):
                out.pop(key)
        else:
            out.pop("activation")
        return out


@dataclass(frozen=True)
class ProtocolDefaults:
    """Evaluation thresholds; the site's protocol unless a family documents otherwise.

    Families give a PostprocessSpec (`detector.postprocess`) whose `.defaults` is this; plugins
    written before post-processing kinds existed give only this, and get kind "nms"."""

    conf: float = 0.001
    iou: float = 0.6
    max_det: int = 300


@dataclass(frozen=True)
class Candidates:
    """Decoded head output of one image, labels resolved: boxes xyxy in input-tensor pixels.

    A decoder may drop candidates whose score is below the `conf` it is given (the harness
    applies the threshold again, so a decoder that ignores it is still correct). A segment detector's
    decoder also gives `rows`: each candidate's row (query, anchor) in the image's mask head."""

    boxes: torch.Tensor  # [K, 4]
    scores: torch.Tensor  # [K]
    labels: torch.Tensor  # [K] contiguous class index
    rows: torch.Tensor | None = None  # [K] row in MaskMaps of this image (segment detectors)


@dataclass(frozen=True)
class DenseCandidates:
    """Decoded head output of a whole batch, one score per (box, class); the harness picks labels
    (single- or multi-label for "nms", top-k over boxes x classes for "topk").

    boxes [B, K, 4] xyxy in input-tensor pixels; scores [B, K, C]: probabilities, or logits when the
    spec's `activation` is "sigmoid"."""

    boxes: torch.Tensor
    scores: torch.Tensor


Task = Literal["detect", "segment"]


@dataclass(frozen=True)
class MaskSpec:
    """How a segment detector's mask head becomes one binary mask per kept detection, at the source image's
    resolution (then COCO RLE). Shared harness code applies it (harness/pipeline/masks.py).

    - `kind` "query": one map per box row (DETR-style per-query mask logits or probabilities); "prototypes":
      Ultralytics-style, each box row's coefficients times the image's prototypes, through a sigmoid.
    - `values`: what the maps hold while they are resized: "logits" (a pixel is on where > 0) or
      "probabilities" (on where >= 0.5). Prototype masks are probabilities.
    - `resize` "direct": the map goes straight to the source image's size (libreyolo's RF-DETR and EC);
      "via_input": first to the input size, the letterbox padding cropped, then to the source size (D-FINE,
      prototypes). Bilinear, half-pixel centres (torch's align_corners=False), values thresholded after the
      last resize. A map of a letterboxed input always goes via the input size (its padding is cropped there).
    - `crop_to_box`: zero outside the detection's box, in "input" pixels before the padding is cropped
      (Ultralytics), or in "source" pixels after the last resize (D-FINE: x1 <= x < x2, y1 <= y < y2); "none".
    """

    kind: Literal["query", "prototypes"] = "query"
    values: Literal["logits", "probabilities"] = "logits"
    resize: Literal["direct", "via_input"] = "direct"
    crop_to_box: Literal["none", "input", "source"] = "none"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class MaskMaps:
    """A batch's mask head: "query" maps [B, N, h, w] (one per box row), or "prototypes" [B, P, h, w] with each
    box row's `coefficients` [B, N, P]."""

    maps: torch.Tensor
    coefficients: torch.Tensor | None = None


@dataclass(frozen=True)
class WeightsInfo:
    """Where the weights came from (recorded in repro.weights). Random weights: file and source "random"."""

    file: str
    sha256: str | None
    source: str  # "official release", "local file", "plugin", "random", ...


RANDOM_WEIGHTS = "random"  # `--weights random`: seeded random initialisation, timing only


@runtime_checkable
class Core(Protocol):
    """A loaded model core on one backend."""

    backend: str  # user-facing backend name: onnxruntime | pytorch | ...
    format: str  # site runtime.format: onnx | pytorch | tensorrt ...
    provider: str  # site runtime.provider: cpu | cuda | tensorrt ...
    precision: str  # fp32 | fp16 ...
    # Optional `takes_device_tensors: bool`: True when the core reads a batch already on its device (the
    # pipeline moves it in the transfer stage and may decode/letterbox there), False when it takes host
    # memory and copies it itself (inside the forward). Absent: True for cores with a `torch_module`.
    # Optional async forwards, for a runtime with streams of its own (OpenVINO in overlapped mode):
    # `async_slots: int` (> 1: that many forwards may be in flight), `start(batch) -> ticket` and
    # `collect(ticket) -> (raw outputs, forward ns as the runtime measured it)`, collected in start order.
    # Optional `concurrent_forwards: int` (default `async_slots`): how many of those run at once. A core whose
    # slots only hand the next batch over while one forward runs (the forward in a process of its own) says 1:
    # its forwards do not share the interval.
    # Optional `forward_borrowed(batch) -> (raw outputs, forward ns as the runtime measured it)`: the forward as
    # the runtime's own call runs it, its outputs still the runtime's host buffers (valid until its next forward).
    # The pipeline's forward stage is the runtime's own time for the call (what its benchmark tool reports); the
    # rest of the call's wall time (the language binding handing the input over and the outputs back) and the
    # outputs' copy out go to the transfer stage. `__call__` always returns outputs of the caller's own.

    def __call__(self, batch: torch.Tensor) -> list[torch.Tensor]: ...

    def info(self) -> dict[str, Any]: ...


@runtime_checkable
class Detector(Protocol):
    """A model family instance: see the module docstring. `postprocess` is optional for plugins
    (they may give `defaults` only); families built in harness/models give both.

    Its core comes as `core_source` (a CoreSource, harness/detector/source.py), which the backends load; a
    family may add `check_input_size(input_size)` (refused before loading) and `check_core(core, input_size)`
    (after loading). A plugin may instead load its core itself: `backends` (the names it offers) and
    `load_core(backend, device, precision, input_size, threads)`.

    A segment detector (`task` "segment"; absent means "detect") also gives `mask_spec` (a MaskSpec) and
    `mask_maps(raw) -> MaskMaps`: its raw head tensors' masks, whose rows are DenseCandidates' boxes or the
    `rows` of its Candidates.

    Optional, for the families in harness/models: `host_decoder`, `decode` as a picklable callable of the same
    arguments that holds no model and no device tensors (a few settings; its caches are made again where it is
    unpickled). With it, `--host-processes` runs a detection model's decode in the host processes, on the raw
    outputs copied to shared memory; otherwise (a plugin file, which those processes cannot import; a segment
    model) the decode stays in the run's process (recorded in runtime.host)."""

    model_id: str
    family: str
    variant: str
    preprocess: PreprocessSpec
    defaults: ProtocolDefaults
    class_map: tuple[int, ...]  # contiguous class index -> COCO category id
    weights: WeightsInfo

    def decode(self, raw: list[torch.Tensor], input_size: tuple[int, int],
               conf: float) -> list[Candidates] | DenseCandidates:
        """Raw head tensors of a batch -> one Candidates per image, or DenseCandidates for the batch."""
        ...

    def model_stats(self, input_size: tuple[int, int]) -> ModelStats: ...


def task_of(detector: Any) -> Task:
    """The detector's task: "segment" for one that gives masks, else "detect"."""
    return "segment" if getattr(detector, "task", "detect") == "segment" else "detect"


def postprocess_spec(detector: Any) -> PostprocessSpec:
    """The detector's PostprocessSpec; kind "nms" with its `defaults` for a plugin that has none."""
    spec = getattr(detector, "postprocess", None)
    if isinstance(spec, PostprocessSpec):
        return spec
    d = detector.defaults
    return PostprocessSpec(kind="nms", conf=d.conf, iou=d.iou, max_det=d.max_det)


# what a FLOP count counts, in inspect's output and a submission's model_stats alike
FLOP_CONVENTION = ("FLOP = 2 x MAC (torch FlopCounterMode: convolution, linear/matmul, attention; "
                   "element-wise ops, activations and norms not counted)")


@dataclass
class ModelStats:
    """Static model statistics; None with a reason when a figure could not be computed."""

    params_millions: float | None = None
    gflops: float | None = None
    notes: dict[str, str] = field(default_factory=dict)
    # of params_millions, those a batch-1 forward reads (a branch built but never run, such as a RepVGG block's
    # merged convolution before fusion or a training-only head, is left out); None where not counted
    params_used_millions: float | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"params_millions": self.params_millions, "gflops": self.gflops}
        if self.params_used_millions is not None:
            out["params_used_millions"] = self.params_used_millions
        if self.gflops is not None:
            out["flops_convention"] = FLOP_CONVENTION
        if self.notes:
            out["unavailable"] = self.notes
        return out
