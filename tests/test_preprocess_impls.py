"""Preprocessing implementations (--preprocess cv2|torch|pil): the torch path against independent
references (cv2's decoder, cv2.resize on float images), every PreprocessSpec field honoured, the CUDA
device choice and its record with fakes (no GPU here), the forward's GPU time (absent on CPU), one
device->host copy, and accuracy: torch within 0.002 mAP of cv2 on the sample for yolox-nano, both backends."""

from __future__ import annotations

from dataclasses import replace

import cv2
import numpy as np
import pytest
import torch
from conftest import COCO_DIR, load_core_of, requires_coco, requires_yolox

from harness.data.coco import CocoDataset
from harness.detector.protocol import PostprocessSpec, PreprocessSpec
from harness.errors import UsageError
from harness.eval.coco_eval import evaluate_bbox
from harness.measure.device import Device, parse_device
from harness.models.registry import get_detector
from harness.pipeline import gpu
from harness.pipeline.pipeline import DetectorPipeline, Thresholds
from harness.pipeline.postprocess import BatchCandidates, split_by_image
from harness.pipeline.preprocess import (
    decode_bytes,
    decode_tensor,
    preprocess_batch,
    preprocess_tensors,
    resolve_implementation,
)
from harness.pipeline.stage_timer import DEVICE_TIMES, STAGES, StageTimer


@pytest.fixture(scope="module")
def records():
    if not (COCO_DIR / "annotations").is_dir():
        pytest.skip("COCO sample not found")
    dataset = CocoDataset(str(COCO_DIR))
    return dataset.records(dataset.variant("sample"))


# ------------------------------------------------------------------------------ choice and record

def test_preprocess_choice_defaults_per_device():
    spec = PreprocessSpec(input_size=(416, 416))
    assert resolve_implementation(spec, "auto", cuda=False).library == "cv2"  # the family's own
    assert resolve_implementation(spec, "auto", cuda=True).library == "torch"
    assert resolve_implementation(replace(spec, library="torch"), "auto", cuda=False).library == "torch"
    assert resolve_implementation(spec, "pil", cuda=True).library == "pil"
    with pytest.raises(UsageError, match="--preprocess 'opencv'"):
        resolve_implementation(spec, "opencv", cuda=False)


class _FakeTorchCore:
    """Stands for a PyTorch core (has a torch module); never called here."""

    backend, format, provider, precision = "pytorch", "pytorch", "cuda", "fp32"
    torch_module = torch.nn.Identity()


class _FakeDetector:
    model_id = "fake"
    class_map = tuple(range(80))
    postprocess = PostprocessSpec()


@pytest.mark.parametrize("library,device,decode,upload", [
    ("torch", Device("cuda", 1), "nvjpeg", False),
    ("torch", Device("cpu"), "cv2", False),
    ("cv2", Device("cuda", 0), "cv2", True),
])
def test_device_choice_is_recorded(library, device, decode, upload):
    """A fake CUDA device (no GPU needed: nothing touches torch.cuda at construction): the torch
    implementation on a torch core decodes with nvJPEG there; cv2 letterboxes on the host and uploads the uint8
    canvas; the record says where everything ran."""
    spec = PreprocessSpec(input_size=(416, 416), library=library)
    pipeline = DetectorPipeline(_FakeDetector(), _FakeTorchCore(), device, spec, Thresholds(0.001, 0.6, 300))
    info = pipeline.preprocess_info()
    assert pipeline.decoder == decode and info["decode"] == decode
    assert info["implementation"] == library
    assert info["device"] == str(device.torch_device)
    assert ("upload" in info) == upload


def test_onnxruntime_core_on_cuda_decodes_on_the_host():
    """An ORT core takes host memory, so nvJPEG would only add a round trip: host decode, recorded."""
    core = type("OrtCore", (), {"backend": "onnxruntime"})()
    assert gpu.choose_decoder("torch", cuda=False) == "cv2"
    pipeline = DetectorPipeline(_FakeDetector(), core, Device("cuda", 0), PreprocessSpec((416, 416), library="torch"),
                                Thresholds(0.001, 0.6, 300))
    assert pipeline.decoder == "cv2" and pipeline.preprocess_info()["device"] == "cpu"
    record = gpu.preprocess_record(PreprocessSpec((416, 416), library="torch"), "cv2", torch.device("cuda", 0))
    assert record["upload"] == "uint8 from pinned memory, non_blocking"


@pytest.mark.parametrize("core_attrs, device_resident", [
    ({"takes_device_tensors": True}, True),  # a TensorRT engine core: no torch module, device tensors in
    ({"takes_device_tensors": False, "torch_module": object()}, False),  # the attribute decides
    ({"torch_module": object()}, True),  # a plugin core with a torch module (no attribute): as before
    ({}, False)])
def test_where_the_batch_goes_is_the_cores_to_say(core_attrs, device_resident):
    core = type("Core", (), {"backend": "x", **core_attrs})()
    pipeline = DetectorPipeline(_FakeDetector(), core, Device("cuda", 0), PreprocessSpec((416, 416), library="torch"),
                                Thresholds(0.001, 0.6, 300))
    assert (pipeline.input_device == torch.device("cuda", 0)) is device_resident
    assert pipeline.decoder == ("nvjpeg" if device_resident else "cv2")
    assert pipeline.preprocess_info()["device"] == ("cuda:0" if device_resident else "cpu")


@requires_yolox
def test_the_builtin_cores_say_where_their_batch_goes():
    from harness.backends.tensorrt import TensorRTEngineCore

    detector = get_detector("yolox-nano")
    cpu = parse_device("cpu")
    assert load_core_of(detector, "pytorch", cpu, "fp32", (416, 416)).takes_device_tensors is True
    assert load_core_of(detector, "onnxruntime", cpu, "fp32", (416, 416)).takes_device_tensors is False
    assert TensorRTEngineCore.takes_device_tensors is True


def test_nvjpeg_decode_is_one_batched_call(records, monkeypatch):
    """decode_on_device hands all JPEGs to decode_jpeg in one call, with device and RGB mode; a PNG (not
    nvJPEG's) is decoded on the host. decode_jpeg is faked by the host decoder (no GPU here)."""
    calls = []

    def fake_decode_jpeg(encoded, mode, device):
        calls.append((len(encoded), mode, device))
        return [decode_tensor(e.numpy().tobytes(), "x") for e in encoded]

    import torchvision.io

    monkeypatch.setattr(torchvision.io, "decode_jpeg", fake_decode_jpeg)  # gpu.py imports it where it decodes
    datas = [r.path.read_bytes() for r in records[:3]]
    png = cv2.imencode(".png", decode_bytes(datas[0], "x"))[1].tobytes()
    out = gpu.decode_on_device([*datas, png], torch.device("cpu"), ["a", "b", "c", "d"])
    assert calls == [(3, torchvision.io.ImageReadMode.RGB, torch.device("cpu"))]
    assert len(out) == 4 and torch.equal(out[3], out[0])  # PNG is lossless: same pixels as the JPEG decode


def test_nvjpeg_takes_a_cached_images_bytes_without_a_copy(records, monkeypatch):
    """A run's image cache holds bytearrays: nvJPEG's input tensors are views of them (no copy of every image's bytes
    under the interpreter lock); bytes read from disk are copied once."""
    import ctypes

    import torchvision.io

    from harness.data.cache import ImageBytes

    seen = []

    def fake_decode_jpeg(encoded, mode, device):
        seen.extend(e.data_ptr() for e in encoded)
        return [decode_tensor(e.numpy().tobytes(), "x") for e in encoded]

    monkeypatch.setattr(torchvision.io, "decode_jpeg", fake_decode_jpeg)
    cache = ImageBytes(records[:2], budget_bytes=2**30)
    cached = [cache.read(r) for r in records[:2]]
    assert all(isinstance(c, bytearray) for c in cached)
    out = gpu.decode_on_device([*cached, records[2].path.read_bytes()], torch.device("cpu"), ["a", "b", "c"])
    addresses = [ctypes.addressof((ctypes.c_char * len(c)).from_buffer(c)) for c in cached]
    assert seen[:2] == addresses and len(seen) == 3 and len(out) == 3


def test_forward_gpu_time_is_a_measure_beside_the_stages():
    """StageTimer.device_time adds forward_gpu from the events once the batch ends; total is untouched."""
    class Events:
        def elapsed_ns(self):
            return 1_234_000

    timer = StageTimer(Device("cpu"))
    timer.begin_batch(2)
    with timer.stage("forward"):
        timer.device_time("forward_gpu", Events())
    batch = timer.end_batch()
    assert batch.ms("forward_gpu") == pytest.approx(1.234)
    assert "forward_gpu" in DEVICE_TIMES and "forward_gpu" not in STAGES  # never summed into the batch time


def test_split_by_image_copies_once_and_keeps_dtypes(monkeypatch):
    boxes = torch.tensor([[1.5, 2.25, 30.125, 40.0], [0.1, 0.2, 0.3, 0.4], [5, 6, 7, 8]], dtype=torch.float32)
    cands = BatchCandidates(boxes=boxes, scores=torch.tensor([0.9, 0.123456789, 0.5]),
                            labels=torch.tensor([3, 79, 0]), image=torch.tensor([0, 0, 1]), counts=[2, 1])
    copies = []
    original = torch.Tensor.cpu

    def counting_cpu(self, *a, **k):
        copies.append(self.shape)
        return original(self, *a, **k)

    monkeypatch.setattr(torch.Tensor, "cpu", counting_cpu)
    out = split_by_image(cands, boxes, [10, 11])
    assert len(copies) == 1
    assert out[0].boxes.dtype == np.float32 and out[0].labels.dtype == np.int64
    np.testing.assert_array_equal(out[0].boxes, boxes[:2].numpy())
    np.testing.assert_array_equal(out[0].scores, cands.scores[:2].numpy())
    assert out[1].labels.tolist() == [0] and out[1].image_id == 11


# ------------------------------------------------------------------------------ torch path on CPU

def test_torchvision_decode_matches_cv2(records):
    """torchvision.io (RGB CHW) and cv2.imdecode (BGR HWC) are both libjpeg: measured equal on the sample."""
    for r in records[:20]:
        data = r.path.read_bytes()
        a = decode_bytes(data, r.path)
        b = decode_tensor(data, r.path).permute(1, 2, 0).flip(-1).numpy()
        assert np.abs(a.astype(int) - b.astype(int)).max() <= 1


def test_decode_tensor_bad_bytes_is_a_usage_error():
    with pytest.raises(UsageError, match="could not be decoded"):
        decode_tensor(b"not an image", "bad.jpg")


def test_torch_letterbox_equals_cv2_float_resize(records):
    """Independent truth: cv2.resize INTER_LINEAR on a float32 image (no uint8 rounding) is the same
    half-pixel bilinear without antialiasing; the torch canvas matches it, and the pad region is the pad."""
    spec = PreprocessSpec(input_size=(416, 416))
    for r in records[:6]:
        image = decode_bytes(r.path.read_bytes(), r.path)
        batch, (t,) = preprocess_tensors([image], spec)
        h, w = image.shape[:2]
        nh, nw = int(h * t.ratio[1]), int(w * t.ratio[0])
        ref = cv2.resize(image.astype(np.float32), (nw, nh), interpolation=cv2.INTER_LINEAR)
        got = batch[0].permute(1, 2, 0).numpy()
        assert np.abs(got[:nh, :nw] - ref).max() < 0.02
        assert (got[nh:] == 114).all() and (got[:, nw:] == 114).all()


@pytest.mark.parametrize("spec", [
    PreprocessSpec(input_size=(320, 320)),
    PreprocessSpec(input_size=(320, 384), pad_position="center", pad_value=(10, 20, 30), channel_order="RGB",
                   scale=1 / 255, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)),
    PreprocessSpec(input_size=(256, 256), resize="stretch", channel_order="RGB", scale=1 / 255),
    PreprocessSpec(input_size=(640, 640), fit_margin=4, pad_position="center", size_rounding="ceil"),
])
def test_torch_path_honours_every_spec_field(records, spec):
    """Against the cv2 implementation of the same spec: same geometry (transforms), pad, channel order and
    normalisation; pixels differ only by cv2's uint8 rounding (<= 1 pixel unit, in input units)."""
    images = [decode_bytes(r.path.read_bytes(), r.path) for r in records[:3]]
    ref, ref_t = preprocess_batch(images, spec)
    from_arrays, t1 = preprocess_tensors(images, spec)
    tensors = [decode_tensor(r.path.read_bytes(), r.path) for r in records[:3]]
    from_tensors, t2 = preprocess_tensors(tensors, spec)
    assert ref_t == t1 == t2
    assert torch.equal(from_arrays, from_tensors)
    unit = spec.scale / min(spec.std or (1.0,))
    assert (from_arrays - ref).abs().max().item() <= 1.0 * unit + 1e-5
    assert (from_arrays - ref).abs().mean().item() <= 0.3 * unit


# ------------------------------------------------------------------------------ real runs

@requires_coco
@requires_yolox
def test_pipeline_on_cpu_has_no_forward_gpu_time(records):
    device = parse_device("cpu")
    detector = get_detector("yolox-nano")
    spec = replace(detector.preprocess, library="torch")
    core = load_core_of(detector, "onnxruntime", device, "fp32", spec.input_size, threads=torch.get_num_threads())
    pipeline = DetectorPipeline(detector, core, device, spec, Thresholds(0.001, 0.65, 100))
    timer = StageTimer(device)
    pipeline.run_batch(records[:2], timer)
    stages = timer.batches[0].stages
    assert "forward_gpu" not in stages and "preprocess.decode" in stages and "preprocess.upload" not in stages


@requires_coco
@requires_yolox
@pytest.mark.parametrize("backend", ["onnxruntime", pytest.param("pytorch", marks=pytest.mark.heavy)])
def test_torch_preprocessing_keeps_map_within_0_002_of_cv2(records, backend):
    """Acceptance: on the 206-image sample, yolox-nano, --preprocess torch scores within 0.002
    mAP 50:95 of cv2 (the same evaluator on both: faster-coco-eval, a run's default, which gives pycocotools'
    statistics to 1e-12 on this model and sample, test_run_yolox's
    test_faster_coco_eval_is_bit_identical_to_pycocotools; pycocotools' Python evaluate was ~10 s of this test).
    Detection passes only (no timing), batch 8."""
    device = parse_device("cpu")
    detector = get_detector("yolox-nano")
    d = detector.defaults
    core = load_core_of(detector, backend, device, "fp32", detector.preprocess.input_size,
                              threads=torch.get_num_threads())
    dataset = CocoDataset(str(COCO_DIR))
    ids = [r.image_id for r in records]
    maps = {}
    for library in ("cv2", "torch"):
        pipeline = DetectorPipeline(detector, core, device, replace(detector.preprocess, library=library),
                                    Thresholds(d.conf, d.iou, d.max_det))
        timer, results = StageTimer(device), []
        for start in range(0, len(records), 8):
            for det in pipeline.run_batch(records[start:start + 8], timer):
                results += det.to_coco(detector.class_map)
        maps[library] = evaluate_bbox(dataset.coco, results, ids, "faster-coco-eval")["mAP_50_95"]
    assert maps["cv2"] > 0.2  # the real model on real images
    assert abs(maps["torch"] - maps["cv2"]) <= 0.002, maps


@requires_coco
@requires_yolox
@pytest.mark.parametrize("overlap", [False, True])
def test_site_fields_add_up_and_record_the_implementation(tmp_path_factory, overlap):
    """A small real run with --preprocess torch: runtime/repro say torch (and the host decoder on CPU), no
    forward_gpu on CPU, total_ms's split adds up to its mean, and in overlapped mode the site's
    fps_mean = 1000 / total_ms.mean reads the stream's throughput, not half of it."""
    from conftest import run_benchmark

    from harness.results.submission import build_submission

    _, records = run_benchmark(tmp_path_factory, f"pre{int(overlap)}", limit=8, batch_sizes=[4], overlap=overlap,
                               preprocess="torch", warmup_batches=1, min_timed_batches=4, layers=False,
                               profile=False, energy=False, accuracy=False)
    doc = build_submission(records[0])
    assert doc["runtime"]["preprocess"]["implementation"] == "torch"
    assert doc["runtime"]["preprocess"]["decode"] == "cv2"
    assert doc["repro"]["preprocess"] == "torch"
    assert "forward_gpu" not in doc["timing"]["stages_ms"]
    total = doc["timing"]["total_ms"]
    parts = total["preprocess_ms"] + total["inference_ms"] + total["postprocess_ms"]
    stages = doc["timing"]["stages_ms"]
    inference = (stages["forward"]["mean"] + stages.get("transfer", {"mean": 0})["mean"]) / 4
    assert total["inference_ms"] == pytest.approx(inference, abs=1e-3)  # transfer is inside inference
    if overlap:
        assert parts == pytest.approx(total["mean"], abs=1e-3)
        assert doc["throughput"]["fps_mean"] == pytest.approx(doc["throughput"]["images_per_s"], rel=0.1)
        assert doc["timing"]["batch_ms"]["mean"] / 4 > total["mean"]  # latency with queueing > interval
    else:
        assert parts == pytest.approx(total["mean"], rel=0.02, abs=0.05)
