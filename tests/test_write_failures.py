"""Writes that fail for real (a full disk, a file-size limit, a short write to stdout): what the user is told, what is
left on disk, and what a resume then trusts. Each test reproduces what a small mounted tmpfs or `ulimit -f` showed;
none needs root (the failures are monkeypatched)."""

import errno
import io
import json
import os
import subprocess
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import COCO_DIR, requires_coco, run_in_process

from harness.files import DiskFullError, is_disk_full, storage_problem

PLUGIN = Path(__file__).parent / "plugins" / "synthetic_detector.py"
ENV = {"VA_BENCH_TEST_FORWARD_MS": "1"}


def _enospc(filename: str | None = None) -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), *([filename] if filename else []))


def _full_while(*patterns: str, under: Path, real=os.statvfs):
    """os.statvfs of a file system with no block left while a file matching one of `patterns` (globs) exists under
    `under`, as a real small disk answers while a cut write's leftover still fills it; the real answer after."""

    def statvfs(path):
        s = real(path)
        if not any(next(under.rglob(pattern), None) for pattern in patterns):
            return s
        return os.statvfs_result((s.f_bsize, s.f_frsize, s.f_blocks, 0, 0, s.f_files, s.f_ffree, s.f_favail,
                                  s.f_flag, s.f_namemax))

    return statvfs


def _args(out: Path, run_id: str, *more: str) -> list[str]:
    return ["--model", f"{PLUGIN}:make_detector", "--backend", "pytorch", "--subset", "sample", "--limit", "8",
            "--batch-sizes", "1", "2", "--coco-dir", str(COCO_DIR), "--warmup-batches", "1", "--warmup-seconds", "0",
            "--min-timed-batches", "2", "--draw-images", "0", "--no-energy", "--output-dir", str(out),
            "--run-id", run_id, *more]


def _cells(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / "run.json").read_text())["cells"]


# --- caches ---------------------------------------------------------------------------------------------------------


def test_a_full_disk_under_a_best_effort_cache_only_costs_a_recount(tmp_path, monkeypatch):
    """write_cache_file is best effort ("a cache that cannot be written only costs the next run a recount"), but it
    catches OSError only, and atomic_write_bytes turns ENOSPC into DiskFullError (a VaBenchError): the FLOP-count cache
    in a full $VA_BENCH_WEIGHTS stopped a whole run whose output folder had room."""
    from harness.files import write_cache_file

    real = os.fsync

    def fsync(fd):
        if "model-stats" in os.readlink(f"/proc/self/fd/{fd}"):
            raise _enospc()
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    assert write_cache_file(tmp_path / "model-stats" / "x.json", b"{}") is False
    assert not list((tmp_path / "model-stats").iterdir())


def test_an_openvino_ir_that_does_not_fit_the_cache_is_a_full_disk(tmp_path, monkeypatch):
    """ov.save_model onto a full disk raises RuntimeError('basic_ios::clear: iostream error'): the cells were marked
    failed with that text, the sweep went on, and the hint was --retry-failed. It should read as a full disk naming
    the cache folder (and stop the sweep like every other full disk)."""
    pytest.importorskip("openvino")
    import openvino

    from harness.backends.openvino import OpenVinoCore

    def save_model(model, path, compress_to_fp16=False):
        Path(path).write_bytes(b"<net/>")  # what was written before the stream failed
        raise RuntimeError("basic_ios::clear: iostream error")

    monkeypatch.setattr(openvino, "save_model", save_model)
    monkeypatch.setattr(os, "statvfs", _full_while("model.xml", under=tmp_path))
    target = tmp_path / "openvino" / "m__abc__fp32" / "model.xml"
    with pytest.raises(DiskFullError) as err:
        OpenVinoCore._save_ir(object(), target, compress_to_fp16=False)
    assert str(target.parent) in str(err.value) and "VA_BENCH_WEIGHTS" in str(err.value), repr(err.value)
    assert not target.parent.exists() and [p.name for p in (tmp_path / "openvino").iterdir()] == []


# --- files of the run folder ------------------------------------------------------------------------------------------


def test_a_detections_file_on_a_full_disk_names_its_path(tmp_path, monkeypatch):
    """JsonArrayWriter (detections/*.json) let the raw OSError out: the run stopped with 'no space left on device
    (OSError: [Errno 28] No space left on device)', naming no file; atomic_write_bytes names it (DiskFullError)."""
    from harness.files import JsonArrayWriter

    monkeypatch.setattr(os, "fsync", lambda fd: (_ for _ in ()).throw(_enospc()))
    path = tmp_path / "detections" / "cell.json"
    with pytest.raises(DiskFullError) as err:
        with JsonArrayWriter(path) as out:
            out.extend([{"image_id": 1}])
    assert str(path) in str(err.value)
    assert not list((tmp_path / "detections").iterdir())


def test_a_file_size_limit_stops_the_sweep_like_a_full_disk(tmp_path):
    """`ulimit -f` (EFBIG): every cell failed with 'OSError: [Errno 27] File too large', no path, no fix, and the
    sweep went on to fail every later cell the same way. It is the storage's limit, not a cell's failure."""
    folder = tmp_path / "run"
    exc = OSError(errno.EFBIG, os.strerror(errno.EFBIG), str(folder / "detections" / ".x.json.abc.tmp"))
    problem = storage_problem(exc, folder)
    assert problem is not None and str(folder / "detections") in problem.message


def test_a_torch_trace_the_profiler_could_not_write_never_lands_empty(tmp_path):
    """torch's Kineto writes the Chrome trace to PATH + '.tmp' and renames it; when the write fails (a full disk,
    `ulimit -f`) it says nothing and leaves that file: export_trace then renamed its own empty temp file to
    trace.json. Seen for real: `ulimit -f 200; va-bench run ... --profile` exits 0, both cells ok, trace.json of 0 bytes
    named in the submission, and a 200 KB .trace.json.*.tmp.tmp beside it."""
    from harness.measure.profiler import export_trace

    def export_chrome_trace(path):
        Path(path + ".tmp").write_bytes(b'{"traceEvents": [{"ph": "X", "na')  # cut short, never renamed

    trace = tmp_path / "trace.json"
    profiler = SimpleNamespace(export_chrome_trace=export_chrome_trace)
    with pytest.raises(RuntimeError, match="did not finish writing its trace"):  # room left: not the disk
        export_trace(profiler, trace)
    assert not trace.exists() and not list(tmp_path.glob(".*")), list(tmp_path.iterdir())
    with pytest.MonkeyPatch.context() as full:  # the disk full while the cut trace fills it
        full.setattr(os, "statvfs", _full_while("*.tmp.tmp", under=tmp_path))
        with pytest.raises(DiskFullError, match="trace.json"):
            export_trace(profiler, trace)
    assert not trace.exists() and not list(tmp_path.glob(".*")), list(tmp_path.iterdir())


def test_an_onnx_runtime_profile_cut_short_by_a_full_disk_is_a_full_disk(tmp_path, monkeypatch):
    """ORT does not say when its profile did not fit: finish_profile raises ValueError('... a full disk?'), which
    `_optional_passes` records as a probe failure. On a real full tmpfs (`--layers --profile`) the run exited 0 with
    both cells ok, layers AND profiler 'failed' (the profiler pass never ran; it got the layer pass's reason), and a
    resume never runs them. The project's own rule (test_a_full_disk_in_the_layer_pass_stops_the_sweep): a full disk
    in the layer pass stops the sweep. With the file system full, the error must say so."""
    from harness.backends.onnxruntime import OnnxRuntimeCore

    written = tmp_path / "profile_1.json"
    written.write_text('[{"cat": "Session", "name": "model_run", "ts": 1}, {"cat": "No')
    core = OnnxRuntimeCore.__new__(OnnxRuntimeCore)
    core.session = SimpleNamespace(end_profiling=lambda: str(written))
    monkeypatch.setattr(os, "statvfs", _full_while("profile_1.json", under=tmp_path))
    with pytest.raises(DiskFullError) as err:
        core.finish_profile(tmp_path / "ort_profile__m.json")
    assert storage_problem(err.value, tmp_path) is not None, repr(err.value)
    assert not written.exists() and not (tmp_path / "ort_profile__m.json").exists()


@requires_coco
def test_resume_after_a_full_disk_in_the_profile_pass_leaves_one_trace(tmp_path, monkeypatch):
    """The disk fills after trace.json is written (at profiler_ops.csv): the cell is interrupted, fine. On resume the
    pass runs again but trace_path() sees trace.json there and names the new trace trace__<group>.json: the killed
    pass's trace.json (0 bytes when the trace itself hit the full disk) stays forever, listed by `report` as an
    artefact. Every trace in the folder should be one an ok submission names."""
    from harness.results.artifacts import ProbeArtifacts

    real = ProbeArtifacts.add_profile

    def full(self, cell, profile):
        raise _enospc(str(self.run_dir / "profiler_ops.csv"))

    monkeypatch.setattr(ProbeArtifacts, "add_profile", full)
    out = tmp_path / "o"
    result = run_in_process("run", *_args(out, "p", "--profile", "--profile-batches", "1"), env=ENV)
    assert result.returncode == 1 and "no space left on device" in result.stderr, result.stderr
    assert [c["status"] for c in _cells(out / "p")] == ["ok", "interrupted"]
    assert (out / "p" / "trace.json").is_file()  # the interrupted pass's
    monkeypatch.setattr(ProbeArtifacts, "add_profile", real)
    resumed = run_in_process("run", "--resume", "p", "--output-dir", str(out), env=ENV)
    assert resumed.returncode == 0, resumed.stderr
    named = {v for c in _cells(out / "p")
             for v in json.loads((out / "p" / c["submission"]).read_text())["artifacts"].values()}
    traces = {p.name for p in (out / "p").glob("trace*.json")}
    assert traces <= named, f"traces no submission names: {traces - named}"
    # the resumed b2 is measured against b1's detections, read back from b1's file
    assert "batch invariance not measured" not in resumed.stderr, resumed.stderr
    b2 = next(json.loads((out / "p" / c["submission"]).read_text()) for c in _cells(out / "p")
              if c["cell"].endswith(" b2"))
    assert b2["batch_invariance"]["reference_batch_size"] == 1 and b2["batch_invariance"]["match_rate"] == 1.0


@requires_coco
def test_a_full_disk_at_memory_csv_loses_no_finished_cells_samples(tmp_path, monkeypatch):
    """memory.csv is written after the cell is marked ok, while its submission already names it: a full disk there
    stops the sweep with the cell ok and its samples never written; a resumed process starts memory.csv from what is
    on disk, so the ok cell's window is gone for good while its submission still points at memory.csv."""
    from harness.results.artifacts import ProbeArtifacts

    real = ProbeArtifacts.write_memory
    calls = []

    def full_once(self, samples):
        calls.append(1)
        if len(calls) == 1:
            raise _enospc(str(self.run_dir / "memory.csv"))
        return real(self, samples)

    monkeypatch.setattr(ProbeArtifacts, "write_memory", full_once)
    out = tmp_path / "o"
    result = run_in_process("run", *_args(out, "m"), "--json", env=ENV)
    assert result.returncode == 1 and "no space left on device" in result.stderr, result.stderr
    # a script still gets the cells' statuses and why the run stopped (stdout was empty: a script could not tell a
    # run to resume from a cell that failed)
    summary = json.loads(result.stdout)
    assert "no space left on device" in summary["stopped"] and "--resume m" in summary["stopped"]
    cells = _cells(out / "m")
    assert [c["status"] for c in summary["cells"]] == [c["status"] for c in cells]
    first = json.loads((out / "m" / cells[0]["submission"]).read_text()) if cells[0]["status"] == "ok" else None
    resumed = run_in_process("run", "--resume", "m", "--output-dir", str(out), env=ENV)
    assert resumed.returncode == 0, resumed.stderr
    if first is not None and first["artifacts"].get("memory"):
        tags = {line.split(",")[1] for line in (out / "m" / "memory.csv").read_text().splitlines()[1:]}
        assert any(tag.endswith(" b1") or "b1" in tag for tag in tags), f"the ok cell's samples are missing: {tags}"


# --- --repeats --------------------------------------------------------------------------------------------------------


@requires_coco
def test_a_full_disk_in_an_extra_process_stops_the_run(tmp_path, monkeypatch):
    """--repeats 2 on a disk that fills during the extra process: it was recorded as an ordinary failed repeat
    (timing.repeats.processes 1 of 2), the run exited 0, and --resume never repeats it (timing.repeats is there). A
    full disk should stop the run (exit 1, the resume hint) so that --resume runs the repeats once space is freed."""
    from harness.run import repeats

    def full(cmd, **kwargs):
        return subprocess.CompletedProcess(cmd, 1, "", "error: no space left on device writing /x/run.json; the run "
                                                       "stopped after 0 of 2 cells\n")

    monkeypatch.setattr(repeats, "subprocess", SimpleNamespace(run=full))
    out = tmp_path / "o"
    result = run_in_process("run", *_args(out, "rp", "--repeats", "2"), env=ENV)
    assert result.returncode == 1 and "no space left on device" in result.stderr, result.stderr


# --- downloads --------------------------------------------------------------------------------------------------------


def test_a_model_download_onto_a_full_disk_says_so(tmp_path, monkeypatch):
    """`models fetch` into a full weights cache printed 'could not download URL ([Errno 28] No space left on device);
    check the URL and the network, or pass --weights PATH': the fix points at the network."""
    from harness import files

    source = tmp_path / "w.onnx"
    source.write_bytes(b"x" * 4096)
    monkeypatch.setattr(files.shutil, "copyfileobj", lambda src, dst: (_ for _ in ()).throw(_enospc()))
    dest = tmp_path / "cache" / "w.onnx"
    with pytest.raises(Exception) as err:
        files.download(source.as_uri(), dest)
    assert is_disk_full(err.value) and "network" not in str(err.value), str(err.value)
    assert not dest.exists() and not list(dest.parent.iterdir())


def test_a_dataset_download_onto_a_full_disk_says_so(tmp_path, monkeypatch):
    """`data fetch coco` onto a full disk: 'stopped after 0 bytes ([Errno 28] ...); run the same command again: it
    continues where it stopped' while 1 MB was kept in the .part, and running it again fails the same way. It should
    say the disk is full, where, and to free space first."""
    from harness.data import fetch

    source = tmp_path / "a.zip"
    source.write_bytes(os.urandom(3 << 20))
    part = tmp_path / "dest" / ".downloads" / "a.zip.part"
    real_open = open

    class Full(io.FileIO):
        def write(self, b):
            room = (1 << 20) + 4096 - self.tell()
            if room <= 0:
                raise _enospc()
            return super().write(bytes(b)[:room])

    monkeypatch.setattr(fetch, "open", lambda p, mode="r", *a, **k: io.BufferedWriter(Full(p, mode.replace("b", "")))
                        if "b" in mode and ("w" in mode or "a" in mode) else real_open(p, mode, *a, **k), raising=False)
    with pytest.raises(fetch.FetchError) as err:
        fetch.download_resumable(source.as_uri(), part)
    message = str(err.value)
    assert "free" in message and str(part.parent) in message, message


def test_an_extraction_onto_a_full_disk_is_one_line_and_leaves_no_staging(tmp_path, monkeypatch):
    """ENOSPC in zipfile.extractall escaped _extract as a bare OSError: 'error: OSError: [Errno 28] No space left on
    device (rerun with --debug for the traceback)', and dest/.val2017.extracting/ stayed with half the files (one of
    them empty), holding the space a retry needs for its download."""
    from harness.data import fetch
    from harness.errors import VaBenchError

    archive = tmp_path / "v.zip"
    with zipfile.ZipFile(archive, "w") as zf:
        zf.writestr("val2017/1.jpg", b"a" * 1000)
        zf.writestr("val2017/2.jpg", b"b" * 1000)

    def extractall(self, path, members=None):
        target = Path(path) / "val2017"
        target.mkdir(parents=True, exist_ok=True)
        (target / "1.jpg").write_bytes(b"a" * 1000)
        (target / "2.jpg").write_bytes(b"")
        raise _enospc(str(target / "2.jpg"))

    monkeypatch.setattr(zipfile.ZipFile, "extractall", extractall)
    dest = tmp_path / "coco"
    dest.mkdir()
    with pytest.raises(VaBenchError) as err:
        fetch._extract(archive, fetch.Archive("v.zip", "0" * 40, "val2017", files=2), dest)
    assert "space" in str(err.value)
    assert list(dest.iterdir()) == []


# --- stdout -----------------------------------------------------------------------------------------------------------


class _ShortWrites(io.RawIOBase):
    """A raw stream that takes 8 KiB and then answers ENOSPC: stdout redirected to a full disk with
    PYTHONUNBUFFERED=1 (sys.stdout then wraps the raw FileIO, and TextIOWrapper ignores a short write's count)."""

    def __init__(self):
        self.data = bytearray()

    def writable(self):
        return True

    def write(self, b):
        room = 8192 - len(self.data)
        if room <= 0:
            raise _enospc()
        self.data += bytes(b)[:room]
        return min(room, len(b))


def test_json_on_stdout_that_does_not_fit_is_an_error_not_a_truncated_document():
    """`PYTHONUNBUFFERED=1 va-bench aggregate ... --json > /full/x.json` (and `run --json`) exited 0 with a cut JSON
    document (8192 bytes) and nothing on stderr; print_json must not return normally when stdout took only part."""
    from rich.console import Console

    from harness.errors import VaBenchError
    from harness.views.output import print_json

    raw = _ShortWrites()
    console = Console(file=io.TextIOWrapper(raw, encoding="utf-8", write_through=True))
    with pytest.raises((OSError, VaBenchError)):
        print_json(console, {"rows": ["x" * 100] * 1000})


# --- outputs the user names -------------------------------------------------------------------------------------------


def test_an_output_through_a_symlink_updates_the_file_it_points_to(tmp_path):
    """`aggregate -o lb.json` where lb.json is a symlink (say into a web root): os.replace put a regular file in the
    link's place, the file it pointed to kept its old content, and the command said 'written to lb.json'."""
    from harness.files import atomic_write_json

    target = tmp_path / "www" / "lb.json"
    target.parent.mkdir()
    target.write_text("{}\n")
    link = tmp_path / "lb.json"
    link.symlink_to(target)
    atomic_write_json(link, {"rows": []})
    assert link.is_symlink() and json.loads(target.read_text()) == {"rows": []}


@requires_coco
def test_an_output_dir_that_is_a_file_or_a_dangling_link_says_which(tmp_path):
    """--output-dir naming a file, or a link to a folder that is gone: 'cannot create it (File exists)' said neither."""
    file = tmp_path / "runs.txt"
    file.write_text("x")
    link = tmp_path / "runs"
    link.symlink_to(tmp_path / "gone")
    for out, expect in ((file, "a file, not a folder"), (link, f"a link to {tmp_path / 'gone'}, which does not exist")):
        result = run_in_process("run", *_args(out, "o"), env=ENV)
        assert result.returncode == 2 and expect in result.stderr, result.stderr
    assert file.read_text() == "x" and not (tmp_path / "gone").exists()


@requires_coco
def test_a_resume_onto_a_full_disk_says_how_to_go_on(tmp_path, monkeypatch):
    """A resume whose first run.json write finds the disk full: the message says to free space and resume."""
    from harness.run.state import RunState

    out = tmp_path / "o"
    assert run_in_process("run", *_args(out, "f"), env=ENV).returncode == 0
    real = RunState.save
    monkeypatch.setattr(RunState, "save", lambda self: (_ for _ in ()).throw(DiskFullError(self.run_dir / "run.json",
                                                                                           _enospc())))
    result = run_in_process("run", "--resume", "f", "--output-dir", str(out), "--retry-failed", env=ENV)
    monkeypatch.setattr(RunState, "save", real)
    assert result.returncode == 1 and "free some space, then resume again" in result.stderr, result.stderr
    assert run_in_process("run", "--resume", "f", "--output-dir", str(out), env=ENV).returncode == 0  # lock released


def test_a_fleet_campaign_stops_when_a_datasets_run_folder_does_not_fit_here(tmp_path, monkeypatch):
    """A node's run folder sent back to a full disk: every later dataset's would not fit either, so the campaign
    stops naming the folder (it was each dataset 'skipped' in turn, the same reason every time); nothing is left."""
    pytest.importorskip("ray", reason="the fleet extra is not installed (pip install 'va-bench[fleet]')")
    from harness.fleet import campaign

    monkeypatch.setattr(campaign.ray, "get", lambda ref: {"node": {"host": "n1", "address": "10.0.0.2"},
                                                          "files": {"run.json": b"{}", "submissions/a.json": b"{}"}})
    real = Path.write_bytes

    def write_bytes(self, data):
        if self.name == "a.json":
            raise _enospc(str(self))
        return real(self, data)

    monkeypatch.setattr(Path, "write_bytes", write_bytes)
    entry = SimpleNamespace(name="cells-abc", version=1, weights="w.pt")
    fleet = campaign.CampaignFleet.__new__(campaign.CampaignFleet)
    with pytest.raises(DiskFullError) as err:
        fleet._result(entry, object(), tmp_path)
    assert str(tmp_path) in str(err.value) and "run the campaign again" in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_a_second_name_for_the_same_detections_is_a_link_or_a_copy_never_half_a_file(tmp_path, monkeypatch):
    """same_file_as: a hard link where the file system has them; else a copy; a copy onto a full disk is a
    DiskFullError naming the file, with nothing left under its name or beside it."""
    import shutil

    from harness.files import same_file_as

    source = tmp_path / "a.json"
    source.write_bytes(b"[1, 2]\n")
    same_file_as(source, tmp_path / "b.json")
    assert (tmp_path / "b.json").stat().st_ino == source.stat().st_ino
    monkeypatch.setattr(os, "link", lambda a, b: (_ for _ in ()).throw(OSError(errno.EXDEV, "cross-device")))
    same_file_as(source, tmp_path / "c.json")
    assert (tmp_path / "c.json").read_bytes() == source.read_bytes()
    assert (tmp_path / "c.json").stat().st_ino != source.stat().st_ino
    monkeypatch.setattr(shutil, "copyfile", lambda a, b: (Path(b).write_bytes(b"[1"), (_ for _ in ()).throw(
        _enospc(str(b))))[1])
    with pytest.raises(DiskFullError, match="d.json"):
        same_file_as(source, tmp_path / "d.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.json", "b.json", "c.json"]


def test_a_converter_failure_is_blamed_on_the_storage_only_for_what_it_wrote(tmp_path, monkeypatch):
    """cache_writes judges the file-size limit on the temp file or folder being written, never on older cache
    entries beside it (a 3 MB export under a 2 MB `ulimit -f` made an unsupported operator read "file too large"),
    and says how to lift a file-size limit rather than to free space."""
    import resource

    from harness.storage import cache_writes

    (tmp_path / "old.onnx").write_bytes(b"x" * 3_000_000)
    monkeypatch.setattr(resource, "getrlimit", lambda which: (2_000_000, resource.RLIM_INFINITY))
    written = tmp_path / ".new.onnx.part"
    written.write_bytes(b"abc")
    with pytest.raises(RuntimeError, match="not supported"):
        with cache_writes(tmp_path / "new.onnx", written):
            raise RuntimeError("Exporting the operator 'aten::foo' to ONNX opset version 17 is not supported")
    written.write_bytes(b"x" * 2_000_000)  # the write itself reached the limit
    with pytest.raises(DiskFullError, match="ulimit -f") as err:
        with cache_writes(tmp_path / "new.onnx", written):
            raise RuntimeError("stream error")
    assert "new.onnx" in str(err.value)


def test_json_files_hold_arrays_of_numbers_on_one_line_and_read_back_the_same():
    """A submission's batch times (hundreds of thousands in a sustained run of fast batches) are one line, not one
    line a number, so a ten-minute run of 1 ms batches stays within what the readers take; every document reads back
    as what was written, strings that look like arrays included."""
    import random

    from harness.files import json_text
    from harness.results.reader import MAX_FILE_BYTES

    rng = random.Random(4)

    def value(depth: int):
        kind = rng.choice(["num", "str", "list", "dict", "none", "bool"] if depth < 4 else ["num", "str"])
        if kind == "num":
            return rng.choice([rng.randint(-5, 5), round(rng.uniform(-1e6, 1e6), rng.randint(0, 6)), 1e-07])
        if kind == "str":
            return rng.choice(["x", "[1,\n2]", "a]b", "{", ""])
        if kind == "list":
            return [value(depth + 1) for _ in range(rng.randint(0, 4))]
        if kind == "dict":
            return {f"k{i}": value(depth + 1) for i in range(rng.randint(0, 4))}
        return None if kind == "none" else rng.random() < 0.5

    for _ in range(300):
        doc = {"root": value(0)}
        assert json.loads(json_text(doc, "test")) == doc
    samples = [round(rng.uniform(0.5, 3.0), 4) for _ in range(600_000)]  # 600 s of 1 ms batches
    text = json_text({"timing": {"batch_samples_ms": samples, "interval_samples_ms": samples}}, "test")
    assert text.count("\n") == 5 and len(text) < MAX_FILE_BYTES


def test_a_name_made_safe_is_one_part_of_a_path_and_never_hidden():
    """Every file name the harness builds from a model id, a runtime or a provider goes through one rule."""
    from harness.files import safe_name

    assert safe_name("rtdetr-r18/../../etc") == "rtdetr-r18-..-..-etc"  # no separator left, so no way out
    assert safe_name("..") == "x" and safe_name(".hidden") == "hidden" and safe_name("/", "core") == "core"
    assert safe_name("yolo11n.onnx") == "yolo11n.onnx" and safe_name("a b\u00e9c") == "a-b-c"


def test_the_umask_is_read_without_being_changed():
    """A result file is made 0666 less the process's umask; learning the umask never sets it (a moment in which
    another thread's new file would be world-writable)."""
    import subprocess
    import sys

    code = ("import os; os.umask(0o027); real = os.umask\n"
            "def never(mask): raise AssertionError('the umask was set to learn it')\n"
            "os.umask = never\nfrom harness import files\nos.umask = real\n"
            "print(oct(files._UMASK)); print(oct(os.umask(0)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["0o27", "0o27"], done.stderr


def test_a_file_in_the_way_of_the_run_folders_own_stops_the_sweep(tmp_path):
    """A file where the run keeps its submissions/ folder: every cell was timed and scored, then failed the same way
    (FileExistsError); like an unwritable folder, it stops the sweep at the first, saying what is in the way."""
    folder = tmp_path / "run"
    for exc in (FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(folder / "submissions")),
                NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(folder / "submissions" / "a.json"))):
        problem = storage_problem(exc, folder)
        assert problem is not None and problem.fix == "move what is in the way out of the run folder", exc
        assert str(folder / "submissions") in problem.message
    elsewhere = FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(tmp_path / "other"))
    assert storage_problem(elsewhere, folder) is None  # a model's or dataset's file: that cell's problem alone
