"""Where model weights live: a local cache (downloads only when asked to)."""

from __future__ import annotations

import os
from pathlib import Path

ENV_WEIGHTS_DIR = "VA_BENCH_WEIGHTS"


def weights_dir() -> Path:
    """The weights cache: $VA_BENCH_WEIGHTS, else ~/.cache/va-bench/weights."""
    return Path(os.environ.get(ENV_WEIGHTS_DIR) or Path.home() / ".cache" / "va-bench" / "weights")
