"""Where the harness's code comes from: the source checkout it runs from, or an installed build that recorded the
commit it was built from. A submission names its code by commit (`repro.harness_commit`); an installed package has
no git, so `setup.py` writes the commit into the wheel. Standard library only: setup.py loads this file by path.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
BUILD_INFO_FILE = "_build_info.json"  # written into a built package only, never into the checkout


def source_tree() -> Path | None:
    """The checkout the harness runs from (the folder that holds its pyproject.toml beside `harness/`), or None
    for an installed package, whose parent folder is site-packages."""
    root = PACKAGE_DIR.parent
    return root if (root / "pyproject.toml").is_file() else None


def source_sha256(package_dir: Path = PACKAGE_DIR) -> str:
    """SHA-256 over the harness package's files (relative path and bytes, sorted), the build's record left out.
    Git's dirty flag is a bool, so two checkouts with different uncommitted edits would look alike without this."""
    digest = hashlib.sha256()
    files = (p for p in package_dir.rglob("*") if p.is_file() and "__pycache__" not in p.parts
             and p.relative_to(package_dir).as_posix() != BUILD_INFO_FILE)
    for path in sorted(files):
        digest.update(path.relative_to(package_dir).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def git_state(root: Path) -> tuple[str, bool | None]:
    """(commit, dirty) of the git checkout whose top folder is `root`; ("unknown", None) when `root` is not the top
    of a checkout (a copy inside some other repository, whose commit says nothing about this code) or git fails."""
    def git(*args: str) -> str | None:
        try:
            return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True,
                                  timeout=10, check=True).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return None

    top = git("rev-parse", "--show-toplevel")
    if not top or Path(top).resolve() != root.resolve():
        return "unknown", None
    commit = git("rev-parse", "HEAD")
    if not commit:
        return "unknown", None
    status = git("status", "--porcelain", "--untracked-files=no")
    return commit, (None if status is None else bool(status))


def write_build_info(package_dir: Path, source_root: Path) -> None:
    """Record in a built package the commit of the checkout it was built from, whether that checkout had
    uncommitted changes, and the hash of the package's files as built (nothing when git cannot say)."""
    commit, dirty = git_state(source_root)
    if commit == "unknown":
        return
    info = {"commit": commit, "dirty": dirty, "source_sha256": source_sha256(package_dir)}
    (package_dir / BUILD_INFO_FILE).write_text(json.dumps(info, indent=1) + "\n")


def installed_build(package_dir: Path = PACKAGE_DIR) -> tuple[str, bool | None]:
    """(commit, dirty) an installed package's build recorded: dirty also when its files changed after the build
    (their hash differs); ("unknown", None) without a readable record."""
    try:
        info = json.loads((package_dir / BUILD_INFO_FILE).read_text(encoding="utf-8"))
        commit, dirty, built = info["commit"], info["dirty"], info["source_sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return "unknown", None
    if not isinstance(commit, str) or not isinstance(built, str) or dirty not in (True, False, None):
        return "unknown", None
    return commit, True if source_sha256(package_dir) != built else dirty


def harness_commit() -> tuple[str, bool | None]:
    """(commit, dirty) of the code running now: its checkout's git state, or what its installed build recorded."""
    root = source_tree()
    return git_state(root) if root is not None else installed_build()
