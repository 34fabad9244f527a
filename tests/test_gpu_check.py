"""The GPU acceptance script's plumbing, run on the CPU: every check gives a figure, a goal and a result, or
says why it did not run; the JSON and Markdown reports are written."""

import json

import pytest
from conftest import requires_coco, requires_yolox

from harness.bench.gpu_check import main


def test_the_environment_says_what_decides_whether_a_forward_process_can_share_the_device(monkeypatch, tmp_path):
    import types

    import torch

    from harness.bench.gpu_check import check_env

    monkeypatch.delenv("PYTORCH_ALLOC_CONF", raising=False)
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    state = {}
    info = check_env(types.SimpleNamespace(device="cpu"), state).data
    assert info["alloc_conf"] == "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True"
    assert info["mps_daemon"].startswith(("running", "not running"))
    assert state["env"] is info and ("compute_mode" in info) == torch.cuda.is_available()  # NVML's, on a GPU
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")
    assert check_env(types.SimpleNamespace(device="cpu"), state).data["alloc_conf"] == "unset"
    pipes = tmp_path / "mps"  # a host's daemon, seen from a container through its pipe
    pipes.mkdir()
    (pipes / "control").touch()
    monkeypatch.setenv("CUDA_MPS_PIPE_DIRECTORY", str(pipes))
    assert check_env(types.SimpleNamespace(device="cpu"), state).data["mps_daemon"] == f"running (its pipe in {pipes})"


@pytest.mark.heavy  # six whole runs in subprocesses (20 s alone, minutes on a loaded box): make test-slow
@requires_coco
@requires_yolox
def test_gpu_check_runs_its_checks_on_the_cpu_and_reports_them(tmp_path):
    code = main(["--device", "cpu", "--limit", "8", "--out", str(tmp_path),
                 "--checks", "env", "reference", "fp32", "precisions", "postprocess", "runtimes"])
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["env"]["data"]["torch"] and checks["env"]["data"]["device"] == "cpu"
    assert checks["reference"]["status"] == "ok" and "mAP" in checks["reference"]["figure"]
    # the same CPU PyTorch core at batch 1 and 8: the checks' own goals hold
    assert checks["fp32.map_vs_cpu"]["passed"] and checks["fp32.batch8_vs_1"]["passed"], checks
    assert all(checks[f"fp32.stage_sum_b{b}"]["status"] in ("ok", "failed") for b in (1, 8))
    assert "fp32.stage_sum_b32" not in checks  # 8 images: no batch of 32
    assert checks["fp32.energy_b8"]["figure"].startswith("unavailable")
    hygiene = checks["fp32.hygiene"]
    assert hygiene["passed"] and hygiene["data"]["samples"] >= 1 and hygiene["data"]["throttled"] is None  # no signal
    assert hygiene["data"]["gpu_hygiene"] == {"status": "not a CUDA run", "locked_clocks": None}
    assert checks["precisions"] == {**checks["precisions"], "status": "not run", "reason": "needs a CUDA device"}
    where = checks["postprocess.where"]  # on a CPU the variants are the same selection, and agree
    assert set(where["data"]["variants"]) == {"device-whole-batch", "device-per-image", "device-serial", "host"}
    assert all(v["matched_vs_per_image"] == 1.0 for v in where["data"]["variants"].values()), where
    assert checks["tensorrt"]["status"] == "not run" and "64 MiB" in checks["tensorrt"]["reason"]
    # TorchScript (in torch: on the lent machine too) against eager fp32; fp16 only on a GPU
    assert checks["torchscript.fp32"]["passed"], checks["torchscript.fp32"]
    assert "torchscript.fp16" not in checks
    markdown = (tmp_path / "gpu_check.md").read_text()
    assert markdown.count("\n| ") == len(report["checks"]) + 1  # header + a row per check
    assert code == (1 if any(c["status"] == "failed" for c in report["checks"]) else 0)


@pytest.mark.heavy
@requires_coco
@requires_yolox
def test_gpu_check_overhead_step_gives_every_row_on_the_cpu(tmp_path):
    # the plumbing of the step the next GPU call runs first: every row measured (none lost to a bad option), the
    # judged rows judged, each with the forward thread's account, and the lock holders found by py-spy
    main(["--device", "cpu", "--limit", "2", "--out", str(tmp_path), "--checks", "overhead"])
    checks = {c["name"]: c for c in json.loads((tmp_path / "gpu_check.json").read_text())["checks"]}
    rows = ["overhead.b2", "overhead.b2.forward_process", "overhead.b2.processes", "overhead.b2.per_image",
            "overhead.b2.finishes_2", "overhead.b2.cv2", "overhead.b2.combined",
            "overhead.b2.forward_and_host_processes", "overhead.b2.yolox_s"]
    assert set(rows) | {"overhead.b2.lock_holders"} == set(checks), sorted(checks)
    judged = {"overhead.b2", "overhead.b2.forward_process", "overhead.b2.processes",
              "overhead.b2.combined"}  # failed when the ratio misses the goal
    for name in rows:
        row = checks[name]
        assert row["status"] == ("ok" if name not in judged or row["passed"] else "failed"), row
        assert "its forward" in row["figure"] and row["data"]["batch_size"] == 2
        assert (row["goal"], row["passed"] is None) == ((">= 0.9", False) if name in judged else ("", True)), row
    processes = checks["overhead.b2.processes"]["data"]  # cv2 and the selection in two processes, a worker each
    assert processes["host_processes"] == 2 and processes["workers"] == 2 and processes["finishes_in_flight"] == 2
    assert processes["preprocess"]["host_processes"] == 2 and processes["decode"].startswith("in the timed path")
    assert checks["overhead.b2.forward_process"]["data"]["forward_process"] is True
    assert "the forward stage" in checks["overhead.b2.forward_process"]["figure"]
    larger = checks["overhead.b2.yolox_s"]["data"]  # a larger architecture's forward, its weights seeded random
    assert (larger["model"], larger["weights"], checks["overhead.b2"]["data"]["weights"]) == (
        "yolox-s", "random", "the model's own")
    both = checks["overhead.b2.forward_and_host_processes"]["data"]
    assert both["forward_process"] is True and both["host_processes"] == 2
    combined = checks["overhead.b2.combined"]["data"]
    assert combined["finishes_in_flight"] == 2 and combined["cuda_graphs"] is False
    assert combined["preprocess"]["implementation"] == "cv2"  # auto on a CPU: the family's own library
    # the A/B row runs the NMS one image at a time; on a CPU a run does too (the whole batch is a GPU's way)
    assert checks["overhead.b2.per_image"]["data"]["nms"] == checks["overhead.b2"]["data"]["nms"] == \
        "torchvision.ops.nms, one call per image"
    holders = checks["overhead.b2.lock_holders"]
    if holders["status"] == "ok":  # py-spy is in the dev extra; a box that forbids ptrace says "not run"
        # which threads py-spy caught holding the lock in a two-image stream is chance (on a loaded box it once
        # caught only a worker): the plumbing gives some, each a thread of the stream
        threads = holders["data"]["by_thread"]
        assert threads and all(t == "MainThread" or t.startswith("va-stream") for t in threads), holders
    else:
        assert holders["status"] == "not run" and holders["reason"], holders


def test_a_check_past_its_limit_is_killed_with_what_it_started(tmp_path):
    """A timed-out check's partial output comes back as text (it was bytes, which the JSON report could not hold),
    and the processes it started die with it (a --repeats child would keep its CUDA context)."""
    import os
    import sys
    import time

    from harness.bench.gpu_check import Check, Runner, write_reports

    runner = Runner("cpu", tmp_path, budget_s=60, limit=8, work=tmp_path / "runs")
    pid_file = tmp_path / "grandchild.pid"
    script = ("import subprocess, sys, time; print('partial', flush=True); "
              "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
              "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "  # not our pipes: communicate() does not wait
              f"open({str(pid_file)!r}, 'w').write(str(child.pid)); time.sleep(60)")
    for limit in (2, 10):  # both start in well under 2 s; a loaded box that did not manage it gets 10
        done = runner.command([sys.executable, "-c", script], timeout=limit)
        if pid_file.exists() and pid_file.read_text():
            break
    assert done.returncode == 124 and done.stdout == "partial\n" and f"timed out after {limit} s" in done.stderr
    grandchild = int(pid_file.read_text())
    try:
        os.waitpid(grandchild, os.WNOHANG)
    except ChildProcessError:
        pass  # not our child: its zombie is reaped by init; it only must not run on

    def alive() -> bool:
        try:
            return "Z" not in open(f"/proc/{grandchild}/stat").read().split()[2]
        except FileNotFoundError:
            return False

    deadline = time.monotonic() + 10  # SIGKILL is delivered at once, but the process ends when it is next scheduled
    while alive() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive()
    write_reports(tmp_path, [Check("fakes", done.stdout, status="failed", reason=done.stderr)], "cpu")
    assert json.loads((tmp_path / "gpu_check.json").read_text())["checks"][0]["figure"] == "partial\n"


def test_overhead_rows_the_budget_has_no_room_for_are_not_run_not_failed(tmp_path):
    from harness.bench.gpu_check import Runner, check_overhead

    runner = Runner("cuda", tmp_path, budget_s=5, limit=None, work=tmp_path / "runs")  # nothing starts with 5 s left
    rows = check_overhead(runner, {})
    assert [c.name for c in rows[:8]] == ["overhead.b8", "overhead.b32", "overhead.b8.forward_process",
                                          "overhead.b32.forward_process", "overhead.b8.processes",
                                          "overhead.b32.processes", "overhead.b8.combined",
                                          "overhead.b32.combined"]  # the judged rows first
    assert all(c.status == "not run" and c.reason.startswith("time budget") for c in rows), rows


def test_the_checks_run_folders_go_when_the_call_ends(tmp_path, monkeypatch):
    """Each call's run folders live in a temporary folder of its own, removed at the end (120 of them had piled up
    in this box's /tmp); `fakes` names pytest's absence from its stderr where its stdout says nothing."""
    import subprocess

    from harness.bench import gpu_check

    monkeypatch.setattr(gpu_check.tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(gpu_check.Runner, "command", lambda self, args, timeout: subprocess.CompletedProcess(
        args, 1, "", "/usr/bin/python3: No module named pytest\n"))
    (fakes,) = gpu_check.run_checks("cpu", tmp_path / "out", 60, 8, ("fakes",))
    assert fakes.figure == "/usr/bin/python3: No module named pytest" and fakes.status == "failed"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_the_run_folder_goes_when_the_call_is_terminated(tmp_path):
    """SIGTERM (a device call's timeout, a Ctrl-C'd wrapper) mid-check: the call's run folder goes too (Python's
    default SIGTERM ends the process without running `finally`)."""
    import os
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    code = ("import time\nfrom pathlib import Path\nfrom harness.bench import gpu_check\n"
            "gpu_check.Runner.command = lambda self, args, timeout: time.sleep(60)\n"
            f"gpu_check.run_checks('cpu', Path({str(tmp_path / 'out')!r}), 60, 8, ('fakes',))\n")
    temp = tmp_path / "temp"
    temp.mkdir()
    process = subprocess.Popen([sys.executable, "-c", code], env={**os.environ, "TMPDIR": str(temp)},
                               cwd=Path(__file__).resolve().parents[1])
    try:
        for _ in range(300):  # until the call has made its folder (or ended)
            if any(temp.iterdir()) or process.poll() is not None:
                break
            time.sleep(0.1)
        assert any(temp.iterdir()), "the call made no run folder"
        process.send_signal(signal.SIGTERM)
        process.wait(30)
    finally:
        if process.poll() is None:
            process.kill()
    assert list(temp.iterdir()) == []


def _server_run(tmp_path, latencies: list[list[float]], fastest_image: float, max_qps: float | None):
    """A batch-1 submission's server block and its samples file, as a run writes them."""
    (tmp_path / "server").mkdir()
    trials = [{"qps": 10.0 * (i + 1), "bound_held": max(t) < 50, "achieved_qps": 9.5 * (i + 1),
               "latency_ms": {"p99": max(t)}} for i, t in enumerate(latencies)]
    (tmp_path / "server" / "c.json").write_text(json.dumps(
        {"trials": [{"qps": t["qps"], "latency_samples_ms": s} for t, s in zip(trials, latencies, strict=True)]}))
    return {"timing": {"per_image_ms": {"min": fastest_image}},
            "server": {"samples": "server/c.json", "latency_bound_ms": 50.0, "max_qps": max_qps,
                       "search": {"trials": trials, "why_none": None if trials else "the fastest timed query took "
                                                                                   "60.00 ms, more than the bound"}}}


def test_the_server_row_holds_its_fastest_query_against_the_timed_pass(tmp_path):
    from harness.bench.gpu_check import server_check

    for folder, fastest_image, passed in (("ok", 4.0, True), ("early", 9.0, False)):
        (tmp_path / folder).mkdir()
        doc = _server_run(tmp_path / folder, [[80.0, 70.0], [3.8, 12.0, 6.0]], fastest_image, 20.0)
        check = server_check(doc, tmp_path / folder)
        # the fastest of every query of every trial (3.8 ms), and the highest rate that held (the second trial's)
        assert check.data["fastest_query_ms"] == 3.8 and check.passed is passed, check
        assert "max 20.0 qps at p99 <= 50 ms (p99 12.00 ms, achieved 19.0 qps)" in check.figure
        assert f"({3.8 / fastest_image:.2f}x)" in check.figure
    (tmp_path / "none").mkdir()
    none = server_check(_server_run(tmp_path / "none", [], 60.0, None), tmp_path / "none")
    assert none.status == "not run" and "no rate held p99 <= 50 ms: the fastest timed query took 60.00" in none.figure


@pytest.mark.heavy
@requires_coco
@requires_yolox
def test_gpu_check_server_step_runs_on_the_cpu(tmp_path):
    main(["--device", "cpu", "--limit", "2", "--out", str(tmp_path), "--checks", "server"])
    (check,) = json.loads((tmp_path / "gpu_check.json").read_text())["checks"]
    assert check["name"] == "server" and check["status"] in ("ok", "failed") and check["data"]["trials"], check
    assert check["data"]["fastest_query_ms"] > 0 and "qps" in check["figure"]


def test_the_server_step_asks_a_run_for_queries_it_takes():
    """--limit 1 asked for 5 queries a trial, which a run refuses (10 at least)."""
    from types import SimpleNamespace

    from harness.bench.gpu_check import SERVER_QUERIES, check_server
    from harness.config import RunConfig

    least = RunConfig.model_fields["server_queries"].metadata[0].ge
    for limit, want in ((1, max(10, least)), (2, 10), (None, SERVER_QUERIES)):
        asked = []

        def run(*options, timeout, asked=asked):
            asked.append(int(options[options.index("--server-queries") + 1]))
            raise RuntimeError("not run here")

        check = check_server(SimpleNamespace(device="cpu", limit=limit, run=run), {})
        assert check.status == "failed" and asked == [want] and want >= least, (limit, asked)
