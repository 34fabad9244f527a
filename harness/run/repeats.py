"""`--repeats N`: every cell measured in N fresh processes (pyperf's habit): one process is one sample of the
machine, and on a shared host the same command's figures move between processes more than within one.

The run's own process times and scores every cell; then N - 1 more `va-bench run` processes time the same cells
(the run's configuration, written as a preset into `repeats/`; no accuracy, drawings, layer or profiler passes;
conversions come from the cache the first process filled, since converting is not what is timed). Each cell's
submission gets `timing.repeats`: every process's median batch time (the first is this run's), their median,
and the spread between processes; `compare` tests significance across process medians when both sides have them.
"""

from __future__ import annotations

import os
import shutil
import signal
import statistics
import subprocess
from pathlib import Path

import yaml

from harness.files import DISK_FULL_ERRNOS, DiskFullError, atomic_write_bytes, atomic_write_json
from harness.measure.hygiene import RunParent
from harness.results.reader import read_json_object, read_run_json
from harness.shell import harness_command
from harness.storage import storage_fix

REPEATS_DIR = "repeats"
CHILD_OFF = {"repeats": 1, "accuracy": False, "draw_images": 0, "layers": False, "profile": False,
             "scenario": None, "qps": None, "latency_bound_ms": None, "find_max_qps": False,
             "run_id": None, "output_dir": None}  # what the extra processes do not do
REPEAT_OF = "VA_BENCH_REPEAT_OF"  # set in an extra process: the pid of the run that started it (it holds the GPU)
REPEAT_GPU_PIDS = "VA_BENCH_REPEAT_GPU_PIDS"  # and the PIDs NVML lists for that run's work (the host's, in a container)


def repeat_parent() -> RunParent | None:
    """The run that started this process, where this is an extra process of its --repeats (the variable naming
    another PID than this process's parent is stale or forged: no parent)."""
    if os.environ.get(REPEAT_OF) != str(os.getppid()):
        return None
    listed = os.environ.get(REPEAT_GPU_PIDS, "").split(",")
    return RunParent(os.getppid(), frozenset(int(p) for p in listed if p.isdigit()))


def cell_key(coords: dict) -> tuple:
    """A cell's coordinates as the run and its submissions both record them."""
    return (coords["model"], coords["backend"], coords["precision"], tuple(coords["input_size"]),
            int(coords["batch_size"]))


def _child_medians(folder: Path) -> dict[tuple, float]:
    """Each ok cell's median batch time (ms) in one extra process's run folder (its run.json names the cells and
    their submissions)."""
    run = read_run_json(folder, folder.name)
    out = {}
    for cell in run.get("cells", []):
        if cell.get("status") == "ok" and cell.get("submission"):
            doc = read_json_object(folder / cell["submission"])
            out[cell_key(cell)] = float(doc["timing"]["batch_ms"]["p50"])
    return out


def repeats_missing(run_dir: Path, submissions: dict[str, str]) -> bool:
    """Whether an ok cell's submission lacks `timing.repeats` (a new run, a resumed one that ran cells again, or one
    stopped while its extra processes ran)."""
    for relative in submissions.values():
        timing = read_json_object(run_dir / relative).get("timing")
        if not isinstance(timing, dict) or "repeats" not in timing:
            return True
    return False


def _failure(done: subprocess.CompletedProcess) -> str:
    """Why an extra process failed, one line: the signal that killed it, else its error line, else its exit code."""
    if done.returncode < 0:
        try:
            return f"killed by {signal.Signals(-done.returncode).name}"
        except ValueError:
            return f"killed by signal {-done.returncode}"
    lines = [line.strip() for line in done.stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith(("error:", "interrupted"))]
    return (errors or [f"exit {done.returncode}"])[-1][:500]


def _storage_errno(why: str) -> int | None:
    """The errno of an extra process's error line that says its storage took no more bytes, else None."""
    text = why.lower()
    for number in DISK_FULL_ERRNOS:
        if os.strerror(number).lower() in text:
            return number
    return None


def repeat_in_fresh_processes(config, run_dir: Path, submissions: dict[str, str], progress,
                              run_gpu_pids: set[int] = frozenset()) -> dict[str, dict]:
    """Time the run's cells in `config.repeats - 1` more processes; add `timing.repeats` to each ok cell's
    submission (`submissions`: cell label -> path relative to the run folder, every ok cell of the run, those an
    earlier process of a resumed run finished too; `run_gpu_pids`: the PIDs NVML lists for this run's work on its
    GPU, which the extra processes' check of other processes leaves out). Returns label -> that block."""
    folder = run_dir / REPEATS_DIR
    preset = folder / "config.yaml"
    child = {k: v for k, v in {**config.model_dump(mode="json"), **CHILD_OFF}.items() if v is not None}
    atomic_write_bytes(preset, yaml.safe_dump(child, sort_keys=True).encode())
    medians: dict[tuple, list[float]] = {}
    failures = []
    for k in range(2, config.repeats + 1):
        run_id = f"process-{k}"
        shutil.rmtree(folder / run_id, ignore_errors=True)  # a resumed run repeats its cells afresh
        with progress.task(f"repeat {k} of {config.repeats}: a fresh process", None):
            done = subprocess.run(harness_command("run", "--config", str(preset), "--run-id", run_id, "--output-dir",
                                                  str(folder), "--json"), capture_output=True, text=True,
                                  env={**os.environ, REPEAT_OF: str(os.getpid()),
                                       REPEAT_GPU_PIDS: ",".join(str(pid) for pid in sorted(run_gpu_pids))})
        if done.returncode != 0:
            why = _failure(done)
            storage = _storage_errno(why)
            if storage is not None:  # every later process would fail too: the run stops, --resume repeats them
                shutil.rmtree(folder / run_id, ignore_errors=True)
                cause = OSError(storage, os.strerror(storage))
                raise DiskFullError(folder / run_id, cause, f"{storage_fix(cause, 'free some space')}, then resume "
                                    f"(the extra process said: {why})")
            failures.append(f"process {k}: {why}")
            progress.log(f"warning: repeat {k} failed ({why}); its samples are missing")
            continue
        for key, value in _child_medians(folder / run_id).items():
            medians.setdefault(key, []).append(value)
    cells = {c["cell"]: c for c in read_run_json(run_dir, run_dir.name).get("cells", [])}
    blocks = {}
    for label, relative in submissions.items():
        path = run_dir / relative
        doc = read_json_object(path)
        own = float(doc["timing"]["batch_ms"]["p50"])
        values = [round(own, 4), *[round(v, 4) for v in medians.get(cell_key(cells[label]), [])]]
        middle = statistics.median(values)
        # one process (the others failed) has no spread to speak of, not a spread of 0
        spread = round(100 * (max(values) - min(values)) / middle, 3) if len(values) > 1 and middle > 0 else None
        block = {"processes": len(values), "requested": config.repeats, "batch_ms_p50": values,
                 "median_of_processes_ms": round(middle, 4), "spread_pct": spread,
                 "note": "the first value is the run's own process's (timed and scored); the others fresh processes "
                         "timing the same cell (no accuracy pass)"}
        if spread is None:
            block["spread_reason"] = ("one process measured the cell (the others failed): no spread between processes"
                                      if len(values) < 2 else "the median of the processes is not positive")
        if failures:
            block["failed"] = failures
        doc["timing"]["repeats"] = blocks[label] = block
        atomic_write_json(path, doc)
    return blocks
