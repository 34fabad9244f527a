"""`--input synthetic`: time a model with no dataset anywhere, as `trtexec` and `benchmark_app` do.

Generated uint8 images of the run's input size (seeded noise, the same every run; up to 64 distinct ones, made
before anything is timed and reused in turn) go through the whole pipeline:
letterbox (a no-op at the input size), collate, forward, post-processing; decode is skipped (nothing is
encoded) and said so. Nothing is scored: a synthetic run is timing only, labelled as such in its submissions
(dataset id "synthetic"), and `validate`/`aggregate` refuse to publish it, like random weights. Post-processing
on noise keeps fewer candidates than on real images: its share of the time is a lower bound.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from harness.data.cache import CacheDecision
from harness.data.coco import ImageRecord
from harness.data.variants import DatasetVariant

SYNTHETIC_ID = "synthetic"
DEFAULT_IMAGES = 64  # without --limit
DISTINCT_IMAGES = 64  # generated once, at the first image asked for (in the warm-up), then reused in turn
SEED = 0


class SyntheticDataset:
    """What a timing run reads of a dataset, for generated images: no annotations, no categories, no files."""

    layout = "synthetic"
    class_map = None
    root = None
    annotation_file = None
    annotation_format = None
    categories: dict[int, str] = {}
    orientations: dict[int, int] = {}  # generated images have no EXIF

    def __init__(self, size: tuple[int, int]):
        self.size = tuple(size)  # (height, width) of every generated image
        self.distinct = DISTINCT_IMAGES
        self._images: list[np.ndarray] | None = None

    def describe(self) -> dict:
        return {"id": SYNTHETIC_ID, "split": "generated", "num_categories": None, "categories_sha256": None,
                "annotations_sha256": None,
                "generator": {"kind": "uniform noise, uint8 BGR", "seed": SEED, "height": self.size[0],
                              "width": self.size[1], "distinct_images": self.distinct,
                              "when": "all at the first image asked for (in the warm-up), never inside a timed "
                                      "batch; reused in turn past that many"}}

    def variant(self, name: str, limit: int | None = None) -> DatasetVariant:
        n = limit or DEFAULT_IMAGES
        self.distinct = min(n, DISTINCT_IMAGES)
        return DatasetVariant(f"synthetic{n}", tuple(range(1, n + 1)), SYNTHETIC_ID)

    def records(self, variant: DatasetVariant) -> list[ImageRecord]:
        h, w = self.size
        return [ImageRecord(i, Path(f"<synthetic image {i}>"), w, h) for i in variant.image_ids]

    def label_categories(self, model_id: str, class_names: tuple[str | None, ...], class_map=None) -> tuple[int, ...]:
        """Every model label is kept (nothing is scored against categories)."""
        return tuple(range(len(class_names)))

    def image(self, record: ImageRecord) -> np.ndarray:
        """The record's image: H x W x 3 uint8 BGR noise (the same every run), shared by every batch that uses it
        (the pipeline copies it into its canvas). The distinct images are all generated at the first call, so that
        making noise is never timed as preprocessing."""
        if self._images is None:
            self._images = [self._generate(k) for k in range(1, self.distinct + 1)]
        return self._images[(record.image_id - 1) % self.distinct]

    def _generate(self, k: int) -> np.ndarray:
        return np.random.default_rng((SEED, k)).integers(0, 256, (*self.size, 3), dtype=np.uint8)


class SyntheticImages:
    """A run's image source for generated images: nothing is read or decoded."""

    decision = CacheDecision("synthetic", "none", "--input synthetic: images generated in memory, nothing to "
                             "decode", 0, None)

    def __init__(self, dataset: SyntheticDataset):
        self.dataset = dataset

    def read(self, record) -> bytes:
        raise ValueError(f"{record.path} is generated: it has no encoded bytes (--input synthetic)")
