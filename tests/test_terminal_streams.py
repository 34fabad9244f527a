"""Streams users really hand va-bench: a reader that stopped reading (`| head`, `| true`), a closed stdout, a dumb
terminal, an ASCII-only terminal of 80 columns, and a folder name that is not UTF-8. Each test runs in seconds."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import COCO_DIR, CORPUS, REPO, requires_coco, requires_corpus

SYNTHETIC_PLUGIN = REPO / "tests" / "plugins" / "synthetic_detector.py"


def cli(*args: str, env: dict[str, str] | None = None, **streams) -> subprocess.CompletedProcess:
    streams = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, **streams}
    return subprocess.run([sys.executable, "-m", "harness", *args], cwd=REPO, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})}, **streams)


def broken_pipe() -> int:
    """The write end of a pipe whose reader is already gone: every write to it is EPIPE."""
    read, write = os.pipe()
    os.close(read)
    return write


def _corpus_pair() -> tuple[Path, Path]:
    files = sorted((CORPUS / "submissions").glob("*.json"))
    return files[0], files[1]


def test_a_reader_gone_from_stderr_keeps_the_exit_code_of_the_error():
    """Bad input is exit 2 even when nobody reads the error line (rich's on_broken_pipe made it 1)."""
    write = broken_pipe()
    try:
        done = cli("validate", "/nonexistent-submissions", stderr=write)
    finally:
        os.close(write)
    assert done.returncode == 2


@requires_corpus
def test_a_reader_gone_from_stderr_leaves_the_json_on_stdout():
    """A deprecation line that cannot be written must not send stdout (the --json document) to /dev/null."""
    a, b = _corpus_pair()
    write = broken_pipe()
    try:
        done = cli("compare", str(a), str(b), "--json", "--iou", "0.5", stderr=write)
    finally:
        os.close(write)
    assert done.returncode == 0
    assert json.loads(done.stdout)["comparisons"]


@pytest.mark.parametrize("args", [("--version",), ("schema",)])
def test_a_reader_gone_from_stdout_is_not_exit_1(args):
    """`va-bench ... | head -1`: exit 1 means a problem found (a failed cell, validation errors, a gate); a reader
    that stopped reading is the shell's SIGPIPE status, 128 + 13, with no traceback or 'Exception ignored'."""
    write = broken_pipe()
    try:
        done = cli(*args, stdout=write)
    finally:
        os.close(write)
    assert done.returncode == 128 + signal.SIGPIPE, done.stderr
    assert b"Traceback" not in done.stderr and b"Exception ignored" not in done.stderr


def test_schema_with_stdout_closed_is_not_an_error():
    """`va-bench schema >&-`: like every other command, nothing to print to is not an AttributeError line."""
    done = cli("schema", stdout=None, preexec_fn=lambda: os.close(1))
    assert done.returncode == 0 and b"error" not in done.stderr, done.stderr


def test_a_dumb_terminal_gets_plain_progress_lines(monkeypatch):
    """TERM=dumb (Emacs shell, some CI ptys): rich's live bars draw nothing there, so a run showed blank lines."""
    from rich.console import Console

    from harness.views.output import progress_for
    from harness.views.progress import PlainProgress, RichProgress

    monkeypatch.setenv("TERM", "dumb")
    assert isinstance(progress_for(Console(file=io.StringIO(), force_terminal=True)), PlainProgress)
    monkeypatch.setenv("TERM", "xterm-256color")
    assert isinstance(progress_for(Console(file=io.StringIO(), force_terminal=True)), RichProgress)


@requires_corpus
def test_an_ascii_terminal_of_80_columns_gets_lines_of_80_columns():
    """Where Δ, −, ≥, · cannot be shown, the summary still fits the width rich laid it out for."""
    a, b = _corpus_pair()
    done = cli("compare", str(a), str(b), env={"PYTHONIOENCODING": "ascii", "COLUMNS": "80"})
    assert done.returncode == 0, done.stderr
    wide = [line for line in done.stdout.decode("ascii").splitlines() if len(line) > 80]
    assert not wide, wide


@requires_corpus
def test_a_recorded_name_that_is_not_utf8_does_not_stop_the_report(tmp_path):
    """A run folder under a name whose bytes are not UTF-8 (or any non-ASCII name under LC_ALL=C PYTHONUTF8=0) is
    recorded with lone surrogates in repro.command; `report` then refused the run in every locale."""
    from harness.report.run_report import make_report

    source = sorted((CORPUS / "submissions").glob("yolox-s__onnx__cuda__jetson_orin__*.json"))[0]
    doc = json.loads(source.read_text(encoding="utf-8"))
    doc["repro"] = {"command": "va-bench run --output-dir /data/r\udce9sultats", "argv": ["/data/r\udce9sultats"]}
    run = tmp_path / "run"
    (run / "submissions").mkdir(parents=True)
    (run / "submissions" / source.name).write_text(json.dumps(doc), encoding="utf-8")
    outcome = make_report(run, None, None)
    assert outcome.html.is_file()


def test_a_name_that_is_not_utf8_is_recorded_as_escapes():
    """What a run records of its command line (repro.argv, repro.command) holds a non-UTF-8 name's bytes as
    backslash escapes, which every UTF-8 reader takes; UTF-8 names as they are."""
    from harness.shell import recordable

    assert recordable("/data/r\udce9sultats") == "/data/r\\xe9sultats"
    assert recordable("/data/résultats") == "/data/résultats"
    json.dumps(recordable("/data/r\udce9sultats")).encode("utf-8")


@requires_coco
def test_json_stdout_holds_the_document_alone_whatever_a_library_prints(tmp_path):
    """A library that prints while a `--json` command runs (NNCF's calibration bars did, on a fresh int8 run), from
    Python or straight to the file descriptor from C, lands on stderr: stdout parses as the document."""
    plugin = tmp_path / "noisy_detector.py"
    plugin.write_text(
        "import importlib.util, os\n"
        f"spec = importlib.util.spec_from_file_location('synthetic_detector', {str(SYNTHETIC_PLUGIN)!r})\n"
        "synthetic = importlib.util.module_from_spec(spec)\n"
        "spec.loader.exec_module(synthetic)\n"
        "def make_detector():\n"
        "    print('a library line from Python', flush=True)\n"
        "    os.write(1, b'a library line from C\\n')\n"
        "    return synthetic.make_detector()\n")
    done = cli("run", "--model", f"{plugin}:make_detector", "--backend", "pytorch", "--subset", "sample", "--limit",
               "2", "--batch-sizes", "1", "--coco-dir", str(COCO_DIR), "--warmup-batches", "1", "--warmup-seconds",
               "0", "--min-timed-batches", "1", "--draw-images", "0", "--no-energy", "--output-dir",
               str(tmp_path / "out"), "--json")
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout)["cells"][0]["status"] == "ok"
    assert b"a library line from Python" in done.stderr and b"a library line from C" in done.stderr


def test_notes_and_unavailable_plots_wrap_at_80_columns():
    """aggregate's and validate's notes, and report's plots that could not be drawn, fit an 80-column terminal
    (they were printed unwrapped: 114 to 285 characters)."""
    from types import SimpleNamespace

    from rich.console import Console

    from harness.views.commands import print_notes, print_report_outcome

    console = Console(file=io.StringIO(), width=80, force_terminal=False)
    print_notes(console, ["/a/long/path/outputs/run-1 is a run folder: reading its submissions/*.json only (4 "
                          "files; 3 other JSON files skipped: run.json, detections, the layer pass's steps)"])
    plot = SimpleNamespace(png=None, title="Energy per image", unavailable="energy unavailable: " + "no source " * 25)
    print_report_outcome(console, SimpleNamespace(html="report.html", pngs=[], plots=[plot], gates=None), None)
    lines = console.file.getvalue().splitlines()
    assert len(lines) > 3 and all(len(line) <= 80 for line in lines), lines


def test_json_with_stderr_closed_still_prints_the_document():
    """`2>&-`: nowhere to send what is not the document; stdout carries it as before (it exited 1)."""
    done = cli("models", "list", "--json", stderr=None, preexec_fn=lambda: os.close(2))
    assert done.returncode == 0 and json.loads(done.stdout)


def test_the_stdout_console_is_stdouts_again_after_a_json_command():
    """The document's console (its stream closed when the command ends) is not left for the next in-process call."""
    from conftest import run_in_process
    from typer.testing import CliRunner

    from harness import cli as va_cli

    assert run_in_process("models", "list", "--json").returncode == 0
    listed = CliRunner().invoke(va_cli.app, ["models", "list"])
    assert listed.exit_code == 0 and "yolox-nano" in listed.output
