"""Finding and fetching model weights (a local cache; downloads only when asked to)."""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import urllib.request
from pathlib import Path

from harness.errors import VaBenchError


class DownloadError(VaBenchError):
    """A download that failed (network, server): exit 1, not a usage error."""

ENV_WEIGHTS_DIR = "VA_BENCH_WEIGHTS"


def weights_dir() -> Path:
    """The weights cache: $VA_BENCH_WEIGHTS, else ~/.cache/va-bench/weights."""
    return Path(os.environ.get(ENV_WEIGHTS_DIR) or Path.home() / ".cache" / "va-bench" / "weights")


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def download(url: str, dest: Path, timeout: float = 60.0) -> Path:
    """Download `url` to `dest` atomically (a temp file renamed into place); never a partial file."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as response:
            shutil.copyfileobj(response, out)
        os.replace(tmp, dest)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        raise DownloadError(f"could not download {url} ({exc}); check the network or pass --weights PATH") from exc
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return dest
