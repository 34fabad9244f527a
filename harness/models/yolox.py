"""YOLOX family: official ONNX exports, run by any backend (ONNX Runtime as is, PyTorch via onnx2torch).

Raw output [B, N, 85] per anchor point at strides 8/16/32: (dx, dy, log w, log h) in grid units,
objectness and 80 class probabilities (already sigmoid). Input: BGR, 0-255, no normalisation,
aspect-preserving resize with top-left padding of value 114 (YOLOX's ValTransform, legacy=False).
"""

from __future__ import annotations

import os
from functools import cached_property
from pathlib import Path

import onnx
import torch

from harness.backends import CoreSource, backend_names, load_core
from harness.backends.export import make_batch_dynamic, onnx_model_stats
from harness.data.categories import COCO80_TO_91
from harness.errors import UsageError
from harness.measure.device import Device
from harness.models.protocol import (
    RANDOM_WEIGHTS,
    Candidates,
    ModelStats,
    PostprocessSpec,
    PreprocessSpec,
    WeightsInfo,
)
from harness.models.weights import file_sha256, weights_dir

# variant -> native input size (the official release's export size)
VARIANTS = {"nano": 416, "tiny": 416, "s": 640, "m": 640, "l": 640, "x": 640}
RELEASE_URL = "https://github.com/Megvii-BaseDetection/YOLOX/releases/download/0.1.1rc0/yolox_{variant}.onnx"
STRIDES = (8, 16, 32)
REPO_ROOT = Path(__file__).resolve().parents[2]
OFFLINE_DIR = REPO_ROOT.parent / "shared" / "assets" / "onnx"


def weight_candidates(variant: str) -> list[Path]:
    """Where yolox-<variant> weights are looked for, in order."""
    filename = f"yolox_{variant}.onnx"
    candidates = []
    env = os.environ.get(f"VA_BENCH_YOLOX_{variant.upper()}")
    if env:
        candidates.append(Path(env))
    candidates += [weights_dir() / filename, OFFLINE_DIR / filename]
    return candidates


class YoloxDetector:
    """A YOLOX model from an ONNX file."""

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
        self.weights = WeightsInfo(
            file=self.path.name,
            sha256=file_sha256(self.path),
            source="--weights" if weights else "official YOLOX release (ONNX export)",
        )
        self._raw_model = self._load(self.path)
        size = self._native_input_size()
        self.preprocess = PreprocessSpec(input_size=size, resize="letterbox", pad_position="top-left",
                                         pad_value=114, channel_order="BGR", scale=1.0)
        self._grids: dict[tuple, torch.Tensor] = {}

    def _resolve(self, weights: str | Path | None) -> Path:
        if weights == RANDOM_WEIGHTS:
            raise UsageError(f"--weights random needs a torch-defined model; {self.model_id} is defined by its "
                             "ONNX export (pass --weights FILE.onnx, or use a libreyolo YOLOX for random weights)")
        if weights is not None:
            path = Path(weights)
            if not path.is_file():
                raise UsageError(f"--weights {path}: no such file")
            return path
        for candidate in weight_candidates(self.variant):
            if candidate.is_file():
                return candidate
        raise UsageError(
            f"weights for {self.model_id} not found (looked in "
            f"{', '.join(str(c) for c in weight_candidates(self.variant))}); run "
            f"`va-bench models fetch {self.model_id}` or pass --weights PATH"
        )

    @staticmethod
    def _load(path: Path) -> onnx.ModelProto:
        try:
            model = onnx.load(str(path))
        except Exception as exc:  # onnx raises DecodeError and friends
            raise UsageError(f"{path} is not a readable ONNX model ({exc})") from exc
        outputs = model.graph.output
        if len(outputs) != 1 or outputs[0].type.tensor_type.shape.dim[-1].dim_value != 85:
            raise UsageError(f"{path} does not look like a COCO YOLOX export (want one output [B,N,85])")
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
        """The ONNX export as it is; `pytorch` runs its onnx2torch conversion."""
        return CoreSource(self.model_id, onnx_model=lambda: self.onnx_model)

    @property
    def backends(self) -> tuple[str, ...]:
        return backend_names(self.core_source)

    def load_core(self, backend: str, device: Device, precision: str, input_size: tuple[int, int],
                  threads: int | None = None):
        return load_core(self.core_source, backend, device, precision, input_size, threads)

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

    def decode(self, raw: list[torch.Tensor], input_size: tuple[int, int], conf: float) -> list[Candidates]:
        out = raw[0]
        batch, anchors, width = out.shape
        grid = self._grid(input_size, out.device, out.dtype)
        if anchors != grid.shape[0]:
            raise UsageError(f"{self.model_id}: head has {anchors} anchors, input size {input_size} "
                             f"implies {grid.shape[0]}; is --input-size a multiple of 32?")
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

    def model_stats(self, input_size: tuple[int, int]) -> ModelStats:
        return onnx_model_stats(self.onnx_model, input_size)
