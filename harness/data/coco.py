"""COCO val2017 on disk: discovery, annotations (validated, then pycocotools), and variant resolution."""

from __future__ import annotations

import contextlib
import io
import json
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Annotated, Literal

from pycocotools.coco import COCO
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from harness.data.images import check_image_files
from harness.data.variants import VAL2017_NUM_IMAGES, DatasetVariant, mini500_ids
from harness.errors import UsageError, path_problem

REPO_ROOT = Path(__file__).resolve().parents[2]
ENV_COCO_DIR = "VA_BENCH_COCO"
# Searched in this order after --coco-dir and $VA_BENCH_COCO.
DEFAULT_COCO_DIRS = (REPO_ROOT / "datasets" / "coco", REPO_ROOT.parent / "shared" / "assets" / "coco")
# The official full file first; a subset file holds the official records of the images present.
ANNOTATION_FILES = ("instances_val2017.json", "instances_val2017_subset.json")
HOW_TO_GET_COCO = (
    "get COCO val2017 (images + annotations, see datasets/README.md) and pass --coco-dir or set "
    f"${ENV_COCO_DIR}"
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
        problems.append("images: image ids are not unique")
    for i, img in enumerate(instances.images):
        # a file name from an untrusted file must name a file inside val2017/, nothing else
        name = img.file_name
        if Path(name).name != name or name in (".", "..") or "\\" in name or "\0" in name:
            problems.append(f"images[{i}].file_name: {name[:60]!r} is not a plain file name")
    known_images, known_cats = set(image_ids), {c.id for c in instances.categories}
    for i, ann in enumerate(instances.annotations):
        if ann.image_id not in known_images:
            problems.append(f"annotations[{i}].image_id: {ann.image_id} is not in images")
        if ann.category_id not in known_cats:
            problems.append(f"annotations[{i}].category_id: {ann.category_id} is not in categories")
        if ann.bbox[2] < 0 or ann.bbox[3] < 0:
            problems.append(f"annotations[{i}].bbox: negative width or height {ann.bbox}")
    return problems


def load_instances(path: Path, name: str | None = None) -> COCO:
    """A pycocotools COCO index of a validated instances file; any problem is one UsageError line.

    `name` is how messages name the file (as the user's --coco-dir reaches it); its absolute path follows."""
    name = name or str(path)

    def problem(text: str, fix: str = HOW_TO_GET_COCO) -> UsageError:
        where = "" if name == str(path) else f" ({path})"
        return UsageError(f"{name} {text}{where}; {fix}")

    try:
        data = json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise problem(f"is not valid JSON ({str(exc)[:80]})") from exc
    except OSError as exc:
        raise problem(f"cannot be read ({exc.strerror})", "check its permissions") from exc
    except RecursionError as exc:
        raise problem("is not a COCO instances file (nested too deeply)") from exc
    problems = _structure_problems(data)
    if problems:
        more = f" (and {len(problems) - 1} more problems)" if len(problems) > 1 else ""
        raise problem(f"is not a valid COCO instances file: {problems[0]}{more}")
    coco = COCO()  # built from the checked dict, so the file is read once
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


def coco_dir_source(coco_dir: str | Path | None = None) -> tuple[str, str] | None:
    """Where the COCO root was given: ("--coco-dir", value) or ("$VA_BENCH_COCO", value); None for the defaults."""
    if coco_dir is not None:
        return "--coco-dir", str(coco_dir)
    if os.environ.get(ENV_COCO_DIR):
        return f"${ENV_COCO_DIR}", os.environ[ENV_COCO_DIR]
    return None


def find_coco_dir(coco_dir: str | Path | None = None) -> Path:
    """The COCO root: --coco-dir, then $VA_BENCH_COCO, then datasets/coco, then ../shared/assets/coco."""
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
    for candidate in DEFAULT_COCO_DIRS:
        if _annotation_file(candidate) is not None:
            return candidate.resolve()
    tried = ", ".join(str(c) for c in DEFAULT_COCO_DIRS)
    raise UsageError(f"no COCO val2017 annotations found (looked in {tried}); {HOW_TO_GET_COCO}")


def _annotation_file(root: Path) -> Path | None:
    for name in ANNOTATION_FILES:
        path = root / "annotations" / name
        if path.is_file():
            return path
    return None


class CocoDataset:
    """COCO val2017 rooted at `root` (annotations/ + val2017/)."""

    def __init__(self, root: str | Path | None = None):
        self.root = find_coco_dir(root)
        self.annotation_file = _annotation_file(self.root)
        self.image_dir = self.root / "val2017"
        source = coco_dir_source(root)
        # how messages name the root: as the user gave it (the absolute path follows), else absolute
        self._named_root = None if source is None else f"{source[0]} {source[1]}"
        self._shown_root = str(self.root) if source is None or source[1] == str(self.root) \
            else f"{source[1]} ({self.root})"

    @cached_property
    def coco(self) -> COCO:
        name = None
        if self._named_root is not None:
            name = f"{self._named_root}: {self.annotation_file.relative_to(self.root)}"
        return load_instances(self.annotation_file, name)

    def record(self, image_id: int) -> ImageRecord:
        info = self.coco.imgs[image_id]
        return ImageRecord(image_id, self.image_dir / info["file_name"], info["width"], info["height"])

    def records(self, variant: DatasetVariant) -> list[ImageRecord]:
        return [self.record(i) for i in variant.image_ids]

    def _present(self, image_ids) -> tuple[list[int], int, int]:
        """Split ids into present ones and counts of (not annotated, file missing)."""
        present, not_annotated, no_file = [], 0, 0
        for image_id in image_ids:
            info = self.coco.imgs.get(image_id)
            if info is None:
                not_annotated += 1
            elif not (self.image_dir / info["file_name"]).is_file():
                no_file += 1
            else:
                present.append(image_id)
        return present, not_annotated, no_file

    def variant(self, name: str, limit: int | None = None) -> DatasetVariant:
        """Resolve a variant; every image it names must be present and look whole (size, first and last
        bytes: `check_image_files`), or this is a UsageError.

        `limit` keeps the first N sorted ids of the variant and labels the result `subsetN`.
        """
        if limit is not None and limit < 1:
            raise UsageError(f"--limit must be a positive number of images, got {limit}")
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
        present, not_annotated, no_file = self._present(wanted)
        missing = len(wanted) - len(present)
        if missing:
            label = name if limit is None else f"the first {len(wanted)} images of {name}"
            raise UsageError(
                f"dataset variant {label!r} needs {len(wanted)} images but {missing} are missing under "
                f"{self._shown_root} ({not_annotated} not in {self.annotation_file.name}, {no_file} image files "
                f"absent); {HOW_TO_GET_COCO}, or use --subset sample / --limit N"
            )
        if not present:
            raise UsageError(f"dataset variant {name!r} is empty in {self.annotation_file.name} under "
                             f"{self._shown_root}")
        check_image_files(self.image_dir / self.coco.imgs[i]["file_name"] for i in present)
        final_name = name if limit is None or limit >= expected else f"subset{len(present)}"
        return DatasetVariant(name=final_name, image_ids=tuple(present), base=name)
