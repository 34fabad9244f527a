"""The benchmark log: one dated Markdown section per run, appended to a file that is never
rewritten. Setup, accuracy and performance tables, gates as target vs today, notes, the reproduce command
and the artefact list. The file is opened in append mode only, so earlier sections stay byte-identical."""

from __future__ import annotations

import hashlib
import os
import re
from collections import defaultdict
from pathlib import Path

from harness.errors import UsageError
from harness.files import DiskFullError, is_disk_full, output_file_problem
from harness.locks import lock_file
from harness.report.gates import NOT_MET, GateResult, gate_table
from harness.report.sections import (
    REPEATS_NOTE,
    Table,
    accuracy_table,
    accuracy_unavailable,
    artefacts,
    harness_builds,
    harness_commits,
    human_size,
    notes,
    operating_point_table,
    performance_table,
    repeats_table,
    repro_commands,
    run_date,
    server_table,
    setup_table,
)
from harness.results.reader import RunFolder

LOG_HEADER = ("# Benchmark log\n\nAppend-only: `va-bench report RUN_DIR --log FILE` adds one dated section per run "
              "and never rewrites earlier ones.\n")


def marker(run_id: str, state: str) -> str:
    """The HTML comment that opens a run's section (invisible when rendered; finds duplicates): the run and the
    state of its cells (`run_state`), so a run resumed after it was logged is logged again, once."""
    return f"<!-- va-bench run {run_id} cells {state} -->"


def run_state(run: RunFolder) -> str:
    """The run's cells as logged: a digest of each cell's status and submission (12 hex digits)."""
    statuses = sorted(f"{c.get('cell')}={c.get('status')}" for c in run.cell_status)
    files = sorted(c.path.name for c in run.cells)
    return hashlib.sha256("\n".join(statuses + files).encode("utf-8")).hexdigest()[:12]


def _inline(value: object) -> str:
    """Text from a run's files as Markdown inline text: one line (control characters as spaces) and no HTML (a
    model id with `<script>` or a forged section marker shows as text). Only `<` opens a tag or a comment: `>` stays
    itself, so a note reads "CV 24.0% > 10%" in the file too."""
    text = re.sub(r"[\x00-\x1f\x7f]", " ", str(value))
    return text.replace("&", "&amp;").replace("<", "&lt;")


def _cell(value: str) -> str:
    return _inline(value).replace("|", "\\|")


def _code(value: str) -> str:
    """Inline code of a file name (backticks in it would end the span)."""
    return "`" + _inline(value).replace("`", "'") + "`"


def markdown_table(table: Table, bold: str | None = None) -> str:
    """A GitHub-flavoured Markdown table; cells equal to `bold` are emphasised (NOT MET)."""
    lines = ["| " + " | ".join(_cell(h) for h in table.header) + " |",
             "|" + "|".join("---:" if num else "---" for num in table.numeric) + "|"]
    for row in table.rows:
        lines.append("| " + " | ".join(f"**{_cell(v)}**" if v == bold else _cell(v) for v in row) + " |")
    return "\n".join(lines)


def _artefact_lines(run: RunFolder) -> list[str]:
    """Top-level files one per line; images/ summarised (count and size), every other file listed."""
    lines, grouped = [], defaultdict(list)
    for name, size in artefacts(run):
        folder = name.split("/", 1)[0] if "/" in name else ""
        if folder == "images":
            grouped[folder].append(size)
        else:
            lines.append(f"- {_code(name)} {human_size(size)}")
    for folder, sizes in grouped.items():
        lines.append(f"- {_code(folder + '/')} {len(sizes)} files, {human_size(sum(sizes))}")
    return lines


def section(run: RunFolder, gates: list[GateResult] | None, gate_source: str, gate_notes: list[str],
            again: bool = False) -> str:
    """The Markdown section of one run (starts with its marker, ends with a newline); `again`: the log holds a
    section of the run before it was resumed, which this one supersedes."""
    first = run.cells[0]
    models = ", ".join(sorted({c.key.model for c in run.cells}))
    hardware = ", ".join(sorted({str(c.get("hardware.id") or "?") for c in run.cells}))
    out = [marker(run.run_id, run_state(run)),
           f"## {run_date(run)} — run {run.run_id}: {_inline(models)} on {_inline(hardware)}", "",
           "### Setup", "", markdown_table(setup_table(run)), ""]
    if again:
        out[-1:-1] = ["", "This run was logged above before it was resumed; this section is its state now and "
                          "supersedes that one."]
    acc = accuracy_table(run)
    out += [f"### Accuracy ({_inline(first.dataset_variant or '?')}, {_inline(first.get('dataset.num_images') or '?')} "
            "images)",
            "", markdown_table(acc) if acc else accuracy_unavailable(run), ""]
    point = operating_point_table(run)
    if point is not None:
        out += ["Operating point (the confidence with the highest mean F1 over the classes, IoU 0.50):", "",
                markdown_table(point), ""]
    out += ["### Performance", "", markdown_table(performance_table(run)), ""]
    repeated = repeats_table(run)
    if repeated is not None:  # --repeats: how far apart the processes were, as report.html shows it
        out += [f"Repeated in fresh processes (--repeats): {REPEATS_NOTE}", "", markdown_table(repeated), ""]
    served = server_table(run)
    if served is not None:  # --scenario server: each trial, as report.html shows them
        out += ["Server scenario (each trial's rate asked and achieved, latency from arrival to result):", "",
                markdown_table(served), ""]
    out += [f"### Gates ({gate_source})", ""]
    if gates is None:
        out += ["no gates file", ""]
    else:
        out += [markdown_table(gate_table(gates), bold=NOT_MET) if gates else "no gates in the file", ""]
        out += [f"- {_inline(n)}" for n in gate_notes] + ([""] if gate_notes else [])
    found = notes(run)
    out += ["### Notes", ""] + ([f"- {_inline(n)}" for n in found] if found else ["none"]) + [""]
    if len(harness_builds(run)) == 1:
        commit = str(first.get("repro.harness_commit") or "unknown")
        built = f"At harness commit {_code(commit)}" + (" (dirty: uncommitted changes)"
                                                         if first.get("repro.harness_dirty") else "")
    else:  # resumed under another build: the cells name theirs
        built = "Its cells were made at harness commits " + harness_commits(run)
    commands = [re.sub(r"[\x00-\x1f\x7f]", " ", c) for c in repro_commands(run)] or \
        ["# no repro.command recorded in the submissions"]
    fence = "`" * max(3, 1 + max(len(ticks) for c in commands for ticks in re.findall(r"`+", c) or [""]))
    out += ["### Reproduce", "", f"{built}:", "", f"{fence}bash", *commands, fence]
    out += ["", "### Artefacts", "", f"Run folder {_code(run.path.resolve())}:", ""]
    out += _artefact_lines(run) + [""]
    return "\n".join(out)


def check_log(path: Path, run_id: str, state: str) -> bool:
    """Refuse before anything is written: a folder, a missing parent, or a run already logged in this state (a run
    resumed since its section was written is logged again). Whether the log holds a section of the run in another
    state (before it was resumed), which the new one supersedes."""
    path = Path(path)
    problem = output_file_problem(path)
    if problem:  # a folder, a FIFO (appending would block), a path under a file or in a folder we cannot write
        raise UsageError(f"--log {path} {problem}; pass a Markdown file, e.g. BENCHMARKS.md")
    if not path.parent.is_dir():
        raise UsageError(f"--log {path}: folder {path.parent} does not exist; create it or choose another path")
    if path.is_file():
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            raise UsageError(f"--log {path} is not UTF-8 text; pass a Markdown benchmark log") from None
        if _logged(text, run_id, state):
            raise UsageError(f"run {run_id} already has a section in {path}{_as_they_are(text, run_id)}; the log is "
                             "append-only, nothing written")
        return re.search(f"^<!-- va-bench run {re.escape(run_id)} cells [0-9a-f]+ -->$", text, re.M) is not None
    return False


def _logged(text: str, run_id: str, state: str) -> bool:
    """Whether the log holds the run's section for this state of its cells: its marker on a line of its own, as the
    log writes it (a log written before states were marked: any section of the run)."""
    return re.search(f"^({re.escape(marker(run_id, state))}|{re.escape(f'<!-- va-bench run {run_id} -->')})$",
                     text, re.M) is not None


def _as_they_are(text: str, run_id: str) -> str:
    """How the log holds the run: for its cells as they are, or in a section written before sections recorded their
    cells' state (which stands for any state of the run)."""
    old = re.search(f"^{re.escape(f'<!-- va-bench run {run_id} -->')}$", text, re.M) is not None
    return " (written before sections recorded the state of a run's cells)" if old else " for its cells as they are"


def append_section(path: Path, text: str, run_id: str, state: str) -> None:
    """Append one section in a single write, under an exclusive lock on the file (two reports at once log a run
    once: the section is looked for again under the lock); a new file gets the log's header first. Earlier bytes
    are never touched: the file is opened for appending, and a write cut short (a full disk) is cut back to the
    size the log had, so a retry is not refused by half a section."""
    path = Path(path)
    try:
        # the umask decides the mode; O_BINARY: Windows would otherwise write each "\n" as "\r\n"
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_BINARY", 0), 0o666)
    except OSError as exc:
        raise UsageError(f"--log {path}: cannot append ({exc.strerror}); choose a writable path") from None
    try:
        lock_file(fd, wait=True)
        existing = _read_from_start(fd)
        size = len(existing)
        logged = existing.decode("utf-8", errors="replace")
        if _logged(logged, run_id, state):
            raise UsageError(f"run {run_id} already has a section in {path}{_as_they_are(logged, run_id)}; the log is "
                             "append-only, nothing written")
        prefix = LOG_HEADER + "\n" if not size else "\n" if existing.endswith(b"\n") else "\n\n"
        data = (prefix + text).encode("utf-8", "backslashreplace")
        try:
            written = 0
            while written < len(data):
                written += os.write(fd, data[written:])
        except OSError as exc:
            os.ftruncate(fd, size)  # the log as it was: no half section
            if is_disk_full(exc):
                raise DiskFullError(path, exc, "free some space; the log is as it was") from None
            raise UsageError(f"--log {path}: cannot append ({exc.strerror}); choose a writable path") from None
    finally:
        os.close(fd)


def _read_from_start(fd: int) -> bytes:
    """The whole file, read from its start (its appends still go to the end: it is open with O_APPEND)."""
    os.lseek(fd, 0, os.SEEK_SET)
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)
