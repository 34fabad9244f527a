"""LibreYOLO families (harness/models/libreyolo.py + catalogue.yaml) against libreyolo itself.

The reference is libreyolo's own validation path (the path its COCO mAP comes from), run piece by piece
with its own code: its COCO dataset + the family's validation preprocessor, its validator's normalisation
and forward, and `_postprocess_predictions` at the thresholds the validator uses. Our side is the harness
pipeline (DetectorPipeline) on the same images and the same weights, including the images libreyolo's
validation path resizes twice in the DETR families that fit then stretch (`resize: fit_stretch`).

Random weights give degenerate scores (a from-scratch head scores every box alike, so NMS and top-k
choose among ties). The parity models therefore get their BatchNorm statistics from a few real images
first (running mean/var only, no parameter changes): scores then spread out like a real detector's,
and both sides see exactly the same module.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
import threading
from dataclasses import replace
from functools import partial
from http.server import HTTPServer, SimpleHTTPRequestHandler

import numpy as np
import pytest
import torch
from conftest import COCO_DIR, CORPUS, load_core_of, requires_coco, requires_corpus, requires_yolox, run_in_process
from torch.nn.modules.batchnorm import _BatchNorm

from harness.detector.protocol import RANDOM_WEIGHTS
from harness.errors import UsageError
from harness.eval.matching import mask_areas, match_detections
from harness.models import libreyolo as ly
from harness.records import ImageDetections

libreyolo = pytest.importorskip("libreyolo", reason="the optional `libreyolo` extra is not installed")
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning")  # torch.jit.script deprecation inside libreyolo

def _has_transformers() -> bool:
    try:
        import transformers  # noqa: F401
    except ImportError:
        return False
    return True


# RF-DETR needs `transformers` (part of the libreyolo extra); without it its tests skip, and the one-line
# refusal is tested in test_a_family_whose_dependency_is_missing_says_so_in_one_line
HAS_RFDETR = _has_transformers()
SUBSET_JSON = "instances_val2017_subset.json"
# 640x426 (long side = the input size), 352x230 (upscaled) and 375x500: the fit_stretch families resize the
# last two twice (the fit is a copy for the first)
PARITY_IMAGES = (139, 37777, 480985)
CALIBRATION_IMAGES = (5001, 87038)
# The smallest model of every family (and one segmentation variant), at its native input size.
PARITY_MODELS = ("yolox-nano", "yolov9t", "yolonas-s", "picodet-s", "rtdetr-r18", "rtdetrv2-r18", "rtdetrv4-s",
                 "dfine-n", "deim-n", "deimv2-atto", "ec-s", *(("rfdetr-n", "rfdetr-seg-n") if HAS_RFDETR else ()),
                 "rtmdet-t", "yolov9e2e-t", "yolov7-b", "ppyoloe-s", "lwdetr-t")
# In `make test`: one model per kind of head and post-processing (anchor-free NMS, DFL, DETR top-k, RF-DETR);
# every family's smallest model in `make test-slow` (a list that grows with the catalogue).
PARITY_QUICK = ("yolox-nano", "yolov9t", "rtdetr-r18", "dfine-n", "rfdetr-n", "rfdetr-seg-n")
# Families the site's support matrix does not list yet (catalogue `site_matrix: pending`): every variant's
# parity runs in `make test-slow` (marker "catalogue"), the smallest in `make test`.
PENDING_FAMILIES = ("rtmdet", "yolov9-e2e", "yolov7", "ppyoloe", "lwdetr")
ALL_PENDING_VARIANTS = tuple(m for m, model in ly.catalogue().items()
                             if model.family.key in PENDING_FAMILIES and m not in PARITY_MODELS)


@pytest.fixture(scope="module")
def coco():
    from harness.data.coco import CocoDataset

    return CocoDataset(COCO_DIR)


def calibrated(model_id: str, coco) -> ly.LibreYoloDetector:
    """Random weights whose BatchNorm running statistics come from real images (see the module docstring)."""
    from harness.pipeline.preprocess import decode_image, preprocess_batch

    det = ly.LibreYoloDetector(model_id, RANDOM_WEIGHTS)
    module = det.wrapper.model
    # PP-YOLOE's from-scratch prediction convs are zeros (every score alike); x 0.002 keeps the larger variants'
    # scores off sigmoid's saturation (at x 0.02 ppyoloe-l scores 300 boxes of an image exactly 1.0: ties)
    if det.entry.family.head == "ppyoloe":
        generator = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for conv in (*module.head.pred_cls, *module.head.pred_reg):
                conv.weight.copy_(torch.randn(conv.weight.shape, generator=generator) * 0.002)
    norms = [m for m in module.modules() if isinstance(m, _BatchNorm)]
    for bn in norms:
        bn.reset_running_stats()
        bn.momentum = None  # cumulative average over the calibration batch
        bn.train()
    batch, _ = preprocess_batch([decode_image(coco.record(i).path) for i in CALIBRATION_IMAGES], det.preprocess)
    with torch.inference_mode():
        module(batch)
    for bn in norms:
        bn.eval()
    return det


def libreyolo_detections(det: ly.LibreYoloDetector, image_ids) -> list[ImageDetections]:
    """libreyolo's validation path: its COCO dataset + the family's validation preprocessor, its validator's
    normalisation and forward, and its `_postprocess_predictions` at the thresholds the validator uses."""
    from libreyolo.data.dataset import COCODataset
    from libreyolo.validation.config import ValidationConfig
    from libreyolo.validation.detection_validator import DetectionValidator, val_collate_fn
    from torch.utils.data import DataLoader, Subset

    wrapper, size, post = det.wrapper, det.entry.input_size, det.postprocess
    preproc = wrapper._get_val_preprocessor(img_size=size)
    dataset = COCODataset(data_dir=str(COCO_DIR), json_file=SUBSET_JSON, name="val2017", img_size=(size, size),
                          preproc=preproc, num_classes=80)
    index = {int(image_id): k for k, image_id in enumerate(dataset.ids)}
    loader = DataLoader(Subset(dataset, [index[i] for i in image_ids]), batch_size=1, collate_fn=val_collate_fn)
    validator = DetectionValidator(wrapper, ValidationConfig(
        data_dir=str(COCO_DIR), imgsz=size, batch_size=1, device="cpu", verbose=False,
        conf_thres=post.conf, iou_thres=post.iou, max_det=post.max_det))
    validator.val_preproc, validator._actual_imgsz = preproc, size  # what its _setup_dataloader sets
    out = []
    with torch.no_grad():
        for batch in loader:
            images, _, _, ids = validator._preprocess_batch(batch)
            preds = validator._inference(images)
            for d, image_id in zip(validator._postprocess_predictions(preds, batch), ids, strict=True):
                out.append(ImageDetections(int(image_id), d["boxes"].numpy().astype(np.float64), d["scores"].numpy(),
                                           d["classes"].numpy().astype(int), _rles(d.get("masks"))))
    return out


def _rles(masks: torch.Tensor | None) -> list[dict] | None:
    """libreyolo's masks [K, H, W] as COCO RLEs, encoded as its evaluator does (pycocotools, Fortran uint8)."""
    from pycocotools import mask as mask_utils

    if masks is None:
        return None
    return [mask_utils.encode(np.asfortranarray(m.numpy().astype(np.uint8))) for m in masks]


def our_detections(det, records, batch_size: int = 1) -> list[ImageDetections]:
    from harness.measure.device import parse_device
    from harness.pipeline.pipeline import DetectorPipeline, Thresholds
    from harness.pipeline.stage_timer import StageTimer

    device = parse_device("cpu")
    core = load_core_of(det, "pytorch", device, "fp32", det.preprocess.input_size)
    p = det.postprocess
    pipeline = DetectorPipeline(det, core, device, det.preprocess, Thresholds(p.conf, p.iou, p.max_det))
    timer = StageTimer(device)
    return [d for k in range(0, len(records), batch_size) for d in pipeline.run_batch(records[k:k + batch_size], timer)]


def detections_of_inputs(det, records, inputs: torch.Tensor) -> list[ImageDetections]:
    """Our core and post-processing on given input tensors (libreyolo's own), our transforms for the geometry.
    For RF-DETR's masks: from scratch, its larger sizes are chaotic (rfdetr-seg-s: a 1e-4 input difference,
    the float resize's cv2 vs torch, moves mask logits by ~160 for a spread of ~55), so the post-processing is
    compared on the same inputs; the inputs themselves are compared in test_preprocessing_matches_libreyolo_pixels."""
    from harness.measure.device import parse_device
    from harness.pipeline.pipeline import DetectorPipeline, Thresholds
    from harness.pipeline.preprocess import decode_image, preprocess_batch
    from harness.pipeline.stage_timer import StageTimer

    device = parse_device("cpu")
    core = load_core_of(det, "pytorch", device, "fp32", det.preprocess.input_size)
    p = det.postprocess
    pipeline = DetectorPipeline(det, core, device, det.preprocess, Thresholds(p.conf, p.iou, p.max_det))
    _, transforms = preprocess_batch([decode_image(r.path) for r in records], det.preprocess)
    timer = StageTimer(device)
    timer.begin_batch(len(records))
    with torch.inference_mode():
        return pipeline._finish(records, core(inputs), transforms, timer, None)


def comparable(reference: list[ImageDetections], records, head: str) -> list[ImageDetections]:
    """libreyolo's detections as the harness reports boxes. Two documented differences: the harness clips
    every box to the image (libreyolo leaves DETR boxes unclipped: clipping only raises IoU with in-image
    ground truth), and a from-scratch RF-DETR's 81st logit column (never a class) is dropped, where
    libreyolo reports it as class 80."""
    out = []
    for d, r in zip(reference, records, strict=True):
        kept = d.select(d.labels < 80 if head == "rfdetr" else np.ones(len(d.labels), bool))
        kept.boxes = np.clip(kept.boxes, 0, [r.width, r.height, r.width, r.height])
        out.append(kept)
    return out


# ------------------------------------------------------------------------------------------ catalogue


@requires_corpus
def test_catalogue_has_every_support_matrix_id_libreyolo_has():
    matrix = json.loads((CORPUS / "support-matrix.json").read_text())["models"]
    missing = [m for m in matrix if m not in ly.catalogue()]
    ultralytics = re.compile(r"(yolov8|yolo11|yolo26)[nsmlx]|yolov5[nsmlx]u")  # AGPL families: not in libreyolo
    assert missing and all(ultralytics.fullmatch(m) for m in missing), missing
    # every other catalogue id is on the matrix, except the families marked pending (none of whose ids is)
    pending = {m for m, model in ly.catalogue().items() if model.family.site_matrix == "pending"}
    assert {ly.catalogue()[m].family.key for m in pending} == set(PENDING_FAMILIES)
    assert all((m in matrix) != (m in pending) for m in ly.catalogue())


def test_catalogue_sizes_and_weight_names_are_libreyolos():
    """Input sizes are libreyolo's INPUT_SIZES; weight names are ones libreyolo's hub resolves to this size."""
    for model_id, model in ly.catalogue().items():
        if model.family.class_name == "LibreRFDETR" and not HAS_RFDETR:
            continue
        cls = ly.libreyolo_class(model)
        sizes = cls.TASK_INPUT_SIZES.get(model.family.task) or cls.INPUT_SIZES
        assert sizes[model.size] == model.input_size, model_id
        assert cls.detect_size_from_filename(model.weights_file) == model.size, model_id
        assert cls.get_download_url(model.weights_file), model_id
        assert (cls.detect_task_from_filename(model.weights_file) or "detect") == model.family.task, model_id


def test_catalogue_rejects_a_bad_entry(tmp_path, monkeypatch):
    bad = tmp_path / "catalogue.yaml"
    bad.write_text("libreyolo:\n  families:\n    x:\n      class: LibreYOLOX\n      head: yolox\n      weights: a\n"
                   "      licence: b\n      preprocess: {resize: sideways}\n      postprocess: {kind: nms}\n"
                   "      models: {x-n: {size: n, input_size: 416}}\n")
    monkeypatch.setattr(ly, "CATALOGUE", bad)
    ly.catalogue.cache_clear()
    try:
        with pytest.raises(UsageError, match="family x"):
            ly.catalogue()
    finally:
        ly.catalogue.cache_clear()


def test_rfdetr_columns_map_to_contiguous_classes():
    coco = ly.rfdetr_column_labels(91)  # COCO checkpoints: column = category id
    assert coco[1] == 0 and coco[90] == 79 and coco[0] == -1 and coco[12] == -1
    assert (coco >= 0).sum() == 80
    scratch = ly.rfdetr_column_labels(81)  # built for 80 classes: the last column is no class
    assert scratch[:80].tolist() == list(range(80)) and scratch[80] == -1


# ------------------------------------------------------------------------------------------ parity


def libreyolo_inputs(det: ly.LibreYoloDetector, records) -> torch.Tensor:
    """The input tensors libreyolo's validation path builds for these images."""
    from libreyolo.data.dataset import COCODataset
    from libreyolo.validation.config import ValidationConfig
    from libreyolo.validation.detection_validator import DetectionValidator, val_collate_fn

    size = det.entry.input_size
    preproc = det.wrapper._get_val_preprocessor(img_size=size)
    dataset = COCODataset(data_dir=str(COCO_DIR), json_file=SUBSET_JSON, name="val2017", img_size=(size, size),
                          preproc=preproc, num_classes=80)
    index = {int(image_id): k for k, image_id in enumerate(dataset.ids)}
    validator = DetectionValidator(det.wrapper, ValidationConfig(data_dir=str(COCO_DIR), imgsz=size, device="cpu",
                                                                 verbose=False))
    validator.val_preproc = preproc
    return validator._preprocess_batch(val_collate_fn([dataset[index[r.image_id]] for r in records]))[0]


# the smallest model of every family whose libreyolo validation path fits then stretches (seg variants too)
FIT_STRETCH_MODELS = ("rtdetr-r18", "rtdetrv4-s", "dfine-n", "dfine-seg-n", "deim-n", "ec-s", "ec-seg-s")


@requires_coco
def test_preprocessing_matches_libreyolo_pixels(coco):
    """Our preprocess_batch against libreyolo's input tensors, pixel by pixel, for every preprocessing
    convention (DEIMv2's DINOv3 sizes add ImageNet statistics), and the catalogue's fit_stretch is where
    libreyolo's validation path resizes twice: a plain resize (no letterbox) whose preprocessor lets the
    dataset fit the image first (it does not ask for the unresized image)."""
    from harness.pipeline.preprocess import decode_image, preprocess_batch

    models = (*PARITY_MODELS, "deimv2-s", "dfine-seg-n", "ec-seg-s")
    families = {m.family.key for m in ly.catalogue().values() if HAS_RFDETR or m.family.head != "rfdetr"}
    assert {ly.catalogue()[m].family.key for m in models} == families
    for model_id in models:
        det = ly.LibreYoloDetector(model_id, RANDOM_WEIGHTS)
        preproc = det.wrapper._get_val_preprocessor()
        twice = not preproc.uses_letterbox and not preproc.wants_unresized_image
        assert (det.preprocess.resize == "fit_stretch") == twice, model_id
        assert twice == (model_id in FIT_STRETCH_MODELS), model_id
        if det.entry.family.head == "rfdetr":  # its top-k is the model's own num_select
            assert det.postprocess.max_det == det.wrapper.model.num_select, model_id
        records = [coco.record(i) for i in PARITY_IMAGES]
        ours, _ = preprocess_batch([decode_image(r.path) for r in records], det.preprocess)
        worst = float((libreyolo_inputs(det, records) - ours).abs().max())
        # bit-identical (measured 0), except RF-DETR: it resizes floats, libreyolo in cv2 and we in torch
        # (measured 1.4e-4: <= 2e-5 of the 0-1 range, ~1e-4 once divided by ImageNet's std)
        assert worst <= (2e-4 if det.entry.family.head == "rfdetr" else 0.0), (model_id, worst)


@requires_coco
@pytest.mark.parametrize("model_id", FIT_STRETCH_MODELS)
def test_fit_stretch_matches_libreyolo_on_every_twice_resized_image(model_id, coco):
    """Every sample image whose long side is not the input size (35 of 206: libreyolo's validation path
    resizes them twice): the cv2 path equals libreyolo's input tensor bit for bit, the torch path (float, no
    uint8 rounding between the resizes) is within 2 pixel units (measured max 1.46). A single stretch
    differs (mean |delta| > 1e-3): the images do exercise the fit, and if libreyolo stopped fitting first
    this fails."""
    from harness.pipeline.preprocess import decode_image, preprocess_batch, preprocess_tensors

    det = ly.LibreYoloDetector(model_id, RANDOM_WEIGHTS)
    spec = det.preprocess
    size = det.entry.input_size
    records = [r for r in coco.records(coco.variant("sample")) if max(r.width, r.height) != size]
    assert len(records) == 35
    pixel_unit = spec.scale / min(spec.std or (1.0,))
    for k in range(0, len(records), 12):
        batch = records[k:k + 12]
        images = [decode_image(r.path) for r in batch]
        theirs = libreyolo_inputs(det, batch)
        assert torch.equal(theirs, preprocess_batch(images, spec)[0]), model_id
        assert float((theirs - preprocess_tensors(images, spec)[0]).abs().max()) <= 2 * pixel_unit, model_id
        single = preprocess_batch(images, replace(spec, resize="stretch"))[0]
        assert float((theirs - single).abs().mean()) > 1e-3, model_id


@requires_coco
@pytest.mark.slow
@pytest.mark.parametrize("model_id", [
    *(pytest.param(m, marks=() if m in PARITY_QUICK else pytest.mark.catalogue) for m in PARITY_MODELS),
    *(pytest.param(m, marks=pytest.mark.catalogue) for m in ALL_PENDING_VARIANTS)])
def test_detections_match_libreyolo(model_id, coco):
    """Acceptance: >= 99 % of detections matched at IoU >= 0.99 (same class, score within 1e-3) on the same
    real images and weights, against libreyolo's own pre- and post-processing, on every image alone too
    (the fit_stretch families resize two of the three images twice)."""
    det = calibrated(model_id, coco)
    records = [coco.record(i) for i in PARITY_IMAGES]
    reference = comparable(libreyolo_detections(det, [r.image_id for r in records]), records, det.entry.family.head)
    ours = our_detections(det, records)
    report = match_detections(reference, ours)
    assert report.detections_a > 50 * len(records), report.to_dict()  # real work: many detections per image
    assert report.match_rate >= 0.99, report.to_dict()
    per_image = {a.image_id: match_detections([a], [b]).match_rate for a, b in zip(reference, ours, strict=True)}
    assert min(per_image.values()) >= 0.99, per_image


# The two mask heads (logits at the source size; probabilities via the input size, cropped) in `make test`; the
# smallest of each family and every variant in `make test-slow`.
SEGMENT_QUICK = ("rfdetr-seg-n", "dfine-seg-n")
SEGMENT_MODELS = (*(("rfdetr-seg-n",) if HAS_RFDETR else ()), "dfine-seg-n", "ec-seg-s")
ALL_SEGMENT_VARIANTS = tuple(m for m, model in ly.catalogue().items() if model.family.task == "segment"
                             and m not in SEGMENT_MODELS and (HAS_RFDETR or model.family.head != "rfdetr"))


@requires_coco
@pytest.mark.parametrize("model_id", [
    *(pytest.param(m, marks=() if m in SEGMENT_QUICK else pytest.mark.catalogue) for m in SEGMENT_MODELS),
    *(pytest.param(m, marks=pytest.mark.catalogue) for m in ALL_SEGMENT_VARIANTS)])
def test_masks_match_libreyolo(model_id, coco):
    """Acceptance: >= 99 % of detections matched with their box (IoU >= 0.99, same class, score within 1e-3)
    AND their mask (mask IoU >= 0.99) against libreyolo's own validation path on the same images and weights;
    every mask is at its source image's height x width. (libreyolo's predict path post-processes masks the
    same way; only its preprocessing differs for D-FINE and EC: the validation path is the reference.)"""
    det = calibrated(model_id, coco)
    records = [coco.record(i) for i in PARITY_IMAGES]
    reference = comparable(libreyolo_detections(det, [r.image_id for r in records]), records, det.entry.family.head)
    if det.entry.family.head == "rfdetr":
        ours = detections_of_inputs(det, records, libreyolo_inputs(det, records))
    else:
        ours = our_detections(det, records, batch_size=len(records))
    assert all(d.masks is not None and len(d.masks) == len(d.scores) for d in (*reference, *ours))
    for d, r in zip(ours, records, strict=True):
        assert {tuple(m["size"]) for m in d.masks} == {(r.height, r.width)}, model_id
    report = match_detections(reference, ours, mask_iou_threshold=0.99)
    assert report.detections_a >= 50 * len(records) and report.mask_iou_threshold == 0.99, report.to_dict()
    assert report.match_rate >= 0.99, report.to_dict()
    # the masks are not empty or all alike: real work to compare
    areas = [float(a) for d in ours for a in mask_areas(d.masks)]
    assert np.count_nonzero(areas) > len(areas) // 2 and len(set(areas)) > 10, model_id


# ------------------------------------------------------------------------------------------ end to end

# (model, input size): the smallest model of each family, at 320 where the family runs there batch-invariantly
# (D-FINE/DEIM at 320 choose among tied queries differently at batch 1 and 4 with random weights: native 640).
# The segmentation variants share their family's head; rfdetr-seg-n's native 312 is refused by the run's
# multiple-of-32 input-size rule.
E2E_MODELS = (("yolox-nano", 320), ("yolov9t", 320), ("yolonas-s", 320), ("picodet-s", 320), ("rtdetr-r18", 320),
              ("rtdetrv2-r18", 320), ("rtdetrv4-s", 320), ("dfine-n", 640), ("deim-n", 640), ("deimv2-atto", 320),
              ("ec-s", 320), *((("rfdetr-n", 384),) if HAS_RFDETR else ()), ("rtmdet-t", 320), ("yolov9e2e-t", 320),
              ("yolov7-b", 320), ("ppyoloe-s", 320), ("lwdetr-t", 320))


# `make test` runs three of them (a NMS family, a top-k one, RF-DETR's); the matrix grows with the catalogue: the
# rest run in `make test-slow`
E2E_QUICK = ("yolox-nano", "dfine-n", "rfdetr-n")


@requires_coco
@requires_corpus
@pytest.mark.slow
@pytest.mark.parametrize("model_id, input_size", [
    pytest.param(m, size, marks=() if m in E2E_QUICK else pytest.mark.catalogue) for m, size in E2E_MODELS])
def test_random_weights_run_end_to_end(model_id, input_size, tmp_path):
    """`run --model ID --weights random --backend pytorch --batch-sizes 1 4 --limit 8`: both cells ok,
    batch 4 matches batch 1, the submissions are labelled random and validate except for that refusal."""
    from harness.catalogue import pending_site_ids
    from harness.config import RunConfig
    from harness.results.validate import load_support_matrix, validate_paths
    from harness.run.plan import prepare
    from harness.run.scheduler import Scheduler

    plan = prepare(RunConfig(models=[model_id], weights=RANDOM_WEIGHTS, backends=["pytorch"], batch_sizes=[1, 4],
                             limit=8, input_sizes=[input_size], warmup_batches=0,  # no timing is asserted
                             warmup_seconds=0.0, min_timed_batches=2, layers=False, profile=False, draw_images=0,
                             coco_dir=str(COCO_DIR), output_dir=str(tmp_path)))
    outcome = Scheduler(plan, ["run", "--test", model_id]).run()
    assert not outcome.problems and len(outcome.records) == 2, outcome.problems
    records = outcome.records
    b4 = next(r for r in records if r.cell.batch_size == 4)
    assert b4.invariance.report.match_rate >= 0.99, b4.invariance.report.to_dict()
    files = sorted((plan.run_dir / "submissions").glob("*.json"))
    assert len(files) == 2
    for f in files:
        doc = json.loads(f.read_text())
        assert doc["model"]["id"] == model_id and doc["model"]["weights"] == RANDOM_WEIGHTS
        assert doc["repro"]["weights"]["libreyolo_version"] == libreyolo.__version__
        assert doc["benchmark"]["libreyolo_version"] == doc["software"]["libreyolo"] == libreyolo.__version__
        assert doc["accuracy"]["status"] == "unavailable" and "random weights" in doc["accuracy"]["reason"]
    report = validate_paths([plan.run_dir / "submissions"], load_support_matrix(CORPUS / "support-matrix.json"),
                            None, pending_site_ids())
    errors = {f.rule for r in report.reports for f in r.errors}
    assert errors == {"random-weights"}, [f.to_dict() for r in report.reports for f in r.findings]
    pending = {f.rule for r in report.reports for f in r.findings if f.severity == "warning"}
    assert ("pending-support-matrix" in pending) == (model_id in pending_site_ids())


@requires_coco
@requires_corpus
@pytest.mark.slow
@pytest.mark.skipif(not HAS_RFDETR, reason="RF-DETR needs `transformers`")
def test_segmentation_run_end_to_end(tmp_path):
    """Acceptance: `run --model rfdetr-seg-n --weights random --batch-sizes 1 4 --limit 8` writes segment
    submissions the site's schema accepts and its board rule puts on the segmentation board; batch 4 matches
    batch 1 box and mask (mask IoU >= 0.99) on >= 99 % of detections; the detections files carry each mask as a
    COCO RLE at its source image's height x width, and the masks are their own post-processing substep."""
    import jsonschema
    from pycocotools import mask as mask_utils

    from harness.config import RunConfig
    from harness.results.model import Submission
    from harness.run.plan import prepare
    from harness.run.scheduler import Scheduler

    plan = prepare(RunConfig(models=["rfdetr-seg-n"], weights=RANDOM_WEIGHTS, backends=["pytorch"],
                             batch_sizes=[1, 4], limit=8, warmup_batches=0, warmup_seconds=0.0, min_timed_batches=2,
                             energy=False, draw_images=1, coco_dir=str(COCO_DIR), output_dir=str(tmp_path)))
    outcome = Scheduler(plan, ["run", "--test", "segment"]).run()
    assert not outcome.problems and len(outcome.records) == 2, outcome.problems
    b4 = next(r for r in outcome.records if r.cell.batch_size == 4)
    report = b4.invariance.report
    assert report.mask_iou_threshold == 0.99 and report.match_rate >= 0.99, report.to_dict()
    schema = json.loads((CORPUS / "schemas" / "submission.v1.json").read_text())
    sizes = {r.image_id: (r.height, r.width) for r in plan.records}
    for f in sorted((plan.run_dir / "submissions").glob("*.json")):
        doc = json.loads(f.read_text())
        jsonschema.validate(doc, schema)
        assert doc["model"]["task"] == "segment" and Submission.model_validate(doc).board == "segmentation"
        assert doc["config"]["masks"]["kind"] == "query"
        assert "postprocess.masks" in doc["timing"]["stages_ms"]
    for f in (plan.run_dir / "detections").glob("*.json"):
        results = json.loads(f.read_text())
        assert {r["image_id"] for r in results} == set(sizes)
        for r in results:
            assert tuple(r["segmentation"]["size"]) == sizes[r["image_id"]]
        assert sum(mask_utils.area(r["segmentation"]) > 0 for r in results) > len(results) // 2
    assert list((plan.run_dir / "images").glob("*.jpg"))


# Published figures (params in millions, GFLOPs = 2 x GMACs) at the native input size: YOLOX's README
# (nano 0.91 M, 1.08 G at 416), DEIMv2's README (atto 0.49 M, 0.76 G at 320), RT-DETR's README (R18 20 M,
# 60 G at 640).
PUBLISHED_STATS = {"yolox-nano": (0.91, 1.08), "deimv2-atto": (0.49, 0.76), "rtdetr-r18": (20.0, 60.0)}


@pytest.mark.parametrize("model_id", PUBLISHED_STATS)
def test_model_stats_match_the_published_figures(model_id):
    det = ly.LibreYoloDetector(model_id, RANDOM_WEIGHTS)
    stats = det.model_stats(det.preprocess.input_size)
    params, gflops = PUBLISHED_STATS[model_id]
    assert stats.params_millions == pytest.approx(params, rel=0.05)
    assert stats.gflops == pytest.approx(gflops, rel=0.05)


# ------------------------------------------------------------------------------------------ weights


def _saved_checkpoint(path, seed: int = 1):
    """A real libreyolo checkpoint (its own `save`) of a seeded yolox-nano: what a user's file looks like."""
    wrapper = libreyolo.LibreYOLOX._from_scratch(size="n", device="cpu", seed=seed)
    wrapper.save(str(path))
    return wrapper


def test_weights_file_loads_through_libreyolo_with_its_sha256(tmp_path, monkeypatch):
    path = tmp_path / "LibreYOLOXn.pt"
    saved = _saved_checkpoint(path)
    det = ly.LibreYoloDetector("yolox-nano", str(path))
    assert det.weights.file == path.name and det.weights.source == "--weights"
    assert det.weights.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    x = torch.rand(2, 3, 320, 320)
    with torch.inference_mode():
        expected = ly.LibreCore(saved.model.eval(), "yolox")(x)[0]
        assert torch.equal(det.core_module(x)[0], expected)  # the file's weights, not a fresh init
    monkeypatch.setenv("VA_BENCH_WEIGHTS", str(tmp_path))  # no --weights: the catalogue name in the cache
    cached = ly.LibreYoloDetector("yolox-nano")
    assert cached.weights.source == "libreyolo" and cached.weights.sha256 == det.weights.sha256


def test_missing_weights_say_how_to_get_them(tmp_path, monkeypatch):
    monkeypatch.setenv("VA_BENCH_WEIGHTS", str(tmp_path))
    with pytest.raises(UsageError) as err:
        ly.LibreYoloDetector("dfine-n")
    message = str(err.value)
    assert "\n" not in message and "va-bench models fetch dfine-n" in message and "--weights random" in message
    with pytest.raises(UsageError, match="no such file"):
        ly.LibreYoloDetector("dfine-n", str(tmp_path / "nope.pt"))


class _Payload:
    """Unpickling this touches a marker file: proof that a refused file was never unpickled."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (type(self.marker).touch, (self.marker,))


def test_pickled_objects_are_refused_unread(tmp_path):
    marker = tmp_path / "unpickled"
    path = tmp_path / "LibreYOLOXn.pt"
    torch.save({"model": _Payload(marker)}, path)
    with pytest.raises(UsageError, match="not a plain weights checkpoint"):
        ly.LibreYoloDetector("yolox-nano", str(path))
    assert not marker.exists()
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint")  # not even a zip or a pickle: said so, with what to pass
    with pytest.raises(UsageError, match=r"is not a PyTorch checkpoint \(neither a zip nor a pickle file\); pass the "
                                         r"LibreYOLOXn.pt checkpoint of yolox-nano or its ONNX export \(.onnx\)"):
        ly.LibreYoloDetector("yolox-nano", str(garbage))


def test_training_arguments_in_a_checkpoint_are_plain_data(tmp_path):
    """RF-DETR checkpoints carry their training arguments (argparse.Namespace): read without unpickling code."""
    path = tmp_path / "ckpt.pt"
    torch.save({"model": {"w": torch.zeros(2)}, "args": argparse.Namespace(lr=1e-4, epochs=12)}, path)
    assert ly._trusted(libreyolo.LibreYOLOX, path, "0" * 64)


def test_a_checkpoint_of_another_model_is_one_line(tmp_path):
    path = tmp_path / "LibreYOLOXn.pt"
    _saved_checkpoint(path)
    with pytest.raises(UsageError) as err:
        ly.LibreYoloDetector("picodet-s", str(path))
    assert "\n" not in str(err.value) and "could not be loaded as picodet-s" in str(err.value)


def test_a_file_without_the_models_tensors_is_refused_not_run_on_random_values(tmp_path):
    """libreyolo loads some families non-strictly and logs what was missing: a state dict of something else would
    leave every tensor at its random initialisation under the file's name and sha256."""
    import logging

    foreign = tmp_path / "foreign.pt"
    torch.save({"a": torch.zeros(3)}, foreign)
    quiet = logging.getLogger("libreyolo")
    quiet.setLevel(logging.ERROR)  # a user's quieter logging must not hide the report
    try:
        for model_id in ("yolox-nano", "rtdetr-r18"):
            with pytest.raises(UsageError) as err:
                ly.LibreYoloDetector(model_id, str(foreign))
            assert "\n" not in str(err.value) and f"does not hold {model_id}'s weights" in str(err.value)
    finally:
        quiet.setLevel(logging.NOTSET)
    assert logging.getLogger("libreyolo.models.base.model").level == logging.NOTSET  # restored
    # RTMDet shares its head's convolutions across levels; its checkpoints hold each shared tensor once, and the
    # names libreyolo reports missing are those aliases: loaded, not refused
    model = ly.catalogue()["rtmdet-t"]
    wrapper = ly.libreyolo_class(model)._from_scratch(size=model.size, device="cpu", task="detect", seed=1)
    wrapper.save(str(tmp_path / "rtm.pt"))
    checkpoint = torch.load(tmp_path / "rtm.pt", map_location="cpu", weights_only=False)
    seen, aliases = set(), []
    for key, tensor in wrapper.model.state_dict(keep_vars=True).items():
        where = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if tensor.numel() and where in seen:
            aliases.append(key)
        seen.add(where)
    assert aliases  # the shared convolutions
    checkpoint["model"] = {k: v for k, v in checkpoint["model"].items() if k not in aliases}
    torch.save(checkpoint, tmp_path / "rtm-once.pt")
    loaded = ly.LibreYoloDetector("rtmdet-t", str(tmp_path / "rtm-once.pt")).core_module.state_dict()
    for key, tensor in wrapper.model.state_dict().items():  # every tensor the file's, aliases included
        assert torch.equal(loaded[f"module.{key}"], tensor), key
    # but a file without a real weight besides the aliases (its classification head), or without any name of a
    # shared convolution, is refused, whatever libreyolo's first five names say
    once = checkpoint["model"]
    head = [k for k in once if ".rtm_cls." in k]
    group = [k for k in wrapper.model.state_dict() if k.endswith(aliases[0].split(".", 3)[-1])
             and k.startswith("head.cls_convs.")]
    for cut in (head, group):
        assert cut
        checkpoint["model"] = {k: v for k, v in once.items() if k not in cut}
        torch.save(checkpoint, tmp_path / "rtm-cut.pt")
        with pytest.raises(UsageError, match="does not hold rtmdet-t's weights"):
            ly.LibreYoloDetector("rtmdet-t", str(tmp_path / "rtm-cut.pt"))


def test_fetch_uses_libreyolos_download_and_records_sha256(tmp_path, monkeypatch):
    """`fetch_weights` goes through libreyolo's own download (here from a server on 127.0.0.1 standing in for
    its hub: the URL libreyolo resolves the name to is redirected there)."""
    served = tmp_path / "served"
    served.mkdir()
    _saved_checkpoint(served / "LibreYOLOXn.pt", seed=2)
    handler = partial(SimpleHTTPRequestHandler, directory=str(served))
    handler.log_message = lambda *a, **k: None
    server = HTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_port}/LibreYOLOXn.pt"
        real = libreyolo.LibreYOLOX.get_download_url
        monkeypatch.setattr(libreyolo.LibreYOLOX, "get_download_url",
                            classmethod(lambda cls, name: url if real(name) else None))
        cache = tmp_path / "cache"
        path, sha = ly.fetch_weights("yolox-nano", cache)
    finally:
        server.shutdown()
    assert path == cache / "LibreYOLOXn.pt"
    assert sha == hashlib.sha256((served / "LibreYOLOXn.pt").read_bytes()).hexdigest()
    monkeypatch.setenv("VA_BENCH_WEIGHTS", str(cache))
    assert ly.LibreYoloDetector("yolox-nano").weights.sha256 == sha


# ------------------------------------------------------------------------------------------ what cannot run


class _NoRFDETR:
    """libreyolo as it is without `transformers`: its RF-DETR class cannot be imported."""

    __version__ = "1.6.0"

    def __getattr__(self, name):
        raise ModuleNotFoundError("RF-DETR support requires extra dependencies.\nInstall with: pip install "
                                  "libreyolo[rfdetr]")


def test_a_family_whose_dependency_is_missing_says_so_in_one_line(monkeypatch):
    monkeypatch.setattr(ly, "libreyolo_module", lambda: _NoRFDETR())
    with pytest.raises(UsageError) as err:
        ly.LibreYoloDetector("rfdetr-n", RANDOM_WEIGHTS)
    message = str(err.value)
    assert "\n" not in message and "rfdetr-n" in message and "RF-DETR support requires extra dependencies" in message


def test_without_libreyolo_the_models_say_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "libreyolo", None)  # import libreyolo -> ImportError
    with pytest.raises(UsageError, match=r"va-bench\[libreyolo\]"):
        ly.LibreYoloDetector("dfine-n", RANDOM_WEIGHTS)


# ------------------------------------------------------------------------------------------ registry


@requires_yolox
def test_yolox_ids_keep_the_onnx_family_for_onnx_weights():
    from harness.models.registry import get_detector
    from harness.models.yolox import YoloxDetector

    assert isinstance(get_detector("yolox-nano"), YoloxDetector)
    libre = get_detector("yolox-nano", RANDOM_WEIGHTS)
    assert isinstance(libre, ly.LibreYoloDetector) and libre.weights.source == RANDOM_WEIGHTS
    # one post-processing code path for both: the libreyolo core returns the official export's layout
    from harness.models.yolox import YoloxHeadDecoder

    assert isinstance(get_detector("yolox-nano").host_decoder, YoloxHeadDecoder)
    assert isinstance(libre.host_decoder._yolox, YoloxHeadDecoder)


def test_every_catalogue_id_is_registered_with_its_postprocessing_kind():
    from harness.models.registry import REGISTRY

    for model_id, model in ly.catalogue().items():
        entry = REGISTRY[model_id]
        assert entry.family == model.family.family
        if not model_id.startswith("yolox-"):
            assert entry.postprocess == model.postprocess.kind and model.family.licence in entry.note


# ------------------------------------------------------------------------------------------ new families


@requires_coco
@pytest.mark.slow
# the two slowest exports (yolov7-b ~30 s, lwdetr-t ~17 s here) run with the catalogue matrix (make test-slow)
@pytest.mark.parametrize("model_id", ["rtmdet-t", "yolov9e2e-t", pytest.param("yolov7-b", marks=pytest.mark.catalogue),
                                      "ppyoloe-s", pytest.param("lwdetr-t", marks=pytest.mark.catalogue), "yolov9t",
                                      "yolonas-s"])
def test_onnx_export_of_the_families_runs_at_batch_1_2_4(model_id, coco):
    """The core exported with a dynamic batch runs in ONNX Runtime and agrees with PyTorch at batch 1, 2 and 4
    (the backend's own check), and on real images. YOLOv9's anchor-grid cache broke the trace before its
    head's export flag was set: yolov9t is here for that; YOLO-NAS's head returns its decoded pair alone under a
    trace, which the core unpacked as (boxes, raw). The weights are
    `--weights random`'s, as a user's timing run has them; LW-DETR's are calibrated, because with raw random
    weights its encoder's top-k picks among near-tied proposals and ORT and PyTorch break the ties differently
    (relative difference 0.4)."""
    from harness.measure.device import parse_device
    from harness.pipeline.preprocess import decode_image, preprocess_batch

    det = calibrated(model_id, coco) if model_id == "lwdetr-t" else ly.LibreYoloDetector(model_id, RANDOM_WEIGHTS)
    device = parse_device("cpu")
    core = load_core_of(det, "onnxruntime", device, "fp32", det.preprocess.input_size)  # export + its own check
    batch, _ = preprocess_batch([decode_image(coco.record(i).path) for i in PARITY_IMAGES], det.preprocess)
    with torch.inference_mode():
        want = det.core_module(batch)
    got = core(batch)
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        scale = max(1.0, float(w.abs().max()))
        assert float((torch.as_tensor(g) - w).abs().max()) / scale <= 1e-3, model_id


@pytest.mark.skipif(not HAS_RFDETR, reason="libreyolo[rfdetr] not installed")
@pytest.mark.parametrize("model_id, outputs", [("rfdetr-n", 2), ("rfdetr-seg-n", 3)])
def test_rfdetr_exports_with_a_dynamic_batch(model_id, outputs):
    """RF-DETR's eval forward split the batch into a list of images, which the trace baked into a Split of the
    traced batch (ONNX Runtime refused batch 1); the core runs its export forward. Its values are not compared
    with PyTorch here: from scratch its query selection is chaotic (near-tied scores flip with the thread count)."""
    import onnxruntime as ort

    from harness.backends.export import export_core

    det = ly.LibreYoloDetector(model_id, RANDOM_WEIGHTS)
    size = (det.entry.input_size, det.entry.input_size)
    model, _ = export_core(model_id, det.core_module, size)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    queries = det.postprocess.max_det
    for batch in (1, 3):
        got = session.run(None, {session.get_inputs()[0].name: np.random.rand(batch, 3, *size).astype(np.float32)})
        assert len(got) == outputs and [o.shape[:2] for o in got] == [(batch, queries)] * outputs, model_id


def test_pending_families_validate_with_a_warning_not_an_error(tmp_path):
    """A submission of a family the site's matrix does not list yet: a warning naming it; an unknown id stays
    an error."""
    from harness.catalogue import pending_site_ids
    from harness.results.validate import validate_paths

    support = {"models": ["yolov9t"], "runtimes": []}
    doc = {"model": {"id": "rtmdet-t"}}
    (tmp_path / "a.json").write_text(json.dumps(doc))
    (tmp_path / "b.json").write_text(json.dumps({"model": {"id": "madeup-x"}}))
    reports = {r.path.name: r for r in validate_paths([tmp_path], support, None, pending_site_ids()).reports}
    pending = [f for f in reports["a.json"].findings if f.path == "model.id"]
    assert [(f.severity, f.rule) for f in pending] == [("warning", "pending-support-matrix")]
    assert "not on the site's support matrix yet" in pending[0].message
    assert any(f.path == "model.id" and f.severity == "error" for f in reports["b.json"].findings)


def test_models_list_filters_and_unavailable_families():
    from conftest import run_in_process

    rows = json.loads(run_in_process("models", "list", "--family", "rtmdet", "--json").stdout)
    assert [r["id"] for r in rows] == ["rtmdet-t", "rtmdet-s", "rtmdet-m", "rtmdet-l", "rtmdet-x"]
    for family, first in (("yolov9-e2e", "yolov9e2e-t"), ("yolov7", "yolov7-b"), ("ppyoloe", "ppyoloe-s"),
                          ("lwdetr", "lwdetr-t")):
        assert json.loads(run_in_process("models", "list", "--family", family, "--json").stdout)[0]["id"] == first
    damo = json.loads(run_in_process("models", "list", "--family", "damoyolo", "--json").stdout)
    assert len(damo) == 6 and all(not r["available"] and "not in libreyolo 1.6.0" in r["note"] for r in damo)
    segment = json.loads(run_in_process("models", "list", "--task", "segment", "--json").stdout)
    assert len(segment) == 13 + 10 and {r["task"] for r in segment} == {"segment"}  # libreyolo 13, Ultralytics 10
    refused = run_in_process("run", "--model", "damoyolo-s")
    assert refused.returncode == 2 and "damoyolo-s is not available: not in libreyolo 1.6.0" in refused.stderr


def test_a_checkpoint_libreyolo_pins_is_trusted_unread(tmp_path, monkeypatch):
    """PP-YOLOE's Deci checkpoints are pickles libreyolo verifies by checksum (`_CHECKPOINT_SHA256`, YOLO-NAS's
    `_DECI_CHECKPOINT_SHA256`): a file with a pinned checksum is let through without torch reading it."""
    marker = tmp_path / "unpickled"
    path = tmp_path / "ppyoloe_s_coco.pth"
    torch.save({"model": _Payload(marker)}, path)
    sha = hashlib.sha256(path.read_bytes()).hexdigest()
    assert not ly._trusted(libreyolo.LibrePPYOLOE, path, sha)
    monkeypatch.setattr(libreyolo.LibrePPYOLOE, "_CHECKPOINT_SHA256", {path.name: sha})
    assert ly._trusted(libreyolo.LibrePPYOLOE, path, sha) and not marker.exists()


RFDETR_IDS = ("rfdetr-n", "rfdetr-s", "rfdetr-m", "rfdetr-l", "rfdetr-seg-n", "rfdetr-seg-s", "rfdetr-seg-m",
              "rfdetr-seg-l")


@pytest.mark.skipif(not HAS_RFDETR, reason="libreyolo without RF-DETR")
@pytest.mark.catalogue
@pytest.mark.parametrize("model_id", RFDETR_IDS)
def test_an_rfdetr_models_size_rule_is_its_backbones_block(model_id):
    """RF-DETR's backbone takes sizes that are multiples of its patch x windows (libreyolo asserts it in the
    forward): the catalogue's rule for each id is that block, read from libreyolo's own model."""
    from libreyolo.models.rfdetr.imgsz import resolve_patch_window

    model = ly.catalogue()[model_id]
    wrapper = ly.libreyolo_class(model)._from_scratch(size=model.size, device="cpu", task=model.family.task, seed=0)
    patch, windows = resolve_patch_window(wrapper.model)
    assert model.size_multiple == patch * windows and model.input_size % model.size_multiple == 0


@pytest.mark.skipif(not HAS_RFDETR, reason="libreyolo without RF-DETR")
def test_an_input_size_the_rfdetr_seg_backbone_refuses_is_refused_when_planned(tmp_path):
    """rfdetr-seg-n at 320 passed the family's multiple-of-32 rule and failed inside the run ("Backbone requires
    input shape to be divisible by 12"); 336 (a multiple of 24, not of 32) was refused though seg-s takes it."""
    common = ("run", "--weights", "random", "--batch-sizes", "1", "--limit", "2", "--dry-run")
    refused = run_in_process(*common, "--model", "rfdetr-seg-n", "--input-size", "320")
    assert refused.returncode == 2 and "input size 320 is not a multiple of 12 (rfdetr-seg-n's" in refused.stderr
    assert run_in_process(*common, "--model", "rfdetr-seg-s", "--input-size", "336").returncode == 0


@pytest.mark.heavy
def test_rfdetr_away_from_its_native_size_exports_and_is_refused_for_what_differs(monkeypatch, tmp_path):
    """rfdetr-n at 416 (its native 384): the export failed inside the tracer ("Cannot insert a Tensor that requires
    grad as a constant": its library binds the position embedding's interpolation to the module it built, which the
    copy the export traces still calls). It exports now, and the check refuses it for a real difference: libreyolo
    interpolates the embedding with antialiasing in eager mode and without it under an ONNX export; with eager's
    antialiasing off the two agree (the independent reading of why)."""
    import onnxruntime

    from harness.backends.export import check_export, export_core
    from harness.detector.graph import max_relative_diff, module_outputs
    from harness.models.registry import get_detector

    module = get_detector("rfdetr-n", RANDOM_WEIGHTS).core_source.torch_module().eval()
    monkeypatch.setenv("VA_BENCH_WEIGHTS", str(tmp_path))
    _, path = export_core("rfdetr-n", module, (416, 416))
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])

    def core(x):
        return [torch.from_numpy(o) for o in session.run(None, {"images": x.numpy()})]

    with pytest.raises(UsageError, match="disagrees with PyTorch at batch 1"):
        check_export("rfdetr-n", module, core, (416, 416), None, batches=(1,))
    torch.manual_seed(0)
    x = torch.rand(1, 3, 416, 416)
    monkeypatch.setattr(torch.onnx, "is_in_onnx_export", lambda: True)  # eager without the antialiasing
    assert max_relative_diff(core(x), module_outputs(module, x)) < 1e-5
