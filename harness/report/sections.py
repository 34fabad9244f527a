"""The report's tables as plain text rows (setup, performance, accuracy, artefacts, notes), built once from
the run folder and rendered by both html.py and log.py, so the HTML and the benchmark log agree."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from harness.figures import count_of
from harness.results.reader import RunFolder, inside_run_folder, lookup, number, read_json_object

COCO_METRICS = ("mAP_50_95", "mAP_50", "mAP_75", "mAP_small", "mAP_medium", "mAP_large",
                "AR1", "AR10", "AR100", "AR_small", "AR_medium", "AR_large")


@dataclass
class Table:
    header: list[str]
    rows: list[list[str]]
    numeric: list[bool]  # per column: right-align


def fmt(value: Any, digits: int = 2) -> str:
    """A number with `digits` decimals; '-' for a missing value (never 0 for 'not measured')."""
    x = number(value)
    return "-" if x is None else f"{x:.{digits}f}"


def run_date(run: RunFolder) -> str:
    """YYYY-MM-DD of the run (its first cell's created_at, else the run id's stamp)."""
    stamp = run.created_at or run.run_id
    if len(stamp) >= 10 and stamp[4] == "-":
        return stamp[:10]
    return f"{stamp[:4]}-{stamp[4:6]}-{stamp[6:8]}" if stamp[:8].isdigit() else "unknown date"


def _hardware(run: RunFolder) -> str:
    h = run.first("hardware", {}) or {}
    gpu = h.get("gpu")
    gpu_text = "no GPU" if gpu in (None, "", "none") else f"GPU {gpu} ({h.get('gpu_memory_gb')} GiB, driver " \
                                                           f"{h.get('driver_version')}, CUDA {h.get('cuda_version')})"
    if "cpu_physical_cores" in h:
        cpus = f"{h.get('cpu_cores') or '?'} logical CPUs / {h['cpu_physical_cores'] or '?'} cores"
    else:  # a run recorded before cpu_cores counted logical CPUs: cores and threads
        cpus = f"{h.get('cpu_cores', '?')} cores / {h.get('cpu_threads', '?')} threads"
    others = [(i, n) for i, n in counted([c.get("hardware.id") or "?" for c in run.cells]) if i != str(h.get("id"))]
    elsewhere = f"; other cells under {_counts(others)}" if others else ""  # a resume under another id
    return f"{h.get('id', '?')}: {h.get('cpu', '?')} ({cpus}), {h.get('ram_gb', '?')} GiB RAM, {gpu_text}{elsewhere}"


def counted(values: list[Any]) -> list[tuple[str, int]]:
    """The distinct values (as text) with how many times each occurs, in the order they first occur."""
    counts: dict[str, int] = {}
    for v in values:
        counts[str(v)] = counts.get(str(v), 0) + 1
    return list(counts.items())


def _counts(pairs: list[tuple[str, int]]) -> str:
    return ", ".join(f"{value} ({count_of(n, 'cell')})" for value, n in pairs)


def harness_builds(run: RunFolder) -> list[tuple[str, int]]:
    """The builds the cells were made at (the commit's 12 digits, "(dirty)" with uncommitted changes), each with its
    cell count: more than one when a resume under another build made some of them."""
    return counted([f"{str(c.get('repro.harness_commit') or 'unknown')[:12]}"
                    f"{' (dirty)' if c.get('repro.harness_dirty') else ''}" for c in run.cells])


def harness_commits(run: RunFolder) -> str:
    """harness_builds as text: the one build, or each with its cell count."""
    builds = harness_builds(run)
    return builds[0][0] if len(builds) == 1 else _counts(builds)


def _on_off(value: Any) -> str:
    return {True: "on", False: "off"}.get(value, "not recorded")


def _span(values: list[Any], digits: int = 0) -> str:
    nums = sorted({round(float(v), digits) for v in values if number(v) is not None})
    if not nums:
        return "-"
    low, high = (f"{n:.{digits}f}" for n in (nums[0], nums[-1]))
    return low if low == high else f"{low}-{high}"


def _accuracy_pass(cells: list) -> str:
    """Which evaluator scored the cells, each cell its own timed pass at its batch size ("not run" without one)."""
    evaluators = sorted({str(c.get("eval.evaluator")) for c in cells if c.get("eval.evaluator")})
    if not evaluators:
        return "not run"
    sizes = sorted({int(b) for c in cells if number(b := c.get("eval.batch_size")) is not None})
    return f"{', '.join(evaluators)}, on each cell's own pass (batch size {', '.join(map(str, sizes)) or '?'})"


def cell_counts(run: RunFolder) -> str:
    """'4 ok' or '3 ok, 1 failed (...)' from run.json's cell list (the submissions when run.json has none)."""
    if not run.cell_status:
        return f"{len(run.cells)} with submissions (run.json lists no cell status)"
    by_status: dict[str, int] = {}
    for c in run.cell_status:
        by_status[str(c.get("status"))] = by_status.get(str(c.get("status")), 0) + 1
    return ", ".join(f"{n} {s}" for s, n in sorted(by_status.items(), key=lambda kv: kv[0] != "ok"))


def setup_table(run: RunFolder) -> Table:
    """Component | Value: what ran, where, on which data, with which protocol and software."""
    env = run.first("environment", {}) or {}
    software = run.first("environment.software") or run.first("software") or {}
    threads = env.get("threads") or run.first("environment.threads") or {}
    alloc = env.get("memory_allocator") or run.first("environment.memory_allocator") or {}
    tf32 = run.first("runtime.tf32") or env.get("tf32") or {}
    cells = run.cells
    first = cells[0]
    rows = [
        ["Run", f"{run.run_id} ({run_date(run)})"],
        ["Hardware", _hardware(run)],
        ["Device", str(run.first("device") or first.get("runtime.device") or "?")],
        ["Platform", str(run.first("environment.platform") or "?")],
        ["Software", ", ".join(f"{k} {v}" for k, v in software.items()) or "?"],
        ["Threads", ", ".join(f"{k} {'unset' if v is None else v}" for k, v in threads.items()
                              if not isinstance(v, dict)) or "?"],
        ["Memory allocator", " ".join(str(v) for v in (alloc.get("allocator"), alloc.get("GLIBC_TUNABLES")) if v)
         or "?"],
        ["TF32", f"mode {tf32.get('mode', '?')}, float32 matmul precision {tf32.get('float32_matmul_precision', '?')}"],
        ["Dataset", f"{first.get('dataset.id') or 'coco2017'} {first.get('dataset.split') or 'val2017'}, variant "
                    f"{first.dataset_variant or '?'} ({first.get('dataset.num_images') or '?'} images), "
                    f"image_id_sha256 {str(first.get('dataset.image_id_sha256') or '?')[:16]}…"],
        ["Protocol", f"conf {first.get('config.conf')}, iou {first.get('config.iou')}, max_det "
                     f"{first.get('config.max_det')}"],
        ["Timing", f"warm-up {_span([c.get('timing.warmup.batches') for c in cells])} batches, "
                   f"{_span([c.get('timing.warmup.seconds') for c in cells], 1)} s (until the batch times "
                   f"settled, or {run.first('config.warmup_seconds', '?')} s since it began once its minimum "
                   f"batches were done); timed batches per cell "
                   f"{_span([c.get('timing.timed_batches') for c in cells])}; mode "
                   f"{', '.join(sorted({c.key.mode for c in cells}))}; stage sync "
                   f"{', '.join(sorted({_on_off(c.get('timing.stage_sync')) for c in cells}))}"],
        ["Accuracy pass", _accuracy_pass(cells)],
        ["Harness", f"va-bench {run.first('repro.harness_version') or '?'}, commit {harness_commits(run)}"],
        ["Cells", cell_counts(run)],
    ]
    return Table(["Component", "Value"], rows, [False, False])


def _split(cell) -> str:
    """The batch time's split as the run's summary shows it: the forward's share includes the input's transfer to
    the device (as the submission's inference_ms does)."""
    total = number(cell.get("timing.batch_ms.mean"))
    parts = []
    for stages, short in ((("preprocess",), "pre"), (("transfer", "forward"), "fwd"), (("postprocess",), "post")):
        means = [m for m in (number(cell.get(f"timing.stages_ms.{stage}.mean")) for stage in stages) if m is not None]
        if means and total:
            parts.append(f"{short} {100 * sum(means) / total:.0f}%")
    return " / ".join(parts) or "-"


def _energy(cell) -> str:
    if cell.get("energy.status") == "ok":
        return fmt(cell.get("energy.joules_per_image"), 4)
    return "unavailable"


def _p99(cell) -> str:
    """A cell's p99 per image beside its distribution-free 95 % upper bound (timing.tail), or why it has none."""
    tail = cell.get("timing.tail.p99")
    if not isinstance(tail, dict):  # a cell recorded before timing.tail, or the site's own file
        return fmt(cell.first_number("timing.per_image_ms.p99", "timing.total_ms.p99"))
    if tail.get("upper95") is None:
        return f"{fmt(tail.get('value'))} (no bound: {tail.get('samples')} of {tail.get('samples_needed')} samples)"
    return f"{fmt(tail.get('value'))} (<= {fmt(tail.get('upper95'))})"


def performance_table(run: RunFolder) -> Table:
    """One row per cell: throughput, latency percentiles (the p99 with its 95 % upper bound), how long it was timed,
    stage split, peak memory, energy."""
    header = ["model", "backend", "precision", "size", "batch", "mode", "timed batches", "timed s", "img/s",
              "p50 ms/batch", "p95 ms/batch", "p50 ms/img", "p99 ms/img (95 % bound)", "stage split", "peak RAM MB",
              "peak VRAM MB", "J/img"]
    rows = []
    for c in run.cells:
        k = c.key
        rows.append([k.model, k.backend, k.precision, str(k.input_size), str(k.batch_size), k.mode,
                     fmt(c.get("timing.timed_batches"), 0), fmt(c.get("timing.timed_seconds"), 1),
                     fmt(c.first_number("throughput.images_per_s", "throughput.fps_mean")),
                     fmt(c.get("timing.batch_ms.p50")), fmt(c.get("timing.batch_ms.p95")),
                     fmt(c.first_number("timing.per_image_ms.p50", "timing.total_ms.p50")), _p99(c), _split(c),
                     fmt(c.get("memory.peak_ram_mb"), 1),
                     fmt(c.get("memory.peak_vram_mb"), 1), _energy(c)])
    numeric = [False, False, False, True, True, False, True, True, True, True, True, True, False, False, True, True,
               True]
    return Table(header, rows, numeric)


def _cells_with(run: RunFolder, block: str):
    """Each cell that has the figures block `block` (a dotted path), with the block."""
    for c in run.cells:
        found = c.get(block)
        if isinstance(found, dict):
            yield c, found


def server_table(run: RunFolder) -> Table | None:
    """--scenario server: each trial of each cell (the one at --qps, then --find-max-qps's search in its order): the
    rate asked and achieved, the latency percentiles from arrival to result, the queueing p99 and whether the p99
    held the bound; None when no cell served."""
    rows = []
    for c, server in _cells_with(run, "server"):
        k = c.key
        trials = ([("at --qps", server["at_qps"])] if isinstance(server.get("at_qps"), dict) else []) + [
            (f"search {n}", t) for n, t in enumerate((server.get("search") or {}).get("trials") or [], 1)]
        found = f"max {fmt(server['max_qps'])} qps" if number(server.get("max_qps")) is not None else (
            "no rate held" if "max_qps" in server else "")
        for n, (what, t) in enumerate(trials):
            latency = t.get("latency_ms") or {}
            rows.append([k.model, k.backend, str(k.batch_size), what, fmt(t.get("qps")), fmt(t.get("achieved_qps")),
                         fmt(latency.get("p50"), 1), fmt(latency.get("p99"), 1), fmt(t.get("queue_ms_p99"), 1),
                         fmt(t.get("latency_bound_ms") or server.get("latency_bound_ms"), 0),
                         "held" if t.get("bound_held") else "NOT held", found if n == 0 else ""])
    if not rows:
        return None
    header = ["model", "backend", "batch", "trial", "qps asked", "qps achieved", "p50 ms", "p99 ms",
              "queueing p99 ms", "bound ms", "p99 <= bound", "found"]
    return Table(header, rows, [False, False, True, False, True, True, True, True, True, True, False, False])


REPEATS_NOTE = ("the median batch time of every process that timed the cell, the run's own (timed and scored) first, "
                "the others fresh processes timing the same cell; the spread is their range over their median")


def repeats_table(run: RunFolder) -> Table | None:
    """--repeats: each cell's median batch time in every process that timed it (the run's own first), their median and
    spread; None when no cell was repeated."""
    rows = []
    for c, block in _cells_with(run, "timing.repeats"):
        k = c.key
        medians = " / ".join(fmt(v) for v in block.get("batch_ms_p50") or [])
        spread = (f"{fmt(block['spread_pct'], 1)} %" if number(block.get("spread_pct")) is not None
                  else f"unavailable: {block.get('spread_reason') or 'no reason recorded'}")
        rows.append([k.model, k.backend, k.precision, str(k.input_size), str(k.batch_size),
                     f"{fmt(block.get('processes'), 0)} of {fmt(block.get('requested'), 0)}", medians,
                     fmt(block.get("median_of_processes_ms")), spread])
    if not rows:
        return None
    header = ["model", "backend", "precision", "size", "batch", "processes", "p50 ms/batch in each",
              "median ms/batch", "spread"]
    return Table(header, rows, [False, False, False, True, True, True, False, True, False])


def accuracy_table(run: RunFolder) -> Table | None:
    """The 12 COCO metrics per cell (of the masks for a segmentation cell, with its box mAP beside them); None when
    no cell has accuracy."""
    scored = [c for c in run.cells if number((c.get("accuracy") or {}).get("mAP_50_95")) is not None]
    if not scored:
        return None
    segment = any(c.get("model.task") == "segment" for c in scored)
    intervals = any(isinstance(c.get("eval.map_ci"), dict) for c in scored)
    rows = []
    for c in scored:
        acc, k = c.get("accuracy"), c.key
        row = [k.model, k.backend, k.precision, str(k.input_size), str(k.batch_size),
               fmt(c.get("dataset.num_images") or c.get("eval.numImages"), 0)]
        if segment:
            row.append("masks" if c.get("model.task") == "segment" else "boxes")
        failing = _int8_failing(c) is not None  # marked as the run's summary marks it
        rows.append(row + [fmt(acc.get(m), 4) + ("!" if failing and m == "mAP_50_95" else "") for m in COCO_METRICS]
                    + ([fmt(acc.get("bbox_mAP_50_95"), 4)] if segment else [])
                    + ([_interval(c.get("eval.map_ci"))] if intervals else []))
    header = ["model", "backend", "precision", "size", "batch", "images", *(["scored"] if segment else []),
              *COCO_METRICS, *(["bbox_mAP_50_95"] if segment else []),
              *(["mAP_50_95 95 % CI (images)"] if intervals else [])]
    numeric = [False, False, False, True, True, True, *([False] if segment else []), *[True] * len(COCO_METRICS),
               *([True] if segment else []), *([False] if intervals else [])]
    return Table(header, rows, numeric)


def _int8_failing(cell) -> str | None:
    """Why an int8 cell's row fails (it keeps < 99 % of the same model's fp32 mAP, or the fp32 reference could not be
    scored: eval.int8_vs_fp32), or None."""
    verdict = cell.get("eval.int8_vs_fp32")
    if not isinstance(verdict, dict) or (verdict.get("passed") is not False and verdict.get("status") != "unavailable"):
        return None
    if verdict.get("failing"):
        return str(verdict["failing"])
    if verdict.get("status") == "unavailable":  # a file written before the run said so itself
        return f"the int8 accuracy rule could not be checked: {verdict.get('reason') or 'no reason recorded'}"
    return f"int8 keeps {verdict.get('kept')} of the fp32 mAP: below 99 %"


def operating_point_table(run: RunFolder) -> Table | None:
    """Per scored cell, the operating point (`eval.operating_point`): the confidence with the highest mean F1 over
    the classes and the mean precision, recall and F1 there, or why there is none; None when no cell has one
    (a run recorded before operating points, the site's own files)."""
    rows = []
    for c in run.cells:
        point = c.get("eval.operating_point")
        if not isinstance(point, dict):
            continue
        k = c.key
        row = [k.model, k.backend, k.precision, str(k.input_size), str(k.batch_size),
               "masks" if c.get("model.task") == "segment" else "boxes"]
        if point.get("status") == "unavailable":
            rows.append(row + ["-", "-", "-", "-", "-", f"unavailable: {point.get('reason')}"])
        else:
            rows.append(row + [fmt(point.get("confidence"), 4), fmt(point.get("precision"), 4),
                               fmt(point.get("recall"), 4), fmt(point.get("F1"), 4), fmt(point.get("classes"), 0),
                               ""])
    if not rows:
        return None
    return Table(["model", "backend", "precision", "size", "batch", "scored", "confidence", "P", "R", "F1", "classes",
                  "note"], rows, [False, False, False, True, True, False, True, True, True, True, True, False])


def per_class_file(run: RunFolder, cell) -> dict | None:
    """A cell's per_class file (`eval.per_class`, inside its run folder), or None where it has none to read."""
    relative = cell.get("eval.per_class")
    path = inside_run_folder(run.path, relative) if isinstance(relative, str) else None
    if path is None or not path.is_file():
        return None
    return read_json_object(path)


def _interval(ci) -> str:
    """A cell's bootstrap interval of mAP 50:95 (`eval.map_ci`), or '-' where it has none."""
    bounds = ci.get("mAP_50_95") if isinstance(ci, dict) else None
    if not (isinstance(bounds, list) and len(bounds) == 2):
        return "- (withheld: eval.map_ci.reason says why)" if isinstance(ci, dict) and ci.get("reason") else "-"
    return f"{fmt(bounds[0], 4)}-{fmt(bounds[1], 4)} ({ci.get('resamples')} resamples)"


def per_class_table(run: RunFolder) -> tuple[str, Table] | None:
    """Each category's AP 50:95 and AP 50 (at the evaluation cap), and its precision, recall and F1 at the
    operating point, of the first scored cell that has them (`eval.per_class`, written by the run): (the cell's
    label, table); None when no cell has them."""
    documents = [(c, d) for c in run.cells if (d := per_class_file(run, c)) is not None]
    # a cell scored with its operating point first (a resumed run can hold files written before them)
    for c, document in sorted(documents, key=lambda cd: "operating_point" not in cd[1]):
        entries = [e for e in document.get("categories") or [] if isinstance(e, dict)]
        rows = [[str(e.get("id")), str(e.get("name") or "-"), fmt(e.get("AP"), 4), fmt(e.get("AP50"), 4),
                 fmt(e.get("precision"), 4), fmt(e.get("recall"), 4), fmt(e.get("F1"), 4)] for e in entries]
        if rows:
            return c.key.label, Table(["id", "category", "AP 50:95", "AP 50", "P", "R", "F1"], rows,
                                      [True, False, True, True, True, True, True])
    return None


def accuracy_unavailable(run: RunFolder) -> str:
    reasons = sorted({str(c.get("accuracy.reason") or c.get("eval.status") or "no accuracy block") for c in run.cells})
    return "accuracy unavailable: " + "; ".join(reasons)


def notes(run: RunFolder) -> list[str]:
    """What a reader must know before trusting the numbers: failed cells, timing warnings, batch invariance,
    missing probes, files the reader superseded."""
    out = []
    for c in run.cell_status:
        if c.get("status") != "ok":
            why = c.get("reason") or c.get("error")
            out.append(f"cell {c.get('cell')}: {c.get('status')}" + (f" ({why})" if why else ""))
    for c in run.cells:
        if (failing := _int8_failing(c)) is not None:
            out.append(f"{c.key.label}: {failing} (mAP_50_95!)")
        for w in c.get("timing.warnings") or []:
            out.append(f"{c.key.label}: {w}")
        rate = number(c.get("batch_invariance.match_rate"))
        if rate is not None and rate < 1.0:
            out.append(f"{c.key.label}: batch invariance {100 * rate:.2f}% of detections matched the reference pass")
    energy = sorted({str(c.get("energy.reason") or "no reason given") if isinstance(c.get("energy"), dict)
                     else "no energy block in the submission" for c in run.cells if c.get("energy.status") != "ok"})
    out += [f"energy unavailable: {r}" for r in energy]
    for resume in lookup(run.run, "resumed") or []:
        forced = resume.get("forced_differences") if isinstance(resume, dict) else None
        if forced:
            out.append(f"resumed {resume.get('at') or ''} with --force despite: {'; '.join(map(str, forced))}")
    return out + run.notes


REPORT_PAGE = "report.html"


def artefacts(run: RunFolder, report_files: Sequence[str] = ()) -> list[tuple[str, int]]:
    """(path relative to the run folder, bytes) of every file in it, submissions and images included, but for the
    report's own files (`report_files`, top level): the report lists those it writes itself, so the list does not
    depend on whether the run was reported before."""
    files = sorted(p for p in run.path.rglob("*") if p.is_file() and not p.name.startswith(".")
                   and not (p.parent == run.path and p.name in report_files))
    return [(p.relative_to(run.path).as_posix(), p.stat().st_size) for p in files]


def repro_commands(run: RunFolder) -> list[str]:
    """The distinct `repro.command`s of the submissions (one per run unless it was resumed)."""
    commands = [str(c.get("repro.command")) for c in run.cells if c.get("repro.command")]
    if not commands and lookup(run.run, "environment.command"):
        commands = [str(lookup(run.run, "environment.command"))]
    return list(dict.fromkeys(commands))


def human_size(n: float) -> str:
    """1536 -> '1.5 KB'."""
    units = ("B", "KB", "MB", "GB")
    i = 0
    while n >= 1024 and i < len(units) - 1:
        n /= 1024
        i += 1
    return f"{int(n)} B" if i == 0 else f"{n:.1f} {units[i]}"
