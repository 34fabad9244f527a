"""Everything about the package is in pyproject.toml; this file only adds one build step: a built package records
the commit it was built from (harness/_build_info.json), so that an installed va-bench names its code in a
submission as a checkout does (`repro.harness_commit`). A source archive records it too, and a wheel built from the
archive (no git there: `python -m build`, `pip install va-bench.tar.gz`) keeps the archive's record."""

import importlib.util
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = Path(__file__).resolve().parent


def _record(package_dir: Path) -> None:
    spec = importlib.util.spec_from_file_location("_va_bench_build_info", HERE / "harness" / "build_info.py")
    build_info = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(build_info)
    build_info.write_build_info(package_dir, HERE)  # nothing without git: an archive's record stays as it came


class BuildPyRecordingCommit(build_py):
    """setuptools' build_py, then the build's record written into the built package (not for editable
    installs: those run from the checkout, which has git)."""

    def run(self):
        super().run()
        if not getattr(self, "editable_mode", False):
            _record(Path(self.build_lib) / "harness")


class SdistRecordingCommit(sdist):
    """setuptools' sdist, with the record in the archive's package folder."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        _record(Path(base_dir) / "harness")


setup(cmdclass={"build_py": BuildPyRecordingCommit, "sdist": SdistRecordingCommit})
