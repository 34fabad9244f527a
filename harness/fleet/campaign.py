"""`va-bench campaign --fleet`: a campaign's datasets as Ray tasks, one per dataset, all on one hardware id.

A campaign's row is one machine's (its hardware block, its pooled latency), so every dataset runs on nodes of
one hardware id: `--hardware ID`, or the cluster's only one. Each dataset is a task asking for that hardware
and a benchmark slot (harness/fleet/join.py), so datasets spread over the nodes of that hardware and never
share a node with another benchmark. The node resolves the dataset and weights at the campaign's paths, checks
them against the driver's SHA-256, runs the dataset as the local campaign does, and sends its run folder back;
the driver writes it under the campaign's datasets/ (harness/run/campaign.py reads it from there, so resuming
works the same whether the datasets ran here or on the fleet). A task that raises or whose node dies skips its
dataset with the reason; the campaign's row is then partial until the campaign is run again.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import ray

from harness.errors import RunInterrupted, UsageError, exception_line
from harness.files import DiskFullError, is_disk_full, replace_folder
from harness.fleet.driver import LIVENESS_EVERY_S, FleetNode, choose_targets, connect, node_info, survey, task_cause
from harness.fleet.fingerprint import build_fingerprint
from harness.fleet.gather import inside_folder
from harness.fleet.join import hardware_resource, node_resources
from harness.fleet.node import CampaignJob
from harness.results.campaign import DatasetResult
from harness.results.reader import finished_submission
from harness.run.campaign import Campaign, CampaignEntry, incoming_folder, run_folder_name
from harness.run.signals import Interrupted, protected


# One worker process per dataset (max_calls=1): a dataset's run never shares a process, its memory or its
# loaded runtimes with the next one. max_retries=0: a dataset that died is reported, never run twice silently.
@ray.remote(num_cpus=0, max_calls=1, max_retries=0)
def _dataset_task(job: CampaignJob) -> dict:
    from harness.fleet.node import run_campaign_dataset

    return {**run_campaign_dataset(job), "node": node_info()}


@dataclass
class CampaignFleet:
    """The Ray cluster a campaign runs on: its accepted nodes and the one hardware id its datasets go to."""

    hardware_id: str
    nodes: list[FleetNode]
    build: dict

    def __call__(self, campaign: Campaign, entries: list[CampaignEntry], datasets_dir: Path, argv: list[str],
                 progress) -> Iterator[DatasetResult]:
        """Send every entry to the fleet; yield each dataset's result as its task ends."""
        for n in self.nodes:
            if n.refused:
                progress.log(f"{n.describe()} refused: {n.refused}")
        pending: dict[object, CampaignEntry] = {}
        try:
            for entry in entries:
                try:
                    job = self._job(campaign, entry, argv)
                except (UsageError, OSError) as exc:
                    yield _skipped(entry, str(exc).splitlines()[0])
                    continue
                pending[_dataset_task.options(resources=node_resources(self.hardware_id)).remote(job)] = entry
            if pending:
                progress.log(f"campaign: {len(pending)} datasets sent to the nodes of {self.hardware_id}")
            checked = time.monotonic()
            while pending:
                with protected():  # a signal waits for the end of this step (at most ~1 s), as in `fleet run`
                    ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
                for ref in ready:
                    yield self._result(pending.pop(ref), ref, datasets_dir)
                if pending and time.monotonic() - checked > LIVENESS_EVERY_S:
                    checked = time.monotonic()
                    if not self._hardware_alive():  # queued tasks would wait for a node that is gone, forever
                        for ref in list(pending):
                            ray.cancel(ref, force=True)
                            yield _skipped(pending.pop(ref), f"no node of hardware {self.hardware_id} is alive any "
                                                             "more; run the campaign again when one is")
        except Interrupted as exc:
            raise RunInterrupted(f"{exc}: the finished datasets are kept in {datasets_dir}; run the same campaign "
                                 "command again to run the rest", exc.exit_code) from None
        finally:  # stopped, failed or abandoned: nothing of this campaign goes on running on the nodes
            for ref in pending:
                ray.cancel(ref, force=True)

    def _hardware_alive(self) -> bool:
        need = hardware_resource(self.hardware_id)
        return any(n.get("Alive") and need in n.get("Resources", {}) for n in ray.nodes())

    def _job(self, campaign: Campaign, entry: CampaignEntry, argv: list[str]) -> CampaignJob:
        from harness.data.coco import CocoDataset
        from harness.run.campaign import entry_split

        ground_truth = CocoDataset.from_path(entry.dataset, entry_split(campaign, entry)).annotations_sha256()
        # the nodes read the paths as the driver resolves them (a relative path would be their own working dir's)
        absolute = replace(entry, dataset=str(Path(entry.dataset).expanduser().absolute()),
                           weights=str(Path(entry.weights).expanduser().absolute()))
        return CampaignJob(campaign, absolute, self.hardware_id, argv, self.build,
                           campaign.weights_sha256[entry.name], ground_truth)

    def _result(self, entry: CampaignEntry, ref, datasets_dir: Path) -> DatasetResult:
        try:
            out = ray.get(ref)
        except ray.exceptions.RayTaskError as exc:
            return _skipped(entry, f"its task raised {exception_line(task_cause(exc))}")
        except ray.exceptions.RayError as exc:
            return _skipped(entry, f"its task died ({exception_line(exc)}); run the campaign again to run it")
        where = f" on {out['node'].get('host')} ({out['node'].get('address')})"
        if "files" not in out:
            return _skipped(entry, out["reason"] + where)
        run_dir, incoming = datasets_dir / run_folder_name(entry), incoming_folder(entry, datasets_dir)
        shutil.rmtree(incoming, ignore_errors=True)
        try:
            for name, data in out["files"].items():
                path = incoming / inside_folder(name)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
            with protected():  # a move cut short is finished by the next pass (run/campaign.py: settled)
                replace_folder(incoming, run_dir)
        except (ValueError, TypeError, OSError) as exc:
            shutil.rmtree(incoming, ignore_errors=True)
            if is_disk_full(exc):  # every later dataset's folder would not fit either: the campaign stops here
                raise DiskFullError(datasets_dir, exc, "free some space, then run the campaign again (finished "
                                    "datasets are kept)") from exc
            return _skipped(entry, f"its run folder could not be written here ({exc}){where}")
        submission = finished_submission(run_dir)
        if submission is None:
            return _skipped(entry, f"the run folder sent back{where} holds no finished submission")
        return DatasetResult(entry.name, entry.version, entry.weights or "", submission)


def _skipped(entry: CampaignEntry, reason: str) -> DatasetResult:
    return DatasetResult(entry.name, entry.version, entry.weights or "", None, reason[:300])


def prepare_campaign_fleet(address: str | None, hardware: str | None) -> CampaignFleet:
    """Connect to the cluster, probe its nodes and choose the campaign's hardware id: `hardware`, or the only
    one of the accepted nodes (a UsageError naming them when there are several)."""
    build = build_fingerprint()
    connect(address)
    nodes = survey(build)
    targets = choose_targets(nodes, [hardware] if hardware else None)
    if len(targets) > 1:
        raise UsageError(f"the cluster has nodes of hardware {', '.join(targets)}; a campaign's row is one machine's: "
                         "choose one with --hardware ID")
    return CampaignFleet(targets[0], nodes, build)
