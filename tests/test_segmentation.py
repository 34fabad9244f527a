"""Instance segmentation around the pipeline: the refusals a plan makes, the mask-IoU detection diff, drawn
masks, the segmentation board of `aggregate` and `compare` on segmentation files, and the mask work against numpy
at a non-square input (the models' masks are checked against libreyolo in test_libreyolo_families.py and against
numpy in test_ultralytics_onnx.py)."""

from __future__ import annotations

import json
import shutil

import cv2
import numpy as np
import pytest
import torch
from conftest import COCO_DIR, CORPUS, requires_coco, requires_corpus
from pycocotools import mask as mask_utils
from reference_resize import bilinear

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
    """The corpus's rfdetr-seg-n file (model.task segment) and a detection row of the same model (no task, box
    figures only; the site puts a file without a task on the detection board): two rows on two boards, never one.
    The segmentation file with its task removed keeps its mask figures: it is refused (mask mAP would be ranked as
    box mAP), on neither board."""
    from harness.results.aggregate import aggregate
    from harness.results.validate import load_support_matrix, validate_paths

    (source,) = (CORPUS / "submissions").glob("rfdetr-seg-n__*.json")
    shutil.copy(source, tmp_path / source.name)
    doc = json.loads(source.read_text())
    del doc["model"]["task"]
    masks_as_boxes = json.loads(json.dumps(doc))
    masks_as_boxes["submission_id"] += "-masks-as-boxes"
    (tmp_path / ("masks-as-boxes-" + source.name)).write_text(json.dumps(masks_as_boxes))
    doc["accuracy"] = {k.removeprefix("bbox_"): v for k, v in doc["accuracy"].items() if k.startswith("bbox_")}
    doc["submission_id"] += "-boxes"
    (tmp_path / ("boxes-" + source.name)).write_text(json.dumps(doc))
    report = validate_paths([tmp_path], load_support_matrix(CORPUS / "support-matrix.json"))
    board = aggregate(report.reports)
    (seg,), (det,) = board["segmentation_leaderboard"], board["leaderboard"]
    assert seg["model"] == det["model"] == "rfdetr-seg-n" and seg["board"] == "segmentation"
    assert det["board"] == "detection" and board["counts"]["segmentation_rows"] == 1
    assert det["file"].endswith("/boxes-" + source.name)
    (refused,) = [e for e in board["excluded"] if "masks-as-boxes" in e["file"]]
    assert refused["rules"] == ["task"]


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


# ------------------------------------------------------------------------------ the mask work against numpy

def _box_pixels(boxes: np.ndarray, size: tuple[int, int]) -> np.ndarray:
    """[n, h, w] bool: pixel (x, y) in its row's xyxy box, x1 <= x < x2 and y1 <= y < y2, by a plain loop."""
    h, w = size
    out = np.zeros((len(boxes), h, w), bool)
    for k, (x1, y1, x2, y2) in enumerate(boxes):
        for y in range(h):
            for x in range(w):
                out[k, y, x] = x1 <= x < x2 and y1 <= y < y2
    return out


def _quarter_boxes(rng, n: int, size: tuple[int, int]) -> np.ndarray:
    """n xyxy boxes at quarter-pixel coordinates (exact in float32), some past the edges."""
    h, w = size
    x = np.sort(rng.uniform(-0.1 * w, 1.1 * w, (n, 2)), axis=1)
    y = np.sort(rng.uniform(-0.1 * h, 1.1 * h, (n, 2)), axis=1)
    return np.round(np.stack([x[:, 0], y[:, 0], x[:, 1], y[:, 1]], axis=1) * 4) / 4


def test_inside_is_the_half_open_box_on_a_non_square_grid():
    from harness.pipeline.masks import inside

    boxes = np.concatenate([[[10.5, 3.25, 70.0, 40.75], [0.0, 0.0, 7.0, 5.0], [-3.0, 20.0, 2.5, 90.0],
                             [30.0, 30.0, 30.0, 31.0]], _quarter_boxes(np.random.default_rng(0), 8, (45, 75))])
    got = inside(torch.tensor(boxes, dtype=torch.float32), (45, 75)).numpy()
    assert got.shape == (len(boxes), 45, 75)
    assert np.array_equal(got, _box_pixels(boxes, (45, 75)))
    assert got[0].sum() == (70 - 11) * (41 - 4) and got[3].sum() == 0  # columns 11..69, rows 4..40; an empty box


INPUT = (96, 128)  # (height, width): a non-square input
# (image height, width): landscape, portrait (40 detections: two chunks of masks), one the input's aspect
SOURCES = ((75, 125), (150, 100), (48, 64))
MASK_CASES = {  # MaskSpec, PreprocessSpec fields: each family's way, plus a letterboxed map resized "direct"
    "prototypes": (dict(kind="prototypes", values="probabilities", resize="via_input", crop_to_box="input"),
                   dict(pad_position="center", size_rounding="ceil")),
    "query-source-crop": (dict(kind="query", values="logits", resize="via_input", crop_to_box="source"),
                          dict(pad_position="top-left")),
    "query-direct-letterboxed": (dict(kind="query", values="logits", resize="direct", crop_to_box="none"),
                                 dict(pad_position="center")),
    "query-direct-stretched": (dict(kind="query", values="probabilities", resize="direct", crop_to_box="source"),
                               dict(resize="stretch")),
}


def _placement(image: tuple[int, int], preprocess: dict) -> tuple[tuple[int, int], tuple[int, int]]:
    """Where an image lands in INPUT, by hand: ((top, left), (height, width) as resized)."""
    (h, w), (in_h, in_w) = image, INPUT
    if preprocess.get("resize") == "stretch":
        return (0, 0), INPUT
    r = min(in_h / h, in_w / w)
    rounding = np.ceil if preprocess.get("size_rounding") == "ceil" else np.floor
    nh, nw = int(rounding(h * r)), int(rounding(w * r))
    if preprocess.get("pad_position") == "center":
        return ((in_h - nh) // 2, (in_w - nw) // 2), (nh, nw)
    return (0, 0), (nh, nw)


@pytest.mark.parametrize("case", MASK_CASES)
def test_masks_of_a_non_square_input_are_numpys_at_each_source_size(case):
    """batch_masks on a batch of three images of other aspects than the non-square input, against a numpy
    reference: the map (or sigmoid(coefficients @ prototypes)) to the input size, zero outside its input box, the
    image's place in the input (computed here by hand) cropped, to the source size, thresholded, zero outside its
    source box; then through pycocotools' decoder. The transforms are the real preprocessing's."""
    from harness.detector.protocol import MaskMaps, MaskSpec, PreprocessSpec
    from harness.pipeline.masks import batch_masks
    from harness.pipeline.postprocess import BatchCandidates
    from harness.pipeline.preprocess import preprocess_batch

    fields, preprocess = MASK_CASES[case]
    spec = MaskSpec(**fields)
    _, transforms = preprocess_batch([np.zeros((*hw, 3), np.uint8) for hw in SOURCES],
                                     PreprocessSpec(input_size=INPUT, **preprocess))
    rng = np.random.default_rng(1)
    counts, rows_per_image, head = [5, 40, 3], 50, (24, 32)
    # smooth maps (a coarse grid upsampled), so that a mask is a few blobs: logits around 0, or probabilities
    coarse = rng.normal(0, 2, (len(SOURCES), rows_per_image if spec.kind == "query" else 6, 6, 8))
    maps = bilinear(coarse.reshape(-1, 6, 8), head).reshape(*coarse.shape[:2], *head)
    coefficients = rng.normal(0, 1, (len(SOURCES), rows_per_image, 6)) if spec.kind == "prototypes" else None
    if spec.kind == "query" and spec.values == "probabilities":
        maps = 1 / (1 + np.exp(-maps))
    maps[:, 0] = 5.0 if spec.kind == "query" else maps[:, 0]  # an all-on map: the crop's own pixels show
    rows = np.concatenate([rng.choice(rows_per_image, n, replace=False) for n in counts])
    rows[0] = 0
    input_boxes = np.concatenate([_quarter_boxes(rng, n, INPUT) for n in counts])
    source_boxes = np.concatenate([_quarter_boxes(rng, n, hw) for n, hw in zip(counts, SOURCES, strict=True)])
    image = np.repeat(np.arange(len(SOURCES)), counts)
    kept = BatchCandidates(torch.tensor(input_boxes, dtype=torch.float32), torch.ones(len(rows)),
                           torch.zeros(len(rows), dtype=torch.long), torch.tensor(image), counts, torch.tensor(rows))
    head_maps = MaskMaps(torch.tensor(maps, dtype=torch.float32),
                         None if coefficients is None else torch.tensor(coefficients, dtype=torch.float32))
    ours = batch_masks(head_maps, spec, kept, torch.tensor(source_boxes, dtype=torch.float32), transforms, INPUT)

    start = 0
    for k, ((h, w), n) in enumerate(zip(SOURCES, counts, strict=True)):
        (top, left), (nh, nw) = _placement((h, w), preprocess)
        assert transforms[k].pad == (left, top) and transforms[k].resized == (nh, nw)
        mine = slice(start, start + n)
        if spec.kind == "prototypes":
            values = 1 / (1 + np.exp(-np.einsum("np,phw->nhw", coefficients[k, rows[mine]], maps[k])))
        else:
            values = maps[k, rows[mine]]
        if spec.resize == "via_input" or spec.crop_to_box == "input" or (top, left, nh, nw) != (0, 0, *INPUT):
            values = bilinear(values, INPUT)
            if spec.crop_to_box == "input":
                values = values * _box_pixels(input_boxes[mine], INPUT)
            values = values[:, top:top + nh, left:left + nw]
        values = bilinear(values, (h, w))
        want = values > 0 if spec.values == "logits" else values >= 0.5
        if spec.crop_to_box == "source":
            want &= _box_pixels(source_boxes[mine], (h, w))
        assert len(ours[k]) == n and all(tuple(rle["size"]) == (h, w) for rle in ours[k])
        got = np.moveaxis(mask_utils.decode(ours[k]), -1, 0).astype(bool)
        # float32 against float64: only a pixel within rounding of the threshold may differ
        assert np.count_nonzero(got != want) <= 3, (case, k, np.count_nonzero(got != want))
        assert want.any(axis=(1, 2)).sum() >= n // 2  # masks with pixels on: something to compare
        start += n
