"""The campaign row's pooled timing against a plain numpy computation over the datasets' own samples."""

import numpy as np
import pytest

from harness.results.campaign import pooled_timing


def test_pooled_timing_is_every_datasets_batches_per_image():
    subs = [{"timing": {"batch_size": 1, "num_images": 3, "batch_samples_ms": [10.0, 12.0, 11.0]}},
            {"timing": {"batch_size": 4, "num_images": 8, "batch_samples_ms": [40.0, 60.0]}}]
    per_image = np.array([10.0, 12.0, 11.0, 10.0, 15.0])  # batches of 4 divided by 4
    timing = pooled_timing(subs)
    assert timing["num_images"] == 11
    assert timing["total_ms"]["mean"] == pytest.approx(per_image.mean(), abs=1e-4)
    assert timing["total_ms"]["p50"] == pytest.approx(np.median(per_image), abs=1e-4)
    assert timing["total_ms"]["p99"] == pytest.approx(np.percentile(per_image, 99), abs=1e-4)


def test_pooled_timing_of_overlapped_cells_is_their_intervals_and_std_the_sample_one():
    # an overlapped cell's batch samples are latencies (queueing included): its per-image time is the interval
    subs = [{"timing": {"batch_size": 4, "num_images": 8, "mode": "overlapped", "batch_samples_ms": [90.0, 120.0],
                        "interval_samples_ms": [20.0, 22.0]}},
            {"timing": {"batch_size": 1, "num_images": 2, "mode": "latency", "batch_samples_ms": [10.0, 14.0]}}]
    per_image = np.array([20.0, 22.0, 10.0, 14.0])
    timing = pooled_timing(subs)
    assert timing["total_ms"]["mean"] == pytest.approx(per_image.mean(), abs=1e-4)
    assert timing["total_ms"]["std"] == pytest.approx(per_image.std(ddof=1), abs=1e-4)
    # one timed batch in all: no spread to speak of (null, as a cell's own total_ms says it), not a spread of 0
    one = pooled_timing([{"timing": {"batch_size": 1, "num_images": 1, "batch_samples_ms": [10.0]}}])
    assert one["total_ms"]["std"] is None


def test_pooled_stage_split_adds_up_to_the_pooled_mean_and_is_null_where_a_dataset_lacks_it():
    def cell(samples, pre, inf, post):  # a latency cell of batch 1 whose stage means add up to its mean
        assert abs(pre + inf + post - np.mean(samples)) < 1e-9
        return {"timing": {"batch_size": 1, "num_images": len(samples), "batch_samples_ms": samples,
                           "total_ms": {"preprocess_ms": pre, "inference_ms": inf, "postprocess_ms": post}}}

    subs = [cell([10.0, 12.0, 14.0], 2.0, 8.0, 2.0), cell([30.0], 5.0, 20.0, 5.0)]
    total = pooled_timing(subs)["total_ms"]
    assert total["preprocess_ms"] == pytest.approx((2.0 * 3 + 5.0) / 4)
    assert total["inference_ms"] == pytest.approx((8.0 * 3 + 20.0) / 4)
    parts = total["preprocess_ms"] + total["inference_ms"] + total["postprocess_ms"]
    assert parts == pytest.approx(total["mean"], abs=1e-3) and total["mean"] == pytest.approx(16.5)
    subs[1]["timing"]["total_ms"]["inference_ms"] = None
    assert pooled_timing(subs)["total_ms"]["inference_ms"] is None


def test_campaign_means_leave_undefined_statistics_out_and_pool_every_batch():
    """Three datasets' submissions (batch 1, 2 and 4): each accuracy key of the row is statistics.mean of the
    datasets' defined values (mAP_small undefined on one, AR_large on another: not counted as 0); its total_ms is
    numpy's of every dataset's batch times / batch size, pooled."""
    import statistics

    from harness.eval.coco_eval import STAT_NAMES
    from harness.results.campaign import DatasetResult, campaign_submission

    rng = np.random.default_rng(8)
    subs = []
    for k, batch in enumerate((1, 2, 4)):
        accuracy = {name: float(rng.uniform(0.1, 0.6)) for name in (*STAT_NAMES, "AR_max_det")}
        undefined = {0: "mAP_small", 2: "AR_large"}.get(k)
        if undefined:
            accuracy[undefined] = None
            accuracy["unavailable"] = {undefined: "no ground truth in this area range"}
        samples = rng.lognormal(np.log(10.0 * batch), 0.2, 12 + 5 * k)
        subs.append({"schema_version": "va.submission.v1", "benchmark": {}, "model": {"id": "m"},
                     "runtime": {"format": "onnx", "provider": "cpu"}, "hardware": {"id": "box"},
                     "config": {"batch_size": batch, "input_size": 640, "conf": 0.001, "iou": 0.65, "max_det": 500},
                     "eval": {"maxDets": [1, 10, 100, 500]}, "accuracy": accuracy,
                     "dataset": {"split": "test", "num_images": 20, "num_categories": 2, "image_id_sha256": str(k)},
                     "repro": {"weights": {}, "harness_version": "x", "harness_commit": "y", "harness_dirty": False},
                     "timing": {"batch_size": batch, "num_images": batch * len(samples),
                                "batch_samples_ms": samples.round(4).tolist()}})
    row = campaign_submission([DatasetResult(f"d{k}", 1, "w", s) for k, s in enumerate(subs)], 3, {})
    for key in (*STAT_NAMES, "AR_max_det"):
        defined = [s["accuracy"][key] for s in subs if s["accuracy"][key] is not None]
        assert row["accuracy"][key] == pytest.approx(statistics.mean(defined), abs=1e-12), key
    assert len([s for s in subs if s["accuracy"]["mAP_small"] is not None]) == 2
    per_image = np.concatenate([np.asarray(s["timing"]["batch_samples_ms"]) / s["timing"]["batch_size"]
                                for s in subs])
    total = row["timing"]["total_ms"]
    assert total["mean"] == pytest.approx(per_image.mean(), abs=1e-4)
    assert total["std"] == pytest.approx(per_image.std(ddof=1), abs=1e-4)
    for q in (50, 95, 99):
        assert total[f"p{q}"] == pytest.approx(np.percentile(per_image, q), abs=1e-4), q
    assert row["throughput"]["fps_mean"] == pytest.approx(1000 / per_image.mean(), abs=2e-3)
