"""The report of run folders whose operating points are at their edges: a cell that detected nothing (its point has
no confidence) and a resumed run whose earlier cell's per_class file predates the curves. Each runs in seconds."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import CORPUS, coco_from, requires_corpus

from harness.eval.coco_eval import evaluate_cell_file, operating_point_summary, per_class_document

SHA = "ab" * 32


def _evaluation(tmp_path: Path, detections: list[dict]):
    """A two-image, one-class evaluation of `detections`, as a run scores a cell."""
    dataset = {"images": [{"id": i, "width": 100, "height": 100, "file_name": f"{i}.jpg"} for i in (1, 2)],
               "annotations": [{"id": 1, "image_id": 1, "category_id": 3, "bbox": [10, 10, 20, 20], "area": 400,
                                "iscrowd": 0}],
               "categories": [{"id": 3, "name": "car"}]}
    path = tmp_path / "dets.json"
    path.write_text(json.dumps(detections))
    return evaluate_cell_file(coco_from(dataset), path, [1, 2], "pycocotools", 100)


def _run_folder(tmp_path: Path, cells: list[tuple[int, dict | None, dict]]) -> Path:
    """A run folder of one site submission per (batch size, eval.operating_point, per_class document), every cell
    with the same detections (one sha256)."""
    source = sorted((CORPUS / "submissions").glob("yolox-s__onnx__cuda__jetson_orin__*.json"))[0]
    run = tmp_path / "run"
    (run / "submissions").mkdir(parents=True)
    (run / "per_class").mkdir()
    for batch, point, document in cells:
        doc = json.loads(source.read_text(encoding="utf-8"))
        doc["config"]["batch_size"] = batch
        doc["submission_id"] = f"{doc.get('submission_id')}-b{batch}"
        doc["eval"] = {**doc["eval"], "per_class": f"per_class/b{batch}.json", "detections_sha256": SHA,
                       **({"operating_point": point} if point is not None else {})}
        (run / "per_class" / f"b{batch}.json").write_text(json.dumps(document))
        (run / "submissions" / source.name.replace("__2026", f"__b{batch}__2026")).write_text(json.dumps(doc))
    return run


@requires_corpus
def test_a_cell_that_detected_nothing_does_not_stop_the_report(tmp_path):
    """No detection at all: the point has ground truth to average over but no confidence (null); the confidence plot
    draws the curve without a dot, and the report is made."""
    from harness.report.plots import confidence_curves, precision_recall
    from harness.report.run_report import make_report
    from harness.results.reader import load_run

    evaluation = _evaluation(tmp_path, [])
    point = operating_point_summary(evaluation.primary)
    assert point["confidence"] is None and point["F1"] == 0.0 and point["classes"] == 1
    run = _run_folder(tmp_path, [(1, point, per_class_document(evaluation, {3: "car"}, 100))])
    loaded = load_run(run)
    assert confidence_curves(loaded).png is not None
    assert precision_recall(loaded).png is not None
    assert make_report(run, None, None).html.is_file()


@requires_corpus
def test_curves_of_a_resumed_run_come_from_the_cell_that_has_them(tmp_path):
    """A resumed run: b1 scored before the curves existed (its per_class file holds AP only), b2 after, on the same
    detections. The plots draw b2's curves instead of saying that no cell has any."""
    from harness.report.plots import confidence_curves, precision_recall
    from harness.results.reader import load_run

    evaluation = _evaluation(tmp_path, [{"image_id": 1, "category_id": 3, "bbox": [10, 10, 20, 20], "score": 0.9}])
    new = per_class_document(evaluation, {3: "car"}, 100)
    old = {"eval_max_det": 100, "categories": [{k: c[k] for k in ("id", "name", "AP", "AP50")}
                                               for c in new["categories"]]}
    run = load_run(_run_folder(tmp_path, [(1, None, old), (2, operating_point_summary(evaluation.primary), new)]))
    for plot in (precision_recall(run), confidence_curves(run)):
        assert plot.png is not None, plot.notes
        assert len(plot.data) == 1


def test_a_plot_of_many_cells_draws_ten_and_names_the_rest(monkeypatch):
    """Twelve cells with distinct detections: ten curves drawn (colours would repeat past them), the other two
    named in the caption, every cell's figures still in the plot's data."""
    from harness.report import plots

    curve = {"recall": [0.0, 0.5, 1.0], "0.50": [1.0, 0.5, 0.0], "0.50:0.95": [0.5, 0.2, 0.0], "point": (0.4, 0.6)}
    cells = {f"cell {k}": dict(curve) for k in range(12)}
    drawn = plots._drawn(cells)
    assert [label for label, _ in drawn] == [f"cell {k}" for k in range(10)]
    (note,) = plots._left_out(cells)
    assert "2 more cells" in note and "cell 10, cell 11" in note
    assert plots._left_out(dict(list(cells.items())[:10])) == []
