"""The scheduler of a run: resolves and checks the plan before anything is written, then runs its cells
in order with an error boundary per cell, keeps run.json current after every cell, and resumes.

Cell states: pending -> running -> ok | failed | oom | skipped | interrupted. A cell that raises is
`failed` with the exception's one-line reason (traceback in errors.log); an out-of-memory error is
`oom` and the larger batch sizes of its group are `skipped`; SIGINT/SIGTERM mark the running cell
`interrupted` and stop the run. `--resume RUN_ID` runs what is not `ok` (failed/oom/skipped only with
--retry-failed) in the same folder. A full disk is not a cell's failure: every later cell would fail too, so
the sweep stops (the running cell `interrupted`, exit 1, a resume hint) and a plain --resume continues it; so
does a run folder that can no longer be written. A cell is ok once its submission holds everything asked of it
(the group's layer and profiler passes included); `--repeats` runs once every cell is, and a resume runs them
when an ok cell lacks them.
"""

from __future__ import annotations

import os
import signal
import traceback
from contextlib import ExitStack, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import torch

from harness import shell
from harness.backends.support import converting_backends
from harness.config import RunConfig
from harness.data.images import find_corrupt_images, orientation_warning
from harness.detector.weights import cache_problem
from harness.errors import RunInterrupted, RunStopped, exception_line
from harness.files import StorageProblem, atomic_write_json, storage_problem
from harness.measure.affinity import affinity_record, inherited_affinity, pinned
from harness.measure.energy import EnergyProbe
from harness.measure.env import RECOMMENDED_GLIBC_TUNABLES, apply_tf32, collect_environment, hardware_block
from harness.measure.hygiene import DeviceSampler, locked_clocks, run_gpu_pids
from harness.measure.memory import MemoryMonitor
from harness.pipeline.pipeline import resolve_workers, stream_worker_priority
from harness.records import Cell, CellRecord, LoadKey, utc_now_iso
from harness.results.artifacts import ProbeArtifacts, cell_csv_key, detections_file
from harness.results.reader import MEMORY_FILE, STEPS_FILE, SUBMISSIONS_DIR
from harness.results.steps_csv import existing_rows, steps_rows, write_steps_csv
from harness.results.submission import build_submission, submission_filename
from harness.results.validate import commit_problem
from harness.run.executor import GroupExecutor, RunContext
from harness.run.plan import RunPlan
from harness.run.progress import SilentProgress
from harness.run.repeats import repeat_in_fresh_processes, repeats_missing
from harness.run.resume import runnable
from harness.run.signals import Interrupted, interrupt_handling, protected, signals_ignored
from harness.run.state import RunState


def stopping_problem(exc: BaseException, state: RunState) -> StorageProblem | None:
    """What stops the sweep rather than fail one cell: a full disk or a run folder that cannot be written
    (`storage_problem`), or a run folder removed or moved while the run wrote to it."""
    problem = storage_problem(exc, state.run_dir)
    if problem is None and state.folder_replaced():
        problem = StorageProblem(f"the run folder {state.run_dir} was removed or moved while the run wrote to it",
                                 "the run folder was removed or moved", "put it back")
    return problem


def inherited_thread_limit(config: RunConfig, threads: int) -> str | None:
    """A warning when the environment, not the user's options, gave the run fewer threads than the CPUs it may use:
    OMP_NUM_THREADS or MKL_NUM_THREADS exported by a container image, a job system or a shell profile (torch takes
    its default from them)."""
    if config.threads or config.cpu_affinity:
        return None
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or threads
    limits = [f"{name}={os.environ[name]}" for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS") if os.environ.get(name)]
    if not limits or threads >= usable:
        return None
    return (f"warning: {' and '.join(limits)} from the environment leaves the run {threads} of the {usable} CPUs it "
            f"may use (recorded in environment.threads); give --threads {usable} for all of them, or --threads "
            f"{threads} to say this is meant")


def unpublishable_accuracy(variant: str, environment: dict) -> str | None:
    """The warning for a full-val run whose accuracy validate will refuse (the harness's commit does not pin its
    code), said before hours of measuring; None otherwise."""
    problem = commit_problem(environment["harness_commit"], environment["harness_dirty"], "the harness's commit")
    if variant != "full" or problem is None:
        return None
    return (f"warning: full-val accuracy needs a pinned, clean commit ({problem}): `va-bench validate` will refuse "
            "this run's mAP; commit the changes (an installed package: one built from a clean checkout) and run again")


@dataclass
class RunOutcome:
    """What a run (or a resumed part of it) produced."""

    records: list[CellRecord]  # cells measured by this process
    state: RunState
    repeats: dict[str, dict] = field(default_factory=dict)  # --repeats: cell label -> timing.repeats

    @property
    def repeat_failures(self) -> list[str]:
        """--repeats: the extra processes that failed, each with why (their samples are missing)."""
        return sorted({f for block in self.repeats.values() for f in block.get("failed", [])})

    @property
    def problems(self) -> dict[str, str]:
        """Cells that did not finish ok: label -> 'state: reason'."""
        return {label: f"{s.state}: {s.reason}" if s.reason else s.state
                for label, s in self.state.cells.items() if s.state != "ok"}


def _run_gpu_pids(plan: RunPlan) -> set[int]:
    """The PIDs NVML lists for this run's work on its GPU (none on a CPU run): the other processes found at plan
    time (allowed with --allow-shared-gpu) are not the run's."""
    if not plan.device.is_cuda:
        return set()
    accepted = {p["pid"] for p in (plan.gpu_hygiene or {}).get("other_processes", [])}
    return run_gpu_pids(plan.device.index, accepted)


def is_out_of_memory(exc: BaseException) -> bool:
    """CUDA / host allocation failures (torch's OutOfMemoryError, ORT's 'Failed to allocate memory')."""
    if isinstance(exc, (MemoryError, torch.cuda.OutOfMemoryError)):
        return True
    text = str(exc).lower()
    return "out of memory" in text or "failed to allocate memory" in text


class Scheduler:
    """Runs a prepared plan cell by cell; `progress` shows bars or lines; results go to disk as they finish."""

    def __init__(self, plan: RunPlan, argv: list[str], progress=None, stop=None):
        self.plan = plan
        self.stop = stop  # a threading.Event: set, the run stops before its next cell as on SIGTERM (fleet nodes)
        self.config = plan.config
        self.progress = progress or SilentProgress()
        self.argv = argv
        self._repeating = False  # --repeats: the extra processes are running

    def run(self) -> RunOutcome:
        """The run, with the GPU's clocks locked around it when --lock-clocks asks (before the run folder exists:
        a lock NVML refuses leaves nothing behind)."""
        device = self.plan.device
        with pinned(self.config.cpu_affinity), \
                locked_clocks(device.index, self.config.lock_clocks, warn=self._warn) if device.is_cuda \
                else nullcontext() as clocks:
            return self._run(clocks)

    def _warn(self, message: str) -> None:
        self.progress.log(f"warning: {message}")

    def _run(self, clocks: dict | None) -> RunOutcome:
        plan, config = self.plan, self.config
        threads = config.threads or len(config.cpu_affinity) or torch.get_num_threads()
        torch.set_num_threads(threads)
        apply_tf32(config.tf32)
        environment = collect_environment(plan.device, config.tf32, self.argv, threads)
        if config.cpu_affinity:
            environment["cpu_affinity"] = affinity_record(config.cpu_affinity)
        elif (inherited := inherited_affinity()) is not None:
            environment["cpu_affinity"] = inherited
        if config.overlap:
            workers = resolve_workers(config.workers, plan.device.is_cuda, config.host_processes)  # --workers
            environment["threads"]["overlapped_host_worker"] = {"threads": 1, "workers": workers,
                                                                "host_processes": config.host_processes,
                                                                **stream_worker_priority()}
        environment["gpu_hygiene"] = {**(plan.gpu_hygiene or {"status": "not a CUDA run"}), "locked_clocks": clocks}
        if environment["memory_allocator"]["allocator"] == "glibc (default)":
            self.progress.log("warning: glibc malloc with its default thresholds (GLIBC_TUNABLES unset, no tcmalloc or "
                              "jemalloc preloaded): detector forwards can spend a quarter of their CPU time in page "
                              "faults (recorded in environment.memory_allocator); before the run: export "
                              f"GLIBC_TUNABLES={RECOMMENDED_GLIBC_TUNABLES}")
        if warning := inherited_thread_limit(config, threads):
            self.progress.log(warning)
        if converting_backends(config.backends) and (problem := cache_problem()):  # plan refused a missing one
            self.progress.log(f"warning: {problem}: conversions it holds are read, a conversion it lacks fails")
        if config.accuracy and (warning := unpublishable_accuracy(plan.variant.name, environment)):
            self.progress.log(warning)
        if warning := orientation_warning(plan.dataset.orientations, plan.dataset.annotation_format != "yolo"):
            self.progress.log(warning)
        if warning := plan.limit_warning():
            self.progress.log(warning)
        hardware = hardware_block(plan.device, config.hardware_id)
        state: RunState | None = None
        ctx: RunContext | None = None
        outcome: RunOutcome | None = None
        try:
            # everything from the folder's creation on is inside the try: a signal from here on keeps the folder
            # resumable and says so
            state = self._open_state(environment, hardware)
            ctx = RunContext(config=config, run_id=plan.run_id, run_dir=plan.run_dir, device=plan.device,
                             dataset=plan.dataset, variant=plan.variant, records=plan.records,
                             environment=environment, hardware=hardware, artifacts=ProbeArtifacts(plan.run_dir),
                             energy_probe=EnergyProbe.detect(plan.device.index if plan.device.is_cuda else None)
                             if config.energy else None,
                             monitor=MemoryMonitor(plan.device) if config.memory else None,
                             progress=self.progress, threads=threads, backend_options=plan.backend_options,
                             label_categories=plan.label_categories,
                             sampler=DeviceSampler.for_device(plan.device), calibration=plan.calibration,
                             corrupt_images=state.header["dataset"]["corrupt_images"])
            ok = {cell_csv_key(s.cell) for s in state.cells.values() if s.state == "ok"}
            self._steps = [row for row in existing_rows(plan.run_dir / STEPS_FILE) if tuple(row[:5]) in ok]
            ctx.artifacts.keep_cells(ok)
            outcome = RunOutcome([], state)
            with ExitStack() as stack:
                if ctx.monitor is not None:
                    stack.enter_context(ctx.monitor)
                stack.enter_context(ctx.sampler)
                for key, cells in plan.groups:
                    self._run_group(ctx, key, cells, outcome)
            self._write_memory(ctx)
            if config.repeats > 1 and repeats_missing(plan.run_dir, self._ok_submissions(state)):
                self._repeating = True
                outcome.repeats = repeat_in_fresh_processes(config, plan.run_dir, self._ok_submissions(state),
                                                            self.progress, _run_gpu_pids(plan))
        except Interrupted as exc:
            if state is None:  # before the run folder exists: nothing to resume
                raise
            with signals_ignored():  # a second Ctrl-C must not cut the bookkeeping short
                for status in state.cells.values():
                    if status.state == "running":
                        status.state, status.reason = "interrupted", f"stopped by {exc}"
                state.save()
                if ctx is not None:
                    self._write_memory(ctx)
            done = state.counts().get("ok", 0)
            still = "; the repeats in fresh processes are still to run" if self._repeating else ""
            raise RunInterrupted(
                f"{exc} after {done} of {len(state.cells)} cells{still}; finished cells are kept in {plan.run_dir}; "
                f"resume with: va-bench run --resume {plan.run_id} --output-dir "
                f"{shell.quote(str(plan.run_dir.parent))}",
                exc.exit_code, outcome if outcome is not None else RunOutcome([], state)) from None
        except Exception as exc:
            problem = None if state is None else stopping_problem(exc, state)
            if problem is None:
                raise
            raise self._stopped_by_storage(problem, state, outcome) from exc
        finally:
            if state is not None:
                state.close()
        return outcome

    @staticmethod
    def _ok_submissions(state: RunState) -> dict[str, str]:
        """Every ok cell's submission (cell label -> path relative to the run folder), this process's or not."""
        return {label: s.submission for label, s in state.cells.items() if s.state == "ok" and s.submission}

    def _stopped_by_storage(self, problem: StorageProblem, state: RunState,
                            outcome: RunOutcome | None) -> RunStopped:
        """A full disk or a run folder that can no longer be written stops the sweep: the running cell is
        `interrupted`, the rest stay `pending` (recorded if run.json can still be written), and one line says how
        to go on."""
        with signals_ignored():
            recorded = state.stop(problem.reason)
        plan = self.plan
        kept = "" if recorded else "; run.json keeps its last complete version"
        return RunStopped(
            f"{problem.message}; the run stopped after {state.counts().get('ok', 0)} of {len(state.cells)} cells "
            f"(finished cells are kept in {plan.run_dir}{kept}); {problem.fix}, then resume with: va-bench run "
            f"--resume {plan.run_id} --output-dir {shell.quote(str(plan.run_dir.parent))}",
            outcome if outcome is not None else RunOutcome([], state))

    def _open_state(self, environment: dict, hardware: dict) -> RunState:
        plan = self.plan
        corrupt = []
        if plan.dataset.layout != "synthetic":  # generated images have no files
            with self.progress.task("checking JPEG integrity", None):  # the rest of a check started at plan time
                found = plan.integrity.result() if plan.integrity is not None else find_corrupt_images(plan.records)
                corrupt = [c.to_dict() for c in found]
        for c in corrupt:
            self.progress.log(f"warning: {c['path']} decodes only with errors ({c['problem']})")
        header = {"config": self.config.model_dump(),
                  "dataset": {**plan.dataset.describe(), **plan.variant.describe(),
                              "root": None if plan.dataset.root is None else str(plan.dataset.root),
                              "annotation_file": None if plan.dataset.annotation_file is None
                              else str(plan.dataset.annotation_file),
                              "annotation_format": plan.dataset.annotation_format,
                              "corrupt_images": corrupt},
                  "device": str(plan.device), "hardware": hardware, "environment": environment}
        if plan.resume is None:
            return RunState.create(plan.run_dir, plan.run_id, header, plan.cells)
        old = plan.resume
        resumed = list(old.get("resumed", [])) + [{
            "at": utc_now_iso(), "argv": environment["argv"], "harness_commit": environment["harness_commit"],
            "harness_dirty": environment["harness_dirty"], "hardware_id": hardware["id"],
            "forced_differences": old.get("forced_differences", [])}]
        # the original run's environment stays the run's; each resume is listed with what it ran under
        header.update({k: old[k] for k in ("environment", "hardware", "device") if k in old}, resumed=resumed)
        return RunState.reopen(plan.run_dir, plan.run_id, plan.cells, header)

    def _runnable(self, state: RunState, cell: Cell) -> bool:
        s = state.cells[cell.label].state
        return runnable(s, self.plan.retry_failed)

    def _run_group(self, ctx: RunContext, key: LoadKey, cells: list[Cell], outcome: RunOutcome) -> None:
        """One (model, backend, precision, input size): load once, then every runnable batch size."""
        state = outcome.state
        todo = [c for c in cells if self._runnable(state, c)]
        if not todo:
            return
        try:
            with ctx.progress.task(f"loading {key.label}", None):
                executor = GroupExecutor(ctx, self.plan.detectors[key.model], key,
                                         self.plan.model_specs.get(key.model, key.model))
        except Exception as exc:  # the group cannot run at all: each of its cells says why
            if stopping_problem(exc, state):
                raise  # not this group's fault: the sweep stops (run)
            reason = f"loading failed: {exception_line(exc)}"
            state.log_error(key.label, traceback.format_exc())
            with protected():
                for cell in todo:
                    state.set(cell, "oom" if is_out_of_memory(exc) else "failed", reason)
                state.save()
            ctx.progress.log(f"{key.label}: {reason}")
            return
        reference = next((c for c in cells if state.cells[c.label].state == "ok"), None)
        if reference is not None:  # resumed: invariance is measured against the cell finished earlier
            path = ctx.run_dir / detections_file(reference)
            try:
                executor.use_reference(reference.batch_size, path)
            except (OSError, ValueError, KeyError) as exc:  # deleted or edited: no reference, and say so
                ctx.progress.log(f"{key.label}: batch invariance not measured on resume: {path.name} unreadable "
                                 f"({exception_line(exc)})")
        try:
            self._run_cells(ctx, executor, cells, todo, outcome)
        finally:
            executor.close()

    def _run_cells(self, ctx: RunContext, executor: GroupExecutor, cells: list[Cell], todo: list[Cell],
                   outcome: RunOutcome) -> None:
        """The group's runnable cells, in order, each behind the error boundary of one cell."""
        state = outcome.state
        oom_at: int | None = None
        for cell in todo:
            if self.stop is not None and self.stop.is_set():
                raise Interrupted(signal.SIGTERM)
            if oom_at is not None:
                with protected():
                    state.set(cell, "skipped", f"batch size {oom_at} ran out of memory")
                    state.save()
                continue
            with protected():
                state.set(cell, "running", started_at=utc_now_iso(), finished_at=None)
                state.save()
            try:
                record = executor.run_cell(cell)
                if cell is cells[-1] and (ctx.config.layers or ctx.config.profile):
                    self._optional_passes(ctx, executor, cell, record, state)  # the cell is ok once they are done
                with protected():  # the submission and its ok status together: a signal waits for both
                    state.check_folder()  # the folder gone: no submission in a new one under its name
                    self._write_memory(ctx)  # before the submission that names it: a cell is ok with its samples
                    path = self._write_submission(ctx, record)
                    self._mark_ok(ctx, cell, record, path, state)
            except Exception as exc:  # the error boundary of one cell
                if stopping_problem(exc, state):
                    raise  # every later cell would fail too: the sweep stops (run)
                oom = is_out_of_memory(exc)
                state.log_error(cell.label, traceback.format_exc())
                if oom:
                    oom_at = cell.batch_size
                    if ctx.device.is_cuda:
                        torch.cuda.empty_cache()
                with protected():
                    state.set(cell, "oom" if oom else "failed", exception_line(exc), finished_at=utc_now_iso())
                    state.save()
                ctx.progress.log(f"{cell.label}: {state.cells[cell.label].state}: {exception_line(exc)}")
                continue
            outcome.records.append(record)

    def _optional_passes(self, ctx: RunContext, executor: GroupExecutor, cell: Cell, record: CellRecord,
                         state: RunState) -> None:
        """Layers and profiler: a probe that breaks is recorded as such; the cell's measurements stand."""
        try:
            executor.run_optional_passes(cell, record)
        except Exception as exc:
            if stopping_problem(exc, state):
                raise  # a full disk is not a probe's failure: the sweep stops, the cell is not ok
            state.log_error(f"{cell.label} (layer/profiler pass)", traceback.format_exc())
            failure = {"status": "failed", "reason": exception_line(exc)}
            layers_failed = ctx.config.layers and record.layers is None  # the profiler pass, after it, never ran
            record.layers = record.layers or (failure if ctx.config.layers else None)
            if ctx.config.profile and record.profiler is None:
                record.profiler = ({"status": "unavailable", "reason": "not run: the layer pass before it failed"}
                                   if layers_failed else failure)
            record.timing.warnings.append(f"layer/profiler pass failed: {exception_line(exc)} (see errors.log)")

    @staticmethod
    def _write_submission(ctx: RunContext, record: CellRecord) -> Path:
        """The cell's submission file, with the probes' files and summaries (a cell whose status never became ok has
        its file removed on resume)."""
        path = ctx.run_dir / SUBMISSIONS_DIR / submission_filename(record)
        record.artifacts = {"submission": path.relative_to(ctx.run_dir).as_posix(), "steps_timer": STEPS_FILE,
                            **ctx.artifacts.files}
        if ctx.monitor is not None:  # written once the cell is ok, with this cell's samples in it
            record.artifacts["memory"] = MEMORY_FILE
        if record.detections_file is not None:  # an unscored cell's detections too (random weights, synthetic)
            record.artifacts["detections"] = record.detections_file
        with protected():
            atomic_write_json(path, build_submission(record))
        return path

    def _mark_ok(self, ctx: RunContext, cell: Cell, record: CellRecord, path: Path, state: RunState) -> None:
        """steps_timer.csv rows and the ok status, written together (a signal waits for this)."""
        with protected():
            self._steps += steps_rows(record)
            write_steps_csv(ctx.run_dir / STEPS_FILE, self._steps)
            state.set(cell, "ok", None, submission=path.relative_to(ctx.run_dir).as_posix(), finished_at=utc_now_iso())
            state.save()

    @staticmethod
    def _write_memory(ctx: RunContext) -> None:
        if ctx.monitor is not None:
            taken = ctx.monitor.count()  # both files hold the same samples, however many come meanwhile
            ctx.artifacts.write_memory(lambda: ctx.monitor.rows(taken))


def run_with_interrupts(plan: RunPlan, argv: list[str], progress=None) -> RunOutcome:
    """Run a plan with SIGINT/SIGTERM turned into a clean stop (see harness/run/signals.py)."""
    with interrupt_handling():
        return Scheduler(plan, argv, progress).run()
