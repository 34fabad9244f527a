"""A run's plan: a RunConfig checked once and expanded into cells (model x backend x precision x input size x
batch size), with its dataset, detectors, device and backend options resolved before anything is written."""

from __future__ import annotations

import difflib
import os
import secrets
from concurrent.futures import Future
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from harness.backends import BUILTIN_BACKENDS, BackendOptions, detector_backends
from harness.backends.support import (
    check_batch_sizes,
    check_support,
    converting_backends,
    mask_backends,
    ort_provider_for,
    what_loads,
)
from harness.catalogue import PLUGIN_PATTERN, check_model_id, segment_ids
from harness.config import RunConfig, device_spec, timed_batches
from harness.data.images import find_corrupt_images_in_background
from harness.detector.engine import check_engine_weights, engine_build, is_engine_file
from harness.detector.protocol import RANDOM_WEIGHTS
from harness.detector.weights import cache_problem, weights_dir
from harness.errors import UsageError, brief, path_problem
from harness.measure.affinity import check_cores
from harness.measure.hygiene import no_cuda_ipc
from harness.records import Cell, LoadKey

# Characters of a model's id: a submission's file name holds it beside the hardware id (at most 100), the runtime,
# batch and time stamp (about 65), and its temp name adds 14, within a file system's 255
MAX_MODEL_ID = 64

if TYPE_CHECKING:  # the modules that import torch, ONNX Runtime or a model: after the options are checked
    from harness.data.calibration import CalibrationSet
    from harness.data.coco import CocoDataset, ImageRecord
    from harness.data.variants import DatasetVariant
    from harness.detector.protocol import Detector
    from harness.measure.device import Device


@dataclass
class RunPlan:
    """Everything resolved and checked before the first file is written."""

    config: RunConfig
    run_id: str
    run_dir: Path
    device: Device
    dataset: CocoDataset
    variant: DatasetVariant
    records: list[ImageRecord]
    detectors: dict[str, Detector]
    groups: list[tuple[LoadKey, list[Cell]]]
    label_categories: dict[str, tuple[int, ...]]  # model id -> the dataset category of each label
    gpu_hygiene: dict | None  # other compute processes on the GPU, checked at plan time (CUDA runs)
    backend_options: BackendOptions  # what every load of this run gets (from check_runtimes)
    resume: dict | None = None  # run.json of the run being resumed
    retry_failed: bool = False
    calibration: CalibrationSet | None = None  # int8 cells: images disjoint from the evaluated ones
    integrity: Future | None = None  # the images' strict decode (find_corrupt_images), started at plan time
    model_specs: dict[str, str] = field(default_factory=dict)  # model id -> the --model value that named it

    @property
    def cells(self) -> list[Cell]:
        return [c for _, cells in self.groups for c in cells]

    def describe(self) -> dict:
        """What the run will do, cell by cell (`--dry-run`): batches, timed batches, what each group loads."""
        config, n = self.config, self.variant.num_images
        groups = []
        for key, cells in self.groups:
            source = getattr(self.detectors[key.model], "core_source", None)
            if source is None:
                loads = "the plugin's own core"
            elif source.engine_file is not None:
                loads = "a TensorRT engine"
            else:
                loads = what_loads(key.backend, source.torch_module is not None, source.onnx_model is not None)
            rows = []
            for cell in cells:
                full, short = divmod(n, cell.batch_size)
                timed = timed_batches(config, full)
                rows.append({"cell": cell.label, "batch_size": cell.batch_size, "full_batches": full,
                             "short_batch": short or None, "timed_batches": timed, "scored_images": n})
            groups.append({"load": key.label, "loads": loads, "weights": self.detectors[key.model].weights.source,
                           "cells": rows})
        return {"run_id": self.run_id, "run_dir": str(self.run_dir), "device": str(self.device),
                "dataset": {**self.dataset.describe(), **self.variant.describe()},
                "warmup": {"batches": config.warmup_batches, "seconds": config.warmup_seconds},
                "timing": {"min_seconds": config.min_seconds, "target_ci": config.target_ci},
                # nothing is scored without accuracy, nor on synthetic input
                "evaluation": config.evaluator if config.accuracy and config.input_source != "synthetic" else None,
                "groups": groups,
                "num_cells": len(self.cells),
                "warnings": [w for w in (self.limit_warning(),) if w]}

    def limit_warning(self) -> str | None:
        """--limit above the variant's size: every image of it is scored, under the variant's own name (said, not
        silently fewer than asked)."""
        limit = self.config.limit
        if limit is None or self.config.input_source == "synthetic" or self.variant.num_images >= limit:
            return None
        return (f"warning: --limit {limit}: the {self.variant.name} variant has {self.variant.num_images} images; "
                "all of them are scored")


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


def open_dataset(config: RunConfig) -> CocoDataset:
    """The run's dataset: `--dataset PATH` (any COCO-format dataset) or COCO val2017 (`--coco-dir`, ...)."""
    from harness.data.coco import CocoDataset

    if config.dataset is not None:
        if config.coco_dir is not None:
            raise UsageError("--dataset and --coco-dir name two datasets; give one")
        return CocoDataset.from_path(config.dataset, config.split)
    if config.split is not None:
        raise UsageError("--split selects a split of a --dataset (a Roboflow export or a YOLO dataset); give "
                         "--dataset PATH or drop it")
    return CocoDataset(config.coco_dir)


def check_device(device: Device, config: RunConfig, fleet_node: bool = False) -> dict | None:
    """Plan-time hygiene of a CUDA run: other compute processes on the GPU are refused unless
    --allow-shared-gpu (measure/hygiene.py); --lock-clocks only on CUDA. On a fleet node the job's own Ray
    workers hold CUDA contexts, so the process list cannot tell them from strangers: not checked there."""
    if not device.is_cuda:
        if config.lock_clocks is not None:
            raise UsageError("--lock-clocks applies to an NVIDIA GPU (--device cuda); drop it")
        return None
    if fleet_node:
        return {"status": "unavailable", "reason": "not checked on a fleet node (this job's Ray workers hold CUDA "
                                                   "contexts there)"}
    from harness.measure.hygiene import gpu_processes
    from harness.run.repeats import repeat_parent

    return gpu_processes(device.index, config.allow_shared_gpu, parent=repeat_parent())


def prepare(config: RunConfig, dry_run: bool = False, fleet_node: bool = False,
            shared_class_map: bool = False) -> RunPlan:
    """Resolve dataset, models and cells. Raises UsageError on bad input; writes nothing (a dry run does not
    even create --output-dir). `shared_class_map`: --class-map is a campaign's, for all its datasets."""
    config = engine_defaults(config)  # --backend tensorrt: --precision/--tf32 not given are the engine's build's
    backend_options = check_runtimes(config)  # what the options alone decide: before torch or a model is imported
    from harness.data.classes import ClassMap

    synthetic = config.input_source == "synthetic"
    integrity = None
    if not synthetic:
        dataset = open_dataset(config)  # its annotations; no image is read yet
        variant = dataset.variant(config.subset, config.limit)
        records = dataset.records(variant)
        if not dry_run:  # the images' strict decode overlaps the imports below (its threads release the GIL)
            integrity = find_corrupt_images_in_background(records)
    class_map = ClassMap.read(config.class_map, shared_class_map) if config.class_map else None
    from harness.measure.device import parse_device  # torch, and the models' libraries, from here on
    from harness.models.registry import get_detector

    device = parse_device(config.device)
    gpu_hygiene = check_device(device, config, fleet_node)  # before this process makes a CUDA context of its own
    check_machine(config, device)
    detectors, model_specs = {}, {}
    for spec in config.models:
        detector = get_detector(spec, config.weights, fetch=not dry_run)  # a dry run downloads nothing
        if not isinstance(detector.model_id, str) or not 0 < len(detector.model_id) <= MAX_MODEL_ID:
            raise UsageError(f"{spec}: its model_id {brief(detector.model_id)} is not a name of 1 to {MAX_MODEL_ID} "
                             "characters (the run's file names hold it); give it a shorter one")
        _check_host_letterbox(config, detector, device.is_cuda)
        detectors[detector.model_id] = detector
        model_specs[detector.model_id] = spec
    if synthetic:  # images of the run's (first) input size: the first --input-size, else the first model's own
        from harness.data.synthetic import SyntheticDataset

        first = next(iter(detectors.values())).preprocess.input_size
        dataset = SyntheticDataset((config.input_sizes[0],) * 2 if config.input_sizes else first)
        variant = dataset.variant(config.subset, config.limit)
        records = dataset.records(variant)
    label_categories = scoring_checks(config, dataset, variant, detectors, class_map)
    groups = plan_cells(config, detectors, variant.num_images)
    calibration = int8_calibration(config, dataset, records)
    output_dir = Path(config.output_dir)
    run_id = config.run_id or new_run_id()
    try:  # Path.exists() raises what is not "no such file": a name too long for the file system (ENAMETOOLONG)
        taken = (output_dir / run_id).exists()
    except OSError as exc:
        raise UsageError(path_problem("--output-dir", config.output_dir, f"cannot be used ({exc.strerror})")
                         + "; pick another folder") from exc
    if taken:  # a dry run says so too
        raise UsageError(path_problem("--output-dir", config.output_dir, f"already has a run {run_id}")
                         + f"; pick another --run-id or continue it with --resume {run_id}")
    if dry_run:
        return RunPlan(config, run_id, output_dir / run_id, device, dataset, variant, records,
                       detectors, groups, label_categories, gpu_hygiene, backend_options, calibration=calibration,
                       model_specs=model_specs)
    if output_dir.is_symlink() and not output_dir.exists():
        raise UsageError(path_problem("--output-dir", config.output_dir, f"a link to {os.readlink(output_dir)}, which "
                                      "does not exist") + "; create that folder, or pick another")
    if output_dir.exists() and not output_dir.is_dir():
        raise UsageError(path_problem("--output-dir", config.output_dir, "a file, not a folder") + "; pick a folder")
    try:
        output_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(path_problem("--output-dir", config.output_dir, f"cannot create it ({exc.strerror})")
                         + "; pick a writable folder") from exc
    if not os.access(output_dir, os.W_OK | os.X_OK):
        raise UsageError(path_problem("--output-dir", config.output_dir, "not writable") + "; pick a writable folder")
    run_dir = Path(config.output_dir) / run_id
    return RunPlan(config, run_id, run_dir, device, dataset, variant, records, detectors, groups,
                   label_categories, gpu_hygiene, backend_options, calibration=calibration, integrity=integrity,
                   model_specs=model_specs)


def scoring_checks(config: RunConfig, dataset, variant: DatasetVariant, detectors: dict[str, Detector],
                   class_map) -> dict[str, tuple[int, ...]]:
    """What scoring needs of the dataset (a timing-only run, or generated images, needs none of it): ground truth
    among the variant's images, masks for a segmentation model's, and a category for every annotated one among each
    model's classes. Returns each model's label -> dataset category (`CocoDataset.label_categories`)."""
    from harness.data.classes import model_class_names
    from harness.detector.protocol import task_of

    dataset.class_map = class_map
    if config.input_source != "synthetic" and config.accuracy:
        dataset.check_ground_truth(variant)
        if config.masks and any(task_of(d) == "segment" for d in detectors.values()):
            dataset.check_masks(variant)  # masks scored against boxes-only ground truth would all miss
    return {model_id: dataset.label_categories(model_id, model_class_names(d), class_map)
            for model_id, d in detectors.items()}


def int8_calibration(config: RunConfig, dataset: CocoDataset, records: list[ImageRecord]) -> CalibrationSet | None:
    """The int8 cells' calibration images (checked disjoint from the evaluated ones); None without int8."""
    if "int8" not in config.precisions:
        return None
    from harness.data.calibration import calibration_set

    return calibration_set(dataset, records, config.calibration, config.calibration_images)


def engine_defaults(config: RunConfig) -> RunConfig:
    """An engine run's --precision and --tf32, when not given, are the engine's build's (its sidecar's
    command): the config with them filled in. Given ones are left for check_engine_run to hold against the
    engine; an unreadable sidecar too (it says what is wrong, in its order)."""
    unset = {"precisions", "tf32"} - config.model_fields_set
    if not unset or not is_engine_file(config.weights) or config.backends != ["tensorrt"]:
        return config
    try:
        build = engine_build(Path(config.weights))
    except UsageError:
        return config
    update = {"precisions": [build.precision], "tf32": "on" if build.tf32 and build.precision == "fp32" else "off"}
    return config.model_copy(update={k: v for k, v in update.items() if k in unset})


def check_engine_run(config: RunConfig, device_kind: str) -> None:
    """A run's engine options, before any model is loaded: an engine runs on `--backend tensorrt` alone and
    that backend runs engines alone; the engine must be runnable here (check_engine_weights), and the run's
    --precision and --tf32 must be what the engine was built with (it cannot run another)."""
    engine, wants_trt = is_engine_file(config.weights), "tensorrt" in config.backends
    if not engine and not wants_trt:
        return
    if not engine:
        raise UsageError("--backend tensorrt runs a serialized TensorRT engine: pass --weights MODEL.engine (built "
                         "by trtexec, with its JSON sidecar); to build engines from ONNX use --backend onnxruntime "
                         "--ort-provider tensorrt --device cuda --tf32 on (or --precision fp16)")
    name = Path(config.weights).name
    others = [b for b in config.backends if b != "tensorrt"]
    if others:
        raise UsageError(f"--weights {name} is a serialized TensorRT engine: it runs on --backend tensorrt only, not "
                         f"{others[0]}; pass --backend tensorrt alone")
    build = check_engine_weights(config.weights, device_kind)
    if config.precisions != [build.precision]:
        raise UsageError(f"--precision {' '.join(config.precisions)}: {name} was built {build.precision} (its "
                         f"sidecar's command); drop --precision (an engine runs at its build's) or pass "
                         f"--precision {build.precision}")
    recorded_tf32 = config.tf32 != "off"  # "default" keeps torch's flags, which allow TF32 (runtime.tf32)
    if build.precision == "fp32" and build.tf32 != recorded_tf32:
        raise UsageError(
            f"{name} was built without --noTF32 (trtexec then runs fp32 layers in TF32), but --tf32 off records "
            "IEEE fp32; rebuild it with --noTF32, or drop --tf32 to record TF32 on" if build.tf32 else
            f"{name} was built with --noTF32 (IEEE fp32), but --tf32 {config.tf32} records TF32; drop --tf32")
    if config.layers:
        raise UsageError("--layers times PyTorch modules or ONNX Runtime nodes; a TensorRT engine has neither here "
                         "(use trtexec --dumpProfile): drop --layers")




def check_runtimes(config: RunConfig) -> BackendOptions:
    """Every refusal the options alone decide, before torch, ONNX Runtime or a model is imported (one UsageError
    line: what and how to fix): the device's spelling, engines, (backend, device, precision) by the rules,
    execution modes, model ids, --weights; the run's backend options."""
    kind, index = device_spec(config.device)
    check_engine_run(config, kind)  # --backend tensorrt / --weights x.engine: the engine, its sidecar, precision
    for backend in config.backends:
        check_batch_sizes(backend, config.batch_sizes, "use --batch-sizes 1 for it, or run the other batch sizes on "
                                                       "another backend")
    for backend in config.backends:
        for precision in config.precisions:
            check_support(backend, kind, precision, config.ort_provider, index, machine=False)
    _check_tensorrt_provider_tf32(config, kind)
    _check_execution_modes(config, kind)
    _check_synthetic_input(config)
    _check_host_processes(config, kind)
    _check_forward_process(config, kind)
    check_cores(config.cpu_affinity)
    if config.target_ci is not None and config.max_timed_batches is not None:
        raise UsageError("--target-ci times until the interval is reached and --max-timed-batches caps the timed "
                         "batches; give one of them")
    if config.target_ci is not None and config.overlap:
        raise UsageError("--target-ci checks the interval between chunks of batches, which would stop the overlapped "
                         "stream whose wall time is its throughput; use it in latency mode (drop "
                         f"{'--scenario offline' if config.scenario == 'offline' else '--overlap'})")
    if config.min_seconds is not None and config.max_timed_batches is not None:
        raise UsageError("--min-seconds times for at least that long and --max-timed-batches caps the timed batches; "
                         "give one of them")
    if config.min_seconds is not None and config.target_ci is not None and config.min_seconds > config.max_seconds:
        raise UsageError(f"--min-seconds {config.min_seconds:g} is longer than --max-seconds {config.max_seconds:g}, "
                         "the longest a --target-ci pass may run; raise --max-seconds")
    _check_models(config)
    _check_segment_backends(config)
    converting = converting_backends(config.backends)
    # no cache to read conversions from and none can be made: found now, not as a failed cell inside the run folder
    # (a cache that exists but is read-only still serves what it holds: the run warns)
    if converting and not weights_dir().is_dir() and (problem := cache_problem()):
        raise UsageError(f"--backend {converting[0]} keeps the model it converts in the weights cache: {problem}")
    if config.calibration is not None and "int8" in config.precisions and not Path(config.calibration).is_dir():
        raise UsageError(path_problem("--calibration", config.calibration, "not a folder")
                         + "; give a folder of image files")
    return BackendOptions.from_config(config)


def _check_synthetic_input(config: RunConfig) -> None:
    """--input synthetic times generated images: options that name or need a dataset are refused."""
    if config.input_source != "synthetic":
        return
    given = [flag for flag, on in (("--dataset", config.dataset), ("--coco-dir", config.coco_dir),
                                   ("--split", config.split), ("--class-map", config.class_map),
                                   ("--calibration", config.calibration), ("--subset", config.subset != "sample"),
                                   ("--precision int8", "int8" in config.precisions)) if on]
    if given:
        raise UsageError(f"--input synthetic times generated images and needs no dataset: {given[0]} does not apply; "
                         "drop it, or use --input dataset")


def _check_host_processes(config: RunConfig, kind: str) -> None:
    """--host-processes letterbox the dataset's files on the host: not torch's letterbox (on the device on CUDA),
    not generated images."""
    if not config.host_processes:
        return
    if config.input_source == "synthetic":
        raise UsageError("--host-processes read and letterbox the dataset's files; --input synthetic has none: drop "
                         "--host-processes")
    library = "torch" if config.preprocess == "auto" and kind == "cuda" else config.preprocess
    if library == "torch":
        given = "--preprocess auto (torch on CUDA)" if config.preprocess == "auto" else "--preprocess torch"
        raise UsageError(f"--host-processes letterbox on the host (cv2 or PIL) and {given} letterboxes with torch; "
                         "add --preprocess cv2 (or pil), or drop --host-processes")


def _check_forward_process(config: RunConfig, kind: str) -> None:
    """--forward-process shares device memory between two processes (CUDA IPC) and loads the core there: not where
    CUDA has no IPC, not with int8 (calibrated in the run's process)."""
    if not config.forward_process:
        return
    if kind == "cuda" and (machine := no_cuda_ipc()) is not None:
        raise UsageError(f"--forward-process shares the device's memory between two processes (CUDA IPC), which "
                         f"{machine} does not support; drop --forward-process")
    if "int8" in config.precisions:
        raise UsageError("--forward-process runs the core in a process of its own and --precision int8 calibrates it "
                         "in this one; run int8 without --forward-process")


def _check_host_letterbox(config: RunConfig, detector: Detector, cuda: bool) -> None:
    """--host-processes with --preprocess auto on a CPU: the family's own letterbox must be a host one."""
    if not config.host_processes:
        return
    from harness.pipeline.preprocess import resolve_implementation

    if resolve_implementation(detector.preprocess, config.preprocess, cuda).library == "torch":
        raise UsageError(f"--host-processes letterbox on the host (cv2 or PIL) and {detector.model_id}'s own "
                         "preprocessing is torch's; add --preprocess cv2 (or pil), or drop --host-processes")


def _check_segment_backends(config: RunConfig) -> None:
    """Masks come from the runtimes whose cores return a segment model's mask maps; the others are refused."""
    segment = [m for m in config.models if m in segment_ids()]
    runs = sorted(mask_backends())
    others = [b for b in config.backends if b not in runs]
    if config.masks and segment and others:
        raise UsageError(f"{segment[0]} is a segmentation model: its masks run on {' and '.join(runs)}, not "
                         f"{others[0]}; use --backend {' or '.join(runs)}, or --no-masks to time and score its boxes "
                         "only")


def _check_models(config: RunConfig) -> None:
    """Registry ids exist; --weights goes with one registry model and names a file (or `random`)."""
    if config.weights and len(config.models) > 1:
        raise UsageError("--weights applies to a single --model; run one model at a time with it")
    if config.weights and PLUGIN_PATTERN.match(config.models[0]):
        raise UsageError("--weights does not apply to a plugin model (its factory loads its own weights); drop it")
    plugins = [spec for spec in config.models if PLUGIN_PATTERN.match(spec)]
    for spec in config.models:
        if spec not in plugins:
            check_model_id(spec)
    unknown = [b for b in config.backends if b not in BUILTIN_BACKENDS]
    if unknown and not plugins:  # a plugin model may register a backend of its own when it is imported
        close = difflib.get_close_matches(unknown[0], BUILTIN_BACKENDS, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]}? " if close else ""
        raise UsageError(f"unknown backend {unknown[0]!r}; {hint}use {', '.join(BUILTIN_BACKENDS)} (or onnx)")
    weights = config.weights
    if weights is not None and weights != RANDOM_WEIGHTS and not Path(weights).is_file():
        problem = "not a file" if Path(weights).exists() else "no such file"
        raise UsageError(path_problem("--weights", weights, problem) + "; give the model's weights file")


def check_machine(config: RunConfig, device: Device) -> None:
    """What the machine answers for each (backend, precision): a bf16 convolution here, the GPU's capability,
    ONNX Runtime's GPU providers (after the GPU's hygiene check: a probe may create a CUDA context)."""
    for backend in config.backends:
        for precision in config.precisions:
            check_support(backend, device.kind, precision, config.ort_provider, device.index)


def _check_tensorrt_provider_tf32(config: RunConfig, kind: str) -> None:
    """ONNX Runtime's TensorRT provider builds fp32 engines with TF32 allowed (TensorRT's default) and has no
    option to forbid it: an fp32 row there is not IEEE fp32, so `--tf32 off` (the default) cannot be kept."""
    if ("onnxruntime" in config.backends and "fp32" in config.precisions and config.tf32 == "off"
            and ort_provider_for(kind, config.ort_provider) == "tensorrt"):
        raise UsageError("--ort-provider tensorrt runs fp32 layers in TF32 (TensorRT's default; the provider cannot "
                         "turn it off): add --tf32 on to record it so, or use --ort-provider cuda for IEEE fp32")


def _check_execution_modes(config: RunConfig, kind: str) -> None:
    """--compile / --cuda-graphs: PyTorch only, CUDA graphs on a GPU only, and not with the hook-based
    layer pass (hooks on the eager modules do not fire inside a compiled or replayed forward)."""
    modes = [flag for flag, on in (("--compile", config.compile != "none"), ("--cuda-graphs", config.cuda_graphs))
             if on]
    if not modes:
        return
    if config.cuda_graphs and kind != "cuda":
        raise UsageError("--cuda-graphs needs --device cuda (CUDA graphs replay GPU work); drop it on the CPU")
    others = [b for b in config.backends if b != "pytorch"]
    if others:
        raise UsageError(f"{' and '.join(modes)}: PyTorch execution modes, not for --backend {others[0]}; "
                         "use --backend pytorch")
    if config.layers:
        raise UsageError(f"--layers times eager modules through hooks, which do not fire under "
                         f"{' and '.join(modes)}; drop --layers (or run it eager)")


def plan_cells(config: RunConfig, detectors: dict[str, Detector], num_images: int) -> list[tuple[LoadKey, list[Cell]]]:
    """Cells grouped by what must be loaded, batch sizes ascending (an OOM at one batch size skips the
    larger ones); every combination is checked before anything runs (check_runtimes has checked the runtimes)."""
    too_big = [b for b in config.batch_sizes if b > num_images]
    if too_big:
        raise UsageError(f"batch size {max(too_big)} is larger than the {num_images} images of the dataset "
                         "variant; use a bigger --subset or smaller --batch-sizes")
    groups = []
    for model_id, detector in detectors.items():
        for backend in config.backends:
            offered = detector_backends(detector)
            if backend not in offered:
                raise UsageError(f"{model_id} has no backend {backend!r}; it has {', '.join(offered)} "
                                 "(backends here: onnxruntime or onnx, pytorch, openvino, ncnn, tflite, "
                                 "torchscript, tensorrt with --weights FILE.engine)")
            for precision in config.precisions:
                sizes = [(s, s) for s in config.input_sizes] or [detector.preprocess.input_size]
                multiple = getattr(detector, "size_multiple", 32)  # the family's stride; 32 for most detectors
                for size in sizes:
                    native = size == tuple(detector.preprocess.input_size)  # a family's own size is valid
                    if not native and (size[0] % multiple or size[1] % multiple):
                        raise UsageError(f"input size {size[0]} is not a multiple of {multiple} ({model_id}'s "
                                         "strides); pick another --input-size")
                    key = LoadKey(model_id, backend, precision, size)
                    groups.append((key, [Cell(key, b) for b in sorted(config.batch_sizes)]))
    return groups
