"""Expand a RunConfig into cells: model x backend x precision x input size x batch size."""

from __future__ import annotations

from harness.backends import BackendOptions, set_options
from harness.backends.support import check_support
from harness.backends.tensorrt import check_engine_run
from harness.config import RunConfig
from harness.errors import UsageError
from harness.models.protocol import Detector
from harness.records import Cell, LoadKey


def device_kind(spec: str) -> str:
    """'cpu' or 'cuda' from a --device value (parse_device has already checked the device exists)."""
    return "cuda" if spec.strip().lower().startswith("cuda") else "cpu"


def check_runtimes(config: RunConfig) -> None:
    """Refuse, before any model is loaded, every (backend, device, precision) this machine cannot run as
    asked (one UsageError line: what and how to fix), and set the run's backend options."""
    kind = device_kind(config.device)
    index = int(config.device.split(":", 1)[1]) if ":" in config.device else 0  # parse_device checked it
    check_engine_run(config, kind)  # --backend tensorrt / --weights x.engine: the engine, its sidecar, precision
    if "ncnn" in config.backends and max(config.batch_sizes) > 1:
        raise UsageError("--backend ncnn runs one image per call (no batch axis); use --batch-sizes 1 for it, or "
                         "run the other batch sizes on another backend")
    for backend in config.backends:
        for precision in config.precisions:
            check_support(backend, kind, precision, config.ort_provider, index)
    _check_execution_modes(config, kind)
    set_options(BackendOptions(ort_provider=config.ort_provider, trt_cache_dir=config.trt_cache_dir,
                               trt_workspace_mb=config.trt_workspace_mb, max_batch=max(config.batch_sizes),
                               batch_sizes=tuple(sorted(config.batch_sizes)), compile=config.compile,
                               cuda_graphs=config.cuda_graphs))


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
    larger ones); checks every combination before anything runs."""
    too_big = [b for b in config.batch_sizes if b > num_images]
    if too_big:
        raise UsageError(f"batch size {max(too_big)} is larger than the {num_images} images of the dataset "
                         "variant; use a bigger --subset or smaller --batch-sizes")
    check_runtimes(config)
    groups = []
    for model_id, detector in detectors.items():
        for backend in config.backends:
            if backend not in detector.backends:
                raise UsageError(f"{model_id} has no backend {backend!r}; it has {', '.join(detector.backends)} "
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
