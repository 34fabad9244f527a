"""Which code runs: a checkout names its git commit; an installed package, the commit its build recorded. A wheel
built here is installed into a folder of its own and asked, from another working directory, what it is."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.build_info import BUILD_INFO_FILE, git_state, installed_build, source_sha256, write_build_info

REPO = Path(__file__).resolve().parents[1]
GIT_USER = ["-c", "user.name=va-bench tests", "-c", "user.email=tests@va-bench.invalid"]


def git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *GIT_USER, *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def committed_tree(root: Path) -> str:
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "test tree")
    return git(root, "rev-parse", "HEAD")


def test_a_build_records_its_commit_and_an_edit_after_it_reads_as_dirty(tmp_path):
    source = tmp_path / "src"
    (source / "pkg").mkdir(parents=True)
    (source / "pkg" / "a.py").write_text("A = 1\n")
    commit = committed_tree(source)
    built = tmp_path / "built" / "pkg"
    shutil.copytree(source / "pkg", built)
    write_build_info(built, source)
    assert json.loads((built / BUILD_INFO_FILE).read_text())["commit"] == commit
    assert installed_build(built) == (commit, False)
    assert source_sha256(built) == source_sha256(source / "pkg")  # the record itself is not part of the hash

    (built / "a.py").write_text("A = 2\n")  # edited after the build
    assert installed_build(built) == (commit, True)


def test_a_build_from_a_dirty_tree_says_so_and_no_git_records_nothing(tmp_path):
    source = tmp_path / "src"
    (source / "pkg").mkdir(parents=True)
    (source / "pkg" / "a.py").write_text("A = 1\n")
    commit = committed_tree(source)
    (source / "pkg" / "a.py").write_text("A = 3\n")
    assert git_state(source) == (commit, True)
    write_build_info(source / "pkg", source)
    assert installed_build(source / "pkg") == (commit, True)

    plain = tmp_path / "plain" / "pkg"
    plain.mkdir(parents=True)
    write_build_info(plain, plain.parent)  # not a checkout
    assert not (plain / BUILD_INFO_FILE).exists()
    assert installed_build(plain) == ("unknown", None)


@pytest.mark.parametrize("text", ["{", "[]", '{"commit": 1, "dirty": false, "source_sha256": "x"}',
                                  '{"commit": "abc", "dirty": "no", "source_sha256": "x"}'])
def test_an_unreadable_build_record_is_unknown(tmp_path, text):
    (tmp_path / BUILD_INFO_FILE).write_text(text)
    assert installed_build(tmp_path) == ("unknown", None)


@pytest.mark.parametrize("route", ["wheel", "sdist"])
def test_an_installed_wheel_names_its_commit_and_finds_its_own_files(tmp_path, route):
    """The wheel of a clean checkout (built from it, or from its source archive, where there is no git), installed
    outside it, used from an unrelated folder: its commit is the checkout's, clean; its presets, gates example and
    catalogues are inside it; it looks for COCO in the working directory, not in site-packages."""
    pytest.importorskip("setuptools")
    source = tmp_path / "checkout"
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(REPO / name, source / name)
    shutil.copytree(REPO / "harness", source / "harness",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc", BUILD_INFO_FILE))
    commit = committed_tree(source)
    built_from = str(source)
    if route == "sdist":
        subprocess.run([sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path / "dist")], check=True,
                       capture_output=True, cwd=source)
        (built_from,) = map(str, (tmp_path / "dist").glob("*.tar.gz"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path / "wheel"), built_from], check=True, capture_output=True, cwd=tmp_path)
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
                    *map(str, (tmp_path / "wheel").glob("*.whl"))], check=True, capture_output=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    probe = (
        "import json, harness\n"
        "from harness.build_info import harness_commit, source_tree\n"
        "from harness.config import preset_path\n"
        "from harness.data.coco import default_coco_dirs\n"
        "from harness.report import EXAMPLE_GATES\n"
        "from harness.catalogue import model_ids\n"
        "print(json.dumps({'file': harness.__file__, 'commit': harness_commit(), 'tree': str(source_tree()),\n"
        "  'preset': preset_path('default').is_file(), 'gates': EXAMPLE_GATES.is_file(),\n"
        "  'coco': [str(p) for p in default_coco_dirs()], 'models': len(model_ids())}))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=elsewhere,
                          env={"PYTHONPATH": str(site), "PATH": "/usr/bin:/bin", "HOME": str(tmp_path)})
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert Path(seen["file"]).is_relative_to(site)
    assert seen["commit"] == [commit, False] and seen["tree"] == "None"
    assert seen["preset"] and seen["gates"] and seen["models"] > 0
    assert seen["coco"] == [str(elsewhere / "datasets" / "coco")]
    shipped = {p.relative_to(site / "harness").as_posix() for p in (site / "harness").rglob("*") if p.is_file()}
    ours = {p.relative_to(source / "harness").as_posix() for p in (source / "harness").rglob("*")
            if p.is_file() and "__pycache__" not in p.parts}
    assert ours - shipped == set()  # every file of the package, data files included


def test_a_full_val_run_whose_commit_does_not_pin_its_code_is_warned_at_its_start():
    from harness.run.scheduler import unpublishable_accuracy

    clean = {"harness_commit": "a" * 40, "harness_dirty": False}
    dirty = {"harness_commit": "a" * 40, "harness_dirty": True}
    unknown = {"harness_commit": "unknown", "harness_dirty": None}
    assert unpublishable_accuracy("full", clean) is None
    assert "aaaaaaaaaaaa was dirty" in unpublishable_accuracy("full", dirty)
    assert "is unknown" in unpublishable_accuracy("full", unknown)
    assert unpublishable_accuracy("mini500", dirty) is None  # validate only warns on a subset
