"""The CLI's exit skips the interpreter's teardown of torch, and nothing else: exit codes, atexit handlers,
buffered output and non-daemon threads behave as with sys.exit."""

import subprocess
import sys

from conftest import REPO, requires_coco, run_in_process


def _run(body: str) -> subprocess.CompletedProcess:
    script = "import atexit, sys, threading, time\nimport torch\nfrom harness.process_exit import leave\n" + body
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120)


def test_exit_code_handlers_and_buffered_output_survive():
    done = _run("atexit.register(lambda: print('handler ran'))\nsys.stdout.write('buffered ')\nleave(3)")
    assert done.returncode == 3 and done.stdout == "buffered handler ran\n", done
    assert _run("leave(None)").returncode == 0
    message = _run("leave('no such thing')")
    assert message.returncode == 1 and message.stderr.strip() == "no such thing"


def test_closed_streams_change_no_exit_code():
    """Started with stdout and stderr closed (`>&- 2>&-`): the exit code is the command's, not a traceback's; progress
    lines to a closed or broken stderr are dropped, never an error of the cell that logged them."""
    done = subprocess.run([sys.executable, "-c", "import torch\nfrom harness.process_exit import leave\nleave(3)"],
                          cwd=REPO, timeout=120, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          preexec_fn=lambda: (__import__("os").close(1), __import__("os").close(2)))
    assert done.returncode == 3
    import io

    from harness.views.progress import PlainProgress

    PlainProgress(None).log("to a closed stderr")
    broken = io.StringIO()
    broken.close()  # writing raises ValueError, as a broken pipe raises OSError
    PlainProgress(broken).log("to a broken one")


def test_a_live_non_daemon_thread_gets_the_normal_exit(tmp_path):
    marker = tmp_path / "finished"
    done = _run(f"threading.Thread(target=lambda: (time.sleep(0.5), open({str(marker)!r}, 'w').close())).start()\n"
                "leave(0)")
    assert done.returncode == 0 and marker.exists()  # joined, as sys.exit joins it


TEARDOWN_MARK = ("class Mark:\n    def __del__(self):\n        print('torn down', flush=True)\n"
                 "mark = Mark()\n")  # printed by the interpreter's module teardown only, never after os._exit


def test_the_pipelines_idle_pools_are_closed_so_the_exit_skips_the_teardown():
    """The host pools live as long as the process and their threads are not daemons: `leave` closes them (their
    `before_leave` hooks) and still takes the fast exit. A pool nobody closes keeps the normal exit (the control,
    which shows the mark tells the two apart)."""
    pools = ("from harness.pipeline.pipeline import _host_pool, _host_thread\n"
             "_host_pool(2).submit(sum, [1]).result()\n_host_thread().submit(sum, [1]).result()\n")
    fast = _run(TEARDOWN_MARK + pools + "leave(0)")
    assert fast.returncode == 0 and "torn down" not in fast.stdout, fast
    stray = ("from concurrent.futures import ThreadPoolExecutor\n"
             "ThreadPoolExecutor(1).submit(sum, [1]).result()\n")
    normal = _run(TEARDOWN_MARK + stray + "leave(0)")
    assert normal.returncode == 0 and "torn down" in normal.stdout, normal


def test_a_command_plans_without_collections_and_leaves_the_collector_as_it_found_it():
    """`quiet_start`: no collection while the command imports and plans; after `imports_done` what existed is frozen
    and collections resume; when the command ends (returning or raising) nothing stays frozen, and a collector the
    caller had disabled stays disabled."""
    import gc

    import pytest

    from harness.collector import imports_done, quiet_start

    seen = {}

    @quiet_start
    def command(fail: bool) -> str:
        seen["planning"] = gc.isenabled()
        imports_done()
        seen["running"] = gc.isenabled(), gc.get_freeze_count() > 0
        if fail:
            raise ValueError("bad input")
        return "done"

    assert gc.isenabled() and gc.get_freeze_count() == 0
    assert command(False) == "done"
    assert seen == {"planning": False, "running": (True, True)}
    assert gc.isenabled() and gc.get_freeze_count() == 0
    with pytest.raises(ValueError):
        command(True)
    assert gc.isenabled() and gc.get_freeze_count() == 0
    gc.disable()
    try:
        command(False)
        assert not gc.isenabled() and gc.get_freeze_count() == 0
    finally:
        gc.enable()


@requires_coco
def test_data_check_and_a_dry_run_leave_the_collector_as_they_found_it():
    # a command that froze the collector's objects without thawing them left the next command in the process
    # (the tests) a collector blind to everything that existed before it
    import gc

    for args in (["data", "check", "--subset", "sample"], ["run", "--dry-run", "--limit", "8"]):
        done = run_in_process(*args)
        assert done.returncode == 0, done.stderr
        assert gc.isenabled() and gc.get_freeze_count() == 0, args


def test_ctrl_c_while_the_cli_imports_is_one_line():
    """Before the CLI's handlers exist (its imports take a moment): exit 130 and one line, no traceback."""
    script = ("import sys\nclass Interrupting:\n    def find_spec(self, name, path=None, target=None):\n"
              "        if name == 'harness.cli':\n            raise KeyboardInterrupt\n"
              "sys.meta_path.insert(0, Interrupting())\nfrom harness.__main__ import main\nmain()\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert done.returncode == 130 and done.stderr == "interrupted while starting; nothing was run\n", done.stderr
