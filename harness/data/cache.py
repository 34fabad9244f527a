"""Where the pipeline's timed decode substep gets each image's encoded bytes: memory or disk.

`--cache-images auto` reads the variant's image files once, before the first cell, and keeps their
encoded bytes in memory when they fit the budget (the smaller of CACHE_CAP_BYTES and CACHE_FRACTION of
the memory available at the start); every batch of every cell then decodes from those bytes, so the
decode substep measures the JPEG decode alone, never the disk or the page cache, and the first cell is
not charged for reading files the later cells find cached. `off`, or a variant over the budget, reads
each file inside the decode substep (from disk or the OS page cache), for every cell alike. The choice is
made once per run and recorded in every submission (`environment.images`).

Encoded bytes, not decoded pixels, are kept: the timed pass of every cell must run the decode it times,
so decoded pixels would only serve untimed work (warm-up, drawing) while costing ~6x the memory
(~0.9 MB per COCO image against ~0.16 MB).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import psutil

CACHE_MODES = ("auto", "off")
CACHE_CAP_BYTES = 512 * 2**20  # mini500 (~80 MB of JPEGs) fits; full val2017 (~790 MB) streams from disk
CACHE_FRACTION = 0.10  # of the memory available when the run starts


@dataclass(frozen=True)
class CacheDecision:
    """What the run does with image bytes, and why."""

    mode: str  # the option: auto | off
    decode_from: Literal["memory", "disk", "none"]  # none: generated images (--input synthetic)
    reason: str
    variant_bytes: int
    budget_bytes: int | None

    def to_dict(self) -> dict:
        return {"cache_images": self.mode, "decode_from": self.decode_from, "reason": self.reason,
                "variant_mb": round(self.variant_bytes / 2**20, 1),
                "budget_mb": None if self.budget_bytes is None else round(self.budget_bytes / 2**20, 1)}


def cache_budget() -> int:
    """The cache's byte budget on this machine now."""
    return int(min(CACHE_CAP_BYTES, CACHE_FRACTION * psutil.virtual_memory().available))


class ImageBytes:
    """The encoded bytes of a variant's images, from memory (cached) or read from disk on each call."""

    def __init__(self, records: Sequence, mode: str = "auto", budget_bytes: int | None = None,
                 read_elsewhere: str | None = None):
        """`read_elsewhere`: why the timed decode reads the files itself whatever `mode` says (host processes, which
        cannot see this process's memory): nothing is cached, and the decision says so."""
        if mode not in CACHE_MODES:
            raise ValueError(f"cache mode {mode!r}: use one of {CACHE_MODES}")
        paths = {r.image_id: Path(r.path) for r in records}
        total = sum(p.stat().st_size for p in paths.values())
        self._cached: dict[int, bytearray] | None = None
        if mode == "off" or read_elsewhere is not None:
            self.decision = CacheDecision(mode, "disk", read_elsewhere or "--cache-images off", total, None)
            return
        budget = cache_budget() if budget_bytes is None else budget_bytes
        if total > budget:
            self.decision = CacheDecision(mode, "disk", f"the variant's image files ({total / 2**20:.0f} MB) exceed "
                                          f"the cache budget ({budget / 2**20:.0f} MB)", total, budget)
            return
        # bytearrays: a writable buffer, which a tensor takes without a copy (nvJPEG's input on a GPU); never written
        self._cached = {image_id: bytearray(path.read_bytes()) for image_id, path in paths.items()}
        self.decision = CacheDecision(mode, "memory", "the variant's image files fit the cache budget", total, budget)

    def read(self, record) -> bytes | bytearray:
        """The encoded bytes of `record` (anything with `.image_id` and `.path`): the cached bytearray itself (read
        it, never write it), or the file's bytes."""
        if self._cached is not None:
            cached = self._cached.get(record.image_id)
            if cached is not None:
                return cached
        return Path(record.path).read_bytes()
