"""torchvision detectors on the shared pipeline: parity with torchvision's own `model.eval()` output.

Offline there are no pretrained weights, so the models carry `--weights random` weights (seeded, with
BatchNorm statistics that keep activations alive, so they do detect). torchvision's own forward runs
its own transform configured to the harness's geometry (min_size = max_size = S, size_divisible = S:
see harness/models/torchvision_family.py) on the same real COCO images."""

from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import COCO_DIR, load_core_of, requires_coco

from harness.backends import detector_backends
from harness.data.coco import CocoDataset
from harness.detector.protocol import PostprocessSpec
from harness.errors import UsageError
from harness.eval.matching import match_detections
from harness.measure.device import parse_device
from harness.models.registry import get_detector
from harness.models.torchvision_family import MODELS, TorchvisionDetector
from harness.pipeline.pipeline import DetectorPipeline, Thresholds
from harness.pipeline.preprocess import decode_image
from harness.pipeline.stage_timer import StageTimer
from harness.records import ImageDetections

pytestmark = requires_coco

# small inputs keep the ResNet-50 models affordable on 2 cores; 128 = RetinaNet's coarsest stride
SIZES = {"ssdlite320_mobilenet_v3_large": 320, "fasterrcnn_mobilenet_v3_large_320_fpn": 320,
         "retinanet_resnet50_fpn_v2": 256, "fcos_resnet50_fpn": 256}


@pytest.fixture(scope="module")
def records():
    dataset = CocoDataset(str(COCO_DIR))
    return dataset.records(dataset.variant("sample"))[:4]


def _torchvision_own(detector: TorchvisionDetector, size: int, images: list[np.ndarray],
                     image_ids: list[int]) -> list[ImageDetections]:
    """torchvision's own eval forward (its transform, network, post-processing) on the images."""
    model = detector.model
    transform = model.transform
    transform.min_size, transform.max_size = (size,), size
    if transform.fixed_size is not None:
        transform.fixed_size = (size, size)
    else:
        transform.size_divisible = size
    tensors = [torch.from_numpy(img[:, :, ::-1].copy()).permute(2, 0, 1).float() / 255 for img in images]
    with torch.no_grad():
        outputs = model.eval()(tensors)
    return [ImageDetections(i, o["boxes"].numpy(), o["scores"].numpy(), o["labels"].numpy())
            for i, o in zip(image_ids, outputs, strict=True)]


def _ours(detector: TorchvisionDetector, size: int, records, images, backend="pytorch") -> list[ImageDetections]:
    device = parse_device("cpu")
    spec = detector.preprocess.with_input_size(size)
    core = load_core_of(detector, backend, device, "fp32", spec.input_size)
    d = detector.postprocess
    pipeline = DetectorPipeline(detector, core, device, spec, Thresholds(d.conf, d.iou, d.max_det))
    return pipeline.run_batch(records, StageTimer(device), images=images)


def _padded(detections: list[ImageDetections]) -> list[ImageDetections]:
    """Every box grown by 1 px right and down, in both sets alike: random weights put many boxes in the
    letterbox padding, which clipping flattens to zero height, and IoU is undefined for zero-area boxes."""
    return [ImageDetections(d.image_id, d.boxes + np.array([0, 0, 1, 1], dtype=d.boxes.dtype), d.scores, d.labels)
            for d in detections]


@pytest.mark.parametrize("name", list(MODELS))
def test_parity_with_torchvision_own_output(name, records):
    """Our pipeline against torchvision's own eval forward, both on one torch thread: with random weights
    torchvision's output moves with its thread count more than the tolerance (fasterrcnn_mobilenet, 4 images:
    its own 1-thread and 2-thread outputs match 98.5 % at IoU 0.99), so the comparison pins it, whatever thread
    count the tests before left behind."""
    detector = TorchvisionDetector(name, "random")
    size = SIZES[name]
    images = [decode_image(r.path) for r in records]
    ids = [r.image_id for r in records]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        ours = _ours(detector, size, records, images)
        theirs = _torchvision_own(detector, size, images, ids)
    finally:
        torch.set_num_threads(threads)
    report = match_detections(_padded(theirs), _padded(ours), iou_threshold=0.99, score_tolerance=1e-3)
    assert report.detections_a >= 20, f"{name}: too few detections to compare ({report.to_dict()})"
    assert report.match_rate >= 0.99, report.to_dict()


def test_postprocess_defaults_are_torchvision_own():
    """Each family's thresholds are the values torchvision's own model carries."""
    for name, config in MODELS.items():
        from torchvision.models import detection

        model = getattr(detection, name)(weights=None, weights_backbone=None)
        post = config.postprocess
        if config.kind == "fasterrcnn":
            own = (model.roi_heads.score_thresh, model.roi_heads.nms_thresh, model.roi_heads.detections_per_img)
        else:
            own = (model.score_thresh, model.nms_thresh, model.detections_per_img)
            assert config.topk_candidates == model.topk_candidates
        assert (post.conf, post.iou, post.max_det) == pytest.approx(own), name
        assert tuple(model.transform.image_mean) == pytest.approx(config.mean)
        assert tuple(model.transform.image_std) == pytest.approx(config.std)
        assert post.kind == "nms" and post.multi_label and post.clip_before_nms


def test_random_weights_are_seeded_and_labelled():
    a = get_detector("ssdlite320_mobilenet_v3_large", "random")
    b = get_detector("ssdlite320_mobilenet_v3_large", "random")
    assert a.weights.file == a.weights.source == "random"
    for (name, x), (_, y) in zip(a.model.state_dict().items(), b.model.state_dict().items(), strict=True):
        assert torch.equal(x, y), name


def test_state_dict_weights_and_bad_files(tmp_path):
    good = tmp_path / "ssdlite.pth"
    source = TorchvisionDetector("ssdlite320_mobilenet_v3_large", "random")
    torch.save(source.model.state_dict(), good)
    loaded = TorchvisionDetector("ssdlite320_mobilenet_v3_large", str(good))
    assert loaded.weights.source == "--weights" and len(loaded.weights.sha256) == 64
    x = next(iter(source.model.state_dict().values()))
    assert torch.equal(next(iter(loaded.model.state_dict().values())), x)
    bad = tmp_path / "bad.pth"
    bad.write_bytes(b"not a checkpoint")
    with pytest.raises(UsageError, match="not a state_dict"):
        TorchvisionDetector("ssdlite320_mobilenet_v3_large", str(bad))


def test_parameter_counts_are_torchvisions_however_the_weights_came(tmp_path):
    """torchvision's weighted build freezes the backbone's BatchNorm (buffers, not parameters): a random or
    state_dict build has the same layers, so `num_params` (torchvision's own metadata) is met either way."""
    from torchvision.models import get_model_weights

    name = "fasterrcnn_mobilenet_v3_large_320_fpn"
    published = get_model_weights(name).DEFAULT.meta["num_params"]
    random = TorchvisionDetector(name, "random")
    assert sum(p.numel() for p in random.model.parameters()) == published == 19_386_354
    path = tmp_path / "frcnn.pth"
    torch.save(random.model.state_dict(), path)
    loaded = TorchvisionDetector(name, str(path))
    assert sum(p.numel() for p in loaded.model.parameters()) == published
    for (key, x), (_, y) in zip(random.model.state_dict().items(), loaded.model.state_dict().items(), strict=True):
        assert torch.equal(x, y), key
    # a state_dict of an unfrozen build (a user's own training) loads too: the same statistics and affine
    from torchvision.models import detection

    plain = tmp_path / "plain.pth"
    torch.save(detection.fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None).state_dict(),
               plain)
    assert sum(p.numel() for p in TorchvisionDetector(name, str(plain)).model.parameters()) == published


def test_torchvision_cache_is_used_for_official_weights(tmp_path, monkeypatch):
    """No --weights: torchvision's own cache (torch.hub) provides the file; its sha256 is recorded."""
    from torchvision.models import get_model_weights

    from harness.models.torchvision_family import _checkpoint_path

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))
    official = get_model_weights("ssdlite320_mobilenet_v3_large").DEFAULT
    path = _checkpoint_path(official)
    path.parent.mkdir(parents=True)
    torch.save(TorchvisionDetector("ssdlite320_mobilenet_v3_large", "random").model.state_dict(), path)
    detector = TorchvisionDetector("ssdlite320_mobilenet_v3_large")
    assert detector.weights.file == path.name and detector.weights.source.startswith("torchvision")
    import hashlib

    assert detector.weights.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


def test_faster_rcnn_core_reads_each_image_area_from_the_padding(records):
    """Its RPN clips proposals to each image as torchvision's does: the areas come back exactly."""
    from harness.models.torchvision_family import image_areas
    from harness.pipeline.preprocess import preprocess_batch

    detector = TorchvisionDetector("fasterrcnn_mobilenet_v3_large_320_fpn", "random")
    images = [decode_image(r.path) for r in records]
    for library in ("torch", "cv2", "pil"):  # cv2 and pil letterbox into a uint8 canvas: the mean pad rounded
        spec = replace(detector.preprocess.with_input_size(320), library=library)
        batch, transforms = preprocess_batch(images, spec)
        want = [(round(t.orig_size[0] * t.ratio[1]), round(t.orig_size[1] * t.ratio[0])) for t in transforms]
        assert image_areas(batch) == want and any(h < 320 for h, _ in want) and any(w < 320 for _, w in want), \
            library
    assert image_areas(torch.rand(2, 3, 64, 96) - 0.5) == [(64, 96)] * 2


def test_faster_rcnn_has_no_export_backend():
    detector = TorchvisionDetector("fasterrcnn_mobilenet_v3_large_320_fpn", "random")
    assert detector_backends(detector) == ("pytorch",)
    with pytest.raises(UsageError, match="data-dependent"):
        load_core_of(detector, "onnxruntime", parse_device("cpu"), "fp32", (320, 320))


def test_onnxruntime_backend_exports_the_core_and_matches(tmp_path, monkeypatch, records):
    """`--backend onnxruntime` for a torch-defined family: export once (cached by weights hash), checked
    against PyTorch at batch 1/2/4, then the same detections as the pytorch backend."""
    monkeypatch.setenv("VA_BENCH_WEIGHTS", str(tmp_path))
    detector = TorchvisionDetector("ssdlite320_mobilenet_v3_large", "random")
    images = [decode_image(r.path) for r in records]
    ours_torch = _ours(detector, 320, records, images)
    ours_ort = _ours(detector, 320, records, images, backend="onnxruntime")
    report = match_detections(ours_torch, ours_ort, iou_threshold=0.99, score_tolerance=1e-3)
    assert report.detections_a >= 20 and report.match_rate >= 0.99, report.to_dict()
    (export,) = (tmp_path / "onnx-exports").glob("*.onnx")
    assert "opset17" in export.name
    core = load_core_of(detector, "onnxruntime", parse_device("cpu"), "fp32", (320, 320))
    assert core.info()["exported_from_pytorch"]["checked_batches"] == [1, 2, 4]
    assert list((tmp_path / "onnx-exports").glob("*.onnx")) == [export]  # the cache served the second load


def test_decoder_output_kind_is_declared():
    for config in MODELS.values():
        assert isinstance(config.postprocess, PostprocessSpec)


def test_random_weights_run_through_the_cli_is_labelled(tmp_path):
    """`--weights random`: a timing-only run, labelled in the submission, no accuracy published."""
    import json

    from conftest import run_in_process

    out = tmp_path / "outputs"
    result = run_in_process(
        "run", "--model", "ssdlite320_mobilenet_v3_large", "--weights", "random", "--backend", "pytorch",
        "--batch-sizes", "1", "2", "--subset", "sample", "--limit", "4", "--coco-dir", str(COCO_DIR), "--output-dir",
        str(out), "--run-id", "rnd", "--warmup-batches", "1", "--warmup-seconds", "0", "--min-timed-batches", "2",
        "--no-layers", "--no-profile", "--no-energy")
    assert result.returncode == 0, result.stderr[-2000:]
    docs = [json.loads(p.read_text()) for p in sorted((out / "rnd" / "submissions").glob("*.json"))]
    assert len(docs) == 2
    for doc in docs:
        assert doc["model"]["weights"] == "random" and doc["repro"]["weights"]["source"] == "random"
        assert doc["config"]["conf"] == 0.001 and doc["config"]["iou"] == 0.55  # the family's own defaults
        assert doc["accuracy"].get("mAP_50_95") is None


def test_torchvisions_download_line_stays_off_stdout(monkeypatch, capsys):
    """torch.hub writes "Downloading: ..." to stdout while it fetches official weights: a --json command's stdout
    must stay JSON, so the line goes to stderr."""
    import sys

    from torchvision.models import detection

    real = detection.ssdlite320_mobilenet_v3_large

    def downloading(weights=None, **kwargs):
        sys.stdout.write('Downloading: "https://download.pytorch.org/models/x.pth" to /cache/x.pth\n')
        return real(weights=None, weights_backbone=None)

    monkeypatch.setattr(detection, "ssdlite320_mobilenet_v3_large", downloading)
    TorchvisionDetector("ssdlite320_mobilenet_v3_large")
    out, err = capsys.readouterr()
    assert "Downloading" not in out and "Downloading" in err


def test_a_failed_download_is_one_line_and_a_dry_run_or_inspect_downloads_nothing(monkeypatch, capsys, tmp_path):
    """Offline, the refusal is the error's line alone (torch.hub's "Downloading: ..." line went before it); a dry
    run, inspect and data check build the architecture alone and never reach the network."""
    import sys
    import urllib.error

    from torchvision.models import detection

    from harness.errors import UsageError
    from harness.models.registry import get_detector

    monkeypatch.setenv("TORCH_HOME", str(tmp_path))  # an empty cache: the weights are not there
    real = detection.ssdlite320_mobilenet_v3_large
    asked = []

    def offline(weights=None, **kwargs):
        if weights is not None:
            asked.append(weights)
            sys.stdout.write('Downloading: "https://download.pytorch.org/models/x.pth" to /cache/x.pth\n')
            raise urllib.error.URLError("Name or service not known")
        return real(weights=None, **kwargs)

    monkeypatch.setattr(detection, "ssdlite320_mobilenet_v3_large", offline)
    with pytest.raises(UsageError, match="could not download its weights"):
        TorchvisionDetector("ssdlite320_mobilenet_v3_large")
    out, err = capsys.readouterr()
    assert "Downloading" not in out + err and len(asked) == 1
    described = get_detector("ssdlite320_mobilenet_v3_large", fetch=False)
    assert len(asked) == 1 and "not downloaded yet" in described.weights.source and described.weights.sha256 is None
    # the commands that need no weights ask for none: a dry run, inspect (which says so), data check
    from conftest import COCO_DIR, run_in_process

    from harness.models.inspect import inspect_model

    report = inspect_model("ssdlite320_mobilenet_v3_large")
    assert len(asked) == 1 and any("not downloaded" in n for n in report.notes), report.notes
    dry = run_in_process("run", "--model", "ssdlite320_mobilenet_v3_large", "--coco-dir", str(COCO_DIR), "--limit",
                         "8", "--dry-run", "--output-dir", str(tmp_path / "out"))
    assert dry.returncode == 0 and len(asked) == 1, dry.stderr
    checked = run_in_process("data", "check", "--coco-dir", str(COCO_DIR), "--limit", "8", "--model",
                             "ssdlite320_mobilenet_v3_large")
    assert checked.returncode == 0 and len(asked) == 1, checked.stderr
