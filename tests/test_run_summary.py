"""The end-of-run summary reads right: an int8 row that fails its accuracy rule is marked and warned about,
an overlapped group says what its latencies are, and a group without mAP says why."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import COCO_DIR, YOLOX_NANO
from rich.console import Console

from harness.views.tables import group_table, int8_failing, run_warnings


def _record(label, mode="latency", m=0.3034, reference=None, reason=None, iou_types=("bbox",)):
    stat = SimpleNamespace(mean=10.0, p50=10.0, p95=12.0)
    accuracy = None if m is None else SimpleNamespace(stats={"mAP_50_95": m}, reference=reference,
                                                      iou_types=list(iou_types))
    return SimpleNamespace(
        cell=SimpleNamespace(label=label, batch_size=1),
        timing=SimpleNamespace(images_per_s=100.0, batch_ms=stat, stages_ms={"forward": stat}, mode=mode, warnings=[]),
        accuracy=accuracy, accuracy_reason=reason, invariance=None, memory={}, energy={}, runtime={})


def _caption(records) -> str:
    statuses = [SimpleNamespace(cell=r.cell, state="ok") for r in records]
    key = SimpleNamespace(model="m", backend="openvino", precision="int8", label="m openvino int8 416")
    console = Console(width=200, record=True)
    console.print(group_table(key, statuses, {r.cell.label: r for r in records}))
    return " ".join(console.export_text().split())  # the caption wraps at the table's width


def test_a_failing_int8_row_is_marked_and_warned_about():
    failing = {"failing": "int8 keeps 97.0 % of the fp32 mAP (0.3034 vs 0.3128); below 99 %: this row is marked "
                          "failing", "passed": False}
    bad, good = _record("int8 b1", reference=failing), _record("int8 b2", reference={"passed": True})
    assert int8_failing(bad) and not int8_failing(good)
    assert run_warnings([bad, good]) == [f"int8 b1: {failing['failing']}"]
    text = _caption([bad, good])
    assert "0.3034!" in text and "mAP!: int8 keeps < 99 % of fp32's mAP, or was not compared (failing)" in text
    from harness.views.tables import failing_rows

    assert failing_rows([bad, good]) == ["int8 b1"]  # status ok (it ran), its row failing: --json's failing_rows


def test_an_int8_row_whose_fp32_reference_failed_is_failing_not_passed_in_silence():
    """The fp32 reference pass raised (a load that failed, a bug): the row's loss is unknown, so it is marked failing
    (the run exits 1, the summary says why) instead of a verdict of None the summary, exit code and report passed."""
    from harness.run.scoring import CellScorer

    def broken(cell, pipeline):
        raise RuntimeError("the fp32 core could not be loaded")

    judge = SimpleNamespace(fp32_reference=None, _fp32_reference=broken)
    verdict = CellScorer.int8_verdict(judge, None, SimpleNamespace(stats={"mAP_50_95": 0.3}), None)
    assert verdict["status"] == "unavailable" and verdict["passed"] is None
    assert "RuntimeError: the fp32 core could not be loaded" in verdict["failing"]
    record = _record("int8 b1", reference=verdict)
    assert int8_failing(record) and run_warnings([record]) == [f"int8 b1: {verdict['failing']}"]
    from harness.report.sections import _int8_failing

    assert _int8_failing(SimpleNamespace(get=lambda path: verdict)) == verdict["failing"]
    older = {k: v for k, v in verdict.items() if k != "failing"}  # a file written before the run marked it
    assert _int8_failing(SimpleNamespace(get=lambda path: older)) == ("the int8 accuracy rule could not be checked: "
                                                                     + verdict["reason"])


def test_an_int8_verdict_just_below_the_rule_never_reads_as_on_it():
    """0.3606 of 0.3643 keeps 98.98 %: it read "keeps 99.0 % ...; below 99 %"."""
    from harness.run.scoring import CellScorer

    judge = SimpleNamespace(fp32_reference={"mAP_50_95": 0.3643})
    verdict = CellScorer.int8_verdict(judge, None, SimpleNamespace(stats={"mAP_50_95": 0.3606}), None)
    assert verdict["passed"] is False and verdict["kept"] == 0.9898
    assert verdict["failing"].startswith("int8 keeps 98.9% of the fp32 mAP (0.3606 vs 0.3643); below 99 %")


def test_a_segmentation_cells_map_is_said_to_be_of_the_masks():
    assert "mAP: of the masks (--json: bbox_mAP_50_95 for the boxes)" in _caption([_record("b1", iou_types=("segm",
                                                                                                          "bbox"))])
    assert "of the masks" not in _caption([_record("b1")])


def test_overlapped_latency_and_a_missing_map_are_explained():
    text = _caption([_record("b1", mode="overlapped", m=None, reason="random weights: a timing-only run")])
    assert "overlapped: p50/p95 ms per batch from its start to its result, queueing included" in text
    assert "mAP -: random weights: a timing-only run" in text


def test_the_split_adds_up_with_the_transfer_in_the_forward():
    from harness.views.tables import stage_split

    record = _record("b1")
    ms = lambda v: SimpleNamespace(mean=v)  # noqa: E731
    record.timing.batch_ms = SimpleNamespace(mean=10.0)
    record.timing.stages_ms = {"preprocess": ms(1.0), "transfer": ms(2.0), "forward": ms(5.0), "postprocess": ms(2.0)}
    assert stage_split(record) == "10/70/20"


def test_an_overlapped_streams_fill_is_no_variation():
    """A steady stream (one worker: the first batch has no queue ahead of it) is not warned of; a stream that
    does vary still is."""
    from harness.run.executor import stream_warnings

    steady = [58.98, 102.06, 101.05, 100.95, 101.2, 100.8, 101.4, 100.9, 101.1, 102.24]  # a real one: CV 13.8 % whole
    assert stream_warnings(steady, depth=2) == []
    varying = steady[:2] + [60.0, 140.0] * 4
    assert any(w.startswith("high variation") for w in stream_warnings(varying, depth=2))
    assert stream_warnings(steady[:3], depth=2)[0].startswith("only 3 samples")


def test_the_sites_split_of_total_ms_by_hand():
    """timing.total_ms's split per image, batch 4. Latency mode: each stage's mean / 4, the input's transfer counted
    in inference_ms. Overlapped mode (an 8 ms interval per image): inference as in latency mode (over the forwards
    in flight), the rest of the interval shared 3:1 as the measured pre- and post-processing times are."""
    from harness.results.submission import site_split

    def record(mode, interval=None, in_flight=None, concurrent=None, **stages):
        timing = SimpleNamespace(mode=mode, image_ms=SimpleNamespace(mean=interval),
                                 stages_ms={k: SimpleNamespace(mean=v) for k, v in stages.items()})
        host = {"forwards_in_flight": in_flight} | ({} if concurrent is None else {"forwards_concurrent": concurrent})
        return SimpleNamespace(cell=SimpleNamespace(batch_size=4), runtime={"host": host}, timing=timing)

    per_batch = {"preprocess": 12.0, "transfer": 4.0, "forward": 20.0, "postprocess": 4.0}
    assert site_split(record("latency", 10.0, **per_batch)) == {"preprocess_ms": 3.0, "inference_ms": 6.0,
                                                                "postprocess_ms": 1.0}
    assert site_split(record("overlapped", 8.0, **per_batch)) == {"preprocess_ms": 1.5, "inference_ms": 6.0,
                                                                  "postprocess_ms": 0.5}  # host: 8 - 6 = 2 ms
    assert site_split(record("overlapped", 8.0, in_flight=2, **per_batch)) == {
        "preprocess_ms": 3.75, "inference_ms": 3.0, "postprocess_ms": 1.25}  # host: 8 - 6 / 2 = 5 ms
    # two in flight, one running at a time (the forward in a process of its own): the forward's whole time
    assert site_split(record("overlapped", 8.0, in_flight=2, concurrent=1, **per_batch)) == {
        "preprocess_ms": 1.5, "inference_ms": 6.0, "postprocess_ms": 0.5}
    no_transfer = {k: v for k, v in per_batch.items() if k != "transfer"}
    assert site_split(record("latency", 9.0, **no_transfer))["inference_ms"] == 5.0


def _run_figures_truth(run_dir):
    """Each cell's figures from outside the harness's summary code: numpy on the submission's own batch samples, and
    pycocotools' COCOeval (its summarize()) on the cell's detections file over the run's images (their id list
    checked against the submission's image_id_sha256 by hashlib)."""
    import contextlib
    import hashlib
    import io
    import json

    import numpy as np
    from conftest import SUBSET_ANNOTATIONS
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    from harness.data.coco import CocoDataset

    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(str(SUBSET_ANNOTATIONS))
    truth = {}
    for path in sorted((run_dir / "submissions").glob("*.json")):
        doc = json.loads(path.read_text())
        size = doc["timing"]["batch_size"]
        ids = sorted(CocoDataset(SUBSET_ANNOTATIONS.parents[1]).variant("sample", doc["dataset"]["num_images"])
                     .image_ids)
        assert hashlib.sha256("\n".join(map(str, ids)).encode()).hexdigest() == doc["dataset"]["image_id_sha256"]
        with contextlib.redirect_stdout(io.StringIO()):
            ev = COCOeval(gt, gt.loadRes(str(run_dir / doc["eval"]["detections"])), "bbox")
            ev.params.imgIds = ids
            ev.evaluate(), ev.accumulate(), ev.summarize()
        samples = np.asarray(doc["timing"]["batch_samples_ms"])
        truth[size] = {"images_per_s": size * 1000 / samples.mean(), "p50": np.percentile(samples, 50),
                       "p95": np.percentile(samples, 95), "mean": samples.mean(),
                       "image_p50": np.median(samples / size), "mAP": float(ev.stats[0]), "doc": doc}
    return truth


_SUMMARY_RUN = ("run", "--model", "yolox-nano", "--backend", "onnxruntime", "--limit", "8", "--batch-sizes", "1",
                "2", "--warmup-batches", "1", "--warmup-seconds", "0", "--min-timed-batches", "6", "--no-energy",
                "--no-layers", "--no-profile", "--draw-images", "0")


@pytest.mark.skipif(not (COCO_DIR.is_dir() and YOLOX_NANO.is_file()), reason="offline assets missing")
def test_the_end_of_run_table_shows_each_cells_measured_figures(tmp_path):
    """The table a person reads at the end of `va-bench run` (one row per batch size): img/s, p50/p95 ms per batch,
    mAP and peak RAM equal numpy's figures of the submission's own batch samples and pycocotools' mAP on the cell's
    detections file, to the digits shown."""
    from conftest import run_in_process

    done = run_in_process(*_SUMMARY_RUN, "--coco-dir", str(COCO_DIR), "--output-dir", str(tmp_path),
                          "--run-id", "table", env={"COLUMNS": "200"})
    assert done.returncode == 0, done.stderr
    truth = _run_figures_truth(tmp_path / "table")
    header = ["batch", "status", "img/s", "p50 ms", "p95 ms", "split %", "mAP", "b-inv", "RAM MB"]
    lines = done.stdout.splitlines()
    assert any(line.split()[:3] == ["batch", "status", "img/s"] for line in lines if line.strip()), done.stdout
    rows = {int(cells[0]): dict(zip(header, cells, strict=True)) for cells in map(str.split, lines)
            if len(cells) == len(header) and cells[0].isdigit() and cells[1] == "ok"}
    assert set(rows) == {1, 2}, done.stdout
    for size, row in rows.items():
        t = truth[size]
        assert float(row["img/s"]) == pytest.approx(t["images_per_s"], abs=0.05 + 1e-3), (size, row)
        assert float(row["p50 ms"]) == pytest.approx(t["p50"], abs=0.005 + 2e-4), (size, row)
        assert float(row["p95 ms"]) == pytest.approx(t["p95"], abs=0.005 + 2e-4), (size, row)
        assert float(row["mAP"]) == pytest.approx(t["mAP"], abs=5e-5 + 1e-12), (size, row)
        assert float(row["RAM MB"]) == pytest.approx(t["doc"]["memory"]["peak_ram_mb"], abs=0.5 + 1e-9)
    assert rows[1]["b-inv"] == "ref"


@pytest.mark.skipif(not (COCO_DIR.is_dir() and YOLOX_NANO.is_file()), reason="offline assets missing")
def test_the_run_json_summary_gives_each_cells_measured_figures(tmp_path):
    """`va-bench run --json` (what scripts read): each cell's images/s, batch latency, per-image p50, stage means and
    mAP equal numpy's figures of the submission's own batch samples and pycocotools' mAP on its detections file."""
    import json

    from conftest import run_in_process

    done = run_in_process(*_SUMMARY_RUN, "--coco-dir", str(COCO_DIR), "--output-dir", str(tmp_path),
                          "--run-id", "json", "--json")
    assert done.returncode == 0, done.stderr
    truth = _run_figures_truth(tmp_path / "json")
    cells = {c["batch_size"]: c for c in json.loads(done.stdout)["cells"]}
    assert set(cells) == {1, 2}
    for size, cell in cells.items():
        t = truth[size]
        assert cell["status"] == "ok"
        assert cell["images_per_s"] == pytest.approx(t["images_per_s"], rel=1e-5, abs=1e-3), size
        assert cell["batch_ms"]["p50"] == pytest.approx(t["p50"], abs=2e-4), size
        assert cell["batch_ms"]["p95"] == pytest.approx(t["p95"], abs=2e-4), size
        assert cell["batch_ms"]["mean"] == pytest.approx(t["mean"], abs=2e-4), size
        assert cell["batch_ms"]["count"] == len(t["doc"]["timing"]["batch_samples_ms"])
        assert cell["image_ms_p50"] == pytest.approx(t["image_p50"], abs=2e-4), size
        assert cell["mAP_50_95"] == pytest.approx(t["mAP"], abs=1e-12), size
        assert cell["scored"] == "boxes" and "bbox_mAP_50_95" not in cell
        stages = t["doc"]["timing"]["stages_ms"]
        assert cell["stages_ms_mean"] == pytest.approx({k: v["mean"] for k, v in stages.items()}, abs=2e-4), size
        assert cell["memory"] == t["doc"]["memory"]


def test_the_json_summary_says_what_a_cells_map_scored():
    """A segmentation cell's mAP_50_95 is of its masks: `--json` says so and gives the boxes' beside it."""
    from harness.views.tables import summary_json

    stat = SimpleNamespace(mean=10.0, p50=10.0, p95=12.0, to_dict=lambda: {"p50": 10.0})
    records = []
    for label, iou_types, stats in (("seg b1", ["segm", "bbox"], {"mAP_50_95": 0.25, "bbox_mAP_50_95": 0.31}),
                                    ("det b1", ["bbox"], {"mAP_50_95": 0.3})):
        records.append(SimpleNamespace(
            cell=SimpleNamespace(label=label), runtime={}, invariance=None, memory={}, energy={}, layers=None,
            profiler=None, server=None,
            timing=SimpleNamespace(mode="latency", images_per_s=100.0, batch_ms=stat, image_ms=stat,
                                   stages_ms={}, warnings=[]),
            accuracy=SimpleNamespace(stats=stats, iou_types=iou_types, map_interval=None, reference=None)))
    status = SimpleNamespace(submission=None, to_dict=lambda: {})
    outcome = SimpleNamespace(records=records, state=SimpleNamespace(
        run_id="r", cells={"seg b1": status, "det b1": status}, counts=lambda: {}))
    seg, det = summary_json(Path("r"), outcome)["cells"]
    assert (seg["scored"], seg["mAP_50_95"], seg["bbox_mAP_50_95"]) == ("masks", 0.25, 0.31)
    assert (det["scored"], det["mAP_50_95"]) == ("boxes", 0.3) and "bbox_mAP_50_95" not in det
