"""Model registry: names -> Detector factories, plus user plugins (`path/to/file.py:factory`).

One place registers families: FAMILY_ENTRIES below, one function per family returning its ModelEntry
rows. A family module provides the Detector (harness/detector/protocol.py); the entry says how to build
it and where its weights are.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.catalogue import PLUGIN_PATTERN, check_model_id
from harness.detector.engine import is_engine_file
from harness.detector.protocol import RANDOM_WEIGHTS, Detector
from harness.errors import UsageError, brief, path_problem
from harness.models import torchvision_family, ultralytics_onnx, yolox


@dataclass(frozen=True)
class ModelEntry:
    """A registered model: how to build it and where its weights come from."""

    model_id: str
    family: str
    factory: Callable[[str | None], Detector]  # weights (None: the default, a path, or "random") -> Detector
    weights_url: str | None
    weights_file: str | None
    weights_sha256: str | None = None  # the download's SHA-256 where pinned: another file is refused
    note: str = ""
    postprocess: str = "nms"  # the family's post-processing kind (PostprocessSpec.kind)
    local_weights: Callable[[], Path | None] = lambda: None  # the weights file found locally, if any
    engines: bool = False  # whether --weights may be a TensorRT engine of the model (--backend tensorrt)
    task: str = "detect"  # detect | segment
    check_weights: Callable[[Path], None] = lambda path: None  # UsageError when a file is not this model's weights
    # the detector without fetching its weights (a dry run, inspect, data check: no download); None where building
    # it fetches nothing
    describe: Callable[[str | None], Detector] | None = None
    # where its weights come from when va-bench downloads none itself (`models fetch` says it)
    weights_hint: str = "run it with --weights FILE"


def _yolox_entry(variant: str) -> ModelEntry:
    return ModelEntry(
        model_id=f"yolox-{variant}",
        family="yolox",
        factory=lambda weights, v=variant: yolox.YoloxDetector(v, weights),
        weights_url=yolox.RELEASE_URL.format(variant=variant),
        weights_file=f"yolox_{variant}.onnx",
        weights_sha256=yolox.RELEASE_SHA256.get(variant),
        note=f"official YOLOX ONNX export, {yolox.VARIANTS[variant]}px (or a TensorRT .engine of one)",
        postprocess=yolox.YoloxDetector.postprocess.kind,
        local_weights=lambda v=variant: next((p for p in yolox.weight_candidates(v) if p.is_file()), None),
        engines=True,
        check_weights=lambda path, v=variant: _check_yolox_weights(v, path),
    )


def _check_yolox_weights(variant: str, path: Path) -> None:
    """A UsageError unless `path` is an ONNX export of this variant (the detector checks its graph when built)."""
    yolox.YoloxDetector(variant, path)


def _yolox_entries() -> list[ModelEntry]:
    return [_yolox_entry(v) for v in yolox.VARIANTS]


def _torchvision_entries() -> list[ModelEntry]:
    return [ModelEntry(
        model_id=name,
        family=torchvision_family.TorchvisionDetector.family,
        factory=lambda weights, n=name: torchvision_family.TorchvisionDetector(n, weights),
        weights_url=None,  # torchvision downloads its own weights (torch.hub cache) when the model is built
        weights_file=None,
        note=f"torchvision, {config.input_size}px ({config.resize}); weights via torchvision's cache",
        weights_hint="torchvision downloads its weights into its own cache when a run loads the model (or pass "
                     "--weights FILE)",
        postprocess=config.postprocess.kind,
        local_weights=lambda n=name: torchvision_family.cached_weights(n),
        describe=lambda weights, n=name: torchvision_family.TorchvisionDetector(n, weights, fetch=False),
    ) for name, config in torchvision_family.MODELS.items()]


def _ultralytics_entries() -> list[ModelEntry]:
    return [ModelEntry(
        model_id=model_id,
        family=family,
        factory=lambda weights, m=model_id: ultralytics_onnx.UltralyticsOnnxDetector(m, weights),
        weights_url=None,  # exported by the user (Ultralytics is AGPL: not imported, not downloaded here)
        weights_file=f"{model_id}.onnx",
        note="Ultralytics-format ONNX export (--weights FILE.onnx, or a TensorRT FILE.engine of one)",
        weights_hint=f"export it with Ultralytics (`yolo export model={model_id}.pt format=onnx`) and pass --weights "
                     f"{model_id}.onnx",
        postprocess=ultralytics_onnx.postprocess_kind(family),
        local_weights=lambda m=model_id: ultralytics_onnx.cached_weights(m),
        engines=model_id not in ultralytics_onnx.SEGMENT_IDS,
        task="segment" if model_id in ultralytics_onnx.SEGMENT_IDS else "detect",
    ) for model_id, family in ultralytics_onnx.MODEL_IDS.items()]


# --- LibreYOLO families (harness/models/libreyolo.py, ids and conventions in harness/models/catalogue.yaml) ---


def _libreyolo_entry(model_id: str, onnx_yolox: ModelEntry | None) -> ModelEntry:
    """A catalogue id. The yolox-* ids are also the official-ONNX YOLOX family's: ONNX weights (the
    default, or --weights FILE.onnx) and TensorRT engines of them (FILE.engine) keep that family;
    --weights random or a libreyolo checkpoint builds the model with libreyolo."""
    from harness.detector.protocol import RANDOM_WEIGHTS
    from harness.detector.weights import weights_dir
    from harness.models import libreyolo

    model = libreyolo.catalogue()[model_id]

    def cached() -> Path | None:
        path = weights_dir() / model.weights_file
        return path if path.is_file() else None

    def factory(weights: str | None) -> Detector:
        onnx_like = weights is None or str(weights).lower().endswith(".onnx") or is_engine_file(weights)
        if onnx_yolox is not None and onnx_like:
            return onnx_yolox.factory(weights)
        return libreyolo.LibreYoloDetector(model_id, weights)

    note = f"libreyolo {model.weights_file}, {model.input_size}px; weights licence: {model.family.licence}"
    if onnx_yolox is None:
        return ModelEntry(model_id=model_id, family=model.family.family, factory=factory, weights_url=None,
                          weights_file=model.weights_file, note=note, postprocess=model.postprocess.kind,
                          local_weights=cached, task=model.family.task,
                          check_weights=lambda path: libreyolo.check_checkpoint(model_id, path))
    return ModelEntry(model_id=model_id, family=onnx_yolox.family, factory=factory,
                      weights_url=onnx_yolox.weights_url, weights_file=onnx_yolox.weights_file,
                      weights_sha256=onnx_yolox.weights_sha256,
                      note=f"{onnx_yolox.note}; --weights {RANDOM_WEIGHTS} or a .pt: {note}",
                      postprocess=onnx_yolox.postprocess, local_weights=onnx_yolox.local_weights, engines=True,
                      check_weights=onnx_yolox.check_weights)


def _libreyolo_entries() -> list[ModelEntry]:
    from harness.models import libreyolo

    onnx_yolox = {e.model_id: e for e in _yolox_entries()}
    return [_libreyolo_entry(model_id, onnx_yolox.get(model_id)) for model_id in libreyolo.catalogue()]


# --- end of the LibreYOLO families ------------------------------------------------------------------------


# Every family, in the order `va-bench models list` shows them. Add a family here.
FAMILY_ENTRIES: tuple[Callable[[], list[ModelEntry]], ...] = (
    _yolox_entries,
    _torchvision_entries,
    _ultralytics_entries,
    _libreyolo_entries,  # after _yolox_entries: its yolox-* entries extend those
)
REGISTRY: dict[str, ModelEntry] = {e.model_id: e for entries in FAMILY_ENTRIES for e in entries()}
REQUIRED_ATTRS = ("model_id", "family", "variant", "preprocess", "defaults", "class_map", "weights", "decode",
                  "model_stats")
# A plugin's core: a `core_source` the backends run, or its own `load_core` with the `backends` it offers.
CORE_ATTRS = (("core_source",), ("load_core", "backends"))


def load_plugin(path: str, factory_name: str) -> Detector:
    """Import a user file and call its factory; the result must follow the Detector protocol. The file is code run
    with the user's permissions: whoever names it (a flag, a preset, a campaign file) trusts it."""
    file = Path(path)
    if not file.is_file():
        raise UsageError(f"model plugin {file}: {'not a file' if file.exists() else 'no such file'}")
    module_name = "va_bench_plugin_" + re.sub(r"\W", "_", file.stem)
    spec = importlib.util.spec_from_file_location(module_name, file)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as exc:  # a sys.exit() in the plugin is its failure, not the harness's exit
        raise UsageError(f"model plugin {file} failed to import: {type(exc).__name__}: {exc}") from exc
    factory = getattr(module, factory_name, None)
    if not callable(factory):
        raise UsageError(f"model plugin {file} has no callable {factory_name!r}")
    try:
        detector = factory()
    except UsageError:
        raise
    except (Exception, SystemExit) as exc:  # the user's code, as its import above: one line naming it
        first = str(exc).splitlines()[0][:200] if str(exc) else ""
        raise UsageError(f"model plugin {file}:{factory_name}() failed: {type(exc).__name__}"
                         f"{': ' + first if first else ''}; fix the plugin") from exc
    if isinstance(detector, type):
        raise UsageError(f"{file}:{factory_name} returned the class {detector.__name__}, not a detector: return "
                         f"{detector.__name__}(...)")
    missing = [a for a in REQUIRED_ATTRS if not hasattr(detector, a)]
    if not any(all(hasattr(detector, a) for a in attrs) for attrs in CORE_ATTRS):
        missing.append("core_source (or load_core and backends)")
    if missing:
        raise UsageError(f"{file}:{factory_name} returned an object without {', '.join(missing)} "
                         "(see harness/detector/protocol.py: Detector)")
    _check_specs(detector, f"{file}:{factory_name}")
    return detector


def _check_specs(detector: Detector, where: str) -> None:
    """A plugin's specs of the types the contract names: a `postprocess` of another type would be ignored (the
    family's NMS defaults run instead), an input size of another shape fails deep inside a run, a `core_source` of
    another type was an AttributeError when the run was planned, one with no core an empty list of backends, and
    `backends` given as a string offered its letters."""
    from harness.detector.protocol import PostprocessSpec, PreprocessSpec
    from harness.detector.source import CoreSource

    source = getattr(detector, "core_source", None)
    if source is not None and not (isinstance(source, CoreSource) and (
            source.torch_module is not None or source.onnx_model is not None or source.engine_file is not None)):
        raise UsageError(f"{where}: core_source must be a CoreSource (harness/detector/source.py) with a torch_module "
                         f"or an onnx_model, not {brief(source)}; or give load_core and backends instead")
    if source is None:
        offered = getattr(detector, "backends", None)
        names = list(offered) if isinstance(offered, (tuple, list, set, frozenset)) else []
        if not names or not all(isinstance(b, str) for b in names):
            raise UsageError(f"{where}: backends must be a tuple of backend names (e.g. ('pytorch',)), "
                             f"not {brief(offered)}")
    post = getattr(detector, "postprocess", None)
    if post is not None and not isinstance(post, PostprocessSpec):
        raise UsageError(f"{where}: postprocess is a {type(post).__name__}, not a PostprocessSpec "
                         "(harness/detector/protocol.py); build one, or leave it out for NMS at the defaults")
    pre = detector.preprocess
    size = getattr(pre, "input_size", None)
    if not isinstance(pre, PreprocessSpec) or not (isinstance(size, tuple) and len(size) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in size)):
        raise UsageError(f"{where}: preprocess must be a PreprocessSpec whose input_size is (height, width) in "
                         f"pixels, not {brief(size if isinstance(pre, PreprocessSpec) else pre)}")


def get_detector(spec: str, weights: str | None = None, fetch: bool = True) -> Detector:
    """Build a detector from a registry id or a `file.py:factory` plugin spec. `fetch` False: what a dry run,
    inspect or data check need (its classes, input, architecture) without downloading weights it lacks."""
    match = PLUGIN_PATTERN.match(spec)
    if match:
        return load_plugin(match["path"], match["factory"])
    check_model_id(spec)
    entry = REGISTRY[spec]
    if weights is not None and weights != RANDOM_WEIGHTS and not Path(weights).is_file():  # one message, every family
        problem = "not a file" if Path(weights).exists() else "no such file"
        raise UsageError(path_problem("--weights", weights, problem) + "; give the model's weights file")
    if is_engine_file(weights) and not entry.engines:
        takes = ", ".join(sorted({e.family for e in REGISTRY.values() if e.engines}))
        raise UsageError(f"--weights {Path(weights).name}: {spec} does not run TensorRT engines (the {takes} families "
                         "do); run its ONNX export on --backend onnxruntime --ort-provider tensorrt --tf32 on")
    return entry.describe(weights) if not fetch and entry.describe is not None else entry.factory(weights)
