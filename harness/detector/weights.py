"""Where model weights live: a local cache (downloads only when asked to)."""

from __future__ import annotations

import os
from pathlib import Path

ENV_WEIGHTS_DIR = "VA_BENCH_WEIGHTS"


def weights_dir() -> Path:
    """The weights cache: $VA_BENCH_WEIGHTS, else ~/.cache/va-bench/weights."""
    return Path(os.environ.get(ENV_WEIGHTS_DIR) or Path.home() / ".cache" / "va-bench" / "weights")


def cache_problem() -> str | None:
    """Why the weights cache cannot be written (its nearest existing folder is not writable), as a whole message
    saying how to fix it; None when it can."""
    from harness.files import output_file_problem

    folder = weights_dir()
    problem = output_file_problem(folder / "any-file")
    if problem is None:
        return None
    return f"the weights cache {folder} {problem}; set ${ENV_WEIGHTS_DIR} to a writable folder"
