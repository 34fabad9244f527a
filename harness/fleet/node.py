"""What a fleet node runs, inside a Ray task (no Ray in this module, so it runs and tests without it).

- `run_group`: one group's cells (model, backend, precision, input size x its batch sizes) with the
  ordinary scheduler and executor, in a scratch run folder of the node's own; yields a `NodeUpdate`
  every time that folder's run.json changes (a cell started or finished), with the files that changed.
- `detect_shard`: the detections (a COCO results file) of one shard of a group's accuracy pass
  (harness/fleet/shards.py).
- `run_campaign_dataset`: one dataset of a campaign (harness/run/campaign.py), its run folder's files sent
  back whole.
- `probe`: this node's build fingerprint and threads, for the driver to accept or refuse it.

Datasets and weights are resolved here, on the node (its $VA_BENCH_COCO, weights cache, plugin paths);
the job carries only the configuration and the driver's fingerprints to check against.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from harness.config import build_config
from harness.errors import UsageError, VaBenchError
from harness.files import atomic_write_json
from harness.fleet.fingerprint import build_differences, build_fingerprint
from harness.fleet.gather import NodeUpdate, inside_folder
from harness.fleet.shards import Shard
from harness.records import LoadKey
from harness.results.reader import RUN_FILE, TRACE_FILE, read_run_json
from harness.run.state import ERROR_LOG, LOCK_FILE

if TYPE_CHECKING:  # the node imports the campaign's run code only when it runs one
    from harness.run.campaign import Campaign, CampaignEntry

POLL_SECONDS = 0.5  # how often the node looks at its run.json (a stat; read only when it changed)


class NodeRefused(VaBenchError):
    """This node's build differs from the driver's: its numbers would not be comparable."""


@dataclass
class GroupJob:
    """One group of cells for one hardware id, as the driver sends it."""

    run_id: str
    hardware_id: str
    config: dict  # RunConfig fields: hardware_id set, models narrowed to the group's model
    group: LoadKey
    argv: list[str]
    build: dict  # the driver's fingerprint
    dataset_sha256: str  # the driver's dataset variant fingerprint
    cells: list[dict] = field(default_factory=list)  # the group's statuses (CellStatus.to_dict) when continuing
    header: dict = field(default_factory=dict)  # the hardware folder's run.json header when continuing
    files: dict[str, bytes] = field(default_factory=dict)  # finished cells' submissions and detections
    retry_failed: bool = False


@dataclass
class ShardJob:
    """One shard of one group's accuracy pass."""

    config: dict
    group: LoadKey
    batch_size: int
    shard: Shard
    build: dict
    dataset_sha256: str


@dataclass
class CampaignJob:
    """One dataset of a campaign, with the driver's fingerprints of its weights and annotation file."""

    campaign: Campaign
    entry: CampaignEntry
    hardware_id: str
    argv: list[str]
    build: dict
    weights_sha256: str
    annotation_sha256: str


def check_build(expected: dict) -> dict:
    """This node's fingerprint; NodeRefused when it differs from the driver's."""
    mine = build_fingerprint()
    differences = build_differences(expected, mine)
    if differences:
        raise NodeRefused("its build differs from the driver's (" + "; ".join(differences) + "); install the "
                          "driver's harness commit and package versions on it")
    return mine


def probe() -> dict:
    """What the driver checks before it sends work: build fingerprint, threads, and how OpenMP's threads wait."""
    import torch

    from harness.measure.hygiene import OPENMP_WAIT_SETTINGS

    return {"build": build_fingerprint(), "torch_threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
            "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"),
            "openmp_wait": {name: os.environ.get(name) for name in OPENMP_WAIT_SETTINGS}}


def _plan(config_fields: dict, scratch: Path, dataset_sha256: str):
    """The node's own plan of a job's configuration (datasets and weights resolved here)."""
    from harness.run.plan import prepare

    plan = prepare(build_config({**config_fields, "output_dir": str(scratch), "run_id": None}), fleet_node=True)
    if plan.variant.image_id_sha256 != dataset_sha256:
        raise UsageError(f"this node's dataset variant {plan.variant.name} ({plan.variant.num_images} images, ids "
                         f"{plan.variant.image_id_sha256[:12]}) differs from the driver's ({dataset_sha256[:12]}); "
                         "point $VA_BENCH_COCO on this node at the same COCO copy")
    return plan


def scratch_folder(kind: str) -> Path:
    """A scratch folder named after this process; those of processes that died (a killed task leaves its
    folder: no `finally` runs on SIGKILL) are removed first."""
    import psutil

    root = Path(tempfile.gettempdir())
    for old in root.glob(f"va-bench-{kind}-*-*"):
        pid = old.name.split("-")[3]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"va-bench-{kind}-{os.getpid()}-", dir=root))


def run_group(job: GroupJob, node: dict) -> Iterator[NodeUpdate]:
    """Run the job's group with the ordinary scheduler; yield updates as its run.json changes."""
    check_build(job.build)
    scratch = scratch_folder("fleet")
    try:
        plan = _plan(job.config, scratch, job.dataset_sha256)
        plan.groups = [(key, cells) for key, cells in plan.groups if key == job.group]
        if not plan.groups:
            raise UsageError(f"{job.group.label} is not in this node's plan of the configuration")
        plan.run_id, plan.run_dir = job.run_id, scratch / job.run_id
        plan.resume, plan.retry_failed = _seed_folder(plan.run_dir, job, plan.cells), job.retry_failed
        yield from _stream(plan, job.argv, node)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _seed_folder(run_dir: Path, job: GroupJob, cells) -> dict:
    """The scratch run folder, made before the scheduler opens it as a run to continue: run.json with the
    group's statuses (all pending on a first run), and the finished cells' files. Returns its run.json."""
    recorded = {c.get("cell"): c for c in job.cells}
    # the folder's environment, hardware and device once a node has reported them; before that (the driver's header
    # holds an empty environment and a placeholder hardware block) this node's scheduler records its own, as a new run
    # does, and sends them as the folder's header
    known = job.header if job.header.get("environment") else {}
    doc = {"run_id": job.run_id, "config": job.config,
           **{k: known[k] for k in ("environment", "hardware", "device") if k in known},
           "cells": [recorded.get(c.label) or {"cell": c.label, "status": "pending"} for c in cells]}
    run_dir.mkdir(parents=True)
    for name, data in job.files.items():
        path = run_dir / inside_folder(name, "the driver")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    # ProbeArtifacts names the first profiled group's trace trace.json and later ones trace__<group>.json.
    # Every group runs in a folder of its own here, so this placeholder (never sent back) makes each trace
    # carry its group's name and no two groups collide in the gathered hardware folder.
    (run_dir / TRACE_FILE).write_text('{"note": "placeholder of a fleet node; not a trace"}\n')
    atomic_write_json(run_dir / RUN_FILE, doc)  # the scheduler polls it: never half a file
    return doc


def _stream(plan, argv: list[str], node: dict) -> Iterator[NodeUpdate]:
    """The scheduler in a thread; this generator watches run.json and yields what changed."""
    from harness.run.scheduler import Scheduler

    run_dir = plan.run_dir
    sent = _listing(run_dir)  # what the folder held before the run is the driver's already
    failure: list[BaseException] = []

    stop = threading.Event()

    def work() -> None:
        try:
            Scheduler(plan, argv, stop=stop).run()
        except BaseException as exc:  # re-raised below, in the task's own thread
            failure.append(exc)

    thread = threading.Thread(target=work, name="va-bench-fleet-group", daemon=True)
    thread.start()
    last_stamp, header_sent, errors_at = None, False, 0
    try:
        while True:
            thread.join(POLL_SECONDS)
            done = not thread.is_alive()
            stamp = _stamp(run_dir / RUN_FILE)
            if stamp != last_stamp or done:
                last_stamp = stamp
                doc = read_run_json(run_dir, run_dir.name)
                files = _changed_files(run_dir, sent)
                errors, errors_at = _read_from(run_dir / ERROR_LOG, errors_at)
                header = {}
                # the header once the scheduler has written its environment: the seeded run.json it replaces
                # holds none, and the driver keeps the first header a hardware folder gets
                if not header_sent and doc.get("environment"):
                    header = {k: v for k, v in doc.items() if k not in ("run_id", "cells")}
                    header_sent = True
                yield NodeUpdate(node=node, header=header, cells=doc["cells"], files=files, errors_log=errors)
            if done:
                break
    finally:  # closed early or failed: the scheduler stops after its running cell, before run_group removes scratch
        stop.set()
        thread.join()
    if failure:
        raise failure[0]


def _stamp(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_mtime_ns, st.st_size


def _listing(run_dir: Path) -> dict[str, tuple[int, int] | None]:
    """The run folder's result files; hidden ones are writes in progress (.name.*.tmp) and ORT's scratch."""
    out = {}
    for path in run_dir.rglob("*"):
        rel = path.relative_to(run_dir)
        if rel.as_posix() in (RUN_FILE, LOCK_FILE, ERROR_LOG) or any(p.startswith(".") for p in rel.parts):
            continue
        if path.is_file():
            out[rel.as_posix()] = _stamp(path)
    return out


def _changed_files(run_dir: Path, sent: dict[str, tuple[int, int] | None]) -> dict[str, bytes]:
    """Files written since the last update (atomic writes: a file under its final name is whole)."""
    out = {}
    for name, stamp in _listing(run_dir).items():
        if stamp is not None and sent.get(name) != stamp:
            try:
                out[name] = (run_dir / name).read_bytes()
            except FileNotFoundError:  # replaced between the listing and the read: the next update has it
                continue
            sent[name] = stamp
    return out


def _read_from(path: Path, offset: int) -> tuple[str, int]:
    if not path.is_file():
        return "", offset
    data = path.read_bytes()
    return data[offset:].decode("utf-8", errors="replace"), len(data)


def detect_shard(job: ShardJob) -> dict:
    """Detections (COCO results format) of the shard's images, in the unsharded pass's batches."""
    import torch

    from harness.measure.env import apply_tf32
    from harness.pipeline.stage_timer import StageTimer
    from harness.results.artifacts import ProbeArtifacts, write_coco_detections
    from harness.run.executor import GroupExecutor, RunContext
    from harness.run.progress import SilentProgress

    check_build(job.build)
    scratch = scratch_folder("shard")
    try:
        plan = _plan(job.config, scratch, job.dataset_sha256)
        config = plan.config
        threads = config.threads or torch.get_num_threads()  # as the scheduler sets them for a cell
        torch.set_num_threads(threads)
        apply_tf32(config.tf32)
        records = plan.records[job.shard.start:job.shard.stop]
        ctx = RunContext(config=config, run_id=plan.run_id, run_dir=scratch, device=plan.device, dataset=plan.dataset,
                         variant=plan.variant, records=records, environment={}, hardware={},
                         artifacts=ProbeArtifacts(scratch), energy_probe=None, monitor=None,
                         progress=SilentProgress(), threads=threads, backend_options=plan.backend_options,
                         label_categories=plan.label_categories,
                         calibration=plan.calibration)  # int8: the same images on every node
        executor = GroupExecutor(ctx, plan.detectors[job.group.model], job.group,
                                 plan.model_specs.get(job.group.model, job.group.model))
        timer = StageTimer(plan.device, config.stage_sync)
        start = time.perf_counter()
        path = scratch / "detections.json"
        try:
            count = write_coco_detections(path, (image for batch in ctx.batches(job.batch_size)  # as the executor does
                                                 for image in executor.pipeline.run_batch(batch, timer)),
                                          executor.label_categories)
        finally:
            executor.close()
        return {"detections_json": path.read_bytes(), "detections": count, "images": len(records),
                "seconds": round(time.perf_counter() - start, 3), "threads": threads}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def run_campaign_dataset(job: CampaignJob) -> dict:
    """One dataset's run on this node, under the node's hardware id, in a scratch folder: {"files": {relative
    path: bytes}} of its run folder (run.json, submission, detections, ...), or {"reason": ...} when it was
    skipped before or during the run. Its weights and ground truth (annotation file, or a YOLO dataset's labels)
    are this node's copies at the campaign's paths, refused when their SHA-256 differs from the driver's."""
    from harness.data.coco import CocoDataset
    from harness.files import file_sha256
    from harness.run.campaign import entry_split, run_dataset, run_folder_name
    from harness.run.progress import SilentProgress
    from harness.run.scheduler import Scheduler

    check_build(job.build)
    entry = job.entry
    try:
        dataset = CocoDataset.from_path(entry.dataset, entry_split(job.campaign, entry))
    except UsageError as exc:
        return {"reason": f"on this node: {str(exc).splitlines()[0]}"}
    weights = Path(entry.weights)
    if not weights.is_file():
        return {"reason": f"this node has no weights {weights}; give every node the campaign's files at the same paths"}
    for what, sha256, expected in (("weights", lambda: file_sha256(weights), job.weights_sha256),
                                   ("ground truth", dataset.annotations_sha256, job.annotation_sha256)):
        if sha256() != expected:
            where = weights if what == "weights" else dataset.annotation_file
            return {"reason": f"this node's {what} ({where}) differs from the driver's (SHA-256); give every node "
                              "the same copy"}
    scratch = scratch_folder("campaign")
    try:
        result = run_dataset(job.campaign, entry, scratch, job.argv, SilentProgress(),
                             execute=lambda plan, argv, progress: Scheduler(plan, argv, progress).run(),
                             hardware_id=job.hardware_id)
        run_dir = scratch / run_folder_name(entry)
        if result.submission is None:
            return {"reason": result.reason or "its run finished without a submission"}
        return {"files": {p.relative_to(run_dir).as_posix(): p.read_bytes() for p in sorted(run_dir.rglob("*"))
                          if p.is_file() and p.name != LOCK_FILE}}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
