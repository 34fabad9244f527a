"""The GPU path's whole-batch letterbox and NMS, run on the CPU against their per-image references: torchvision's
NMS class by class (its batched_nms without the offsets) and F.interpolate image by image; and the count of tensor
operations they dispatch, which no longer grows by a handful with every image."""

import collections
from dataclasses import replace

import numpy as np
import pytest
import torch
from conftest import requires_coco, requires_yolox
from torch.utils._python_dispatch import TorchDispatchMode
from torchvision.ops import nms as torchvision_nms

from harness.detector.protocol import PreprocessSpec
from harness.pipeline import batch_nms
from harness.pipeline.batch_nms import nms_whole_batch
from harness.pipeline.preprocess import preprocess_tensors, whole_batch_letterbox


def reference_nms(boxes, scores, labels, counts, iou, max_det):
    """torchvision's NMS per image and class, each image's best max_det, equal scores in the candidates' order."""
    kept, start = [], 0
    for count in counts:
        b, s, lab = boxes[start:start + count], scores[start:start + count], labels[start:start + count]
        keep = [torch.nonzero(lab == c).squeeze(1) for c in lab.unique().tolist()]
        keep = torch.cat([m[torchvision_nms(b[m], s[m], iou)] for m in keep]).sort().values if keep else \
            torch.zeros(0, dtype=torch.long)
        keep = keep[torch.argsort(s[keep], descending=True, stable=True)][:max_det]
        kept.append(keep + start)
        start += count
    return torch.cat(kept)


def random_candidates(generator, counts, classes=3, spread=60.0):
    """Boxes crowded in a small area (long chains of suppression), a few classes, scores with ties."""
    n = sum(counts)
    xy = torch.rand(n, 2, generator=generator) * spread
    wh = 5 + torch.rand(n, 2, generator=generator) * 30
    boxes = torch.cat([xy, xy + wh], 1)
    scores = torch.randint(0, 40, (n,), generator=generator).float() / 40  # ties on purpose
    labels = torch.randint(0, classes, (n,), generator=generator)
    return boxes, scores, labels


@pytest.mark.parametrize("seed", range(6))
def test_whole_batch_nms_keeps_what_torchvision_keeps_image_by_image(seed):
    generator = torch.Generator().manual_seed(seed)
    counts = [0, 1, 37, 250, 0, 120, 3][: 3 + seed % 5]
    boxes, scores, labels = random_candidates(generator, counts)
    for iou, max_det in ((0.5, 300), (0.65, 20), (0.3, 1)):
        expected = reference_nms(boxes, scores, labels, counts, iou, max_det)
        assert torch.equal(nms_whole_batch(boxes, scores, labels, counts, iou, max_det), expected)


def test_whole_batch_nms_in_chunks_and_alone_keeps_the_same():
    """A small scratch budget: the images go in several chunks, and one too crowded for it alone goes to
    torchvision's NMS by itself; the boxes kept do not change."""
    generator = torch.Generator().manual_seed(7)
    counts = [40, 90, 10, 0, 60, 25]
    boxes, scores, labels = random_candidates(generator, counts, classes=2)
    expected = reference_nms(boxes, scores, labels, counts, 0.45, 300)
    for entries in (1 << 26, 100 * 100, 60 * 60):  # one chunk; several; the 90-candidate image alone
        scratch = entries * batch_nms.BYTES_PER_ENTRY
        assert torch.equal(nms_whole_batch(boxes, scores, labels, counts, 0.45, 300, scratch), expected), entries


def test_a_chain_of_boxes_each_suppressing_the_next_goes_to_torchvision_alone(monkeypatch):
    """Boxes in a row, each overlapping only its neighbours: the fixed point needs a round per box; past MAX_LOOKS
    that image goes to torchvision by itself, its neighbours in the batch stay with the matrix, all as the reference."""
    chain = 64
    x = torch.arange(chain, dtype=torch.float32) * 3
    row = torch.stack([x, torch.zeros(chain), x + 10, torch.full((chain,), 10.0)], 1)  # neighbours' IoU 0.54
    generator = torch.Generator().manual_seed(11)
    other, other_scores, other_labels = random_candidates(generator, [30, 25])
    boxes = torch.cat([other[:30], row, other[30:]])
    scores = torch.cat([other_scores[:30], torch.linspace(1, 0.5, chain), other_scores[30:]])
    labels = torch.cat([other_labels[:30], torch.zeros(chain, dtype=torch.long), other_labels[30:]])
    counts = [30, chain, 25]
    alone = []
    one_image = batch_nms._one_image
    monkeypatch.setattr(batch_nms, "_one_image", lambda b, *rest: alone.append(len(b)) or one_image(b, *rest))
    expected = reference_nms(boxes, scores, labels, counts, 0.5, 300)
    assert torch.equal(nms_whole_batch(boxes, scores, labels, counts, 0.5, 300), expected)
    assert alone == [chain]  # the chain's image only
    assert torch.equal(nms_whole_batch(boxes, scores, labels, counts, 0.5, 5), reference_nms(boxes, scores, labels,
                                                                                          counts, 0.5, 5))


def test_whole_batch_nms_compares_the_ratio_with_the_threshold_as_torchvision_does():
    # IoU 60 / 100: float32 0.60000002, above the double 0.6, so torchvision's CPU kernel suppresses the second box
    boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0], [0.0, 0.0, 10.0, 6.0]])
    scores, labels = torch.tensor([0.9, 0.8]), torch.tensor([0, 0])
    assert torchvision_nms(boxes, scores, 0.6).tolist() == [0]
    assert nms_whole_batch(boxes, scores, labels, [2], 0.6, 300).tolist() == [0]
    assert nms_whole_batch(boxes, scores, labels, [2], 0.61, 300).tolist() == [0, 1]


def _images(seed: int, sizes):
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 256, (3, h, w), dtype=torch.uint8, generator=generator) for h, w in sizes]


SPECS = [PreprocessSpec((416, 416), pad_value=114, channel_order="BGR", library="torch"),
         PreprocessSpec((320, 480), pad_position="center", library="torch", scale=1 / 255,
                        mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)),
         PreprocessSpec((512, 384), resize="stretch", library="torch"),
         PreprocessSpec((640, 640), fit_margin=32, size_rounding="round", pad_position="center", library="torch")]


@pytest.mark.parametrize("spec", SPECS, ids=lambda s: f"{s.resize}-{s.input_size[0]}x{s.input_size[1]}")
def test_whole_batch_letterbox_is_the_per_image_letterbox(spec):
    """Shrinking, enlarging, unchanged and one-pixel images, in one batch: F.interpolate's pixels to float
    rounding, the same transforms, the pad exactly where it was."""
    images = _images(3, [(480, 640), (640, 427), (416, 416), (100, 700), (1, 1), (900, 300), (17, 23)])
    expected, transforms = preprocess_tensors(images, spec)
    got, got_transforms = preprocess_tensors(images, spec, whole_batch=True)
    assert got_transforms == transforms and got.shape == expected.shape
    unit = 1.0 if spec.std is None and spec.scale == 1.0 else 1 / 255 / 0.224
    difference = (got - expected).abs()
    # float rounding (a weight an ulp apart), not another resize: a pixel off by a sampling step would be units off
    assert float(difference.max()) <= 0.01 * unit and float(difference.mean()) <= 1e-4 * unit
    pad = torch.ones_like(got, dtype=torch.bool)  # outside each image's resized area, from its transform
    for i, t in enumerate(transforms):
        (left, top), (h, w) = (int(v) for v in t.pad), t.resized
        pad[i, :, top:top + h, left:left + w] = False
    assert torch.equal(got[pad], expected[pad])


def test_the_whole_batch_letterbox_in_chunks_is_the_same():
    """A smaller scratch budget splits the batch into chunks of images: the same canvas."""
    from harness.pipeline.preprocess import LETTERBOX_BYTES_PER_ENTRY

    spec = SPECS[0]
    images = _images(6, [(480, 640), (640, 427), (300, 300), (20, 900), (416, 416)])
    whole = preprocess_tensors(images, spec, whole_batch=True)[0]
    two = 2 * 3 * 416 * 416 * LETTERBOX_BYTES_PER_ENTRY  # two images a chunk
    assert torch.equal(preprocess_tensors(images, spec, whole_batch=True, scratch=two)[0], whole)


def test_a_spec_the_whole_batch_letterbox_does_not_do_runs_image_by_image():
    spec = PreprocessSpec((320, 320), resize="fit_stretch", library="torch")
    area = PreprocessSpec((320, 320), downscale_interpolation="area", library="torch")
    images = _images(4, [(480, 640), (200, 100)])
    for s in (spec, area):
        assert not whole_batch_letterbox(s)
        assert torch.equal(preprocess_tensors(images, s, whole_batch=True)[0], preprocess_tensors(images, s)[0])


class _CountOps(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))


def _ops(fn) -> int:
    with _CountOps() as counting:
        fn()
    return sum(counting.ops.values())


def test_the_whole_batch_ways_dispatch_a_fixed_number_of_operations():
    """Twelve more images cost the whole-batch letterbox twelve views (their flattening) and the NMS nothing, where
    the per-image ways dispatch a handful each: the Python calls that take the interpreter lock on a GPU."""
    spec = SPECS[1]
    small, large = _images(5, [(300, 400)] * 4), _images(5, [(300, 400)] * 16)
    whole = [_ops(lambda images=images: preprocess_tensors(images, spec, whole_batch=True))
             for images in (small, large)]
    per_image = [_ops(lambda images=images: preprocess_tensors(images, spec)) for images in (small, large)]
    assert whole[1] - whole[0] <= 12 < 4 * 12 <= per_image[1] - per_image[0], (whole, per_image)
    generator = torch.Generator().manual_seed(1)
    boxes, scores, labels = random_candidates(generator, [30] * 16)
    whole_nms = [_ops(lambda n=n: nms_whole_batch(boxes[:30 * n], scores[:30 * n], labels[:30 * n], [30] * n,
                                                  0.5, 300)) for n in (4, 16)]
    # at most a look or two more to the fixed point (a longer chain among more boxes), nothing per image
    assert whole_nms[1] - whole_nms[0] <= 24, whole_nms


@requires_coco
@requires_yolox
def test_a_pipeline_with_the_whole_batch_ways_detects_what_the_per_image_one_does():
    """The sample through YOLOX-Nano (ONNX Runtime) at batch 16, letterboxed in torch: the whole-batch letterbox and
    NMS (a GPU run's way, forced here on the CPU) against one image at a time."""
    from harness.backends import BackendOptions, load_detector_core
    from harness.config import RunConfig
    from harness.data.coco import CocoDataset
    from harness.eval.matching import match_detections
    from harness.measure.device import parse_device
    from harness.models.registry import get_detector
    from harness.pipeline.pipeline import DetectorPipeline, Thresholds
    from harness.pipeline.stage_timer import StageTimer

    detector, device = get_detector("yolox-nano"), parse_device("cpu")
    spec = replace(detector.preprocess, library="torch")
    options = BackendOptions.from_config(RunConfig(backends=["onnxruntime"], batch_sizes=[16]))
    core = load_detector_core(detector, "onnxruntime", device, "fp32", spec.input_size, options=options, threads=2)
    d = detector.defaults
    dataset = CocoDataset()
    records = dataset.records(dataset.variant("sample"))[:48]
    batches = [records[k:k + 16] for k in range(0, len(records), 16)]
    results = {}
    for whole in (False, True):
        pipeline = DetectorPipeline(detector, core, device, spec, Thresholds(d.conf, d.iou, d.max_det),
                                    whole_batch=whole)
        assert pipeline.nms_whole_batch is whole and pipeline.letterbox_whole_batch is whole
        assert ("whole batch" in pipeline.nms_calls) is whole
        assert ("whole batch" in pipeline.preprocess_info()["resize"]) is whole
        results[whole] = [det for batch in batches for det in pipeline.run_batch(batch, StageTimer(device))]
    report = match_detections(results[False], results[True])
    total = sum(len(det.scores) for det in results[False])
    assert total > 2000 and abs(total - sum(len(det.scores) for det in results[True])) <= 2
    assert report.match_rate >= 0.999, report
    assert np.isclose(sum(float(det.scores.sum()) for det in results[True]),
                      sum(float(det.scores.sum()) for det in results[False]), rtol=1e-3)


def test_an_image_far_wider_than_high_keeps_a_row_in_every_implementation():
    """1 x 700 at 640: the fit rounds its height to 0, which no resize takes (cv2 and F.interpolate raise; the
    whole-batch indices overflowed); it keeps one row, the same in every implementation."""
    from harness.pipeline.preprocess import preprocess_batch

    wide = torch.full((3, 1, 700), 200, dtype=torch.uint8)
    outputs = {}
    for library in ("cv2", "pil", "torch"):
        spec = PreprocessSpec((640, 640), library=library)
        image = wide.permute(1, 2, 0).numpy().copy() if library != "torch" else wide
        outputs[library], (transform,) = preprocess_batch([image], spec)
        assert transform.resized == (1, 640)
    outputs["whole"] = preprocess_tensors([wide, wide[:, :, :5]], PreprocessSpec((640, 640), library="torch"),
                                          whole_batch=True)[0][:1]
    for name, batch in outputs.items():
        assert torch.equal(batch[0, :, 0, :640], torch.full((3, 640), 200.0)), name
        assert torch.equal(batch[0, :, 1:], torch.full((3, 639, 640), 114.0)), name


def test_the_scratch_budget_is_a_hundredth_of_the_devices_memory(monkeypatch):
    from types import SimpleNamespace

    from harness.pipeline import scratch

    scratch.scratch_bytes.cache_clear()
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: SimpleNamespace(total_memory=141 << 30))
    try:
        assert scratch.scratch_bytes(torch.device("cpu")) == 256 << 20
        assert scratch.scratch_bytes(torch.device("cuda", 0)) == int((141 << 30) * 0.01)  # 1.41 GiB on an H200
    finally:
        scratch.scratch_bytes.cache_clear()


@requires_coco
@requires_yolox
def test_the_overhead_bench_sets_tf32_as_a_run_does_before_its_cores_load(monkeypatch):
    """A forward process applies the run's TF32 (off by default) in its own process: the bench's forward alone must
    run under the same setting, or the two forwards run different kernels on a GPU and their ratio says nothing."""
    import torch

    from harness.bench import overhead
    from harness.config import RunConfig

    class Loaded(Exception):
        pass

    seen = []

    def load(*args, **kwargs):
        seen.append((torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32, kwargs["options"].tf32))
        raise Loaded

    # torch's own defaults for cuDNN, as a fresh process has them (the switches are torch's, put back after)
    before = (torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32,
              torch.get_float32_matmul_precision())
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = True
    monkeypatch.setattr(overhead, "load_detector_core", load)
    try:
        with pytest.raises(Loaded):
            overhead.measure("yolox-nano", "pytorch", 2, 1, 1, "cpu", forward_process=True)
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = before[:2]
        torch.set_float32_matmul_precision(before[2])
    assert RunConfig().tf32 == "off" and seen == [(False, False, "off")]


@requires_coco
@requires_yolox
def test_the_overhead_benchs_per_image_flag_reaches_its_pipelines(monkeypatch):
    """`--per-image` (gpu_check's A/B rows) builds every pipeline of the bench one image at a time; without it, as a
    run does (None: whole-batch on a GPU)."""
    from harness.bench import overhead

    class Built(Exception):
        pass

    seen = []

    def pipeline(*args, **kwargs):
        seen.append(kwargs["whole_batch"])
        raise Built

    monkeypatch.setattr(overhead, "load_detector_core", lambda *args, **kwargs: object())
    monkeypatch.setattr(overhead, "DetectorPipeline", pipeline)
    for per_image in (True, False):
        with pytest.raises(Built):
            overhead.measure("yolox-nano", "pytorch", 2, 1, 1, "cpu", per_image=per_image)
    assert seen == [False, None]
