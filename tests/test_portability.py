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
import json, tempfile, traceback
from harness.__main__ import main
# The commands run one after another in this process (one interpreter start, not one per command), each as its
# own process would: its own argv, stdout and stderr (the descriptors, as a pipe), its own lock table, and its
# exit through harness.process_exit.leave to the end (the exit handlers run; only os._exit becomes the return).
class Left(BaseException):
    pass
def _exit(code):
    raise Left(code)
os._exit = _exit
results = []
for args in json.loads(sys.argv[1]):
    held.clear()
    sys.argv = ["va-bench", *args]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush(); sys.stderr.flush()
        saved = os.dup(1), os.dup(2)
        os.dup2(out.fileno(), 1); os.dup2(err.fileno(), 2)
        try:
            main()
            code = 0
        except Left as exc:
            code = exc.args[0]
        except SystemExit as exc:  # as the interpreter ends on it
            code = exc.code
            if isinstance(code, str):
                print(code, file=sys.stderr)
                code = 1
            code = code or 0
        except BaseException:  # an uncaught error: the traceback a process would print
            traceback.print_exc()
            code = 1
        finally:
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            os.dup2(saved[0], 1); os.dup2(saved[1], 2)
            os.close(saved[0]); os.close(saved[1])
        texts = []
        for f in (out, err):
            f.seek(0)
            texts.append(f.read().decode("utf-8", "replace"))
    results.append([code, *texts])
print(json.dumps(results))
'''


def _va_bench_windows_like(*commands: list[str], cwd) -> list[subprocess.CompletedProcess]:
    """Each command (`va-bench ARGS`) as its process would end, run in turn in one Windows-like interpreter."""
    done = subprocess.run([sys.executable, "-c", WINDOWS_LIKE, json.dumps([list(map(str, c)) for c in commands])],
                          capture_output=True, text=True, cwd=cwd,
                          env={**__import__("os").environ, "VA_BENCH_TEST_FORWARD_MS": "1", "PYTHONPATH": str(REPO)},
                          timeout=600)
    assert done.returncode == 0 and done.stdout, done.stderr[-2000:]
    return [subprocess.CompletedProcess(c, code, out, err)
            for c, (code, out, err) in zip(commands, json.loads(done.stdout.splitlines()[-1]), strict=True)]


@requires_coco
def test_the_main_commands_run_without_posix_only_calls(tmp_path):
    out = tmp_path / "runs"
    log = str(tmp_path / "log.md")
    checked = (["validate", str(out / "w")], ["aggregate", str(out / "w"), "--json"],
               ["compare", str(out / "w"), str(out / "w")], ["--version"])
    run, report, again, *done = _va_bench_windows_like(
        ["run", "--model", f"{PLUGIN}:make_detector", "--backend", "pytorch", "--subset", "sample", "--limit", "6",
         "--batch-sizes", "1", "2", "--coco-dir", str(COCO_DIR), "--warmup-batches", "1", "--warmup-seconds", "0",
         "--min-timed-batches", "2", "--draw-images", "1", "--no-energy", "--output-dir", str(out), "--run-id", "w",
         "--layers", "--json"],
        ["report", str(out / "w"), "--log", log], ["report", str(out / "w"), "--log", log], *checked, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    assert json.loads(run.stdout)  # --json: the document alone on stdout
    cells = json.loads((out / "w" / "run.json").read_text())["cells"]
    assert [c["status"] for c in cells] == ["ok", "ok"]
    sub = json.loads((out / "w" / cells[0]["submission"]).read_text())
    assert "/" in cells[0]["submission"] and "\\" not in json.dumps(sub["artifacts"])
    assert report.returncode == 0, report.stderr[-2000:]
    assert "w" in (tmp_path / "log.md").read_text()
    assert again.returncode == 2 and "already has a section" in again.stderr  # the log read back from its start
    for command, result in zip(checked, done, strict=True):
        assert result.returncode in (0, 1) and "Traceback" not in result.stderr, (command, result.stderr[-2000:])
        assert "rerun with --debug" not in result.stderr, (command, result.stderr[-2000:])  # no internal error
    assert done[-1].stdout.strip()  # --version printed it


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
