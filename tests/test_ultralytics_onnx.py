"""Ultralytics-format ONNX families, with tiny exports of the right layouts built here (torch.onnx.export
of small modules; no Ultralytics code): the dense [B, 84, N] layout of yolov8/yolo11/yolov5u and the
NMS-free end-to-end [B, K, 6] layout of yolo26. Decoding and post-processing are checked against a
reference written here the way Ultralytics' validator does it, on real COCO images."""

import json
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from conftest import COCO_DIR, YOLOX_NANO, load_core_of, requires_coco, requires_yolox, run_in_process
from reference_resize import bilinear
from torch import nn
from torchvision.ops import batched_nms

from harness.backends import detector_backends
from harness.data.categories import COCO80_TO_91
from harness.data.coco import CocoDataset
from harness.errors import UsageError
from harness.measure.device import parse_device
from harness.models.registry import get_detector
from harness.models.ultralytics_onnx import MAX_NMS
from harness.pipeline.pipeline import DetectorPipeline, Thresholds
from harness.pipeline.preprocess import decode_image, preprocess_batch
from harness.pipeline.stage_timer import StageTimer

SIZE = 320
STRIDE = 16
# The tiny models score every class of every anchor above the validator's conf 0.001 (32000 candidates an image,
# ~1 s of NMS each). Greedy NMS decides a box by the boxes scoring above it only, so at a higher conf the best
# max_det detections are those at 0.001 as long as max_det of them are kept: tests that compare two implementations
# of the same post-processing use QUICK_CONF and check that the cap is still reached. The validator-reference test
# keeps 0.001 (it also exercises the pre-NMS cap of MAX_NMS candidates).
QUICK_CONF = 0.05


class TinyDense(nn.Module):
    """[B, 4 + 80, N] like a YOLOv8 export: cx, cy, w, h in input pixels, then sigmoid class scores."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.conv = nn.Conv2d(3, 84, kernel_size=STRIDE, stride=STRIDE)
        nn.init.normal_(self.conv.weight, std=0.02)
        side = SIZE // STRIDE
        ys, xs = torch.meshgrid(torch.arange(side), torch.arange(side), indexing="ij")
        self.register_buffer("grid", torch.stack((xs, ys)).reshape(1, 2, -1).float())
        # a different offset per anchor: the flat padding would otherwise give many anchors exactly equal
        # scores, and which of exactly tied boxes NMS keeps is arbitrary
        self.register_buffer("offset", torch.linspace(0, 1, side * side).reshape(1, 1, -1))

    def forward(self, x):
        y = self.conv(x).reshape(x.shape[0], 84, -1)  # traced at batch 1: Reshape [1, 84, -1], as Ultralytics'
        xy = (self.grid + torch.sigmoid(y[:, 0:2])) * STRIDE
        wh = torch.exp(y[:, 2:4].clamp(-8, 3)) * STRIDE * 2
        return torch.cat((xy, wh, torch.sigmoid(y[:, 4:] * 4 - 4 + self.offset)), dim=1)


class TinyEnd2End(TinyDense):
    """[B, K, 6] like a YOLO26 end-to-end export: x1, y1, x2, y2, score, class of the K best anchors."""

    K = 50

    def forward(self, x):
        dense = super().forward(x).transpose(1, 2)
        scores, labels = dense[..., 4:].max(dim=-1)
        top, index = scores.topk(self.K, dim=1)
        rows = torch.gather(dense[..., :4], 1, index[..., None].expand(-1, -1, 4))
        xyxy = torch.cat((rows[..., :2] - rows[..., 2:] / 2, rows[..., :2] + rows[..., 2:] / 2), dim=-1)
        return torch.cat((xyxy, top[..., None], torch.gather(labels, 1, index)[..., None].float()), dim=-1)


def _export(module: nn.Module, path, dynamic: bool):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), (torch.rand(1, 3, SIZE, SIZE),), str(path), input_names=["images"],
                          output_names=["output0"], opset_version=17, dynamo=False,
                          dynamic_axes={"images": {0: "batch"}, "output0": {0: "batch"}} if dynamic else None)
    return path


@pytest.fixture(scope="module")
def dense_onnx(tmp_path_factory):
    """Static batch 1 and fixed size, as Ultralytics exports by default."""
    return _export(TinyDense(), tmp_path_factory.mktemp("ul") / "yolov8n.onnx", dynamic=False)


@pytest.fixture(scope="module")
def end2end_onnx(tmp_path_factory):
    return _export(TinyEnd2End(), tmp_path_factory.mktemp("ul") / "yolo26n.onnx", dynamic=True)


@pytest.fixture(scope="module")
def images():
    dataset = CocoDataset(str(COCO_DIR))
    records = dataset.records(dataset.variant("sample"))[:6]
    return records, [decode_image(r.path) for r in records]


def _reference_letterbox(image: np.ndarray, size: int = SIZE) -> tuple[np.ndarray, float, tuple[int, int]]:
    """Ultralytics' validation transform, written out from its data/base.py load_image (8.3.x): long side to SIZE
    (ceil; cv2 INTER_LINEAR whether it shrinks or enlarges), centre pad 114, RGB, /255."""
    import cv2

    h0, w0 = image.shape[:2]
    r = size / max(h0, w0)
    if r != 1:
        resized = (min(int(np.ceil(w0 * r)), size), min(int(np.ceil(h0 * r)), size))
        image = cv2.resize(image, resized, interpolation=cv2.INTER_LINEAR)
    h, w = image.shape[:2]
    dh, dw = (size - h) / 2, (size - w) / 2
    top, left = int(round(dh - 0.1)), int(round(dw - 0.1))
    canvas = np.full((size, size, 3), 114, np.uint8)
    canvas[top:top + h, left:left + w] = image
    return canvas[:, :, ::-1].transpose(2, 0, 1).astype(np.float32) / 255, r, (left, top)


def _reference_detections(path, image, conf=0.001, iou=0.7, max_det=300, end2end=False):
    """Run the ONNX file itself (ONNX Runtime, batch 1) and post-process it the validator's way."""
    x, r, (left, top) = _reference_letterbox(image)
    out = torch.from_numpy(ort.InferenceSession(str(path)).run(None, {"images": x[None]})[0][0])
    if end2end:
        keep = out[:, 4] > conf
        boxes, scores, labels = out[keep, :4], out[keep, 4], out[keep, 5].long()
        order = scores.argsort(descending=True)[:max_det]
        boxes, scores, labels = boxes[order], scores[order], labels[order]
    else:
        pred = out.T  # [N, 84]
        xyxy = torch.cat((pred[:, :2] - pred[:, 2:4] / 2, pred[:, :2] + pred[:, 2:4] / 2), dim=1)
        i, j = torch.where(pred[:, 4:] > conf)  # multi-label
        boxes, scores, labels = xyxy[i], pred[i, 4 + j], j
        order = scores.argsort(descending=True)[:MAX_NMS]
        boxes, scores, labels = boxes[order], scores[order], labels[order]
        keep = batched_nms(boxes, scores, labels, iou)[:max_det]
        boxes, scores, labels = boxes[keep], scores[keep], labels[keep]
    boxes = (boxes - torch.tensor([left, top, left, top])) / r
    h0, w0 = image.shape[:2]
    boxes = torch.stack((boxes[:, 0].clamp(0, w0), boxes[:, 1].clamp(0, h0), boxes[:, 2].clamp(0, w0),
                         boxes[:, 3].clamp(0, h0)), dim=1)
    return boxes.numpy(), scores.numpy(), labels.numpy()


def _unmatched(ours, reference, box_tol=1e-2, score_tol=1e-5) -> int:
    """Reference detections with no detection of ours of the same class, score and box (one-to-one);
    order-free, since the order of equal scores is arbitrary."""
    boxes, scores, labels = ours
    free = np.ones(len(scores), dtype=bool)
    missing = 0
    for box, score, label in zip(*reference, strict=True):
        hit = free & (labels == label) & (np.abs(scores - score) <= score_tol) & \
            (np.abs(boxes - box).max(axis=1) <= box_tol)
        if hit.any():
            free[np.argmax(hit)] = False
        else:
            missing += 1
    return missing


def _pipeline(detector, backend="onnxruntime", conf=None):
    device = parse_device("cpu")
    core = load_core_of(detector, backend, device, "fp32", detector.preprocess.input_size)
    d = detector.postprocess
    return DetectorPipeline(detector, core, device, detector.preprocess,
                            Thresholds(d.conf if conf is None else conf, d.iou, d.max_det))


def test_preprocessing_is_ultralytics_validation_transform(dense_onnx, images):
    _, imgs = images
    detector = get_detector("yolov8n", str(dense_onnx))
    for size in (SIZE, 416):  # 640 -> 320 is an exact halving, which INTER_AREA and INTER_LINEAR agree on; 416 is not
        batch, transforms = preprocess_batch(imgs, detector.preprocess.with_input_size(size))
        for image, got, t in zip(imgs, batch, transforms, strict=True):
            want, r, pad = _reference_letterbox(image, size)
            assert np.array_equal(np.rint(got.numpy() * 255), np.rint(want * 255)), size  # x/255 vs x*(1/255)
            assert t.ratio == (r, r) and t.pad == pad


@requires_coco
@pytest.mark.parametrize("layout", ["dense", "end2end"])
def test_detections_match_the_validator_reference(layout, dense_onnx, end2end_onnx, images):
    """Batch of 6 through the pipeline = each image alone through ORT + the reference post-processing."""
    records, imgs = images
    path, model_id = (dense_onnx, "yolov8n") if layout == "dense" else (end2end_onnx, "yolo26n")
    detector = get_detector(model_id, str(path))
    assert detector.layout == layout
    assert detector.postprocess.kind == ("nms" if layout == "dense" else "topk")
    ours = _pipeline(detector).run_batch(records, StageTimer(parse_device("cpu")), images=imgs)
    total = 0
    for det, image in zip(ours, imgs, strict=True):
        boxes, scores, labels = _reference_detections(path, image, end2end=layout == "end2end")
        total += len(scores)
        assert len(det.scores) == len(scores)
        assert _unmatched((det.boxes, det.scores, det.labels), (boxes, scores, labels)) == 0
    assert total >= 6 * 20  # enough detections for the comparison to mean something


def test_static_export_gets_a_dynamic_batch_checked_per_row(dense_onnx):
    detector = get_detector("yolov8n", str(dense_onnx))
    dims = detector._raw_model.graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_value == 1  # the file is batch-1 static, as Ultralytics exports by default
    core = load_core_of(detector, "onnxruntime", parse_device("cpu"), "fp32", (SIZE, SIZE))
    x = torch.rand(3, 3, SIZE, SIZE)
    together = core(x)[0]
    alone = torch.cat([core(x[i:i + 1])[0] for i in range(3)])
    torch.testing.assert_close(together, alone, rtol=1e-5, atol=1e-5)
    with pytest.raises(UsageError, match="runs at that size only"):
        load_core_of(detector, "onnxruntime", parse_device("cpu"), "fp32", (640, 640))


def test_pytorch_backend_runs_the_export_through_onnx2torch(dense_onnx, images):
    records, imgs = images
    detector = get_detector("yolov8n", str(dense_onnx))
    assert detector_backends(detector)[:2] == ("pytorch", "onnxruntime")
    timer = StageTimer(parse_device("cpu"))
    ort_dets = _pipeline(detector, conf=QUICK_CONF).run_batch(records, timer, images=imgs)
    converted = _pipeline(detector, "pytorch", conf=QUICK_CONF)
    torch_dets = converted.run_batch(records, timer, images=imgs)
    assert converted.core.info()["conversion"]["converter"] == "onnx2torch"  # said in the summary and the record
    # max_det kept on every image: the detections at conf 0.001 (see QUICK_CONF)
    assert [len(d.scores) for d in ort_dets] == [detector.postprocess.max_det] * len(records)
    for a, b in zip(ort_dets, torch_dets, strict=True):
        np.testing.assert_allclose(a.boxes, b.boxes, atol=1e-2)
        assert np.array_equal(a.labels, b.labels)


@pytest.mark.parametrize("export", ["dense_onnx", "end2end_onnx"])
def test_host_processes_decode_the_export_as_the_run_does(export, images, request):
    # the family's host decoder in a host process, on the raw outputs in shared memory: the run's detections
    records, _ = images
    model_id = "yolo26n" if export == "end2end_onnx" else "yolov8n"
    detector = get_detector(model_id, str(request.getfixturevalue(export)))
    device = parse_device("cpu")
    core = load_core_of(detector, "onnxruntime", device, "fp32", detector.preprocess.input_size)
    d = detector.postprocess
    runs = []
    for processes in (0, 1):
        pipeline = DetectorPipeline(detector, core, device, detector.preprocess, Thresholds(0.05, d.iou, d.max_det),
                                    host_processes=processes)  # conf: fewer of the tiny model's boxes to suppress
        assert pipeline.decode_runs_in_host_processes == bool(processes)
        runs.append([d for out in pipeline.run_stream([records[:3], records[3:]], StageTimer(device), overlap=True)
                     for d in out])
    assert sum(len(d.scores) for d in runs[1]) > 0
    for a, b in zip(*runs, strict=True):
        assert a.image_id == b.image_id and a.boxes.tobytes() == b.boxes.tobytes()
        assert a.scores.tobytes() == b.scores.tobytes() and a.labels.tobytes() == b.labels.tobytes()


def test_bad_files_are_one_line_errors(tmp_path):
    with pytest.raises(UsageError, match="no such file"):
        get_detector("yolov8n", str(tmp_path / "missing.onnx"))
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"\x00not onnx")
    with pytest.raises(UsageError, match="not a readable ONNX"):
        get_detector("yolo11s", str(garbage))
    wrong = _export(nn.Conv2d(3, 8, 3), tmp_path / "conv.onnx", dynamic=True)  # [B, 8, H, W]: no such layout
    with pytest.raises(UsageError, match="Ultralytics-format"):
        get_detector("yolov5nu", str(wrong))
    with pytest.raises(UsageError, match="torch-defined"):
        get_detector("yolov8n", "random")


@requires_coco
def test_run_end_to_end_through_the_cli(dense_onnx, tmp_path):
    """`va-bench run --model yolov8n --weights FILE.onnx`: a submission per batch size, its detections
    equal to the reference on every image."""
    out = tmp_path / "outputs"
    result = run_in_process(
        "run", "--model", "yolov8n", "--weights", str(dense_onnx), "--backend", "onnxruntime", "--batch-sizes", "1",
        "2", "--subset", "sample", "--limit", "4", "--coco-dir", str(COCO_DIR), "--output-dir", str(out), "--run-id",
        "ul", "--warmup-batches", "1", "--warmup-seconds", "0", "--min-timed-batches", "2", "--no-layers",
        "--no-profile", "--no-energy", "--conf", str(QUICK_CONF))
    assert result.returncode == 0, result.stderr[-2000:]
    run_dir = out / "ul"
    submissions = sorted((run_dir / "submissions").glob("*.json"))
    assert len(submissions) == 2
    doc = json.loads(submissions[0].read_text())
    assert doc["model"]["id"] == "yolov8n" and doc["model"]["weights"] == dense_onnx.name
    assert doc["runtime"]["format"] == "onnx" and doc["config"]["iou"] == 0.7 and doc["config"]["conf"] == QUICK_CONF
    detections = json.loads(next((run_dir / "detections").glob("*.json")).read_text())
    dataset = CocoDataset(str(COCO_DIR))
    for record in dataset.records(dataset.variant("sample"))[:4]:
        boxes, scores, labels = _reference_detections(dense_onnx, decode_image(record.path), conf=QUICK_CONF)
        mine = [d for d in detections if d["image_id"] == record.image_id]
        assert len(mine) == len(scores) == 300  # max_det reached: the detections at conf 0.001 (see QUICK_CONF)
        assert sorted(d["category_id"] for d in mine) == sorted(COCO80_TO_91[k] for k in labels)
        assert sorted(d["score"] for d in mine) == pytest.approx(sorted(scores.tolist()), abs=1e-5)


def test_exported_graph_is_left_untouched_on_disk(dense_onnx):
    before = dense_onnx.read_bytes()
    get_detector("yolov8n", str(dense_onnx)).onnx_model  # noqa: B018 (builds the rewritten copy)
    assert dense_onnx.read_bytes() == before
    assert onnx.load(str(dense_onnx)).graph.input[0].type.tensor_type.shape.dim[0].dim_value == 1


# ------------------------------------------------------------------------------------------ segmentation

PROTOTYPES = 8
SEG_MAX_DET = 100  # detections per image the mask comparison covers (the reference's masks are float64)


class TinySeg(TinyDense):
    """Like a YOLOv8-seg export: [B, 4 + 80 + P, N] (the dense rows plus P mask coefficients per anchor) and
    prototypes [B, P, SIZE / 4, SIZE / 4]."""

    def __init__(self):
        super().__init__()
        self.coefficients = nn.Conv2d(3, PROTOTYPES, kernel_size=STRIDE, stride=STRIDE)
        self.prototypes = nn.Conv2d(3, PROTOTYPES, kernel_size=4, stride=4)
        nn.init.normal_(self.coefficients.weight, std=0.5)
        nn.init.normal_(self.prototypes.weight, std=0.5)

    def forward(self, x):
        coefficients = self.coefficients(x).reshape(x.shape[0], PROTOTYPES, -1)
        return torch.cat((super().forward(x), coefficients), dim=1), torch.tanh(self.prototypes(x - 0.5) * 4)


def _reference_masks(path, image, conf=0.001) -> tuple[tuple, np.ndarray]:
    """The validator-style detections of the export (ONNX Runtime, batch 1) and each one's mask, in numpy:
    sigmoid(coefficients @ prototypes), to the input size, zero outside its box, the padding cropped, to the
    source size, on at >= 0.5."""
    x, r, (left, top) = _reference_letterbox(image)
    rows, prototypes = ort.InferenceSession(str(path)).run(None, {"images": x[None]})
    pred = torch.from_numpy(rows[0]).T  # [N, 84 + P]
    xyxy = torch.cat((pred[:, :2] - pred[:, 2:4] / 2, pred[:, :2] + pred[:, 2:4] / 2), dim=1)
    i, j = torch.where(pred[:, 4:84] > conf)
    boxes, scores, labels = xyxy[i], pred[i, 4 + j], j
    order = scores.argsort(descending=True)[:MAX_NMS]
    keep = order[batched_nms(boxes[order], scores[order], labels[order], 0.7)[:SEG_MAX_DET]]
    input_boxes = boxes[keep].numpy().astype(np.float64)
    coefficients = pred[i[keep], 84:].numpy().astype(np.float64)
    protos = prototypes[0].astype(np.float64)
    masks = 1 / (1 + np.exp(-(coefficients @ protos.reshape(PROTOTYPES, -1)))).reshape(-1, *protos.shape[1:])
    masks = bilinear(masks, (SIZE, SIZE))
    ys, xs = np.arange(SIZE)[None, :, None], np.arange(SIZE)[None, None, :]
    b = input_boxes[:, :, None, None]
    masks *= (xs >= b[:, 0]) & (xs < b[:, 2]) & (ys >= b[:, 1]) & (ys < b[:, 3])
    h0, w0 = image.shape[:2]
    h, w = min(int(np.ceil(h0 * r)), SIZE), min(int(np.ceil(w0 * r)), SIZE)  # the image as placed (ceil, as above)
    masks = bilinear(masks[:, top:top + h, left:left + w], (h0, w0)) >= 0.5
    source = (input_boxes - [left, top, left, top]) / r
    source = np.clip(source, 0, [w0, h0, w0, h0])
    return (source, scores[keep].numpy(), labels[keep].numpy()), masks


@pytest.fixture(scope="module")
def seg_onnx(tmp_path_factory):
    path = tmp_path_factory.mktemp("ul") / "yolov8n-seg.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(TinySeg().eval(), (torch.rand(1, 3, SIZE, SIZE),), str(path), input_names=["images"],
                          output_names=["output0", "output1"], opset_version=17, dynamo=False)
    return path


@requires_coco
@pytest.mark.parametrize("backend", ["onnxruntime", pytest.param("pytorch", marks=pytest.mark.heavy)])
def test_segmentation_export_masks_match_a_numpy_reference(seg_onnx, images, backend):
    """An Ultralytics-format -seg export (static batch 1, as exported by default) at batch 3 on real images of
    several aspect ratios (letterboxed: the padding is cropped): every detection of the validator-style reference
    is ours (class, score, box), and its mask is ours at IoU >= 0.99 for >= 99 % of them."""
    from pycocotools import mask as mask_utils

    detector = get_detector("yolov8n-seg", str(seg_onnx))
    assert detector.task == "segment" and detector.coefficients == PROTOTYPES
    records, decoded = images
    pipeline = _pipeline(detector, backend)
    pipeline.thresholds = Thresholds(QUICK_CONF, 0.7, SEG_MAX_DET)
    ours = pipeline.run_batch(records[:3], StageTimer(parse_device("cpu")))
    agree = total = nonempty = 0
    for det, image in zip(ours, decoded[:3], strict=True):
        (boxes, scores, labels), masks = _reference_masks(seg_onnx, image, conf=QUICK_CONF)
        assert len(scores) == SEG_MAX_DET  # the cap reached: the detections at conf 0.001 (see QUICK_CONF)
        assert len(det.masks) == len(det.scores) > 30 and _unmatched((det.boxes, det.scores, det.labels),
                                                                      (boxes, scores, labels)) == 0
        assert {tuple(m["size"]) for m in det.masks} == {image.shape[:2]}
        for box, score, label, mask in zip(boxes, scores, labels, masks, strict=True):
            k = np.flatnonzero((det.labels == label) & (np.abs(det.scores - score) <= 1e-5)
                               & (np.abs(det.boxes - box).max(axis=1) <= 1e-2))[0]
            theirs = mask_utils.encode(np.asfortranarray(mask.astype(np.uint8)))
            iou = mask_utils.iou([det.masks[k]], [theirs], [0])[0][0]
            agree += iou >= 0.99 or (mask.sum() == 0 and mask_utils.area(det.masks[k]) == 0)
            total += 1
            nonempty += mask.sum() > 0
    assert agree >= 0.99 * total and total > 100 and nonempty > total // 2, (agree, total, nonempty)


@requires_coco
def test_no_masks_holds_in_the_extra_passes(seg_onnx, images, tmp_path):
    """With --no-masks the profile pass (and every pass copied from the row's pipeline) does the row's own work:
    boxes only, no mask resizes in the profile of a segmentation export."""
    from harness.run.executor import profile_pass

    detector = get_detector("yolov8n-seg", str(seg_onnx))
    with_masks = _pipeline(detector)
    d = detector.postprocess
    # the ops are what is looked at, not the thresholds: a few detections (and masks) an image are enough
    with_masks.thresholds = Thresholds(QUICK_CONF, d.iou, 20)
    boxes_only = DetectorPipeline(detector, with_masks.core, parse_device("cpu"), detector.preprocess,
                                  Thresholds(QUICK_CONF, d.iou, 20), masks=False, nms_on="host")
    copied = boxes_only.copy_with(host_workers=1, host_thread=False)
    assert (copied.masks, copied.nms_threads, copied.host_thread, copied.core) == (False, 1, None, boxes_only.core)
    records = images[0][:2]
    ops = {pipeline: {row["name"] for row in profile_pass(pipeline, [records], tmp_path / f"{i}.json").ops}
           for i, pipeline in enumerate((with_masks, boxes_only))}
    assert "aten::upsample_bilinear2d" in ops[with_masks] and "aten::upsample_bilinear2d" not in ops[boxes_only]


def test_a_segmentation_export_under_a_detection_id_is_one_line(seg_onnx, dense_onnx):
    with pytest.raises(UsageError, match="segmentation export; run it as --model yolov8n-seg"):
        get_detector("yolov8n", str(seg_onnx))
    with pytest.raises(UsageError, match="detection export; run it as --model yolov8n$"):
        get_detector("yolov8n-seg", str(dense_onnx))


class TinyThreeClasses(TinyDense):
    """A fine-tuned export: [B, 4 + 3, N]."""

    def forward(self, x):
        return super().forward(x)[:, :7]


def _with_names(path, names: str | None):
    model = onnx.load(str(path))
    if names is not None:
        model.metadata_props.add(key="names", value=names)
    onnx.save(model, str(path))
    return path


@requires_coco
def test_a_fine_tuned_export_brings_its_own_classes(tmp_path):
    """The class count comes from the output shape and the names from the export's metadata (a dict literal, read
    as one): such a model is matched to a dataset by name, never as COCO's 80; names that are code or that do
    not cover the classes are one line."""
    from test_datasets_custom import RENUMBERED, _three_class_dataset

    from harness.data.classes import model_class_names

    named = _with_names(_export(TinyThreeClasses(), tmp_path / "named.onnx", dynamic=True),
                        "{0: 'dog', 1: 'person', 2: 'car'}")
    detector = get_detector("yolov8n", str(named))
    assert model_class_names(detector) == ("dog", "person", "car") and detector.class_map == (0, 1, 2)
    unnamed = get_detector("yolov8n", str(_export(TinyThreeClasses(), tmp_path / "plain.onnx", dynamic=True)))
    assert model_class_names(unnamed) == ("class_0", "class_1", "class_2")
    for bad, why in (("__import__('os').system('true')", "not a {index: name} literal"),
                     ("{0: 'dog', 1: 'person'}", "does not name classes 0..2"),
                     ("{0: 'dog', 'x': 'person', 2: 'car'}", "does not name classes 0..2"),
                     ("{0: 'dog', 1.0: 'person', 2: 'car'}", "does not name classes 0..2")):
        path = _with_names(_export(TinyThreeClasses(), tmp_path / "bad.onnx", dynamic=True), bad)
        with pytest.raises(UsageError, match=why):
            get_detector("yolov8n", str(path))
    # the metadata names the classes whatever the layout and count: an end-to-end export's and an 80-class one's
    # own names are theirs, not COCO's; COCO's 80 names in COCO's order are COCO's classes
    end2end = _with_names(_export(TinyEnd2End(), tmp_path / "e2e.onnx", dynamic=True),
                          "{0: 'car', 1: 'dog', 2: 'person'}")
    assert model_class_names(get_detector("yolo26n", str(end2end))) == ("car", "dog", "person")
    widgets = str({i: f"widget{i}" for i in range(80)})
    eighty = get_detector("yolov8n", str(_with_names(_export(TinyDense(), tmp_path / "w.onnx", dynamic=True), widgets)))
    assert model_class_names(eighty)[:2] == ("widget0", "widget1") and eighty.class_map == tuple(range(80))
    from harness.data.categories import COCO80_TO_91, COCO_NAMES_BY_ID

    coco_names = str({i: COCO_NAMES_BY_ID[c] for i, c in enumerate(COCO80_TO_91)})
    coco_export = _with_names(_export(TinyDense(), tmp_path / "c.onnx", dynamic=True), coco_names)
    coco = get_detector("yolov8n", str(coco_export))
    assert coco.class_map == COCO80_TO_91 and not hasattr(coco, "class_names")
    annotation = _three_class_dataset(tmp_path / "data")
    out = tmp_path / "out"
    result = run_in_process("run", "--model", "yolov8n", "--weights", str(named), "--dataset", str(annotation),
                            "--batch-sizes", "2", "--warmup-batches", "1", "--warmup-seconds", "0",
                            "--min-timed-batches", "2", "--no-energy", "--draw-images", "0", "--output-dir", str(out))
    assert result.returncode == 0, result.stderr
    detections = json.loads(next(out.glob("*/detections/*.json")).read_text())
    assert detections and {d["category_id"] for d in detections} <= set(RENUMBERED.values())


@requires_yolox
@pytest.mark.parametrize("model_id", ["yolov8n", "yolov8n-seg"])
def test_another_familys_export_given_as_an_ultralytics_id_is_named_so(model_id):
    """YOLOX-Nano's ONNX ([1, 3549, 85]) run as yolov8n read as an export of 3545 classes (and advised a class
    map), and as yolov8n-seg as "an Ultralytics detection export": its rows are anchors, not a box's values."""
    with pytest.raises(UsageError, match=r"its output \[1, 3549, 85\] holds 3549 rows of 85 values, one row per "
                                         r"anchor, which is not an Ultralytics export"):
        get_detector(model_id, str(YOLOX_NANO))


def test_an_export_of_few_anchors_is_still_read_as_ultralytics(tmp_path):
    """A genuine [1, 84, 21] export (imgsz 32: 16 + 4 + 1 anchors, fewer than its 84 values) is Ultralytics'
    layout: only a graph whose rows are its input size's anchors is another family's."""
    from onnx import TensorProto, helper, numpy_helper

    def export(size: int, shape: list[int], name: str):
        out = helper.make_node("Constant", [], ["output0"],
                               value=numpy_helper.from_array(np.zeros(shape, dtype=np.float32)))
        graph = helper.make_graph([out], "g", [helper.make_tensor_value_info("images", TensorProto.FLOAT,
                                                                            [1, 3, size, size])],
                                  [helper.make_tensor_value_info("output0", TensorProto.FLOAT, shape)])
        path = tmp_path / name
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
        return path

    few = get_detector("yolov8n", str(export(32, [1, 84, 21], "few.onnx")))
    assert few.layout == "dense" and few.fixed_size == (32, 32)
    with pytest.raises(UsageError, match=r"holds 21 rows of 84 values, one row per anchor"):
        get_detector("yolov8n", str(export(32, [1, 21, 84], "rows.onnx")))
