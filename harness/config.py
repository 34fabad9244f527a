"""RunConfig: what `va-bench run` does, from a YAML preset (a file, or a built-in one in harness/presets/) plus CLI
overrides.

Every run option is declared once, here: its type, default, validation, help text and command-line
flags. The CLI builds `va-bench run`'s options from these fields (harness/cli/options.py: run_options).
"""

from __future__ import annotations

import re
import typing
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from harness.errors import UsageError, brief, path_problem
from harness.files import load_user_yaml, yaml_problem

PRESETS_DIR = Path(__file__).resolve().parent / "presets"  # installed with the package
# A run id / hardware id names a folder and file-name parts: a safe slug, never a path.
SAFE_ID = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$"  # a file or folder name: no separator (see also reserved_name)
_WINDOWS_DEVICES = re.compile(r"(?i)(?:con|prn|aux|nul|com[1-9]|lpt[1-9])(?:\..*)?")


def reserved_name(value: str) -> str | None:
    """Why a new run or hardware id cannot name a folder on every platform: one of Windows' device names (CON, NUL,
    COM1, ..., with any extension), or a trailing dot, which Windows drops; None when it can."""
    if _WINDOWS_DEVICES.fullmatch(value):
        return "is a device name on Windows, not a folder name there"
    if value.endswith("."):
        return "ends in '.', which Windows drops from a folder name"
    return None


# a field's bounds (pydantic's constraint names), as --help and a refusal say them
BOUND_WORDS = {"ge": "at least", "gt": "above", "le": "at most", "lt": "below"}
BOUND_ERRORS = {"greater_than_equal": "ge", "greater_than": "gt", "less_than_equal": "le", "less_than": "lt"}


def option(default: Any, flags: str | list[str], help: str, **constraints: Any) -> Any:
    """A RunConfig field that is also a `va-bench run` option: flags[0] is the main flag; a bool field's
    flag pair is `--x/--no-x`; list fields take several values after one flag (`--batch-sizes 1 2 4`)."""
    flags = [flags] if isinstance(flags, str) else flags
    extra = {"flags": flags}
    bounds = [f"{word} {constraints[key]}" for key, word in BOUND_WORDS.items() if key in constraints]
    if bounds:  # the range the validation holds it to, in --help too
        help = f"{help} ({', '.join(bounds)})"
    if callable(default):
        return Field(default_factory=default, description=help, json_schema_extra=extra, **constraints)
    return Field(default, description=help, json_schema_extra=extra, **constraints)


# A cell times at least this many batches whatever the options say: one sample has no spread (its standard
# deviation is undefined, and the site's submissions need a number there)
MIN_TIMED_BATCHES = 2
MIN_RESAMPLES = 100  # --map-ci: fewer leave a 2.5 % tail to two or three draws
# --eval-max-det at most: far above any detector's detections per image (a cap above them all is no cap), and within
# what faster-coco-eval takes (it sizes buffers by the cap: std::bad_alloc from ~5e7 on 23 GB, a cast error past 2**31)
MAX_EVAL_DET = 1_000_000


class RunConfig(BaseModel):
    """A benchmark sweep on one device. Unknown keys are errors (typos must not pass silently)."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)  # `--warmup-seconds inf` is no duration

    models: list[str] = option(lambda: ["yolox-nano"], "--model",
                               "registry id (`va-bench models list`) or path/to/file.py:factory")
    weights: str | None = option(None, "--weights", "weights file for a single --model")
    backends: list[str] = option(lambda: ["onnxruntime"], "--backend",
                                 "onnxruntime, pytorch, openvino, ncnn, tflite, torchscript, tensorrt (a serialized "
                                 "engine: --weights FILE.engine)")
    precisions: list[str] = option(lambda: ["fp32"], "--precision",
                                   "fp32, fp16, bf16, int8 (which backend runs which where: "
                                   "docs/precisions-and-runtimes.md; a pair it cannot run is refused before anything "
                                   "loads)")
    calibration: str | None = option(None, "--calibration",
                                     "int8: folder of calibration images (never evaluated ones); default: the "
                                     "dataset's images the run does not evaluate")
    calibration_images: int = option(300, "--calibration-images", "int8: calibration images used at most", ge=1)
    input_sizes: list[int] = option(list, ["--input-size", "--input-sizes"],
                                    "square input sizes (multiples of 32); default: each model's native size")
    batch_sizes: list[int] = option(lambda: [1], ["--batch-sizes", "--batch-size"],
                                    "one timing+scoring pass and one submission per batch size")
    input_source: Literal["dataset", "synthetic"] = option(
        "dataset", "--input", "dataset (COCO or --dataset), or synthetic: generated images of the input size, no "
        "dataset needed, timing only (--limit N images, default 64)")
    subset: str = option("sample", "--subset", "dataset variant: full, mini500 or sample")
    limit: int | None = option(None, "--limit", "first N images of the variant (-> subsetN)", ge=1)
    coco_dir: str | None = option(None, "--coco-dir",
                                  "COCO root (annotations/ + val2017/); else $VA_BENCH_COCO, ./datasets/coco")
    dataset: str | None = option(None, "--dataset",
                                 "your own dataset instead of COCO val2017: a COCO annotation JSON (images beside "
                                 "it), a folder with _annotations.coco.json, a Roboflow export root, or a YOLO "
                                 "dataset (its data.yaml, or the folder holding it)")
    split: str | None = option(None, "--split", "--dataset: the split of a Roboflow export (valid, test, train; "
                               "default: the first present) or of a YOLO dataset (val, test, train; default: val, "
                               "else test)")
    class_map: str | None = option(None, "--class-map",
                                   "YAML file of `dataset category name: model class name or index` lines, for "
                                   "datasets whose class names differ from the model's")
    device: str = option("cpu", "--device", "cpu, cuda or cuda:N")
    allow_shared_gpu: bool = option(False, "--allow-shared-gpu/--no-allow-shared-gpu",
                                    "run although other compute processes use the GPU (recorded; submissions "
                                    "marked); without it such a run is refused")
    lock_clocks: int | None = option(None, "--lock-clocks", "lock the GPU clocks at MHz during the run (NVML, needs "
                                     "root; reset afterwards; recorded)", ge=1)
    threads: int | None = option(None, "--threads", "CPU threads for the core; default: all cores (with "
                                 "--cpu-affinity: as many as its cores)", ge=1)
    cpu_affinity: list[int] = option(list, "--cpu-affinity", "pin the run (every thread) to these CPU cores, e.g. "
                                     "--cpu-affinity 2 3 (Linux); recorded in environment.cpu_affinity")
    warmup_batches: int = option(3, "--warmup-batches", "warm-up: at least this many batches (untimed); then until "
                                 "the last 3 batch times are within 10 % of each other", ge=0)
    warmup_seconds: float = option(10.0, "--warmup-seconds", "warm-up: at most this long once --warmup-batches are "
                                   "done (a cap: a warm-up that settles ends sooner)", ge=0)
    min_timed_batches: int = option(10, ["--min-timed-batches", "--iterations"],
                                    "timed batches at least (the variant's batches are cycled; never fewer than "
                                    f"{MIN_TIMED_BATCHES}: one has no spread)", ge=1)
    max_timed_batches: int | None = option(None, "--max-timed-batches",
                                           "timed batches at most (the rest of the variant is scored untimed)",
                                           ge=MIN_TIMED_BATCHES)
    repeats: int = option(1, "--repeats",
                          "measure every cell in N fresh processes (pyperf's habit): this one, timed and scored, and "
                          "N - 1 more, timing only; each process's median and their spread in timing.repeats",
                          ge=1, le=20)
    target_ci: float | None = option(None, "--target-ci",
                                     "keep timing (past one pass over the images, at most --max-seconds) until the "
                                     "95 % confidence interval of the median batch time is within +-PCT % of it",
                                     gt=0, lt=100)
    max_seconds: float = option(300.0, "--max-seconds", "--target-ci: the longest one cell's timed pass may run", gt=0)
    min_seconds: float | None = option(None, "--min-seconds",
                                       "time each cell for at least this long (the variant's batches cycled past one "
                                       "pass, unscored): sustained load, under which devices throttle and clocks drop "
                                       "(MLPerf times 600 s)", gt=0)
    stage_sync: bool = option(True, "--stage-sync/--no-stage-sync",
                              "sync the device at every stage boundary (latency) or once per batch")
    overlap: bool = option(False, "--overlap/--no-overlap",
                           "overlapped mode: prepare/post-process neighbouring batches while the core runs")
    scenario: Literal["single-stream", "offline", "server"] | None = option(
        None, "--scenario", "MLPerf's names: single-stream (latency mode, the default), offline (= --overlap), or "
        "server (seeded Poisson arrivals at --qps, one image a query, p99 latency against --latency-bound)")
    qps: float | None = option(None, "--qps", "--scenario server: the arrival rate (queries per second)", gt=0)
    latency_bound_ms: float | None = option(None, "--latency-bound", "--scenario server: the p99 latency bound (ms), "
                                            "arrival to result", gt=0)
    find_max_qps: bool = option(False, "--find-max-qps/--no-find-max-qps",
                                "--scenario server: search for the highest rate whose p99 holds the bound")
    server_queries: int = option(1000, "--server-queries", "--scenario server: queries per trial", ge=10)
    workers: str = option("auto", "--workers",
                          "overlapped mode: host workers preparing batches (N, at most N batches ahead, or auto: "
                          "1 on CPU, min(cores - 1, 8) on CUDA)")
    host_processes: int = option(
        0, "--host-processes", "overlapped mode: the host's reads, decode and letterbox (--preprocess cv2 or pil), "
        "and the selection of candidates on the host (a CPU run, an ONNX Runtime core, --nms-on host), in N processes "
        "of their own, outside the interpreter lock that an eager forward's calls need (--workers auto: N); 0: on the "
        "workers' threads", ge=0, le=64)
    forward_process: bool = option(
        False, "--forward-process", "overlapped mode: the core in a process of its own, whose one thread runs the "
        "forward, outside the interpreter lock that the host stages' threads take (batches cross through slots on the "
        "device, or in shared memory)")
    accuracy: bool = option(True, "--accuracy/--no-accuracy", "COCO-evaluate each cell's detections")
    masks: bool = option(True, "--masks/--no-masks",
                         "segmentation models: compute each detection's mask and score segm beside bbox; "
                         "--no-masks scores their boxes only (a detection-board row)")
    eval_max_det: int = option(100, "--eval-max-det",
                               "COCOeval's detection cap per image (maxDets 1, 10, 100 and this; AP and AR_max_det "
                               "read at it; RF100-VL: 500); not the NMS --max-det", ge=1, le=MAX_EVAL_DET)
    map_ci: int = option(0, "--map-ci", "a 95 % bootstrap interval of each cell's mAP over the scored images, from "
                         "this many resamples (1000 is usual; 0: none): how much the figure owes to which images "
                         "were drawn", ge=0)
    evaluator: Literal["pycocotools", "faster-coco-eval"] = option(
        "faster-coco-eval", "--evaluator", "faster-coco-eval (pycocotools' 12 statistics to 1e-12: tested for bbox, "
        "segm and an evaluation cap of 500) or pycocotools")
    conf: float | None = option(None, "--conf", "score threshold; default: the family's (site: 0.001)",
                                ge=0, lt=1)
    iou: float | None = option(None, "--iou", "NMS IoU threshold; default: the family's (site: 0.6)", gt=0, le=1)
    max_det: int | None = option(None, "--max-det", "detections kept per image; default: the family's (site: 300)",
                                 ge=1)
    tf32: Literal["on", "off", "default"] = option("off", "--tf32",
                                                   "TF32 on CUDA: off (fp32 is IEEE fp32), on, or default "
                                                   "(torch's own flags)")
    ort_provider: Literal["auto", "cpu", "cuda", "tensorrt"] = option(
        "auto", "--ort-provider", "ONNX Runtime provider: auto (the device's: cpu or cuda), cpu, cuda, tensorrt")
    trt_cache_dir: str = option("~/.cache/va-bench/tensorrt", "--trt-cache-dir",
                                "TensorRT provider engine cache folder")
    trt_workspace_mb: int = option(4096, "--trt-workspace-mb", "TensorRT provider builder workspace (MiB)", ge=1)
    compile: Literal["none", "default", "max-autotune"] = option(
        "none", "--compile", "PyTorch: torch.compile mode (compiled at load, per batch size): none, default, "
        "max-autotune")
    cuda_graphs: bool = option(False, "--cuda-graphs/--no-cuda-graphs",
                               "PyTorch on CUDA: capture one CUDA graph per batch size at load and replay it")
    hardware_id: str | None = option(None, "--hardware-id", "override the derived hardware id (a slug)",
                                     pattern=SAFE_ID)
    output_dir: str = option("outputs", "--output-dir", "where run folders are created")
    run_id: str | None = option(None, "--run-id", "name of the run folder (a slug); default: time + random",
                                pattern=SAFE_ID)
    draw_images: int = option(4, "--draw-images", "images saved with their boxes drawn", ge=0)
    # probes: each in its own pass (layers, profile) or a cheap window around the timed batches
    layers: bool = option(False, "--layers/--no-layers", "per-layer timing pass (layer_timer.csv)")
    layer_batches: int = option(3, "--layer-batches", "batches in the layer pass", ge=1)
    profile: bool = option(False, "--profile/--no-profile", "torch.profiler pass (trace.json)")
    profile_batches: int = option(2, "--profile-batches", "batches in the profiler pass", ge=1)
    energy: bool = option(True, "--energy/--no-energy", "energy over each timing window")
    memory: bool = option(True, "--memory/--no-memory", "peak RSS / VRAM per timing window + memory.csv")
    cache_images: Literal["auto", "off"] = option("auto", "--cache-images",
                                                  "auto: keep the variant's encoded images in memory when they fit "
                                                  "a budget (decode timed from memory); off: read each from disk")
    preprocess: Literal["auto", "cv2", "torch", "pil"] = option(
        "auto", "--preprocess", "preprocessing implementation: cv2, torch (F.interpolate of the images cv2 decodes; "
        "nvJPEG and the letterbox on the device on CUDA, the whole batch at once for bilinear ones) or pil; auto: "
        "torch on CUDA, else the family's own (cv2 for most)")
    nms_on: Literal["device", "host"] = option(
        "device", "--nms-on", "on CUDA, where the selection (NMS or top-k) and the boxes run: device (the whole "
        "batch's NMS at once, with a torch or TensorRT core), or host (the candidates copied once, NMS per image on a "
        "thread per core); the same on a CPU")

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        """A YAML true/false is no number: pydantic's lax mode would read a preset's `target_ci: true` as 1 %,
        `min_seconds: true` as 1 s, `draw_images: true` as one image (a toggle taken for a value)."""
        items = value if isinstance(value, list) else [value]
        flag = next((v for v in items if isinstance(v, bool)), None)
        if flag is not None and _takes_a_number(cls.model_fields[info.field_name].annotation):
            where = "" if items is not value else f" in {brief(value)}"
            raise ValueError(f"{str(flag).lower()}{where} is a yes/no, not a number; give a number (or leave the key "
                             "out for its default)")
        return value

    @field_validator("map_ci")
    @classmethod
    def _resamples(cls, value: int) -> int:
        if 0 < value < MIN_RESAMPLES:
            raise ValueError(f"{value} resamples cannot place a 95 % interval's 2.5 % tails; give at least "
                             f"{MIN_RESAMPLES} (1000 is usual) or 0 for none")
        return value

    @field_validator("cpu_affinity")
    @classmethod
    def _cores(cls, values: list[int]) -> list[int]:
        if any(v < 0 for v in values):
            raise ValueError("core numbers start at 0")
        return sorted(set(values))

    @field_validator("batch_sizes", "input_sizes")
    @classmethod
    def _positive(cls, values: list[int]) -> list[int]:
        if any(v < 1 for v in values):
            raise ValueError("must be positive integers")
        return list(dict.fromkeys(values))  # keep order, drop repeats

    @field_validator("batch_sizes")
    @classmethod
    def _ascending(cls, values: list[int]) -> list[int]:
        """Cells run from the smallest batch up whatever the order given: `2 1` is the sweep `1 2` (a resume given
        either is the same run)."""
        return sorted(values)

    @field_validator("device", mode="before")
    @classmethod
    def _device_name(cls, value: Any) -> Any:
        """`CPU` and ` cuda:1` are cpu and cuda:1 (device_spec reads them so): one device, one recorded name."""
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("workers", mode="before")
    @classmethod
    def _workers(cls, value: Any) -> str:
        text = str(value).strip() if isinstance(value, (int, str)) and not isinstance(value, bool) else ""
        if text != "auto" and not (text.isdigit() and 1 <= int(text) <= 64):
            raise ValueError(f"{brief(value)}: use a number of workers from 1 to 64, or auto")
        return text if text == "auto" else str(int(text))  # YAML `workers: 3` and `--workers 3` alike

    @field_validator("backends")
    @classmethod
    def _site_backend_names(cls, values: list[str]) -> list[str]:
        """The site's runtime name `onnx` is ONNX Runtime here."""
        return list(dict.fromkeys("onnxruntime" if v == "onnx" else v for v in values))

    @field_validator("models", "backends", "precisions", "batch_sizes")
    @classmethod
    def _not_empty(cls, values: list) -> list:
        if not values:
            raise ValueError("needs at least one value")
        return list(dict.fromkeys(values))  # a value given twice is one cell, as the plan shows it

    @field_validator("run_id", "hardware_id")
    @classmethod
    def _portable_name(cls, value: str | None, info: ValidationInfo) -> str | None:
        """New ids only: a run recorded before this rule (`build_config(..., recorded=True)`) resumes as it is."""
        recorded = bool(info.context and info.context.get("recorded"))
        if value is not None and not recorded and (problem := reserved_name(value)):
            raise ValueError(f"{value} {problem}; pick another")
        return value

    @field_validator("weights", "calibration", "output_dir", "coco_dir", "dataset", "class_map", "trt_cache_dir")
    @classmethod
    def _home(cls, value: str | None) -> str | None:
        """`~` is the home folder in every path option (a preset's `output_dir: ~/runs`, or `--output-dir=~/runs`,
        which the shell leaves alone, made a folder named `~`)."""
        return None if value is None else str(Path(value).expanduser())

    @model_validator(mode="after")
    def _scenario(self) -> RunConfig:
        """--scenario: single-stream and offline name the modes --overlap sets (a contradiction is refused); server
        needs its bound and rate, one image a query; the server options go with it only."""
        if self.scenario == "server":
            if self.latency_bound_ms is None or (self.qps is None and not self.find_max_qps):
                raise ValueError("--scenario server needs --latency-bound MS and --qps R (or --find-max-qps)")
            if self.overlap or self.batch_sizes != [1]:
                raise ValueError("--scenario server serves one image a query in latency mode: use --batch-sizes 1, "
                                 "without --overlap")
        elif self.qps is not None or self.latency_bound_ms is not None or self.find_max_qps:
            raise ValueError("--qps, --latency-bound and --find-max-qps belong to --scenario server")
        if self.scenario in ("single-stream", "offline"):
            wanted = self.scenario == "offline"
            if "overlap" in self.model_fields_set and self.overlap != wanted:
                raise ValueError(f"--scenario {self.scenario} contradicts --{'' if self.overlap else 'no-'}overlap; "
                                 "give one of them")
            self.overlap = wanted
        return self

    def options_of_other_modes(self) -> dict[str, str]:
        """Option field -> the mode it belongs to, for each option of a mode this run is not in."""
        cuda = self.device.strip().lower().startswith("cuda")
        # what the scoring takes, where nothing is scored (no accuracy pass, or generated images)
        scoring = ("--input dataset" if self.input_source == "synthetic" else "--accuracy",
                   self.accuracy and self.input_source != "synthetic")
        belongs = {"map_ci": scoring, "eval_max_det": scoring,
                   "workers": ("--overlap", self.overlap), "host_processes": ("--overlap", self.overlap),
                   "forward_process": ("--overlap", self.overlap),
                   "max_seconds": ("--target-ci", self.target_ci is not None),
                   "server_queries": ("--scenario server", self.scenario == "server"),
                   "calibration": ("--precision int8", "int8" in self.precisions),
                   "calibration_images": ("--precision int8", "int8" in self.precisions),
                   "layer_batches": ("--layers", self.layers), "profile_batches": ("--profile", self.profile),
                   "tf32": ("--device cuda", cuda), "allow_shared_gpu": ("--device cuda", cuda),
                   "trt_cache_dir": ("--ort-provider tensorrt", self.ort_provider == "tensorrt"),
                   "trt_workspace_mb": ("--ort-provider tensorrt", self.ort_provider == "tensorrt")}
        return {name: mode for name, (mode, active) in belongs.items() if not active}

    @model_validator(mode="after")
    def _defaults_for_other_modes(self) -> RunConfig:
        """An option of a mode the run is not in does nothing: it is recorded at its default, so that the record
        says what ran (a preset's `workers: 4` under `--no-overlap`, a resumed run's older record). Given on the
        command line, it is refused instead (`load_config`). After `_scenario`, which sets --overlap."""
        for name in self.options_of_other_modes():
            default = type(self).model_fields[name].get_default(call_default_factory=True)
            if getattr(self, name) != default:
                setattr(self, name, default)
        return self

    def identity(self) -> dict[str, Any]:
        """What makes two runs the same sweep (for --resume): everything but where it is written."""
        return self.model_dump(exclude={"run_id", "output_dir"})


def _takes_a_number(annotation: Any) -> bool:
    """Whether a field's type is a number, a list of numbers or an optional one (not a bool: bool is an int)."""
    if annotation in (int, float):
        return True
    return any(_takes_a_number(a) for a in typing.get_args(annotation))


def run_option_fields() -> dict[str, Any]:
    """RunConfig's fields that are `va-bench run` options: name -> pydantic FieldInfo."""
    return {name: f for name, f in RunConfig.model_fields.items() if f.json_schema_extra}


def _validation_message(exc: ValidationError) -> str:
    err = exc.errors()[0]
    where = ".".join(str(p) for p in err["loc"])
    field = RunConfig.model_fields.get(str(err["loc"][0])) if err["loc"] else None
    flag = f" ({field.json_schema_extra['flags'][0].split('/')[0]})" if field and field.json_schema_extra else ""
    message = err["msg"].removeprefix("Value error, ")
    if err["type"] == "string_pattern_mismatch":
        message = f"{brief(err['input'])} is not a plain name: use letters, digits, '_', '.' and '-' (no paths)"
    if err["type"] == "finite_number":
        message = f"{brief(err['input'])} is not a finite number"
    elif err["type"].endswith("_parsing") or err["type"].endswith("_type"):  # name the value that is not one
        message = f"{message}, got {brief(err['input'])}"
    elif err["type"] in BOUND_ERRORS and BOUND_ERRORS[err["type"]] in err.get("ctx", {}):
        bound = BOUND_ERRORS[err["type"]]
        message = f"{brief(err['input'])} is out of range: give a value {BOUND_WORDS[bound]} {err['ctx'][bound]}"
    return f"invalid run configuration: {where}{flag}: {message}" if where else f"invalid run configuration: {message}"


def device_spec(spec: str) -> tuple[str, int]:
    """'cpu', 'cuda', 'cuda:1' -> (kind, index), from the text alone (whether that device is there is
    measure/device.py's parse_device); anything else is a one-line UsageError."""
    spec = spec.strip().lower()
    if spec == "cpu":
        return "cpu", 0
    if spec == "cuda" or spec.startswith("cuda:"):
        index = spec.split(":", 1)[1] if ":" in spec else "0"
        if not index.isdigit():
            raise UsageError(f"--device {spec}: the CUDA device index must be a number (cuda:0, cuda:1, ...)")
        return "cuda", int(index)
    if spec == "mps" or spec.startswith("mps:"):
        raise UsageError("--device mps (Apple GPUs) is not supported yet: va-bench's backends run on cpu and CUDA "
                         "here; use --device cpu")
    raise UsageError(f"unknown --device {spec!r}; use cpu, cuda or cuda:N")


def build_config(data: dict, recorded: bool = False) -> RunConfig:
    """RunConfig from plain data; a validation error becomes one UsageError line naming the option. `recorded`: the
    configuration of an existing run (resumed): the rules for new names do not apply to its ids."""
    try:
        return RunConfig.model_validate(data, context={"recorded": recorded})
    except ValidationError as exc:
        raise UsageError(_validation_message(exc)) from exc


def preset_names() -> list[str]:
    """The presets that ship with the harness (harness/presets/NAME.yaml), by name."""
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))


def preset_path(given: str | Path) -> Path:
    """The file `--config` names: a path, or else the name of a preset that ships with the harness."""
    path = Path(given).expanduser()
    if not path.is_file() and str(given) in preset_names():
        return PRESETS_DIR / f"{given}.yaml"
    return path


def read_preset(given: str | Path) -> dict:
    """A YAML preset (safe_load) as a dict: a file, or a built-in preset by name; YAML errors name the line and
    column."""
    path = preset_path(given)
    if not path.is_file():
        raise UsageError(path_problem("--config", given, "no such file") + "; give the path of a YAML preset or "
                         f"the name of a built-in one ({', '.join(preset_names())})")
    try:
        data = load_user_yaml(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise UsageError(path_problem("--config", given, f"not valid YAML{yaml_problem(exc)}") + "; fix the file") \
            from exc
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise UsageError(path_problem("--config", given, f"could not be read ({reason})") + "; fix the file") from exc
    if not isinstance(data, dict):
        raise UsageError(path_problem("--config", given, "not a YAML mapping") + "; write RunConfig fields as "
                         "`name: value` lines")
    for key in data:
        if key not in RunConfig.model_fields:
            raise UsageError(path_problem("--config", given, f"unknown key {brief(str(key))}") + "; "
                             + _key_hint(str(key)))
    return data


# `va-bench run`'s flags that are no RunConfig field (cli/options.py: RUN_FLAGS, DRY_RUN_FLAG)
COMMAND_LINE_ONLY = ("config", "resume", "retry_failed", "force", "json", "dry_run")


def _key_hint(key: str) -> str:
    """How to write a preset key that is no RunConfig field: the field its flag sets (`backend` is --backend,
    whose key is `backends`), else the nearest names."""
    import difflib

    wanted = key.strip().lstrip("-").replace("-", "_")
    for name, field in run_option_fields().items():
        first, *negated = field.json_schema_extra["flags"][0].split("/")
        if negated and wanted == negated[0].lstrip("-").replace("-", "_"):  # `no-energy: true` means energy: false
            return f"the key of {first}/{negated[0]} is `{name}`: write `{name}: false` for {negated[0]}"
        flags = {f.lstrip("-").replace("-", "_") for flag in field.json_schema_extra["flags"] for f in flag.split("/")}
        if wanted in flags or wanted == name:
            return f"the key of {first} is `{name}`"
    if wanted in COMMAND_LINE_ONLY:  # what a run does with its options, not one of them
        return f"--{wanted.replace('_', '-')} is a flag of the command line only: give it there, not in a preset"
    near = difflib.get_close_matches(wanted, list(RunConfig.model_fields), n=3, cutoff=0.6)
    return (f"did you mean {' or '.join(f'`{n}`' for n in near)}? " if near else "") + \
        "a preset's keys are the run options' field names (`models`, `backends`, `batch_sizes`, ...: docs/running.md)"


def given(overrides: dict) -> dict:
    """The overrides the user actually gave (None / [] mean "not given")."""
    return {k: v for k, v in overrides.items() if v is not None and v != []}


def load_config(path: str | Path | None, overrides: dict) -> RunConfig:
    """Load a YAML preset (safe_load) and apply CLI overrides (None means "not given"). An override of a mode the
    run is not in (it would be recorded and do nothing), or a --min-timed-batches above --max-timed-batches, is
    a one-line UsageError."""
    data = read_preset(path) if path is not None else {}
    flags = given(overrides)
    config = build_config({**data, **flags})
    refuse_given_options(config, flags)
    fields = RunConfig.model_fields
    # both asked for, other than their defaults (the default minimum yields to a maximum)
    asked = {k for k in ("min_timed_batches", "max_timed_batches")
             if {**data, **flags}.get(k, fields[k].default) != fields[k].default}
    if len(asked) == 2 and config.min_timed_batches > config.max_timed_batches:
        raise UsageError(f"--min-timed-batches {config.min_timed_batches} is more than --max-timed-batches "
                         f"{config.max_timed_batches}; lower one of them")
    return config


def refuse_given_options(config: RunConfig, flags: dict) -> None:
    """A one-line UsageError for an option given now (`flags`, other than its default) of a mode `config` is not in:
    it would be recorded and do nothing."""
    fields = RunConfig.model_fields
    for name, mode in config.options_of_other_modes().items():
        if name in flags and flags[name] != fields[name].get_default(call_default_factory=True):
            flag = fields[name].json_schema_extra["flags"][0].split("/")[0]
            raise UsageError(f"{flag} applies to {mode} only; add {mode} or drop {flag}")


def add_run_argument(parser: Any, name: str, flag: str | None = None, default: Any = ..., **overrides: Any) -> None:
    """An argparse option declared by a RunConfig field (the bench scripts' options): its flag, type, choices and
    help come from the field; `flag` (e.g. the singular --batch-size), `default` and `overrides` adapt it."""
    field = RunConfig.model_fields[name]
    annotation = field.annotation
    item = typing.get_args(annotation)[0] if typing.get_origin(annotation) is list else annotation
    choices = typing.get_args(item) if typing.get_origin(item) is Literal else None
    base = next((a for a in typing.get_args(item) if a is not type(None)), item) if choices is None else str
    kwargs: dict[str, Any] = {"default": field.get_default(call_default_factory=True) if default is ... else default,
                              "help": field.description}
    if base is bool:  # a switch: given or not
        kwargs["action"] = "store_true"
    else:
        kwargs["type"] = base
    if choices:
        kwargs["choices"] = choices
    parser.add_argument(flag or field.json_schema_extra["flags"][0], **{**kwargs, **overrides})


def timed_batches(config: RunConfig, full: int) -> int:
    """How many batches a cell times: one pass over its `full` batches, at least --min-timed-batches and
    MIN_TIMED_BATCHES (cycling the batches), at most --max-timed-batches; none without a full batch."""
    if not full:
        return 0
    timed = max(full, config.min_timed_batches, MIN_TIMED_BATCHES)
    return min(timed, config.max_timed_batches) if config.max_timed_batches else timed
