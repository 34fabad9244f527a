"""Everything about the package is in pyproject.toml; this file only adds one build step: a built package records
the commit it was built from (harness/_build_info.json), so that an installed va-bench names its code in a
submission as a checkout does (`repro.harness_commit`)."""

import importlib.util
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


class BuildPyRecordingCommit(build_py):
    """setuptools' build_py, then the build's record written into the built package (not for editable
    installs: those run from the checkout, which has git)."""

    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        spec = importlib.util.spec_from_file_location("_va_bench_build_info", HERE / "harness" / "build_info.py")
        build_info = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(build_info)
        build_info.write_build_info(Path(self.build_lib) / "harness", HERE)


setup(cmdclass={"build_py": BuildPyRecordingCommit})
