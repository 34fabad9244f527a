"""Calibration images for int8 post-training quantisation, never the images the run evaluates.

An int8 model calibrated on the images it is then scored on overstates its accuracy. The calibration set is
`--calibration DIR` (image files), or by default the dataset's images that the run does not evaluate (the
first `--calibration-images` of them by sorted id: with the 206-image sample and `--limit 106`, the other
100). Any overlap with the evaluated images is refused: by image id for the dataset's own images, by file
content (SHA-256) for a folder. What was used is recorded: source, count and the SHA-256 of the ids or files.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.data.coco import CocoDataset, ImageRecord
from harness.data.variants import image_id_sha256
from harness.errors import UsageError, path_problem
from harness.files import file_sha256

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff")  # the formats data/images.py reads


@dataclass(frozen=True)
class CalibrationSet:
    """The images an int8 core is calibrated on, and how they were chosen (for the record)."""

    records: tuple[ImageRecord, ...]
    source: str  # "dataset" (images the run does not evaluate) or the folder given
    fingerprint: str  # SHA-256 of the sorted image ids (dataset) or of the files' SHA-256 (folder)
    requested: int  # --calibration-images

    @property
    def shortfall(self) -> str | None:
        """What a set smaller than asked for is, and why (a run warns of it); None when it has the images asked for."""
        if len(self.records) >= self.requested:
            return None
        where = ("images of the dataset that the run does not evaluate" if self.source == "dataset"
                 else f"image files in {self.source}")
        fix = ("evaluate fewer (--limit N) or give --calibration DIR with more" if self.source == "dataset"
               else f"put more images in {self.source}")
        return (f"int8 calibrated on {len(self.records)} images, not the {self.requested} asked for "
                f"(--calibration-images): there are no more {where}; {fix}")

    def describe(self) -> dict[str, Any]:
        how = ("the dataset's images the run does not evaluate (first by sorted id)" if self.source == "dataset"
               else f"--calibration {self.source}")
        key = "image_id_sha256" if self.source == "dataset" else "files_sha256"
        return {"calibration_source": how, "calibration_images": len(self.records),
                "calibration_images_requested": self.requested, f"calibration_{key}": self.fingerprint,
                "calibration_disjoint_from_evaluated": True,
                **({"calibration_shortfall": self.shortfall} if self.shortfall else {})}


def calibration_set(dataset: CocoDataset, evaluated: list[ImageRecord], folder: str | None,
                    count: int) -> CalibrationSet:
    """Up to `count` calibration images disjoint from `evaluated`; one UsageError line when there are none
    or when a given image is also evaluated."""
    if folder is None:
        taken = {r.image_id for r in evaluated}
        rest = [i for i in sorted(dataset.coco.imgs) if i not in taken]
        records = []
        for image_id in rest:
            record = dataset.record(image_id)
            if Path(record.path).is_file():
                records.append(record)
            if len(records) == count:
                break
        if not records:
            raise UsageError("int8 needs calibration images that the run does not evaluate, and every image of the "
                             "dataset is evaluated; evaluate fewer (--limit N) or give --calibration DIR")
        return CalibrationSet(tuple(records), "dataset", image_id_sha256(r.image_id for r in records), count)
    root = Path(folder)
    if not root.is_dir():
        raise UsageError(path_problem("--calibration", folder, "not a folder") + "; give a folder of image files")
    files = sorted(p for p in root.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())[:count]
    if not files:
        raise UsageError(path_problem("--calibration", folder, "has no image files") +
                         f" ({', '.join(IMAGE_SUFFIXES)}); put calibration images in it")
    # decoded as calibration decodes them, now rather than when the first int8 core is built inside the run (a
    # header-and-tail check would refuse photos with data after the JPEG, which decode fine)
    import cv2

    broken = [p for p in files if cv2.imread(str(p), cv2.IMREAD_COLOR) is None]
    if broken:
        more = f" (and {len(broken) - 1} more)" if len(broken) > 1 else ""
        raise UsageError(path_problem("--calibration", folder, f"{broken[0].name} cannot be decoded as an image{more}")
                         + "; replace or remove the broken files")
    evaluated_sha = {file_sha256(Path(r.path)): r for r in evaluated}
    digests = [file_sha256(p) for p in files]
    overlap = [(p, evaluated_sha[d]) for p, d in zip(files, digests, strict=True) if d in evaluated_sha]
    if overlap:
        path, record = overlap[0]
        raise UsageError(f"--calibration {folder}: {len(overlap)} of its images are also evaluated (e.g. {path.name} "
                         f"is image {record.image_id}); int8 calibrated on the scored images overstates its "
                         "accuracy, give images the run does not evaluate")
    records = tuple(ImageRecord(-(k + 1), p, 0, 0) for k, p in enumerate(files))
    return CalibrationSet(records, str(root), hashlib.sha256("".join(digests).encode()).hexdigest(), count)
