"""The one way to read what runs wrote: submission files, run folders (run.json, submissions/, detections/,
probe CSVs) and folders of submissions. Every command that reads results (report, compare, aggregate, validate,
resume, campaigns) goes through here, so they share one idea of a cell (`CellIdentity`), one "latest wins" rule
(`latest_wins`) and one set of size caps. Torch-free.

Tolerant where a report must be (optional parts missing, every field looked up with `lookup()`), strict
about what makes a file unreadable: those are one-line `UsageError`s (or `Finding`s for validate).
"""

from __future__ import annotations

import csv
import errno
import json
import math
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import cached_property
from pathlib import Path
from typing import Any, TypeVar

from harness import shell
from harness.errors import UsageError, path_problem
from harness.files import file_identity
from harness.json_stream import iter_json_array, read_json_text
from harness.results.model import Submission
from harness.results.site_rules import Finding

RUN_FILE, SUBMISSIONS_DIR, DETECTIONS_DIR = "run.json", "submissions", "detections"
# the run-wide files beside run.json, a row (or sample) per cell: written by results/artifacts.py and the scheduler,
# read by report, a resume and a fleet's gathering
STEPS_FILE = "steps_timer.csv"
LAYERS_FILE, LAYER_TYPES_FILE, PROFILER_OPS_FILE = "layer_timer.csv", "layer_types.csv", "profiler_ops.csv"
ENERGY_FILE, MEMORY_FILE, MPROF_FILE, TRACE_FILE = "energy.csv", "memory.csv", "memory.mprof.dat", "trace.json"
FLEET_FILE = "fleet.json"  # a fleet run folder: the plan over hardware ids, beside one run folder per id
FLEET_ACCURACY_DIR = "accuracy"  # a fleet run's sharded accuracy (its groups' merged detections), beside fleet.json
CAMPAIGN_FILE = "campaign.json"  # a campaign folder: its recipe, beside submissions/ (the row) and datasets/
SUBMISSION_SCHEMA_VERSION = "va.submission.v1"
SUBMISSION_BLOCKS = ("model", "runtime", "config", "timing", "hardware")  # any of them: a submission, maybe broken
# every top-level field of a submission (the site's and ours): a JSON object with none of them is no submission at
# all (a COCO annotation file beside the runs, `{}`), not a broken one to list dozens of missing fields of
SUBMISSION_FIELDS = (*SUBMISSION_BLOCKS, "schema_version", "submission_id", "created_at", "benchmark", "repro",
                     "dataset", "accuracy", "throughput", "model_stats", "memory", "energy", "metadata", "eval")
# a submission is a few KB to a few MB (every timed batch's time: a sustained run of fast batches at ~9 bytes each);
# anything this big is not one
MAX_FILE_BYTES = 32 * 2**20
MAX_RUN_JSON_BYTES = MAX_FILE_BYTES  # run.json of a long sweep; submissions read for a report
MAX_DETECTIONS_BYTES = 2**30  # full val2017 at max_det 300 is ~150 MB

T = TypeVar("T")


# ------------------------------------------------------------------------------------ identity --
@dataclass(frozen=True)
class CellIdentity:
    """Everything that tells two measurements apart. Two files with the same identity are the same cell measured
    twice (a resumed run, a folder of several runs): the latest wins. Files that differ in anything here never
    replace each other."""

    model: str
    weights: str
    hardware: str
    backend: str  # runtime.backend (ONNX Runtime's TensorRT provider and a native engine share format/provider)
    preprocess: str  # Submission.preprocess_choice: the family's own ("default") or another implementation asked for
    format: str
    provider: str
    precision: str
    tf32: str
    input_size: int | None
    batch_size: int | None
    protocol: tuple  # conf, iou, max_det
    dataset: str
    variant: str
    mode: str

    @classmethod
    def of(cls, sub: Submission) -> CellIdentity:
        mode = sub.timing.get("mode")
        return cls(model=sub.model.id or "unknown", weights=sub.weights_identity, hardware=sub.hardware_id,
                   backend=sub.backend, preprocess=sub.preprocess_choice, format=sub.runtime.format or "?",
                   provider=sub.runtime.provider or "?", precision=sub.runtime.precision or "?", tf32=sub.tf32,
                   input_size=sub.input_size, batch_size=sub.batch_size,
                   protocol=sub.protocol,
                   dataset=f"{sub.dataset_id}/{(sub.dataset.split if sub.dataset else None) or 'val2017'}",
                   variant=sub.dataset_variant or "?", mode=mode if isinstance(mode, str) else "latency")

    @classmethod
    def of_doc(cls, doc: dict) -> CellIdentity:
        return cls.of(Submission.model_validate(doc))


def latest_wins(items: list[T], key: Callable[[T], Hashable], when: Callable[[T], datetime | None],
                name: Callable[[T], str]) -> tuple[list[T], list[tuple[T, T]]]:
    """One item per key: the newest (`when`: an aware datetime, e.g. Submission.timestamp; undated is oldest; a
    tie goes to the later name). Returns the winners in first-seen order and (loser, winner) pairs."""
    undated = datetime.min.replace(tzinfo=timezone.utc)

    def stamp(item: T) -> tuple[datetime, str]:
        return (when(item) or undated), name(item)

    groups: dict[Hashable, list[T]] = {}
    for item in items:
        groups.setdefault(key(item), []).append(item)
    winners, losers = [], []
    for group in groups.values():
        group = sorted(group, key=stamp)
        winners.append(group[-1])
        losers += [(old, group[-1]) for old in group[:-1]]
    return winners, losers


# ------------------------------------------------------------------------------------- files --
def submission_files(folder: Path, loose: bool = False) -> list[Path]:
    """A run folder's submissions/*.json (sorted); `loose`: a plain folder of submissions when it has none."""
    folder = Path(folder)
    inner = folder / SUBMISSIONS_DIR
    if inner.is_dir() or not loose:
        return sorted(p for p in inner.glob("*.json") if p.is_file())
    return sorted(p for p in folder.glob("*.json") if p.is_file())


def run_folders_in(path: Path) -> tuple[list[str], list[str]]:
    """The names of the run folders directly inside `path` (those holding a submissions/ folder), and of the folders
    inside that could not be looked into (another user's, lost+found), each sorted."""
    runs, unreadable = [], []
    for inner in path.iterdir():
        try:
            if (inner / SUBMISSIONS_DIR).is_dir():
                runs.append(inner.name)
        except OSError:  # Path.is_dir() raises what is not "no such file": EACCES in a folder not ours
            unreadable.append(inner.name)
    return sorted(runs), sorted(unreadable)


def refuse_fleet_or_campaign(path: Path, doing: str, campaign: bool = True) -> None:
    """A UsageError naming the run folders inside `path` when it is a fleet run's folder (fleet.json beside one run
    folder per hardware id) or, with `campaign`, a campaign's (campaign.json: its row, averaged over datasets, with
    no batch timing): `doing` (compare, report) works on one run folder."""
    if (path / FLEET_FILE).is_file() and not (path / SUBMISSIONS_DIR).is_dir():
        runs, _ = run_folders_in(path)
        inside = f"{', '.join(runs[:4])}{', ...' if len(runs) > 4 else ''}" if runs else "none finished yet"
        raise UsageError(f"{path} is a fleet run (one run folder per hardware id: {inside}); {doing} one of them, "
                         f"e.g. {path / (runs[0] if runs else '<hardware id>')}")
    if campaign and (path / CAMPAIGN_FILE).is_file() and not (path / RUN_FILE).is_file():
        raise UsageError(f"{path} is a campaign (its row is averaged over datasets, with no batch timing); {doing} a "
                         f"dataset's run folder under {path / 'datasets'}, or read the row with `va-bench aggregate`")


def not_a_file_or_folder(path: Path) -> str:
    """Why a path that is neither a regular file nor a folder cannot be read."""
    if path.is_symlink() or path.exists():
        return "neither a file nor a folder (a FIFO, a device, or a link that loops)"
    return "no such file or folder"


def other_document(doc: Any) -> str | None:
    """What a parsed JSON document is when it is plainly no submission: another schema_version (a support matrix, a
    leaderboard, generated tables), a JSON Schema, or an object with no field a submission has (a COCO annotation
    file, `{}`), and none of a submission's blocks; None for a submission or a broken one (a misspelt
    schema_version included: that is a finding)."""
    if not isinstance(doc, dict) or any(key in doc for key in SUBMISSION_BLOCKS):
        return None  # shaped like a submission: validated, whatever its schema_version says
    version = doc.get("schema_version")
    if isinstance(version, str) and version != SUBMISSION_SCHEMA_VERSION:
        return f"schema_version {version[:60]!r}"
    if "$schema" in doc:
        return "a JSON Schema"
    if not any(key in doc for key in SUBMISSION_FIELDS):
        if isinstance(doc.get("images"), list) and isinstance(doc.get("annotations"), list):
            return "a COCO annotation file"
        return "no field of a submission" if doc else "an empty JSON object"
    return None


def _plan_record(path: Path) -> bool:
    """A fleet's or campaign's own fleet.json / campaign.json (its plan or recipe, no schema_version), not a
    submission that happens to have the name: never one under submissions/."""
    if path.name not in (FLEET_FILE, CAMPAIGN_FILE) or path.parent.name == SUBMISSIONS_DIR:
        return False
    doc, problem = read_json(path)
    return problem is None and isinstance(doc, dict) and "schema_version" not in doc


def _first_parent_in(path: Path, folders) -> Path | None:
    """The nearest of `path`'s parents that is one of `folders` (a set or a dict's keys), or None."""
    return next((parent for parent in path.parents if parent in folders), None)


RUN_NOTES_EACH = 3  # up to this many run folders are each named in a note; more are summed up in one


def _run_folder_notes(runs: list[tuple[Path, int, int, list[str]]]) -> list[str]:
    """The notes on run folders (folder, submissions kept, other JSON files skipped, what those are)."""
    if len(runs) <= RUN_NOTES_EACH:
        return [f"{run_dir} is a run folder: reading its {SUBMISSIONS_DIR}/*.json only ({kept} files; {skipped} "
                f"other JSON files skipped" + (f": {', '.join(where)})" if where else ")")
                for run_dir, kept, skipped, where in runs]
    kinds = sorted({w for *_, where in runs for w in where})
    return [f"{len(runs)} run folders: reading their {SUBMISSIONS_DIR}/*.json only ({sum(r[1] for r in runs)} "
            f"files; {sum(r[2] for r in runs)} other JSON files skipped" + (f": {', '.join(kinds)})" if kinds else ")")]


def collect_files(paths: list[str | Path]) -> tuple[list[Path], list[str]]:
    """Files named, plus *.json under folders named (sorted), and notes. Inside a run folder (one with
    run.json) only submissions/*.json are submissions: run.json, detections and traces are skipped, and
    a note says so; so are a fleet's or campaign's own fleet.json / campaign.json. A missing path, or no file at
    all, is a usage error."""
    files: list[Path] = []
    notes: list[str] = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(x for x in p.rglob("*.json") if x.is_file())
            # a campaign's dataset runs are parts of its row (submissions/ beside campaign.json), each under the
            # campaign's protocol, not a COCO submission of its own
            campaigns = {x.parent / "datasets" for x in found if x.name == CAMPAIGN_FILE and _plan_record(x)}
            parts = {x for x in found if _first_parent_in(x, campaigns) is not None} if campaigns else set()
            if parts:
                found = [x for x in found if x not in parts]
                notes.append(f"skipped {len(parts)} JSON files of the campaign's dataset runs (datasets/): its row is "
                             "its submissions/*.json; validate a dataset's run folder by itself to check it")
            # a fleet's sharded accuracy: its groups' merged detections and scores, read into each hardware's
            # submissions, none a submission itself
            sharded = {x.parent / FLEET_ACCURACY_DIR for x in found if x.name == FLEET_FILE and _plan_record(x)}
            parts = {x for x in found if _first_parent_in(x, sharded) is not None} if sharded else set()
            if parts:
                found = [x for x in found if x not in parts]
                notes.append(f"skipped {len(parts)} JSON files of the fleet's sharded accuracy "
                             f"({FLEET_ACCURACY_DIR}/): its scores are in each hardware's submissions/*.json")
            # each file's run folder found by walking its own parents against a set (a folder of hundreds of run
            # folders would otherwise test every file against every run folder)
            every_run = {x.parent for x in found if x.name == RUN_FILE}
            # a run folder inside another (a --repeats process's, under repeats/) is part of it, skipped with it
            run_dirs = sorted(d for d in every_run if _first_parent_in(d, every_run) is None)
            inside: dict[Path, list[Path]] = {d: [] for d in run_dirs}
            loose = []
            for x in found:
                owner = _first_parent_in(x, inside.keys())
                (inside[owner] if owner is not None else loose).append(x)
            run_notes = []
            for run_dir in run_dirs:
                keep = [x for x in inside[run_dir] if x.parent == run_dir / SUBMISSIONS_DIR]
                skipped = [x for x in inside[run_dir] if x.parent != run_dir / SUBMISSIONS_DIR]
                loose += keep
                where = sorted({"/".join(x.relative_to(run_dir).parts[:1]) + ("/" if x.parent != run_dir else "")
                                for x in skipped})
                run_notes.append((run_dir, len(keep), len(skipped), where))
            found = sorted(loose)
            notes += _run_folder_notes(run_notes)
            records = [x for x in found if _plan_record(x)]
            if records:
                found = [x for x in found if x not in records]
                notes.append(f"skipped {len(records)} fleet or campaign record(s) ({', '.join(map(str, records))}): "
                             "not submissions")
            files += found
        elif p.is_file():
            files.append(p)
        else:
            raise UsageError(path_problem("", p, not_a_file_or_folder(p))
                             + "; pass submission files or folders of them")
    if not files:
        unfinished = [p for p in map(Path, paths) if (p / RUN_FILE).is_file()]
        if unfinished:  # a run folder without a finished cell: not a wrong path
            run = unfinished[0]
            doc, _ = read_json(run / RUN_FILE)
            cells = doc.get("cells") if isinstance(doc, dict) and isinstance(doc.get("cells"), list) else []
            failed = any(isinstance(c, dict) and c.get("status") in ("failed", "oom", "skipped") for c in cells)
            raise UsageError(f"no submission files (*.json) in {', '.join(map(str, paths))}: {run} is a run folder "
                             f"without a finished cell (see its {RUN_FILE}); finish it with va-bench run --resume "
                             f"{run.name} --output-dir {shell.quote(str(run.parent))}"
                             + (" --retry-failed" if failed else ""))
        raise UsageError(f"no submission files (*.json) in {', '.join(map(str, paths))}; pass va.submission.v1 "
                         "files, folders of them, or a run folder outputs/<run_id>/")
    # a file reached through two of the paths given (a folder and a file in it, a name twice) is one submission:
    # read twice, it would be its own duplicate submission_id and the leaderboard would leave it out
    unique: dict[object, Path] = {}
    for f in files:
        unique.setdefault(file_identity(f), f)
    if len(unique) < len(files):
        notes.append(f"{len(files) - len(unique)} file(s) reached through more than one of the paths given: each "
                     "read once")
    return list(unique.values()), notes


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a JSON number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):  # 1e400 parses to inf: no measurement is that
        raise ValueError(f"{text} is beyond the range of a double")
    return value


def read_json(path: Path, max_bytes: int = MAX_FILE_BYTES) -> tuple[Any, Finding | None]:
    """Parse a file defensively: size cap, strict numbers (no NaN/Infinity), nesting, encoding."""
    try:
        size = path.stat().st_size
        if size > max_bytes:
            return None, Finding("$", f"file is {size / 2**20:.1f} MiB; a submission is at most "
                                      f"{max_bytes // 2**20} MiB", "file.size")
        text = path.read_text(encoding="utf-8")
        return json.loads(text, parse_constant=_reject_constant, parse_float=_finite_float), None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return None, Finding("$", f"not valid JSON: {str(exc)[:120]}", "file.json")
    except ValueError as exc:  # NaN/Infinity, integers beyond the digit limit
        return None, Finding("$", f"not valid JSON: {str(exc)[:120]}", "file.json")
    except RecursionError:
        return None, Finding("$", "not valid JSON: nested too deeply", "file.json")
    except OSError as exc:
        return None, Finding("$", f"cannot read: {exc.strerror}", "file.read")


def read_detections(file: Path) -> tuple[Iterator[Any] | None, str | None]:
    """A run's COCO detections file (strict numbers, 1 GiB cap): (its results, decoded one at a time as the
    iterator is read, None) or (None, what is wrong); the iterator raises ValueError where the file stops being
    a JSON array of them (NotAJsonArray when it is none)."""
    size = file.stat().st_size
    if size > MAX_DETECTIONS_BYTES:
        return None, f"{file.name} is {size / 2**30:.1f} GiB; not checked (limit {MAX_DETECTIONS_BYTES // 2**30} GiB)"
    try:
        text = read_json_text(file)
    except UnicodeDecodeError as exc:
        return None, f"{file.name} is not valid JSON: {str(exc)[:120]}"
    return iter_json_array(text, json.JSONDecoder(parse_constant=_reject_constant)), None


def run_folder_of(path: Path) -> Path | None:
    """The run folder of a submission file in its submissions/, else None. Absolute: a file named from inside
    submissions/ (`x.json`, whose parent is ".") is in it all the same."""
    parent = path.absolute().parent
    return parent.parent if parent.name == SUBMISSIONS_DIR else None


def detections_file(path: Path, doc: dict) -> Path | None:
    """The detections file a submission inside a run folder references (artifacts.detections), looked up
    by name in that run's detections/ only (an untrusted path never leads outside it). None when the
    submission is not in a run folder (a copy for the site: its artifacts point at another machine)."""
    artifacts = doc.get("artifacts")
    ref = artifacts.get("detections") if isinstance(artifacts, dict) else None
    run_dir = run_folder_of(path)
    if not isinstance(ref, str) or run_dir is None or not (run_dir / RUN_FILE).is_file():
        return None
    name = Path(ref.replace("\\", "/")).name
    return run_dir / DETECTIONS_DIR / name if name not in ("", ".", "..") else None


def resolve_detections(doc: dict, path: Path, run_dir: Path) -> tuple[Path | None, str]:
    """(path, note) of a submission's artifacts.detections (absolute, or relative to its run folder and never
    outside it; a moved run folder's file found by name), or (None, why not)."""
    artifacts = doc.get("artifacts")
    value = artifacts.get("detections") if isinstance(artifacts, dict) else None
    if not isinstance(value, str) or not value:
        return None, f"{path.name} names no artifacts.detections (accuracy pass skipped or not a va-bench run)"
    given = Path(value)
    if not given.is_absolute():
        found = (run_dir / given).resolve()
        if not found.is_relative_to(run_dir.resolve()):
            return None, f"artifacts.detections {value!r} points outside the run folder {run_dir}"
        return (found, "") if found.is_file() else (None, f"{found}: no such file")
    if given.is_file():
        return given, ""
    # run folders get moved or copied between machines: the same file name under this run folder
    moved = run_dir / DETECTIONS_DIR / given.name
    if moved.is_file():
        return moved, f"{given} is gone; read {moved} (run folder moved)"
    return None, f"{given}: no such file (and no {moved})"


def inside_run_folder(run_dir: Path, relative: str) -> Path | None:
    """A file a submission names relative to its run folder, or None when the name leads outside it."""
    path = (run_dir / relative).resolve()
    return path if path.is_relative_to(run_dir.resolve()) else None


def read_run_json(run_dir: Path, run_id: str) -> dict:
    """run.json of an existing run, or a UsageError saying why it cannot be resumed."""
    return _resumable(run_dir, run_id, RUN_FILE, "run", ("config",))


def read_fleet_json(fleet_dir: Path, run_id: str) -> dict:
    """fleet.json of an existing fleet run, or a UsageError saying why it cannot be resumed."""
    return _resumable(fleet_dir, run_id, FLEET_FILE, "fleet run", ("config", "targets"))


def _resumable(folder: Path, run_id: str, name: str, what: str, required: tuple[str, ...]) -> dict:
    path = folder / name
    try:  # Path.is_file() raises what is not "no such file": a name too long for the file system (ENAMETOOLONG)
        found = path.is_file()
    except OSError as exc:
        if exc.errno != errno.ENAMETOOLONG:  # a folder that cannot be entered: say so, not "no run there"
            raise UsageError(path_problem("--output-dir", folder.parent, f"cannot be read ({exc.strerror})")
                             + "; check the folder's permissions") from exc
        found = False  # no run can be there either
    if not found:
        raise UsageError(path_problem("--output-dir", folder.parent, f"no {what} {run_id} to resume (no "
                                                                     f"{run_id}/{name})")
                         + "; check --output-dir and the run id")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"{path} is not readable JSON ({exc}); the {what} cannot be resumed") from exc
    kinds = {"config": dict, "targets": list}
    if not isinstance(doc, dict) or not all(isinstance(doc.get(key), kinds[key]) for key in required):
        configuration = "run configuration" if what == "run" else "fleet configuration"
        raise UsageError(f"{path} has no {configuration}; the {what} cannot be resumed")
    return doc


def finished_submission(run_dir: Path) -> dict | None:
    """A one-cell run's submission when its run finished with every cell ok; None otherwise."""
    try:
        state = json.loads((run_dir / RUN_FILE).read_text(encoding="utf-8"))
        cells = state.get("cells") or []
        if not cells or any(not isinstance(c, dict) or c.get("status") != "ok" for c in cells):
            return None
        files = submission_files(run_dir)
        return read_json_object(files[0], MAX_FILE_BYTES) if len(files) == 1 else None
    except (OSError, ValueError, AttributeError, UsageError):
        return None


def submission_of_cell(run_dir: Path, relative: str | None) -> dict:
    """The submission a run.json cell names (relative to its run folder); {} when absent or unreadable."""
    path = inside_run_folder(run_dir, relative) if relative else None
    if path is None:
        return {}
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


@dataclass(frozen=True)
class SubmissionFile:
    """One submission file: its document, its parsed view, the run folder its artifacts resolve against."""

    path: Path
    doc: dict
    submission: Submission
    run_dir: Path

    @property
    def identity(self) -> CellIdentity:
        return CellIdentity.of(self.submission)


def read_submission(path: Path, schema_version: str = SUBMISSION_SCHEMA_VERSION) -> SubmissionFile:
    """A va.submission.v1 file, strictly (32 MiB, strict numbers, the schema version, the fields' types); a
    one-line UsageError naming the problem otherwise."""
    from pydantic import ValidationError

    doc, problem = read_json(path)
    if problem:
        raise UsageError(f"{path}: {problem.message}; pass run folders or {schema_version} files")
    if not isinstance(doc, dict) or doc.get("schema_version") != schema_version:
        raise UsageError(f"{path} is not a {schema_version} submission; pass run folders, submission files "
                         "or COCO detection files")
    try:
        sub = Submission.model_validate(doc)
    except ValidationError as exc:
        err = exc.errors()[0]
        raise UsageError(f"{path}: {'.'.join(map(str, err['loc']))}: {err['msg']} (check it with "
                         "`va-bench validate`)") from exc
    return SubmissionFile(path, doc, sub, run_folder_of(path) or path.absolute().parent)


# --------------------------------------------------------------------------------- run folders --
def lookup(doc: Any, path: str, default: Any = None) -> Any:
    """doc['a']['b'] for path 'a.b'; `default` when any step is missing or not a mapping."""
    for part in path.split("."):
        if not isinstance(doc, dict) or part not in doc:
            return default
        doc = doc[part]
    return doc


def number(value: Any) -> float | None:
    """A real number or None (bools, strings and nulls are not measurements)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


@dataclass(frozen=True)
class CellKey:
    """How a report shows one performance cell of a run (what varies inside one run folder; timing mode kept
    apart). Which file stands for a cell is decided by its full CellIdentity."""

    model: str
    backend: str
    precision: str
    input_size: int
    batch_size: int
    mode: str

    @property
    def series(self) -> str:
        """Everything but the batch size: one line in a batch-size sweep plot."""
        label = f"{self.model} {self.backend} {self.precision} {self.input_size}"
        return label if self.mode == "latency" else f"{label} ({self.mode})"

    @property
    def label(self) -> str:
        return f"{self.series} b{self.batch_size}"


def short_labels(keys: list[CellKey]) -> dict[CellKey, str]:
    """Labels naming only the coordinates that differ between the keys (for crowded axes)."""
    names = ("model", "backend", "precision", "input_size", "mode")
    varying = [n for n in names if len({getattr(k, n) for k in keys}) > 1]
    out = {}
    for k in keys:
        parts = [str(getattr(k, n)) for n in varying if not (n == "mode" and k.mode == "latency")]
        out[k] = " ".join([*parts, f"b{k.batch_size}"])
    return out


@dataclass
class FinishedCell:
    """One submission of the run."""

    key: CellKey
    path: Path
    doc: dict[str, Any]

    def get(self, path: str, default: Any = None) -> Any:
        return lookup(self.doc, path, default)

    def first_number(self, *paths: str) -> float | None:
        """The first of `paths` that holds a number: ours first, then the site's own name for the same figure."""
        for path in paths:
            value = number(self.get(path))
            if value is not None:
                return value
        return None

    @cached_property  # the whole submission typed once, not once per table row or gate that asks
    def dataset_variant(self) -> str | None:
        """The dataset variant as every reader derives it (declared, else from the image count)."""
        try:
            return Submission.model_validate(self.doc).dataset_variant
        except ValueError:  # pydantic's ValidationError: a file the reader keeps but cannot type
            return self.get("dataset.variant")


@dataclass
class RunFolder:
    """A finished run folder as every command reads it: run.json and its cells' submissions."""

    path: Path
    run: dict[str, Any]  # run.json, {} when absent
    cells: list[FinishedCell]  # sorted by coordinates
    cell_status: list[dict[str, Any]] = field(default_factory=list)  # run.json's cells [{cell, status, ...}]
    notes: list[str] = field(default_factory=list)  # what the reader decided (superseded files)

    @property
    def run_id(self) -> str:
        return str(self.run.get("run_id") or lookup(self.cells[0].doc, "metadata.run_id") or self.path.name)

    @property
    def created_at(self) -> str:
        """When the run's first cell finished (ISO-8601), from the submissions."""
        stamps = sorted(str(c.get("created_at")) for c in self.cells if c.get("created_at"))
        return stamps[0] if stamps else ""

    def first(self, path: str, default: Any = None) -> Any:
        """A run-level fact: run.json first, else the first submission that has it."""
        value = lookup(self.run, path)
        if value is not None:
            return value
        return next((v for c in self.cells if (v := c.get(path)) is not None), default)

    def csv_rows(self, name: str) -> list[dict[str, str]] | None:
        """Rows of a probe CSV in the run folder, or None when the run did not write it."""
        path = self.path / name
        if not path.is_file():
            return None
        try:
            with path.open(newline="", encoding="utf-8") as fh:
                return list(csv.DictReader(fh))
        except (UnicodeDecodeError, csv.Error) as exc:
            raise UsageError(f"{path}: not a readable CSV ({exc}); re-run the benchmark or remove the file") from None


def read_json_object(path: Path, max_bytes: int = MAX_RUN_JSON_BYTES) -> dict[str, Any]:
    """A JSON object from a run folder; a one-line UsageError when it is too big, not JSON or not an object."""
    if path.stat().st_size > max_bytes:
        raise UsageError(f"{path}: {path.stat().st_size} bytes is too big for a va-bench record; remove it")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UsageError(f"{path}: not valid JSON ({exc}); re-run the benchmark or remove the file") from None
    if not isinstance(doc, dict):
        raise UsageError(f"{path}: expected a JSON object, found {type(doc).__name__}; remove the file")
    return doc


def _cell_key(doc: dict[str, Any], path: Path) -> CellKey:
    batch = number(lookup(doc, "config.batch_size", lookup(doc, "timing.batch_size")))
    size = number(lookup(doc, "config.input_size", lookup(doc, "model.input_size")))
    model = lookup(doc, "model.id")
    if model is None or batch is None or size is None:
        raise UsageError(f"{path}: not a va-bench submission (model.id, config.batch_size or config.input_size "
                         "missing); remove it from submissions/")
    return CellKey(model=str(model),
                   backend=str(lookup(doc, "runtime.backend") or lookup(doc, "runtime.format") or "?"),
                   precision=str(lookup(doc, "runtime.precision") or "?"), input_size=int(size),
                   batch_size=int(batch), mode=str(lookup(doc, "timing.mode") or "latency"))


def load_run(path: Path) -> RunFolder:
    """Read outputs/<run_id>/; UsageError (one line) when it is not a readable run folder."""
    path = Path(path)
    if not path.is_dir():
        raise UsageError(path_problem("", path, "not a folder" if path.exists() else "no such folder")
                         + "; pass a run folder, e.g. outputs/<run_id>/")
    refuse_fleet_or_campaign(path, "report")
    run = read_json_object(path / RUN_FILE) if (path / RUN_FILE).is_file() else {}
    files = submission_files(path)
    if not files:
        hint = "its cells did not finish (see run.json)" if run else "is it a va-bench run folder?"
        raise UsageError(f"{path} has no {SUBMISSIONS_DIR}/*.json to report: {hint}")
    cells, parsed = [], {}
    for f in files:
        doc = read_json_object(f)
        cells.append(FinishedCell(_cell_key(doc, f), f, doc))
        try:
            parsed[f] = Submission.model_validate(doc)
        except ValueError as exc:  # pydantic's ValidationError: a field of the wrong type
            raise UsageError(f"{f}: not a va-bench submission ({str(exc).splitlines()[0]}); check it with "
                             "`va-bench validate` or remove it from submissions/") from None
    # a resumed run may have re-written a cell: the latest wins
    cells, superseded = latest_wins(cells, key=lambda c: CellIdentity.of(parsed[c.path]),
                                    when=lambda c: parsed[c.path].timestamp, name=lambda c: c.path.name)
    notes = [f"{old.path.name} superseded by {new.path.name} (same cell, later timestamp)" for old, new in superseded]
    cells.sort(key=lambda c: (c.key.model, c.key.backend, c.key.precision, c.key.input_size, c.key.mode,
                              c.key.batch_size))
    status = [c for c in run.get("cells", []) if isinstance(c, dict)] if isinstance(run.get("cells"), list) else []
    return RunFolder(path=path, run=run, cells=cells, cell_status=status, notes=notes)
