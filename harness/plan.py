"""Expand a RunConfig into cells: model x backend x precision x input size x batch size."""

from __future__ import annotations

from harness.config import RunConfig
from harness.errors import UsageError
from harness.models.protocol import Detector
from harness.records import Cell, LoadKey


def plan_cells(config: RunConfig, detectors: dict[str, Detector], num_images: int) -> list[tuple[LoadKey, list[Cell]]]:
    """Cells grouped by what must be loaded, batch sizes ascending (an OOM at one batch size skips the
    larger ones); checks every combination before anything runs."""
    too_big = [b for b in config.batch_sizes if b > num_images]
    if too_big:
        raise UsageError(f"batch size {max(too_big)} is larger than the {num_images} images of the dataset "
                         "variant; use a bigger --subset or smaller --batch-sizes")
    groups = []
    for model_id, detector in detectors.items():
        for backend in config.backends:
            if backend not in detector.backends:
                raise UsageError(f"{model_id} has no backend {backend!r}; it has {', '.join(detector.backends)}")
            for precision in config.precisions:
                if precision != "fp32":
                    raise UsageError(f"precision {precision!r} is not supported yet; use fp32")
                sizes = [(s, s) for s in config.input_sizes] or [detector.preprocess.input_size]
                for size in sizes:
                    if size[0] % 32 or size[1] % 32:
                        raise UsageError(f"input size {size[0]} is not a multiple of 32 (detector strides)")
                    key = LoadKey(model_id, backend, precision, size)
                    groups.append((key, [Cell(key, b) for b in sorted(config.batch_sizes)]))
    return groups
