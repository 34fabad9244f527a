"""va-bench where the POSIX-only parts of Python are missing, as on Windows (217 of the leaderboard's 708 rows came
from a Windows machine): a fresh interpreter with fcntl, resource, SIGHUP, os.getloadavg, os.pread, os.statvfs,
os.geteuid, sched_*affinity and the like removed before va-bench is imported, and msvcrt's byte lock standing in for
the one Windows has, runs a sweep, reports it to a log, validates, aggregates and compares it. No Windows machine
runs here: what this guards is that no POSIX-only call sits on those commands' paths."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import COCO_DIR, REPO, requires_coco

PLUGIN = REPO / "tests" / "plugins" / "synthetic_detector.py"

WINDOWS_LIKE = r'''
import errno, os, signal, sys, threading, time, types
import torch, numpy, cv2, onnxruntime, psutil, scipy, pycocotools.coco  # what a Windows wheel provides
for module in ("fcntl", "resource", "pwd", "grp", "termios"):
    sys.modules[module] = None
held = {}
lock = threading.Lock()
def locking(fd, mode, nbytes):  # msvcrt's byte-range lock, one process's view of it
    key = os.fstat(fd).st_ino
    with lock:
        if held.get(key, fd) != fd:
            raise OSError(errno.EDEADLK, "Resource deadlock avoided")
        held[key] = fd
msvcrt = types.ModuleType("msvcrt")
msvcrt.LK_NBLCK, msvcrt.locking = 2, locking
sys.modules["msvcrt"] = msvcrt
for name in ("getloadavg", "pread", "pwrite", "sched_getaffinity", "sched_setaffinity", "killpg", "getpgid",
             "statvfs", "geteuid", "getuid", "uname", "fork", "wait4", "setpriority", "getpriority", "nice"):
    if hasattr(os, name):
        delattr(os, name)
for name in ("SIGHUP", "SIGKILL", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGQUIT", "setitimer", "alarm"):
    if hasattr(signal, name):
        delattr(signal, name)
if hasattr(time, "CLOCK_BOOTTIME"):
    delattr(time, "CLOCK_BOOTTIME")
from harness.__main__ import main
sys.argv = ["va-bench", *sys.argv[1:]]
main()
'''


def _va_bench_windows_like(*args: str, cwd) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WINDOWS_LIKE, *args], capture_output=True, text=True, cwd=cwd,
                          env={**__import__("os").environ, "VA_BENCH_TEST_FORWARD_MS": "1",
                               "PYTHONPATH": str(REPO)}, timeout=600)


@requires_coco
def test_the_main_commands_run_without_posix_only_calls(tmp_path):
    out = tmp_path / "runs"
    run = _va_bench_windows_like("run", "--model", f"{PLUGIN}:make_detector", "--backend", "pytorch", "--subset",
                                 "sample", "--limit", "6", "--batch-sizes", "1", "2", "--coco-dir", str(COCO_DIR),
                                 "--warmup-batches", "1", "--warmup-seconds", "0", "--min-timed-batches", "2",
                                 "--draw-images", "1", "--no-energy", "--output-dir", str(out), "--run-id", "w",
                                 "--layers", "--json", cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    cells = json.loads((out / "w" / "run.json").read_text())["cells"]
    assert [c["status"] for c in cells] == ["ok", "ok"]
    sub = json.loads((out / "w" / cells[0]["submission"]).read_text())
    assert "/" in cells[0]["submission"] and "\\" not in json.dumps(sub["artifacts"])
    report = _va_bench_windows_like("report", str(out / "w"), "--log", str(tmp_path / "log.md"), cwd=tmp_path)
    assert report.returncode == 0, report.stderr[-2000:]
    assert "w" in (tmp_path / "log.md").read_text()
    again = _va_bench_windows_like("report", str(out / "w"), "--log", str(tmp_path / "log.md"), cwd=tmp_path)
    assert again.returncode == 2 and "already has a section" in again.stderr  # the log read back from its start
    for command in (["validate", str(out / "w")], ["aggregate", str(out / "w"), "--json"],
                    ["compare", str(out / "w"), str(out / "w")], ["--version"]):
        done = _va_bench_windows_like(*command, cwd=tmp_path)
        assert done.returncode in (0, 1) and "Traceback" not in done.stderr, (command, done.stderr[-2000:])
        assert "rerun with --debug" not in done.stderr, (command, done.stderr[-2000:])  # no internal error


def test_names_commands_and_machine_facts_as_each_platform_has_them(monkeypatch):
    """Windows' device names are no run or hardware ids; a command line to paste is quoted for cmd.exe there; a Mac's
    CPU is its brand string (platform says "arm" for every Apple chip); only Linux has a glibc to tune."""
    import pytest

    from harness import shell
    from harness.config import RunConfig
    from harness.measure import env

    for name in ("nul", "CON", "com1.txt", "aux"):
        with pytest.raises(ValueError, match="device name on Windows"):
            RunConfig(run_id=name)
    with pytest.raises(ValueError):
        RunConfig(hardware_id="box.")  # Windows drops a trailing dot
    assert RunConfig(run_id="console").run_id == "console"
    from harness.config import build_config

    # a run recorded before the rule resumes under its own names
    assert build_config({"run_id": "nul", "hardware_id": "box."}, recorded=True).hardware_id == "box."
    monkeypatch.setattr(sys, "platform", "win32")
    assert shell.quote(r"C:\My Runs") == '"C:\\My Runs"' and shell.join(["run", "a b"]) == 'run "a b"'
    assert env.allocator()["allocator"] == "win32 default"
    monkeypatch.setattr(sys, "platform", "linux")
    assert shell.quote("/my runs") == "'/my runs'"
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setattr(env, "Path", lambda p: __import__("pathlib").Path("/nonexistent") / str(p).lstrip("/"))
    monkeypatch.setattr(env.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, "Apple M3 Pro\n", ""))
    assert env.cpu_model() == "Apple M3 Pro"
