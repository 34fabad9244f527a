"""Who holds the interpreter lock: py-spy's raw samples summarized by thread group and function, and a real
py-spy run on a program whose lock holder is known."""

import sys
import textwrap

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


def test_py_spy_finds_the_thread_that_holds_the_lock(tmp_path):
    """One thread spins in Python (holding the lock), another sleeps (not holding it): the spinning one is nearly
    every lock-holding sample inside `spin`."""
    program = tmp_path / "holders.py"
    program.write_text(textwrap.dedent("""\
        import threading, time

        def spin():
            end = time.monotonic() + 1.5
            while time.monotonic() < end:
                sum(range(200))

        def rest():
            time.sleep(1.5)

        threads = [threading.Thread(target=spin, name="spinner"), threading.Thread(target=rest, name="sleeper")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        """))
    done, summary = profile([sys.executable, str(program)], 200, tmp_path / "raw.txt", timeout=60,
                            within=("spin", "rest"))
    assert done.returncode == 0 and "by_thread" in summary, summary
    assert summary["by_thread"]["spinner"]["share"] > 0.95 and "sleeper" not in summary["by_thread"]
    assert 0.5 < summary["by_thread"]["spinner"]["held_s"] <= 1.6  # ~1.5 s held, less what sampling missed
    assert next(iter(summary["top_functions"])).startswith("spin (")
