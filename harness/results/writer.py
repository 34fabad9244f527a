"""Atomic writes: a temp file in the same folder, fsync, then rename. A killed run never leaves a
half-written file under its final name."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import tempfile
from pathlib import Path

_UMASK = os.umask(0)
os.umask(_UMASK)


def atomic_write_bytes(path: Path, data: bytes) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp creates 0600; results are meant to be shared
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def _finite(obj):
    """NaN/inf are not JSON; a measurement that is not a number is recorded as null."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def atomic_write_json(path: Path, obj, indent: int | None = 2) -> Path:
    text = json.dumps(_finite(obj), indent=indent, allow_nan=False)
    return atomic_write_bytes(path, (text + "\n").encode("utf-8"))


def atomic_write_csv(path: Path, header: list[str], rows: list[list]) -> Path:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return atomic_write_bytes(path, buffer.getvalue().encode("utf-8"))
