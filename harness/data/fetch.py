"""`va-bench data fetch coco`: download COCO val2017 (images + annotations) into the layout the harness
reads (datasets/README.md), checksum-verified and resumable.

Downloads go to `<dest>/.downloads/<name>.part` and continue where they stopped (an HTTP Range request;
a server that ignores it restarts the file). A finished archive is verified against the SHA-1 the COCO
site publishes before anything is extracted; extraction refuses members that would land outside
`<dest>` and moves each tree into place only once it is complete.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import shutil
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from harness.data.variants import VAL2017_NUM_IMAGES
from harness.errors import UsageError, VaBenchError
from harness.files import atomic_write_json, check_base_url, is_disk_full, move_into_place
from harness.storage import storage_fix

COCO_BASE_URL = "http://images.cocodataset.org"
CHUNK = 1 << 20


@dataclass(frozen=True)
class Archive:
    """One published archive: its path under the base URL, SHA-1 (cocodataset.org's table), what it holds."""

    path: str
    sha1: str
    provides: str  # the folder it extracts into `<dest>`
    only: tuple[str, ...] = ()  # members to extract (default: all); the rest stays in the archive
    files: int | None = None  # the files its folder holds: where all are there, it is not downloaded again

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    def present(self, dest: Path) -> bool:
        """Whether `dest` holds what this archive provides already (extraction is all or nothing, so an earlier
        fetch's folder is whole): its named members, or as many files as the archive holds."""
        if self.only:
            return all((dest / member).is_file() for member in self.only)
        folder = dest / self.provides
        return (self.files is not None and folder.is_dir()
                and sum(1 for p in folder.iterdir() if p.is_file()) >= self.files)


COCO_VAL2017 = (
    Archive("zips/val2017.zip", "4950dc9d00dbe1c933ee0170f5797584351d2a41", "val2017", files=VAL2017_NUM_IMAGES),
    # 241 MB, mostly train2017 annotations the harness never reads: only the val2017 instances are extracted
    Archive("annotations/annotations_trainval2017.zip", "8551ee4bb5860311e79dace7e79cb91e432e78b3", "annotations",
            only=("annotations/instances_val2017.json",)),
)


class FetchError(VaBenchError):
    """A download that failed or did not verify (exit 1: a problem found, not bad usage)."""


def _sha1(path: Path) -> str:
    digest = hashlib.sha1()  # the checksum the COCO site publishes (integrity, not security)
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def download_resumable(url: str, part: Path, progress: Callable[[int, int | None], None] | None = None,
                       timeout: float = 60.0) -> Path:
    """Download `url` into `part`, continuing an earlier partial download when the server honours Range."""
    part.parent.mkdir(parents=True, exist_ok=True)
    have = part.stat().st_size if part.exists() else 0
    request = urllib.request.Request(url, headers={"Range": f"bytes={have}-"} if have else {})
    try:
        response = urllib.request.urlopen(request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and have:  # nothing left to fetch: the part is complete
            return part
        raise FetchError(f"could not download {url} (HTTP {exc.code}); check the URL or try again later") from exc
    except OSError as exc:
        raise FetchError(f"could not download {url} ({exc}); check the network (or --base-url) and run the same "
                         "command again: it continues where it stopped") from exc
    if (response.headers.get_content_type() or "").startswith("text/html"):  # a captive portal, a moved page
        response.close()
        raise FetchError(f"{url} answered with a web page, not the archive; check the URL (or --base-url)")
    with response:
        resumed = have and getattr(response, "status", 200) == 206
        length = response.headers.get("Content-Length")
        total = (int(length) + (have if resumed else 0)) if length is not None else None
        done = have if resumed else 0
        try:
            with open(part, "ab" if resumed else "wb") as out:
                for chunk in iter(lambda: response.read(CHUNK), b""):
                    out.write(chunk)
                    done += len(chunk)
                    if progress is not None:
                        progress(done, total)
        except OSError as exc:
            if is_disk_full(exc):  # the disk, not the connection: what the part holds is kept for the next try
                kept = part.stat().st_size if part.exists() else 0
                raise FetchError(f"{str(exc.strerror or exc).lower()} writing {part} ({kept} bytes of "
                                 f"{total if total is not None else '?'} kept); "
                                 + storage_fix(exc, f"free space in {part.parent} (or give --dest on another disk)")
                                 + ", then run the same command again: it continues where it stopped") from exc
            raise FetchError(f"the download of {url} stopped after {done} bytes ({exc or type(exc).__name__}); "
                             "run the same command again: it continues where it stopped") from exc
        except http.client.HTTPException as exc:  # the connection dropped mid-file
            raise FetchError(f"the download of {url} stopped after {done} bytes ({exc or type(exc).__name__}); "
                             "run the same command again: it continues where it stopped") from exc
    if total is not None and done < total:  # the server closed early without an error: the part is kept
        raise FetchError(f"the download of {url} stopped after {done} of {total} bytes; run the same command "
                         "again: it continues where it stopped")
    return part


def _extract(path: Path, archive: Archive, dest: Path) -> None:
    """Extract the archive's `provides/` tree into dest/provides, all or nothing, no path escapes."""
    provides = archive.provides
    staging = dest / f".{provides}.extracting"
    shutil.rmtree(staging, ignore_errors=True)
    root = staging.resolve()
    with zipfile.ZipFile(path) as zf:
        members = [m for m in zf.infolist() if not archive.only or m.filename in archive.only]
        for member in members:
            target = (staging / member.filename).resolve()
            if root != target and root not in target.parents:
                raise FetchError(f"{path.name}: member {member.filename!r} would land outside {dest}; "
                                 "not extracting it")
        try:
            zf.extractall(staging, members)
        except OSError as exc:  # half a tree holds the space the next try needs: none of it is kept
            shutil.rmtree(staging, ignore_errors=True)
            if is_disk_full(exc):
                need = sum(m.file_size for m in members)
                raise FetchError(f"{str(exc.strerror or exc).lower()} extracting {path.name} into {dest} (it "
                                 f"needs {need / 2**20:.0f} MiB); "
                                 + storage_fix(exc, "free space there (or give --dest on another disk)")
                                 + ", then run the same command again") from exc
            raise FetchError(f"could not extract {path.name} into {dest} ({exc}); nothing of it was kept") from exc
    tree = staging / provides
    if not tree.is_dir():
        raise FetchError(f"{path.name} has no {provides}/ folder; is it the COCO archive?")
    final = dest / provides
    if final.exists():  # a complete earlier copy: merge (the zip never holds fewer files than it)
        for item in tree.iterdir():
            move_into_place(item, final / item.name)
    else:
        move_into_place(tree, final)
    shutil.rmtree(staging, ignore_errors=True)


def fetch_archives(dest: Path, archives: tuple[Archive, ...] = COCO_VAL2017, base_url: str = COCO_BASE_URL,
                   progress: Callable[[str, int, int | None], None] | None = None, keep_archives: bool = False,
                   ) -> list[str]:
    """Download, verify and extract each archive into `dest`; returns one line per archive for the user."""
    check_base_url(base_url, "COCO's own")
    created = not dest.exists()
    if dest.exists() and not dest.is_dir():
        raise UsageError(f"--dest {dest} is not a folder (a file is there); pick another --dest")
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create {dest} ({exc.strerror}); pick another --dest") from exc
    if not os.access(dest, os.W_OK | os.X_OK):  # a read-only mount, or another user's folder
        raise UsageError(f"--dest {dest} cannot be written; pick a folder you can write")
    try:
        return _fetch_into(dest, archives, base_url, progress, keep_archives)
    finally:  # a fetch that got nothing leaves no empty folders behind (a partial download stays, to resume)
        downloads = dest / ".downloads"
        if downloads.is_dir() and not any(downloads.iterdir()):
            downloads.rmdir()
        if created and dest.is_dir() and not any(dest.iterdir()):
            dest.rmdir()


def _fetch_into(dest: Path, archives: tuple[Archive, ...], base_url: str,
                progress: Callable[[str, int, int | None], None] | None, keep_archives: bool) -> list[str]:
    lines = []
    for archive in archives:
        if archive.present(dest):  # 1 GB not fetched twice
            lines.append(f"{archive.name}: already present in {dest / archive.provides} (delete it to fetch it again)")
            continue
        part = dest / ".downloads" / f"{archive.name}.part"
        url = f"{base_url.rstrip('/')}/{archive.path}"
        download_resumable(url, part, (lambda done, total, n=archive.name: progress(n, done, total))
                           if progress else None)
        actual = _sha1(part)
        if actual != archive.sha1:
            part.unlink()
            fix = ("run the command again" if base_url == COCO_BASE_URL else
                   f"check that {base_url} serves COCO's own {archive.path} (a mirror's other build or a page "
                   "does not verify), then run the command again")
            raise FetchError(f"{archive.name}: SHA-1 {actual} is not the published {archive.sha1}; the corrupt "
                             f"download was deleted; {fix}")
        _extract(part, archive, dest)
        if keep_archives:
            move_into_place(part, dest / ".downloads" / archive.name)
        else:
            part.unlink()
        lines.append(f"{archive.name}: SHA-1 {actual} verified, extracted to {dest / archive.provides}")
    if not keep_archives:
        shutil.rmtree(dest / ".downloads", ignore_errors=True)
    return lines


RF100VL_INSTALL = "pip install rf100vl (the optional RF100-VL download; it brings the roboflow client)"


def _fetched_versions(path: Path) -> dict[str, int | str]:
    """The versions an earlier fetch into this folder recorded (none without the file); a file that is not such a
    record is one line."""
    if not path.is_file():
        return {}
    try:
        versions = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError) as exc:
        versions, reason = None, exc.strerror if isinstance(exc, OSError) else "not valid JSON"
    else:
        reason = "not a JSON object of dataset name -> version"
    if not (isinstance(versions, dict) and all(
            isinstance(k, str) and isinstance(v, int | str) and not isinstance(v, bool) for k, v in versions.items())):
        raise UsageError(f"{path}: {reason}; delete it and fetch again (every dataset is then downloaded anew)")
    return versions


def version_number(version_id) -> int | str:
    """A Roboflow version id ("workspace/project/4", or 4) as the site's rows record it: the integer 4 (a string
    "4" would give the row another dataset fingerprint); an id that does not end in a number, as it is."""
    last = str(version_id).rsplit("/", 1)[-1]
    return int(last) if last.isdigit() else last


def fetch_rf100vl(dest: Path, progress: Callable[[str], None] | None = None) -> list[str]:
    """The 100 RF100-VL datasets (COCO format, Roboflow's layout: <dataset>/{train,valid,test}) through the
    `rf100vl` package, each at its latest version, recorded in <dest>/rf100vl_versions.json for campaigns.
    Needs ROBOFLOW_API_KEY: without it the package would ask for a login on the terminal."""
    import importlib

    if not os.environ.get("ROBOFLOW_API_KEY"):
        raise UsageError("RF100-VL downloads need a Roboflow API key: set ROBOFLOW_API_KEY (your key from "
                         "app.roboflow.com settings) and run the command again")
    try:
        rf100vl = importlib.import_module("rf100vl")
    except ImportError as exc:
        raise UsageError(f"the `rf100vl` package is not installed ({exc}); {RF100VL_INSTALL}") from exc
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"cannot create {dest} ({exc.strerror}); pick another --dest") from exc
    versions_file = dest / "rf100vl_versions.json"
    versions = _fetched_versions(versions_file)
    lines = []
    try:
        for dataset in rf100vl.get_rf100vl_projects():
            if dataset.name in versions and (dest / dataset.name).is_dir():  # fetched by an earlier call
                lines.append(f"{dataset.name}: version {versions[dataset.name]} already in {dest / dataset.name}")
                continue
            latest = max((version_number(v.id) for v in dataset.rf_project.versions()),
                         key=lambda n: (isinstance(n, int), n))
            folder = dest / dataset.name
            existed = folder.exists()
            try:
                dataset.download(str(folder))
            except BaseException:  # a download cut short leaves no folder a campaign would take for a dataset
                if not existed:  # one that was there (a copy of the user's) is not this download's to remove
                    shutil.rmtree(folder, ignore_errors=True)
                raise
            versions[dataset.name] = latest
            atomic_write_json(versions_file, dict(sorted(versions.items())))  # after each: resumable
            line = f"{dataset.name}: version {versions[dataset.name]} in {dest / dataset.name}"
            if progress:
                progress(line)
            lines.append(line)
    except UsageError:
        raise
    except Exception as exc:  # the roboflow client's network/auth errors: one line, exit 1
        raise FetchError(f"RF100-VL download stopped ({type(exc).__name__}: {str(exc).splitlines()[0][:200]}); "
                         f"{len(lines)} datasets are in {dest}; run the command again to continue") from exc
    return lines
