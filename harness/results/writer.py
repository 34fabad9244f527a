"""Atomic writes: a temp file in the same folder, fsync, then rename. A killed run never leaves a
half-written file under its final name. JSON is strict: NaN/inf are refused, not written as null."""

from __future__ import annotations

import csv
import errno
import io
import json
import math
import os
import tempfile
from pathlib import Path

from harness.errors import VaBenchError

_UMASK = os.umask(0)
os.umask(_UMASK)


DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class DiskFullError(VaBenchError):
    """No space left on the device (or the quota is used up) while writing `path`: exit 1. Nothing was written
    under the final name; a sweep stops here, since every later cell would fail the same way."""

    def __init__(self, path: Path | str | None, cause: BaseException | None = None):
        self.path = path
        reason = cause.strerror.lower() if isinstance(cause, OSError) and cause.strerror else "no space left on device"
        super().__init__(f"{reason} writing {path}" if path else reason)


def is_disk_full(exc: BaseException | None) -> bool:
    """Whether `exc`, or an exception it was raised from, is a full disk (ENOSPC/EDQUOT). Libraries that write
    files (the profiler, cv2, pycocotools) may wrap the OSError or only keep its text."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, DiskFullError) or (isinstance(exc, OSError) and exc.errno in DISK_FULL_ERRNOS):
            return True
        if "no space left on device" in str(exc).lower() or "disk quota exceeded" in str(exc).lower():
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def atomic_write_bytes(path: Path, data: bytes) -> Path:
    """Write `data` to `path` atomically. A full disk is a DiskFullError naming `path`; the temp file is
    removed whatever happens, so a failed write leaves the previous version (or nothing) in place."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    except OSError as exc:
        if exc.errno in DISK_FULL_ERRNOS:
            raise DiskFullError(path, exc) from exc
        raise
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp creates 0600; results are meant to be shared
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())  # ENOSPC may come only here (delayed allocation), never after the rename
        os.replace(tmp, path)
    except OSError as exc:
        Path(tmp).unlink(missing_ok=True)
        if exc.errno in DISK_FULL_ERRNOS:
            raise DiskFullError(path, exc) from exc
        raise
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


class NonFiniteNumberError(VaBenchError, ValueError):
    """A NaN or infinity where a number belongs: a bug upstream (exit 1), never written as null."""


def _first_non_finite(obj, path: str = "$") -> tuple[str, float] | None:
    """The JSON path and value of the first NaN/inf in `obj`, depth first."""
    if isinstance(obj, float):
        return None if math.isfinite(obj) else (path, obj)
    if isinstance(obj, dict):
        items = ((f"{path}.{k}" if path != "$" else str(k), v) for k, v in obj.items())
    elif isinstance(obj, (list, tuple)):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(obj))
    else:
        return None
    for sub_path, value in items:
        found = _first_non_finite(value, sub_path)
        if found is not None:
            return found
    return None


def atomic_write_json(path: Path, obj, indent: int | None = 2) -> Path:
    """Write `obj` as JSON atomically. NaN/inf are refused (NonFiniteNumberError naming the JSON path),
    never turned into null: null means "not measured" and is written only where the caller put None."""
    try:
        text = json.dumps(obj, indent=indent, allow_nan=False)
    except ValueError as exc:
        found = _first_non_finite(obj)
        if found is None:
            raise
        where, value = found
        raise NonFiniteNumberError(
            f"refusing to write {path}: {where} is {value}, not a number (a bug upstream: an unmeasured "
            "value must be None, and a computed one finite); nothing was written") from exc
    return atomic_write_bytes(path, (text + "\n").encode("utf-8"))


def atomic_write_csv(path: Path, header: list[str], rows: list[list]) -> Path:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return atomic_write_bytes(path, buffer.getvalue().encode("utf-8"))
