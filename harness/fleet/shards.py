"""Sharded accuracy: a variant's images split over several nodes, their detections merged for one COCO
evaluation.

Shards are contiguous runs of whole batches of the sorted image list, so every batch a shard runs holds
exactly the images the unsharded pass puts in that batch: the detections, and so the 12 COCO metrics,
are the unsharded pass's (same images, same batches, same evaluator).
"""

from __future__ import annotations

from dataclasses import dataclass

from harness.errors import UsageError


@dataclass(frozen=True)
class Shard:
    """Images [start, stop) of the variant's sorted image list."""

    index: int
    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start


def split_shards(num_images: int, batch_size: int, shards: int) -> list[Shard]:
    """`shards` contiguous shards of whole batches (sizes differ by at most one batch; the short last batch
    of the variant stays last)."""
    batches = -(-num_images // batch_size)
    if shards < 1:
        raise UsageError(f"--accuracy-shards must be at least 1, got {shards}")
    if shards > batches:
        raise UsageError(f"--accuracy-shards {shards} is more than the {batches} batches of {batch_size} in the "
                         f"{num_images} images of the variant; use at most {batches} shards")
    bounds = [min(num_images, (k * batches // shards) * batch_size) for k in range(shards + 1)]
    return [Shard(k, bounds[k], bounds[k + 1]) for k in range(shards)]


def merge_result_files(parts: list[tuple[Shard, bytes]]) -> bytes:
    """One COCO results file (a JSON array) from the shards' files, in the order of the unsharded pass.

    The arrays are joined as text: parsing them would hold a Python dict per detection (millions on full
    val2017 at conf 0.001). Every part is checked to be an array, and the shards to cover the images once."""
    ordered = sorted(parts, key=lambda p: p[0].start)
    position, bodies = 0, []
    for shard, data in ordered:
        if shard.start != position:
            raise ValueError(f"shard {shard.index} starts at image {shard.start}, expected {position}: "
                             "shards must cover the variant exactly once")
        position = shard.stop
        text = data.strip()
        if not (text.startswith(b"[") and text.endswith(b"]")):
            raise ValueError(f"shard {shard.index}'s detections are not a JSON array")
        body = text[1:-1].strip()
        if body:
            bodies.append(body)
    return b"[" + b",".join(bodies) + b"]\n"
