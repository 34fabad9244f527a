"""YOLO-format datasets (Ultralytics' and LibreYOLO's `data.yaml` with `labels/*.txt`), read into a COCO instances
dict, so that they are scored like any COCO-format dataset.

The layout rules are Ultralytics' own (`check_det_dataset`, `img2label_paths`): a split is a folder of images
(searched recursively), a text file listing images, or a list of either; each image's labels are the `.txt` at its
path with the last `images` folder replaced by `labels`; a row is `class cx cy w h` or `class x1 y1 x2 y2 ...` (a
polygon), normalised to the image's width and height. An image with no label file holds no object.

Read here rather than through a library: Ultralytics and LibreYOLO (`verify_image_label`, `YOLOCocoAPI`) skip a
line or a whole image's labels they cannot read, with a warning, and supervision decodes every image to learn its
size. The harness refuses such data in one line naming the file and the line (a dropped box would be scored as an
object that is not there), and reads each image's size from its header. Boxes are clipped to the image, as
LibreYOLO's COCO view of a YOLO dataset clips them (the harness's tests check this reader against it).
"""

from __future__ import annotations

import glob
import math
import os
from dataclasses import dataclass
from pathlib import Path

import yaml

from harness.data.images import HOW_TO_FIX, decoded_size, unreadable_reason
from harness.errors import UsageError, path_problem
from harness.files import load_user_yaml, yaml_problem

YAML_NAMES = ("data.yaml", "data.yml")
# Ultralytics' IMG_FORMATS: every file it would take as an image is one here, so that one the harness cannot decode
# (DNG, PFM, HEIC: data/images.py) is refused by name instead of left out of the split
IMAGE_SUFFIXES = frozenset({".bmp", ".dng", ".jpeg", ".jpg", ".mpo", ".png", ".tif", ".tiff", ".webp", ".pfm",
                            ".heic"})
SPLITS = ("val", "test", "train")
SPLIT_ALIASES = {"valid": "val"}  # a Roboflow YOLO export's folder is "valid", its YAML's key "val"
LABEL_FORMAT = "YOLO label rows are `class cx cy w h` or `class x1 y1 x2 y2 x3 y3 ...`, normalised to [0, 1]"
# Ultralytics' "coordinate points check with 1% tolerance": values in [-0.01, 1.01] are rounding, clipped to the image
TOLERANCE = 0.01
MIN_EXTENT_PX = 0.01  # a box or polygon narrower than this (a rounded 0) is no object a detector could find


@dataclass(frozen=True)
class YoloSplit:
    """One split of a YOLO dataset as COCO instances: image ids 1..N in path order, file names relative to
    `image_dir`, category ids the YOLO class indices."""

    yaml_path: Path
    root: Path  # the dataset's root: the YAML's `path`, else its folder
    split: str  # the YAML's key: val, test or train
    image_dir: Path  # the folder every image of the split lies under
    instances: dict
    rows: tuple[str, ...]  # where annotation id i + 1 was read: 'label file FILE line N'
    orientations: dict[int, int]  # image id -> EXIF orientation other than 1, read with the sizes

    @property
    def dataset_id(self) -> str:
        return self.root.name


def dataset_yaml(given: str) -> Path | None:
    """The YOLO dataset YAML a `--dataset` path names: a .yaml/.yml path (existing or not: its refusal is the YAML's),
    or a folder holding data.yaml, else its only YAML file (Ultralytics' `find_dataset_yaml`); None otherwise. The
    caller asks only of paths that are no COCO layout. A folder with several YAML files and no data.yaml is refused
    by name."""
    path = Path(given).expanduser()
    if path.suffix.lower() in (".yaml", ".yml") and not path.is_dir():
        return path
    if not path.is_dir():
        return None
    for name in YAML_NAMES:
        if (path / name).is_file():
            return path / name
    found = sorted(p for p in path.iterdir() if p.suffix.lower() in (".yaml", ".yml") and p.is_file())
    if len(found) > 1:
        raise UsageError(path_problem("--dataset", given, "holds several YAML files and no data.yaml ("
                                      + ", ".join(p.name for p in found[:4]) + ")")
                         + "; give the YOLO dataset's YAML itself")
    return found[0] if found else None


@dataclass(frozen=True)
class SplitLayout:
    """A split as its YAML lays it out: the class names, the dataset's root, the split's key and its images."""

    names: dict[int, str]
    root: Path
    key: str
    images: list[Path]


def locate_split(yaml_path: Path, split: str | None, named: str) -> SplitLayout:
    """The YAML read and the split's images found, no label read: what a campaign checks of each dataset up front
    (a broken label is that dataset's run's refusal, not the campaign file's)."""
    config = _read_yaml(yaml_path, named)
    names = _class_names(config, named)
    root = _root(config, yaml_path, named)
    key = _split_key(config, split, named)
    return SplitLayout(names, root, key, _split_images(config[key], root, key, named))


def read_split(yaml_path: Path, split: str | None, named: str) -> YoloSplit:
    """The split `split` (default: val, else test) of the dataset `yaml_path` describes, as COCO instances. Any
    problem is one UsageError line naming the file (`named`: the YAML as the user gave it) and how to fix it."""
    layout = locate_split(yaml_path, split, named)
    names, root, key, images = layout.names, layout.root, layout.key, layout.images
    label_files = [label_path(p) for p in images]
    if not any(f.is_file() for f in label_files):
        raise UsageError(path_problem("--dataset", named, f"split {key!r} has {len(images)} images and no label file "
                                      f"(the first image's would be {label_files[0]})")
                         + "; YOLO labels lie at each image's path with its last images/ folder as labels/ and .txt")
    image_dir = Path(os.path.commonpath([str(p.parent) for p in images]))
    records, annotations, rows, orientations = [], [], [], {}
    for image_id, (image, labels) in enumerate(zip(images, label_files, strict=True), 1):
        try:
            width, height, orientation = decoded_size(image)
        except (OSError, SyntaxError, ValueError) as exc:
            raise UsageError(f"image {image} cannot be read as an image ({unreadable_reason(exc, image)}); "
                             f"{HOW_TO_FIX}") from exc
        if orientation != 1:
            orientations[image_id] = orientation
        records.append({"id": image_id, "file_name": image.relative_to(image_dir).as_posix(), "width": width,
                        "height": height})
        if labels.is_file():
            for row in _label_rows(labels, names):
                annotations.append({"id": len(annotations) + 1, "image_id": image_id, "iscrowd": 0,
                                    **_annotation(row, width, height)})
                rows.append(row.where)
    categories = [{"id": index, "name": name} for index, name in sorted(names.items())]
    return YoloSplit(yaml_path, root, key, image_dir,
                     {"images": records, "annotations": annotations, "categories": categories}, tuple(rows),
                     orientations)


def label_path(image: Path) -> Path:
    """Ultralytics' `img2label_paths`: the image's path with its last `images` folder as `labels`, and `.txt`."""
    text = str(image)
    before, sep, after = text.rpartition(f"{os.sep}images{os.sep}")
    if sep:
        text = f"{before}{os.sep}labels{os.sep}{after}"
    return Path(text).with_suffix(".txt")


def _read_yaml(yaml_path: Path, named: str) -> dict:
    if not yaml_path.is_file():
        raise UsageError(path_problem("--dataset", named, "no such file" if not yaml_path.exists() else "not a file")
                         + "; give a YOLO dataset's YAML (path, val or test, names), or the folder holding it")
    try:
        config = load_user_yaml(yaml_path.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError, OSError) as exc:
        raise UsageError(path_problem("--dataset", named, f"is not a readable YAML file{yaml_problem(exc)}")
                         + "; give a YOLO dataset YAML (path, train/val/test, names)") from exc
    if not isinstance(config, dict):
        raise UsageError(path_problem("--dataset", named, "is empty" if config is None else
                                      "is not a YOLO dataset YAML (not a mapping)")
                         + "; give one with path, val (or test) and names")
    if config.get("kpt_shape") is not None:
        raise UsageError(path_problem("--dataset", named, "is a pose (keypoint) dataset (it sets kpt_shape)")
                         + "; va-bench scores detection and instance segmentation")
    if "validation" in config and "val" not in config:  # Ultralytics' check_det_dataset renames it
        config = {**config, "val": config["validation"]}
    return config


def _class_names(config: dict, named: str) -> dict[int, str]:
    """Class index -> name: `names` as a list or an {index: name} mapping; `class_i` for `nc` classes without one
    (as Ultralytics names them); `nc` must agree with `names`."""
    names, nc = config.get("names"), config.get("nc")

    def refuse(problem: str) -> UsageError:
        return UsageError(path_problem("--dataset", named, problem)
                          + "; give `names:` as a list of class names, or as {index: name}")
    if nc is not None and (isinstance(nc, bool) or not isinstance(nc, int) or nc < 1):
        raise refuse(f"nc is {nc!r}, not a number of classes")
    if names is None:
        if nc is None:
            raise refuse("has neither names nor nc")
        return {i: f"class_{i}" for i in range(nc)}
    if isinstance(names, list):
        names = dict(enumerate(names))
    if not isinstance(names, dict) or not names:
        raise refuse("names is neither a list nor a mapping of class names")
    # Ultralytics' check_class_names reads each key as int(k): '0' is class 0
    names = {int(k) if isinstance(k, str) and k.strip().isdigit() else k: v for k, v in names.items()}
    for index, name in names.items():
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise refuse(f"names has the key {index!r}, not a class index (0, 1, ...)")
        if not isinstance(name, (str, int, float)) or isinstance(name, bool) or str(name) == "":
            raise refuse(f"names[{index}] is {name!r}, not a class name")
    if nc is not None and nc != len(names):  # names are what rows index: nc is the one usually left stale
        raise UsageError(path_problem("--dataset", named, f"nc is {nc} but names holds {len(names)} classes")
                         + f"; set nc: {len(names)} (or drop nc), or give names every class")
    return {index: str(name) for index, name in names.items()}


def _root(config: dict, yaml_path: Path, named: str) -> Path:
    """The dataset root: `path` (relative to the YAML's folder), else the YAML's folder. (Ultralytics also looks in
    its own settings' datasets_dir; the harness reads no settings of another tool.)"""
    given = config.get("path")
    if given is None or given == "":
        return yaml_path.parent.absolute()
    root = Path(str(given)).expanduser()
    root = root if root.is_absolute() else yaml_path.parent.absolute() / root
    if not root.is_dir():
        raise UsageError(path_problem("--dataset", named, f"its path {given!r} is not a folder ({root})")
                         + "; set path to the dataset's root folder (absolute, or relative to the YAML's folder)")
    return root


def _split_key(config: dict, split: str | None, named: str) -> str:
    present = [k for k in SPLITS if config.get(k)]
    if split is None:
        for key in ("val", "test"):
            if key in present:
                return key
        raise UsageError(path_problem("--dataset", named, "names no val or test split")
                         + ("; score the training images with --split train" if "train" in present
                            else "; add val: (a folder or list of images) to it"))
    key = SPLIT_ALIASES.get(split, split)
    if key not in present:
        raise UsageError(path_problem("--dataset", named, f"has no {split!r} split")
                         + (f"; use --split {' or '.join(present)}" if present else "; add val: to it"))
    return key


def _split_images(value, root: Path, key: str, named: str) -> list[Path]:
    """The image files of a split: each entry a folder (searched recursively), a text file of image paths (relative
    ones to its folder), or an image; relative entries are the root's. Sorted; one listed twice is refused."""
    entries = value if isinstance(value, list) else [value]
    images: list[Path] = []
    for entry in entries:
        if not isinstance(entry, str) or not entry:
            raise UsageError(path_problem("--dataset", named, f"{key}: {entry!r} is not a path")
                             + "; give a folder, a text file of image paths, or a list of them")
        path = Path(entry).expanduser()
        if not path.is_absolute():
            path = root / entry
            if not path.exists() and entry.startswith("../"):  # Roboflow's exports: '../valid/images' beside the YAML
                path = root / entry[3:]
        if path.is_dir():  # as Ultralytics lists it: through symlinked folders, without hidden files and folders
            found = glob.glob(os.path.join(glob.escape(str(path)), "**", "*.*"), recursive=True)
            in_folder = [p for p in map(Path, found) if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()]
            _check_no_orphan_labels(path, in_folder, named)
            images += in_folder
        elif path.is_file() and path.suffix.lower() == ".txt":
            images += _listed_images(path, named)
        elif path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES:
            images.append(path)
        else:
            problem = "no such file or folder" if not path.exists() else "is not a folder, image or .txt list"
            raise UsageError(path_problem("--dataset", named, f"{key}: {entry} ({path}): {problem}")
                             + "; give each split as a folder of images, a text file of image paths, or a list")
    if not images:
        raise UsageError(path_problem("--dataset", named, f"split {key!r} holds no image file")
                         + "; put its images (JPEG, PNG, WebP, BMP or TIFF) in the folder it names")
    seen: dict[str, Path] = {}
    for image in images:  # one file under two spellings (./x.jpg, ../root/x.jpg, a link) is one image
        real = os.path.realpath(image)
        if real in seen:
            also = "" if seen[real] == image else f" (also as {seen[real]})"
            raise UsageError(path_problem("--dataset", named, f"split {key!r} lists {image} twice{also}")
                             + "; list each image once (its labels would count twice)")
        seen[real] = image
    return sorted(images, key=str)


def _check_no_orphan_labels(folder: Path, images: list[Path], named: str) -> None:
    """A label file in the folder's labels/ twin that no image of the folder has: its image is gone, and its objects
    would silently not be scored (Ultralytics reads labels through images and never sees it). A UsageError naming
    it; a folder without an images/ twin (labels beside the images) is not checked."""
    labels = label_path(folder / "x.jpg").parent
    if labels == folder or not labels.is_dir():
        return
    # the files the images' labels are, by identity: a case-insensitive disk finds IMG_1.JPG's label as img_1.txt
    expected = {(st.st_dev, st.st_ino) for p in images if (st := _stat(label_path(p))) is not None}
    orphans = sorted(p for p in labels.rglob("*.txt") if p.name != "classes.txt"
                     and not any(part.startswith(".") for part in p.relative_to(labels).parts)  # as images are listed
                     and (st := _stat(p)) is not None and (st.st_dev, st.st_ino) not in expected)
    if orphans:
        more = f" and {len(orphans) - 1} more" if len(orphans) > 1 else ""
        raise UsageError(path_problem("--dataset", named, f"label file {orphans[0]}{more} has no image in {folder}")
                         + "; put its image back, or remove the label file (its objects would not be scored)")


def _stat(path: Path) -> os.stat_result | None:
    try:
        return path.stat()
    except OSError:
        return None


def _listed_images(listing: Path, named: str) -> list[Path]:
    images = []
    for number, line in enumerate(listing.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        image = Path(line[2:] if line.startswith("./") else line).expanduser()
        image = image if image.is_absolute() else listing.parent / image
        if image.suffix.lower() not in IMAGE_SUFFIXES or not image.is_file():
            problem = "no such file" if not image.exists() else "not an image file"
            raise UsageError(path_problem("--dataset", named, f"{listing} line {number}: {line[:80]!r} is {problem}")
                             + "; list one image path per line (relative ones to the list's folder)")
        images.append(image)
    return images


@dataclass(frozen=True)
class _Row:
    where: str  # 'FILE line N', for messages
    class_index: int
    values: tuple[float, ...]  # cx, cy, w, h, or a polygon's x1, y1, x2, y2, ...


def _label_rows(path: Path, names: dict[int, str]) -> list[_Row]:
    """The rows of one label file, each checked: a class index the YAML names, 4 values (a box) or 6 or more in
    pairs (a polygon), all finite and within [0, 1] (give or take Ultralytics' 1 %), a box with an area, and no row
    given twice (Ultralytics drops a repeat, LibreYOLO scores it as a second object: either way a score the other
    would not give). Blank lines are skipped."""
    rows: list[_Row] = []
    first_seen: dict[tuple, int] = {}
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"label file {path} cannot be read ({exc}); {LABEL_FORMAT}") from exc
    for number, line in enumerate(text.splitlines(), 1):
        fields = line.split()
        if not fields:
            continue
        where = f"label file {path} line {number}"

        def refuse(problem: str, fix: str = LABEL_FORMAT, where: str = where, line: str = line) -> UsageError:
            return UsageError(f"{where} ({line.strip()[:60]!r}) {problem}; {fix}")
        if len(fields) == 6:
            raise refuse("has 6 values: a box with a confidence (a predictions file)?")
        if len(fields) != 5 and (len(fields) < 7 or len(fields) % 2 == 0):
            raise refuse(f"has {len(fields)} values")
        try:
            class_value = float(fields[0])
            values = tuple(float(v) for v in fields[1:])
        except ValueError as exc:
            if number == 1 and line.startswith("\ufeff"):  # Ultralytics reads the mark as part of the class too
                raise refuse("starts with a byte order mark (the file was saved as UTF-8 with BOM)",
                             "save the label file as UTF-8 without a BOM") from exc
            raise refuse("holds a value that is not a number") from exc
        if not class_value.is_integer() or int(class_value) not in names:
            raise refuse(f"has the class {fields[0]}, which the dataset YAML does not name "
                         f"(its classes: {min(names)}..{max(names)})", "fix the row or the YAML's names")
        if not all(math.isfinite(v) for v in values):
            raise refuse("holds a value that is not finite")
        if max(values) > 1 + TOLERANCE or min(values) < -TOLERANCE:
            raise refuse("holds a value outside [0, 1]" + (": pixel coordinates?" if max(values) > 2 else ""))
        if len(values) == 4 and (values[2] <= 0 or values[3] <= 0):
            raise refuse("is a box of no area (width or height 0): it could never be found")
        if (int(class_value), values) in first_seen:
            raise refuse(f"repeats line {first_seen[int(class_value), values]} (the same object twice: one of them "
                         "could never be found)", "remove the repeated row")
        first_seen[int(class_value), values] = number
        rows.append(_Row(where, int(class_value), values))
    return rows


def _annotation(row: _Row, width: int, height: int) -> dict:
    """A row as a COCO annotation in pixels: a box clipped to the image (area: the clipped box's), or a polygon (its
    extent as the box, its area by the shoelace formula, as COCO's polygons have theirs)."""
    if len(row.values) == 4:
        cx, cy, w, h = row.values
        x1, y1 = max(0.0, (cx - w / 2) * width), max(0.0, (cy - h / 2) * height)
        x2, y2 = min(float(width), (cx + w / 2) * width), min(float(height), (cy + h / 2) * height)
        if x2 <= x1 or y2 <= y1:  # a centre within the 1 % past an edge, and a box that does not reach back
            raise UsageError(f"{row.where} is a box off its image; {LABEL_FORMAT}")
        if min(x2 - x1, y2 - y1) < MIN_EXTENT_PX:
            raise UsageError(f"{row.where} is a box {x2 - x1:.2g} x {y2 - y1:.2g} px, of no width or height (a "
                             f"rounded 0?): it could never be found; {LABEL_FORMAT}")
        return {"category_id": row.class_index, "bbox": [x1, y1, x2 - x1, y2 - y1], "area": (x2 - x1) * (y2 - y1)}
    xs = [min(max(x, 0.0), 1.0) * width for x in row.values[0::2]]  # within the image, as LibreYOLO clamps them
    ys = [min(max(y, 0.0), 1.0) * height for y in row.values[1::2]]
    x1, y1, x2, y2 = min(xs), min(ys), max(xs), max(ys)
    area = abs(sum(xs[i] * ys[i - 1] - xs[i - 1] * ys[i] for i in range(len(xs)))) / 2
    # on one line, slanted too: its shoelace area is then the floating point's rounding of 0
    if min(x2 - x1, y2 - y1) < MIN_EXTENT_PX or area <= 1e-9 * (x2 - x1) * (y2 - y1):
        raise UsageError(f"{row.where} is a polygon of no area (its points on one line): its mask could never be "
                         f"found; {LABEL_FORMAT}")
    polygon = [v for point in zip(xs, ys, strict=True) for v in point]
    return {"category_id": row.class_index, "bbox": [x1, y1, x2 - x1, y2 - y1], "area": area,
            "segmentation": [polygon]}
