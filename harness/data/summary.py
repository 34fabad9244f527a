"""What a dataset variant holds, as a run reads it: images (with objects, background), objects per class by COCO's
area ranges, crowd regions, masks, and, for a model, which of its classes each category scores as. `va-bench data
check` prints it; reading the dataset also makes every check a run makes before it starts."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from harness.data.classes import NOT_IN_DATASET
from harness.data.coco import has_mask
from harness.data.images import find_corrupt_images, image_formats

# COCO's area ranges (COCOeval's areaRng): small < 32², medium < 96², large above
SMALL, MEDIUM = 32 ** 2, 96 ** 2


@dataclass
class CategoryCount:
    """One category's ground truth among the variant's images."""

    id: int
    name: str
    objects: int = 0  # non-crowd annotations: what recall divides by
    images: int = 0  # images holding one of them
    small: int = 0
    medium: int = 0
    large: int = 0
    crowd: int = 0  # crowd regions (neither found nor missed)
    model_classes: list[str] | None = None  # the model's classes scored as this category (with a model)


@dataclass
class DatasetSummary:
    dataset: dict  # the run's dataset block: id, split, categories, annotations_sha256, variant, images
    annotation_format: str
    annotation_file: str
    images: int
    images_with_objects: int
    objects: int
    crowd: int
    with_masks: int  # annotations with a polygon or RLE (a segmentation model's ground truth)
    oriented_images: int  # images with an EXIF orientation other than 1 (decoded upright)
    image_dir: str  # the folder the images were read from
    image_formats: dict[str, int]  # images per file format (JPEG, PNG, WebP, BMP, TIFF), by their first bytes
    categories: list[CategoryCount] = field(default_factory=list)
    model: str | None = None
    unscored_model_classes: list[str] | None = None  # the model's classes the dataset has no category for
    corrupt_images: list[dict] = field(default_factory=list)  # JPEGs that decode only with errors, as a run records

    def to_dict(self) -> dict:
        return asdict(self)


def summarize(dataset, variant, model_id: str | None = None, class_names: tuple[str | None, ...] = (),
              label_categories: tuple[int, ...] = ()) -> DatasetSummary:
    """The summary of `variant` of `dataset` (a CocoDataset whose variant was resolved, so its checks ran); with a
    model, its class names and the category each of its labels scores as (`CocoDataset.label_categories`)."""
    counts = {c: CategoryCount(c, name) for c, name in sorted(dataset.categories.items())}
    images_with_objects = objects = crowd = masks = 0
    for image_id in variant.image_ids:
        anns = [a for a in dataset.coco.imgToAnns.get(image_id, ()) if a["category_id"] in counts]
        seen = set()
        for ann in anns:
            count = counts[ann["category_id"]]
            masks += has_mask(ann.get("segmentation"))
            if ann.get("iscrowd"):
                count.crowd += 1
                crowd += 1
                continue
            count.objects += 1
            objects += 1
            area = ann["area"]
            if area < SMALL:
                count.small += 1
            elif area < MEDIUM:
                count.medium += 1
            else:
                count.large += 1
            seen.add(ann["category_id"])
        for category in seen:
            counts[category].images += 1
        images_with_objects += bool(seen)
    summary = DatasetSummary({**dataset.describe(), **variant.describe()}, dataset.annotation_format,
                             str(dataset.annotation_file), variant.num_images, images_with_objects, objects, crowd,
                             masks, sum(1 for i in variant.image_ids if i in dataset.orientations),
                             str(dataset.image_dir), image_formats(r.path for r in dataset.records(variant)),
                             list(counts.values()),
                             corrupt_images=[c.to_dict() for c in find_corrupt_images(dataset.records(variant))])
    if model_id is not None:
        summary.model = model_id
        for count in counts.values():
            count.model_classes = []
        unscored = []
        for name, category in zip(class_names, label_categories, strict=True):
            if name is None:
                continue
            if category == NOT_IN_DATASET:
                unscored.append(name)
            else:
                counts[category].model_classes.append(name)
        summary.unscored_model_classes = unscored
    return summary
