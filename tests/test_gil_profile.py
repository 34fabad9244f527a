"""Who holds the interpreter lock: py-spy's raw samples summarized by thread group and function, and a real
py-spy run on a program whose lock holder is known."""

import subprocess
import sys
import textwrap
import time

import pytest

from harness.bench.gil_profile import profile, summarize

RAW = """\
thread (0x1): MainThread;main (bench.py:10);forward (model.py:5) 300
thread (0x2): va-stream_0;Thread._bootstrap (threading.py:1);prepare (pipeline.py:20);_collate (pipeline.py:30) 50
thread (0x3): va-stream_1;Thread._bootstrap (threading.py:1);prepare (pipeline.py:20);_collate (pipeline.py:31) 30
thread (0x1): MainThread;_find_and_load (<frozen importlib._bootstrap>:1176) 120
thread (0x4);<module> (startup.py:1) 20
not a sample line
"""


def test_summary_groups_pool_threads_and_functions_and_keeps_only_the_region_asked_for():
    every = summarize(RAW, rate=100)
    assert every["samples_holding"] == 520
    assert every["by_thread"] == {"MainThread": {"held_s": 4.2, "share": round(420 / 520, 3)},
                                  "va-stream": {"held_s": 0.8, "share": round(80 / 520, 3)},
                                  "thread 0x4": {"held_s": 0.2, "share": round(20 / 520, 3)}}
    # the two lines of _collate are one function
    assert every["top_functions"]["_collate (pipeline.py)"] == round(80 / 520, 3)
    timed = summarize(RAW, rate=100, within=("main", "prepare"))  # not the imports, not the unnamed thread
    assert timed["samples_holding"] == 380 and set(timed["by_thread"]) == {"MainThread", "va-stream"}
    assert timed["within"] == ["main", "prepare"]
    assert summarize(RAW, rate=100, within=("nowhere",))["status"] == "unavailable"
    # a thread group counted whole, beside a function on another thread
    pool_and_main = summarize(RAW, rate=100, within=("main",), threads=("va-stream",))
    assert pool_and_main["samples_holding"] == 380 and pool_and_main["threads"] == ["va-stream"]
    assert summarize(RAW, rate=100, threads=("va-stream",))["by_thread"] == {"va-stream": {"held_s": 0.8, "share": 1.0}}


def test_py_spy_finds_the_thread_that_holds_the_lock(tmp_path):
    """One pool thread spins in Python inside a closure (holding the lock), another thread sleeps (not holding it):
    the spinning one is nearly every lock-holding sample, found both by its thread group and by the function that
    encloses the closure (the way gpu_check finds the overlapped workers and the forward's thread)."""
    program = tmp_path / "holders.py"
    program.write_text(textwrap.dedent("""\
        import threading, time
        from concurrent.futures import ThreadPoolExecutor

        def stream():
            def spin():
                end = time.monotonic() + 1.5
                while time.monotonic() < end:
                    sum(range(200))
            with ThreadPoolExecutor(1, thread_name_prefix="spinner") as pool:
                pool.submit(spin).result()

        sleeper = threading.Thread(target=time.sleep, args=(1.5,), name="sleeper")
        sleeper.start()
        stream()
        sleeper.join()
        """))
    shares = {}
    for name, region in (("all", {}), ("within", {"within": ("stream",)}), ("threads", {"threads": ("spinner",)})):
        done, summary = profile([sys.executable, str(program)], 200, tmp_path / "raw.txt", timeout=60, **region)
        if "ermission" in summary.get("reason", ""):  # a sandbox that forbids reading another process (ptrace)
            pytest.skip(f"py-spy cannot read processes here: {summary['reason']}")
        assert "by_thread" in summary and done.returncode == 0, summary
        shares[name] = {group: held["share"] for group, held in summary["by_thread"].items()}
        # ~1.5 s held: not a fraction of it, not the whole run twice (py-spy catches up on ticks it fell behind on)
        assert 0.5 < summary["by_thread"]["spinner"]["held_s"] <= 2.0, summary
        assert next(iter(summary["top_functions"])).split(" (")[0].endswith("spin"), summary
    # unfiltered, the interpreter's start-up (main thread) is in it too, and the sleeper next to nothing
    assert shares["all"]["spinner"] > 0.8 and shares["all"].get("sleeper", 0) < 0.05, shares
    assert shares["within"]["spinner"] > 0.95 and "sleeper" not in shares["within"], shares
    assert shares["threads"] == {"spinner": 1.0}, shares


def test_a_profile_past_its_time_limit_stops_py_spy_and_the_command(tmp_path):
    marker = f"gil-profile-timeout-{tmp_path.name}"
    start = time.monotonic()
    done, summary = profile([sys.executable, "-c", "import sys, time; time.sleep(60)", marker], 200,
                            tmp_path / "raw.txt", timeout=3)
    assert time.monotonic() - start < 30 and summary["timed_out"], summary
    # what py-spy saw before the limit (the interpreter starting holds the lock) is summarised; nothing: says why
    assert "by_thread" in summary or "after the 3 s limit" in summary.get("reason", ""), summary
    left = subprocess.run(["pgrep", "-f", marker], capture_output=True, text=True)
    assert left.stdout.strip() == ""  # the command did not outlive its profile
