"""A plugin's mistakes against the detector contract (harness/detector/protocol.py) are one line naming the field
and the fix, never a silently wrong mAP: xywh or normalised boxes, logits, NaN scores, float or out-of-range labels,
another number of images, a class for an instance, a postprocess or preprocess of another type, a core of another
precision than the one asked for."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from conftest import COCO_DIR, requires_coco, run_in_process

from harness.detector.protocol import Candidates, DenseCandidates
from harness.errors import UsageError
from harness.pipeline.checks import ModelOutputError, check_decoded

PLUGINS = Path(__file__).parent / "plugins"
SIZE = (416, 416)


def _candidates(boxes, scores=None, labels=None) -> Candidates:
    boxes = torch.as_tensor(boxes, dtype=torch.float32)
    k = boxes.shape[0]
    return Candidates(boxes, torch.full((k,), 0.9) if scores is None else torch.as_tensor(scores),
                      torch.zeros(k, dtype=torch.long) if labels is None else torch.as_tensor(labels))


XYXY = [[100.0 + 10 * i, 120.0, 140.0 + 10 * i, 200.0] for i in range(12)]  # 12 boxes, xyxy in pixels
XYWH = [[x1, y1, x2 - x1, y2 - y1] for x1, y1, x2, y2 in XYXY]  # the same boxes as x, y, w, h


def test_the_contracts_output_passes():
    check_decoded([_candidates(XYXY), _candidates(XYXY[:3])], 2, SIZE, False)
    check_decoded([_candidates(torch.zeros(0, 4))], 1, SIZE, False)  # no candidates at all
    dense = DenseCandidates(torch.tensor([XYXY, XYXY]), torch.randn(2, 12, 80) * 5)  # logits: the spec's sigmoid
    check_decoded(dense, 2, SIZE, True)
    # boxes of any shape where they do not count: random weights (timing only), a trained model's background
    check_decoded([_candidates(XYWH)], 1, SIZE, False, trained=False)
    check_decoded([_candidates(XYWH, scores=torch.full((12,), 0.01))], 1, SIZE, False)


@pytest.mark.parametrize("decoded, images, logits, expected", [
    ([_candidates(XYWH)], 1, False, "must be xyxy"),
    ([_candidates([[b / 416 for b in box] for box in XYXY])], 1, False, "not normalised"),
    ([_candidates(XYXY, scores=torch.linspace(-4, 4, 12))], 1, False, "must be probabilities"),
    ([_candidates(XYXY, scores=torch.tensor([float("nan")] * 12))], 1, False, "NaN scores"),
    ([_candidates(XYXY, labels=torch.zeros(12))], 1, False, "integer tensor"),
    ([_candidates(XYXY)], 2, False, "Candidates of 1 images for a batch of 2"),
    ((torch.zeros(12, 4), torch.zeros(12)), 1, False, "one Candidates per image"),
    (DenseCandidates(torch.zeros(2, 12, 4), torch.zeros(2, 12)), 2, False, "must be [B, K, 4] and [B, K, C]"),
    (DenseCandidates(torch.tensor([XYXY]), torch.randn(1, 12, 80) * 5), 1, False, "must be probabilities"),
])
def test_a_decoders_mistake_is_one_line_naming_it(decoded, images, logits, expected):
    with pytest.raises(ModelOutputError, match=re.escape(expected)):
        check_decoded(decoded, images, SIZE, logits)


@pytest.mark.parametrize("label", [-1, 80])
def test_a_label_outside_the_class_map_is_refused_where_it_would_be_written(label):
    """Label -1 indexed the class map from its end (scored as the last class, toothbrush); 80 past it."""
    import numpy as np

    from harness.data.categories import COCO80_TO_91
    from harness.records import ImageDetections, coco_json_texts

    det = ImageDetections(7, np.array([[1.0, 2.0, 30.0, 40.0]], np.float32), np.array([0.9], np.float32),
                          np.array([label]))
    for write in (det.to_coco, lambda m: coco_json_texts(det, m)):
        with pytest.raises(ValueError, match=r"image 7: labels from .* class indices of the model's 80 classes"):
            write(COCO80_TO_91)


def _plugin(tmp_path: Path, body: str) -> str:
    path = tmp_path / "plugin.py"
    path.write_text(f"import sys\nsys.path.insert(0, {str(PLUGINS)!r})\nimport torch\n"
                    "from synthetic_detector import SleepyCore, SyntheticDetector\n"
                    "from harness.detector.protocol import Candidates, PreprocessSpec\n\n" + body)
    return f"{path}:make"


def _run(spec: str, tmp_path: Path, *extra: str):
    return run_in_process("run", "--model", spec, "--backend", "pytorch", "--limit", "4", "--batch-sizes", "2",
                          "--coco-dir", str(COCO_DIR), "--warmup-batches", "1", "--warmup-seconds", "0",
                          "--min-timed-batches", "2", "--no-energy", "--draw-images", "0", "--output-dir",
                          str(tmp_path / "o"), *extra, env={"VA_BENCH_TEST_FORWARD_MS": "1"})


@requires_coco
def test_a_plugin_giving_xywh_boxes_fails_its_cell_in_one_line(tmp_path):
    spec = _plugin(tmp_path, (
        "class XYWH(SyntheticDetector):\n"
        "    def decode(self, raw, input_size, conf):\n"
        "        boxes = torch.tensor([[30.0 + i, 30.0, 10.0, 10.0] for i in range(12)])  # x, y, w, h\n"
        "        return [Candidates(boxes, torch.full((12,), 0.9), torch.zeros(12, dtype=torch.long))\n"
        "                for _ in range(raw[0].shape[0])]\n\n"
        "def make():\n    return XYWH()\n"))
    done = _run(spec, tmp_path)
    assert done.returncode == 1 and "must be xyxy" in done.stderr, done.stderr
    (run,) = (tmp_path / "o").iterdir()
    cells = json.loads((run / "run.json").read_text())["cells"]
    assert [c["status"] for c in cells] == ["failed"] and not list((run / "submissions").glob("*.json"))


@pytest.mark.parametrize("body, expected", [
    ("def make():\n    return SyntheticDetector\n", "returned the class SyntheticDetector, not a detector"),
    ("class D(SyntheticDetector):\n    postprocess = {'kind': 'topk'}\n\ndef make():\n    return D()\n",
     "postprocess is a dict, not a PostprocessSpec"),
    ("class D(SyntheticDetector):\n    preprocess = PreprocessSpec(input_size=416)\n\ndef make():\n    return D()\n",
     "input_size is (height, width) in pixels, not 416"),
    # were an AttributeError at planning (exit 1), "it has " and nothing, and the string's letters as backends
    ("class D(SyntheticDetector):\n    core_source = 'model.onnx'\n\ndef make():\n    return D()\n",
     "core_source must be a CoreSource (harness/detector/source.py) with a torch_module or an onnx_model, not "
     "'model.onnx'"),
    ("from harness.detector.source import CoreSource\n\nclass D(SyntheticDetector):\n"
     "    core_source = CoreSource('empty')\n\ndef make():\n    return D()\n", "not CoreSource(name='empty'"),
    ("class D(SyntheticDetector):\n    backends = 'pytorch'\n\ndef make():\n    return D()\n",
     "backends must be a tuple of backend names (e.g. ('pytorch',)), not 'pytorch'"),
])
def test_a_plugin_of_another_shape_is_refused_when_loaded(tmp_path, body, expected):
    from harness.models.registry import get_detector

    with pytest.raises(UsageError, match=re.escape(expected)):
        get_detector(_plugin(tmp_path, body))


@requires_coco
def test_a_core_of_another_precision_than_asked_is_not_recorded_as_asked(tmp_path):
    """The synthetic plugin's core is fp32 whatever it is asked: a bf16 run of it would have said bf16."""
    done = _run(f"{PLUGINS / 'synthetic_detector.py'}:make_detector", tmp_path, "--precision", "bf16")
    assert done.returncode == 1 and "load_core gave a fp32 core for --precision bf16" in done.stderr, done.stderr


def test_a_core_returning_a_dict_is_told_what_to_return():
    """torchvision-style dict outputs: list() would take the keys for outputs ("'str' object has no attribute ...")."""
    from harness.detector.graph import output_list

    assert len(output_list((torch.zeros(1), torch.ones(2)))) == 2 and len(output_list(torch.zeros(3))) == 1
    with pytest.raises(TypeError, match="must return a tensor or a tuple of tensors, not a dict"):
        output_list({"boxes": torch.zeros(1, 4)})
    with pytest.raises(TypeError, match="not a tuple of Tensor, str"):
        output_list((torch.zeros(1), "boxes"))
