"""Post-processing kinds (harness/pipeline/postprocess.py) against references written the straightforward
way with torchvision.ops: multi-/single-label NMS with pre-NMS top-k, clip and small-box filter, and
NMS-free top-k over queries x classes (the RT-DETR/D-FINE post-processor's recipe)."""

import numpy as np
import pytest
import torch
from torchvision.ops import batched_nms, clip_boxes_to_image, remove_small_boxes

from harness.detector.ops import top_k_per_group
from harness.detector.protocol import Candidates, DenseCandidates, PostprocessSpec, ProtocolDefaults, postprocess_spec
from harness.pipeline.postprocess import BatchCandidates, drop_small, gather_candidates, select
from harness.pipeline.preprocess import ImageTransform

B, K, C = 3, 400, 12
SIZE = 320


def _dense(seed=0, logits=False) -> DenseCandidates:
    g = torch.Generator().manual_seed(seed)
    xy = torch.rand(B, K, 2, generator=g) * SIZE
    wh = torch.rand(B, K, 2, generator=g) * 80 + 2
    boxes = torch.cat((xy - wh / 2, xy + wh / 2), dim=-1)  # some cross the image border
    raw = torch.randn(B, K, C, generator=g) * 2 - 3
    return DenseCandidates(boxes=boxes, scores=raw if logits else torch.sigmoid(raw))


def _transforms(content=((SIZE, SIZE), (SIZE, 200), (150, SIZE))):
    """Images whose content fills part of the canvas (letterbox, top-left), ratio 1."""
    return [ImageTransform((1.0, 1.0), (0.0, 0.0), hw) for hw in content]


def _per_image(cands: BatchCandidates):
    cuts = np.cumsum(cands.counts)[:-1].tolist()
    return list(zip(np.split(cands.boxes.numpy(), cuts), np.split(cands.scores.numpy(), cuts),
                    np.split(cands.labels.numpy(), cuts), strict=True))


def _run(decoded, spec, transforms=None):
    transforms = transforms or _transforms()
    cands = gather_candidates(decoded, spec, spec.conf, spec.max_det)
    return _per_image(select(cands, spec, spec.iou, spec.max_det, transforms))


@pytest.mark.parametrize("multi_label", [True, False])
@pytest.mark.parametrize("pre_nms_topk", [None, 150])
def test_dense_nms_equals_reference(multi_label, pre_nms_topk):
    dense = _dense()
    spec = PostprocessSpec("nms", conf=0.05, iou=0.5, max_det=100, multi_label=multi_label, pre_nms_topk=pre_nms_topk)
    ours = _run(dense, spec)
    for i in range(B):
        boxes, scores = dense.boxes[i], dense.scores[i]
        if multi_label:
            k, c = torch.where(scores >= spec.conf)
            boxes, s, labels = boxes[k], scores[k, c], c
        else:
            s, labels = scores.max(dim=1)
            keep = s >= spec.conf
            boxes, s, labels = boxes[keep], s[keep], labels[keep]
        if pre_nms_topk:
            order = s.argsort(descending=True)[:pre_nms_topk]
            boxes, s, labels = boxes[order], s[order], labels[order]
        keep = batched_nms(boxes, s, labels, spec.iou)[:spec.max_det]
        got_boxes, got_scores, got_labels = ours[i]
        assert len(keep) > 20
        np.testing.assert_array_equal(got_scores, s[keep].numpy())
        np.testing.assert_array_equal(got_labels, labels[keep].numpy())
        np.testing.assert_array_equal(got_boxes, boxes[keep].numpy())


def test_clip_and_small_box_filter_before_nms_equal_torchvision():
    """torchvision's order: clip to the image, drop boxes under min size, batched NMS, max_det."""
    dense = _dense(1)
    spec = PostprocessSpec("nms", conf=0.05, iou=0.5, max_det=100, multi_label=True, clip_before_nms=True,
                           min_box_size=4.0)
    transforms = _transforms()
    ours = _run(dense, spec, transforms)
    for i, t in enumerate(transforms):
        k, c = torch.where(dense.scores[i] >= spec.conf)
        boxes = clip_boxes_to_image(dense.boxes[i][k], t.orig_size)
        scores, labels = dense.scores[i][k, c], c
        keep = remove_small_boxes(boxes, spec.min_box_size)
        boxes, scores, labels = boxes[keep], scores[keep], labels[keep]
        keep = batched_nms(boxes, scores, labels, spec.iou)[:spec.max_det]
        np.testing.assert_array_equal(ours[i][0], boxes[keep].numpy())
        np.testing.assert_array_equal(ours[i][1], scores[keep].numpy())


def test_topk_over_queries_and_classes_equals_detr_postprocessor():
    """RT-DETR's post-processor: sigmoid, top-k over the flattened queries x classes, query = index // C."""
    dense = _dense(2, logits=True)
    spec = PostprocessSpec("topk", conf=0.3, max_det=50, activation="sigmoid")
    ours = _run(dense, spec)
    probs = torch.sigmoid(dense.scores)
    for i in range(B):
        scores, index = probs[i].flatten().topk(spec.max_det)
        keep = scores >= spec.conf
        scores, index = scores[keep], index[keep]
        boxes, labels = dense.boxes[i][index // C], index % C
        np.testing.assert_allclose(ours[i][1], scores.numpy(), rtol=1e-6)
        np.testing.assert_array_equal(ours[i][2], labels.numpy())
        np.testing.assert_array_equal(ours[i][0], boxes.numpy())
        assert 0 < len(scores) <= spec.max_det


def test_topk_keeps_overlapping_boxes_that_nms_would_drop():
    box = torch.tensor([[10.0, 10, 50, 50]])
    dense = DenseCandidates(boxes=box.expand(1, 3, 4).clone(), scores=torch.tensor([[[0.9], [0.8], [0.7]]]))
    topk = _run(dense, PostprocessSpec("topk", conf=0.001, max_det=300), _transforms()[:1])
    nms = _run(dense, PostprocessSpec("nms", conf=0.001, iou=0.5, max_det=300), _transforms()[:1])
    assert len(topk[0][1]) == 3 and len(nms[0][1]) == 1


def test_topk_on_resolved_candidates_sorts_and_truncates_per_image():
    """An end-to-end head (YOLO26: [K, 6] rows) gives Candidates; topk keeps each image's best max_det."""
    g = torch.Generator().manual_seed(3)
    cands = [Candidates(torch.rand(n, 4, generator=g) * 100, torch.rand(n, generator=g), torch.arange(n) % 5)
             for n in (30, 0, 12)]
    spec = PostprocessSpec("topk", conf=0.2, max_det=10)
    ours = _run(cands, spec, _transforms())
    for c, (boxes, scores, labels) in zip(cands, ours, strict=True):
        keep = c.scores >= spec.conf
        order = c.scores[keep].argsort(descending=True)[:spec.max_det]
        np.testing.assert_array_equal(scores, c.scores[keep][order].numpy())
        np.testing.assert_array_equal(boxes, c.boxes[keep][order].numpy())
        np.testing.assert_array_equal(labels, c.labels[keep][order].numpy())


def test_top_k_per_group_equals_a_loop_of_topk():
    g = torch.Generator().manual_seed(4)
    scores = torch.rand(5000, generator=g)
    groups = torch.randint(0, 37, (5000,), generator=g)
    kept = top_k_per_group(scores, groups, 25)
    for group in range(37):
        members = (groups == group).nonzero().squeeze(1)
        want = members[scores[members].topk(min(25, members.numel())).indices]
        got = kept[groups[kept] == group]
        assert torch.equal(got, want)
    assert torch.equal(torch.sort(top_k_per_group(scores, groups, None)).values, torch.arange(5000))


def test_spec_records_what_applies_to_its_kind():
    nms = PostprocessSpec("nms", conf=0.001, iou=0.7, max_det=300, multi_label=True, pre_nms_topk=30000).to_dict()
    assert nms == {"kind": "nms", "conf": 0.001, "iou": 0.7, "max_det": 300, "multi_label": True,
                   "pre_nms_topk": 30000, "clip_before_nms": False, "min_box_size": 0.0}
    topk = PostprocessSpec("topk", conf=0.0, max_det=300, activation="sigmoid").to_dict()
    assert topk == {"kind": "topk", "conf": 0.0, "max_det": 300, "activation": "sigmoid"}
    with pytest.raises(ValueError):
        PostprocessSpec("soft-nms")


def test_plugin_without_a_spec_gets_nms_with_its_defaults():
    class Plugin:
        defaults = ProtocolDefaults(conf=0.25, iou=0.45, max_det=100)

    spec = postprocess_spec(Plugin())
    assert (spec.kind, spec.conf, spec.iou, spec.max_det, spec.multi_label) == ("nms", 0.25, 0.45, 100, False)


def test_host_copy_is_one_exact_round_trip_of_every_field():
    """The packed host copy (`--nms-on host`) gives back every candidate's box, score, label, image and mask row
    bit for bit, in the original dtypes (float64 rows hold float32 values and int64 indices below 2**53)."""
    g = torch.Generator().manual_seed(3)
    boxes = torch.rand(50, 4, generator=g) * 640
    scores = torch.rand(50, generator=g)
    labels = torch.randint(0, 80, (50,), generator=g)
    image = torch.sort(torch.randint(0, 4, (50,), generator=g)).values
    rows = torch.randint(0, 300, (50,), generator=g)
    cands = BatchCandidates(boxes, scores, labels, image, torch.bincount(image, minlength=4).tolist(), rows)
    copy = cands.host_copy()
    for name in ("boxes", "scores", "labels", "image", "rows"):
        got, want = getattr(copy, name), getattr(cands, name)
        assert got.dtype == want.dtype and torch.equal(got, want), name
    assert copy.counts == cands.counts and copy.counts is not cands.counts
    no_rows = BatchCandidates(boxes, scores, labels, image, list(cands.counts)).host_copy()
    assert no_rows.rows is None and torch.equal(no_rows.boxes, boxes)
    assert cands.to(torch.device("cpu")) is cands  # already there: no copy


def test_the_whole_batch_selection_equals_torchvision_per_image():
    """`select(whole_batch=True)` (a GPU run's NMS, every image at once: pipeline/batch_nms.py) keeps what
    torchvision's batched_nms keeps image by image, multi-label candidates included."""
    dense = _dense(seed=3)
    spec = PostprocessSpec("nms", conf=0.05, iou=0.5, max_det=60, multi_label=True)
    kept = select(gather_candidates(dense, spec, spec.conf, spec.max_det), spec, spec.iou, spec.max_det,
                  [], whole_batch=True)
    for i, (got_boxes, got_scores, got_labels) in enumerate(_per_image(kept)):
        k, c = torch.where(dense.scores[i] >= spec.conf)
        boxes, s = dense.boxes[i][k], dense.scores[i][k, c]
        keep = batched_nms(boxes, s, c, spec.iou)[:spec.max_det]
        assert len(keep) == spec.max_det
        np.testing.assert_array_equal(got_scores, s[keep].numpy())
        np.testing.assert_array_equal(got_labels, c[keep].numpy())
        np.testing.assert_array_equal(got_boxes, boxes[keep].numpy())


def test_boxes_exactly_min_size_wide_or_high_are_kept_as_torchvision_keeps_them():
    """remove_small_boxes keeps w >= min_size and h >= min_size: boxes of exactly the minimum size stay."""
    boxes = torch.tensor([[10.0, 10.0, 14.0, 30.0], [10.0, 10.0, 30.0, 14.0], [0.0, 0.0, 4.0, 4.0],
                          [5.0, 5.0, 8.5, 20.0], [5.0, 5.0, 20.0, 8.75], [1.0, 2.0, 40.0, 50.0]])
    n = len(boxes)
    cands = BatchCandidates(boxes, torch.linspace(0.9, 0.4, n), torch.zeros(n, dtype=torch.long),
                            torch.zeros(n, dtype=torch.long), [n])
    kept = drop_small(cands, 4.0)
    assert torch.equal(kept.boxes, boxes[remove_small_boxes(boxes, 4.0)])
    assert kept.counts == [4]  # the three of exactly 4 px and the large one


@pytest.mark.parametrize("spec", [PostprocessSpec("topk", conf=0.25, max_det=10),
                                  PostprocessSpec("nms", conf=0.25, iou=0.5, max_det=10),
                                  PostprocessSpec("nms", conf=0.25, iou=0.5, max_det=10, multi_label=True)],
                         ids=["topk", "nms", "nms-multi-label"])
@pytest.mark.parametrize("resolved", [False, True], ids=["dense", "resolved"])
def test_a_score_equal_to_conf_is_kept_by_every_kind(spec, resolved):
    """The threshold is score >= conf (PostprocessSpec): 0.25 exactly (a float32 value) stays, 0.2499999 goes, for
    dense scores and for a decoder's resolved candidates alike. Disjoint boxes: nothing else removes any."""
    boxes = torch.tensor([[0.0, 0.0, 10.0, 10.0], [20.0, 0.0, 30.0, 10.0], [40.0, 0.0, 50.0, 10.0]])
    scores = torch.tensor([0.5, 0.25, np.nextafter(np.float32(0.25), np.float32(0))])
    if resolved:
        decoded = [Candidates(boxes, scores, torch.zeros(3, dtype=torch.long))]
    else:
        decoded = DenseCandidates(boxes=boxes[None], scores=scores[None, :, None])
    (kept_boxes, kept_scores, _), = _run(decoded, spec, _transforms()[:1])
    assert kept_scores.tolist() == [0.5, 0.25] and np.array_equal(kept_boxes, boxes[:2].numpy())


def test_an_untrained_models_crowd_is_selected_class_by_class_as_torchvision_selects_it(monkeypatch):
    """An image of more candidates than CLASS_BY_CLASS_ABOVE (an untrained model's near-even scores: every class
    of every anchor) runs one kernel call per class, and keeps what torchvision's batched_nms keeps (its own
    class-by-class loop at that size); a smaller image in the same batch keeps the single call's result."""
    from harness.pipeline import postprocess

    g = torch.Generator().manual_seed(3)
    counts = [postprocess.CLASS_BY_CLASS_ABOVE + 2000, 600]
    n = sum(counts)
    xy, wh = torch.rand(n, 2, generator=g) * 320, torch.rand(n, 2, generator=g) * 60 + 4
    cands = BatchCandidates(boxes=torch.cat((xy - wh / 2, xy + wh / 2), dim=1), scores=torch.rand(n, generator=g),
                            labels=torch.randint(0, 80, (n,), generator=g),
                            image=torch.repeat_interleave(torch.arange(2), torch.tensor(counts)), counts=counts)
    calls, kernel = [], postprocess.nms

    def counted(boxes, scores, iou):
        calls.append(len(scores))
        return kernel(boxes, scores, iou)

    monkeypatch.setattr(postprocess, "nms", counted)
    kept = postprocess.nms_batch(cands, 0.65, 300)
    assert len(calls) == len(torch.unique(cands.labels[:counts[0]])) + 1  # a call a class, then one for the other
    start = 0
    for i, count in enumerate(counts):
        part = slice(start, start + count)
        order = batched_nms(cands.boxes[part], cands.scores[part], cands.labels[part], 0.65)[:300] + start
        got = slice(sum(kept.counts[:i]), sum(kept.counts[:i + 1]))
        assert kept.counts[i] == 300 and torch.equal(kept.boxes[got], cands.boxes[order]), i
        assert torch.equal(kept.scores[got], cands.scores[order]) and torch.equal(kept.labels[got], cands.labels[order])
        start += count


def test_class_by_class_orders_equal_scores_as_the_single_call_does():
    """Scores on a coarse grid (many equal): the class-by-class selection keeps the same boxes in the same order as
    the single kernel call over shifted classes, which orders equal scores by index."""
    from harness.pipeline.nms_kernel import nms
    from harness.pipeline.postprocess import nms_class_by_class

    g = torch.Generator().manual_seed(4)
    xy, wh = torch.rand(3000, 2, generator=g) * 100, torch.rand(3000, 2, generator=g) * 30 + 2
    boxes = torch.cat((xy - wh / 2, xy + wh / 2), dim=1)
    scores = torch.randint(1, 20, (3000,), generator=g).float() / 20
    labels = torch.randint(0, 30, (3000,), generator=g)
    shifted = boxes + (labels.to(boxes) * (boxes.max() + 1))[:, None]
    single = nms(shifted, scores, 0.5)
    assert len(single) > 500 and len(set(scores[single].tolist())) < len(single) // 10  # many equal scores kept
    assert torch.equal(nms_class_by_class(boxes, scores, labels, 0.5), single)
