"""A synthetic COCO tree for memory-scaling benchmarks: the sample's genuine images repeated under new
image ids until there are N of them (symbolic links, no pixel copies) with their official annotations
re-keyed, written as annotations/instances_val2017.json so that `--subset full` (and `--limit K`) work on it.

Never inside the repository (except its git-ignored outputs/ and datasets/ folders): by default it goes to
the system temp folder. Its `info` block says it is synthetic; its numbers are not COCO results.

    python -m harness.bench.synthetic_coco [OUT_DIR] [--images 5000] [--coco-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

from harness.build_info import source_tree
from harness.config import add_run_argument
from harness.data.coco import find_coco_dir
from harness.errors import UsageError
from harness.files import atomic_write_bytes

FIRST_ID = 900_000_000  # far above val2017's ids, so a synthetic id is never mistaken for a real one
ALLOWED_IN_REPO = ("outputs", "datasets")  # git-ignored contents


def default_dir(images: int) -> Path:
    return Path(tempfile.gettempdir()) / f"va-bench-synthetic-coco-{images}"


def _check_destination(out: Path) -> None:
    out, checkout = out.resolve(), source_tree()
    if checkout is None:
        return
    try:
        inside = out.relative_to(checkout.resolve())
    except ValueError:
        return
    if not inside.parts or inside.parts[0] not in ALLOWED_IN_REPO:
        raise UsageError(f"{out} is inside the repository; build the synthetic tree in a temp folder or under "
                         f"{' or '.join(ALLOWED_IN_REPO)}/ (git-ignored)")


def build_tree(out: Path, images: int, coco_dir: str | Path | None = None) -> Path:
    """Build (or reuse, when it already has `images` images from the same source) the synthetic tree at `out`."""
    _check_destination(out)
    if images < 1:
        raise UsageError(f"--images must be positive, got {images}")
    source_root = find_coco_dir(coco_dir)
    source = json.loads(next(p for p in (source_root / "annotations" / n for n in
                                         ("instances_val2017.json", "instances_val2017_subset.json"))
                             if p.is_file()).read_text(encoding="utf-8"))
    annotation_file = out / "annotations" / "instances_val2017.json"
    stamp = {"synthetic": True, "source": str(source_root), "images": images}
    if annotation_file.is_file():
        info = json.loads(annotation_file.read_text(encoding="utf-8")).get("info", {})
        if {k: info.get(k) for k in stamp} == stamp:
            return out
    originals = sorted(source["images"], key=lambda img: img["id"])
    by_image: dict[int, list[dict]] = {}
    for ann in source["annotations"]:
        by_image.setdefault(ann["image_id"], []).append(ann)
    (out / "val2017").mkdir(parents=True, exist_ok=True)
    (out / "annotations").mkdir(parents=True, exist_ok=True)
    new_images, new_annotations = [], []
    for k in range(images):
        original = originals[k % len(originals)]
        image_id = FIRST_ID + k
        name = f"{image_id:012d}.jpg"
        link = out / "val2017" / name
        if link.is_symlink() or link.exists():
            link.unlink()
        os.symlink((source_root / "val2017" / original["file_name"]).resolve(), link)
        new_images.append({**original, "id": image_id, "file_name": name})
        for ann in by_image.get(original["id"], []):
            new_annotations.append({**ann, "id": len(new_annotations) + 1, "image_id": image_id})
    doc = {"info": {"description": f"SYNTHETIC: {len(originals)} COCO val2017 images repeated to {images}",
                    **stamp},
           "licenses": source.get("licenses", []), "images": new_images, "annotations": new_annotations,
           "categories": source["categories"]}
    atomic_write_bytes(annotation_file, json.dumps(doc).encode())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", nargs="?", type=Path, help="where to build it (default: the temp folder)")
    parser.add_argument("--images", type=int, default=5000)
    add_run_argument(parser, "coco_dir")
    args = parser.parse_args(argv)
    try:
        out = build_tree(args.out or default_dir(args.images), args.images, args.coco_dir)
    except UsageError as exc:
        parser.exit(2, f"error: {exc}\n")
    print(out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
