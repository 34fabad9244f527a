"""Dataset variants (full, mini500, sample, subsetN) and their image-id fingerprints."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

VAL2017_NUM_IMAGES = 5000
# Fingerprints of the official val2017 id lists (sha256 of the sorted ids, one per line), computed
# from the official image index; tests recompute them from ../shared/assets/coco.
FULL_VAL2017_SHA256 = "1d158ad41c99a053bef0f51e7468b7f183408dec16e5f8162fdfa2203104ba04"
MINI500_SHA256 = "b6c349dad846787f982b31d7c79be771032126d82525195d9714cd1195add544"
KNOWN_FINGERPRINTS = {"full": (VAL2017_NUM_IMAGES, FULL_VAL2017_SHA256), "mini500": (500, MINI500_SHA256)}


def image_id_sha256(image_ids: Iterable[int]) -> str:
    """Order-independent fingerprint of an image-id set, as the site's repro block computes it:
    SHA-256 of the sorted ids written in decimal, one per line (no trailing newline)."""
    canonical = "\n".join(str(i) for i in sorted(image_ids))
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


@cache
def mini500_ids() -> tuple[int, ...]:
    """The site's canonical subset: the first 500 of the sorted val2017 image ids."""
    data = json.loads((Path(__file__).with_name("mini500_ids.json")).read_text(encoding="utf-8"))
    return tuple(data["image_ids"])


@dataclass(frozen=True)
class DatasetVariant:
    """A named, fingerprinted set of COCO val2017 images that a run evaluates."""

    name: str  # full | mini500 | sample | subsetN
    image_ids: tuple[int, ...]  # sorted
    base: str  # the variant it was cut from (equal to name unless --limit was used)

    @property
    def num_images(self) -> int:
        return len(self.image_ids)

    @property
    def image_id_sha256(self) -> str:
        return image_id_sha256(self.image_ids)

    def describe(self) -> dict:
        return {
            "variant": self.name,
            "base_variant": self.base,
            "num_images": self.num_images,
            "image_id_sha256": self.image_id_sha256,
        }
