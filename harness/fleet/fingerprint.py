"""Which build of the harness a process runs: version, git commit, a hash of the harness's own source
files, and the versions of the packages that change the numbers. A fleet refuses nodes whose build
differs from the driver's: mixed builds make incomparable numbers."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

from harness import __version__
from harness.build_info import harness_commit, source_sha256
from harness.measure.env import CORE_PACKAGES, package_versions

FLEET_PACKAGES = ("ray",)  # beside harness.measure.env.CORE_PACKAGES: the fleet's own engine


def build_fingerprint() -> dict:
    """This process's build: harness version, commit, dirty flag, source hash and package versions."""
    commit, dirty = harness_commit()
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
