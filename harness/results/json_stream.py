"""A JSON array written item by item, atomically: the run's detections go to disk batch by batch, so a cell
never holds the Python objects of all its detections at once, and a killed run leaves no half-written file
under the final name (temp file in the same folder, fsync, rename; see writer.py)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from types import TracebackType

from harness.results.writer import _UMASK, NonFiniteNumberError


class JsonArrayWriter:
    """`with JsonArrayWriter(path) as out: out.extend(items)`: `path` appears only when the block ends
    without an exception. NaN/inf are refused as in `atomic_write_json`."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.count = 0

    def __enter__(self) -> JsonArrayWriter:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, self._tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
        os.chmod(self._tmp, 0o666 & ~_UMASK)
        self._fh = os.fdopen(fd, "w", encoding="utf-8")
        self._fh.write("[")
        return self

    def extend(self, items: list) -> None:
        """Append `items` to the array."""
        if not items:
            return
        try:
            text = ",".join(json.dumps(item, allow_nan=False) for item in items)
        except ValueError as exc:
            raise NonFiniteNumberError(f"refusing to write {self.path}: an item holds NaN or inf (a bug upstream); "
                                       "nothing was written") from exc
        self._fh.write(("," if self.count else "") + text)
        self.count += len(items)

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            if exc_type is None:
                self._fh.write("]\n")
                self._fh.flush()
                os.fsync(self._fh.fileno())
            self._fh.close()
            if exc_type is None:
                os.replace(self._tmp, self.path)
        finally:
            Path(self._tmp).unlink(missing_ok=True)  # gone already after a successful rename
