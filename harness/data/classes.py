"""Which dataset category each of a model's classes scores as: matched by name, or by a class map.

A detector's label i is its class `class_names[i]`; a dataset has its own category ids and names. A
detection is written under the dataset category of its class; a class the dataset does not have is left
out of the scored detections (its category does not exist there), and a dataset category that no class of
the model names is refused when it has boxes: scoring it would give a silent AP of 0 for that category. (A
category with no box is left out of COCO's mean anyway: a Roboflow split lists every class of the project.)
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from harness.data.categories import COCO_NAMES_BY_ID
from harness.errors import UsageError, path_problem
from harness.files import load_user_yaml, yaml_problem

NOT_IN_DATASET = -1  # a model class with no category in the dataset: its detections are not scored


def model_class_names(detector) -> tuple[str | None, ...]:
    """The model's class name per contiguous label: its own `class_names`, or, for the COCO-trained
    families (whose `class_map` holds COCO category ids), COCO's names; None for a label that is no class
    (torchvision's background and unused ids)."""
    names = getattr(detector, "class_names", None)
    if isinstance(names, dict):  # {index: name}, as Ultralytics-style models give them
        return tuple(names.get(i) for i in range(max(names) + 1)) if names else ()
    if names is not None:
        return tuple(names)
    return tuple(COCO_NAMES_BY_ID.get(int(category)) for category in detector.class_map)


def _norm(name: str) -> str:
    return " ".join(str(name).lower().replace("_", " ").replace("-", " ").split())


@dataclass(frozen=True)
class ClassMap:
    """A user's class map: dataset category name -> model class name or index (`--class-map FILE`, YAML)."""

    path: str
    entries: dict[str, str]
    shared: bool = False  # one map for a campaign's datasets: a key may name another dataset's category

    def record(self) -> dict:
        """What a run records of it: the file as given, its entries and their SHA-256 (a later edit of the file
        shows)."""
        canonical = json.dumps(self.entries, sort_keys=True, separators=(",", ":"))
        return {"file": self.path, "entries": self.entries,
                "sha256": hashlib.sha256(canonical.encode()).hexdigest()}

    @classmethod
    def read(cls, given: str, shared: bool = False) -> ClassMap:
        path = Path(given).expanduser()
        if not path.is_file():
            raise UsageError(path_problem("--class-map", given, "is a folder" if path.is_dir() else "no such file")
                             + "; give a YAML file of "
                             "`dataset category name: model class name` lines")
        try:
            data = load_user_yaml(path.read_text(encoding="utf-8"))
        except (yaml.YAMLError, OSError, UnicodeDecodeError) as exc:
            raise UsageError(path_problem("--class-map", given, f"not readable YAML{yaml_problem(exc)}")
                             + "; fix the file") from exc
        if not isinstance(data, dict) or not data or not all(
                isinstance(k, (str, int)) and isinstance(v, (str, int)) for k, v in data.items()):
            raise UsageError(path_problem("--class-map", given, "not a mapping of names")
                             + "; write `dataset category name: model class name` lines")
        negative = [f"{k}: {v}" for k, v in data.items() if re.fullmatch(r"\s*-\s*\d+\s*", str(v))]
        if negative:  # names are compared without separators: "-1" would otherwise read as index 1
            raise UsageError(path_problem("--class-map", given, f"`{negative[0]}` is no class index (indices are "
                                          "0 or more)") + "; fix the file")
        return cls(str(given), {str(k): str(v) for k, v in data.items()}, shared)


def match_classes(model_id: str, class_names: tuple[str | None, ...], categories: dict[int, str],
                  class_map: ClassMap | None = None, annotated: set[int] | None = None) -> tuple[int, ...]:
    """The dataset category id of each model label (NOT_IN_DATASET where the dataset lacks the class).

    Names are compared case- and separator-insensitively ("traffic_light" is "traffic light"); a class map
    renames dataset categories to model classes first. Raises UsageError, naming the categories no model
    class matches, when any dataset category with boxes (`annotated`: their ids; None: every category) is
    left unmatched, or two categories claim one class."""
    by_name: dict[str, list[int]] = {}
    for label, name in enumerate(class_names):
        if name is not None:
            by_name.setdefault(_norm(name), []).append(label)
    renames = {_norm(k): _norm(v) for k, v in (class_map.entries if class_map else {}).items()}
    labels: dict[int, int] = {}
    unmatched, unknown_targets = [], []
    for category, name in sorted(categories.items()):
        wanted = renames.get(_norm(name), _norm(name))
        named = by_name.get(wanted, [])
        if len(named) > 1:  # which of the model's same-named classes scores as this category is not ours to guess
            raise UsageError(f"{model_id} has {len(named)} classes named {class_names[named[0]]!r} (labels "
                             f"{', '.join(map(str, named))}); map dataset category {name!r} to one of them by its "
                             "index in a class map (--class-map FILE; a campaign file: `class_map:` in its options)")
        label = named[0] if named else None
        if (label is None and _norm(name) in renames and wanted.isdigit() and int(wanted) < len(class_names)
                and class_names[int(wanted)] is not None):
            label = int(wanted)  # a class map may name the model's class by its index (not a label that is no class)
        if label is None:
            if _norm(name) in renames:  # the target the map gives, which the model has no class of
                unknown_targets.append(f"{name!r} (id {category}) -> {renames[_norm(name)]!r}")
            elif annotated is None or category in annotated:
                unmatched.append(f"{name!r} (id {category})")
        elif label in labels and _norm(categories[labels[label]]) == _norm(name):
            # two categories of one name: no class map can tell them apart (it names categories). One without a box
            # needs no class (left out of COCO's mean), so the one with boxes takes it; both with boxes is the data's
            if annotated is not None and labels[label] not in annotated:
                labels[label] = category
            elif annotated is None or category in annotated:
                raise UsageError(f"the dataset has two categories named {name!r} (ids {labels[label]} and {category}) "
                                 "with boxes; a class map names categories, so it cannot tell them apart: give them "
                                 "distinct names in the dataset, or merge them into one")
        elif label in labels:
            raise UsageError(f"dataset categories {categories[labels[label]]!r} and {name!r} both map to "
                             f"{model_id}'s class {class_names[label]!r}; give each its own class in --class-map")
        else:
            labels[label] = category
    named = {_norm(name) for name in categories.values()}
    strays = [k for k in (class_map.entries if class_map and not class_map.shared else {}) if _norm(k) not in named]
    if strays:  # a key that names no category renames nothing: a typo, or a map meant for another dataset
        raise UsageError(f"--class-map {class_map.path}: {', '.join(repr(k) for k in strays[:3])}"
                         f"{f' and {len(strays) - 3} more' if len(strays) > 3 else ''} "
                         f"{'is no category' if len(strays) == 1 else 'are no categories'} of the dataset (its "
                         f"categories: {_some(tuple(categories[c] for c in sorted(categories)))}); a class map's "
                         "keys are the dataset's category names; fix the file")
    if unknown_targets:
        raise UsageError(f"--class-map {class_map.path}: {', '.join(unknown_targets)}: "
                         f"{'no class' if len(unknown_targets) == 1 else 'no classes'} of {model_id} (its classes: "
                         f"{_some(class_names)}); fix the file")
    if unmatched:
        more = f" and {len(unmatched) - 3} more" if len(unmatched) > 3 else ""
        counts = f"the dataset has {len(categories)} classes, {model_id} {sum(n is not None for n in class_names)}"
        raise UsageError(f"the dataset's categories {', '.join(unmatched[:3])}{more} are not classes of "
                         f"{model_id} ({counts}: {_some(class_names)}); scoring them would give AP 0. Map them "
                         "with a class map (--class-map FILE; a campaign file: `class_map: FILE` in its options; YAML: "
                         "`dataset category name: model class name or index`), or "
                         "use weights trained on this dataset")
    return tuple(labels.get(label, NOT_IN_DATASET) for label in range(len(class_names)))


def _some(names: tuple[str | None, ...]) -> str:
    real = [n for n in names if n is not None]
    return ", ".join(real[:5]) + (f", ... ({len(real)} in all)" if len(real) > 5 else "")
