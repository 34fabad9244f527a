"""`va-bench fleet run`: one plan over a Ray cluster, driven from here.

- Nodes join with `va-bench fleet join`, which advertises two Ray resources: `hw:<hardware id>` (1) and
  `va-bench-slot` (1). A group of cells (one model, backend, precision, input size and its batch sizes)
  for hardware X is a Ray task asking for both, so it lands on a node of hardware X and never shares that
  node with another benchmark or accuracy shard; the node runs the ordinary scheduler and executor on it
  (harness/fleet/node.py) and streams each cell's status and files back as it finishes.
- The driver gathers everything into outputs/<run_id>/<hardware id>/ (an ordinary run folder, see
  harness/fleet/gather.py), writes outputs/<run_id>/fleet.json (configuration, build, nodes, accuracy), and
  with `--accuracy-shards N` splits each group's accuracy pass over any nodes (a slot each), merges the
  shards' detections and runs one COCO evaluation (outputs/<run_id>/accuracy/).
- Before anything is sent, every node is probed: a node whose harness commit, sources or package versions
  differ from the driver's is refused with one line. A task that raises marks its unfinished cells
  `failed`; a task whose worker or node dies marks them `interrupted`; the rest of the fleet goes on, and
  `--resume RUN_ID` runs what is unfinished.

Ray is the engine: placement, queueing per device and fault reporting are Ray's; this module only turns a
plan into tasks and their results into files.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from harness.config import SAFE_ID, RunConfig, reserved_name
from harness.detector.protocol import task_of
from harness.errors import RunInterrupted, UsageError, exception_line
from harness.eval.coco_eval import (
    defined_stats,
    evaluate_cell_file,
    evaluator_version,
    max_dets_for,
    operating_point_summary,
    per_class_document,
)
from harness.figures import count_of
from harness.files import atomic_write_bytes, atomic_write_json
from harness.fleet.fingerprint import build_differences, build_fingerprint
from harness.fleet.gather import HardwareFolder
from harness.fleet.join import ACCURACY_DIR, RESERVED_IDS, SLOT, check_reachable, hardware_resource, node_resources
from harness.fleet.node import GroupJob, ShardJob
from harness.fleet.shards import Shard, merge_result_files, split_shards
from harness.records import LoadKey, utc_now_iso
from harness.results.artifacts import load_slug
from harness.results.reader import FLEET_FILE, read_fleet_json
from harness.run.plan import RunPlan, prepare
from harness.run.progress import SilentProgress
from harness.run.resume import check_resume_id, ground_truth_change, refuse_differences, resumed_config, runnable
from harness.run.signals import Interrupted, protected
from harness.shell import recordable

PROBE_TIMEOUT_S = 120.0
_CONNECTED_HERE = False  # connect() made this process's Ray connection, so disconnect() closes it
LIVENESS_EVERY_S = 5.0


# ------------------------------------------------------------------------------------------ Ray tasks


def node_info() -> dict:
    return {"node_id": ray.get_runtime_context().get_node_id(), "host": socket.gethostname(),
            "address": ray.util.get_node_ip_address(), "pid": os.getpid()}


# A group's worker process ends with its task (max_calls=1): the scheduler runs in a thread of it, which must
# never outlive the task into another benchmark. max_retries=0 everywhere: a task that died is reported and
# resumed by the user, never silently run twice. Shards and probes leave nothing running: workers are reused.
@ray.remote(num_cpus=0, max_calls=1, max_retries=0)
def _group_task(job: GroupJob):
    from harness.fleet.node import run_group

    yield from run_group(job, node_info())


@ray.remote(num_cpus=0, max_retries=0)
def _shard_task(job: ShardJob) -> dict:
    from harness.fleet.node import detect_shard

    return {**detect_shard(job), "node": node_info()}


@ray.remote(num_cpus=0, max_retries=0)
def _probe_task() -> dict:
    from harness.fleet.node import probe

    return {**probe(), "node": node_info()}


# -------------------------------------------------------------------------------------------- nodes


@dataclass
class FleetNode:
    """A node of the cluster that advertises a hardware id, and whether the driver accepts it."""

    node_id: str
    address: str
    hardware_ids: list[str]
    probe: dict | None = None
    refused: str | None = None

    def describe(self) -> str:
        host = (self.probe or {}).get("node", {}).get("host")
        return f"node {self.address}{f' ({host})' if host else ''} [{', '.join(self.hardware_ids)}]"

    def to_dict(self) -> dict:
        probe = self.probe or {}
        return {"node_id": self.node_id, "address": self.address, "hardware_ids": self.hardware_ids,
                "host": probe.get("node", {}).get("host"), "torch_threads": probe.get("torch_threads"),
                "cpu_count": probe.get("cpu_count"), "openmp_wait": probe.get("openmp_wait"), "refused": self.refused}


def differing_openmp_waits(nodes: list[FleetNode]) -> list[str]:
    """A warning for each hardware id whose accepted nodes wait differently in OpenMP (OMP_WAIT_POLICY,
    GOMP_SPINCOUNT, KMP_BLOCKTIME): spinning and passive threads time a PyTorch CPU forward 1.4-2x apart on a busy
    machine, and the id's cells come from whichever node ran them."""
    by_id: dict[str, dict[str, list[FleetNode]]] = {}
    for node in nodes:
        waits = (node.probe or {}).get("openmp_wait")
        if node.refused is not None or waits is None:  # a node of an older build says nothing of it
            continue
        setting = ", ".join(f"{k}={str(v).strip().upper()}" for k, v in sorted(waits.items()) if v is not None) or \
            "unset"  # OpenMP reads them regardless of case: passive is PASSIVE
        for hardware_id in node.hardware_ids:
            by_id.setdefault(hardware_id, {}).setdefault(setting, []).append(node)
    return [f"warning: hardware {hardware_id}'s nodes wait differently in OpenMP: "
            + "; ".join(f"{', '.join(n.address for n in group)}: {setting}" for setting, group in settings.items())
            + ": a PyTorch CPU cell's time then depends on the node that ran it; set the same on each (join them "
              "with the same environment)"
            for hardware_id, settings in sorted(by_id.items()) if len(settings) > 1]


def connect(address: str | None) -> None:
    """Join the Ray cluster at `address` as a driver ("auto": $RAY_ADDRESS or the cluster started on this
    machine). A process already connected (tests, notebooks) keeps its connection."""
    global _CONNECTED_HERE
    if ray.is_initialized():
        return
    target = address or os.environ.get("RAY_ADDRESS")
    if target and target != "auto":
        check_reachable(target)  # ray.init retries an unreachable head for minutes before it says so
    elif looked_up := _auto_address():  # the cluster this machine started last, maybe long gone
        check_reachable(looked_up, given=False)
    main = threading.current_thread() is threading.main_thread()
    sigterm = signal.getsignal(signal.SIGTERM) if main else None
    try:
        ray.init(address=address or "auto", log_to_driver=False, configure_logging=False)
        _CONNECTED_HERE = True
        if main:  # ray.init installs a SIGTERM handler that exits on the spot; ours stops cleanly
            signal.signal(signal.SIGTERM, sigterm)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        raise UsageError(f"cannot reach a Ray cluster at {address or 'auto'} ({exception_line(exc)}); start one with "
                         "`va-bench fleet join --head` and pass --address HOST:PORT (a cluster with token "
                         "authentication also needs RAY_AUTH_MODE=token and its token here)") from exc


def disconnect() -> None:
    """Close the connection connect() made (one a test or notebook made stays). Ray's driver keeps a thread that
    prints the cluster's error messages (a raylet that died, dozens of lines) to whatever sys.stdout is when they
    arrive, seconds late: after a `--json` command has restored stdout, they would follow its document there."""
    global _CONNECTED_HERE
    if _CONNECTED_HERE and ray.is_initialized():
        ray.shutdown()  # stops and joins that thread
    _CONNECTED_HERE = False


def _auto_address() -> str | None:
    """The head `ray.init(address="auto")` would join (Ray's own lookup of the cluster started on this machine);
    None when there is none or Ray cannot say."""
    try:
        from ray._private.services import canonicalize_bootstrap_address  # no public equivalent in Ray 2.x
    except ImportError:
        return None
    try:
        return canonicalize_bootstrap_address("auto")
    except Exception:  # noqa: BLE001 (its lookup's own errors: ray.init says them)
        return None


def survey(build: dict, timeout_s: float = PROBE_TIMEOUT_S) -> list[FleetNode]:
    """Every alive node that advertises a hardware id, probed where it runs; refused (with the reason)
    when its build differs from `build`, it cannot hold a benchmark, or it does not answer."""
    nodes = []
    for n in ray.nodes():
        hardware = sorted(k.split(":", 1)[1] for k in n.get("Resources", {}) if k.startswith("hw:"))
        if n.get("Alive") and hardware:
            node = FleetNode(n["NodeID"], n.get("NodeManagerAddress", "?"), hardware)
            bad = [h for h in hardware if not re.fullmatch(SAFE_ID, h) or h in RESERVED_IDS or reserved_name(h)]
            if bad:
                node.refused = (f"hardware id {bad[0]!r} cannot name a results folder (letters, digits, '_', '.', "
                                "'-'; not 'accuracy')")
            elif SLOT not in n.get("Resources", {}):
                node.refused = f"it has no {SLOT} resource; join it with `va-bench fleet join`"
            nodes.append(node)
    probes = {_probe_task.options(scheduling_strategy=NodeAffinitySchedulingStrategy(n.node_id, soft=False))
              .remote(): n for n in nodes if n.refused is None}
    ready, late, deadline = [], list(probes), time.monotonic() + timeout_s
    while late and time.monotonic() < deadline:
        with protected():  # Ctrl-C is raised between Ray calls, never inside one (see _loop)
            done, late = ray.wait(late, num_returns=len(late), timeout=1.0)
        ready += done
    for ref in late:
        probes[ref].refused = f"it did not answer the driver's probe within {timeout_s:.0f} s"
        ray.cancel(ref, force=True)
    for ref in ready:
        node = probes[ref]
        try:
            node.probe = ray.get(ref)
        except ray.exceptions.RayError as exc:
            node.refused = f"its probe failed ({exception_line(task_cause(exc))})"
            continue
        differences = build_differences(build, node.probe["build"])
        if differences:
            node.refused = "its build differs from the driver's (" + "; ".join(differences) + ")"
    return nodes


def choose_targets(nodes: list[FleetNode], requested: list[str] | None) -> list[str]:
    """The hardware ids to run on: `requested`, or every hardware id of an accepted node."""
    accepted = sorted({h for n in nodes if n.refused is None for h in n.hardware_ids})
    refusals = "; ".join(f"{n.describe()} refused: {n.refused}" for n in nodes if n.refused)
    if requested:
        missing = [h for h in dict.fromkeys(requested) if h not in accepted]
        if missing:
            raise UsageError(f"no accepted node of hardware {', '.join(missing)} in the cluster (it has: "
                             f"{', '.join(accepted) or 'none'}){'; ' + refusals if refusals else ''}; join one with "
                             "`va-bench fleet join --hardware-id ID`")
        return list(dict.fromkeys(requested))
    if not accepted:
        raise UsageError("no node of the Ray cluster can run benchmarks: "
                         + (refusals or "none advertises a hardware id; join devices with `va-bench fleet join`"))
    return accepted


# --------------------------------------------------------------------------------------------- plan


@dataclass
class FleetPlan:
    """A configuration resolved on the driver, and the fleet it will run on."""

    plan: RunPlan  # cells, dataset variant and detectors as the driver resolves them
    specs: dict[str, str]  # model id -> the --model value that names it (nodes resolve that value)
    targets: list[str]
    nodes: list[FleetNode]
    build: dict
    shards: int
    fleet_doc: dict | None = None  # fleet.json of the run being resumed
    retry_failed: bool = False
    address: str | None = None  # --address as given: the resume line dials the same head

    def resume_command(self) -> str:
        """The command that finishes this run: from another machine than the head, with the head's address."""
        address = f" --address {shlex.quote(self.address)}" if self.address else ""
        return (f"va-bench fleet run --resume {self.run_id}{address} --output-dir "
                f"{shlex.quote(str(self.fleet_dir.parent))}")

    @property
    def run_id(self) -> str:
        return self.plan.run_id

    @property
    def fleet_dir(self) -> Path:
        return self.plan.run_dir

    @property
    def refusals(self) -> list[str]:
        return [f"{n.describe()} refused: {n.refused}" for n in self.nodes if n.refused]


def _check_options(config: RunConfig, shards: int) -> None:
    if config.hardware_id:
        raise UsageError("--hardware-id does not apply to `fleet run`: each node runs under the id it joined with "
                         "(`va-bench fleet join --hardware-id ID`); choose hardware with --hardware ID")
    if shards and not config.accuracy:
        raise UsageError("--accuracy-shards splits the accuracy pass; drop --no-accuracy or the shards")
    if config.repeats > 1:
        raise UsageError("--repeats runs extra processes on this machine; `fleet run` does not repeat cells: drop it")
    if config.input_source == "synthetic":
        raise UsageError("--input synthetic is a local timing run; `fleet run` benchmarks a dataset on every node: "
                         "run `va-bench run --input synthetic` on each machine instead")


def _model_specs(config: RunConfig, plan: RunPlan) -> dict[str, str]:
    ids = list(plan.detectors)
    if len(ids) != len(config.models):
        raise UsageError("two --model values name the same model id; give each model once")
    return dict(zip(ids, config.models, strict=True))


def prepare_fleet(config: RunConfig, address: str | None, hardware: list[str] | None, shards: int) -> FleetPlan:
    """Resolve the configuration (as `va-bench run` would, writing nothing), then survey the cluster."""
    _check_options(config, shards)
    plan = prepare(config)
    specs = _model_specs(config, plan)
    if shards:
        split_shards(plan.variant.num_images, min(config.batch_sizes), shards)  # refuses too many shards
    build = build_fingerprint()
    connect(address)
    nodes = survey(build)
    return FleetPlan(plan, specs, choose_targets(nodes, hardware), nodes, build, shards, address=address)


def prepare_fleet_resume(run_id: str, output_dir: str | None, overrides: dict, address: str | None,
                         hardware: list[str] | None, shards: int | None, force: bool,
                         retry_failed: bool) -> FleetPlan:
    """The plan of an existing fleet run, to finish it; refuses (UsageError) other options, another build
    or other hardware than the original run's, unless `force`."""
    check_resume_id(run_id, overrides)
    fleet_dir = Path(output_dir or RunConfig.model_fields["output_dir"].default).expanduser() / run_id
    doc = read_fleet_json(fleet_dir, run_id)
    config, problems = resumed_config(doc["config"], overrides, fleet_dir.parent, None)
    build = build_fingerprint()
    problems += build_differences(doc.get("build", {}), build)
    if shards is not None and shards != doc.get("accuracy_shards", 0):
        problems.append(f"accuracy shards: {doc.get('accuracy_shards', 0)} -> {shards}")
    if hardware and sorted(dict.fromkeys(hardware)) != sorted(doc["targets"]):
        problems.append(f"hardware: {', '.join(doc['targets'])} -> {', '.join(hardware)}")
    refuse_differences(f"fleet run {run_id}", problems, force,
                       "rerun with the original options and build, or add --force")
    _check_options(config, doc.get("accuracy_shards", 0))
    plan = prepare(config)
    if changed := ground_truth_change(doc.get("annotations_sha256"), plan.dataset):  # known once the plan is made
        refuse_differences(f"fleet run {run_id}", [changed], force,
                           "rerun on the original ground truth, or add --force")
        problems.append(changed)
    plan.run_id, plan.run_dir = run_id, fleet_dir
    connect(address)
    nodes = survey(build)
    # other hardware than the run's only with --force (refused above otherwise): a lost node's cells stay as they are
    targets = choose_targets(nodes, hardware or doc["targets"])
    doc = {**doc, "forced_differences": problems} if problems else doc
    return FleetPlan(plan, _model_specs(config, plan), targets, nodes, build, doc.get("accuracy_shards", 0),
                     fleet_doc=doc, retry_failed=retry_failed, address=address)


# ---------------------------------------------------------------------------------------------- run


@dataclass
class _Task:
    """A submitted Ray task and what it stands for."""

    kind: str  # "group" | "shard"
    hardware_id: str | None
    key: LoadKey
    labels: list[str] = field(default_factory=list)
    shard: Shard | None = None
    node: dict | None = None  # set by its first update
    placed_on: FleetNode | None = None  # a shard's node, chosen by the driver
    rows_seen: dict[str, int] = field(default_factory=dict)


@dataclass
class FleetOutcome:
    """What a fleet run left: the hardware folders and the sharded accuracy entries."""

    run_id: str
    fleet_dir: Path
    folders: dict[str, HardwareFolder]
    accuracy: dict[str, dict]
    refusals: list[str]
    resume_command: str  # what finishes the run (its failed cells with --retry-failed)

    @property
    def problems(self) -> dict[str, str]:
        """Cells and accuracy entries that did not finish ok: 'hardware: cell' -> 'state: reason'."""
        out = {}
        for hw, folder in self.folders.items():
            for label, s in folder.state.cells.items():
                if s.state != "ok":
                    out[f"{hw}: {label}"] = f"{s.state}: {s.reason}" if s.reason else s.state
        for slug, entry in self.accuracy.items():
            if entry.get("status") not in ("ok", "unavailable"):
                out[f"accuracy {slug}"] = f"{entry.get('status')}: {entry.get('reason')}"
        return out


class FleetDriver:
    """Submits a fleet plan's tasks, gathers what they send, and evaluates the sharded accuracy."""

    def __init__(self, fplan: FleetPlan, argv: list[str], progress=None):
        self.fplan, self.plan, self.config = fplan, fplan.plan, fplan.plan.config
        self.argv = argv
        self.progress = progress or SilentProgress()
        self.folders: dict[str, HardwareFolder] = {}
        self.pending: dict[object, _Task] = {}
        self.doc: dict = {}

    # ---- setup

    def _header(self, hardware_id: str) -> dict:
        plan = self.plan
        return {"config": {**self.config.model_dump(), "hardware_id": hardware_id},
                "dataset": {**plan.dataset.describe(), **plan.variant.describe(), "root": str(plan.dataset.root),
                            "annotation_file": str(plan.dataset.annotation_file),
                            "annotation_format": plan.dataset.annotation_format},
                "device": self.config.device, "hardware": {"id": hardware_id}, "environment": {},
                "fleet": {"run_id": plan.run_id, "hardware_id": hardware_id, "fleet_file": f"../{FLEET_FILE}",
                          "nodes": []}}

    def _open(self) -> None:
        fp, plan = self.fplan, self.plan
        nodes = [n.to_dict() for n in fp.nodes]
        if fp.fleet_doc is None:
            try:
                fp.fleet_dir.mkdir(parents=True)
            except FileExistsError:
                raise UsageError(f"{fp.fleet_dir} already exists; pick another --run-id or continue it with "
                                 f"--resume {fp.run_id}") from None
            for hw in fp.targets:
                self.folders[hw] = HardwareFolder.create(fp.fleet_dir, fp.run_id, hw, self._header(hw), plan.cells)
            self.doc = {"run_id": fp.run_id, "created_at": utc_now_iso(), "config": self.config.model_dump(),
                        "targets": fp.targets, "accuracy_shards": fp.shards, "build": fp.build,
                        "annotations_sha256": plan.dataset.describe()["annotations_sha256"],
                        "driver": {"host": socket.gethostname(), "argv": [recordable(a) for a in self.argv]},
                        "nodes": nodes, "accuracy": {}}
        else:
            for hw in fp.targets:  # each folder's lock also keeps a second driver of this run out
                self.folders[hw] = HardwareFolder.reopen(fp.fleet_dir, fp.run_id, hw, plan.cells)
            old = fp.fleet_doc
            resumed = list(old.get("resumed", [])) + [{
                "at": utc_now_iso(), "argv": [recordable(a) for a in self.argv], "nodes": nodes,
                "forced_differences": old.get("forced_differences", [])}]
            self.doc = {k: v for k, v in old.items() if k != "forced_differences"} | {"resumed": resumed}
        self._save()

    def _save(self) -> None:
        atomic_write_json(self.fplan.fleet_dir / FLEET_FILE, self.doc)

    # ---- submission

    def _runnable(self, state: str) -> bool:
        return runnable(state, self.fplan.retry_failed)

    def _job_config(self, hardware_id: str | None, key: LoadKey) -> dict:
        return {**self.config.model_dump(), "hardware_id": hardware_id, "models": [self.fplan.specs[key.model]]}

    def _submit(self) -> None:
        fp, plan = self.fplan, self.plan
        sha = plan.variant.image_id_sha256
        for hw in fp.targets:
            folder = self.folders[hw]
            for key, cells in plan.groups:
                labels = [c.label for c in cells]
                statuses = [folder.state.cells[label] for label in labels]
                if not any(self._runnable(s.state) for s in statuses):
                    continue
                job = GroupJob(plan.run_id, hw, self._job_config(hw, key), key, self.argv, fp.build, sha,
                               retry_failed=fp.retry_failed)
                if any(s.state != "pending" for s in statuses):  # continuing: the node needs what is done
                    job.cells, job.header = [s.to_dict() for s in statuses], folder.state.header
                    job.files = folder.finished_files(labels)
                ref = _group_task.options(resources=node_resources(hw)).remote(job)
                self.pending[ref] = _Task("group", hw, key, labels)
        if fp.shards:
            self._submit_shards(sha)

    def _shard_nodes(self) -> list[FleetNode]:
        """The nodes that take accuracy shards: those accepted, of the hardware the run is on (a node the survey
        refused, for another build or no dataset, would fail each shard it took, and fail fastest)."""
        targets = set(self.fplan.targets)
        return [n for n in self.fplan.nodes if n.refused is None and targets & set(n.hardware_ids)]

    def _submit_shards(self, sha: str) -> None:
        plan, accuracy = self.plan, self.doc.setdefault("accuracy", {})
        batch_size = min(self.config.batch_sizes)
        nodes, placed = self._shard_nodes(), 0
        for key, _ in plan.groups:
            slug = load_slug(key)
            if accuracy.get(slug, {}).get("status") == "ok":
                continue
            weights = plan.detectors[key.model].weights
            if getattr(weights, "source", None) == "random":
                accuracy[slug] = {"status": "unavailable", "reason": "random weights: a timing-only run, accuracy is "
                                                                       "not meaningful"}
                continue
            shards = split_shards(plan.variant.num_images, batch_size, self.fplan.shards)
            accuracy[slug] = {"status": "running", "reason": None, "group": key.label, "batch_size": batch_size,
                              "shards": [{"index": s.index, "start": s.start, "stop": s.stop} for s in shards]}
            for shard in shards:
                if self._shard_file_ok(slug, shard):
                    continue
                job = ShardJob(self._job_config(None, key), key, batch_size, shard, self.fplan.build, sha)
                node = nodes[placed % len(nodes)]  # in turn: each node one slot's worth at a time
                placed += 1
                strategy = NodeAffinitySchedulingStrategy(node.node_id, soft=False)
                ref = _shard_task.options(resources={SLOT: 1}, scheduling_strategy=strategy).remote(job)
                self.pending[ref] = _Task("shard", None, key, shard=shard, placed_on=node)
        self._save()

    def _shard_path(self, slug: str, shard: Shard, what: str = "json") -> Path:
        """accuracy/<group>/shard-<k>.json (where it ran, what it holds) and shard-<k>.detections.json."""
        return self.fplan.fleet_dir / ACCURACY_DIR / slug / f"shard-{shard.index}.{what}"

    def _shard_file_ok(self, slug: str, shard: Shard) -> bool:
        """A shard finished by an earlier driver of this run (same images, its detections whole) is kept."""
        try:
            doc = json.loads(self._shard_path(slug, shard).read_text(encoding="utf-8"))
            size = self._shard_path(slug, shard, "detections.json").stat().st_size
        except (OSError, ValueError):
            return False
        return (doc.get("shard") == {"index": shard.index, "start": shard.start, "stop": shard.stop}
                and doc.get("bytes") == size)

    # ---- the loop

    def run(self) -> FleetOutcome:
        fp = self.fplan
        self._open()
        for line in fp.refusals:
            self.progress.log(line)
        left = [hw for hw in (fp.fleet_doc or {}).get("targets", []) if hw not in fp.targets]
        if left:
            self.progress.log(f"hardware {', '.join(left)}: not in --hardware now; its cells are left as they are")
        self._log_threads()
        try:
            self._submit()
            tasks = count_of(len(self.pending), "task")
            self.progress.log(f"fleet {fp.run_id}: {len(self.plan.cells)} cells x {len(fp.targets)} hardware "
                              f"({', '.join(fp.targets)}), {tasks}"
                              + (f", accuracy in {fp.shards} shards per group" if fp.shards else ""))
            self._loop()
        except Interrupted as exc:
            self._stop(f"stopped by {exc} on the driver")
            self._close()
            raise RunInterrupted(f"{exc}: finished cells are kept in {fp.fleet_dir}; resume with: "
                                 f"{fp.resume_command()}", exc.exit_code) from None
        except BaseException:
            self._stop("the driver stopped on an error")
            self._close()
            raise
        if fp.shards:
            self._evaluate_accuracy()
        self._close()
        return FleetOutcome(fp.run_id, fp.fleet_dir, self.folders, self.doc.get("accuracy", {}), fp.refusals,
                            fp.resume_command())

    def _log_threads(self) -> None:
        """Warnings about the nodes that run this fleet's cells (those of other hardware are not its concern)."""
        targets = set(self.fplan.targets)
        nodes = [n for n in self.fplan.nodes if targets & set(n.hardware_ids)]
        for line in differing_openmp_waits(nodes):
            self.progress.log(line)
        if self.config.threads:
            return
        for n in nodes:
            p = n.probe or {}
            if n.refused is None and p.get("torch_threads") == 1 and (p.get("cpu_count") or 1) > 1:
                self.progress.log(f"warning: {n.describe()}: its tasks see 1 torch thread of {p['cpu_count']} CPUs "
                                  f"(OMP_NUM_THREADS={p.get('OMP_NUM_THREADS')}: Ray sets 1 for tasks of a node "
                                  "started without it); join it with `va-bench fleet join` or pass --threads")

    def _loop(self) -> None:
        checked = time.monotonic()
        while self.pending:
            # A signal raised inside Ray's compiled calls surfaces as a SystemError: SIGINT/SIGTERM wait for the
            # end of this step (at most ~1 s) and then stop the run cleanly.
            with protected():
                ready, _ = ray.wait(list(self.pending), num_returns=1, timeout=1.0)
                for obj in ready:
                    if obj in self.pending:
                        self._handle(obj)
                if time.monotonic() - checked > LIVENESS_EVERY_S:
                    self._check_liveness()
                    checked = time.monotonic()

    def _handle(self, obj) -> None:
        task = self.pending[obj]
        if task.kind == "shard":
            del self.pending[obj]
            try:
                result = ray.get(obj)
            except ray.exceptions.RayError as exc:
                self._shard_failed(task, *self._failure(exc, task))
            else:
                self._shard_done(task, result)
            return
        try:
            update = ray.get(next(obj))
        except StopIteration:
            self._end(obj, "interrupted", "its task ended before the cell finished")
            return
        except ray.exceptions.RayError as exc:
            self._end(obj, *self._failure(exc, task))
            return
        folder = self.folders[task.hardware_id]
        if task.node is None:
            task.node = update.node
            self.progress.log(f"{task.hardware_id} on {update.node.get('host')} ({update.node.get('address')}): "
                              f"started {task.key.label}")
        try:
            changes = folder.apply(update, task.rows_seen)
        except ValueError as exc:  # a path outside the run folder: that task's cells fail, the fleet goes on
            self._end(obj, "failed", str(exc))
            return
        for change in changes:
            self._log_change(task, change.label, change.state, change.reason)

    def _failure(self, exc: BaseException, task: _Task) -> tuple[str, str]:
        """A task that raised: `failed` with its error; one whose worker or node died: `interrupted`. Where it ran:
        its first update's node, else the node a shard was placed on, else the address Ray's error carries."""
        if task.node:
            where = f" on {task.node.get('host')} ({task.node.get('address')})"
        elif task.placed_on is not None:
            where = f" on {task.placed_on.describe()}"
        else:
            where = f" on {exc.ip}" if getattr(exc, "ip", None) else ""
        if isinstance(exc, ray.exceptions.RayTaskError):
            return "failed", f"the task{where} raised {exception_line(task_cause(exc))}"
        if isinstance(exc, ray.exceptions.TaskCancelledError):
            return "interrupted", f"the task{where} was cancelled"
        return "interrupted", f"the task{where} died ({exception_line(exc)})"

    def _end(self, obj, state: str, reason: str) -> None:
        task = self.pending.pop(obj)
        for change in self.folders[task.hardware_id].mark(task.labels, state, reason):
            self._log_change(task, change.label, change.state, change.reason)

    def _log_change(self, task: _Task, label: str, state: str, reason: str | None) -> None:
        host = (task.node or {}).get("host")  # a task that ended before its first update never said where it ran
        self.progress.log(f"{task.hardware_id}{f' on {host}' if host else ''}: {label}: {state}"
                          + (f" ({reason})" if reason else ""))

    def _check_liveness(self) -> None:
        """Tasks still queued for hardware that no alive node offers any more would wait forever: cancel them
        and say why (a task already running on a node that died is reported by Ray itself)."""
        alive: set[str] = set()
        alive_nodes: set[str] = set()
        for n in ray.nodes():
            if n.get("Alive"):
                alive |= set(n.get("Resources", {}))
                alive_nodes.add(n.get("NodeID"))
        for obj, task in list(self.pending.items()):
            if task.kind == "group":
                gone = hardware_resource(task.hardware_id) not in alive
            else:  # a shard waits for its own node
                gone = task.placed_on is not None and task.placed_on.node_id not in alive_nodes
            if task.node is None and gone:
                ray.cancel(obj, force=True)
                reason = (f"no node of hardware {task.hardware_id} is alive any more" if task.kind == "group"
                          else f"its {task.placed_on.describe()} is not alive any more")
                if task.kind == "group":
                    self._end(obj, "interrupted", reason)
                else:
                    del self.pending[obj]
                    self._shard_failed(task, "interrupted", reason)

    def _stop(self, reason: str) -> None:
        """Cancel what is still out; its unfinished cells become `interrupted`."""
        for obj, task in list(self.pending.items()):
            try:
                ray.cancel(obj, force=True)
            except Exception:  # a task that just finished cannot be cancelled: nothing to do
                pass
            if task.kind == "group":
                self._end(obj, "interrupted", reason)
            else:
                del self.pending[obj]
                self._shard_failed(task, "interrupted", reason)

    def _close(self) -> None:
        for folder in self.folders.values():
            folder.close()

    # ---- accuracy shards

    def _shard_done(self, task: _Task, result: dict) -> None:
        """The shard's detections, then its description (which marks it finished)."""
        slug, shard = load_slug(task.key), task.shard
        node, data = result.get("node", {}), result["detections_json"]
        atomic_write_bytes(self._shard_path(slug, shard, "detections.json"), data)
        atomic_write_json(self._shard_path(slug, shard),
                          {"shard": {"index": shard.index, "start": shard.start, "stop": shard.stop}, "node": node,
                           "images": result["images"], "detections": result["detections"], "bytes": len(data),
                           "seconds": result["seconds"], "threads": result["threads"]})
        self.progress.log(f"accuracy {task.key.label} shard {shard.index + 1}/{self.fplan.shards} ({shard.size} "
                          f"images) on {node.get('host')}: ok in {result['seconds']:.1f} s")

    def _shard_failed(self, task: _Task, state: str, reason: str) -> None:
        entry = self.doc["accuracy"][load_slug(task.key)]
        entry["status"], entry["reason"] = state, f"shard {task.shard.index + 1}/{self.fplan.shards}: {reason}"
        self._save()
        self.progress.log(f"accuracy {task.key.label} shard {task.shard.index + 1}/{self.fplan.shards}: {state} "
                          f"({reason})")

    def _evaluate_accuracy(self) -> None:
        """One COCO evaluation per group over its merged shards, once every benchmark task has ended (so it
        never runs beside a timed pass on this machine)."""
        plan, config = self.plan, self.config
        for key, _ in plan.groups:
            slug = load_slug(key)
            entry = self.doc["accuracy"].get(slug, {})
            if entry.get("status") != "running":
                continue
            shards = [Shard(s["index"], s["start"], s["stop"]) for s in entry["shards"]]
            missing = [s for s in shards if not self._shard_file_ok(slug, s)]
            if missing:
                entry.update(status="interrupted", reason=f"shards {', '.join(str(s.index + 1) for s in missing)} "
                                                          "did not finish")
                continue
            parts = [json.loads(self._shard_path(slug, s).read_text(encoding="utf-8")) for s in shards]
            merged = merge_result_files([(s, self._shard_path(slug, s, "detections.json").read_bytes())
                                         for s in shards])
            rel_dets = f"{ACCURACY_DIR}/{slug}__detections.json"
            atomic_write_bytes(self.fplan.fleet_dir / rel_dets, merged)
            # the evaluation a cell's detections get (executor.py), on the merged file
            task = "segment" if config.masks and task_of(plan.detectors[key.model]) == "segment" else "detect"
            evaluation = evaluate_cell_file(plan.dataset.coco, self.fplan.fleet_dir / rel_dets,
                                            list(plan.variant.image_ids), config.evaluator, config.eval_max_det, task,
                                            config.map_ci)
            stats, iou_types = evaluation.stats, evaluation.iou_types
            # each category's AP, the operating point's per-class figures and curves, the confusion matrix: as a
            # cell's per_class file
            rel_classes = f"{ACCURACY_DIR}/{slug}__per_class.json"
            atomic_write_json(self.fplan.fleet_dir / rel_classes,
                              per_class_document(evaluation, plan.dataset.categories, config.eval_max_det))
            record = {"run_id": plan.run_id, "created_at": utc_now_iso(), **_coordinates(key),
                      "batch_size": entry["batch_size"],
                      "dataset": {**plan.dataset.describe(), **plan.variant.describe()},
                      "evaluator": evaluator_version(config.evaluator), "stats": defined_stats(stats),
                      "operating_point": operating_point_summary(evaluation.primary),
                      **({"map_ci": evaluation.primary.map_interval} if evaluation.primary.map_interval else {}),
                      "maxDets": max_dets_for(config.eval_max_det), "iouType": iou_types,
                      "num_images": plan.variant.num_images, "num_detections": sum(p["detections"] for p in parts),
                      "detections_file": rel_dets, "per_class_file": rel_classes,
                      "shards": [{**s, **{k: p[k] for k in ("node", "images", "detections", "seconds", "threads")}}
                                 for s, p in zip(entry["shards"], parts, strict=True)],
                      "note": "detections of contiguous whole-batch shards, merged in image order and evaluated once"}
            rel = f"{ACCURACY_DIR}/{slug}.json"
            atomic_write_json(self.fplan.fleet_dir / rel, record)
            entry.update(status="ok", reason=None, file=rel, mAP_50_95=stats["mAP_50_95"])
            self.progress.log(f"accuracy {key.label}: mAP {stats['mAP_50_95']:.4f} over {plan.variant.num_images} "
                              f"images from {len(shards)} shards")
        self._save()


def _coordinates(key: LoadKey) -> dict:
    return {"model": key.model, "backend": key.backend, "precision": key.precision, "input_size": list(key.input_size)}


def task_cause(exc: BaseException) -> BaseException:
    """The exception a task raised, when Ray could carry it over (RayTaskError.cause)."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc


def run_fleet(fplan: FleetPlan, argv: list[str], progress=None) -> FleetOutcome:
    """Run a prepared fleet plan to the end (or to SIGINT/SIGTERM: RunInterrupted with the resume hint)."""
    return FleetDriver(fplan, argv, progress).run()
