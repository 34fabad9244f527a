"""An exclusive lock on an open file, where the platform has one: flock on POSIX, a lock on the file's first byte
(msvcrt) on Windows. A run folder's .lock, and the report log while a section is appended."""

from __future__ import annotations

import errno
import os
import time

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None
try:
    import msvcrt
except ImportError:  # POSIX
    msvcrt = None

WAIT_STEP_S = 0.05


def lock_file(fd: int, wait: bool) -> bool:
    """Take the exclusive lock of the open file `fd`: True once held (released when the file is closed or the process
    ends, even by kill -9); False at once when another process holds it and `wait` is False."""
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            return False
        return True
    # Windows: the first byte, locked from offset 0 (allowed past the end of an empty file); the position is restored
    position = os.lseek(fd, 0, os.SEEK_CUR)
    os.lseek(fd, 0, os.SEEK_SET)
    try:
        while True:
            try:
                msvcrt.locking(fd, msvcrt.LK_NBLCK, 1)
                return True
            except OSError as exc:
                if exc.errno not in (errno.EACCES, errno.EDEADLK):  # not another holder: a real failure
                    raise
                if not wait:
                    return False
                time.sleep(WAIT_STEP_S)
    finally:
        os.lseek(fd, position, os.SEEK_SET)
