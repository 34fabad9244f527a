"""What a command leaves behind in a process that goes on: locks, pinned threads, scheduler threads and folders."""

import os
import threading
from pathlib import Path

import pytest
from conftest import COCO_DIR, requires_coco

from harness.errors import UsageError
from harness.records import Cell, LoadKey
from harness.run.state import ENERGY_FILE, RunState

PLUGIN = Path(__file__).parent / "plugins" / "synthetic_detector.py"


def _open_fds_under(folder: Path) -> list[str]:
    out = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(folder)):
            out.append(target)
    return out


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc/self/fd")
def test_a_resume_that_fails_after_locking_releases_the_run_folder(tmp_path):
    """RunState.reopen takes the folder's lock, then cleans the folder; when that raises, the lock's descriptor
    must be closed, or the same process can never resume the run again ("being written by another process")."""
    cells = [Cell(LoadKey("m", "pytorch", "fp32", (64, 64)), 1)]
    run_dir = tmp_path / "r"
    RunState.create(run_dir, "r", {"config": {}}, cells).close()
    (run_dir / ENERGY_FILE).write_bytes(b"timestamp,tag\n1,\xff\xfe\n")  # not UTF-8: drop_energy_rows raises
    with pytest.raises(UnicodeDecodeError):
        RunState.reopen(run_dir, "r", cells, {"config": {}})
    assert _open_fds_under(run_dir) == []
    (run_dir / ENERGY_FILE).write_text("timestamp,tag\n")
    try:
        state = RunState.reopen(run_dir, "r", cells, {"config": {}})
    except UsageError as exc:  # the leaked lock of the failed attempt
        pytest.fail(f"the run folder stayed locked by this very process: {exc}")
    state.close()


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs Linux and two usable cores")
def test_a_thread_that_outlives_a_pinned_run_gets_the_process_mask_back():
    """--cpu-affinity: the process-wide pools (pipeline._host_thread and friends, @cache'd) are started inside the
    first run that needs them and live on; a pinned run must not leave them pinned for the process's later runs."""
    from harness.measure.affinity import pinned

    before = os.sched_getaffinity(0)
    core = min(before)
    started, stop = threading.Event(), threading.Event()
    tid: list[int] = []

    def idle():
        tid.append(threading.get_native_id())
        started.set()
        stop.wait()

    thread = threading.Thread(target=idle, daemon=True)
    try:
        with pinned([core]):
            thread.start()  # like the cached host-ops pool, started by the run's first batch
            started.wait()
            assert os.sched_getaffinity(tid[0]) == {core}
        assert os.sched_getaffinity(0) == before
        assert os.sched_getaffinity(tid[0]) == before, "a thread started in the pinned run stays pinned after it"
    finally:
        stop.set()
        thread.join()


@requires_coco
def test_a_fleet_group_closed_early_leaves_no_scheduler_thread_and_no_scratch(tmp_path, monkeypatch):
    """run_group's consumer going away (the generator closed, or an error in its watcher) must not leave the
    scheduler running the group in a daemon thread, writing into the scratch folder run_group removed."""
    import tempfile

    from harness.config import RunConfig
    from harness.fleet.fingerprint import build_fingerprint
    from harness.fleet.node import GroupJob, run_group
    from harness.run.plan import prepare

    monkeypatch.setenv("VA_BENCH_TEST_FORWARD_MS", "50")
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    model = f"{PLUGIN}:make_detector"
    config = RunConfig(models=[model], backends=["pytorch"], subset="sample", limit=8, batch_sizes=[1, 2, 4],
                       coco_dir=str(COCO_DIR), warmup_batches=1, warmup_seconds=0.0, min_timed_batches=4,
                       draw_images=0, energy=False, output_dir=str(tmp_path / "plan"))
    plan = prepare(config)
    key, _ = plan.groups[0]
    job = GroupJob("fr", "cpu_test", {**config.model_dump(), "hardware_id": "cpu_test", "models": [model]}, key,
                   ["fleet", "run"], build_fingerprint(), plan.variant.image_id_sha256)
    updates = run_group(job, {"node": "test"})
    next(updates)  # the group has started
    updates.close()
    running = [t for t in threading.enumerate() if t.name == "va-bench-fleet-group" and t.is_alive()]
    for thread in running:  # (without the fix: it stops by itself once it sees its run folder gone)
        thread.join()
    assert running == [], "the group's scheduler ran on after its task's generator was closed"
    assert list(tmp_path.glob("va-bench-fleet-*")) == [], "the scratch folder is left (or written again)"
