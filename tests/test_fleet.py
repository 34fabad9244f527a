"""`va-bench fleet` on a real Ray cluster bound to 127.0.0.1: a head (hardware "alpha") and a second raylet
(hardware "beta") on this machine, started once for the module. Plus the pure parts (shards, gathering,
fingerprints, join command) without Ray."""

from __future__ import annotations

import csv
import json
import os
import signal
import threading
import time
from pathlib import Path

import pytest
from conftest import COCO_DIR, CORPUS, requires_coco, requires_yolox, run_in_process
from typer.testing import CliRunner

from harness.errors import UsageError
from harness.fleet.fingerprint import build_differences
from harness.fleet.gather import append_csv_rows, inside_folder, safe_relative
from harness.fleet.shards import Shard, merge_result_files, split_shards
from harness.results.site_rules import schema_findings, site_findings

PLUGINS = Path(__file__).parent / "plugins"
SYNTHETIC = f"{PLUGINS / 'synthetic_detector.py'}:make_detector"
KILLED = f"{PLUGINS / 'killed_detector.py'}:make_detector"


def small(warmup_batches: int = 1) -> list[str]:
    """Run options of a small, quick sweep: 16 images, one warm-up batch (a warm-up that settles still runs its
    minimum: 1200 of the synthetic core's 2 ms sleeps keep a cell running past the 2 s kill switch, however fast
    the machine; 300 did only on a loaded one), two timed batches, one thread."""
    return ["--subset", "sample", "--limit", "16", "--coco-dir", str(COCO_DIR), "--warmup-batches", str(warmup_batches),
            "--warmup-seconds", "0", "--min-timed-batches", "2", "--no-layers", "--no-profile",
            "--threads", "1", "--draw-images", "0", "--no-energy"]


# ------------------------------------------------------------------------------------ without Ray


def test_shards_are_contiguous_whole_batches_covering_the_variant_once():
    shards = split_shards(206, 8, 4)
    assert [s.start for s in shards] == [0, 48, 104, 152] and shards[-1].stop == 206
    assert all(s.start % 8 == 0 for s in shards)
    assert sum(s.size for s in shards) == 206
    assert [s.size for s in split_shards(16, 1, 3)] == [5, 5, 6]
    with pytest.raises(UsageError, match="more than the 2 batches"):
        split_shards(16, 8, 3)
    parts = [(Shard(1, 5, 10), b'[{"image_id":2},{"image_id":3}]\n'), (Shard(0, 0, 5), b"[]\n"),
             (Shard(2, 10, 12), b'[{"image_id":11}]\n')]
    merged = merge_result_files(parts)
    assert json.loads(merged) == [{"image_id": 2}, {"image_id": 3}, {"image_id": 11}]
    assert merge_result_files([(Shard(0, 0, 5), b"[]\n")]) == b"[]\n"
    with pytest.raises(ValueError, match="cover the variant exactly once"):
        merge_result_files([(Shard(0, 0, 5), b"[]"), (Shard(1, 6, 10), b"[]")])
    with pytest.raises(ValueError, match="not a JSON array"):
        merge_result_files([(Shard(0, 0, 5), b'{"image_id": 1}')])


def test_gathered_csv_appends_each_tasks_new_rows_and_widens_the_header(tmp_path):
    path = tmp_path / "energy.csv"
    assert append_csv_rows(path, b"timestamp,tag\n1,a\n", 0) == 1
    assert append_csv_rows(path, b"timestamp,tag\n1,a\n2,b\n", 1) == 2  # the same task's file, grown
    assert append_csv_rows(path, b"timestamp,tag,package_0\n3,c,9.5\n", 0) == 1  # another task, another domain
    with open(path, newline="") as fh:
        assert list(csv.reader(fh)) == [["timestamp", "tag", "package_0"], ["1", "a", ""], ["2", "b", ""],
                                        ["3", "c", "9.5"]]


@pytest.mark.parametrize("name", ["../x.json", "/etc/passwd", "a/../../b", "run.json", ".lock", "a\\b", ""])
def test_a_node_cannot_write_outside_its_folder_or_over_the_drivers_files(name):
    with pytest.raises(ValueError):
        safe_relative(name)
    assert str(safe_relative("submissions/a.json")) == "submissions/a.json"
    if name not in ("run.json", ".lock"):  # a campaign's dataset folder comes back whole, its run.json too
        with pytest.raises(ValueError):
            inside_folder(name)
    assert str(inside_folder("run.json")) == "run.json"


def test_build_differences_name_what_differs():
    base = {"harness_version": "0.1.0", "harness_commit": "a" * 40, "harness_dirty": False,
            "harness_source_sha256": "b" * 64, "packages": {"torch": "2.14.1", "ray": "2.60.0"}}
    assert build_differences(base, base) == []
    other = {**base, "harness_commit": "c" * 40, "packages": {"torch": "2.13.0", "ray": "2.60.0"}}
    assert build_differences(base, other) == [f"harness commit {'a' * 12} -> {'c' * 12}", "torch 2.14.1 -> 2.13.0"]


def test_a_runtime_one_machine_has_and_another_cannot_is_no_build_difference(monkeypatch):
    """A Jetson node with TensorRT and a Raspberry Pi without it run one build: the fingerprint compares the
    packages every machine has (libreyolo among them), not the optional runtimes a submission records."""
    from harness.fleet import fingerprint
    from harness.measure import env

    real = env.version
    monkeypatch.setattr(env, "version", lambda name: "10.7.0" if name == "tensorrt" else real(name))
    packages = fingerprint.build_fingerprint()["packages"]
    assert "tensorrt" not in packages and "openvino" not in packages and "libreyolo" in packages
    assert env.package_versions()["tensorrt"] == "10.7.0"  # still recorded in each submission's software
    # a GPU node's ONNX Runtime is the onnxruntime-gpu build of the same package: compared by its version
    ort = packages["onnxruntime"]
    builds = {"onnxruntime-gpu": ort, "onnxruntime": None}

    def gpu_node(name):
        if name in builds:
            if builds[name] is None:
                raise env.PackageNotFoundError(name)
            return builds[name]
        return real(name)

    monkeypatch.setattr(env, "version", gpu_node)
    assert fingerprint.build_fingerprint()["packages"]["onnxruntime"] == ort


def test_nodes_of_one_hardware_id_that_wait_differently_in_openmp_are_named():
    """Spinning and passive OpenMP threads time a PyTorch CPU forward 1.4-2x apart on a busy machine: two nodes of
    one id that differ are named with their settings; nodes of different ids, a refused node and a node whose
    probe does not say (an older build) are not compared."""
    from harness.fleet.driver import FleetNode, differing_openmp_waits

    def node(address, ids, policy=None, spin=None, refused=None, probe=True):
        waits = {"OMP_WAIT_POLICY": policy, "GOMP_SPINCOUNT": spin, "KMP_BLOCKTIME": None}
        return FleetNode(address, address, ids, {"openmp_wait": waits} if probe else {}, refused)

    nodes = [node("10.0.0.1", ["pi5"]), node("10.0.0.2", ["pi5"], "PASSIVE"), node("10.0.0.3", ["xeon"]),
             node("10.0.0.4", ["xeon"], "PASSIVE", refused="another build"), node("10.0.0.5", ["xeon"], probe=False),
             node("10.0.0.6", ["pi5"], spin="0")]
    (line,) = differing_openmp_waits(nodes)
    assert line.startswith("warning: hardware pi5's nodes wait differently in OpenMP: 10.0.0.1: unset; "
                           "10.0.0.2: OMP_WAIT_POLICY=PASSIVE; 10.0.0.6: GOMP_SPINCOUNT=0: "), line
    assert differing_openmp_waits([node("a", ["pi5"], "PASSIVE"), node("b", ["pi5"], " passive")]) == []


def test_a_driver_of_a_head_on_the_loopback_dials_the_loopback(monkeypatch, tmp_path):
    """`fleet run --address 127.0.0.1:6379` reaches a head that `fleet join --node-ip-address 127.0.0.1` started:
    Ray's setting is made before ray is imported, and only for a loopback address."""
    from harness.fleet.join import LOOPBACK_ENV, loopback_driver

    (name,) = LOOPBACK_ENV
    monkeypatch.setenv("RAY_TMPDIR", str(tmp_path))  # no cluster started on this machine
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    for address, set_ in (("127.0.0.1:6379", True), ("[::1]:6379", True), ("localhost:6379", True),
                          ("10.0.0.5:6379", False), ("auto", False), (None, False)):
        monkeypatch.delenv(name, raising=False)
        loopback_driver(address)
        assert (os.environ.get(name) == "0") is set_, address
    monkeypatch.delenv(name, raising=False)  # no --address: what connect() dials, $RAY_ADDRESS
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:6379")
    loopback_driver(None)
    assert os.environ.get(name) == "0"
    # neither: the cluster this machine started last, as Ray records it (the docs' own `fleet join --head` on the
    # loopback, then `fleet run` with no --address)
    monkeypatch.delenv(name)
    monkeypatch.delenv("RAY_ADDRESS")
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text("127.0.0.1:6390\n")
    loopback_driver(None)
    assert os.environ.get(name) == "0"


def test_join_advertises_the_hardware_id_and_a_benchmark_slot():
    pytest.importorskip("ray", reason="the fleet extra is not installed (pip install 'va-bench[fleet]')")
    from harness.cli import app

    runner = CliRunner()
    result = runner.invoke(app, ["fleet", "join", "--address", "127.0.0.1:6379", "--hardware-id", "rpi5",
                                 "--node-ip-address", "127.0.0.1", "--dry-run"])
    assert result.exit_code == 0, result.output
    assert '--resources={"hw:rpi5":1,"va-bench-slot":1}' in result.output
    assert "--address=127.0.0.1:6379" in result.output and "--node-ip-address=127.0.0.1" in result.output
    # a head on the loopback stays there (without it Ray swaps in the machine's address and listens everywhere);
    # Ray then refuses any other node, so a node's join is left as it was
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in result.output
    head = runner.invoke(app, ["fleet", "join", "--head", "--hardware-id", "a100", "--dry-run"])
    assert "--head" in head.output and "--include-dashboard=false" in head.output
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER" not in head.output
    local = runner.invoke(app, ["fleet", "join", "--head", "--node-ip-address", "127.0.0.1", "--dry-run"])
    assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0" in local.output, local.output
    for bad, words in ((["--hardware-id", "../x"], "cannot name a results folder"),
                       (["--hardware-id", "gpu1\n"], "cannot name a results folder"),
                       (["--hardware-id", "accuracy"], "cannot name a results folder"),
                       (["--head"], "either --head"), ([], "either --head")):
        result = runner.invoke(app, ["fleet", "join", "--address", "h:1", "--dry-run", *bad] if bad != [] else
                               ["fleet", "join", "--dry-run"])
        assert isinstance(result.exception, UsageError) and words in str(result.exception), (bad, result.output)


def test_without_ray_the_fleet_says_how_to_install_it_in_one_line():
    import subprocess
    import sys

    code = ("import sys; sys.modules['ray'] = None; from harness.cli import main; "
            "sys.argv = ['va-bench', 'fleet', 'run', '--limit', '16']; main()")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 2
    assert result.stderr.strip() == "error: va-bench fleet needs Ray, which is not installed: pip install " \
                                    "'va-bench[fleet]'"


def test_resuming_a_fleet_run_that_is_not_there_names_the_folder_as_given_and_absolute(tmp_path, monkeypatch):
    pytest.importorskip("ray", reason="the fleet extra is not installed (pip install 'va-bench[fleet]')")
    from harness.fleet.driver import prepare_fleet_resume

    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError) as info:
        prepare_fleet_resume("nope", "runs", {}, None, None, None, False, False)
    assert str(info.value) == (f"--output-dir runs: no fleet run nope to resume (no nope/fleet.json) "
                               f"({tmp_path / 'runs'}); check --output-dir and the run id")
    # `--output-dir=~/runs` (the shell leaves a `~` after `=` alone) is the home folder's, as a new fleet run's is
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "runs" / "f").mkdir(parents=True)
    (tmp_path / "runs" / "f" / "fleet.json").write_text("[]")
    with pytest.raises(UsageError) as info:
        prepare_fleet_resume("f", "~/runs", {}, None, None, None, False, False)
    assert "no fleet run f to resume" not in str(info.value), info.value


def test_an_unreachable_head_is_one_line_not_minutes_of_retries(tmp_path):
    ray = pytest.importorskip("ray", reason="the fleet extra is not installed (pip install 'va-bench[fleet]')")
    if ray.is_initialized():
        pytest.skip("this process is already connected to a cluster")
    from harness.fleet.driver import connect

    with pytest.raises(UsageError, match=r"cannot reach the Ray head at 127.0.0.1:1 \(Connection refused\)"):
        connect("127.0.0.1:1")
    with pytest.raises(UsageError, match="is not HOST:PORT"):
        connect("nonsense")


def test_auto_checks_the_cluster_this_machine_started_last(monkeypatch):
    """No --address: Ray's lookup names the cluster started here last, which may be long gone (Ray then retried
    it for minutes): it is checked like a given address."""
    ray = pytest.importorskip("ray", reason="the fleet extra is not installed (pip install 'va-bench[fleet]')")
    from harness.fleet import driver

    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(driver, "_auto_address", lambda: "127.0.0.1:1")
    with pytest.raises(UsageError, match=r"cannot reach the Ray head at 127.0.0.1:1 .*started last.*--address"):
        driver.connect(None)


def test_fleet_run_closes_its_ray_connection_before_the_json_document(monkeypatch):
    """Ray's driver prints the cluster's error messages (a raylet that died: dozens of lines) from a thread of its
    own to sys.stdout, seconds late: after `fleet run --json` had restored stdout, they followed the document
    there. The command closes the connection it made before the document; a process's own (a test's) stays."""
    ray = pytest.importorskip("ray", reason="the fleet extra is not installed (pip install 'va-bench[fleet]')")
    from types import SimpleNamespace

    from harness import cli
    from harness.fleet import driver
    from harness.views import fleet_view

    events, connected = [], []
    monkeypatch.setattr(ray, "is_initialized", lambda: bool(connected))
    monkeypatch.setattr(ray, "init", lambda **kwargs: connected.append(True))
    monkeypatch.setattr(ray, "shutdown", lambda: (events.append("shutdown"), connected.clear()))
    monkeypatch.setattr(driver, "check_reachable", lambda *args, **kwargs: None)
    monkeypatch.setattr(driver, "prepare_fleet", lambda config, address, hardware, shards: driver.connect(address))
    monkeypatch.setattr(driver, "run_fleet", lambda *args: events.append("run") or SimpleNamespace(problems={}))
    monkeypatch.setattr(fleet_view, "fleet_summary_json", lambda outcome: events.append("document") or {"ok": 1})
    for already_connected in (False, True):
        events[:] = []
        connected[:] = [True] if already_connected else []
        result = CliRunner().invoke(cli.app, ["fleet", "run", "--address", "127.0.0.1:6379", "--json"],
                                    obj={"typed_argv": ["fleet", "run", "--json"]})
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout) == {"ok": 1}
        assert events == (["run", "document"] if already_connected else ["run", "shutdown", "document"])
        assert connected == ([True] if already_connected else [])


# ------------------------------------------------------------------------------------- the cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Head "alpha" + raylet "beta" on 127.0.0.1: Ray binds to the loopback only when its node address is the
    loopback, which RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 makes it. Token authentication is off here (nothing
    outside this machine can reach the cluster, and Ray reads its mode once per process, which an earlier
    `import ray` in the session may already have done); docs/fleet.md says how to turn it on."""
    ray = pytest.importorskip("ray", reason="the fleet extra is not installed (pip install 'va-bench[fleet]')")
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    marker = tmp_path_factory.mktemp("fleet") / "kill-marker"
    env = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "disabled",
           "OMP_NUM_THREADS": "1",  # as --threads 1, which every sweep here uses: two "nodes" share two cores
           "VA_BENCH_TEST_FORWARD_MS": "2", "VA_BENCH_TEST_KILL_MARKER": str(marker),
           "VA_BENCH_TEST_KILL_AFTER_S": "2"}  # > the nodes' 0.5 s poll: the cell before the kill is sent
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        mp.setattr(ray_constants, "ENABLE_RAY_CLUSTER", False)  # read at import; the env var is for the raylets
        common = {"num_cpus": 1, "include_dashboard": False, "node_ip_address": "127.0.0.1"}
        c = Cluster(initialize_head=True, head_node_args={
            **common, "resources": {"hw:alpha": 1, "va-bench-slot": 1},
            "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 3}})
        sigterm = signal.getsignal(signal.SIGTERM)  # ray.init sets its own, which outlives ray.shutdown
        try:
            c.add_node(**common, resources={"hw:beta": 1, "va-bench-slot": 1})
            ray.init(address=c.address, log_to_driver=False)
            yield {"cluster": c, "common": common, "marker": marker}
        finally:
            ray.shutdown()
            c.shutdown()
            signal.signal(signal.SIGTERM, sigterm)  # the test files after this one in the worker get theirs back


def fleet(*args: str):
    """`va-bench fleet run ARGS` in this process (its Ray connection is the cluster fixture's)."""
    from harness import cli

    argv = ["fleet", "run", *args]
    return CliRunner().invoke(cli.app, argv, obj={"typed_argv": argv})  # as main() hands it over


def submissions(run_dir: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((run_dir / "submissions").glob("*.json"))]


def coordinates(doc: dict) -> tuple:
    """A cell's identity and its accuracy, as a submission states them."""
    return (doc["hardware"]["id"], doc["model"]["id"], doc["runtime"]["format"], doc["runtime"]["provider"],
            doc["config"]["input_size"], doc["config"]["batch_size"], doc["dataset"]["image_id_sha256"],
            doc["accuracy"]["mAP_50_95"])


@pytest.fixture(scope="module")
def two_hardware(cluster, tmp_path_factory):
    """yolox-nano + the synthetic plugin, batch 1 and 4, on alpha and beta; accuracy also in 3 shards."""
    out = tmp_path_factory.mktemp("fleet-out")
    result = fleet("--model", "yolox-nano", "--model", SYNTHETIC, "--backend", "pytorch", "--batch-sizes", "1",
                   "--batch-sizes", "4", *small(), "--accuracy-shards", "3", "--output-dir", str(out),
                   "--run-id", "two")
    return result, out / "two"


@requires_coco
@requires_yolox
def test_every_cell_lands_valid_under_its_hardware_folder(two_hardware):
    result, run_dir = two_hardware
    assert result.exit_code == 0, result.output
    schema = json.loads((CORPUS / "schemas" / "submission.v1.json").read_text()) if CORPUS.is_dir() else None
    support = json.loads((CORPUS / "support-matrix.json").read_text()) if CORPUS.is_dir() else None
    if support is not None:
        support["models"] = [*support["models"], "synthetic-sleepy"]
    for hw in ("alpha", "beta"):
        state = json.loads((run_dir / hw / "run.json").read_text())
        assert [c["status"] for c in state["cells"]] == ["ok"] * 4
        assert state["hardware"]["id"] == hw and state["environment"]["harness_commit"]
        docs = submissions(run_dir / hw)
        assert sorted((d["model"]["id"], d["config"]["batch_size"]) for d in docs) == [
            ("synthetic-sleepy", 1), ("synthetic-sleepy", 4), ("yolox-nano", 1), ("yolox-nano", 4)]
        for doc in docs:
            assert doc["hardware"]["id"] == hw
            assert (run_dir / hw / doc["artifacts"]["detections"]).is_file()
            if schema is not None:
                assert schema_findings(doc, schema) == [] and site_findings(doc, support) == []
        with open(run_dir / hw / "steps_timer.csv", newline="") as fh:  # rows of both groups, once each
            rows = list(csv.DictReader(fh))
        assert sorted({(r["model"], r["batch_size"]) for r in rows}) == [
            ("synthetic-sleepy", "1"), ("synthetic-sleepy", "4"), ("yolox-nano", "1"), ("yolox-nano", "4")]
        assert len(rows) == len({(r["model"], r["batch_size"], r["stage"]) for r in rows})
        memory = run_dir / hw / "memory.csv"
        if memory.is_file():  # the mprof timeline is memory.csv's, every task's samples (not the last task's)
            with open(memory, newline="") as fh:
                samples = list(csv.reader(fh))[1:]
            mem_lines = [line for line in (run_dir / hw / "memory.mprof.dat").read_text().splitlines()
                         if line.startswith("MEM ")]
            assert len(mem_lines) == len(samples) and len({s[1] for s in samples}) >= 2
    fleet_doc = json.loads((run_dir / "fleet.json").read_text())
    assert fleet_doc["targets"] == ["alpha", "beta"] and all(n["refused"] is None for n in fleet_doc["nodes"])
    # which machine ran each cell: a hardware id may name several
    node_ids = {hw: n["node_id"] for n in fleet_doc["nodes"] for hw in n["hardware_ids"]}
    for hw in ("alpha", "beta"):
        for cell in json.loads((run_dir / hw / "run.json").read_text())["cells"]:
            assert cell["node"]["node_id"] == node_ids[hw] and cell["node"]["address"] == "127.0.0.1", cell
    assert not list(run_dir.rglob("*.tmp"))


@requires_coco
@requires_yolox
def test_validate_and_aggregate_take_a_sharded_fleets_folder_whole(two_hardware):
    """Its accuracy/ (each group's merged detections and scores) holds no submission: validate read its files as
    broken ones (exit 1), aggregate counted them excluded."""
    from harness.results.reader import collect_files

    _, run_dir = two_hardware
    assert list((run_dir / "accuracy").rglob("*.json"))
    files, notes = collect_files([run_dir])
    assert sorted(files) == sorted((run_dir / hw / "submissions" / f) for hw in ("alpha", "beta")
                                   for f in os.listdir(run_dir / hw / "submissions"))
    assert any("of the fleet's sharded accuracy (accuracy/)" in n for n in notes), notes
    checked = run_in_process("validate", str(run_dir), "--no-warnings")
    assert checked.returncode == 0, checked.stdout + checked.stderr


@requires_coco
@requires_yolox
def test_the_fleet_equals_two_local_runs(two_hardware, tmp_path):
    from harness.cli import app

    _, run_dir = two_hardware
    fleet_cells = {coordinates(d) for hw in ("alpha", "beta") for d in submissions(run_dir / hw)}
    local_cells = set()
    for hw in ("alpha", "beta"):
        result = CliRunner().invoke(app, ["run", "--model", "yolox-nano", "--model", SYNTHETIC, "--backend", "pytorch",
                                          "--batch-sizes", "1", "--batch-sizes", "4", *small(), "--hardware-id", hw,
                                          "--output-dir", str(tmp_path), "--run-id", hw])
        assert result.exit_code == 0, result.output
        local_cells |= {coordinates(d) for d in submissions(tmp_path / hw)}
    assert len(fleet_cells) == 8
    assert fleet_cells == local_cells  # same cells, same mAP to the last digit
    # compare and report work on one hardware's run folder: the fleet's folder is refused with its run folders named
    for command in (["compare", str(run_dir), str(run_dir / "alpha")], ["report", str(run_dir)]):
        refused = run_in_process(*command)
        assert refused.returncode == 2 and "is a fleet run" in refused.stderr and "alpha, beta" in refused.stderr, \
            refused.stderr


@requires_coco
@requires_yolox
def test_sharded_accuracy_equals_the_unsharded_pass_to_the_last_digit(two_hardware):
    _, run_dir = two_hardware
    for model, slug in (("yolox-nano", "yolox-nano__pytorch__fp32__416"),
                        ("synthetic-sleepy", "synthetic-sleepy__pytorch__fp32__64")):
        sharded = json.loads((run_dir / "accuracy" / f"{slug}.json").read_text())
        assert [s["stop"] - s["start"] for s in sharded["shards"]] == [5, 5, 6] and sharded["batch_size"] == 1
        for hw in ("alpha", "beta"):
            unsharded = next(d for d in submissions(run_dir / hw)
                             if d["model"]["id"] == model and d["config"]["batch_size"] == 1)
            # the same values, undefined ones (COCOeval's -1) null with the same reason as the cells'
            metrics = {k: v for k, v in unsharded["accuracy"].items() if k in sharded["stats"]}
            assert len(set(metrics) - {"unavailable"}) == 12 and sharded["stats"] == metrics
            # the same detections in the same order, byte for byte: the merged shards are the unsharded pass's
            merged = (run_dir / sharded["detections_file"]).read_bytes()
            assert merged == (run_dir / hw / unsharded["artifacts"]["detections"]).read_bytes()
            assert sharded["num_detections"] == len(json.loads(merged))
            # its per_class file is the cell's: per-class AP, operating point, curves, confusion matrix
            classes = json.loads((run_dir / sharded["per_class_file"]).read_text())
            cell_classes = json.loads((run_dir / hw / unsharded["eval"]["per_class"]).read_text())
            assert classes == cell_classes
    assert sharded["stats"]["mAP_50_95"] < 0.01  # the synthetic plugin's one centred box scores ~0
    yolox = json.loads((run_dir / "accuracy" / "yolox-nano__pytorch__fp32__416.json").read_text())
    assert yolox["stats"]["mAP_50_95"] > 0.2  # a real detector on real images


def _statuses(run_dir: Path) -> dict[int, tuple[str, str | None]]:
    doc = json.loads((run_dir / "run.json").read_text())
    return {c["batch_size"]: (c["status"], c["reason"]) for c in doc["cells"]}


def _files(run_dir: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in run_dir.rglob("*")
            if p.is_file() and p.parent.name in ("submissions", "detections")}


@requires_coco
@pytest.mark.heavy  # ~50 s: `make test-slow`; a task that dies is also test_a_node_that_dies_marks_its_cells_...
def test_a_killed_task_marks_its_cells_the_rest_finishes_and_resume_completes(cluster, tmp_path):
    cluster["marker"].write_text("kill one task")
    args = ["--model", KILLED, "--backend", "pytorch", "--batch-sizes", "1", "--batch-sizes", "2", "--batch-sizes",
            "4", *small(warmup_batches=1200), "--output-dir", str(tmp_path)]
    first = fleet(*args, "--run-id", "k")
    assert first.exit_code == 1, first.output
    assert not cluster["marker"].exists()
    run_dir = tmp_path / "k"
    by_hw = {hw: _statuses(run_dir / hw) for hw in ("alpha", "beta")}
    killed = [hw for hw, s in by_hw.items() if s[2][0] != "ok"]
    assert len(killed) == 1, by_hw
    (hw,) = killed
    other = "beta" if hw == "alpha" else "alpha"
    assert {b: s for b, (s, _) in by_hw[other].items()} == {1: "ok", 2: "ok", 4: "ok"}
    assert by_hw[hw][1][0] == "ok"  # streamed before the kill
    for batch in (2, 4):
        state, reason = by_hw[hw][batch]
        assert state == "interrupted" and "died" in reason, reason
    assert f"{hw}: synthetic-sleepy pytorch fp32 64 b2" in first.output  # the summary names the cell
    before = _files(run_dir / hw)

    second = fleet("--resume", "k", "--output-dir", str(tmp_path))
    assert second.exit_code == 0, second.output
    for name in ("alpha", "beta"):
        assert {b: s for b, (s, _) in _statuses(run_dir / name).items()} == {1: "ok", 2: "ok", 4: "ok"}
        assert len(submissions(run_dir / name)) == 3
    after = _files(run_dir / hw)
    assert all(after[name] == data for name, data in before.items())  # finished cells untouched
    b2 = next(d for d in submissions(run_dir / hw) if d["config"]["batch_size"] == 2)
    assert b2["batch_invariance"]["reference_batch_size"] == 1  # measured against the cell of the first run
    assert len(json.loads((run_dir / "fleet.json").read_text())["resumed"]) == 1


@requires_coco
def test_a_node_that_dies_marks_its_cells_and_the_queued_ones(cluster, tmp_path, monkeypatch):
    """A third raylet ("gamma") is removed while it benchmarks: its running group is interrupted (the task
    died) and its queued group too (no node of that hardware is left); the driver does not hang."""
    from harness.config import RunConfig
    from harness.fleet import driver as fleet_module
    from harness.fleet.driver import prepare_fleet, run_fleet

    monkeypatch.setattr(fleet_module, "LIVENESS_EVERY_S", 0.5)  # the driver looks for dead nodes every 0.5 s, not 5
    c = cluster["cluster"]
    gamma = c.add_node(**cluster["common"], resources={"hw:gamma": 1, "va-bench-slot": 1})
    # a warm-up of 40 s at 2 ms a batch: the running cell is still running however late this test sees it running
    # (the node's poll, Ray's stream, this loop's), and the node's removal ends it long before
    config = RunConfig(models=[SYNTHETIC], backends=["pytorch"], input_sizes=[64, 96], batch_sizes=[1, 2],
                       subset="sample", limit=16, coco_dir=str(COCO_DIR), warmup_batches=20000, warmup_seconds=0,
                       min_timed_batches=2, threads=1, draw_images=0, energy=False, output_dir=str(tmp_path),
                       run_id="d")
    fplan = prepare_fleet(config, None, ["gamma"], 0)
    outcome: dict = {}
    driver = threading.Thread(target=lambda: outcome.setdefault("fleet", run_fleet(fplan, ["fleet", "run"])))
    driver.start()
    run_json = tmp_path / "d" / "gamma" / "run.json"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and "running" not in {s for s, _ in _safe_statuses(run_json).values()}:
        time.sleep(0.2)
    c.remove_node(gamma, allow_graceful=False)
    driver.join(timeout=180)
    assert not driver.is_alive(), "the driver hung after its node died"
    cells = json.loads(run_json.read_text())["cells"]
    assert {c["status"] for c in cells} == {"interrupted"}
    reasons = {c["input_size"][0]: c["reason"] for c in cells}
    assert "died" in reasons[64] and "no node of hardware gamma is alive" in reasons[96], reasons
    assert outcome["fleet"].problems


def campaign(*args: str):
    """`va-bench campaign ARGS` in this process (its Ray connection is the cluster fixture's)."""
    from harness import cli

    argv = ["campaign", *args]
    return CliRunner().invoke(cli.app, argv, obj={"typed_argv": argv})  # as main() hands it over


def _row(out: Path) -> dict:
    (path,) = (out / "c" / "submissions").glob("*.json")
    return json.loads(path.read_text())


@requires_coco
@pytest.mark.heavy  # a fleet campaign and a local one, ~1.5 min: `make test-slow`
def test_a_campaign_on_the_fleet_runs_a_task_per_dataset_and_gives_the_local_row(cluster, tmp_path):
    from rf100vl_fake import DATASETS, fake_rf100vl

    fake_rf100vl(tmp_path / "rf", tmp_path / "w")
    common = ["--rf100vl", str(tmp_path / "rf"), "--weights-root", str(tmp_path / "w"), "--model", "yolox-nano",
              "--campaign-id", "c", "--json"]
    several = campaign(*common, "--fleet", "--output-dir", str(tmp_path / "refused"))
    assert isinstance(several.exception, UsageError), several.output
    assert "hardware alpha, beta; a campaign's row is one machine's: choose one with --hardware" in str(
        several.exception)
    alone = campaign(*common, "--hardware", "beta", "--output-dir", str(tmp_path / "refused"))
    assert isinstance(alone.exception, UsageError) and "add --fleet" in str(alone.exception)
    assert not (tmp_path / "refused").exists()

    on_fleet = campaign(*common, "--fleet", "--hardware", "beta", "--output-dir", str(tmp_path / "fleet"))
    assert on_fleet.exit_code == 1, on_fleet.output  # "broken" is skipped: the row is partial
    here = campaign(*common, "--output-dir", str(tmp_path / "here"))
    assert here.exit_code == 1, here.output
    row, local = _row(tmp_path / "fleet"), _row(tmp_path / "here")
    assert row["hardware"]["id"] == "beta" and local["hardware"]["id"] != "beta"
    for name in DATASETS:  # each dataset ran on a node of beta and came back whole
        state = json.loads((tmp_path / "fleet" / "c" / "datasets" / name / "run.json").read_text())
        assert state["hardware"]["id"] == "beta" and [c["status"] for c in state["cells"]] == ["ok"]
    block, local_block = row["rf100vl"], local["rf100vl"]
    assert block["skipped_datasets"] == local_block["skipped_datasets"] == ["broken"]
    assert any(r.startswith("broken: ") and "not valid JSON" in r for r in block["invalid_reasons"])
    assert [d["dataset"] for d in block["datasets"]] == list(DATASETS)
    for mine, theirs in zip(block["datasets"], local_block["datasets"], strict=True):
        assert mine.keys() == theirs.keys()
        for key, value in mine.items():
            assert value == (pytest.approx(theirs[key], abs=1e-6) if isinstance(value, float) else theirs[key]), key
    assert row["accuracy"] == pytest.approx(local["accuracy"], abs=1e-6)
    assert row["repro"]["dataset"] == local["repro"]["dataset"]
    assert block["recipe_sha256"] == local_block["recipe_sha256"]  # the same campaign, wherever it ran
    assert not list((tmp_path / "fleet").rglob("*.incoming"))

    # resumed on the fleet after a dataset's run was lost: only that one runs again; the same row
    (tmp_path / "fleet" / "c" / "datasets" / "pets" / "run.json").unlink()
    kept = (tmp_path / "fleet" / "c" / "datasets" / "street" / "run.json").stat().st_mtime_ns
    again = campaign(*common, "--fleet", "--hardware", "beta", "--output-dir", str(tmp_path / "fleet"))
    assert again.exit_code == 1, again.output
    assert (tmp_path / "fleet" / "c" / "datasets" / "street" / "run.json").stat().st_mtime_ns == kept
    redo = _row(tmp_path / "fleet")
    for d in (row, redo):
        for key in ("created_at", "submission_id", "timing", "throughput", "memory", "metadata"):
            d.pop(key)
    assert redo == row


@requires_coco
def test_campaign_datasets_queued_for_hardware_that_is_gone_are_skipped_not_waited_for(cluster, tmp_path,
                                                                                       monkeypatch):
    import ray

    from harness.fleet import campaign as campaign_module
    from harness.fleet.campaign import prepare_campaign_fleet

    monkeypatch.setattr(campaign_module, "LIVENESS_EVERY_S", 0.5)  # looks for dead nodes every 0.5 s, not 5
    from harness.run.campaign import Campaign, CampaignEntry
    from harness.run.progress import SilentProgress

    c = cluster["cluster"]
    delta = c.add_node(**cluster["common"], resources={"hw:delta": 1, "va-bench-slot": 1})
    runner = prepare_campaign_fleet(None, "delta")
    c.remove_node(delta, allow_graceful=False)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and any(n["Alive"] and "hw:delta" in n["Resources"] for n in ray.nodes()):
        time.sleep(0.1)
    (tmp_path / "d" / "test").mkdir(parents=True)
    (tmp_path / "d" / "test" / "_annotations.coco.json").write_text('{"images": [], "annotations": [], '
                                                                    '"categories": []}')
    (tmp_path / "w.pt").write_bytes(b"weights")
    entry = CampaignEntry("d", str(tmp_path / "d"), str(tmp_path / "w.pt"), None, "test")
    results = list(runner(Campaign("yolox-nano", [entry], "test"), [entry], tmp_path / "out", [], SilentProgress()))
    assert [(r.name, r.submission) for r in results] == [("d", None)]
    assert results[0].reason.startswith("no node of hardware delta is alive any more"), results[0].reason


def _safe_statuses(run_json: Path) -> dict:
    try:
        return {c["cell"]: (c["status"], c["reason"]) for c in json.loads(run_json.read_text())["cells"]}
    except (OSError, ValueError, KeyError):
        return {}


@requires_coco
def test_nodes_of_another_build_are_refused_with_one_line(cluster, tmp_path, monkeypatch):
    from harness.config import RunConfig
    from harness.fleet import driver as fleet_module

    real = fleet_module.build_fingerprint
    monkeypatch.setattr(fleet_module, "build_fingerprint", lambda: {**real(), "harness_commit": "f" * 40})
    config = RunConfig(models=[SYNTHETIC], backends=["pytorch"], subset="sample", limit=16, coco_dir=str(COCO_DIR),
                       output_dir=str(tmp_path))
    with pytest.raises(UsageError) as info:
        fleet_module.prepare_fleet(config, None, None, 0)
    message = str(info.value)
    assert "\n" not in message and "no node of the Ray cluster can run benchmarks" in message
    for hw in ("alpha", "beta"):
        assert f"[{hw}] refused: its build differs from the driver's (harness commit ffffffffffff -> " in message
    assert not list(tmp_path.iterdir())  # nothing written


@requires_coco
def test_unknown_hardware_and_bad_options_are_usage_errors(cluster, tmp_path):
    out = ["--model", SYNTHETIC, "--backend", "pytorch", *small(), "--output-dir", str(tmp_path)]
    unknown = fleet(*out, "--hardware", "gamma-none")
    assert isinstance(unknown.exception, UsageError)
    assert "no accepted node of hardware gamma-none in the cluster (it has: alpha, beta" in str(unknown.exception)
    for bad, words in ((["--hardware-id", "x"], "--hardware-id does not apply"),
                       (["--no-accuracy", "--accuracy-shards", "2"], "drop --no-accuracy"),
                       (["--accuracy-shards", "17"], "more than the 16 batches")):
        result = fleet(*out, *bad)
        assert isinstance(result.exception, UsageError) and words in str(result.exception), result.output
    assert not list(tmp_path.iterdir())


def test_fleet_modules_on_the_driver_side_load_no_torch():
    import subprocess
    import sys

    code = ("import sys; import harness.fleet.gather, harness.fleet.shards, harness.views.fleet_view; "
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ}).stdout.strip()
    assert out == "False"


def test_a_cells_submission_path_from_a_node_stays_inside_the_run(tmp_path):
    """A node reports where each cell's submission is; the driver reads those files back (and sends them to a node
    that resumes the group), so a path outside the run folder is refused like a file sent there."""
    from harness.fleet.gather import HardwareFolder, NodeUpdate
    from harness.records import Cell, LoadKey

    cell = Cell(LoadKey("yolox-nano", "onnxruntime", "fp32", (416, 416)), 1)
    folder = HardwareFolder.create(tmp_path, "r1", "cpu_x", {}, [cell])
    try:
        status = {"cell": cell.label, "status": "ok", "reason": None, "submission": "submissions/a.json"}
        folder.apply(NodeUpdate({"node_id": "n"}, {}, [status]), {})
        assert folder.state.cells[cell.label].submission == "submissions/a.json"
        secret = tmp_path / "secret.txt"
        secret.write_text("token")
        folder.state.cells[cell.label].state = "running"  # a node runs the cell again (a resumed group)
        with pytest.raises(ValueError, match="outside its run folder"):
            folder.apply(NodeUpdate({"node_id": "n"}, {}, [{**status, "submission": str(secret)}]), {})
        assert folder.state.cells[cell.label].state == "running"  # refused before any status changed
    finally:
        folder.close()


@requires_coco
@requires_yolox
def test_fleet_resume_refuses_ground_truth_edited_since_the_run_started(tmp_path, monkeypatch):
    """As `run --resume`: labels edited since the fleet run started (fleet.json's annotations_sha256) are refused
    before the cluster is reached."""
    from conftest import SUBSET_ANNOTATIONS

    from harness.config import build_config
    from harness.errors import UsageError
    from harness.fleet import driver
    from harness.fleet.fingerprint import build_fingerprint
    from harness.run.plan import prepare

    source = json.loads(SUBSET_ANNOTATIONS.read_text())
    images = sorted(source["images"], key=lambda i: i["id"])[:4]
    ids = {i["id"] for i in images}
    (tmp_path / "images").mkdir()
    for i in images:
        (tmp_path / "images" / i["file_name"]).symlink_to(SUBSET_ANNOTATIONS.parents[1] / "val2017" / i["file_name"])
    ann = tmp_path / "annotations.json"
    data = {"images": images, "annotations": [a for a in source["annotations"] if a["image_id"] in ids],
            "categories": source["categories"]}
    ann.write_text(json.dumps(data))
    out = tmp_path / "out"
    config = build_config({"models": ["yolox-nano"], "dataset": str(ann), "output_dir": str(out), "run_id": "f1"})
    plan = prepare(config, dry_run=True)
    (out / "f1" / "hw1").mkdir(parents=True)
    (out / "f1" / "fleet.json").write_text(json.dumps({"run_id": "f1", "config": config.model_dump(),
                                                       "targets": ["hw1"], "accuracy_shards": 0,
                                                       "build": build_fingerprint(),
                                                       "annotations_sha256": plan.dataset.annotations_sha256()}))
    (out / "f1" / "hw1" / "run.json").write_text(json.dumps({"run_id": "f1", "config": config.model_dump(),
                                                              "dataset": plan.dataset.describe(), "cells": []}))
    ann.write_text(json.dumps({**data, "annotations": data["annotations"][3:]}))  # labels edited

    class Reached(Exception):
        pass

    def connect(address):
        raise Reached

    monkeypatch.setattr(driver, "connect", connect)
    with pytest.raises(UsageError, match="ground truth"):
        driver.prepare_fleet_resume("f1", str(out), {}, None, None, None, False, False)


def test_the_resume_line_dials_the_head_the_run_was_given():
    """A driver away from the head (its --address given) was told to resume without it: pasted, that dialled
    $RAY_ADDRESS or this machine's last cluster ("cannot reach the Ray head")."""
    from types import SimpleNamespace

    from harness.fleet.driver import FleetPlan

    plan = SimpleNamespace(run_id="fl3", run_dir=Path("/runs dir/fl3"))
    given = FleetPlan(plan, {}, [], [], {}, 0, address="10.0.0.5:6379")
    assert given.resume_command() == ("va-bench fleet run --resume fl3 --address 10.0.0.5:6379 --output-dir "
                                      "'/runs dir'")
    assert FleetPlan(plan, {}, [], [], {}, 0).resume_command() == "va-bench fleet run --resume fl3 --output-dir " \
                                                                  "'/runs dir'"


@requires_coco
@requires_yolox
def test_shards_go_to_accepted_nodes_of_the_runs_hardware_only(cluster, tmp_path):
    """A node the survey refused (another build, no dataset) failed every shard it took, and took the most (it
    failed fastest); a node of hardware outside --hardware is not the run's to use either."""
    from harness.config import RunConfig
    from harness.fleet.driver import prepare_fleet, run_fleet

    config = RunConfig(models=["yolox-nano"], backends=["pytorch"], batch_sizes=[1], subset="sample", limit=16,
                       coco_dir=str(COCO_DIR), warmup_batches=1, warmup_seconds=0, min_timed_batches=2, threads=1,
                       draw_images=0, energy=False, layers=False, profile=False, output_dir=str(tmp_path),
                       run_id="s")
    fplan = prepare_fleet(config, None, ["alpha"], 4)
    alpha = next(n for n in fplan.nodes if "alpha" in n.hardware_ids)
    outcome = run_fleet(fplan, ["fleet", "run"])
    assert outcome.accuracy["yolox-nano__pytorch__fp32__416"]["status"] == "ok", outcome.accuracy
    shards = [json.loads(p.read_text()) for p in (tmp_path / "s" / "accuracy").rglob("shard-*[0-9].json")]
    assert len(shards) == 4 and {s["node"]["node_id"] for s in shards} == {alpha.node_id}
    # a refused node of the run's hardware takes none either: each of its would-be shards is placed elsewhere
    fplan = prepare_fleet(config.model_copy(update={"run_id": "t"}), None, None, 4)
    beta = next(n for n in fplan.nodes if "beta" in n.hardware_ids)
    beta.refused = "its build differs from the driver's (as a test says)"
    fplan.targets = ["alpha"]
    run_fleet(fplan, ["fleet", "run"])
    shards = [json.loads(p.read_text()) for p in (tmp_path / "t" / "accuracy").rglob("shard-*[0-9].json")]
    assert {s["node"]["node_id"] for s in shards} == {alpha.node_id}


@requires_coco
@requires_yolox
def test_a_forced_resume_on_part_of_the_hardware_runs_there_and_refuses_another_run_id(two_hardware):
    """A run that lost a node's hardware is finished on the rest with --force --hardware; --run-id or a path
    beside --resume is refused, as `va-bench run --resume` refuses it."""
    from harness.fleet.driver import prepare_fleet_resume

    _, run_dir = two_hardware
    out = str(run_dir.parent)
    with pytest.raises(UsageError, match="hardware: alpha, beta -> alpha.*add --force"):
        prepare_fleet_resume("two", out, {}, None, ["alpha"], None, False, False)
    assert prepare_fleet_resume("two", out, {}, None, ["alpha"], None, True, False).targets == ["alpha"]
    with pytest.raises(UsageError, match="drop --run-id other"):
        prepare_fleet_resume("two", out, {"run_id": "other"}, None, None, None, False, False)
    with pytest.raises(UsageError, match="not a run id"):
        prepare_fleet_resume("../two", out, {}, None, None, None, False, False)


def test_a_task_that_failed_before_its_first_update_names_where_it_ran():
    ray = pytest.importorskip("ray")
    from harness.fleet.driver import FleetDriver, FleetNode, _Task
    from harness.records import LoadKey

    key = LoadKey("m", "pytorch", "fp32", (64, 64))
    error = ray.exceptions.RayTaskError("detect_shard", "Traceback ...", ValueError("no COCO here"), ip="10.0.0.7")
    state, reason = FleetDriver._failure(None, error, _Task("group", "gamma", key))
    assert state == "failed" and reason.startswith("the task on 10.0.0.7 raised ValueError: no COCO here"), reason
    node = FleetNode("n1", "10.0.0.8", ["gamma"], probe={"node": {"host": "jetson-2"}})
    state, reason = FleetDriver._failure(None, error, _Task("shard", None, key, placed_on=node))
    assert "the task on node 10.0.0.8 (jetson-2) [gamma] raised" in reason, reason


def test_a_node_sends_its_header_once_its_scheduler_has_written_the_environment(tmp_path, monkeypatch):
    """The seeded run.json a group starts from holds no environment: a first update read from it must not be
    the header the driver keeps for the hardware folder."""
    import types

    import harness.fleet.node as node_module
    import harness.run.scheduler as scheduler_module
    from harness.files import atomic_write_json

    run_dir = tmp_path / "r1"
    run_dir.mkdir()
    seeded = {"run_id": "r1", "config": {"models": ["m"]}, "cells": [{"cell": "a", "status": "pending"}]}
    atomic_write_json(run_dir / "run.json", seeded)
    read = {status: threading.Event() for status in ("pending", "running")}
    reader = node_module.read_run_json

    def read_and_tell(*args):  # the node's poll, telling the fake scheduler what it has read
        doc = reader(*args)
        read.get(doc["cells"][0]["status"], threading.Event()).set()
        return doc

    class SlowScheduler:  # the real one resolves models and measures first: the node polls the seed meanwhile
        def __init__(self, plan, argv, stop):
            self.plan = plan

        def run(self):  # as the real one writes run.json: atomically, the seed read before its first write
            assert read["pending"].wait(60)
            doc = {**seeded, "environment": {"harness_commit": "abc"}, "hardware": {"id": "alpha", "cpu": "x"},
                   "cells": [{"cell": "a", "status": "running"}]}
            atomic_write_json(run_dir / "run.json", doc)
            assert read["running"].wait(60)
            atomic_write_json(run_dir / "run.json", {**doc, "cells": [{"cell": "a", "status": "ok"}]}, indent=1)

    monkeypatch.setattr(node_module, "POLL_SECONDS", 0.05)
    monkeypatch.setattr(node_module, "read_run_json", read_and_tell)
    monkeypatch.setattr(scheduler_module, "Scheduler", SlowScheduler)
    updates = list(node_module._stream(types.SimpleNamespace(run_dir=run_dir), [], {"host": "h"}))
    headers = [u.header for u in updates if u.header]
    assert updates[0].cells == seeded["cells"] and not updates[0].header  # the seed was read: the case in question
    assert len(headers) == 1 and headers[0]["environment"] == {"harness_commit": "abc"}, headers
    assert headers[0]["hardware"]["cpu"] == "x" and updates[-1].cells == [{"cell": "a", "status": "ok"}]


def test_the_fleet_summary_keeps_a_long_hardware_id_whole_in_80_columns(tmp_path):
    import io
    import types

    from rich.console import Console

    from harness.views.fleet_view import print_fleet_summary

    def status(label, state):
        return types.SimpleNamespace(state=state, submission=None, to_dict=lambda: {
            "cell": label, "status": state, "reason": "killed" if state != "ok" else None})

    long_id = "cpu-amd-epyc-7b13-64-core-processor-x2-ubuntu-24.04"
    folders = {hw: types.SimpleNamespace(run_dir=tmp_path / hw, state=types.SimpleNamespace(cells={
        "a": status("yolox-nano/pytorch/fp32/416x416/b8", "failed")})) for hw in (long_id, "beta")}
    outcome = types.SimpleNamespace(run_id="f1", fleet_dir=tmp_path, folders=folders, accuracy={}, refusals=[],
                                    problems={}, resume_command="")
    buffer = io.StringIO()
    print_fleet_summary(Console(file=buffer, width=80, color_system=None), outcome)
    out = buffer.getvalue()
    assert max(len(line) for line in out.splitlines()) <= 80, out
    assert long_id in out and "f1 on beta" in out and out.count("yolox-nano/pytorch/fp32/416x416/b8") == 2, out


def test_the_fleet_summary_says_each_server_cells_trial_as_a_run_does(tmp_path):
    """`fleet run --scenario server` printed no trial and --json had no `server`, though each submission has it."""
    import io
    import types

    from rich.console import Console

    from harness.views.fleet_view import fleet_summary_json, print_fleet_summary

    server = {"latency_bound_ms": 200, "at_qps": {"qps": 5, "bound_held": False, "achieved_qps": 4.8,
                                                  "latency_ms": {"p50": 120.0, "p99": 251.5}}}
    run_dir = tmp_path / "box"
    (run_dir / "submissions").mkdir(parents=True)
    (run_dir / "submissions" / "c.json").write_text(json.dumps({"server": server, "throughput": {}}))
    status = types.SimpleNamespace(state="ok", submission="submissions/c.json", to_dict=lambda: {
        "cell": "yolox-nano onnxruntime fp32 416 b1", "status": "ok", "reason": None})
    outcome = types.SimpleNamespace(run_id="f1", fleet_dir=tmp_path, accuracy={}, refusals=[], problems={},
                                    resume_command="", folders={"box": types.SimpleNamespace(
                                        run_dir=run_dir, state=types.SimpleNamespace(cells={"a": status}))})
    buffer = io.StringIO()
    print_fleet_summary(Console(file=buffer, width=200, color_system=None), outcome)
    assert "box: yolox-nano onnxruntime fp32 416 b1: server at 5 qps: p99 251.5 ms against 200 ms, NOT held" in \
        buffer.getvalue(), buffer.getvalue()
    (cell,) = fleet_summary_json(outcome)["cells"]
    assert cell["server"] == server


def test_a_continuing_group_takes_the_folders_environment_only_once_a_node_has_reported_one(tmp_path):
    """The driver's folder starts with an empty environment and a placeholder hardware block: a group continued
    before any node reported (its task died before its scheduler wrote run.json) must record its own, or the folder
    keeps the empty one for good (the node sends a header only once one is written)."""
    import types

    from harness.fleet.node import GroupJob, _seed_folder
    from harness.records import LoadKey

    key = LoadKey("m", "pytorch", "fp32", (64, 64))
    placeholder = {"environment": {}, "hardware": {"id": "alpha"}, "device": "cpu"}
    job = GroupJob("r1", "alpha", {}, key, [], {}, "sha", cells=[{"cell": "a", "status": "failed"}], header=placeholder)
    doc = _seed_folder(tmp_path / "first", job, [types.SimpleNamespace(label="a")])
    assert not {"environment", "hardware", "device"} & set(doc) and doc["cells"][0]["status"] == "failed"
    reported = {"environment": {"harness_commit": "abc"}, "hardware": {"id": "alpha", "cpu": "x"}, "device": "cpu"}
    job.header = reported
    doc = _seed_folder(tmp_path / "later", job, [types.SimpleNamespace(label="a")])
    assert {k: doc[k] for k in reported} == reported
    # the finished cells' files the driver sends land inside the scratch folder, or nowhere
    job.files = {"submissions/a.json": b"{}", "../escaped.json": b"{}"}
    with pytest.raises(ValueError, match="the driver sent a file outside its run folder: '../escaped.json'"):
        _seed_folder(tmp_path / "sent" / "run", job, [types.SimpleNamespace(label="a")])
    assert not (tmp_path / "sent" / "escaped.json").exists()


def test_joining_a_head_that_is_not_there_or_no_address_at_all_is_one_line(tmp_path):
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    for address, words in (("foo", "'foo' is not HOST:PORT"), (f"127.0.0.1:{port}", "cannot reach the Ray head")):
        result = run_in_process("fleet", "join", "--address", address, "--hardware-id", "zeta")
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.returncode == 2 and len(lines) == 1 and words in lines[0], result.stderr
