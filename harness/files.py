"""Every file the harness writes goes through here: a temp file (or folder) beside the destination, fsync,
then one rename, so a killed run or a full disk never leaves a half-written file under its final name. JSON is
strict: NaN/inf are refused, not written as null. Also the one download helper and the files' SHA-256."""

from __future__ import annotations

import collections.abc
import contextlib
import csv
import errno
import hashlib
import io
import json
import math
import os
import re
import shutil
import tempfile
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

import yaml

from harness.errors import NonFiniteNumberError, UsageError, VaBenchError


def _process_umask() -> int:
    """The process's umask, read where the system shows it (Linux's /proc): setting it to learn it leaves a moment
    in which another thread's new file gets mode 0666."""
    try:
        for line in Path("/proc/self/status").read_text(encoding="ascii").splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _process_umask()


# the storage takes no more bytes: no space left, the quota used up, or the process's file-size limit (ulimit -f)
DISK_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


class DiskFullError(VaBenchError):
    """No space left on the device (the quota used up, a file-size limit reached) while writing `path`: exit 1.
    Nothing was written under the final name; a sweep stops here, since every later cell would fail the same way."""

    def __init__(self, path: Path | str | None, cause: BaseException | None = None, fix: str | None = None):
        self.path = path
        reason = cause.strerror.lower() if isinstance(cause, OSError) and cause.strerror else "no space left on device"
        super().__init__((f"{reason} writing {path}" if path else reason) + (f"; {fix}" if fix else ""))


FILE_SIZE_FIX = "raise the file-size limit (ulimit -f), or write to a file system that takes larger files"


def safe_name(text: str, empty: str = "x") -> str:
    """`text` as a part of a file name: runs of anything but ASCII letters, digits, '.' and '-' become one '-', with
    no '-' or '.' at either end (so never '..' or a hidden file); `empty` where nothing is left."""
    return re.sub(r"[^A-Za-z0-9.-]+", "-", text).strip("-.") or empty


def file_size_limit(exc: BaseException | None) -> bool:
    """Whether `exc`, or an exception it was raised from, is the process's file-size limit (EFBIG: `ulimit -f`)."""
    return any(isinstance(link, OSError) and link.errno == errno.EFBIG for link in exception_chain(exc))


UNWRITABLE_ERRNOS = (errno.EACCES, errno.EPERM, errno.EROFS)
# a file where the run folder has a folder (submissions/), or a folder where it has a file: every later cell fails too
IN_THE_WAY_ERRNOS = (errno.EEXIST, errno.ENOTDIR, errno.EISDIR)


@dataclass(frozen=True)
class StorageProblem:
    """What stops every later write under a folder."""

    message: str  # one line, naming the path
    reason: str  # the same without the path (a cell's reason in run.json)
    fix: str


def storage_problem(exc: BaseException | None, folder: Path) -> StorageProblem | None:
    """A full disk anywhere, or a permission or read-only error on a path in `folder` (made read-only, or
    remounted, mid-run); None for any other failure (an unreadable model file is that model's problem)."""
    if is_disk_full(exc):
        limit = file_size_limit(exc)
        reason = "file too large (the file-size limit)" if limit else "no space left on device"
        message = (str(exc) if isinstance(exc, DiskFullError)
                   else f"{reason} ({type(exc).__name__}: {' '.join(str(exc).split())[:200]})")
        return StorageProblem(message, reason, FILE_SIZE_FIX if limit else "free some space")
    for link in exception_chain(exc):
        if (isinstance(link, OSError) and link.errno in UNWRITABLE_ERRNOS + IN_THE_WAY_ERRNOS
                and link.filename is not None
                and Path(os.path.abspath(link.filename)).is_relative_to(os.path.abspath(folder))):
            why = link.strerror.lower() if link.strerror else "not permitted"
            fix = ("move what is in the way out of the run folder" if link.errno in IN_THE_WAY_ERRNOS
                   else "make the folder writable")
            return StorageProblem(f"cannot write {link.filename} ({why})", f"the run folder cannot be written ({why})",
                                  fix)
    return None


def exception_chain(exc: BaseException | None) -> Iterator[BaseException]:
    """`exc` and the exceptions it was raised from or while handling, once each."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def is_disk_full(exc: BaseException | None) -> bool:
    """Whether `exc`, or an exception it was raised from, is a full disk (ENOSPC/EDQUOT). Libraries that write
    files (the profiler, cv2, pycocotools) may wrap the OSError or only keep its text."""
    for link in exception_chain(exc):
        if isinstance(link, DiskFullError) or (isinstance(link, OSError) and link.errno in DISK_FULL_ERRNOS):
            return True
        if "no space left on device" in str(link).lower() or "disk quota exceeded" in str(link).lower():
            return True
    return False


class _UniqueKeyLoader(yaml.SafeLoader):
    """yaml.safe_load's loader, refusing a key given twice in one mapping (YAML keeps the last one silently: a
    preset's `batch_sizes` written twice would measure the second list with nothing said) and aliases (`*name`:
    nested ones expand a file of a few hundred bytes into gigabytes; a preset has no use for them)."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.events.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(None, None, f"alias *{event.anchor}: aliases are not accepted here, "
                                              "write the value out", event.start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, collections.abc.Hashable):  # the base loader refuses it, naming it
                continue
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"key {key!r} appears twice", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep)


def load_user_yaml(text: str):
    """A user's YAML file (a preset, class map, campaign, gates): `yaml.safe_load`, and a key given twice in one
    mapping is a yaml.YAMLError naming it and its line, as any other mistake of the file."""
    return yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader subclass)


def yaml_problem(exc: BaseException) -> str:
    """What a YAML (or reading) error says, with its line and column: 'at line 3, column 1 (key 'a' appears
    twice)'."""
    mark = getattr(exc, "problem_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    problem = getattr(exc, "problem", None) or (exc.strerror if isinstance(exc, OSError) else type(exc).__name__)
    return f"{where} ({problem})"


def output_file_problem(path: Path) -> str | None:
    """Why a file cannot be written at `path` (a folder there, a file where a folder of its path should be, a
    folder that is not writable); None when it can. For the commands that write an output the user names: checked
    before their work, not found after it."""
    path = Path(path).expanduser()
    if path.is_dir():
        return "is a folder"
    if path.exists() and not path.is_file():  # a FIFO or a device: writing would block or go elsewhere
        return "is not a regular file"
    ancestor = path.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        return f"is under {ancestor}, a file"
    if not os.access(ancestor, os.W_OK | os.X_OK):
        return f"cannot be written ({ancestor} is not writable)"
    if ancestor == path.parent:  # where the write makes its temp file: tried (root passes os.access on /proc)
        try:
            fd, probe = tempfile.mkstemp(dir=ancestor, prefix=f".{path.name}.", suffix=".probe")
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            return f"cannot be written in {ancestor} ({exc.strerror or exc})"
    return None


def atomic_write_bytes(path: Path, data: bytes) -> Path:
    """Write `data` to `path` atomically. A full disk is a DiskFullError naming `path`; the temp file is
    removed whatever happens, so a failed write leaves the previous version (or nothing) in place. A symlink at
    `path` is followed: the file it points to is replaced, the link kept."""
    path = _followed(Path(path))
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


def _followed(path: Path) -> Path:
    """`path`, or the file a symlink there points to (a user's output linked into, say, a web root: replacing the
    link with a file would leave that file stale while the command says it wrote it). A link to nothing is replaced
    itself: nothing is created where it points."""
    return Path(os.path.realpath(path)) if path.is_symlink() and path.is_file() else path


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


def json_text(obj, destination: object, indent: int | None = 2) -> str:
    """`obj` as JSON text. NaN/inf are refused (NonFiniteNumberError naming the JSON path and `destination`),
    never turned into null: null means "not measured" and is written only where the caller put None; and JSON has
    no NaN (Python writes one that other parsers refuse)."""
    try:
        text = json.dumps(obj, indent=indent, allow_nan=False)
    except ValueError as exc:
        found = _first_non_finite(obj)
        if found is None:
            raise
        where, value = found
        raise NonFiniteNumberError(
            f"refusing to write {destination}: {where} is {value}, not a number (a bug upstream: an unmeasured "
            "value must be None, and a computed one finite); nothing was written") from exc
    # an array of numbers on one line, not one line a number: a sustained run's batch times stay a few MB
    return text if indent is None else _NUMBER_ARRAY.sub(_one_line, text)


_SCALAR = r"(?:-?\d[\d.eE+-]*|null|true|false)"
_NUMBER_ARRAY = re.compile(rf"\[\n(?:[ ]*{_SCALAR},\n)*[ ]*{_SCALAR}\n[ ]*\]")


def _one_line(match: re.Match) -> str:
    return "[" + ", ".join(line.strip().rstrip(",") for line in match.group(0)[1:-1].split("\n") if line.strip()) + "]"


def atomic_write_json(path: Path, obj, indent: int | None = 2) -> Path:
    """Write `obj` as JSON atomically (`json_text`: NaN/inf refused)."""
    return atomic_write_bytes(path, (json_text(obj, path, indent) + "\n").encode("utf-8"))


def atomic_write_csv(path: Path, header: list[str], rows: list[list]) -> Path:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows(rows)
    return atomic_write_bytes(path, buffer.getvalue().encode("utf-8"))

class JsonArrayWriter:
    """`with JsonArrayWriter(path) as out: out.extend(items)`: `path` appears only when the block ends
    without an exception. NaN/inf are refused as in `atomic_write_json`."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.count = 0

    def __enter__(self) -> JsonArrayWriter:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self._storage():
            fd, self._tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp")
        os.chmod(self._tmp, 0o666 & ~_UMASK)
        self._fh = os.fdopen(fd, "w", encoding="utf-8")
        try:
            with self._storage():
                self._fh.write("[")
        except BaseException:
            self._discard()
            raise
        return self

    @contextlib.contextmanager
    def _storage(self) -> Iterator[None]:
        """A full disk (or file-size limit) while writing this file: a DiskFullError naming it."""
        try:
            yield
        except OSError as exc:
            if exc.errno in DISK_FULL_ERRNOS:
                raise DiskFullError(self.path, exc) from exc
            raise

    def _discard(self) -> None:
        """The temp file closed and removed (after a failure, or after the rename, when it is gone already)."""
        with contextlib.suppress(OSError):
            self._fh.close()  # its buffered bytes may not fit either
        Path(self._tmp).unlink(missing_ok=True)

    def extend(self, items: list) -> None:
        """Append `items` to the array."""
        if not items:
            return
        try:
            text = ",".join(json.dumps(item, allow_nan=False) for item in items)
        except ValueError as exc:
            raise NonFiniteNumberError(f"refusing to write {self.path}: an item holds NaN or inf (a bug upstream); "
                                       "nothing was written") from exc
        self.extend_encoded([text], len(items))

    def extend_encoded(self, texts: list[str], count: int | None = None) -> None:
        """Append items already encoded as JSON texts (`count` items in all; default one per text)."""
        if not texts:
            return
        with self._storage():
            self._fh.write(("," if self.count else "") + ",".join(texts))
        self.count += len(texts) if count is None else count

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        try:
            if exc_type is None:
                with self._storage():
                    self._fh.write("]\n")
                    self._fh.flush()
                    os.fsync(self._fh.fileno())
                    self._fh.close()
                os.replace(self._tmp, self.path)
        finally:
            self._discard()  # the temp file is gone already after a successful rename


@contextlib.contextmanager
def atomic_text(path: Path) -> Iterator[io.TextIOBase]:
    """`with atomic_text(path) as fh:` write UTF-8 text a piece at a time (never the whole file held as one string);
    `path` appears only when the block ends without an exception, fsynced, as `atomic_write_bytes` writes it; a full
    disk is a DiskFullError naming `path`."""
    path = _followed(Path(path))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8", newline="") as fh:
                os.chmod(tmp, 0o666 & ~_UMASK)
                yield fh
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
        finally:
            Path(tmp).unlink(missing_ok=True)
    except OSError as exc:
        if exc.errno in DISK_FULL_ERRNOS:
            raise DiskFullError(path, exc) from exc
        raise


@contextlib.contextmanager
def atomic_file(path: Path, suffix: str = ".part") -> Iterator[str]:
    """`with atomic_file(path) as tmp:` a library writes `tmp` (a path string in the same folder); it becomes
    `path` only when the block ends without an exception, and is removed otherwise."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
    os.close(fd)
    os.chmod(tmp, 0o666 & ~_UMASK)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_folder(folder: Path) -> Iterator[Path]:
    """`with atomic_folder(folder) as tmp:` fill the folder `tmp` (beside `folder`); it becomes `folder` as a whole
    when the block ends without an exception (a converter's cache entry is complete or absent). An entry another
    process finished meanwhile is kept, never removed from under its readers; a damaged entry is for its reader to
    remove before converting again."""
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=folder.parent, prefix=f".{folder.name}."))
    os.chmod(tmp, 0o777 & ~_UMASK)  # mkdtemp makes it private; a cache entry is meant to be shared
    try:
        yield tmp
        try:
            os.rename(tmp, folder)
        except OSError as exc:  # the folder is there: another process finished the same entry first, keep it
            if exc.errno not in (errno.EEXIST, errno.ENOTEMPTY) or not folder.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def same_file_as(source: Path, dest: Path) -> Path:
    """`dest` holding `source`'s bytes, atomically: a hard link where the file system has them (a second name for
    the same bytes, no copy in memory or on disk; files here are never written in place, only replaced), else a
    streamed copy."""
    dest = Path(dest)
    tmp = dest.parent / f".{dest.name}.{os.getpid()}.link.tmp"
    tmp.unlink(missing_ok=True)
    try:
        os.link(source, tmp)
    except OSError:  # no hard links here (another file system, FAT, some network mounts)
        try:
            shutil.copyfile(source, tmp)
            with open(tmp, "rb+") as fh:
                os.fsync(fh.fileno())  # a full disk may answer only here (delayed allocation)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            if exc.errno in DISK_FULL_ERRNOS:
                raise DiskFullError(dest, exc) from exc
            raise
    try:
        os.replace(tmp, dest)
    finally:
        tmp.unlink(missing_ok=True)
    return dest


def move_into_place(source: Path | str, dest: Path) -> Path:
    """Rename a finished file or folder (written by a library or an extraction) to its final name."""
    os.replace(source, dest)
    return Path(dest)


def replace_folder(incoming: Path, dest: Path) -> Path:
    """A finished folder `incoming` (beside `dest`) becomes `dest`, the old one removed first. Two steps: cut
    short between them, `dest` is gone and `incoming` whole, which its caller finishes on its next pass."""
    shutil.rmtree(dest, ignore_errors=True)
    os.rename(incoming, dest)
    return Path(dest)


def write_cache_file(path: Path, data: bytes) -> bool:
    """Best effort for caches: atomically, but a cache that cannot be written (read-only home) only costs the
    next run a recount. Returns whether it was written."""
    try:
        atomic_write_bytes(path, data)
    except (OSError, DiskFullError):  # a full cache disk too: the run's own folder may have room
        return False
    return True


def file_identity(path: Path) -> object:
    """The file a path names: its (device, inode) where it can be read, else the path; two names of one file (a
    hard link) are one identity."""
    try:
        st = Path(path).stat()
    except OSError:
        return path
    # a file system without stable file ids (some network and FAT mounts) says 0 for every file
    return (st.st_dev, st.st_ino) if st.st_ino else os.path.normcase(os.path.abspath(path))


def file_sha256(path: Path) -> str:
    """SHA-256 of a file's bytes, read in 1 MiB chunks."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class DownloadError(VaBenchError):
    """A download that failed (network, server): exit 1, not a usage error."""


def check_base_url(base_url: str, default: str) -> None:
    """A UsageError unless `base_url` is an http(s):// or file:// URL (urllib would try an ftp:// one for a minute,
    and take a bare host for a scheme)."""
    url = urllib.parse.urlsplit(base_url)
    if not (url.scheme in ("http", "https") and url.netloc or url.scheme == "file" and url.path):
        raise UsageError(f"--base-url {base_url!r} is not an http(s):// or file:// URL; give the mirror's URL "
                         f"(default: {default})")


def download(url: str, dest: Path, timeout: float = 60.0,
             check: Callable[[Path], str | None] | None = None) -> Path:
    """Download `url` to `dest` atomically; never a partial file under the final name. A body shorter than the
    Content-Length the server announced (http.client returns a cut connection's bytes without an error), a web
    page where a file was asked for, or a file `check` finds a problem in (its reason), is a DownloadError and
    leaves nothing."""
    fix = "check the URL and the network, or give a mirror with --base-url"
    try:
        with atomic_file(dest) as tmp:
            with open(tmp, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as response:
                if (response.headers.get_content_type() or "").startswith("text/html"):
                    raise DownloadError(f"{url} answered with a web page, not the file; {fix}")
                shutil.copyfileobj(response, out)
                announced, got = response.headers.get("Content-Length"), out.tell()
                out.flush()
                os.fsync(out.fileno())  # a full disk may answer only here (delayed allocation)
            if announced is not None and announced.isdigit() and got != int(announced):
                raise DownloadError(f"the download of {url} stopped after {got} of {announced} bytes; run the same "
                                    "command again")
            problem = check(Path(tmp)) if check is not None else None
            if problem:
                raise DownloadError(f"{url} gave a file that {problem}; {fix}")
    except OSError as exc:
        if exc.errno in DISK_FULL_ERRNOS:  # the disk, not the network: nothing was left under dest
            raise DiskFullError(dest, exc, f"free space in {dest.parent}, or set $VA_BENCH_WEIGHTS to another "
                                "disk") from exc
        raise DownloadError(f"could not download {url} ({exc}); {fix}") from exc
    return dest
