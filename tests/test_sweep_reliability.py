"""Sweeps that survive: per-cell isolation, OOM, SIGKILL + --resume, SIGINT, refusals, locks, torch-free records."""

import copy
import csv
import errno
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import COCO_DIR, CORPUS, REPO, requires_coco, run_in_process

from harness.results.site_rules import schema_findings, site_findings

PLUGIN = Path(__file__).parent / "plugins" / "synthetic_detector.py"
SWEEP = ["--backend", "pytorch", "--subset", "sample", "--limit", "16", "--batch-sizes", "1", "2", "4", "8",
         "--coco-dir", str(COCO_DIR), "--warmup-batches", "1", "--warmup-seconds", "0", "--min-timed-batches", "4",
         "--draw-images", "0", "--no-energy"]


# the batch-2 cell's forward waits for the signal: it lands inside that cell however late it is sent
HELD_AT_2 = {"VA_BENCH_TEST_FORWARD_MS": "5", "VA_BENCH_TEST_HOLD_AT": "2"}


def va_bench(*args, env=None):
    return run_in_process(*args, env=env)


def start(*args, env=None):
    return subprocess.Popen([sys.executable, "-m", "harness", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=REPO, env={**os.environ, **(env or {})})


def statuses(run_dir: Path) -> dict[int, str]:
    doc = json.loads((run_dir / "run.json").read_text())
    return {c["batch_size"]: c["status"] for c in doc["cells"]}


def wait_for_ok_cells(run_dir: Path, n: int, proc: subprocess.Popen, timeout: float = 300,
                      then_running: bool = False) -> None:
    """Until n cells are ok (and, with `then_running`, the next cell is running: a signal sent then
    lands inside a cell, not in the bookkeeping between two)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"run ended early: {proc.returncode} {proc.stderr.read()}")
        try:
            states = list(statuses(run_dir).values())
            if sum(s == "ok" for s in states) >= n and (not then_running or "running" in states):
                return
        except (OSError, ValueError):
            pass  # not written yet
        time.sleep(0.05)
    raise AssertionError("cells did not finish in time")


def snapshot(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in run_dir.rglob("*")
            if p.is_file() and p.parent.name in ("submissions", "detections")}


@requires_coco
def test_a_failing_cell_does_not_sink_the_sweep(tmp_path):
    out = tmp_path / "o"
    result = va_bench("run", "--model", f"{PLUGIN}:make_failing_detector", *SWEEP, "--output-dir", str(out),
                      "--run-id", "r1", env={"VA_BENCH_TEST_FAIL": "4:error", "VA_BENCH_TEST_FORWARD_MS": "2"})
    assert result.returncode == 1, result.stderr
    run_dir = out / "r1"
    assert statuses(run_dir) == {1: "ok", 2: "ok", 4: "failed", 8: "ok"}
    cell = next(c for c in json.loads((run_dir / "run.json").read_text())["cells"] if c["batch_size"] == 4)
    assert cell["reason"] == "RuntimeError: synthetic failure at batch size 4"
    assert "synthetic-sleepy pytorch fp32 64 b4" in result.stdout and "failed" in result.stdout
    assert "Traceback" in (run_dir / "errors.log").read_text()
    submissions = sorted((run_dir / "submissions").glob("*.json"))
    assert len(submissions) == 3
    if (CORPUS / "schemas").is_dir():
        schema = json.loads((CORPUS / "schemas" / "submission.v1.json").read_text())
        support = {"models": ["synthetic-sleepy"],
                   "runtimes": [{"backend": "pytorch", "providers": ["cpu"], "precisions": ["fp32"]}]}
        for path in submissions:
            doc = json.loads(path.read_text())
            assert schema_findings(doc, schema) == [] and site_findings(doc, support) == []


@requires_coco
def test_a_cell_failing_in_its_timed_pass_closes_its_measurement_windows(tmp_path, monkeypatch):
    """A stream that raises in the middle of the timed pass: the cell fails, and its memory and device windows
    close with it (left open, the next cell's warm-up was sampled as the failed cell's timing)."""
    from harness.measure.hygiene import DeviceSampler
    from harness.measure.memory import MemoryMonitor

    calls = []
    for cls in (MemoryMonitor, DeviceSampler):
        begin, end = cls.begin_window, cls.end_window
        monkeypatch.setattr(cls, "begin_window", lambda self, tag, begin=begin, n=cls.__name__: (
            calls.append((n, "begin", tag)), begin(self, tag))[1])
        monkeypatch.setattr(cls, "end_window", lambda self, end=end, n=cls.__name__: (
            calls.append((n, "end", None)), end(self))[1])
    out = tmp_path / "o"
    result = va_bench("run", "--model", f"{PLUGIN}:make_failing_detector", *SWEEP, "--output-dir", str(out),
                      "--run-id", "r1", env={"VA_BENCH_TEST_FAIL": "4:error:3", "VA_BENCH_TEST_FORWARD_MS": "2"})
    assert result.returncode == 1, result.stderr
    assert statuses(out / "r1") == {1: "ok", 2: "ok", 4: "failed", 8: "ok"}
    for name in ("MemoryMonitor", "DeviceSampler"):
        events = [(what, tag) for n, what, tag in calls if n == name]
        assert [what for what, _ in events] == ["begin", "end"] * 4, events  # each closed before the next opens
        assert sum(tag is not None and tag.endswith("b4") for _, tag in events) == 1


@requires_coco
def test_a_cell_of_one_full_batch_times_two_and_its_spread_is_a_number(tmp_path):
    """--min-timed-batches 1 on a variant of one full batch: two are timed (the data cycled), so the submission's
    std is a number the site's validator accepts, not null."""
    from harness.results.validate import validate_paths

    out = tmp_path / "o"
    result = va_bench("run", "--model", f"{PLUGIN}:make_detector", "--backend", "pytorch", "--limit", "4",
                      "--batch-sizes", "4", "--coco-dir", str(COCO_DIR), "--warmup-batches", "1", "--warmup-seconds",
                      "0", "--min-timed-batches", "1", "--draw-images", "0", "--no-energy", "--output-dir", str(out),
                      "--run-id", "r1", env={"VA_BENCH_TEST_FORWARD_MS": "2"})
    assert result.returncode == 0, result.stderr
    (path,) = (out / "r1" / "submissions").glob("*.json")
    doc = json.loads(path.read_text())
    assert doc["timing"]["timed_batches"] == 2 and isinstance(doc["timing"]["total_ms"]["std"], float)
    (report,) = validate_paths([path], None).reports
    assert not [f for f in report.errors if f.rule.startswith(("type", "degenerate"))], report.findings


@requires_coco
def test_out_of_memory_skips_the_larger_batch_sizes(tmp_path):
    out = tmp_path / "o"
    result = va_bench("run", "--model", f"{PLUGIN}:make_failing_detector", *SWEEP, "--output-dir", str(out),
                      "--run-id", "r1", "--json", env={"VA_BENCH_TEST_FAIL": "2:oom", "VA_BENCH_TEST_FORWARD_MS": "2"})
    assert result.returncode == 1
    assert statuses(out / "r1") == {1: "ok", 2: "oom", 4: "skipped", 8: "skipped"}
    summary = json.loads(result.stdout)
    assert summary["counts"] == {"ok": 1, "oom": 1, "skipped": 2}
    skipped = [c for c in summary["cells"] if c["status"] == "skipped"]
    assert all(c["reason"] == "batch size 2 ran out of memory" for c in skipped)


@requires_coco
def test_sigkill_then_resume_finishes_the_sweep_and_keeps_finished_files(tmp_path):
    out = tmp_path / "o"
    args = ["--model", f"{PLUGIN}:make_detector", *SWEEP, "--output-dir", str(out)]
    proc = start("run", *args, "--run-id", "killed", env={"VA_BENCH_TEST_FORWARD_MS": "60"})
    run_dir = out / "killed"
    wait_for_ok_cells(run_dir, 2, proc)
    proc.kill()
    proc.wait()
    before = snapshot(run_dir)
    assert json.loads((run_dir / "run.json").read_text())  # consistent after kill -9
    assert set(statuses(run_dir).values()) <= {"ok", "running", "pending"}

    result = va_bench("run", "--resume", "killed", "--output-dir", str(out), env={"VA_BENCH_TEST_FORWARD_MS": "5"})
    assert result.returncode == 0, result.stderr
    assert set(statuses(run_dir).values()) == {"ok"}
    after = snapshot(run_dir)
    assert all(after[name] == data for name, data in before.items())  # finished cells untouched
    assert not list(run_dir.rglob("*.tmp"))
    doc = json.loads((run_dir / "run.json").read_text())
    assert len(doc["resumed"]) == 1

    fresh = va_bench("run", *args, "--run-id", "whole", env={"VA_BENCH_TEST_FORWARD_MS": "5"})
    assert fresh.returncode == 0, fresh.stderr

    def cells(d):
        return {(s["model"]["id"], s["config"]["batch_size"], s["accuracy"]["mAP_50_95"])
                for s in (json.loads(p.read_text()) for p in (out / d / "submissions").glob("*.json"))}

    assert cells("killed") == cells("whole") and len(cells("whole")) == 4


@requires_coco
def test_sigint_stops_cleanly_with_a_resume_hint(tmp_path):
    out = tmp_path / "o"
    proc = start("run", "--model", f"{PLUGIN}:make_detector", *SWEEP, "--output-dir", str(out), "--run-id", "int",
                 env=HELD_AT_2)
    wait_for_ok_cells(out / "int", 1, proc, then_running=True)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130
    lines = [line for line in stderr.splitlines() if line.startswith("interrupted")]
    assert len(lines) == 1 and "--resume int" in lines[0], stderr
    assert "Traceback" not in stderr
    assert not list((out / "int").rglob("*.tmp"))
    states = statuses(out / "int")
    assert "interrupted" in states.values() and states[1] == "ok"


@requires_coco
@pytest.mark.parametrize("sent, code", [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])  # SIGHUP: the terminal closed
def test_sigterm_and_sighup_stop_cleanly(tmp_path, sent, code):
    """With --json, a script still gets the JSON: every cell's status, the finished one's figures, and why it
    stopped."""
    out = tmp_path / "o"
    proc = start("run", "--model", f"{PLUGIN}:make_detector", *SWEEP, "--output-dir", str(out), "--run-id", "t",
                 "--json", env=HELD_AT_2)
    wait_for_ok_cells(out / "t", 1, proc, then_running=True)
    proc.send_signal(sent)
    stdout, _ = proc.communicate(timeout=120)
    assert proc.returncode == code
    assert "interrupted" in statuses(out / "t").values()
    summary = json.loads(stdout)
    by_size = {c["batch_size"]: c for c in summary["cells"]}
    assert by_size[1]["status"] == "ok" and by_size[1]["images_per_s"] > 0 and "--resume t" in summary["interrupted"]
    assert "interrupted" in {c["status"] for c in summary["cells"]}


@requires_coco
def test_resume_refuses_other_options_or_commit_unless_forced(tmp_path):
    out = tmp_path / "o"
    args = ["--model", f"{PLUGIN}:make_failing_detector", *SWEEP, "--output-dir", str(out)]
    env = {"VA_BENCH_TEST_FAIL": "8:error", "VA_BENCH_TEST_FORWARD_MS": "1"}
    assert va_bench("run", *args, "--run-id", "r", env=env).returncode == 1
    other = va_bench("run", "--resume", "r", "--output-dir", str(out), "--min-timed-batches", "9", env=env)
    assert other.returncode == 2 and "min_timed_batches" in other.stderr and "--force" in other.stderr
    # nothing to do without --retry-failed: the failed cell stays failed
    again = va_bench("run", "--resume", "r", "--output-dir", str(out), env=env)
    assert again.returncode == 1 and statuses(out / "r")[8] == "failed"
    fixed = va_bench("run", "--resume", "r", "--output-dir", str(out), "--retry-failed",
                     env={**env, "VA_BENCH_TEST_FAIL": "999:error"})
    assert fixed.returncode == 0, fixed.stderr
    assert set(statuses(out / "r").values()) == {"ok"}
    run_json = out / "r" / "run.json"
    doc = json.loads(run_json.read_text())
    doc["environment"]["harness_commit"] = "0" * 40
    doc["hardware"]["id"] = "another_box"
    run_json.write_text(json.dumps(doc))
    moved = va_bench("run", "--resume", "r", "--output-dir", str(out), env=env)
    # one line names every difference, so that --force accepts what the user read
    assert moved.returncode == 2 and "harness commit" in moved.stderr and "hardware another_box ->" in moved.stderr
    assert va_bench("run", "--resume", "r", "--output-dir", str(out), "--force", env=env).returncode == 0
    missing = va_bench("run", "--resume", "nope", "--output-dir", str(out))
    assert missing.returncode == 2 and "no run nope" in missing.stderr


def test_a_run_folder_is_locked_while_a_process_writes_it(tmp_path):
    from harness.errors import UsageError
    from harness.records import Cell, LoadKey
    from harness.run.state import RunState

    cells = [Cell(LoadKey("m", "pytorch", "fp32", (64, 64)), 1)]
    first = RunState.create(tmp_path / "r", "r", {"config": {}}, cells)
    with pytest.raises(UsageError, match="already exists"):
        RunState.create(tmp_path / "r", "r", {"config": {}}, cells)
    with pytest.raises(UsageError, match="another va-bench process"):
        RunState.reopen(tmp_path / "r", "r", cells, {"config": {}})
    first.close()
    RunState.reopen(tmp_path / "r", "r", cells, {"config": {}}).close()
    # a cell status the harness never writes: the file is not its, nothing to resume from
    run_json = tmp_path / "r" / "run.json"
    doc = json.loads(run_json.read_text())
    doc["cells"][0]["status"] = "banana"
    run_json.write_text(json.dumps(doc))
    with pytest.raises(UsageError, match="m pytorch fp32 64 b1 has status 'banana', not one of pending"):
        RunState.reopen(tmp_path / "r", "r", cells, {"config": {}})


@pytest.mark.parametrize("run_id", ["../x", "/abs", "a/b/c", "..", ".hidden"])
def test_run_ids_cannot_escape_the_output_folder(tmp_path, run_id):
    result = va_bench("run", "--run-id", run_id, "--output-dir", str(tmp_path / "o"))
    assert result.returncode == 2 and "--run-id" in result.stderr and "Traceback" not in result.stderr
    assert not any(tmp_path.iterdir())


def test_records_results_and_validation_load_no_torch_and_no_pipeline():
    code = ("import sys, harness.records, harness.results.validate, harness.results.aggregate, "
            "harness.results.submission, harness.views.tables; "
            "bad = [m for m in sys.modules if m == 'torch' or m.startswith(('torch.', 'harness.pipeline', "
            "'harness.run', 'harness.models'))]; print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_run_path_loads_no_scipy():
    """scipy.stats costs a run ~1 s of imports and ~60 MB: only `compare` uses it."""
    code = ("import sys, harness.cli, harness.run.scheduler, harness.run.executor, harness.eval.coco_eval, "
            "harness.pipeline.pipeline, harness.backends, harness.views.tables; "
            "bad = [m for m in sys.modules if m.split('.')[0] == 'scipy']; print(bad); sys.exit(1 if bad else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


# --- a full disk, energy rows on resume ---------------------------------------------------


class _FullDisk:
    """os.fsync answering ENOSPC, as a full file system does (ext4's delayed allocation reports it at fsync):
    from the `nth` fsync of a submission file on, for every file (`stays_full`) or for that one only."""

    def __init__(self, nth: int, stays_full: bool):
        self.nth, self.stays_full, self.seen, self.full = nth, stays_full, 0, False
        self.real = os.fsync

    def __call__(self, fd: int) -> None:
        target = os.readlink(f"/proc/self/fd/{fd}")
        if "/submissions/" in target:
            self.seen += 1
            if self.seen == self.nth:
                self.full = True
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        if self.full and self.stays_full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.real(fd)


def _cells(run_dir: Path) -> dict[int, dict]:
    return {c["batch_size"]: c for c in json.loads((run_dir / "run.json").read_text())["cells"]}


def _csv_rows(path: Path) -> list[list[str]]:
    with open(path, newline="") as fh:
        return list(csv.reader(fh))[1:]


@requires_coco
@pytest.mark.parametrize("stays_full", [True, False], ids=["disk stays full", "one write fails"])
def test_a_full_disk_stops_the_sweep_cleanly_and_resume_finishes_it(tmp_path, monkeypatch, stays_full):
    """The disk fills while the second cell's submission is written: one line and exit 1, nothing truncated,
    run.json valid; after space is freed a plain --resume runs the rest, and no cell's CSV rows appear twice."""
    out = tmp_path / "o"
    args = ["--model", f"{PLUGIN}:make_detector", "--backend", "pytorch", "--subset", "sample", "--limit", "8",
            "--batch-sizes", "1", "2", "4", "8", "--coco-dir", str(COCO_DIR), "--warmup-batches", "1",
            "--warmup-seconds", "0", "--min-timed-batches", "2", "--draw-images", "0", "--no-layers",
            "--no-profile", "--output-dir", str(out), "--run-id", "r"]  # energy on: energy.csv rows per cell
    env = {"VA_BENCH_TEST_FORWARD_MS": "1"}
    disk = _FullDisk(nth=2, stays_full=stays_full)
    monkeypatch.setattr(os, "fsync", disk)
    result = run_in_process("run", *args, env=env)
    monkeypatch.setattr(os, "fsync", disk.real)  # space freed
    assert result.returncode == 1, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error")]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "no space left on device writing" in lines[0] and "submissions" in lines[0]
    assert "the run stopped after 1 of 4 cells" in lines[0] and "--resume r" in lines[0]
    run_dir = out / "r"
    cells = _cells(run_dir)  # valid JSON: written atomically or not at all
    assert not list(run_dir.rglob("*.tmp")) and not list(run_dir.rglob(".*.tmp"))
    (submission,) = (run_dir / "submissions").glob("*.json")  # the first cell's, whole
    assert json.loads(submission.read_text())["config"]["batch_size"] == 1
    if stays_full:  # nothing more could be recorded: the cell is still `running`, which resume re-runs
        assert {b: c["status"] for b, c in cells.items()} == {1: "ok", 2: "running", 4: "pending", 8: "pending"}
    else:
        assert {b: c["status"] for b, c in cells.items()} == {1: "ok", 2: "interrupted", 4: "pending", 8: "pending"}
        assert cells[2]["reason"] == "no space left on device"
        assert cells[4]["reason"] == cells[8]["reason"] == "not run: no space left on device"
    assert len(_csv_rows(run_dir / "energy.csv")) == 2  # the second cell's window was written before its file

    resumed = run_in_process("run", "--resume", "r", "--output-dir", str(out), env=env)
    assert resumed.returncode == 0, resumed.stderr
    assert {b: c["status"] for b, c in _cells(run_dir).items()} == {1: "ok", 2: "ok", 4: "ok", 8: "ok"}
    assert len(list((run_dir / "submissions").glob("*.json"))) == 4
    tags = [row[1] for row in _csv_rows(run_dir / "energy.csv")]
    assert sorted(tags) == sorted(f"synthetic-sleepy pytorch fp32 64 b{b}" for b in (1, 2, 4, 8))  # none twice
    totals = [row[4] for row in _csv_rows(run_dir / "steps_timer.csv") if row[5] == "total"]
    assert sorted(totals) == ["1", "2", "4", "8"]


def test_resume_drops_the_energy_rows_of_cells_that_did_not_finish(tmp_path):
    from harness.records import Cell, LoadKey
    from harness.run.state import RunState

    cells = [Cell(LoadKey("m", "pytorch", "fp32", (64, 64)), b) for b in (1, 2, 4)]
    state = RunState.create(tmp_path / "r", "r", {"config": {}}, cells)
    (state.run_dir / "submissions").mkdir()
    (state.run_dir / "submissions" / "b1.json").write_text("{}")
    state.set(cells[0], "ok", submission="submissions/b1.json")
    state.set(cells[1], "running")
    state.set(cells[2], "failed", "RuntimeError: x")
    state.save()
    state.close()
    energy = tmp_path / "r" / "energy.csv"
    energy.write_text("timestamp,tag,duration,package-0\n" + "".join(
        f"1.0,{c.label},0.5,{i}\n" for i, c in enumerate(cells)))
    RunState.reopen(tmp_path / "r", "r", cells, {"config": {}}).close()
    assert [row[1] for row in _csv_rows(energy)] == [cells[0].label]  # kept: only the finished cell's
    assert energy.read_text().splitlines()[0] == "timestamp,tag,duration,package-0"


# --- signals and storage at every moment of a run ------------------------------------------


def test_a_resume_forced_onto_other_cells_keeps_the_finished_ones(tmp_path):
    """--force with other batch sizes deleted the finished cells' submissions (not in the new plan: "unowned"). They
    are kept, and run.json's options are the forced ones: a plain resume (the line a Ctrl-C prints) goes on with
    them, and the original options are then another forced change."""
    out = tmp_path / "o"
    assert va_bench("run", *_args(out, "r")).returncode == 0
    run_dir = out / "r"
    before = {p.name: p.read_bytes() for p in (run_dir / "submissions").iterdir()}
    forced = va_bench("run", "--resume", "r", "--output-dir", str(out), "--batch-sizes", "4", "--force")
    assert forced.returncode == 0, forced.stderr
    after = {p.name: p.read_bytes() for p in (run_dir / "submissions").iterdir()}
    assert {k: v for k, v in after.items() if k in before} == before and len(after) == 3
    doc = json.loads((run_dir / "run.json").read_text())
    assert sorted((c["cell"].rsplit(" ", 1)[1], c["status"]) for c in doc["cells"]) == [
        ("b1", "ok"), ("b2", "ok"), ("b4", "ok")]
    assert doc["config"]["batch_sizes"] == [4]  # what the last process ran; the change is the resume's entry's
    (entry,) = doc["resumed"]
    assert entry["forced_differences"] == ["batch_sizes: [1, 2] -> [4]"]
    plain = va_bench("run", "--resume", "r", "--output-dir", str(out))
    assert plain.returncode == 0, plain.stderr
    assert {p.name: p.read_bytes() for p in (run_dir / "submissions").iterdir()} == after
    assert len(json.loads((run_dir / "run.json").read_text())["cells"]) == 3
    back = va_bench("run", "--resume", "r", "--output-dir", str(out), "--batch-sizes", "1", "2")
    assert back.returncode == 2 and "batch_sizes: [4] -> [1, 2]" in back.stderr, back.stderr


def _args(out: Path, run_id: str, *more: str) -> list[str]:
    return ["--model", f"{PLUGIN}:make_detector", "--backend", "pytorch", "--subset", "sample", "--limit", "8",
            "--batch-sizes", "1", "2", "--coco-dir", str(COCO_DIR), "--warmup-batches", "1", "--warmup-seconds", "0",
            "--min-timed-batches", "2", "--draw-images", "0", "--no-energy", "--output-dir", str(out),
            "--run-id", run_id, *more]


def _interrupt_self() -> None:
    os.kill(os.getpid(), signal.SIGINT)


def _owned_submissions(run_dir: Path) -> tuple[set[str], set[str]]:
    """(submission files on disk, submissions of ok cells in run.json)."""
    on_disk = {str(p.relative_to(run_dir)) for p in (run_dir / "submissions").glob("*.json")}
    ok = {c["submission"] for c in _cells(run_dir).values() if c["status"] == "ok"}
    return on_disk, ok


@requires_coco
def test_a_signal_while_a_submission_is_written_waits_for_its_ok_status(tmp_path, monkeypatch):
    """The submission and the ok status in run.json are written together: a signal in between waits for both, so
    no file stands for a cell that run.json calls interrupted (validate and aggregate would take it)."""
    from harness.run import scheduler

    real = scheduler.atomic_write_json
    sent = []

    def write_then_signal(path, doc, *a, **k):
        out = real(path, doc, *a, **k)
        if "submissions" in Path(path).parts and not sent:
            sent.append(path)
            _interrupt_self()
        return out

    monkeypatch.setattr(scheduler, "atomic_write_json", write_then_signal)
    out = tmp_path / "o"
    result = run_in_process("run", *_args(out, "w"), env={"VA_BENCH_TEST_FORWARD_MS": "1"})
    assert result.returncode == 130, result.stderr
    on_disk, ok = _owned_submissions(out / "w")
    assert sent and on_disk == ok and len(ok) == 1  # the first cell: written and ok; the second never started
    assert [c["status"] for c in _cells(out / "w").values()] == ["ok", "pending"]


@requires_coco
def test_a_signal_in_the_layer_pass_leaves_the_cell_to_run_again_with_it(tmp_path, monkeypatch):
    """The group's layer pass belongs to its last cell: stopped there, the cell is not ok (its submission would say
    no layers were asked for), and --resume runs it again, layer pass included."""
    from harness.run.executor import GroupExecutor

    real = GroupExecutor.run_optional_passes

    def interrupted(self, cell, record):
        _interrupt_self()
        return real(self, cell, record)

    monkeypatch.setattr(GroupExecutor, "run_optional_passes", interrupted)
    out = tmp_path / "o"
    env = {"VA_BENCH_TEST_FORWARD_MS": "1"}
    result = run_in_process("run", *_args(out, "l", "--layers", "--layer-batches", "2"), env=env)
    assert result.returncode == 130, result.stderr
    assert [c["status"] for c in _cells(out / "l").values()] == ["ok", "interrupted"]
    assert _owned_submissions(out / "l")[0] == _owned_submissions(out / "l")[1]
    monkeypatch.setattr(GroupExecutor, "run_optional_passes", real)
    resumed = run_in_process("run", "--resume", "l", "--output-dir", str(out), env=env)
    assert resumed.returncode == 0, resumed.stderr
    last = json.loads((out / "l" / _cells(out / "l")[2]["submission"]).read_text())
    assert last["layers"] and last["layers"].get("status") != "failed", last["layers"]
    assert (out / "l" / "layer_timer.csv").is_file()


@requires_coco
def test_a_signal_just_after_the_run_folder_exists_is_resumable(tmp_path, monkeypatch):
    """From the run folder's creation on, a stop says how to resume it (the same command would find the folder and
    refuse), and the resume runs every cell."""
    from harness.measure.hygiene import DeviceSampler

    real = DeviceSampler.for_device

    def interrupted(device):
        _interrupt_self()
        return real(device)

    monkeypatch.setattr(DeviceSampler, "for_device", staticmethod(interrupted))
    out = tmp_path / "o"
    env = {"VA_BENCH_TEST_FORWARD_MS": "1"}
    result = run_in_process("run", *_args(out, "e"), env=env)
    assert result.returncode == 130 and "--resume e" in result.stderr, result.stderr
    assert set(statuses(out / "e").values()) == {"pending"}
    monkeypatch.setattr(DeviceSampler, "for_device", staticmethod(real))
    resumed = run_in_process("run", "--resume", "e", "--output-dir", str(out), env=env)
    assert resumed.returncode == 0 and set(statuses(out / "e").values()) == {"ok"}, resumed.stderr


@requires_coco
def test_a_run_folder_that_becomes_unwritable_stops_the_sweep_with_its_path(tmp_path, monkeypatch):
    """A permission error on a path of the run folder (made read-only mid-run) would fail every later cell too:
    the sweep stops in one line naming the path, and a resume once it is writable finishes it."""
    import tempfile

    real = tempfile.mkstemp
    blocked = []

    def read_only(*a, dir=None, **k):
        if dir is not None and Path(dir).name == "submissions" and blocked:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(dir))
        return real(*a, dir=dir, **k)

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    from harness.run import scheduler

    real_mark = scheduler.Scheduler._mark_ok

    def mark_then_block(self, *a, **k):
        real_mark(self, *a, **k)
        blocked.append(True)

    monkeypatch.setattr(scheduler.Scheduler, "_mark_ok", mark_then_block)
    out = tmp_path / "workspace" / "o"  # a word of the path is no reason to advise freeing space
    env = {"VA_BENCH_TEST_FORWARD_MS": "1"}
    result = run_in_process("run", *_args(out, "ro"), env=env)
    assert result.returncode == 1, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("error")]
    assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
    line = lines[0]
    assert "cannot write" in line and "submissions" in line and "permission denied" in line, line
    assert "stopped after 1 of 2 cells" in line and "make the folder writable" in line and "--resume ro" in line
    assert "free some space" not in line
    cells = _cells(out / "ro")
    assert [c["status"] for c in cells.values()] == ["ok", "interrupted"]
    assert cells[2]["reason"] == "the run folder cannot be written (permission denied)"
    monkeypatch.setattr(tempfile, "mkstemp", real)
    resumed = run_in_process("run", "--resume", "ro", "--output-dir", str(out), env=env)
    assert resumed.returncode == 0 and set(statuses(out / "ro").values()) == {"ok"}, resumed.stderr


@requires_coco
def test_a_full_disk_in_the_layer_pass_stops_the_sweep(tmp_path, monkeypatch):
    """The layer pass writing its tables onto a full disk is not a probe that failed (the cell would be ok, its
    layers "failed", and a resume would never run them): the sweep stops, the cell is interrupted."""
    from harness.run.executor import GroupExecutor

    def full(self, cell, record):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(tmp_path / "o" / "full" / "layer_timer.csv"))

    monkeypatch.setattr(GroupExecutor, "run_optional_passes", full)
    out = tmp_path / "my runs"  # the resume line is one a shell runs as printed
    result = run_in_process("run", *_args(out, "full", "--layers"), env={"VA_BENCH_TEST_FORWARD_MS": "1"})
    assert result.returncode == 1 and "no space left on device" in result.stderr, result.stderr
    assert [c["status"] for c in _cells(out / "full").values()] == ["ok", "interrupted"]  # its group's last cell
    import shlex

    hint = shlex.split(" ".join(result.stderr.split()).split("resume with: ")[1])
    assert hint == ["va-bench", "run", "--resume", "full", "--output-dir", str(out)]


@requires_coco
def test_a_run_folder_removed_mid_run_stops_the_sweep_and_writes_no_run_json_again(tmp_path, monkeypatch):
    """The run folder removed while a cell runs: the sweep stops in one line naming the folder (it failed the cells
    after it one by one), and no run.json makes what the cell's last writes left there look like a run."""
    import shutil

    from harness.run import scheduler

    real = scheduler.Scheduler._write_submission

    def remove_then_write(ctx, record):
        shutil.rmtree(ctx.run_dir)
        return real(ctx, record)

    monkeypatch.setattr(scheduler.Scheduler, "_write_submission", staticmethod(remove_then_write))
    out = tmp_path / "o"
    result = run_in_process("run", *_args(out, "gone"), env={"VA_BENCH_TEST_FORWARD_MS": "1"})
    errors = [line for line in result.stderr.splitlines() if line.startswith("error")]
    assert result.returncode == 1 and len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
    assert f"the run folder {out / 'gone'} was removed or moved" in errors[0] and "put it back" in errors[0]
    assert not (out / "gone" / "run.json").exists(), sorted(p.name for p in (out / "gone").rglob("*"))


def test_a_full_disk_at_the_start_names_the_folder_and_leaves_none(tmp_path, monkeypatch):
    from harness.files import DiskFullError
    from harness.records import Cell, LoadKey
    from harness.run.state import RunState

    def full(fd, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(DiskFullError) as err:
        RunState.create(tmp_path / "r", "r", {"config": {}}, [Cell(LoadKey("m", "pytorch", "fp32", (64, 64)), 1)])
    monkeypatch.undo()
    assert str(tmp_path / "r") in str(err.value) and "free some space" in str(err.value)
    assert not (tmp_path / "r").exists()


def test_an_unwritable_error_log_does_not_hide_the_failure(tmp_path):
    from harness.records import Cell, LoadKey
    from harness.run.state import ERROR_LOG, RunState

    state = RunState.create(tmp_path / "r", "r", {"config": {}}, [Cell(LoadKey("m", "pytorch", "fp32", (64, 64)), 1)])
    (state.run_dir / ERROR_LOG).mkdir()  # open(..., "a") fails
    state.log_error("cell", "Traceback ...")
    state.close()


@requires_coco
def test_repeats_hold_the_run_and_a_stop_among_them_is_finished_on_resume(tmp_path, monkeypatch):
    """--repeats: the run folder stays locked while the extra processes run (a --resume then would rewrite what
    they write); stopped among them, --resume runs them (every ok cell lacks timing.repeats); a killed extra
    process is named by its signal."""
    from harness.run import repeats
    from harness.run.state import lock_folder

    def busy_then_stop(cmd, **kwargs):
        with pytest.raises(Exception, match="being written by another va-bench process"):
            lock_folder(out / "rp", "run rp is being written by another va-bench process")
        _interrupt_self()
        raise AssertionError("the signal stops the run first")

    monkeypatch.setattr(repeats, "subprocess", SimpleNamespace(run=busy_then_stop))  # the extra processes only
    out = tmp_path / "o"
    env = {"VA_BENCH_TEST_FORWARD_MS": "1"}
    result = run_in_process("run", *_args(out, "rp", "--repeats", "2"), env=env)
    assert result.returncode == 130, result.stderr
    assert "repeats in fresh processes are still to run" in result.stderr and "--resume rp" in result.stderr
    assert set(statuses(out / "rp").values()) == {"ok"}

    def killed(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, -signal.SIGKILL, "", "process 2: [..] warm-up done\n")

    monkeypatch.setattr(repeats, "subprocess", SimpleNamespace(run=killed))
    resumed = run_in_process("run", "--resume", "rp", "--output-dir", str(out), env=env)
    assert resumed.returncode == 1, resumed.stderr  # its cells ok, one extra process failed: the run says so
    for cell in _cells(out / "rp").values():
        block = json.loads((out / "rp" / cell["submission"]).read_text())["timing"]["repeats"]
        assert block["failed"] == ["process 2: killed by SIGKILL"] and block["processes"] == 1
    again = run_in_process("run", "--resume", "rp", "--output-dir", str(out), env=env)
    assert again.returncode == 0 and "repeat" not in again.stderr.lower(), again.stderr  # nothing left to repeat


def test_resume_names_its_run_id_problems(tmp_path):
    result = run_in_process("run", "--resume", "../x", "--output-dir", str(tmp_path))
    assert result.returncode == 2 and "--resume '../x': not a run id" in result.stderr, result.stderr
    result = run_in_process("run", "--resume", "a", "--run-id", "b", "--output-dir", str(tmp_path))
    assert result.returncode == 2 and "drop --run-id b" in result.stderr, result.stderr


def test_a_killed_layer_pass_leaves_nothing_a_resume_keeps(tmp_path):
    """The layer pass's profiler folder of a process killed during it is removed when the run is resumed."""
    from harness.run.state import LAYER_PROFILE_PREFIX, remove_leftovers

    folder = tmp_path / f"{LAYER_PROFILE_PREFIX}abc"
    folder.mkdir()
    (folder / "profile_2026.json").write_text("")
    (tmp_path / "run.json").write_text("{}")
    assert remove_leftovers(tmp_path) == [folder] and not folder.exists() and (tmp_path / "run.json").exists()


def test_a_profile_onnx_runtime_cut_short_never_lands_under_its_name(tmp_path):
    """ORT does not say when it could not finish its trace (a full disk): a trace that is not whole JSON is removed
    and the pass fails, rather than leaving a truncated file in the run folder."""
    from types import SimpleNamespace

    from harness.backends.onnxruntime import OnnxRuntimeCore

    written = tmp_path / "profile_1.json"
    written.write_text('[{"cat": "Session", "name": "model_run", "ts": 1}, {"cat": "No')
    core = OnnxRuntimeCore.__new__(OnnxRuntimeCore)
    core.session = SimpleNamespace(end_profiling=lambda: str(written))
    with pytest.raises(ValueError, match="not complete JSON"):
        core.finish_profile(tmp_path / "ort_profile__m.json")
    assert not written.exists() and not (tmp_path / "ort_profile__m.json").exists()


@requires_coco
def test_an_interrupted_json_run_whose_reader_left_still_says_how_to_resume(tmp_path):
    """Ctrl-C reaches `va-bench run --json | jq` whole: jq is gone when the summary is written. The exit code is the
    signal's and the resume line still comes (it was 141 and no line)."""
    out = tmp_path / "o"
    proc = start("run", "--model", f"{PLUGIN}:make_detector", *SWEEP, "--output-dir", str(out), "--run-id", "g",
                 "--json", env=HELD_AT_2)
    wait_for_ok_cells(out / "g", 1, proc, then_running=True)
    proc.stdout.close()  # the reader is gone
    proc.send_signal(signal.SIGINT)
    stderr = proc.stderr.read()
    proc.wait(timeout=120)
    assert proc.returncode == 130, stderr
    assert any(line.startswith("interrupted") and "--resume g" in line for line in stderr.splitlines()), stderr


@requires_coco
def test_resume_finds_a_run_whose_output_dir_was_given_with_a_tilde(tmp_path):
    """`--output-dir=~/runs` (the shell leaves a `~` after `=` alone) puts a new run in the home folder's runs/; the
    same option on --resume looked for a folder named `~` and answered "no run to resume"."""
    env = {"HOME": str(tmp_path), "VA_BENCH_TEST_FAIL": "8:error", "VA_BENCH_TEST_FORWARD_MS": "1"}
    args = ["--model", f"{PLUGIN}:make_failing_detector", *SWEEP, "--output-dir=~/runs"]
    assert va_bench("run", *args, "--run-id", "r", env=env).returncode == 1
    assert statuses(tmp_path / "runs" / "r")[8] == "failed"
    resumed = va_bench("run", "--resume", "r", "--output-dir=~/runs", "--retry-failed",
                       env={**env, "VA_BENCH_TEST_FAIL": "999:error"})
    assert resumed.returncode == 0, resumed.stderr
    assert set(statuses(tmp_path / "runs" / "r").values()) == {"ok"}


@requires_coco
def test_max_timed_batches_scores_every_image_and_says_what_was_not_timed(tmp_path):
    """16 batches of 1 with --max-timed-batches 4: 4 timed, the other 12 scored untimed, and a warning says so; a
    pass that times more batches than the variant has (cycling them) has none to say."""
    out = tmp_path / "o"
    common = ["--model", f"{PLUGIN}:make_detector", "--backend", "pytorch", "--subset", "sample", "--coco-dir",
              str(COCO_DIR), "--batch-sizes", "1", "--warmup-batches", "1", "--warmup-seconds", "0", "--draw-images",
              "0", "--no-energy", "--output-dir", str(out)]
    env = {"VA_BENCH_TEST_FORWARD_MS": "1"}
    capped = va_bench("run", *common, "--limit", "16", "--min-timed-batches", "2", "--max-timed-batches", "4",
                      "--run-id", "capped", env=env)
    cycled = va_bench("run", *common, "--limit", "4", "--min-timed-batches", "12", "--run-id", "cycled", env=env)
    assert capped.returncode == 0 and cycled.returncode == 0, capped.stderr + cycled.stderr
    (capped_doc,), (cycled_doc,) = ([json.loads(p.read_text()) for p in (out / run / "submissions").glob("*.json")]
                                    for run in ("capped", "cycled"))
    assert capped_doc["timing"]["timed_batches"] == 4 and capped_doc["dataset"]["num_images"] == 16
    assert len(json.loads((out / "capped" / capped_doc["artifacts"]["detections"]).read_text())) == 16  # one box each
    assert "--max-timed-batches 4: 12 batches were scored but not timed" in capped_doc["timing"]["warnings"]
    assert cycled_doc["timing"]["timed_batches"] == 12
    assert not [w for w in cycled_doc["timing"]["warnings"] if "not timed" in w], cycled_doc["timing"]["warnings"]


@requires_coco
def test_a_resume_of_a_damaged_run_json_is_refused_and_deletes_nothing(tmp_path):
    """A run.json without its cells (or without one finished cell) resumed as if those cells were pending: their
    finished submissions were deleted as a dead process's and the cells run again. A bad value in its recorded
    configuration is named as the file's, not as an option given now."""
    out = tmp_path / "o"
    env = {"VA_BENCH_TEST_FORWARD_MS": "1"}
    args = ["--model", f"{PLUGIN}:make_detector", *SWEEP, "--output-dir", str(out)]
    assert va_bench("run", *args, "--run-id", "r", env=env).returncode == 0
    run_json = out / "r" / "run.json"
    whole = json.loads(run_json.read_text())
    before = snapshot(out / "r")
    for damage, says in ((lambda d: d.pop("cells"), "has no list of cells"),
                         (lambda d: d["cells"].pop(1), "does not record 1 submission(s) in submissions/ as finished"),
                         (lambda d: d["config"].update(batch_sizes=["x"]), "run.json: its recorded batch_sizes.0")):
        doc = copy.deepcopy(whole)
        damage(doc)
        run_json.write_text(json.dumps(doc))
        refused = va_bench("run", "--resume", "r", "--output-dir", str(out), env=env)
        assert refused.returncode == 2 and says in refused.stderr, refused.stderr
        assert len([line for line in refused.stderr.splitlines() if "error" in line]) == 1
        assert snapshot(out / "r") == before
    run_json.write_text(json.dumps(whole))  # restored: nothing left to do, nothing touched
    assert va_bench("run", "--resume", "r", "--output-dir", str(out), env=env).returncode == 0
    assert snapshot(out / "r") == before
    # every cell listed, one failed after its submission was written: that file is its dead attempt's, as before
    failed = copy.deepcopy(whole)
    failed["cells"][1].update(status="failed", reason="after its file", submission=None)
    run_json.write_text(json.dumps(failed))
    again = va_bench("run", "--resume", "r", "--output-dir", str(out), "--retry-failed", env=env)
    assert again.returncode == 0, again.stderr
    assert set(statuses(out / "r").values()) == {"ok"} and len(list((out / "r" / "submissions").glob("*.json"))) == 4


def test_a_resumed_runs_json_gives_the_earlier_cells_figures_from_their_submissions(tmp_path):
    """`run --resume ... --json`: a cell an earlier process finished had its status only (no mAP, no latency, no
    mark), where the text summary marks it ok* and its submission has every figure."""
    out = tmp_path / "o"
    first = run_in_process("run", *_args(out, "rs"), env={"VA_BENCH_TEST_FORWARD_MS": "1"})
    assert first.returncode == 0, first.stderr
    doc = json.loads((out / "rs" / "run.json").read_text())
    b1, b2 = doc["cells"]
    (out / "rs" / b2["submission"]).unlink()  # killed while b2 ran: its submission not written yet
    b2.update(status="interrupted", submission=None)
    (out / "rs" / "run.json").write_text(json.dumps(doc))
    resumed = run_in_process("run", "--resume", "rs", "--output-dir", str(out), "--json",
                             env={"VA_BENCH_TEST_FORWARD_MS": "1"})
    assert resumed.returncode == 0, resumed.stderr
    earlier, now = json.loads(resumed.stdout)["cells"]
    sub = json.loads((out / "rs" / b1["submission"]).read_text())
    assert earlier["finished_earlier"] is True and "finished_earlier" not in now
    assert earlier["image_ms_p50"] == sub["timing"]["per_image_ms"]["p50"]
    assert earlier["images_per_s"] == sub["throughput"]["images_per_s"]
    assert earlier["mAP_50_95"] == sub["accuracy"]["mAP_50_95"] and earlier["scored"] == "boxes"
    assert set(now) <= set(earlier)  # the same keys, one meaning
