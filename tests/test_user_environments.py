"""The environments users run va-bench in: CI that forces colour, terminals that cannot show every character or
report no width, C locales, inherited thread limits, read-only homes, group-shared folders."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

from conftest import CORPUS, REPO, requires_coco, requires_corpus, run_in_process


def cli(*args: str, env: dict[str, str], cwd: Path = REPO) -> subprocess.CompletedProcess:
    """A real interpreter: stream encodings and the locale are fixed when it starts."""
    return subprocess.run([sys.executable, "-m", "harness", *args], capture_output=True, text=True, cwd=cwd,
                          env={**os.environ, "PYTHONPATH": str(REPO), **env}, timeout=300)


@requires_corpus
def test_json_stays_json_and_figures_stay_whole_in_any_terminal():
    submissions = str(CORPUS / "submissions")
    forced = cli("aggregate", submissions, "--json", env={"FORCE_COLOR": "1", "COLUMNS": "0"})
    assert forced.returncode == 0, forced.stderr
    board = json.loads(forced.stdout)  # no colour codes, however sure rich is of a terminal
    # a terminal that cannot show Δ or ·, 60 columns wide: every line there, each figure to its last digit
    narrow = cli("aggregate", submissions, env={"PYTHONIOENCODING": "ascii", "COLUMNS": "60"})
    assert narrow.returncode == 0, narrow.stderr
    for row in board["leaderboard"][:10]:
        assert f"{row['accuracy_shown']:.4f}" in narrow.stdout, row["model"]
    assert "d points" in narrow.stdout and "\\u" not in narrow.stdout  # the gate header: a stand-in for Δ


def test_a_terminal_reporting_no_width_still_shows_output_and_errors():
    assert cli("--version", env={"COLUMNS": "0"}).stdout.startswith("va-bench ")
    missing = cli("report", "/nonexistent-run", env={"COLUMNS": "0"})
    assert missing.returncode == 2 and "no such folder" in missing.stderr


@requires_coco
def test_a_c_locale_reads_utf8_presets(tmp_path):
    preset = tmp_path / "preset.yaml"
    preset.write_text("# réglages de l'équipe\nmodels: [yolox-nano]\nbatch_sizes: [1]\nlimit: 2\n", encoding="utf-8")
    done = cli("run", "--config", str(preset), "--dry-run", "--output-dir", str(tmp_path / "out"),
               env={"LC_ALL": "C", "LANG": "C", "PYTHONUTF8": "0", "PYTHONCOERCECLOCALE": "0"})
    assert done.returncode == 0, done.stderr[-1000:]


def test_an_inherited_thread_limit_is_warned_about(monkeypatch):
    from harness.config import RunConfig
    from harness.run.scheduler import inherited_thread_limit

    usable = len(os.sched_getaffinity(0))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.delenv("MKL_NUM_THREADS", raising=False)
    warning = inherited_thread_limit(RunConfig(), 1)
    if usable == 1:
        assert warning is None  # one thread is all there is
        return
    assert warning is not None and "OMP_NUM_THREADS=1" in warning and f"1 of the {usable} CPUs" in warning
    assert inherited_thread_limit(RunConfig(threads=1), 1) is None  # asked for: no warning
    monkeypatch.delenv("OMP_NUM_THREADS")
    assert inherited_thread_limit(RunConfig(), 1) is None  # fewer threads, but not from the environment


def test_a_weights_cache_that_cannot_be_written_is_refused_before_the_run(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = tmp_path / "out"
    done = run_in_process("run", "--model", "yolox-nano", "--backend", "torchscript", "--batch-sizes", "1",
                          "--output-dir", str(out), env={"VA_BENCH_WEIGHTS": str(blocker / "weights")})
    assert done.returncode == 2 and "VA_BENCH_WEIGHTS" in done.stderr and "weights cache" in done.stderr
    assert not out.exists()


def test_files_a_teammate_needs_follow_the_umask(tmp_path):
    from harness.records import Cell, LoadKey
    from harness.report.log import append_section
    from harness.run.state import LOCK_FILE, RunState

    old = os.umask(0o002)
    try:
        RunState.create(tmp_path / "r", "r", {"config": {}}, [Cell(LoadKey("m", "pytorch", "fp32", (64, 64)), 1)])
        append_section(tmp_path / "log.md", "<!-- va-bench run r -->\n## r\n", "r", "s")
    finally:
        os.umask(old)
    for path in (tmp_path / "r" / LOCK_FILE, tmp_path / "log.md"):  # (atomic writes read the umask at import)
        assert stat.S_IMODE(path.stat().st_mode) & 0o060 == 0o060, path.name  # group read and write


def test_a_read_only_cache_that_exists_still_serves_what_it_holds(tmp_path, monkeypatch):
    """A pre-filled, read-only weights cache (a cluster's shared one): not refused at plan time (its conversions are
    read); the run warns that a conversion it lacks fails."""
    from harness.run import plan as planning

    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setattr(planning, "cache_problem", lambda: f"the weights cache {cache} cannot be written")
    done = run_in_process("run", "--model", "yolox-nano", "--backend", "torchscript", "--batch-sizes", "1",
                          "--dry-run", "--output-dir", str(tmp_path / "out"), env={"VA_BENCH_WEIGHTS": str(cache)})
    assert done.returncode == 0, done.stderr


def test_a_terminal_that_says_zero_columns_gets_the_default_width(monkeypatch):
    from harness.views import output

    monkeypatch.setattr(output.os, "get_terminal_size", lambda fd: os.terminal_size((0, 0)))
    assert output._terminal_width(sys.stdout, 80) == 80
    monkeypatch.setattr(output.os, "get_terminal_size", lambda fd: os.terminal_size((132, 40)))
    assert output._terminal_width(sys.stdout, 80) == 132
