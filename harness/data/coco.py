"""COCO val2017 on disk: discovery, annotations (validated, then pycocotools), and variant resolution."""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import re
import unicodedata
from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path, PurePosixPath
from typing import Annotated, Literal

from pycocotools.coco import COCO
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harness.build_info import source_tree
from harness.data.categories import COCO_NAMES_BY_ID
from harness.data.classes import ClassMap, match_classes
from harness.data.images import check_image_files, check_image_sizes
from harness.data.variants import VAL2017_NUM_IMAGES, DatasetVariant, mini500_ids
from harness.data.yolo import YoloSplit, dataset_yaml, locate_split, read_split
from harness.errors import UsageError, json_problem, path_problem
from harness.files import file_sha256

ENV_COCO_DIR = "VA_BENCH_COCO"
# The official full file first; a subset file holds the official records of the images present.
ANNOTATION_FILES = ("instances_val2017.json", "instances_val2017_subset.json")
HOW_TO_GET_COCO = (
    "run `va-bench data fetch coco` (or get COCO val2017 yourself, in the official layout: annotations/ and "
    f"val2017/, and pass --coco-dir or set ${ENV_COCO_DIR})"
)


FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")


class _Image(_Strict):
    id: int
    file_name: str = Field(min_length=1)
    width: int = Field(gt=0)
    height: int = Field(gt=0)


class _Annotation(_Strict):
    """The fields pycocotools' bbox evaluation reads (segmentation is not used for bbox AP)."""

    id: int
    image_id: int
    category_id: int
    bbox: Annotated[list[FiniteFloat], Field(min_length=4, max_length=4)]
    area: FiniteFloat = Field(ge=0)
    iscrowd: Literal[0, 1]


class _Category(_Strict):
    id: int
    name: str


class _Instances(_Strict):
    images: list[_Image]
    annotations: list[_Annotation]
    categories: list[_Category] = Field(min_length=1)


def _where(loc: tuple) -> str:
    """('annotations', 17, 'bbox', 2) -> 'annotations[17].bbox[2]'."""
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "top level"


def _structure_problems(data) -> list[str]:
    """Everything pycocotools and the harness rely on, checked up front: pycocotools itself raises a bare
    AssertionError, KeyError or Exception on such files, some only at evaluation, after the run started."""
    if not isinstance(data, dict):
        return [f"the top level is a JSON {type(data).__name__}, not an object with images, annotations and "
                "categories"]
    try:
        instances = _Instances.model_validate(data)
    except ValidationError as exc:
        return [f"{_where(e['loc'])}: {e['msg'][0].lower()}{e['msg'][1:]}"
                + ("" if e["type"] == "missing" else f" (got {str(e['input'])[:40]!r})") for e in exc.errors()]
    problems = []
    image_ids = [img.id for img in instances.images]
    if len(set(image_ids)) != len(image_ids):
        repeated = sorted(i for i, n in Counter(image_ids).items() if n > 1)
        problems.append(f"images: ids are not unique ({', '.join(map(str, repeated[:3]))} repeated)")
    first_of: dict[PurePosixPath, int] = {}
    for i, img in enumerate(instances.images):
        # a file name from an untrusted file must name a file inside the image folder, nothing else: a relative path
        # (an export's images/0001.jpg, a dataset's subfolders) without "..", with / between its folders
        name = img.file_name
        relative = PurePosixPath(name)
        if relative.is_absolute() or ".." in relative.parts or not relative.parts or "\\" in name or "\0" in name:
            windows = " (Windows separators: write it with /)" if "\\" in name else ""
            problems.append(f"images[{i}].file_name: {name[:60]!r} is not a relative path inside the image folder"
                            f"{windows}")
        elif relative in first_of:  # one picture under two ids: each id's detections are of every object in it,
            # so the boxes given to the other id score as false positives (the YOLO reader refuses it too)
            problems.append(f"images[{i}].file_name: {name[:60]!r} is images[{first_of[relative]}]'s too (one image "
                            "listed twice: list it once, with all its annotations)")
        else:
            first_of[relative] = i
    # pycocotools indexes annotations and categories by id: a repeated id keeps the last one and loses the other
    # (a box that is never scored, or a category renamed)
    for what, ids in (("annotations", [a.id for a in instances.annotations]),
                      ("categories", [c.id for c in instances.categories])):
        if len(set(ids)) != len(ids):
            repeated = sorted(i for i, n in Counter(ids).items() if n > 1)
            problems.append(f"{what}: ids are not unique ({', '.join(map(str, repeated[:3]))} repeated)")
    for i, cat in enumerate(instances.categories):
        if cat.id < 0:  # negative ids are the harness's mark for "no category"
            problems.append(f"categories[{i}].id: {cat.id} is negative; category ids are 0 or more")
    known_images, known_cats = set(image_ids), {c.id for c in instances.categories}
    for i, ann in enumerate(instances.annotations):
        if ann.image_id not in known_images:
            problems.append(f"annotations[{i}].image_id: {ann.image_id} is not in images")
        if ann.category_id not in known_cats:
            problems.append(f"annotations[{i}].category_id: {ann.category_id} is not in categories")
        if ann.bbox[2] < 0 or ann.bbox[3] < 0 or (not ann.iscrowd and (ann.bbox[2] == 0 or ann.bbox[3] == 0)):
            problems.append(f"annotations[{i}].bbox: {ann.bbox} has no area (width or height 0 or less); "
                            "such a box can never be found")
    return problems + _box_placement_problems(instances)


def _box_placement_problems(instances: _Instances) -> list[str]:
    """Boxes that do not lie on their image: normalised coordinates, [x1, y1, x2, y2] instead of COCO's
    [x, y, width, height], or boxes past the image. pycocotools scores them without a word (a box off its image
    is never matched), so a dataset in another box format would score near 0."""
    boxes = [(i, a) for i, a in enumerate(instances.annotations) if not a.iscrowd]
    sizes = {img.id: (img.width, img.height) for img in instances.images}
    if boxes and all(max(a.bbox) <= 1 for _, a in boxes) and max((max(s) for s in sizes.values()), default=0) > 32:
        return ["annotations: every box's values are 1 or less: normalised coordinates? COCO boxes are "
                "[x, y, width, height] in pixels"]
    # a converter that leaves `area` at 0 puts every object in COCOeval's small range: AP_small scored on all of
    # them, AP_medium and AP_large undefined, without a word (one area of 0 may be a real polygon's; all are not)
    if boxes and all(a.area == 0 for _, a in boxes):
        return ["annotations: every box's area is 0 (COCOeval reads its small, medium and large ranges from area: "
                "the object's pixel area, its mask's, else its box's width x height)"]
    past = []
    for i, ann in boxes:
        if ann.image_id not in sizes:
            continue
        x, y, w, h = ann.bbox
        width, height = sizes[ann.image_id]
        slack_x, slack_y = max(1.0, 0.01 * width), max(1.0, 0.01 * height)  # rounding by annotation tools
        if x < -slack_x or y < -slack_y or x + w > width + slack_x or y + h > height + slack_y:
            # fits as [x1, y1, x2, y2]: on the image from its top-left corner too (a box left of it fits no format)
            as_corners = -slack_x <= x < w <= width + slack_x and -slack_y <= y < h <= height + slack_y
            past.append((i, ann.bbox, width, height, as_corners))
    if not past:
        return []
    i, bbox, width, height, _ = past[0]
    more = f" ({len(past)} boxes in all)" if len(past) > 1 else ""
    hint = (": are the boxes [x1, y1, x2, y2]? COCO boxes are [x, y, width, height]"
            if all(corners for *_, corners in past) else "")
    return [f"annotations[{i}].bbox: {bbox} reaches past its {width}x{height} image{more}{hint}"]


def load_instances(path: Path, name: str | None = None, how_to_fix: str = HOW_TO_GET_COCO) -> COCO:
    """A pycocotools COCO index of a validated instances file; any problem is one UsageError line.

    `name` is how messages name the file (as the user's --coco-dir reaches it); its absolute path follows."""
    name = name or str(path)

    def problem(text: str, fix: str = how_to_fix) -> UsageError:
        where = "" if name == str(path) else f" ({path})"
        return UsageError(f"{name} {text}{where}; {fix}")

    try:
        data = json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise problem(f"is not valid JSON ({json_problem(exc)})") from exc
    except OSError as exc:
        raise problem(f"cannot be read ({exc.strerror})", "check its permissions") from exc
    except RecursionError as exc:
        raise problem("is not a COCO instances file (nested too deeply)") from exc
    problems = _structure_problems(data)
    if problems:
        more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
        raise problem(f"is not a valid COCO instances file: {problems[0]}{more}")
    # pycocotools marks a box not yet matched with id 0 (it assumes ids from 1): a ground-truth box whose id is 0
    # is never counted as found, and its detection counts as a false positive. Roboflow numbers its exports'
    # annotations from 0, so ids below 1 are renumbered 1..N in file order; nothing else reads them.
    if any(a["id"] < 1 for a in data["annotations"]):
        data["annotations"] = [{**a, "id": n} for n, a in enumerate(data["annotations"], 1)]
    return _index(data)


def _index(data: dict) -> COCO:
    """pycocotools' index of checked instances (built from the dict, so a file is read once)."""
    coco = COCO()
    coco.dataset = data
    with contextlib.redirect_stdout(io.StringIO()):  # pycocotools prints progress unconditionally
        coco.createIndex()
    return coco


@dataclass(frozen=True)
class ImageRecord:
    """One image of the dataset, as the pipeline needs it."""

    image_id: int
    path: Path
    width: int
    height: int
    exif_orientation: int = 1  # its EXIF orientation tag: a decoder that ignores it (nvJPEG) must not decode it


def coco_dir_source(coco_dir: str | Path | None = None) -> tuple[str, str] | None:
    """Where the COCO root was given: ("--coco-dir", value) or ("$VA_BENCH_COCO", value); None for the defaults."""
    if coco_dir is not None:
        return "--coco-dir", str(coco_dir)
    if os.environ.get(ENV_COCO_DIR):
        return f"${ENV_COCO_DIR}", os.environ[ENV_COCO_DIR]
    return None


def default_coco_dirs() -> list[Path]:
    """Where COCO is looked for after --coco-dir and $VA_BENCH_COCO: datasets/coco in the working directory (where
    `va-bench data fetch coco` puts it), then, running from the harness's checkout, its datasets/coco and the
    offline sample beside it (../shared/assets/coco)."""
    dirs = [Path.cwd() / "datasets" / "coco"]
    checkout = source_tree()
    if checkout is not None:
        dirs += [checkout / "datasets" / "coco", checkout.parent / "shared" / "assets" / "coco"]
    return list(dict.fromkeys(dirs))


def find_coco_dir(coco_dir: str | Path | None = None) -> Path:
    """The COCO root: --coco-dir, then $VA_BENCH_COCO, then `default_coco_dirs()`."""
    source = coco_dir_source(coco_dir)
    if source is not None:
        flag, given = source
        root = Path(given).expanduser()
        if _annotation_file(root) is not None:
            return root.resolve()
        if not root.exists():
            problem = "no such folder"
        elif not root.is_dir():
            problem = "not a folder"
        else:
            problem = (f"no COCO val2017 annotations in it (looked for annotations/{ANNOTATION_FILES[0]} and "
                       f"annotations/{ANNOTATION_FILES[1]})")
        raise UsageError(f"{path_problem(flag, given, problem)}; {HOW_TO_GET_COCO}")
    candidates = default_coco_dirs()
    for candidate in candidates:
        if _annotation_file(candidate) is not None:
            return candidate.resolve()
    tried = ", ".join(str(c) for c in candidates)
    raise UsageError(f"no COCO val2017 annotations found (looked in {tried}); {HOW_TO_GET_COCO}")


def _annotation_file(root: Path) -> Path | None:
    for name in ANNOTATION_FILES:
        path = root / "annotations" / name
        if path.is_file():
            return path
    return None


class CocoDataset:
    """A COCO-format dataset: COCO val2017 rooted at `root` (annotations/ + val2017/), or, through
    `open_dataset`, any annotation JSON with its image folder (a Roboflow COCO export too). Its identity
    (id, split) and categories are read from what was loaded, never assumed."""

    def __init__(self, root: str | Path | None = None):
        self.root = find_coco_dir(root)
        self.annotation_file = _annotation_file(self.root)
        self.image_dir = self.root / "val2017"
        self.layout = "coco"
        self._fix = HOW_TO_GET_COCO
        source = coco_dir_source(root)
        # how messages name the root: as the user gave it (the absolute path follows), else absolute
        self._named_root = None if source is None else f"{source[0]} {source[1]}"
        self._shown_root = str(self.root) if source is None or source[1] == str(self.root) \
            else f"{source[1]} ({self.root})"

    @classmethod
    def from_path(cls, given: str, split: str | None = None) -> CocoDataset:
        """`--dataset PATH`: an annotation JSON (images beside it, or in images/ beside it), a folder holding
        `_annotations.coco.json` (a Roboflow export split), a Roboflow export root (`--split`), or a YOLO dataset:
        its YAML, or a folder holding data.yaml (`--split`; harness/data/yolo.py)."""
        self = cls.__new__(cls)
        self._named_root = f"--dataset {given}"
        self._shown_root = given if str(Path(given).resolve()) == given else f"{given} ({Path(given).resolve()})"
        self.layout = "custom"
        yaml_path = _yolo_yaml(given)
        if yaml_path is not None:
            found = read_split(yaml_path, split, given)
            self.root, self.annotation_file, self.image_dir = found.root, yaml_path.absolute(), found.image_dir
            self._yolo = found
            self._custom_identity = (_slug(found.dataset_id), found.split)
            self._fix = "fix the dataset's label files"
            return self
        annotation_file, self._image_folders = _custom_layout(given, split)
        self.root, self.annotation_file = annotation_file.parent, annotation_file
        self._fix = "fix the annotation file (COCO format: images, annotations, categories)"
        return self

    _yolo: YoloSplit | None = None  # a YOLO dataset's split, read into COCO instances
    _custom_identity: tuple[str, str]
    # an annotation file's possible image folders with the (dataset id, split) each gives it, in order of preference
    _image_folders: tuple[tuple[Path, tuple[str, str]], ...] = ()

    @cached_property
    def image_dir(self) -> Path:
        """The folder the file names of an annotation file given by `--dataset` are relative to: of its possible
        folders (images/ or data/ beside it, beside it, COCO's layout: annotations/instances_<split>.json with
        <split>/, images/<split>/ or images/ beside annotations/), the one holding the most of up to IMAGE_DIR_PROBES
        images the file lists, spread over it (the first in that order on a tie, the first of all when none holds
        any: the missing images' refusal names it). The other layouts set it when they are opened."""
        listed = [i.get("file_name") for i in self.coco.dataset.get("images") or () if isinstance(i, dict)]
        names = [n for n in listed[::max(1, len(listed) // IMAGE_DIR_PROBES)] if isinstance(n, str)]
        held = [sum((folder / n).is_file() for n in names) for folder, _ in self._image_folders]
        folder, self._custom_identity = self._image_folders[held.index(max(held))]
        return folder

    @property
    def annotation_format(self) -> str:
        """What the ground truth was read from: "coco" (an instances JSON) or "yolo" (a YAML and label files)."""
        return "yolo" if self._yolo is not None else "coco"

    def annotations_sha256(self) -> str:
        """SHA-256 of the ground truth as read: the annotation file's bytes, or a YOLO split's COCO instances (every
        label, class name and image size) as canonical JSON. Two machines with the same value score alike; a run
        resumed on other ground truth is refused."""
        return self._ground_truth_sha256

    @cached_property
    def _ground_truth_sha256(self) -> str:
        if self._yolo is None:
            return file_sha256(self.annotation_file)
        text = json.dumps(self._yolo.instances, sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

    @cached_property
    def categories(self) -> dict[int, str]:
        """Category id -> name of the dataset's classes. A Roboflow export's workspace supercategory (the
        category that is every other one's supercategory and has no annotation) is not a class."""
        cats = self.coco.dataset["categories"]
        annotated = {a["category_id"] for a in self.coco.dataset["annotations"]}

        def workspace(c: dict) -> bool:  # Roboflow's export: {"id": 0, "name": <workspace>, "supercategory": "none"}
            others = [o for o in cats if o is not c]
            return (self.layout == "custom" and c.get("supercategory") == "none" and c["id"] not in annotated
                    and bool(others) and all(o.get("supercategory") == c["name"] for o in others))
        return {c["id"]: c["name"] for c in cats if not workspace(c)}

    @cached_property
    def is_coco_val2017(self) -> bool:
        """A COCO-layout folder whose categories are COCO's 80 (same ids, same names)."""
        return self.layout == "coco" and self.categories == COCO_NAMES_BY_ID

    @cached_property
    def identity(self) -> tuple[str, str]:
        """(dataset id, split) as a submission's dataset block names them."""
        if self.layout == "custom":
            self.image_dir  # noqa: B018 -- an annotation file's identity is that of the image folder it uses
            return self._custom_identity
        return ("coco2017", "val2017") if self.is_coco_val2017 else (_slug(self.root.name), "val2017")

    class_map: ClassMap | None = None  # --class-map, when one renamed the dataset's categories
    orientations: dict[int, int] = {}  # image id -> EXIF orientation other than 1, of the images variant() checked

    def describe(self) -> dict:
        """The dataset block of run.json and submissions (images are the variant's)."""
        dataset_id, split = self.identity
        out = {"id": dataset_id, "split": split, "num_categories": len(self.categories),
               "categories_sha256": categories_sha256(self.categories), "annotations_sha256": self.annotations_sha256()}
        if self.class_map is not None:
            out["class_map"] = self.class_map.record()
        return out

    def label_categories(self, model_id: str, class_names: tuple[str | None, ...],
                         class_map: ClassMap | None = None) -> tuple[int, ...]:
        """The dataset category of each model label (harness/data/classes.py); a UsageError when the model
        does not know the dataset's categories."""
        try:
            annotated = {a["category_id"] for a in self.coco.dataset["annotations"]}
            return match_classes(model_id, class_names, self.categories, class_map, annotated)
        except UsageError as exc:
            raise UsageError(f"{self._shown_root}: {exc}") from exc

    @cached_property
    def coco(self) -> COCO:
        if self._yolo is not None:
            # built by the reader, which checked every row; a copy, since COCOeval marks the ground truth's dicts
            # and the fingerprint (annotations_sha256) is of what was read
            return _index(json.loads(json.dumps(self._yolo.instances)))
        name = None
        if self._named_root is not None:
            name = f"{self._named_root}: {self.annotation_file.relative_to(self.root)}"
        return load_instances(self.annotation_file, name, self._fix)

    def record(self, image_id: int) -> ImageRecord:
        info = self.coco.imgs[image_id]
        return ImageRecord(image_id, self.image_dir / info["file_name"], info["width"], info["height"],
                           self.orientations.get(image_id, 1))

    def records(self, variant: DatasetVariant) -> list[ImageRecord]:
        return [self.record(i) for i in variant.image_ids]

    def _present(self, image_ids) -> tuple[list[int], int, list[str]]:
        """Split ids into present ones, a count of those not annotated, and the file names of those whose file is
        missing."""
        present, not_annotated, absent = [], 0, []
        for image_id in image_ids:
            info = self.coco.imgs.get(image_id)
            if info is None:
                not_annotated += 1
            elif not (self.image_dir / info["file_name"]).is_file():
                absent.append(info["file_name"])
            else:
                present.append(image_id)
        return present, not_annotated, absent

    def _composed_twin(self, file_name: str, listings: dict[Path, dict[str, str]]) -> tuple[str, str] | None:
        """(the annotation's name, the file's) when the image is there under the same name composed otherwise (a
        macOS folder's NFD for an annotation's NFC): they look alike, and a message must show them apart. `listings`:
        each folder's names by their NFC form, read once."""
        wanted = self.image_dir / file_name
        if wanted.parent not in listings:
            names = [p.name for p in wanted.parent.iterdir()] if wanted.parent.is_dir() else []
            listings[wanted.parent] = {unicodedata.normalize("NFC", n): n for n in names}
        found = listings[wanted.parent].get(unicodedata.normalize("NFC", wanted.name))
        return (wanted.name, found) if found is not None and found != wanted.name else None

    def variant(self, name: str, limit: int | None = None) -> DatasetVariant:
        """Resolve a variant; every image it names must be present, look whole (size, first and last
        bytes: `check_image_files`) and have the size its annotations give (`check_image_sizes`), or this is a
        UsageError.

        `limit` keeps the first N sorted ids of the variant and labels the result `subsetN`.
        """
        if limit is not None and limit < 1:
            raise UsageError(f"--limit must be a positive number of images, got {limit}")
        if name in ("full", "mini500") and not self.is_coco_val2017:
            raise UsageError(f"--subset {name} is a COCO val2017 variant and {self._shown_root} is another dataset; "
                             "use --subset sample (all its images) and --limit N")
        if name == "full":
            wanted = sorted(self.coco.imgs) if len(self.coco.imgs) >= VAL2017_NUM_IMAGES else None
            expected = VAL2017_NUM_IMAGES
        elif name == "mini500":
            wanted, expected = list(mini500_ids()), 500
        elif name == "sample":
            wanted = sorted(self.coco.imgs)
            expected = len(wanted)
        else:
            raise UsageError(f"unknown dataset variant {name!r}; use one of full, mini500, sample (+ --limit N)")
        if wanted is None:  # the annotation file cannot describe full val2017
            raise UsageError(
                f"dataset variant 'full' needs all {expected} val2017 images, but {self.annotation_file.name} under "
                f"{self._shown_root} "
                f"describes only {len(self.coco.imgs)}; {HOW_TO_GET_COCO}, or use --subset sample"
            )
        if limit is not None:
            wanted = wanted[:limit]
        present, not_annotated, absent = self._present(wanted)
        missing = len(wanted) - len(present)
        if missing:
            label = name if limit is None else f"the first {len(wanted)} images of {name}"
            named = f": {', '.join(absent[:2])}{', ...' if len(absent) > 2 else ''}" if absent else ""
            listings: dict[Path, dict[str, str]] = {}
            twin = next((t for t in (self._composed_twin(f, listings) for f in absent[:64]) if t), None)
            fix = (f"{twin[0]!a} is there as {twin[1]!a}, the same name composed otherwise (Unicode NFC/NFD): "
                   "rename the files as the annotation file spells them" if twin else self._missing_fix(name))
            raise UsageError(
                f"dataset variant {label!r} needs {len(wanted)} images but {missing} are missing under "
                f"{self._shown_root} ({not_annotated} not in {self.annotation_file.name}, {len(absent)} image files "
                f"absent{named}); {fix}"
            )
        if not present:
            split = self.annotation_file.parent
            others = [s for s in ROBOFLOW_SPLITS if self.annotation_file.name == ROBOFLOW_ANNOTATIONS
                      and s != split.name and (split.parent / s / ROBOFLOW_ANNOTATIONS).is_file()]
            where = (f"the {split.name!r} split's {self.annotation_file.name}" if others
                     else self.annotation_file.name)
            fix = f"score another split (--split {' or '.join(others)}) or {self._fix}" if others else self._fix
            raise UsageError(f"dataset variant {name!r} is empty in {where} under {self._shown_root}: it lists no "
                             f"images; {fix}")
        check_image_files(self.image_dir / self.coco.imgs[i]["file_name"] for i in present)
        if self._yolo is not None:  # its sizes were read from these very headers, with their orientations
            wanted = set(present)
            found = {i: o for i, o in self._yolo.orientations.items() if i in wanted}
        else:
            found = check_image_sizes((i, self.image_dir / self.coco.imgs[i]["file_name"], self.coco.imgs[i]["width"],
                                       self.coco.imgs[i]["height"]) for i in present)
        self.orientations = {**self.orientations, **found}
        final_name = name if limit is None or limit >= expected else f"subset{len(present)}"
        return DatasetVariant(name=final_name, image_ids=tuple(present), base=name)

    def check_ground_truth(self, variant: DatasetVariant) -> None:
        """A UsageError when the variant's images hold no annotation to score (COCO mAP is undefined there; a
        timing-only run, --no-accuracy, needs none)."""
        if not any(not a.get("iscrowd") and a["category_id"] in self.categories
                   for i in variant.image_ids for a in self.coco.imgToAnns.get(i, ())):
            raise UsageError(f"dataset variant {variant.name!r} under {self._shown_root} holds no annotation to "
                             "score: COCO mAP is undefined without ground truth; give a dataset with annotations, "
                             "a larger --limit, or time it only with --no-accuracy")

    def check_masks(self, variant: DatasetVariant) -> None:
        """A UsageError unless every annotation of the variant's images has a mask to score a segmentation model's
        masks against, one pycocotools rasterises as drawn: polygons of three points or more, or an RLE of its
        image's size whose runs cover the image. A detection export has boxes only (`"segmentation": []`): there
        every mask would miss, a silent segm AP of 0; an RLE of another size, or runs short of the image, would be
        scored as a mask that no detection matches (or decoded from memory past its runs)."""
        missing, first = 0, None
        for image_id in variant.image_ids:
            for ann in self.coco.imgToAnns.get(image_id, ()):
                if not has_mask(ann.get("segmentation")):
                    missing += 1
                    first = first or ann
        if missing:
            where = (f"{self._yolo.rows[first['id'] - 1]}, a box" if self._yolo is not None else
                     f"annotations[{self.coco.dataset['annotations'].index(first)}] in the file, segmentation "
                     f"{str(first.get('segmentation', 'absent'))[:30]}")
            raise UsageError(f"{self._shown_root}: {missing} annotations of the images to score have no mask (the "
                             f"first: {where}); "
                             "a segmentation model's masks need ground-truth masks: use a dataset exported with "
                             "them, or score boxes only with --no-masks")
        for image_id in variant.image_ids:
            info = self.coco.imgs[image_id]
            for ann in self.coco.imgToAnns.get(image_id, ()):
                problem = mask_problem(ann["segmentation"], info["height"], info["width"])
                if problem is not None:
                    index = self.coco.dataset["annotations"].index(ann)
                    raise UsageError(f"{self.annotation_file}: annotations[{index}] (id {ann['id']}, image "
                                     f"{info['file_name']}) has a mask that cannot be scored: {problem}; fix or "
                                     "remove that annotation, or score boxes only with --no-masks")

    def _missing_fix(self, name: str) -> str:
        """How to get the missing images: COCO's are fetched; a dataset of the user's own is theirs to complete."""
        if self.layout == "custom":
            others = [str(f) for f, _ in self._image_folders if f != self.image_dir]
            looked = f" (also looked in {', '.join(others)})" if others and self._yolo is None else ""
            return (f"put the image files in {self.image_dir}{looked}, or remove their entries from "
                    f"{self.annotation_file.name}")
        return f"{HOW_TO_GET_COCO}" + (", or use --subset sample / --limit N" if name != "sample" else "")


def has_mask(segmentation) -> bool:
    """Whether an annotation has a mask at all (a detection export's is `[]` or absent): polygons or an RLE, whose
    shape `mask_problem` checks."""
    if isinstance(segmentation, dict):
        return "counts" in segmentation and "size" in segmentation
    return isinstance(segmentation, list) and bool(segmentation)


def mask_problem(segmentation, height: int, width: int) -> str | None:
    """Why pycocotools could not rasterise `segmentation` as a mask of an image `height` x `width` as drawn, or
    None. pycocotools takes a polygon of 4 values as a box and has no check that an RLE's runs cover its image
    (runs short of it decode memory past them, runs past it fail mid-evaluation); faster-coco-eval reads both
    differently again."""
    if isinstance(segmentation, dict):
        size, counts = segmentation["size"], segmentation["counts"]
        if size != [height, width] or any(isinstance(v, bool) for v in size):
            return f"an RLE of size {str(size)[:40]}, not its image's [height, width] [{height}, {width}]"
        runs = rle_runs(counts)
        if runs is None:
            return "RLE counts that are neither run lengths (non-negative integers) nor COCO's compressed string"
        if sum(runs) != height * width:
            return f"RLE runs covering {sum(runs)} pixels, not its image's {height} x {width} = {height * width}"
        return None
    for polygon in segmentation:
        if not isinstance(polygon, list) or not all(
                isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in polygon):
            return f"a polygon that is not a list of numbers ({str(polygon)[:40]})"
        if len(polygon) % 2:
            return f"a polygon of {len(polygon)} values, not x, y pairs"
    # pycocotools reads the first polygon's length as the format: 4 values are a box to it (faster-coco-eval draws a
    # polygon), fewer are an error; a later short fragment of a mask (an export's) is drawn alike by both
    if len(segmentation[0]) < 6:
        return (f"a first polygon of {len(segmentation[0])} values, not three points or more (pycocotools reads 4 "
                "as a box)")
    return None


def rle_runs(counts) -> list[int] | None:
    """An RLE's run lengths: its `counts` as a list, or COCO's compressed string decoded (maskApi.c's rleFrString:
    5 bits a character, offset 48, a continuation bit, a sign bit, each run from the second one before it); None
    when `counts` is neither. By hand: pycocotools and faster-coco-eval decode a string into a mask only, with no
    check that its runs add up to the image."""
    if isinstance(counts, list):
        ok = all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in counts)
        return counts if ok else None
    if isinstance(counts, bytes):
        counts = counts.decode("ascii", errors="replace")
    if not isinstance(counts, str):
        return None
    runs: list[int] = []
    value = shift = 0
    for char in counts:
        code = ord(char) - 48
        if not 0 <= code < 64:
            return None
        value |= (code & 0x1F) << shift
        shift += 5
        if code & 0x20:  # more characters to this run
            continue
        if code & 0x10:  # negative
            value -= 1 << shift
        if len(runs) > 2:
            value += runs[-2]
        if value < 0:
            return None
        runs.append(value)
        value = shift = 0
    return runs if shift == 0 else None


ROBOFLOW_ANNOTATIONS = "_annotations.coco.json"
IMAGE_DIR_PROBES = 64  # listed images an annotation file's possible image folders are tried with
ROBOFLOW_SPLITS = ("valid", "test", "train")


def _slug(name: str) -> str:
    """A dataset id from a folder or file name: lower-case letters and digits of any script with their marks (a
    Devanagari vowel sign, a Tamil virama), '_', '.' and '-'; a name in another script stays itself (two such
    folders were both "dataset")."""
    kept = "".join(c if c.isalnum() or c in "_.-" or unicodedata.category(c) in ("Mn", "Mc") else " "
                   for c in unicodedata.normalize("NFC", name).lower())
    return re.sub(r" +", "-", kept).strip("-.") or "dataset"


def categories_sha256(categories: dict[int, str]) -> str:
    """SHA-256 of the sorted `id<TAB>name` lines: two datasets with the same classes under the same ids
    have the same value."""
    text = "\n".join(f"{i}\t{n}" for i, n in sorted(categories.items()))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _yolo_split_hint(path: Path) -> str | None:
    """For a YOLO split's folder given as --dataset (`valid/`, `valid/images`, `images/val`): the YAML above it and
    the --split to give with it; None when no YAML is found up to two folders above."""
    folder = path.resolve()
    split = folder.parent.name if folder.name in ("images", "labels") else folder.name
    if folder.name in ("images", "labels") and any(f.is_dir() for f in folder.iterdir()):
        split = None  # the splits' parent (images/val, images/train): the YAML names them
    if folder.name not in ("images", "labels") and not (folder / "images").is_dir():
        if folder.parent.name not in ("images", "labels"):
            return None
    for above in (folder.parent, folder.parent.parent, folder.parent.parent.parent):
        try:
            yaml_path = dataset_yaml(str(above))
        except UsageError:
            return None
        if yaml_path is not None and split is None:
            return f"this is a YOLO dataset's {folder.name} folder: give its dataset's YAML, --dataset {yaml_path}"
        if yaml_path is not None:
            return f"this is a YOLO split's folder: give its dataset's YAML, --dataset {yaml_path} --split {split}"
    return None


def _yolo_yaml(given: str) -> Path | None:
    """The YOLO dataset YAML of a `--dataset` path that is no COCO layout (an annotation JSON, a folder with
    `_annotations.coco.json`, or a Roboflow COCO export's root come first); None for those."""
    path = Path(given).expanduser()
    if path.suffix.lower() == ".json" or (path.is_dir() and any(
            (path / s / ROBOFLOW_ANNOTATIONS).is_file() for s in ("", *ROBOFLOW_SPLITS))):
        return None
    return dataset_yaml(given)


def takes_split(given: str) -> bool:
    """Whether a `--dataset` path holds splits for `--split` to choose from: a Roboflow export's root (split folders
    under it) or a YOLO dataset."""
    path = Path(given).expanduser()
    return _yolo_yaml(given) is not None or (path.is_dir() and not (path / ROBOFLOW_ANNOTATIONS).is_file())


def check_custom_layout(given: str, split: str | None) -> None:
    """One UsageError line when a `--dataset` path (with `--split`) is none of the layouts a run reads."""
    yaml_path = _yolo_yaml(given)
    if yaml_path is None:
        _custom_layout(given, split)
    else:
        locate_split(yaml_path, split, given)


def _custom_layout(given: str, split: str | None) -> tuple[Path, tuple[tuple[Path, tuple[str, str]], ...]]:
    """(annotation file, its possible image folders, each with the (dataset id, split) it gives) of a `--dataset`
    path; one UsageError line when it is none of the layouts."""
    path = Path(given).expanduser()
    layouts = (f"an annotation JSON, a folder with {ROBOFLOW_ANNOTATIONS}, a Roboflow export with "
               f"{'/'.join(ROBOFLOW_SPLITS)} folders, or a YOLO dataset's data.yaml")
    if not path.exists():
        raise UsageError(path_problem("--dataset", given, "no such file or folder") + f"; give {layouts}")
    if path.is_file():
        if split is not None:
            raise UsageError("--split applies to a Roboflow export folder, not to an annotation file; drop it")
        # folders are looked for where the file was given: a link (git-annex, DVC's cache) where it lies, not where
        # it points; `labels.json` in the folder it lies in, `../labels.json` in that folder (not "." or "..")
        file = Path(os.path.abspath(path))
        here = file.parent
        # a Roboflow split's file names its split by its folder, as the folder given itself does (cars/valid/)
        identity = (_slug(here.parent.name), _slug(here.name)) if path.name == ROBOFLOW_ANNOTATIONS else \
            (_slug(here.name), _slug(path.stem))
        # images/ or FiftyOne's data/ beside it, or beside it
        folders = [((here / name).resolve(), identity) for name in ("images", "data") if (here / name).is_dir()]
        folders.append((here.resolve(), identity))
        # COCO's own layout (and detectron2's, YOLOX's, Datumaro's and so CVAT's): root/annotations/
        # instances_<split>.json, root/<split>/ or root/images/<split>/ (or root/images/); only there: a file in
        # another folder is that folder's dataset, whatever lies beside the folder
        if here.name == "annotations":
            stem = path.stem.removeprefix("instances_")
            root = here.parent
            coco_identity = (_slug(root.resolve().name), _slug(stem))
            folders += [((root / sub).resolve(), coco_identity) for sub in (stem, f"images/{stem}", "images")]
        return file, tuple(folders)  # a link kept: run.json's path finds the same folders again
    if (path / ROBOFLOW_ANNOTATIONS).is_file():
        if split is not None and split != path.name:
            raise UsageError(path_problem("--dataset", given, f"is the {path.name!r} split already")
                             + f"; drop --split {split} or give the export's root folder")
        return (path / ROBOFLOW_ANNOTATIONS).resolve(), \
            ((path.resolve(), (_slug(path.resolve().parent.name), _slug(path.name))),)
    present = [s for s in ROBOFLOW_SPLITS if (path / s / ROBOFLOW_ANNOTATIONS).is_file()]
    coco_splits = sorted(f.name.removeprefix("instances_").removesuffix(".json")
                         for f in (path / "annotations").glob("instances_*.json"))
    if not present and coco_splits:  # COCO's own layout's root: annotations/instances_<split>.json
        vals = [s for s in coco_splits if s.startswith("val")]
        chosen = split or (coco_splits[0] if len(coco_splits) == 1 else vals[0] if len(vals) == 1 else None)
        if chosen not in coco_splits:
            asked = f"has no {chosen!r} split" if chosen else f"holds the splits {', '.join(coco_splits)}"
            raise UsageError(path_problem("--dataset", given, asked) + f"; use --split {' or '.join(coco_splits)}")
        if f"instances_{chosen}.json" in ANNOTATION_FILES:  # COCO val2017 itself: its rows are the COCO boards'
            raise UsageError(path_problem("--dataset", given, "is COCO val2017 in its own layout")
                             + f"; give it as --coco-dir {given} (its rows are then COCO's, and --subset mini500 "
                               "and full apply)")
        return _custom_layout(str(path / "annotations" / f"instances_{chosen}.json"), None)
    if not present:
        hint = _yolo_split_hint(path)
        raise UsageError(path_problem("--dataset", given, "holds no COCO annotations")
                         + (f"; {hint}" if hint else f"; give {layouts}"))
    chosen = split or present[0]
    if chosen not in present:
        raise UsageError(path_problem("--dataset", given, f"has no {chosen!r} split")
                         + f"; use --split {' or '.join(present)}")
    return (path / chosen / ROBOFLOW_ANNOTATIONS).resolve(), \
        (((path / chosen).resolve(), (_slug(path.resolve().name), chosen)),)
