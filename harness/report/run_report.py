"""`va-bench report RUN_DIR`: read the run folder, draw the plots, write report.html + PNGs into it, and
optionally append the run's section to the benchmark log. Everything that can be refused (bad run folder,
bad gates file, a log that already has this run) is checked before the first byte is written."""

from __future__ import annotations

import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from harness.errors import UsageError
from harness.files import atomic_write_bytes
from harness.report import EXAMPLE_GATES
from harness.report.gates import NO_SUCH_CELL, NOT_MET, GateResult, evaluate, gate_notes, load_gates
from harness.report.html import render_html
from harness.report.log import append_section, check_log, run_state, section
from harness.report.plots import PLOT_NAMES, Plot, all_plots
from harness.report.sections import REPORT_PAGE
from harness.results.reader import load_run


@dataclass
class ReportOutcome:
    run_id: str
    html: Path
    pngs: list[Path]
    plots: list[Plot]
    gates: list[GateResult] | None  # None: no gates file
    gate_source: str
    log: Path | None

    @property
    def gates_not_met(self) -> list[GateResult]:
        return [g for g in self.gates or [] if g.status == NOT_MET]

    @property
    def gates_failing(self) -> list[GateResult]:
        """What fails --fail-on-gates: a gate NOT MET, or one that selected no cell of the run (it checked nothing)."""
        return [g for g in self.gates or [] if g.status == NOT_MET or g.reason == NO_SUCH_CELL]


def _gate_source(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def make_report(run_dir: Path, gates_path: Path | None = None, log_path: Path | None = None,
                require_gates: bool = False) -> ReportOutcome:
    """Write RUN_DIR/report.html and the PNGs; append to `log_path` when given. Gates come only from the file the
    user names (`gates_path`): targets are a machine's and a project's, never applied by default
    (`require_gates`: refuse without one)."""
    run = load_run(run_dir)
    path = gates_path
    if path is None and require_gates:
        raise UsageError(f"--fail-on-gates needs --gates PATH, a YAML file of targets (an example: {EXAMPLE_GATES})")
    gates = load_gates(path) if path is not None else None
    state = run_state(run) if log_path is not None else ""
    # a section of this run already in the log, from before it was resumed: the new one supersedes it
    again = check_log(log_path, run.run_id, state) if log_path is not None else False
    if not os.access(run.path, os.W_OK):
        raise UsageError(f"cannot write the report into {run.path} (not writable); copy the run folder somewhere "
                         "writable and report that")
    results = evaluate(gates, run) if gates is not None else None
    source = _gate_source(path) if path is not None else "no gates file"
    notes = gate_notes(gates) if gates else []

    with _readable(run.path):  # drawn and rendered before the first file is written
        plots = all_plots(run)
        # a run recorded before names were made recordable can hold a lone surrogate: an escape on the page
        page = render_html(run, plots, results, source, notes).encode("utf-8", "backslashreplace")
    pngs = [atomic_write_bytes(run.path / plot.name, plot.png) for plot in plots if plot.png is not None]
    for stale in set(PLOT_NAMES) - {p.name for p in pngs}:
        (run.path / stale).unlink(missing_ok=True)  # a plot from an earlier report that has nothing to show now
    html = atomic_write_bytes(run.path / REPORT_PAGE, page)
    if log_path is not None:  # the log's section lists the run folder's files: the report's among them
        with _readable(run.path):
            text = section(run, results, source, notes, again=again)
        append_section(log_path, text, run.run_id, state)
    return ReportOutcome(run.run_id, html, pngs, plots, results, source, log_path)


@contextmanager
def _readable(run_path: Path):
    """Values a run's files should not hold (a batch size of 0, a list where a number belongs) stop the report in
    one line, naming the run and the command that checks its files."""
    try:
        yield
    except (TypeError, ValueError, ZeroDivisionError, KeyError) as exc:
        detail = next((line.strip()[:160] for line in str(exc).splitlines() if line.strip()), "no detail")
        raise UsageError(f"{run_path}: its files hold values the report cannot read ({type(exc).__name__}: "
                         f"{detail}); check them with va-bench validate {run_path}") from exc
