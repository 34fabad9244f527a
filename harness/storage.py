"""Why a write stopped short when the library that wrote it does not say (ONNX Runtime's profiler, torch's trace
exporter, OpenVINO's serializer, a converter's exit status): the storage's free space and the process's file-size
limit, read when such a write fails, turned into the DiskFullError every other full disk is."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from harness.files import (
    DISK_FULL_ERRNOS,
    FILE_SIZE_FIX,
    DiskFullError,
    exception_chain,
    file_size_limit,
    is_disk_full,
)

LOW_SPACE_BYTES = 1 << 20
CACHE_FULL_FIX = "free space there, or set $VA_BENCH_WEIGHTS to a folder on another disk"


def free_bytes(path: Path) -> int | None:
    """The bytes this process may still write on the file system holding `path` (root may use the blocks reserved
    for it); None when it cannot be read."""
    folder = Path(path)
    while not folder.is_dir() and folder != folder.parent:
        folder = folder.parent
    if hasattr(os, "statvfs"):
        try:
            st = os.statvfs(folder)
        except OSError:
            return None
        root = hasattr(os, "geteuid") and os.geteuid() == 0
        return (st.f_bfree if root else st.f_bavail) * st.f_frsize
    try:
        return shutil.disk_usage(folder).free
    except OSError:
        return None


def storage_exhausted(path: Path, size: int = 0) -> OSError | None:
    """Why a write of `path` that stopped at `size` bytes most likely stopped: the process's file-size limit (the
    file had reached it), or the file system holding `path` with under 1 MiB left for this process; as the OSError
    the write itself would have raised. None when neither holds: the failure is something else. Ask before
    removing what the write left: removing it frees the very space that ran out."""
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
        if soft != resource.RLIM_INFINITY and size >= soft:
            return OSError(errno.EFBIG, os.strerror(errno.EFBIG), str(path))
    except (ImportError, OSError, ValueError):  # no such limit on this platform
        pass
    free = free_bytes(path)
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) if free is not None and \
        free < LOW_SPACE_BYTES else None


def storage_failure(exc: BaseException, written: Path) -> OSError | None:
    """The storage's refusal behind `exc`, raised while writing `written` (a file, or a folder of them): the OSError
    in its chain (ENOSPC, EDQUOT, EFBIG), or, for a library that reports a failed write in its own words, what
    `storage_exhausted` finds there (the largest file written against the file-size limit, the space left); None
    when the storage is not why."""
    for link in exception_chain(exc):
        if isinstance(link, OSError) and link.errno in DISK_FULL_ERRNOS:
            return link
    if is_disk_full(exc):  # said in words only
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(written))
    written = Path(written)
    try:
        files = [written] if written.is_file() else [p for p in written.rglob("*") if p.is_file()]
        largest = max((p.stat().st_size for p in files), default=0)
    except OSError:
        largest = 0
    return storage_exhausted(written, largest)


def storage_fix(cause: BaseException | None, fix: str) -> str:
    """`fix` for a full disk; for a file-size limit (EFBIG in `cause`'s chain), how to lift it."""
    return FILE_SIZE_FIX if file_size_limit(cause) else fix


@contextlib.contextmanager
def cache_writes(entry: Path, written: Path) -> Iterator[None]:
    """Around a converter writing the cache entry `entry` into `written` (its temp file or folder): a failure the
    storage is why of (`storage_failure`) is a DiskFullError naming the entry with the fix, which stops the sweep
    (every later conversion would fail the same way), never a cell's failure in a library's own words. Inside the
    block, before the temp file or folder is removed (that would free the space that ran out)."""
    try:
        yield
    except DiskFullError:
        raise
    except Exception as exc:
        cause = storage_failure(exc, written)
        if cause is None:
            raise
        raise DiskFullError(entry, cause, storage_fix(cause, CACHE_FULL_FIX)) from exc


def discard_cut_write(written: Path, named: Path) -> DiskFullError | None:
    """Remove what a write that stopped short left at `written`; the DiskFullError naming `named` when the storage is
    why (judged before the removal: the leftover holds the very space that ran out), else None."""
    size = written.stat().st_size if written.exists() else 0
    cause = storage_exhausted(written, size)
    written.unlink(missing_ok=True)
    return None if cause is None else DiskFullError(named, cause)
