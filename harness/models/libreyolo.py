"""LibreYOLO families: the leaderboard's models, built by the optional `libreyolo` package.

libreyolo builds the bare nn.Module; `LibreCore` wraps it so its forward returns plain tensors (the
raw head outputs), and everything around it is the harness's shared pipeline, configured from
harness/models/catalogue.yaml: preprocessing (PreprocessSpec), a decoder per head layout below
(raw tensors -> candidates), and the family's post-processing kind (PostprocessSpec: NMS or
NMS-free top-k). The conventions are those of libreyolo's validation path (where its mAP comes from),
including its fit-then-stretch double resize for the DETR families that have one (`resize: fit_stretch`);
the tests check our detections against libreyolo's own (docs/libreyolo-families.md).

Weights: `--weights random` builds the architecture with seeded random weights (libreyolo's
`_from_scratch`, timing only); a file is loaded by libreyolo's own loader; with no `--weights`, the
catalogue's file name is looked up in the weights cache, where `fetch_weights` (libreyolo's own
download) puts it.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import importlib
import logging
import re
import typing
import warnings
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from functools import cache
from pathlib import Path
from typing import Any

import torch

from harness.catalogue import CATALOGUE, catalogue_data
from harness.data.categories import COCO80_TO_91
from harness.detector.graph import count_flops
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
from harness.files import DownloadError, file_sha256, move_into_place
from harness.models.yolox import YoloxHeadDecoder

# libreyolo itself without its own requirements (they would add opencv-python beside opencv-python-headless)
INSTALL_HINT = "install it with `pip install 'va-bench[libreyolo]' && pip install --no-deps libreyolo==1.6.0`"
SEED = 0  # `--weights random` is libreyolo's _from_scratch with this seed: the same weights every run


@dataclass(frozen=True)
class LibreFamily:
    """One family block of the catalogue."""

    key: str  # catalogue key (dfine, dfine-seg, ...)
    family: str  # the site's family name
    class_name: str
    head: str
    task: str
    weights: str  # file name pattern, {size} = size code
    licence: str
    preprocess: dict[str, Any]  # PreprocessSpec fields
    postprocess: dict[str, Any]  # PostprocessSpec fields
    masks: dict[str, Any] | None = None  # MaskSpec fields (task segment)
    size_multiple: int = 32  # input sizes other than the native one must be multiples of this
    site_matrix: str = "listed"  # "pending": the site's support matrix does not list its ids yet


@dataclass(frozen=True)
class LibreModel:
    """One model id of the catalogue."""

    model_id: str
    family: LibreFamily
    size: str
    variant: str
    input_size: int
    preprocess_fields: dict[str, Any] = field(default_factory=dict)  # per-model overrides of the family's
    postprocess_fields: dict[str, Any] = field(default_factory=dict)
    own_size_multiple: int | None = None  # where the model's differs from its family's (a backbone's windows)

    @property
    def size_multiple(self) -> int:
        """What an input size other than the native one must be a multiple of."""
        return self.own_size_multiple or self.family.size_multiple

    @property
    def weights_file(self) -> str:
        return self.family.weights.format(size=self.size)

    @property
    def postprocess(self) -> PostprocessSpec:
        return check_choices(PostprocessSpec(**{**self.family.postprocess, **self.postprocess_fields}))


def _spec_error(where: str, exc: Exception) -> UsageError:
    return UsageError(f"{CATALOGUE}: {where}: {exc}; fix the entry (fields: harness/detector/protocol.py)")


@cache
def catalogue() -> dict[str, LibreModel]:
    """Model id -> LibreModel for every libreyolo id in the catalogue (loaded once by harness.catalogue, validated)."""
    data = catalogue_data(CATALOGUE)["libreyolo"]["families"]
    models: dict[str, LibreModel] = {}
    for key, block in data.items():
        try:
            fam = LibreFamily(key=key, family=block.get("family", key), class_name=block["class"], head=block["head"],
                              task=block.get("task", "detect"), weights=block["weights"], licence=block["licence"],
                              preprocess=dict(block["preprocess"]),
                              postprocess=dict(block["postprocess"]), size_multiple=int(block.get("size_multiple", 32)),
                              site_matrix=block.get("site_matrix", "listed"),
                              masks=dict(block["masks"]) if "masks" in block else None)
            if fam.head not in HEADS:
                raise ValueError(f"unknown head {fam.head!r}; known: {', '.join(HEADS)}")
            if (fam.task == "segment") != (fam.masks is not None) or fam.task not in ("detect", "segment"):
                raise ValueError("task segment needs a masks block (MaskSpec fields), and only it has one")
            if fam.masks is not None:
                check_choices(MaskSpec(**fam.masks))
            for model_id, entry in block["models"].items():
                model = LibreModel(model_id, fam, str(entry["size"]), str(entry.get("variant", entry["size"])),
                                   int(entry["input_size"]), dict(entry.get("preprocess", {})),
                                   dict(entry.get("postprocess", {})),
                                   int(entry["size_multiple"]) if "size_multiple" in entry else None)
                _ = _preprocess_spec(model, model.input_size), model.postprocess  # valid now, not at a run
                models[model_id] = model
        except (KeyError, TypeError, ValueError) as exc:
            raise _spec_error(f"family {key}", exc) from exc
    return models


def _preprocess_spec(model: LibreModel, input_size: int | tuple[int, int]) -> PreprocessSpec:
    fields = {**model.family.preprocess, **model.preprocess_fields}
    fields = {k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()}
    return check_choices(PreprocessSpec(input_size=(0, 0), **fields)).with_input_size(input_size)


def _choices(hint) -> tuple | None:
    """The allowed values of a Literal annotation (or Literal | None); None for any other annotation."""
    if typing.get_origin(hint) is typing.Literal:
        return typing.get_args(hint)
    parts = [_choices(h) if h is not type(None) else (None,) for h in typing.get_args(hint)]
    return sum(parts, ()) if parts and all(p is not None for p in parts) else None


@cache
def _literal_fields(cls: type) -> tuple[tuple[str, tuple], ...]:
    """(field name, allowed values) of a dataclass's Literal-typed fields: resolved once per class, not per model
    (the catalogue checks every model's spec when it loads)."""
    hints = typing.get_type_hints(cls)
    return tuple((f.name, allowed) for f in dataclasses.fields(cls) if (allowed := _choices(hints[f.name])) is not None)


def check_choices(spec):
    """A spec dataclass whose Literal-typed fields hold allowed values. Dataclasses do not check Literal
    annotations, and a typo (library: pill) must not quietly mean the default."""
    for name, allowed in _literal_fields(type(spec)):
        if getattr(spec, name) not in allowed:
            raise ValueError(f"{name}: {getattr(spec, name)!r} is not one of {', '.join(map(repr, allowed))}")
    return spec


# ------------------------------------------------------------------------------------------ libreyolo


def libreyolo_module():
    """The `libreyolo` package, or one line saying how to install it."""
    try:
        return importlib.import_module("libreyolo")
    except ImportError as exc:
        raise UsageError(f"LibreYOLO models need the `libreyolo` package ({exc}); {INSTALL_HINT}") from exc


def libreyolo_class(model: LibreModel):
    """The family's libreyolo model class; one line when it or one of its dependencies is missing."""
    lib = libreyolo_module()
    try:
        with warnings.catch_warnings():  # RF-DETR's modules call torch.jit.script at import: torch's deprecation
            warnings.filterwarnings("ignore", message=".*torch.jit.script.* is deprecated", category=FutureWarning)
            return getattr(lib, model.family.class_name)
    except (ImportError, AttributeError) as exc:  # RF-DETR: ModuleNotFoundError without `transformers`
        why = " ".join(str(exc).split()) or type(exc).__name__  # its message spans lines: one line here
        raise UsageError(f"{model.model_id}: libreyolo {getattr(lib, '__version__', '?')} cannot build "
                         f"{model.family.class_name} ({why}); install what it names, or pick another model") from exc


def _trusted(cls, path: Path, sha256: str) -> bool:
    """A file we let libreyolo load: one torch reads without unpickling objects (weights_only; RF-DETR
    checkpoints also carry their training arguments as an argparse.Namespace, a plain attribute bag), or
    one whose SHA-256 libreyolo itself pins (YOLO-NAS's and PP-YOLOE's Deci checkpoints are pickles it
    verifies so)."""
    pinned = {**getattr(cls, "_DECI_CHECKPOINT_SHA256", {}), **getattr(cls, "_CHECKPOINT_SHA256", {})}
    if sha256 in set(pinned.values()):
        return True
    try:
        with torch.serialization.safe_globals([argparse.Namespace]):
            torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # torch raises UnpicklingError, RuntimeError, ... for files it will not read safely
        return False
    return True


@dataclass(frozen=True)
class LibreWeightsInfo(WeightsInfo):
    """WeightsInfo plus the libreyolo version that defined the model (recorded with the weights)."""

    libreyolo_version: str = ""


def build_libreyolo(model: LibreModel, weights: str | Path | None):
    """(libreyolo model wrapper with its module in eval mode, LibreWeightsInfo)."""
    cls = libreyolo_class(model)
    version = str(getattr(libreyolo_module(), "__version__", "unknown"))
    if weights == RANDOM_WEIGHTS:
        wrapper = cls._from_scratch(size=model.size, device="cpu", task=model.family.task, seed=SEED)
        info = LibreWeightsInfo(file=RANDOM_WEIGHTS, sha256=None, source=RANDOM_WEIGHTS, libreyolo_version=version)
    else:
        path, source = _weights_path(model, weights)
        with open(path, "rb") as fh:
            head = fh.read(4)
        if not head.startswith((b"PK\x03\x04", b"\x80")):  # torch.save writes a zip (or, before 1.6, a pickle)
            raise UsageError(f"{path} is not a PyTorch checkpoint (neither a zip nor a pickle file); pass the "
                             f"{model.weights_file} checkpoint of {model.model_id}"
                             + (" or its ONNX export (.onnx)" if model.family.family == "yolox" else ""))
        sha = file_sha256(path)
        if not _trusted(cls, path, sha):
            raise UsageError(f"{path} is not a plain weights checkpoint (torch.load(weights_only=True) refuses it) "
                             "and its checksum is not one libreyolo pins; va-bench does not unpickle such files")
        try:  # absolute: a bare file name would make libreyolo look in ./weights/ first
            with _missing_keys() as (missing, reported):
                wrapper = cls(str(path.resolve()), size=model.size, device="cpu", task=model.family.task)
        except Exception as exc:  # libreyolo wraps every load failure in RuntimeError/ValueError
            first = str(exc).splitlines()[0][:300] if str(exc) else type(exc).__name__
            raise UsageError(f"{path} could not be loaded as {model.model_id} by libreyolo ({first}); "
                             f"pass the {model.weights_file} checkpoint of this model") from exc
        # the whole list where libreyolo logged it, else the first names it warned of (and the count decides)
        names = missing[0] if missing else (reported[0][1] if reported and reported[0][0] <= 5 else None)
        if reported and (names is None or not _only_aliases(names, wrapper.model)):  # it would run on random values
            count, first = reported[0]
            raise UsageError(f"{path} does not hold {model.model_id}'s weights: {count} of its tensors are not in the "
                             f"file (first: {', '.join(map(str, first[:3]))}); pass the {model.weights_file} "
                             "checkpoint of this model")
        info = LibreWeightsInfo(file=path.name, sha256=sha, source=source, libreyolo_version=version)
    wrapper.model.eval()  # _from_scratch leaves it in train mode
    return wrapper, info


def _only_aliases(missing: list[str], module: torch.nn.Module) -> bool:
    """Whether every key a load reported missing is a name of a tensor the file gave under another name (a module
    shared under two names: RTMDet's checkpoints hold its shared convolutions once; at least one name of the
    group must have been loaded) or BatchNorm's batch counter, never a weight left at its initial value."""
    groups: dict[tuple, list[str]] = {}
    for key, tensor in module.state_dict(keep_vars=True).items():
        if tensor.numel():
            where = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
                     tuple(tensor.stride()))
            groups.setdefault(where, []).append(key)
    gone = set(missing)
    loaded_alias = {key for keys in groups.values() if len(keys) > 1 and not set(keys) <= gone for key in keys}
    return all(key in loaded_alias or key.endswith("num_batches_tracked") for key in missing)


@contextmanager
def _missing_keys():
    """The model keys a checkpoint load left at their initial values, from libreyolo's own report of a non-strict
    load (its families that load non-strictly log the count and first names as a warning, every name at debug
    level: captured here, not printed)."""
    found: list[list[str]] = []
    reported: list[tuple[int, list]] = []

    def capture(record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        if str(record.msg).startswith("Non-strict load from") and len(args) >= 4 and args[1]:
            reported.append((int(args[1]), list(args[3])))
        elif str(record.msg).startswith("All missing keys") and args and reported:
            found.append([str(k) for k in args[0]])
        return record.levelno > logging.DEBUG  # libreyolo's debug lines stay as quiet as they were

    logger = logging.getLogger("libreyolo.models.base.model")
    level = logger.level
    logger.addFilter(capture)
    logger.setLevel(logging.DEBUG)  # the whole list is logged at debug level
    try:
        yield found, reported
    finally:
        logger.removeFilter(capture)
        logger.setLevel(level)


def _weights_path(model: LibreModel, weights: str | Path | None) -> tuple[Path, str]:
    if weights is not None:
        path = Path(weights)
        if not path.is_file():
            raise UsageError(f"--weights {path}: no such file")
        return path, "--weights"
    path = weights_dir() / model.weights_file
    if not path.is_file():
        raise UsageError(f"weights for {model.model_id} not found ({path}); run `va-bench models fetch "
                         f"{model.model_id}`, pass --weights PATH, or --weights random for a timing-only run")
    return path, "libreyolo"


def _no_retry_warnings(record: logging.LogRecord) -> bool:
    """libreyolo logs each retry of a failing download as a warning (several lines before the error)."""
    return not record.getMessage().startswith("Download interrupted")


def check_checkpoint(model_id: str, path: Path) -> None:
    """A UsageError unless `path` is a checkpoint a run lets libreyolo load (`_trusted`): what `models fetch` checks
    in a file it finds."""
    if not _trusted(libreyolo_class(catalogue()[model_id]), path, file_sha256(path)):
        raise UsageError(f"{path.name} is not a plain weights checkpoint (torch.load(weights_only=True) refuses it) "
                         "and libreyolo pins no checksum for it")


def fetch_weights(model_id: str, dest_dir: Path | None = None, force: bool = False) -> tuple[Path, str]:
    """Download a model's weights with libreyolo's own resolution and download (Hugging Face mirror, or
    Deci's CDN for YOLO-NAS with libreyolo's checksum pin) into the weights cache; (path, sha256). `force`:
    download again over a file already there, which is put back if the download fails."""
    model = catalogue()[model_id]
    cls = libreyolo_class(model)
    dest = (dest_dir or weights_dir()) / model.weights_file
    aside = None
    if force and dest.is_file():  # libreyolo downloads only to a path holding no file: the old one waits beside it
        aside = move_into_place(dest, dest.with_name(f".{dest.name}.replaced"))
    try:
        sha = _fetched(model_id, model, cls, dest)
    except BaseException:
        if aside is not None and not dest.exists():
            move_into_place(aside, dest)
        raise
    if aside is not None:
        aside.unlink(missing_ok=True)
    return dest, sha


def _fetched(model_id: str, model: LibreModel, cls, dest: Path) -> str:
    """`dest` downloaded by libreyolo unless it is there, then checked (`_trusted`); its SHA-256."""
    downloaded = not dest.is_file()
    if downloaded:
        from libreyolo.utils.download import download_weights
        from libreyolo.utils.download import logger as download_logger

        download_logger.addFilter(_no_retry_warnings)  # a failure is one line below; licence notices still show
        lock = dest.with_name(dest.name + ".download.lock")  # libreyolo's, which it leaves behind
        had_lock = lock.exists()
        try:
            download_weights(str(dest), model.size)
        except Exception as exc:  # network/HF errors, checksum refusals: exit 1 (not a usage error), one line
            if not had_lock:
                lock.unlink(missing_ok=True)
            first = (str(exc).splitlines() or [""])[0]
            # "Partial download kept at X (0 bytes)." where no byte came, and nothing was kept
            first = re.sub(r"\s*Partial download kept at (\S+) \(0 bytes\)\.", "", first)
            # its cause (a name not resolved, a refused connection) is at the end of urllib3's long first line
            said = first if len(first) <= 240 else f"{first[:100]} ... {first[-130:]}"
            raise DownloadError(f"could not download {model.weights_file} for {model_id} "
                                f"({type(exc).__name__}: {said}); check the network "
                                "or download it yourself and pass --weights PATH") from exc
        finally:
            download_logger.removeFilter(_no_retry_warnings)
    sha = file_sha256(dest)
    if not _trusted(cls, dest, sha):
        if downloaded:  # ours: do not leave it in the cache
            dest.unlink()
        raise UsageError(f"{dest} is not a plain weights checkpoint and libreyolo pins no checksum for it")
    return sha


# ------------------------------------------------------------------------------------------ cores


class LibreCore(torch.nn.Module):
    """The bare libreyolo module; forward returns its raw head outputs as a tuple of tensors (the same
    on every backend, and what ONNX export sees). Nothing of the post-processing happens here, except where
    the family decodes inside its network (YOLO-NAS, PP-YOLOE) or libreyolo's own export wrapper does
    (YOLOv7: its anchors baked into the graph, as libreyolo exports it)."""

    def __init__(self, module: torch.nn.Module, head: str, masks: bool = False):
        super().__init__()
        self.masks = masks  # a segment model: its per-query mask maps are a third output
        if head == "yolo7":
            from libreyolo.models.yolo7.export import YOLO7ExportWrapper

            module = YOLO7ExportWrapper(module)
        if head == "rfdetr":  # its export forward: a tensor in (its eval forward splits the batch into a list,
            # which a trace bakes in). On a copy of the modules, since export() switches their forwards for good (and
            # replaces the position embeddings by new parameters); the weights stay shared, not held twice
            from libreyolo.models.rfdetr.nn import RFDETRExportWrapper

            shared = {id(t): t for t in (*module.parameters(), *module.buffers())}
            module = RFDETRExportWrapper(copy.deepcopy(module, memo=shared))
        self.module = module
        self.head = head

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if self.head in EXPORT_MODE_HEADS:
            with _export_mode(self.module.head):
                out = self.module(x)
            # yolo9: [B, 4 + C, N] xyxy input pixels + class probabilities; ppyoloe: boxes [B,N,4], scores [B,N,C]
            return (out,) if self.head == "yolo9" else tuple(out)
        out = self.module(x)
        if self.head == "yolox":  # per-level [B,85,h,w] -> [B,N,85], the layout of the official ONNX export
            return (torch.cat([level.flatten(2) for level in out], dim=2).transpose(1, 2),)
        if self.head == "yolo7":
            return (out,)  # [B, 4 + C, N]: xyxy input pixels, objectness x class probability
        if self.head == "rfdetr":  # (boxes, logits[, masks]) -> the DETR order below
            return (out[1], out[0], *out[2:]) if self.masks else (out[1], out[0])
        if self.head == "yolonas":  # decoded in the network: [B,N,4] xyxy, [B,N,C] probabilities
            # eager: (decoded, raw); under an ONNX or TorchScript trace the head returns `decoded` alone
            boxes, scores = out if isinstance(out[0], torch.Tensor) else out[0]
            return boxes, scores
        if self.head in ("picodet", "rtmdet"):
            cls_maps, reg_maps = out  # per level: [B,C,h,w] logits, box regression maps
            return (*cls_maps, *reg_maps)
        if self.masks:  # [B,Q,h,w] per-query masks at stride 4 (logits, or probabilities: MaskSpec.values)
            return out["pred_logits"], out["pred_boxes"], out["pred_masks"]
        return out["pred_logits"], out["pred_boxes"]  # DETR-style: [B,Q,C] logits, [B,Q,4] cxcywh in [0,1]


# Heads whose eval forward returns extra outputs (features, raw maps) and, in YOLOv9's case, caches anchor
# grids per input shape (a grid made under inference mode breaks the ONNX trace). Their `export` flag makes
# the forward return the predictions alone and skip the cache: what libreyolo's own exporters set.
EXPORT_MODE_HEADS = ("yolo9", "ppyoloe")


@contextmanager
def _export_mode(head: torch.nn.Module):
    previous = head.export
    head.export = True
    try:
        yield
    finally:
        head.export = previous


# ------------------------------------------------------------------------------------------ decoders


def decode_yolo9(raw: list[torch.Tensor], input_size: tuple[int, int], conf: float) -> DenseCandidates:
    """[B, 4 + C, N]: boxes are already xyxy in input pixels, scores are class probabilities."""
    pred = raw[0].transpose(1, 2)
    return DenseCandidates(boxes=pred[..., :4], scores=pred[..., 4:])


def decode_yolonas(raw: list[torch.Tensor], input_size: tuple[int, int], conf: float) -> DenseCandidates:
    """YOLO-NAS's head gives decoded boxes (xyxy, input pixels) and per-class scores: the candidates as they are."""
    return DenseCandidates(boxes=raw[0], scores=raw[1])


def decode_detr(raw: list[torch.Tensor], input_size: tuple[int, int], conf: float) -> DenseCandidates:
    """pred_boxes cxcywh in [0, 1] of the input -> xyxy input pixels; the logits go to the top-k kind."""
    from torchvision.ops import box_convert  # here: the registry imports this module for every run

    logits, boxes = raw[:2]
    h, w = input_size
    xyxy = box_convert(boxes, "cxcywh", "xyxy") * boxes.new_tensor([w, h, w, h])
    return DenseCandidates(boxes=xyxy, scores=logits)


def rfdetr_column_labels(n_columns: int) -> torch.Tensor:
    """Contiguous class of each RF-DETR logit column, -1 for columns that are no class: COCO checkpoints have
    91 columns indexed by category id (0 and the 10 unused ids are not classes); a model built for N classes
    (80, or a fine-tuned checkpoint's) has N + 1, the last one never trained as a class."""
    labels = torch.full((n_columns,), -1, dtype=torch.long)
    if n_columns == 91:
        labels[list(COCO80_TO_91)] = torch.arange(80)
    else:  # a model built for n - 1 classes (COCO's 80, or a fine-tuned checkpoint's): the last column is none
        labels[:n_columns - 1] = torch.arange(n_columns - 1)
    return labels


def decode_rfdetr(raw: list[torch.Tensor], input_size: tuple[int, int], k: int) -> list[Candidates]:
    """Top-k over every (query, column), then the columns that are no class are dropped (RF-DETR's own
    order: they take part in the top-k, as in libreyolo and upstream), labels mapped to contiguous; each
    candidate's query is its mask row."""
    from torchvision.ops import box_convert  # here: the registry imports this module for every run

    logits, boxes = raw[:2]
    h, w = input_size
    xyxy = box_convert(boxes, "cxcywh", "xyxy") * boxes.new_tensor([w, h, w, h])
    n_classes = logits.shape[2]
    column_labels = rfdetr_column_labels(n_classes).to(logits.device)
    scores, index = logits.sigmoid().flatten(1).topk(min(k, logits.shape[1] * n_classes), dim=1)
    labels = column_labels[index % n_classes]
    query = torch.div(index, n_classes, rounding_mode="floor")
    out = []
    for i in range(logits.shape[0]):
        valid = labels[i] >= 0
        rows = query[i][valid]
        out.append(Candidates(boxes=xyxy[i, rows], scores=scores[i][valid], labels=labels[i][valid], rows=rows))
    return out


def decode_levels(cls_maps: list[torch.Tensor], input_size: tuple[int, int], conf: float, strides: tuple[int, ...],
                  nms_pre: int, offset: float, distances: Callable) -> list[Candidates]:
    """Dense per-level heads (PicoDet's GFL, RTMDet's): per image and level, the (anchor, class) pairs whose
    sigmoid score > conf, that level's `nms_pre` best, each box its point ((cell + `offset`) x stride) minus /
    plus the distances `distances(level, image, anchors)` gives (left, top, right, bottom in input pixels),
    clamped to the input. Multi-label by construction. No library has this decode."""
    h_in, w_in = input_size
    per_image: list[list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = [[] for _ in range(cls_maps[0].shape[0])]
    for level, (cls_map, stride) in enumerate(zip(cls_maps, strides, strict=True)):
        b, n_classes, h, w = cls_map.shape
        scores = cls_map.sigmoid().permute(0, 2, 3, 1).reshape(b, h * w * n_classes)
        ys, xs = torch.meshgrid(torch.arange(h, device=cls_map.device), torch.arange(w, device=cls_map.device),
                                indexing="ij")
        points = (torch.stack((xs, ys), -1).reshape(-1, 2).to(cls_map.dtype) + offset) * stride
        for i in range(b):
            hits = (scores[i] > conf).nonzero().squeeze(1)
            kept = scores[i, hits]
            if kept.numel() > nms_pre:
                kept, top = kept.topk(nms_pre)
                hits = hits[top]
            anchor = torch.div(hits, n_classes, rounding_mode="floor")
            d = distances(level, i, anchor)
            p = points[anchor]
            boxes = torch.cat((p - d[:, :2], p + d[:, 2:]), dim=1)
            boxes = torch.minimum(boxes.clamp(min=0), boxes.new_tensor([w_in, h_in, w_in, h_in]))
            per_image[i].append((boxes, kept, hits % n_classes))
    return [Candidates(boxes=torch.cat([p[0] for p in parts]), scores=torch.cat([p[1] for p in parts]),
                       labels=torch.cat([p[2] for p in parts])) for parts in per_image]


def decode_picodet(raw: list[torch.Tensor], input_size: tuple[int, int], conf: float, strides: tuple[int, ...],
                   nms_pre: int) -> list[Candidates]:
    """PicoDet (GFL/DFL): each side's distance is the softmax expectation of its distribution x stride, from
    the cell centre."""
    n_levels = len(strides)
    reg_maps = raw[n_levels:]
    reg_max = reg_maps[0].shape[1] // 4 - 1
    project = torch.arange(reg_max + 1, dtype=reg_maps[0].dtype, device=reg_maps[0].device)
    dists = [r.permute(0, 2, 3, 1).reshape(r.shape[0], -1, 4, reg_max + 1) for r in reg_maps]

    def distances(level: int, image: int, anchor: torch.Tensor) -> torch.Tensor:
        return (dists[level][image, anchor].softmax(-1) * project).sum(-1) * strides[level]

    return decode_levels(list(raw[:n_levels]), input_size, conf, strides, nms_pre, 0.5, distances)


def decode_rtmdet(raw: list[torch.Tensor], input_size: tuple[int, int], conf: float, strides: tuple[int, ...],
                  nms_pre: int) -> list[Candidates]:
    """RTMDet: its regression maps hold the four distances in input pixels already (x stride in the head),
    from the cell's corner (offset 0, mmdetection's prior generator)."""
    n_levels = len(strides)
    dists = [r.permute(0, 2, 3, 1).reshape(r.shape[0], -1, 4) for r in raw[n_levels:]]
    return decode_levels(list(raw[:n_levels]), input_size, conf, strides, nms_pre, 0.0,
                         lambda level, image, anchor: dists[level][image, anchor])


def decode_lwdetr(raw: list[torch.Tensor], input_size: tuple[int, int], conf: float) -> DenseCandidates:
    """LW-DETR: 91 logit columns indexed by COCO category id; the 80 that are classes are kept before the
    top-k (libreyolo's order), as contiguous classes."""
    logits, boxes = raw[:2]
    if logits.shape[-1] == 91:
        logits = logits.index_select(-1, torch.tensor(COCO80_TO_91, device=logits.device))
    return decode_detr([logits, boxes], input_size, conf)


HEADS = ("yolox", "yolo9", "yolo7", "yolonas", "ppyoloe", "picodet", "rtmdet", "detr", "rfdetr", "lwdetr")
PICODET_STRIDES = (8, 16, 32, 64)  # libreyolo's PicoDet head levels
PICODET_NMS_PRE = 1000  # per level, libreyolo's (and upstream's test_cfg) nms_pre
RTMDET_STRIDES = (8, 16, 32)
RTMDET_NMS_PRE = 30000  # per level, libreyolo's RTMDet post-processing
YOLONAS_FIT = 636  # libreyolo's YOLO-NAS resizes the long side to min(636, input size)


# ------------------------------------------------------------------------------------------ detector


class LibreYoloHeadDecoder:
    """A libreyolo family's head decode, by its head's kind, without the model: picklable (host processes run it)."""

    def __init__(self, head: str, model_id: str, max_det: int):
        self.head, self.model_id, self.max_det = head, model_id, max_det
        self._yolox = YoloxHeadDecoder(model_id) if head == "yolox" else None

    def __call__(self, raw: list[torch.Tensor], input_size: tuple[int, int],
                 conf: float) -> list[Candidates] | DenseCandidates:
        head = self.head
        if head == "yolox":
            return self._yolox(raw, input_size, conf)
        if head == "picodet":
            return decode_picodet(raw, input_size, conf, PICODET_STRIDES, PICODET_NMS_PRE)
        if head == "rtmdet":
            return decode_rtmdet(raw, input_size, conf, RTMDET_STRIDES, RTMDET_NMS_PRE)
        if head == "rfdetr":  # its top-k is the model's num_select (the catalogue's max_det) before the drop
            return decode_rfdetr(raw, input_size, self.max_det)
        decoders: dict[str, Callable] = {"yolo9": decode_yolo9, "yolo7": decode_yolo9, "yolonas": decode_yolonas,
                                         "ppyoloe": decode_yolonas, "detr": decode_detr, "lwdetr": decode_lwdetr}
        return decoders[head](raw, input_size, conf)


class LibreYoloDetector:
    """A catalogue model built by libreyolo: the Detector protocol (harness/detector/protocol.py)."""

    class_map = COCO80_TO_91

    def __init__(self, model_id: str, weights: str | Path | None = None):
        entry = catalogue().get(model_id)
        if entry is None:
            raise UsageError(f"unknown LibreYOLO model {model_id!r}; known: {', '.join(catalogue())}")
        self.entry = entry
        self.model_id, self.family, self.variant = model_id, entry.family.family, entry.variant
        self.licence = entry.family.licence
        self.size_multiple = entry.size_multiple
        self.wrapper, self.weights = build_libreyolo(entry, weights)
        # the model's classes as libreyolo loaded them: COCO's 80, or a fine-tuned checkpoint's own (its `nc` and
        # `names`; libreyolo names them class_0... when the checkpoint does not)
        self.class_names = tuple(str(self.wrapper.names[i]) for i in range(self.wrapper.nb_classes))
        if len(self.class_names) != len(COCO80_TO_91):
            self.class_map = tuple(range(len(self.class_names)))  # no COCO ids: classes match by name
        self.task = entry.family.task
        if self.task == "segment":
            self.mask_spec = MaskSpec(**entry.family.masks)
        self.core_module = LibreCore(self.wrapper.model, entry.family.head, masks=self.task == "segment").eval()
        self.postprocess = entry.postprocess
        self.defaults = self.postprocess.defaults
        self.preprocess = self.preprocess_for(entry.input_size)
        self.host_decoder = LibreYoloHeadDecoder(entry.family.head, model_id, self.postprocess.max_det)

    def preprocess_for(self, input_size: int | tuple[int, int]) -> PreprocessSpec:
        """The family's preprocessing at an input size. Two conventions depend on the model: a YOLOv9
        checkpoint may stamp its letterbox pad (libreyolo's `letterbox_pad`), and YOLO-NAS fits the
        long side to min(636, size) whatever the size."""
        spec = _preprocess_spec(self.entry, input_size)
        pad = getattr(self.wrapper, "letterbox_pad", None)
        if self.entry.family.head == "yolo9" and pad is not None:
            spec = replace(spec, pad_position="center" if pad == "center" else "top-left")
        if self.entry.family.head == "yolonas":
            spec = LongSideFitSpec(**spec.__dict__, fit_size=YOLONAS_FIT).with_input_size(spec.input_size)
        return spec

    @property
    def core_source(self) -> CoreSource:
        return CoreSource(self.model_id, torch_module=lambda: self.core_module,
                          query_rows=self.postprocess.kind == "topk")

    def decode(self, raw: list[torch.Tensor], input_size: tuple[int, int],
               conf: float) -> list[Candidates] | DenseCandidates:
        return self.host_decoder(raw, input_size, conf)

    def mask_maps(self, raw: list[torch.Tensor]) -> MaskMaps:
        """A segment model's per-query masks: its core's third output [B, Q, h, w]."""
        return MaskMaps(raw[2])

    def model_stats(self, input_size: tuple[int, int]) -> ModelStats:
        params = sum(p.numel() for p in self.core_module.parameters())
        stats = ModelStats(params_millions=round(params / 1e6, 4))
        module = self.core_module
        if next(module.parameters()).device.type != "cpu":  # a core loaded on a GPU: count on a CPU copy
            module = copy.deepcopy(module).cpu()
        try:
            flops, used = count_flops(module, input_size)
            stats.gflops, stats.params_used_millions = round(flops / 1e9, 4), round(used / 1e6, 4)
        except Exception as exc:  # a model FlopCounterMode cannot trace must not sink the benchmark; say why
            stats.notes["gflops"] = f"FLOP count failed: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
        return stats


@dataclass(frozen=True)
class LongSideFitSpec(PreprocessSpec):
    """YOLO-NAS's letterbox: the long side to min(`fit_size`, input size), then padded to the input
    size; `with_input_size` (how the runner changes the size) keeps that rule."""

    fit_size: int = 636

    def with_input_size(self, size: int | tuple[int, int]) -> LongSideFitSpec:
        hw = (size, size) if isinstance(size, int) else tuple(size)
        return replace(self, input_size=hw, fit_margin=max(0, min(hw) - self.fit_size))
