"""`va-bench report` on real runs: report.html + PNGs whose plotted numbers equal the run's records, the
append-only benchmark log with gates, bad input (one line, exit 2, nothing written), torch-freeness, and
the page opening in headless Chromium."""

from __future__ import annotations

import base64
import csv
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from conftest import COCO_DIR, REPO, requires_coco, requires_yolox, run_in_process

from harness.errors import UsageError
from harness.report import EXAMPLE_GATES
from harness.report.gates import load_gates
from harness.report.plots import BAND_FROM_SAMPLES, BAND_FROM_SUMMARY, energy_per_image
from harness.report.run_report import make_report
from harness.report.sections import human_size
from harness.results.reader import load_run

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
EXPECTED_PNGS = ("latency_throughput.png", "stages.png", "layer_types.png", "memory.png")
pytestmark = [requires_coco, requires_yolox]


def va_bench(*args: str) -> subprocess.CompletedProcess:
    return run_in_process(*args)


def _bench(out: Path, run_id: str, *extra: str) -> Path:
    """A small real run (ONNX Runtime, 8 images) through the CLI, as a user makes one."""
    result = va_bench("run", "--model", "yolox-nano", "--backend", "onnxruntime", "--limit", "8",
                      "--coco-dir", str(COCO_DIR), "--warmup-batches", "1", "--warmup-seconds", "0",
                      "--min-timed-batches", "2", "--no-profile", "--output-dir", str(out), "--run-id", run_id, *extra)
    assert result.returncode == 0, result.stderr[-2000:]
    return out / run_id


@pytest.fixture(scope="module")
def run_a(tmp_path_factory) -> Path:
    """Batch 1 and 2 with the layer pass (ONNX Runtime's node profiler: a few batches) and memory sampling."""
    return _bench(tmp_path_factory.mktemp("runs"), "report-a", "--batch-sizes", "1", "2", "--layers", "--memory")


@pytest.fixture(scope="module")
def run_b(tmp_path_factory) -> Path:
    """A second, leaner run: no layer pass, no memory, no energy (the report must still work)."""
    return _bench(tmp_path_factory.mktemp("runs"), "report-b", "--batch-sizes", "1", "--limit", "4", "--no-layers",
                  "--no-memory", "--no-energy")


def _copy(run: Path, tmp_path: Path) -> Path:
    dest = tmp_path / run.name
    shutil.copytree(run, dest)
    return dest


def _submissions(run: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((run / "submissions").glob("*.json"))]


def test_report_writes_html_and_pngs(run_a, tmp_path):
    run = _copy(run_a, tmp_path)
    outcome = make_report(run)
    assert outcome.html == run / "report.html"
    for name in EXPECTED_PNGS:
        data = (run / name).read_bytes()
        assert len(data) > 1000 and data.startswith(PNG_SIGNATURE), name
    html = outcome.html.read_text()
    # self-contained: every image is an embedded data URI that decodes to what it claims to be
    sources = re.findall(r"src=['\"]([^'\"]+)['\"]", html)
    assert len(sources) >= len(EXPECTED_PNGS)
    for src in sources:
        mime, payload = re.fullmatch(r"data:(image/(?:png|jpeg));base64,([A-Za-z0-9+/=]+)", src).groups()
        raw = base64.b64decode(payload, validate=True)
        assert raw.startswith(PNG_SIGNATURE if mime == "image/png" else b"\xff\xd8")
    for png in EXPECTED_PNGS:  # the HTML embeds exactly the PNG files written beside it
        assert base64.b64encode((run / png).read_bytes()).decode() in html
    assert "http://" not in html and "https://" not in html
    # energy is not readable on this box: the report says so and why, from the submission
    energy = _submissions(run)[0]["energy"]
    if energy.get("status") != "ok":
        assert not (run / "energy.png").exists()
        assert energy["reason"].split(";")[0] in html


def test_plotted_numbers_equal_the_records(run_a):
    outcome_plots = {p.name: p for p in make_report_plots(run_a)}
    subs = _submissions(run_a)
    assert len(subs) == 2
    by_batch = {s["config"]["batch_size"]: s for s in subs}

    # latency / throughput: one series, a point per batch size, p50 and images/s as recorded
    (series,) = outcome_plots["latency_throughput.png"].data
    assert series.batch_sizes == [1, 2]
    for batch, p50, band, source, ips, ips_band in zip(series.batch_sizes, series.p50_ms, series.band_ms,
                                                       series.band_source, series.images_per_s,
                                                       series.band_images_per_s, strict=True):
        sub = by_batch[batch]
        assert p50 == sub["timing"]["batch_ms"]["p50"]
        assert ips == sub["throughput"]["images_per_s"]
        samples = sub["timing"].get("batch_samples_ms")
        if samples:  # reference: linear-interpolated percentiles by hand
            assert source == BAND_FROM_SAMPLES
            assert band == pytest.approx((_percentile(samples, 5), _percentile(samples, 95)), rel=1e-12)
            assert len(samples) == sub["timing"]["timed_batches"]
        else:
            assert source == BAND_FROM_SUMMARY
            assert band == (sub["timing"]["batch_ms"]["min"], sub["timing"]["batch_ms"]["p95"])
        assert ips_band == pytest.approx((batch * 1000 / band[1], batch * 1000 / band[0]))

    # stages: mean per-batch stage time / batch size; the stack adds up to the batch mean per image
    for bar in outcome_plots["stages.png"].data:
        sub = by_batch[bar.batch_size]
        for stage in ("preprocess", "transfer", "forward", "postprocess"):
            assert bar.ms_per_image[stage] == pytest.approx(sub["timing"]["stages_ms"][stage]["mean"] / bar.batch_size)
        # (stage means are rounded to 1e-4 ms in the submission)
        assert sum(bar.ms_per_image.values()) == pytest.approx(sub["timing"]["batch_ms"]["mean"] / bar.batch_size,
                                                               abs=1e-3)

    # layer types: layer_types.csv as written, and the submission's own top list agrees
    layers = outcome_plots["layer_types.png"].data
    with (run_a / "layer_types.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    (label,) = layers
    assert sorted(layers[label]) == sorted((r["layer_type"], float(r["total_ms"])) for r in rows)
    layered = by_batch[2]  # the layer pass runs at the largest batch size
    for entry in layered["layers"]["by_type_top"]:
        assert dict(layers[label])[entry["layer_type"]] == pytest.approx(entry["total_ms"])

    # memory: every memory.csv sample, and the dashed peak of each window is the submission's peak RAM
    memory = outcome_plots["memory.png"].data
    with (run_a / "memory.csv").open() as fh:
        mem_rows = list(csv.DictReader(fh))
    assert memory["rss_mb"] == [float(r["rss_mb"]) for r in mem_rows]
    assert memory["t_s"][0] == 0 and memory["t_s"] == sorted(memory["t_s"])
    assert memory["peak_ram_mb"] == {f"timing yolox-nano onnxruntime fp32 416 b{b}": s["memory"]["peak_ram_mb"]
                                     for b, s in by_batch.items()}

    # energy: drawn where measured, else the submissions' reason
    energy = outcome_plots["energy.png"]
    if all(s["energy"].get("status") != "ok" for s in subs):
        assert energy.png is None and subs[0]["energy"]["reason"] in energy.unavailable


def make_report_plots(run: Path):
    from harness.report.plots import all_plots

    return all_plots(load_run(run))


def _percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), written out."""
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def test_layer_rows_of_a_cell_that_did_not_finish_are_not_plotted(run_a, tmp_path):
    """A report on a run stopped during a layer pass: layer_types.csv may hold the unfinished cell's rows (a resume
    drops them; a report before it must not plot them as if the cell had finished)."""
    run = _copy(run_a, tmp_path)
    with (run / "layer_types.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    stray = {**rows[0], "batch_size": "64", "layer_type": "StrayConv", "total_ms": "99.0"}
    with (run / "layer_types.csv").open("a", newline="") as fh:
        csv.DictWriter(fh, fieldnames=list(rows[0])).writerow(stray)
    layers = {p.name: p for p in make_report_plots(run)}["layer_types.png"].data
    assert len(layers) == 1 and "StrayConv" not in dict(next(iter(layers.values())))


def test_the_memory_line_breaks_between_the_processes_of_a_resumed_run(run_a, tmp_path, monkeypatch):
    """A resumed run (or a fleet's tasks) appends its process's samples to memory.csv, beginning with its "start"
    tag, minutes or days after the last ones: the line breaks there, not drawn across the gap as if measured."""
    from harness.report import plots

    run = _copy(run_a, tmp_path)
    with (run / "memory.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    later = float(rows[-1]["timestamp"]) + 600
    resumed = [{**rows[0], "timestamp": str(later + 0.05 * i), "tag": tag, "rss_mb": str(100.0 + i)}
               for i, tag in enumerate(["start", "start", "between", "between"])]
    # a third process that ended before its first window (all its samples "start") after one that did the same
    resumed += [{**rows[0], "timestamp": str(later + 600 * k + 0.05 * i), "tag": "start", "rss_mb": str(200.0 + i)}
                for k in (1, 2) for i in range(2)]
    with (run / "memory.csv").open("a", newline="") as fh:
        csv.DictWriter(fh, fieldnames=list(rows[0])).writerows(resumed)
    figures = []
    monkeypatch.setattr(plots, "_png", lambda fig: figures.append(fig) or b"")
    memory = plots.memory_timeline(load_run(run))
    (line,) = [line for line in figures[0].axes[0].get_lines() if line.get_label() == "host RSS (MB)"]
    drawn = list(line.get_ydata())
    n = len(rows)
    breaks = [n, n + 4, n + 6]  # where each later process begins
    assert [i - k for k, i in enumerate(i for i, y in enumerate(drawn) if np.isnan(y))] == breaks, drawn[n:]
    assert drawn[:n] == [float(r["rss_mb"]) for r in rows] and drawn[n + 1:n + 5] == [100, 101, 102, 103]
    assert memory.data["process_starts"] == [0, *breaks]
    assert memory.data["rss_mb"][n:] == [100.0, 101.0, 102.0, 103.0, 200.0, 201.0, 200.0, 201.0]  # as recorded
    # each gap between processes is drawn as MEMORY_GAP_S (not 10 minutes that would squeeze the samples into a
    # line), and said: the times within a process keep their spacing
    t = memory.data["t_s"]
    assert [round(t[i] - t[i - 1], 6) for i in breaks] == [plots.MEMORY_GAP_S] * 3
    assert [round(t[n + k + 1] - t[n + k], 6) for k in range(3)] == [0.05] * 3
    assert [round(g) for g in memory.data["gaps_s"]] == [600] * 3
    assert [text.get_text() for text in figures[0].axes[0].texts if text.get_text().startswith(" +")] == \
        [" +10 min"] * 3


def test_energy_is_plotted_where_measured(run_a, tmp_path):
    """This box has no energy counter, so the measured path is fed a submission carrying a measurement."""
    run = _copy(run_a, tmp_path)
    files = sorted((run / "submissions").glob("*.json"))
    doc = json.loads(files[0].read_text())
    doc["energy"] = {"status": "ok", "methods": ["rapl"], "joules_per_image": 0.4321, "images_per_joule": 2.314}
    files[0].write_text(json.dumps(doc))
    plot = energy_per_image(load_run(run))
    assert plot.png.startswith(PNG_SIGNATURE)
    assert list(plot.data.values()) == [0.4321]
    assert any("not measured" in n for n in plot.notes)  # the other cell has no measurement


def test_performance_table_matches_submissions(run_a):
    from harness.report.sections import performance_table

    table = performance_table(load_run(run_a))
    col = {h: i for i, h in enumerate(table.header)}
    for row in table.rows:
        sub = next(s for s in _submissions(run_a) if s["config"]["batch_size"] == int(row[col["batch"]]))
        # printed to 2 decimals: half a unit of the last digit, plus binary slack (48.695 prints as 48.7)
        half_unit = 0.005 + 1e-9
        assert float(row[col["img/s"]]) == pytest.approx(sub["throughput"]["images_per_s"], abs=half_unit)
        assert float(row[col["p50 ms/batch"]]) == pytest.approx(sub["timing"]["batch_ms"]["p50"], abs=half_unit)
        assert row[col["J/img"]] == ("unavailable" if sub["energy"].get("status") != "ok" else row[col["J/img"]])
        assert float(row[col["timed s"]]) == pytest.approx(sub["timing"]["timed_seconds"], abs=0.05 + 1e-9)
        # the p99 per image and its bound: numpy's percentile and scipy's binomial order statistic of the samples
        from scipy.stats import binom

        samples = np.asarray(sub["timing"]["batch_samples_ms"])
        per_image = samples / sub["timing"]["batch_size"]
        # the other latency columns are numpy's of the same samples (the submission rounds them to 4 decimals)
        assert float(row[col["p95 ms/batch"]]) == pytest.approx(np.percentile(samples, 95), abs=half_unit + 2e-4)
        assert float(row[col["p50 ms/img"]]) == pytest.approx(np.median(per_image), abs=half_unit + 2e-4)
        assert float(row[col["peak RAM MB"]]) == pytest.approx(sub["memory"]["peak_ram_mb"], abs=0.05 + 1e-9)
        shown = row[col["p99 ms/img (95 % bound)"]]
        figure, _, rest = shown.partition(" (")
        # 2 decimals of a figure the submission rounds to 4 (and its samples too): half a unit, and the rounding's
        assert float(figure) == pytest.approx(np.percentile(per_image, 99), abs=half_unit + 2e-4)
        if len(per_image) >= 299:
            bound = np.sort(per_image)[int(binom.ppf(0.95, len(per_image), 0.99))]
            assert rest.startswith("<= ") and float(rest[3:-1]) == pytest.approx(bound, abs=half_unit + 2e-4)
        else:
            assert rest == f"no bound: {len(per_image)} of 299 samples)", shown
        # the split as the run's summary gives it: the transfer to the device is the forward's
        stages, total = sub["timing"]["stages_ms"], sub["timing"]["batch_ms"]["mean"]
        assert "transfer" in stages
        shares = [100 * sum(stages[n]["mean"] for n in names if n in stages) / total
                  for names in (("preprocess",), ("transfer", "forward"), ("postprocess",))]
        assert row[col["stage split"]] == f"pre {shares[0]:.0f}% / fwd {shares[1]:.0f}% / post {shares[2]:.0f}%"


@pytest.mark.skipif(not (Path(os.environ.get("VA_BENCH_CORPUS", REPO.parent / "shared/corpus/vision-analysis"))
                          / "submissions").is_dir(), reason="vision-analysis corpus not found")
def test_the_sites_own_files_report_their_figures_under_its_names(tmp_path):
    """A run folder of the site's files (its throughput.fps_mean and timing.total_ms, a variant derived from 500
    images, no energy block): the figures shown are the files' own, the variant the reader's, never "None"."""
    from harness.report.sections import notes, performance_table, setup_table

    corpus = Path(os.environ.get("VA_BENCH_CORPUS", REPO.parent / "shared/corpus/vision-analysis")) / "submissions"
    (path,) = sorted(corpus.glob("yolox-s__onnx__cuda__jetson_orin__*.json"))[:1]
    doc = json.loads(path.read_text())
    (tmp_path / "run" / "submissions").mkdir(parents=True)
    shutil.copy(path, tmp_path / "run" / "submissions" / path.name)
    run = load_run(tmp_path / "run")
    table = performance_table(run)
    (row,) = table.rows
    col = {h: i for i, h in enumerate(table.header)}
    assert float(row[col["img/s"]]) == pytest.approx(doc["throughput"]["fps_mean"], abs=0.005 + 1e-9)
    assert float(row[col["p50 ms/img"]]) == pytest.approx(doc["timing"]["total_ms"]["p50"], abs=0.005 + 1e-9)
    assert not any("None" in line for line in notes(run))
    dataset = next(r for r in setup_table(run).rows if r[0] == "Dataset")
    assert "variant mini500 (500 images)" in dataset[1]


def test_accuracy_table_says_what_each_cell_scored(run_a, tmp_path):
    """A segmentation cell's plain metrics are of its masks, its box mAP beside them; a detection cell's of boxes."""
    from harness.report.sections import accuracy_table

    run = _copy(run_a, tmp_path)
    path = sorted((run / "submissions").glob("*.json"))[0]
    doc = json.loads(path.read_text())
    doc["model"]["task"], doc["accuracy"]["bbox_mAP_50_95"] = "segment", 0.5
    path.write_text(json.dumps(doc))
    table = accuracy_table(load_run(run))
    col = {h: i for i, h in enumerate(table.header)}
    assert sorted(row[col["scored"]] for row in table.rows) == ["boxes", "masks"]
    masks = next(row for row in table.rows if row[col["scored"]] == "masks")
    assert masks[col["bbox_mAP_50_95"]] == "0.5000"


def test_a_failing_int8_row_is_marked_in_the_report_as_in_the_runs_summary(run_a, tmp_path):
    """An int8 row keeping < 99 % of its fp32 mAP was marked by the run's summary (and made it exit 1), but the
    report showed its mAP plainly and said nothing."""
    from harness.report.sections import accuracy_table, notes

    run = _copy(run_a, tmp_path)
    path = sorted((run / "submissions").glob("*.json"))[0]
    doc = json.loads(path.read_text())
    why = "int8 keeps 36.7% of the fp32 mAP (0.1192 vs 0.3245); below 99 %: this row is marked failing"
    doc["eval"]["int8_vs_fp32"] = {"passed": False, "kept": 0.367, "failing": why}
    path.write_text(json.dumps(doc))
    folder = load_run(run)
    table = accuracy_table(folder)
    shown = sorted(row[table.header.index("mAP_50_95")] for row in table.rows)
    assert [m.endswith("!") for m in shown].count(True) == 1 and f"{doc['accuracy']['mAP_50_95']:.4f}!" in shown
    assert len([n for n in notes(folder) if why in n]) == 1
    done = va_bench("report", str(run))
    assert done.returncode == 0, done.stderr
    assert why in (run / "report.html").read_text()


def test_per_category_ap_is_in_the_report_as_the_run_wrote_it(run_a, tmp_path):
    from harness.report.sections import per_class_table

    label, table = per_class_table(load_run(run_a))
    sub = next(s for s in _submissions(run_a) if label.endswith(f"b{s['config']['batch_size']}"))
    written = json.loads((run_a / sub["eval"]["per_class"]).read_text())["categories"]
    assert [row[0] for row in table.rows] == [str(c["id"]) for c in written] and len(table.rows) == 80
    for row, c in zip(table.rows, written, strict=True):
        assert row[2] == ("-" if c["AP"] is None else f"{c['AP']:.4f}")
        assert row[4:7] == ["-" if c[k] is None else f"{c[k]:.4f}" for k in ("precision", "recall", "F1")]
    assert any(row[6] != "-" for row in table.rows)
    html = make_report(_copy(run_a, tmp_path)).html.read_text()
    assert "per-category AP, and P/R/F1 at the operating point, of" in html


def test_operating_points_and_curves_are_the_runs_own(run_a, tmp_path):
    """The operating-point table is each submission's eval.operating_point; the precision-recall plot draws the
    per_class files' curves and points, once per distinct detections file, under Accuracy."""
    from harness.report.plots import confidence_curves, precision_recall
    from harness.report.sections import operating_point_table

    run = load_run(run_a)
    table = operating_point_table(run)
    col = {h: i for i, h in enumerate(table.header)}
    subs = _submissions(run_a)
    assert len(table.rows) == len(subs)
    for row in table.rows:
        sub = next(s for s in subs if str(s["config"]["batch_size"]) == row[col["batch"]])
        point = sub["eval"]["operating_point"]
        assert 0 < point["confidence"] < 1 and point["classes"] > 0
        assert [row[col[k]] for k in ("confidence", "P", "R", "F1")] == \
            [f"{point[k]:.4f}" for k in ("confidence", "precision", "recall", "F1")]
    plot = precision_recall(run)
    assert plot.png.startswith(PNG_SIGNATURE)
    assert len(plot.data) == len({s["eval"]["detections_sha256"] for s in subs})
    for label, data in plot.data.items():
        sub = next(s for s in subs if label.endswith(f"b{s['config']['batch_size']}"))
        written = json.loads((run_a / sub["eval"]["per_class"]).read_text())
        assert data["0.50"] == written["pr_curve"]["precision"]["0.50"]
        assert data["point"] == (written["operating_point"]["recall"], written["operating_point"]["precision"])
        drawn = confidence_curves(run).data[label]
        assert drawn["F1"] == written["confidence_curve"]["F1"] and len(drawn["confidence"]) == 101
        assert drawn["point"] == (written["operating_point"]["confidence"], written["operating_point"]["F1"])
    html = make_report(_copy(run_a, tmp_path)).html.read_text()
    accuracy = html.split("<h2 id='accuracy'>", 1)[1].split("<h2 id='gates'>", 1)[0]
    assert "<h3>Operating point</h3>" in accuracy and "Precision-recall" in accuracy
    assert "Precision, recall and F1 against confidence" in accuracy


def _artefact_list(html: str) -> list[str]:
    return re.findall(r"<li><a href='[^']*'>([^<]*)</a> <span class='note'>([^<]*)</span></li>",
                      html.split("<h2 id='artefacts'>", 1)[1])


def test_a_report_made_again_lists_the_same_files(run_a, tmp_path):
    run = _copy(run_a, tmp_path)
    first = _artefact_list(make_report(run).html.read_text())
    second = _artefact_list(make_report(run).html.read_text())
    assert first == second
    names = [name for name, _ in first]
    assert names.count("report.html") == 1 and dict(first)["report.html"] == "this page"
    # every listed file is in the folder now, and every file of the folder is listed, at its size
    on_disk = sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.is_file() and not p.name.startswith("."))
    assert sorted(names) == on_disk
    for png in EXPECTED_PNGS:
        assert dict(first)[png] == human_size((run / png).stat().st_size)


def test_cells_made_under_another_build_are_credited_to_it(run_a, tmp_path):
    """A run resumed with --force under another commit and hardware id: the report and the log name both, with
    the cells each made, and the differences the resume accepted."""
    run = _copy(run_a, tmp_path)
    path = sorted((run / "submissions").glob("*.json"))[-1]
    sub = json.loads(path.read_text())
    sub["repro"].update(harness_commit="f" * 40, harness_dirty=False)
    sub["hardware"]["id"] = "another_box"
    path.write_text(json.dumps(sub))
    doc = json.loads((run / "run.json").read_text())
    doc["resumed"] = [{"at": "2026-11-29T00:00:00Z", "forced_differences": ["harness commit a -> f"]}]
    (run / "run.json").write_text(json.dumps(doc))
    log = tmp_path / "log.md"
    html = make_report(run, log_path=log).html.read_text()
    first = _submissions(run)[0]
    own = first["repro"]["harness_commit"][:12] + (" (dirty)" if first["repro"]["harness_dirty"] else "")
    for text in (html, log.read_text()):
        assert f"{own} (1 cell)" in text and "ffffffffffff (1 cell)" in text
        assert "with --force despite: harness commit a -&gt; f" in text or "despite: harness commit a -> f" in text
    assert f"{first['hardware']['id']}:" in html and "other cells under another_box (1 cell)" in html
    assert "Its cells were made at harness commits" in log.read_text()


def test_gates_come_only_from_the_file_the_user_names(run_b, tmp_path):
    run = _copy(run_b, tmp_path)
    assert make_report(run).gates is None  # the shipped example (one box's targets) is no default
    refused = va_bench("report", str(run), "--fail-on-gates")
    assert refused.returncode == 2 and "--fail-on-gates needs --gates PATH" in refused.stderr


def test_run_without_layers_or_memory_still_reports(run_b, tmp_path):
    run = _copy(run_b, tmp_path)
    outcome = make_report(run)
    plots = {p.name: p for p in outcome.plots}
    assert plots["latency_throughput.png"].png is not None and plots["stages.png"].png is not None
    assert "--layers" in plots["layer_types.png"].unavailable and "--memory" in plots["memory.png"].unavailable
    html = outcome.html.read_text()
    assert "no layer pass in this run" in html and "memory.csv absent" in html
    assert not (run / "layer_types.png").exists()


def test_names_from_the_files_are_text_in_the_log(run_a, run_b, tmp_path):
    """A model id with HTML, a newline and a forged section marker: one line of text in the log, and the forged
    marker does not make the run it names "already logged"."""
    a, b = _copy(run_a, tmp_path), _copy(run_b, tmp_path)
    evil = "<script>alert(1)</script>\n<!-- va-bench run report-a -->|x"
    for path in (b / "submissions").glob("*.json"):
        doc = json.loads(path.read_text())
        doc["model"]["id"] = evil
        path.write_text(json.dumps(doc))
    log = tmp_path / "BENCHMARKS.md"
    make_report(b, log_path=log)
    text = log.read_text()
    assert "<script>" not in text and "&lt;script>" in text and "&gt;" not in text  # `>` opens nothing: kept
    assert not re.search(r"^<!-- va-bench run report-a -->", text, flags=re.M)
    make_report(a, log_path=log)  # not refused as a duplicate
    assert re.search(r"^<!-- va-bench run report-a cells [0-9a-f]{12} -->$", log.read_text(), flags=re.M)


def test_log_appends_and_never_rewrites(run_a, run_b, tmp_path):
    a, b = _copy(run_a, tmp_path), _copy(run_b, tmp_path)
    log = tmp_path / "BENCHMARKS.md"
    make_report(a, log_path=log)
    first = log.read_bytes()
    make_report(b, log_path=log)
    second = log.read_bytes()
    assert second.startswith(first) and len(second) > len(first)  # the first section is byte-identical
    text = second.decode()
    sections = re.split(r"^<!-- va-bench run ", text, flags=re.M)[1:]
    assert [s.split(" ", 1)[0] for s in sections] == ["report-a", "report-b"]
    for section, run in zip(sections, (a, b), strict=True):
        for heading in ("### Setup", "### Accuracy", "### Performance", "### Gates", "### Notes", "### Reproduce",
                        "### Artefacts"):
            assert heading in section
        sub = _submissions(run)[0]
        assert re.search(r"^## \d{4}-\d{2}-\d{2} — run ", section, flags=re.M)
        assert sub["repro"]["command"] in section
        assert f"{sub['accuracy']['mAP_50_95']:.4f}" in section
        assert "`report.html`" in section and "`run.json`" in section
    # the same run twice: refused before anything is written
    with pytest.raises(UsageError, match="already has a section"):
        make_report(a, log_path=log)
    assert log.read_bytes() == second


def test_failing_gate_shows_not_met_and_fails_only_when_asked(run_a, tmp_path):
    run = _copy(run_a, tmp_path)
    sub = _submissions(run)[0]
    gates = tmp_path / "gates.yaml"
    gates.write_text("gates:\n"
                     "  - {name: impossible speed, metric: images_per_s, comparison: '>=', target: 1000000,\n"
                     "     cell: {backend: onnxruntime, batch_size: 1}}\n"
                     "  - {metric: mAP_50_95, comparison: '>=', target: 0.0, cell: {model: yolox-nano}}\n"
                     "  - {metric: joules_per_image, comparison: '<=', target: 1.0}\n"
                     "  - {metric: images_per_s, comparison: '>', target: 1, cell: {batch_size: 64}}\n")
    log = tmp_path / "log.md"
    outcome = make_report(run, gates_path=gates, log_path=log)
    statuses = [(r.gate.metric, r.status) for r in outcome.gates]
    assert ("images_per_s", "NOT MET") in statuses and ("mAP_50_95", "met") in statuses
    assert statuses[-1] == ("images_per_s", "not measured")  # batch 64 is not in the run
    text = log.read_text()
    ips = sub["throughput"]["images_per_s"] if sub["config"]["batch_size"] == 1 else None
    row = next(line for line in text.splitlines() if line.startswith("| impossible speed"))
    assert row.endswith("| **NOT MET** |") and "≥ 1000000.00 img/s" in row
    if ips is not None:
        assert f"{ips:.2f} img/s" in row
    if sub["energy"].get("status") != "ok":
        assert "not measured (" in next(line for line in text.splitlines() if line.startswith("| joules_per_image"))
    # exit codes: 0 without --fail-on-gates, 1 with it; 2 for a broken gates file
    assert va_bench("report", str(run), "--gates", str(gates)).returncode == 0
    failing = va_bench("report", str(run), "--gates", str(gates), "--fail-on-gates")
    assert failing.returncode == 1 and "NOT MET" in failing.stdout
    # a script reads every gate's result, not only the exit code (report had no --json)
    scripted = va_bench("report", str(run), "--gates", str(gates), "--fail-on-gates", "--json")
    assert scripted.returncode == 1
    doc = json.loads(scripted.stdout)
    assert [(g["metric"], g["status"]) for g in doc["gates"]] == statuses
    impossible = next(g for g in doc["gates"] if g["gate"] == "impossible speed (images_per_s)")
    assert impossible["target"] == 1000000 and impossible["comparison"] == ">="
    if ips is not None:
        assert impossible["today"] == ips
    assert doc["gates"][-1]["reason"] == "no such cell in this run"
    assert set(doc["gates_failing"]) == {"impossible speed (images_per_s)", "images_per_s"}
    assert doc["report"].endswith("report.html") and doc["log"] is None and doc["run_id"] == run.name
    # a gate that selects no cell checked nothing: it fails too (a misspelt selector passed every run); `onnx` is
    # run's own name for onnxruntime, and selects its cells
    only = tmp_path / "only.yaml"
    for selector, code in (("{batch_size: 64}", 1), ("{precision: FP32}", 1), ("{backend: onnx}", 0)):
        only.write_text(f"gates:\n  - {{metric: mAP_50_95, comparison: '>=', target: 0.0, cell: {selector}}}\n")
        assert va_bench("report", str(run), "--gates", str(only), "--fail-on-gates").returncode == code, selector


@pytest.mark.parametrize("content, expect", [
    ("gates: [a, b\n", "not valid YAML"),
    ("gates: []\n", "lists no gate"),
    ("- metric: mAP_50_95\n", "expected a mapping"),
    ("gates:\n  - {metric: mAP, comparison: '>=', target: 0.2}\n", "unknown metric 'mAP'"),
    ("gates:\n  - {metric: mAP_50_95, comparison: '=>', target: 0.2}\n", "gates[0].comparison"),
    ("gates:\n  - {metric: mAP_50_95, comparison: '>=', target: '0.2'}\n", "gates[0].target"),
    ("gates:\n  - {metric: mAP_50_95, comparison: '>=', target: .nan}\n", "gates[0].target"),
    ("gates:\n  - {metric: mAP_50_95, comparison: '>=', target: 0.2, cell: {batch: 1}}\n", "gates[0].cell.batch"),
    ("gates:\n  - !!python/object/apply:os.system ['true']\n", "not valid YAML"),
])
def test_bad_gates_file_is_one_line_and_nothing_written(run_b, tmp_path, content, expect):
    run = _copy(run_b, tmp_path)
    gates = tmp_path / "bad gates.yaml"
    gates.write_text(content)
    with pytest.raises(UsageError) as err:
        make_report(run, gates_path=gates, log_path=tmp_path / "log.md")
    message = str(err.value)
    assert "\n" not in message and expect in message and str(gates) in message
    assert not (run / "report.html").exists() and not list(run.glob("*.png"))
    assert not (tmp_path / "log.md").exists()


def test_bad_gates_file_exits_2_with_one_line(run_b, tmp_path):
    gates = tmp_path / "gates.yaml"
    gates.write_text("gates:\n  - {metric: mAP_50_95, comparison: '=>', target: 0.2}\n")
    result = va_bench("report", str(run_b), "--gates", str(gates))
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2 and len(lines) == 1 and "gates[0].comparison" in lines[0], result.stderr


def test_bad_run_folder_is_one_line_exit_2(tmp_path, run_b):
    empty = tmp_path / "empty"
    empty.mkdir()
    for target, expect in ((tmp_path / "missing", "missing: no such folder"), (empty, "no submissions")):
        result = va_bench("report", str(target))
        assert result.returncode == 2 and expect in result.stderr and "Traceback" not in result.stderr
    broken = _copy(run_b, tmp_path)
    next((broken / "submissions").glob("*.json")).write_text("{not json")
    with pytest.raises(UsageError, match="not valid JSON"):
        make_report(broken)
    assert not (broken / "report.html").exists()
    # values the report cannot draw (a batch size of 0): one line, and no plot written before the refusal
    odd = _copy(run_b, tmp_path / "odd")
    path = next((odd / "submissions").glob("*.json"))
    doc = json.loads(path.read_text())
    doc["config"]["batch_size"] = doc["timing"]["batch_size"] = 0
    path.write_text(json.dumps(doc))
    with pytest.raises(UsageError, match="values the report cannot read .*va-bench validate"):
        make_report(odd)
    assert not list(odd.glob("*.png")) and not (odd / "report.html").exists()
    fifo = tmp_path / "log.fifo"
    os.mkfifo(fifo)
    result = va_bench("report", str(run_b), "--log", str(fifo))  # appending would block forever
    assert result.returncode == 2 and "is not a regular file" in result.stderr, result.stderr


def test_default_gates_file_is_valid():
    gates = load_gates(EXAMPLE_GATES)
    assert gates and all(g.metric and g.comparison for g in gates)


def test_report_is_torch_free(run_b, tmp_path):
    """results/, report/ work on records: reporting a run must not import torch or the pipeline."""
    run = _copy(run_b, tmp_path)
    code = ("import sys; from pathlib import Path; from harness.report.run_report import make_report; "
            f"make_report(Path({str(run)!r})); "
            "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'torchvision') "
            "or m.startswith(('harness.pipeline', 'harness.run', 'harness.models'))); print(bad)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


CHROMIUM = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install -y chromium)")
def test_report_opens_in_headless_chromium(run_a, tmp_path):
    run = _copy(run_a, tmp_path)
    make_report(run)
    shot = tmp_path / "out.png"
    with tempfile.TemporaryDirectory() as profile:
        result = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             "--disable-component-update", "--no-first-run", "--disable-sync", f"--user-data-dir={profile}",
             "--enable-logging=stderr", "--v=0", "--window-size=1300,2400", f"--screenshot={shot}",
             (run / "report.html").resolve().as_uri()],
            capture_output=True, text=True, timeout=120, env={**os.environ, "HOME": profile})
    assert result.returncode == 0, result.stderr[-2000:]
    # page errors (a blocked resource, a script error) are logged as CONSOLE lines; the page has none
    console = [line for line in result.stderr.splitlines() if ":CONSOLE" in line]
    assert not console, console
    data = shot.read_bytes()
    assert data.startswith(PNG_SIGNATURE)
    from matplotlib.image import imread

    pixels = imread(shot)
    assert pixels.shape[0] == 2400 and np.std(pixels[..., :3]) > 0.05  # rendered content, not a blank page
    if os.environ.get("VA_BENCH_KEEP_SCREENSHOT"):
        shutil.copy(shot, os.environ["VA_BENCH_KEEP_SCREENSHOT"])


def test_a_gate_missed_by_less_than_its_shown_digits_shows_enough_of_them():
    # 84.218 against >= 84.22 is NOT MET: "today 84.22" would read as the target itself
    from harness.report.gates import Gate, GateResult

    gate = Gate(metric="images_per_s", comparison=">=", target=84.22)
    assert GateResult(gate, "cell", 84.218, "NOT_MET").today_text() == "84.218 img/s"
    assert GateResult(gate, "cell", 91.5, "MET").today_text() == "91.50 img/s"


def test_the_stage_split_counts_the_transfer_with_the_forward():
    """An accelerator's cell: 10 % of the batch is the input's transfer, which the summary and inference_ms count
    with the forward."""
    from harness.report.sections import _split

    figures = {"timing.batch_ms.mean": 100.0, "timing.stages_ms.preprocess.mean": 20.0,
               "timing.stages_ms.transfer.mean": 10.0, "timing.stages_ms.forward.mean": 60.0,
               "timing.stages_ms.postprocess.mean": 10.0}

    class Cell:
        def get(self, key):
            return figures.get(key)

    assert _split(Cell()) == "pre 20% / fwd 70% / post 10%"


def test_the_report_embeds_only_images_the_run_drew(run_b, tmp_path):
    """A link in images/ could name any file (the report would carry it inside report.html); a file whose bytes are
    not the image its name says is not embedded either."""
    run = _copy(run_b, tmp_path)
    images = run / "images"
    images.mkdir(exist_ok=True)
    secret = tmp_path / "secret.txt"
    secret.write_bytes(b"\xff\xd8\xff SECRET-TOKEN")
    (images / "m__link.jpg").symlink_to(secret)
    (images / "m__text.png").write_bytes(b"SECRET-TOKEN, not a PNG")
    html = make_report(run).html.read_text()
    assert base64.b64encode(secret.read_bytes()).decode()[:16] not in html
    assert "alt='m__link.jpg'" not in html and "alt='m__text.png'" not in html  # (the file list names them)


def test_a_name_with_dollar_signs_is_plotted_as_written(run_b, tmp_path):
    """matplotlib reads $...$ in a label as TeX; a model's name is a name ("cost$\\bad$" made the report fail)."""
    run = _copy(run_b, tmp_path)
    for path in (run / "submissions").glob("*.json"):
        doc = json.loads(path.read_text())
        doc["model"]["id"] = "cost$\\bad$"
        path.write_text(json.dumps(doc))
    outcome = make_report(run)
    assert "cost$\\bad$" in outcome.html.read_text()


def test_two_reports_at_once_log_a_run_once_and_a_full_disk_leaves_the_log_as_it_was(tmp_path, monkeypatch):
    import errno
    import threading

    from harness.files import DiskFullError
    from harness.report.log import append_section

    log = tmp_path / "BENCHMARKS.md"
    start, outcomes = threading.Barrier(4), []

    def report():
        start.wait()
        try:
            append_section(log, "<!-- va-bench run r1 -->\n## section\n", "r1", "s1")
            outcomes.append("written")
        except UsageError as exc:
            outcomes.append(str(exc))

    threads = [threading.Thread(target=report) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert outcomes.count("written") == 1 and all("already has a section" in o for o in outcomes if o != "written")
    assert log.read_text().count("<!-- va-bench run r1 -->") == 1
    before = log.read_bytes()
    real_write = os.write

    def full(fd, data):  # half the section, then the disk is full
        if len(data) > 20:
            real_write(fd, data[:len(data) // 2])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(DiskFullError, match="the log is as it was"):
        append_section(log, "<!-- va-bench run r2 -->\n## a longer section than twenty bytes\n", "r2", "s2")
    monkeypatch.undo()
    assert log.read_bytes() == before
    append_section(log, "<!-- va-bench run r2 -->\n## a longer section than twenty bytes\n", "r2", "s2")  # a retry
    assert log.read_text().count("<!-- va-bench run r2 -->") == 1


def test_repeats_are_in_the_page_and_the_log(run_b, tmp_path):
    """--repeats: each process's median, their median and spread are in report.html and the benchmark log (they were
    only in the run's summary and the submission); one process left gives the reason, not a spread of 0."""
    run = _copy(run_b, tmp_path)
    (path,) = sorted((run / "submissions").glob("*.json"))
    doc = json.loads(path.read_text())
    doc["timing"]["repeats"] = {"processes": 3, "requested": 3, "batch_ms_p50": [41.5, 44.25, 40.0],
                                "median_of_processes_ms": 41.5, "spread_pct": 10.241, "note": "x"}
    path.write_text(json.dumps(doc))
    log = tmp_path / "BENCHMARKS.md"
    assert va_bench("report", str(run), "--log", str(log)).returncode == 0
    row = "| 41.50 / 44.25 / 40.00 | 41.50 | 10.2 % |"
    assert row in log.read_text() and "3 of 3" in log.read_text()
    page = (run / "report.html").read_text()
    assert "Repeated in fresh processes (--repeats)" in page and "41.50 / 44.25 / 40.00" in page
    doc["timing"]["repeats"] = {"processes": 1, "requested": 2, "batch_ms_p50": [41.5], "median_of_processes_ms": 41.5,
                                "spread_pct": None, "spread_reason": "one process measured the cell"}
    path.write_text(json.dumps(doc))
    again = tmp_path / "AGAIN.md"  # a log takes a run once
    assert va_bench("report", str(run), "--log", str(again)).returncode == 0
    assert "| 1 of 2 | 41.50 | 41.50 | unavailable: one process measured the cell |" in again.read_text()


def test_a_run_resumed_after_it_was_logged_is_logged_again_once(run_a, tmp_path):
    """A run logged while partial, then resumed: `report --log` was refused ("already has a section") for good,
    so the log kept the partial run and report.html was not made again."""
    run = _copy(run_a, tmp_path)
    doc = json.loads((run / "run.json").read_text())
    full = json.loads(json.dumps(doc))
    last = doc["cells"][-1]
    aside = tmp_path / "aside.json"
    (run / last["submission"]).rename(aside)  # stopped before its last cell
    last.update(status="interrupted", submission=None)
    (run / "run.json").write_text(json.dumps(doc))
    log = tmp_path / "BENCHMARKS.md"
    assert va_bench("report", str(run), "--log", str(log)).returncode == 0
    aside.rename(run / full["cells"][-1]["submission"])  # resumed: the last cell finished
    (run / "run.json").write_text(json.dumps(full))
    again = va_bench("report", str(run), "--log", str(log))
    assert again.returncode == 0, again.stderr
    text = log.read_text()
    assert len(re.findall(r"^<!-- va-bench run report-a cells [0-9a-f]{12} -->$", text, flags=re.M)) == 2
    assert text.count("this section is its state now and supersedes that one") == 1
    refused = va_bench("report", str(run), "--log", str(log))  # unchanged since: once
    assert refused.returncode == 2 and "already has a section" in refused.stderr
    old = tmp_path / "OLD.md"  # a log written before sections recorded their cells' state: any state is logged
    old.write_text("# Benchmark log\n\n<!-- va-bench run report-a -->\n## an earlier section\n")
    refused = va_bench("report", str(run), "--log", str(old))
    assert refused.returncode == 2 and "(written before sections recorded the state of a run's cells)" in refused.stderr


def test_a_gate_on_the_batchs_time_is_named_so_and_its_first_name_still_works(tmp_path):
    """`latency_p50_ms` was the batch's p50 where aggregate's `latency_ms_p50` is an image's: a gate written from
    one read the other, off by the batch size. The batch's figures are batch_*_ms; a file of the first names loads
    and its note says what they are."""
    from harness.report.gates import METRICS

    path = tmp_path / "gates.yaml"
    path.write_text("gates:\n  - {metric: latency_p50_ms, comparison: '<=', target: 30}\n"
                    "  - {metric: latency_p95_ms, comparison: '<=', target: 40, note: the box's}\n")
    first, second = load_gates(path)
    assert (first.metric, second.metric) == ("batch_p50_ms", "batch_p95_ms")
    assert first.note == "this file's latency_p50_ms is the batch's time (ms per batch), named batch_p50_ms now"
    assert second.note == "the box's (this file's latency_p95_ms is the batch's time (ms per batch), named " \
                          "batch_p95_ms now)"
    assert METRICS["batch_p50_ms"][0] == "timing.batch_ms.p50"
    assert METRICS["image_p50_ms"][0] == "timing.per_image_ms.p50"
