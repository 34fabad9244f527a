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
