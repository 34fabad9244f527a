"""Which build of the harness a process runs: version, git commit, a hash of the harness's own source
files, and the versions of the packages that change the numbers. A fleet refuses nodes whose build
differs from the driver's: mixed builds make incomparable numbers."""

from __future__ import annotations

import hashlib
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from harness import __version__
from harness.measure.env import CORE_PACKAGES, git_state, package_versions

HARNESS_DIR = Path(__file__).resolve().parents[1]
FLEET_PACKAGES = ("ray",)  # beside harness.measure.env.CORE_PACKAGES: the fleet's own engine


def source_sha256(root: Path = HARNESS_DIR) -> str:
    """SHA-256 over the harness package's files (relative path and bytes, sorted). Git's dirty flag is a
    bool, so two checkouts with different uncommitted edits would look alike without this."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()


def build_fingerprint() -> dict:
    """This process's build: harness version, commit, dirty flag, source hash and package versions."""
    commit, dirty = git_state()
    packages = package_versions(CORE_PACKAGES)  # not the runtimes one machine has and another cannot
    if packages.get("onnxruntime") == "not-installed":  # a GPU machine's build of it (one package, two names)
        packages["onnxruntime"] = package_versions(("onnxruntime-gpu",))["onnxruntime-gpu"]
    for name in FLEET_PACKAGES:
        try:
            packages[name] = version(name)
        except PackageNotFoundError:
            packages[name] = "not-installed"
    return {"harness_version": __version__, "harness_commit": commit, "harness_dirty": dirty,
            "harness_source_sha256": source_sha256(), "packages": packages}


def build_differences(expected: dict, actual: dict) -> list[str]:
    """What differs between two fingerprints, as 'what: expected -> actual' (empty when they match)."""
    out = []
    for key in ("harness_version", "harness_commit", "harness_dirty", "harness_source_sha256"):
        if expected.get(key) != actual.get(key):
            name = key.replace("_", " ").replace("sha256", "hash")
            out.append(f"{name} {_short(expected.get(key))} -> {_short(actual.get(key))}")
    want, got = expected.get("packages", {}), actual.get("packages", {})
    for name in sorted(set(want) | set(got)):
        if want.get(name) != got.get(name):
            out.append(f"{name} {want.get(name, 'absent')} -> {got.get(name, 'absent')}")
    return out


def _short(value) -> str:
    text = str(value)
    return text[:12] if len(text) == 40 or len(text) == 64 else text  # commits and hashes: their prefix
