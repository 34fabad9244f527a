"""Resuming a run: the plan of an existing run folder, refused when it was started differently."""

from __future__ import annotations

import re
from pathlib import Path

from harness.build_info import harness_commit
from harness.config import SAFE_ID, RunConfig, build_config, refuse_given_options
from harness.errors import UsageError
from harness.measure.env import hardware_block
from harness.records import RETRYABLE_STATES
from harness.results.reader import RUN_FILE, read_run_json
from harness.run.plan import RunPlan, prepare


def runnable(state: str, retry_failed: bool) -> bool:
    """Whether a resumed run runs a cell in this state: pending and interrupted ones always; failed, oom and
    skipped ones with --retry-failed."""
    return state in ("pending", "interrupted") or (retry_failed and state in RETRYABLE_STATES)


def resumed_config(recorded: dict, overrides: dict, output_dir: Path,
                   run_id: str | None) -> tuple[RunConfig, list[str]]:
    """The configuration a resumed run (local or fleet) runs with: the recorded one with the options given now,
    and what those options change (each a reason to refuse unless --force)."""
    try:
        original = build_config(recorded, recorded=True)
    except UsageError as exc:  # the file's own values, not an option given now
        raise UsageError(f"{output_dir / str(run_id) / RUN_FILE if run_id else RUN_FILE}: its recorded "
                         f"{str(exc).removeprefix('invalid run configuration: ')}; the run cannot be resumed as "
                         "recorded: restore the file, or start a new run") from exc
    config = build_config({**recorded, **overrides, "run_id": run_id, "output_dir": str(output_dir)}, recorded=True)
    refuse_given_options(config, overrides)  # as a new run's command line would be
    problems = [f"{k}: {original.identity()[k]!r} -> {v!r}" for k, v in config.identity().items()
                if original.identity()[k] != v]
    return config, problems


def ground_truth_change(scored_on: str | None, dataset) -> str | None:
    """The difference to name when the ground truth a run's finished cells were scored on (its recorded
    annotations_sha256; None for a run made before runs recorded it) is not the dataset's now: edited labels would mix
    the scores of two datasets under one. None when it is the same, or unknown."""
    now = dataset.describe()["annotations_sha256"]
    if scored_on is None or scored_on == now:
        return None
    return f"ground truth {dataset.annotation_file} (SHA-256 {scored_on[:12]} -> {str(now)[:12]})"


def refuse_differences(what: str, problems: list[str], force: bool, fix: str) -> None:
    """One line naming every difference from the original run, unless --force accepts them."""
    if problems and not force:
        raise UsageError(f"{what} was started differently ({'; '.join(problems)}); resuming would mix "
                         f"incomparable cells: {fix}")


def check_resume_id(run_id: str, overrides: dict) -> None:
    """`--resume RUN_ID` names a folder under --output-dir (a run's or a fleet run's), and only that run: refuses
    (UsageError) a path, or another --run-id beside it."""
    if not re.fullmatch(SAFE_ID, run_id):
        raise UsageError(f"--resume {run_id!r}: not a run id (letters, digits, '.', '_' and '-'); give the name of a "
                         "folder under --output-dir")
    if overrides.get("run_id") not in (None, run_id):
        raise UsageError(f"--resume {run_id} continues that run in its own folder; drop --run-id "
                         f"{overrides['run_id']}")


def prepare_resume(run_id: str, output_dir: str | None, overrides: dict, force: bool,
                   retry_failed: bool) -> RunPlan:
    """The plan of an existing run, to finish it. Refuses (UsageError) when the options given now, the
    harness commit or the hardware differ from the original run, unless `force`."""
    check_resume_id(run_id, overrides)
    # `~` as a new run's --output-dir takes it (`--output-dir=~/runs`, which the shell leaves alone): the same folder
    run_dir = Path(output_dir or RunConfig.model_fields["output_dir"].default).expanduser() / run_id
    doc = read_run_json(run_dir, run_id)
    config, problems = resumed_config(doc["config"], overrides, run_dir.parent, run_id)
    env = doc.get("environment", {})
    commit, dirty = harness_commit()
    if (env.get("harness_commit"), env.get("harness_dirty")) != (commit, dirty):
        problems.append(f"harness commit {env.get('harness_commit')} (dirty {env.get('harness_dirty')}) -> {commit} "
                        f"(dirty {dirty})")
    try:
        plan = prepare(config.model_copy(update={"run_id": None}))  # resolves everything anew; writes nothing
    except UsageError:  # the differences found so far may be why
        refuse_differences(f"run {run_id}", problems, force, "rerun with the original options or add --force")
        raise
    recorded = doc.get("hardware", {}).get("id")
    here = hardware_block(plan.device, config.hardware_id)["id"]
    if recorded != here:
        problems.append(f"hardware {recorded} -> {here}")
    if changed := ground_truth_change(doc.get("dataset", {}).get("annotations_sha256"), plan.dataset):
        problems.append(changed)
    refuse_differences(f"run {run_id}", problems, force, "rerun with the original options or add --force")
    plan.run_id, plan.run_dir, plan.config = run_id, run_dir, config
    plan.resume, plan.retry_failed = doc, retry_failed
    if problems:
        plan.resume = {**doc, "forced_differences": problems}
    return plan
