"""Instance segmentation around the pipeline: the refusals a plan makes, the mask-IoU detection diff, drawn
masks, the segmentation board of `aggregate` and `compare` on segmentation files (the mask work itself is
checked against libreyolo in test_libreyolo_families.py and against numpy in test_ultralytics_onnx.py)."""

from __future__ import annotations

import json
import shutil

import cv2
import numpy as np
import pytest
from conftest import COCO_DIR, CORPUS, requires_coco, requires_corpus
from pycocotools import mask as mask_utils

from harness.config import RunConfig
from harness.errors import UsageError
from harness.eval.detection_diff import diff_detections, parse_coco_detections
from harness.records import ImageDetections
from harness.run.plan import check_runtimes


def _rle(mask: np.ndarray) -> dict:
    rle = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
    rle["counts"] = rle["counts"].decode("ascii")
    return rle


@pytest.mark.parametrize("backend", ["openvino", "tflite", "ncnn", "torchscript"])
def test_a_segmentation_model_on_another_runtime_is_refused_before_anything_loads(backend):
    config = RunConfig(models=["rfdetr-seg-n"], backends=[backend])
    with pytest.raises(UsageError, match="segmentation model: its masks run on onnxruntime and pytorch, not "
                                         f"{backend}.*--no-masks"):
        check_runtimes(config)
    check_runtimes(RunConfig(models=["rfdetr-seg-n"], backends=[backend], masks=False))  # boxes only: allowed
    check_runtimes(RunConfig(models=["yolov8n-seg"], backends=["onnxruntime"]))


def test_the_detection_diff_pairs_masks_by_mask_iou():
    """Two sets with the same boxes: identical masks pair at mask IoU 0.9; masks shifted by a third of their width
    do not (box IoU would have paired them), and without masks on one side the boxes pair."""
    mask = np.zeros((60, 80), np.uint8)
    mask[10:40, 10:40] = 1
    shifted = np.roll(mask, 10, axis=1)
    box = [10.0, 10.0, 30.0, 30.0]

    def results(m):
        return [{"image_id": 1, "category_id": 1, "bbox": box, "score": 0.9, "segmentation": _rle(m)}]

    a = parse_coco_detections(results(mask))
    same = diff_detections(a, parse_coco_detections(results(mask)), iou=0.9)
    moved = diff_detections(a, parse_coco_detections(results(shifted)), iou=0.9)
    boxes_only = diff_detections(a, parse_coco_detections([{k: v for k, v in results(shifted)[0].items()
                                                            if k != "segmentation"}]), iou=0.9)
    assert (same.iou_type, same.matched) == ("segm", 1)
    assert (moved.iou_type, moved.matched) == ("segm", 0)
    assert (boxes_only.iou_type, boxes_only.matched) == ("bbox", 1)


@requires_coco
def test_drawn_images_show_the_masks(tmp_path):
    from harness.report.draw import draw_detections

    path = COCO_DIR / "val2017" / "000000000139.jpg"
    image = cv2.imread(str(path))
    mask = np.zeros(image.shape[:2], np.uint8)
    mask[100:200, 100:300] = 1
    det = ImageDetections(139, np.array([[100.0, 100, 300, 200]]), np.array([0.9]), np.array([0]), [_rle(mask)])
    drawn = cv2.imdecode(np.frombuffer(draw_detections(path, det, ("person",)), np.uint8), cv2.IMREAD_COLOR)
    without = cv2.imdecode(np.frombuffer(draw_detections(path, ImageDetections(139, det.boxes, det.scores, det.labels),
                                                         ("person",)), np.uint8), cv2.IMREAD_COLOR)
    inside = np.abs(drawn[120:180, 120:280].astype(int) - without[120:180, 120:280]).mean()
    outside = np.abs(drawn[250:, :].astype(int) - without[250:, :]).mean()
    assert inside > 20 and outside < 1


@requires_corpus
def test_aggregate_keeps_the_segmentation_board_apart(tmp_path):
    """The corpus's rfdetr-seg-n file (model.task segment) and the same file without its task (the site puts that
    on the detection board): two rows on two boards, never one."""
    from harness.results.aggregate import aggregate
    from harness.results.validate import load_support_matrix, validate_paths

    (source,) = (CORPUS / "submissions").glob("rfdetr-seg-n__*.json")
    shutil.copy(source, tmp_path / source.name)
    doc = json.loads(source.read_text())
    del doc["model"]["task"]
    doc["submission_id"] += "-boxes"
    (tmp_path / ("boxes-" + source.name)).write_text(json.dumps(doc))
    report = validate_paths([tmp_path], load_support_matrix(CORPUS / "support-matrix.json"))
    board = aggregate(report.reports)
    (seg,), (det,) = board["segmentation_leaderboard"], board["leaderboard"]
    assert seg["model"] == det["model"] == "rfdetr-seg-n" and seg["board"] == "segmentation"
    assert det["board"] == "detection" and board["counts"]["segmentation_rows"] == 1


@requires_corpus
def test_compare_shows_mask_and_box_metrics_and_refuses_mixing_them(tmp_path):
    from harness.results.compare import compare_paths

    (source,) = (CORPUS / "submissions").glob("rfdetr-seg-n__*.json")
    doc = json.loads(source.read_text())
    a, b, boxes = tmp_path / "a", tmp_path / "b", tmp_path / "boxes"
    for folder in (a, b, boxes):
        folder.mkdir()
    (a / source.name).write_text(json.dumps(doc))
    doc["accuracy"]["mAP_50_95"] -= 0.01
    doc["accuracy"]["bbox_mAP_50_95"] += 0.02
    (b / source.name).write_text(json.dumps(doc))
    del doc["model"]["task"]
    (boxes / source.name).write_text(json.dumps(doc))
    (same,) = compare_paths(a, [b])[0].accuracy
    assert same.of == "masks" and "bbox_mAP_50_95" in same.names
    assert same.delta("mAP_50_95") == pytest.approx(-0.01) and same.delta("bbox_mAP_50_95") == pytest.approx(0.02)
    (mixed,) = compare_paths(a, [boxes])[0].accuracy
    assert "one side scores masks" in mixed.unavailable
