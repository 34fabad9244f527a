"""compare --map-ci: the paired bootstrap interval of each mAP delta over the images both cells scored. Each
draw's figures are COCO's on the drawn images (tests/test_bootstrap.py holds them against pycocotools); here: the
interval of two real runs holds their delta, the reasons where there is none, and the command's refusals; the
interval is of the detections the table's accuracy was scored from, a broken detections file costs the interval
(not the comparison), identical detections are said to be identical, a run's own COCO folder is found again, and a
baseline's file is evaluated once for many runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import COCO_DIR, SUBSET_ANNOTATIONS, requires_coco, requires_yolox, run_in_process

from harness.errors import UsageError
from harness.results.compare import ImageSets, compare_paths


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """yolox-nano on 40 sample images at 416 and at 320 (other detections, the same images), and at 416 on 30."""
    out = tmp_path_factory.mktemp("runs")
    for run_id, extra in (("a", ["--limit", "40"]), ("b", ["--limit", "40", "--input-size", "320"]),
                          ("c", ["--limit", "30"])):
        done = run_in_process("run", "--model", "yolox-nano", "--backend", "onnxruntime", "--subset", "sample",
                              "--batch-sizes", "1", "--no-energy", "--output-dir", str(out), "--run-id", run_id,
                              *extra)
        assert done.returncode == 0, done.stderr
    return out


@requires_coco
@requires_yolox
def test_the_paired_interval_holds_the_delta_of_two_real_runs(runs):
    (comparison,) = compare_paths(runs / "a", [runs / "b"], intervals=ImageSets(200, COCO_DIR))
    (acc,) = comparison.accuracy
    ci = acc.delta_interval
    assert acc.delta_interval_unavailable is None and ci["images"] == 40 and ci["resamples"] == 200
    assert "paired" in ci["method"]
    for name in ("mAP_50_95", "mAP_50"):
        if ci[name] is None:  # draws biased past the figure: said, not drawn
            assert f"{name}:" in ci["reason"]
            continue
        lo, hi = ci[name]
        assert lo <= acc.delta(name) <= hi, (name, acc.delta(name), ci[name])
    assert acc.to_dict()["delta_interval"] == ci


@requires_coco
@requires_yolox
def test_no_interval_without_the_same_images_or_their_annotations(runs, tmp_path):
    """Other images (40 against 30): none, and why; a --coco-dir without the annotations: bad input."""
    (other,) = compare_paths(runs / "a", [runs / "c"], intervals=ImageSets(200, COCO_DIR))[0].accuracy
    assert other.delta_interval is None
    assert "A and B scored different image sets (coco2017 subset40 vs coco2017 subset30" in \
        other.delta_interval_unavailable
    with pytest.raises(UsageError, match="could not be found"):  # a folder the user named that holds no COCO
        compare_paths(runs / "a", [runs / "b"], intervals=ImageSets(200, tmp_path))
    (plain,) = compare_paths(runs / "a", [runs / "b"])[0].accuracy
    assert plain.delta_interval is None and plain.delta_interval_unavailable is None
    assert "delta_interval" not in plain.to_dict()


@requires_coco
@requires_yolox
def test_the_command_prints_the_interval_and_refuses_what_it_cannot_do(runs):
    done = run_in_process("compare", str(runs / "a"), str(runs / "b"), "--map-ci", "100")
    assert done.returncode == 0, done.stderr
    assert "ΔmAP_50_95 " in done.stdout and "over 40 images" in done.stdout
    assert all(len(line) <= 80 for line in done.stdout.splitlines() if line.startswith("ΔmAP"))
    few = run_in_process("compare", str(runs / "a"), str(runs / "b"), "--map-ci", "50")
    assert few.returncode == 2 and "at least 100" in few.stderr
    stray = run_in_process("compare", str(runs / "a"), str(runs / "b"), "--coco-dir", str(COCO_DIR))
    assert stray.returncode == 2 and "add --map-ci" in stray.stderr
    for flag in ("--dataset", "--coco-dir"):  # a path the user typed that is not there: bad input, not a table note
        missing = run_in_process("compare", str(runs / "a"), str(runs / "b"), "--map-ci", "100", flag, "/nope")
        assert missing.returncode == 2 and f"{flag} /nope: no such file or folder" in missing.stderr, missing.stderr
        assert not missing.stdout
    empty = runs.parent / "not-a-dataset"
    empty.mkdir(exist_ok=True)
    wrong = run_in_process("compare", str(runs / "a"), str(runs / "b"), "--map-ci", "100", "--coco-dir", str(empty))
    assert wrong.returncode == 2 and "--map-ci: the scored images could not be found" in wrong.stderr, wrong.stderr


IMAGES = 20


def _interval_text(acc) -> str:
    return json.dumps({"interval": acc.delta_interval, "unavailable": acc.delta_interval_unavailable})


def _bounds(acc) -> list:
    ci = acc.delta_interval or {}
    return [ci.get(name) for name in ("mAP_50_95", "mAP_50") if ci.get(name) is not None]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A COCO-layout folder of the sample's last 20 images (not the first 20 any --limit takes), and yolox-nano
    on it at 416 (a) and 320 (b), run with --coco-dir; a2: a copy of a (identical detections)."""
    root = tmp_path_factory.mktemp("tiny")
    coco = root / "coco"
    (coco / "annotations").mkdir(parents=True)
    (coco / "val2017").mkdir()
    full = json.loads(SUBSET_ANNOTATIONS.read_text())
    images = sorted(full["images"], key=lambda i: i["id"])[-IMAGES:]
    ids = {i["id"] for i in images}
    kept = {**full, "images": images, "annotations": [a for a in full["annotations"] if a["image_id"] in ids]}
    (coco / "annotations" / SUBSET_ANNOTATIONS.name).write_text(json.dumps(kept))
    for info in images:
        shutil.copyfile(SUBSET_ANNOTATIONS.parent.parent / "val2017" / info["file_name"],
                        coco / "val2017" / info["file_name"])
    runs = root / "runs"
    for run_id, extra in (("a", []), ("b", ["--input-size", "320"])):
        done = run_in_process("run", "--model", "yolox-nano", "--backend", "onnxruntime", "--subset", "sample",
                              "--coco-dir", str(coco), "--batch-sizes", "1", "--no-energy", "--draw-images", "0",
                              "--warmup-batches", "1", "--warmup-seconds", "0", "--min-timed-batches", "2",
                              "--output-dir", str(runs), "--run-id", run_id, *extra)
        assert done.returncode == 0, done.stderr
    shutil.copytree(runs / "a", runs / "a2")
    return coco, runs


def _copy_with_detections(runs: Path, source: str, name: str, text: str) -> Path:
    target = runs / name
    if not target.exists():
        shutil.copytree(runs / source, target)
        (detections,) = (target / "detections").glob("*.json")
        detections.write_text(text)
    return target


@requires_coco
@requires_yolox
def test_no_interval_from_detections_that_are_not_the_ones_scored(tiny):
    """B's detections file emptied after its accuracy was scored: the table still prints B's mAP, so an interval
    drawn from the empty file (around -0.3, beside a printed delta near -0.04) must not be shown as its interval."""
    coco, runs = tiny
    (normal,) = compare_paths(runs / "a", [runs / "b"], intervals=ImageSets(100, coco))[0].accuracy
    assert normal.delta_interval_unavailable is None, normal.delta_interval_unavailable
    emptied = _copy_with_detections(runs, "b", "b_empty", "[]")
    (acc,) = compare_paths(runs / "a", [emptied], intervals=ImageSets(100, coco))[0].accuracy
    assert not _bounds(acc), (acc.delta("mAP_50_95"), acc.delta_interval)
    assert acc.delta_interval_unavailable or (acc.delta_interval or {}).get("reason")


@requires_coco
@requires_yolox
def test_a_broken_detections_file_costs_the_interval_not_the_comparison(tiny):
    coco, runs = tiny
    (detections,) = (runs / "b" / "detections").glob("*.json")
    broken = _copy_with_detections(runs, "b", "b_broken", detections.read_text()[:2000])
    (acc,) = compare_paths(runs / "a", [broken], intervals=ImageSets(100, coco))[0].accuracy
    # cut short after it was scored: not the file the cell's mAP came from (its recorded SHA-256 says so first)
    assert acc.delta_interval is None and "is not the one it was scored from" in acc.delta_interval_unavailable
    done = run_in_process("compare", str(runs / "a"), str(broken), "--map-ci", "100", "--coco-dir", str(coco))
    assert done.returncode == 0, done.stderr
    assert "mAP delta interval" in done.stdout


@requires_coco
@requires_yolox
def test_identical_detections_are_not_called_too_few_images(tiny):
    coco, runs = tiny
    (acc,) = compare_paths(runs / "a", [runs / "a2"], intervals=ImageSets(100, coco))[0].accuracy
    assert acc.delta("mAP_50_95") == 0 and not _bounds(acc)
    assert "too few images" not in _interval_text(acc)


@requires_coco
@requires_yolox
def test_the_runs_own_coco_folder_is_found_again(tiny, monkeypatch, tmp_path):
    """docs/compare-and-inspect.md: COCO val2017 is found again with --coco-dir, "default the run's": the run
    recorded its --coco-dir in run.json; without --coco-dir (and no $VA_BENCH_COCO), compare looks there."""
    _, runs = tiny
    monkeypatch.delenv("VA_BENCH_COCO", raising=False)
    monkeypatch.chdir(tmp_path)
    (acc,) = compare_paths(runs / "a", [runs / "b"], intervals=ImageSets(100))[0].accuracy
    assert acc.delta_interval_unavailable is None, acc.delta_interval_unavailable
    assert acc.delta_interval["images"] == IMAGES


@requires_coco
@requires_yolox
def test_a_baseline_file_is_evaluated_once_for_many_runs(tiny, monkeypatch):
    import harness.eval.coco_eval as coco_eval

    coco, runs = tiny
    calls: list[str] = []
    real = coco_eval.cell_bootstrap

    def counted(coco_gt, path, *args, **kwargs):
        calls.append(str(Path(path).resolve()))
        return real(coco_gt, path, *args, **kwargs)

    monkeypatch.setattr(coco_eval, "cell_bootstrap", counted)
    comparisons = compare_paths(runs / "a", [runs / "b", runs / "b", runs / "a2"], intervals=ImageSets(100, coco))
    assert all(c.accuracy[0].delta_interval is not None or c.accuracy[0].delta_interval_unavailable
               for c in comparisons)
    (baseline,) = (runs / "a" / "detections").glob("*.json")
    assert calls.count(str(baseline.resolve())) <= 1, calls
    assert max(calls.count(p) for p in set(calls)) <= 1, calls


@requires_coco
@requires_yolox
def test_bare_detections_files_say_there_is_no_interval(runs):
    """Two detections files carry no image list or mAP to resample: a note says so instead of silence."""
    (a,), (b,) = ((runs / run / "detections").glob("*.json") for run in ("a", "b"))
    (comparison,) = compare_paths(a, [b], intervals=ImageSets(200, COCO_DIR))
    assert any("--map-ci needs run folders" in note for note in comparison.notes)


def _edit_submissions(run: Path, change, write: bool = True) -> None:
    """Apply `change` to the eval block of each submission in a run folder (not its detections); `write`: save it."""
    edited = 0
    for path in run.rglob("*.json"):
        if "detections" in path.relative_to(run).parts:
            continue
        doc = json.loads(path.read_text())
        if isinstance(doc, dict) and isinstance(doc.get("eval"), dict) and "accuracy" in doc:
            change(doc["eval"])
            if write:
                path.write_text(json.dumps(doc))
            edited += 1
    assert edited, run


@requires_coco
@requires_yolox
def test_cells_scored_at_other_caps_have_no_interval(tiny):
    """B recorded as scored at a 300-detection cap (maxDets [1, 10, 100, 300]), A at 100: no interval, and why
    (the caps are the lists' last entries, not their first)."""
    coco, runs = tiny
    target = runs / "b_cap300"
    if not target.exists():
        shutil.copytree(runs / "b", target)
        _edit_submissions(target, lambda block: block.update(maxDets=[1, 10, 100, 300]))
    (acc,) = compare_paths(runs / "a", [target], intervals=ImageSets(100, coco))[0].accuracy
    assert acc.delta_interval is None
    assert "different evaluation caps (100 and 300)" in (acc.delta_interval_unavailable or "")


@requires_coco
@requires_yolox
def test_one_detections_file_of_two_image_sets_is_evaluated_on_each(runs):
    """One detections file (a's, 40 images) behind a cell scored on 40 images and, hard-linked, behind one scored on
    the first 30 (c's images, where a's detections are c's): with one ImageSets, the second is evaluated on its own
    30 images, not served the first's 40-image evaluation of the same file."""
    import os

    target = runs / "c_link"
    if not target.exists():
        shutil.copytree(runs / "c", target)
        (mine,) = (target / "detections").glob("*.json")
        (theirs,) = (runs / "a" / "detections").glob("*.json")
        mine.unlink()
        os.link(theirs, mine)
        digest = {}
        _edit_submissions(runs / "a", lambda block: digest.update(sha=block.get("detections_sha256")), write=False)
        _edit_submissions(target, lambda block: block.update(detections_sha256=digest["sha"]))
    intervals = ImageSets(100, COCO_DIR)
    (first,) = compare_paths(runs / "a", [runs / "b"], intervals=intervals)[0].accuracy
    assert first.delta_interval_unavailable is None, first.delta_interval_unavailable
    (second,) = compare_paths(target, [runs / "c"], intervals=intervals)[0].accuracy
    assert second.delta_interval_unavailable is None, second.delta_interval_unavailable
    assert second.delta_interval["images"] == 30


def test_an_accuracy_gate_does_not_fail_on_a_fall_the_interval_calls_chance():
    """With --map-ci, a mAP gate is crossed only by a fall whose paired interval excludes 0 (as the latency gates
    ignore what the verdict calls noise); without an interval, or beyond it, the fall fails."""
    from harness.results.compare import AccuracyDelta, Comparison
    from harness.results.compare_gates import check_gate, parse_gate

    def comparison(interval: dict | None) -> Comparison:
        return Comparison("A", "B", accuracy=[AccuracyDelta("b1", {"mAP_50_95": 0.30, "mAP_50": 0.45},
                                                            {"mAP_50_95": 0.28, "mAP_50": 0.44},
                                                            delta_interval=interval)])
    chance = {"mAP_50_95": [-0.05, 0.01], "mAP_50": [-0.03, -0.002]}
    result = check_gate(parse_gate("map:-0.01"), comparison(chance))
    assert result.status == "ok"
    # a pass past the threshold says so, and --json tells it apart from a clean pass ("none beyond" read as one)
    assert "past -0.01 only where the 95 % interval of B - A holds 0, so not called a fall" in result.detail
    assert result.to_dict()["by_chance"] == ["b1 -0.02 (95 % interval of B - A -0.0500 to +0.0100)"]
    assert "none beyond" not in result.detail
    assert check_gate(parse_gate("map:-1%"), comparison(chance)).status == "ok"
    not_chance = check_gate(parse_gate("map50:-0.005"), comparison(chance))  # its interval excludes 0
    assert not_chance.status == "failed" and "(95 % interval of B - A -0.0300 to -0.0020)" in not_chance.detail
    assert check_gate(parse_gate("map:-0.01"), comparison(None)).status == "failed"
    clean = check_gate(parse_gate("map:-0.03"), comparison(chance))
    assert clean.detail == "1 checked, none beyond -0.03" and clean.to_dict()["by_chance"] == []


@requires_coco
@requires_yolox
def test_a_gate_on_a_real_fall_that_is_not_chance_fails(runs):
    """yolox-nano at 320 against 416 on 40 images: mAP falls by more than its interval allows for chance."""
    done = run_in_process("compare", str(runs / "a"), str(runs / "b"), "--map-ci", "100", "--fail-on", "map:-0.01")
    assert done.returncode == 1, done.stdout
    assert "map:-0.01" in done.stdout and "95 % interval" in done.stdout


def test_the_chance_rule_is_for_falls_only():
    """A '+' gate on a rise of mAP fails as without an interval: the rule lets a fall pass that may be chance."""
    from harness.results.compare import AccuracyDelta, Comparison
    from harness.results.compare_gates import check_gate, parse_gate

    comparison = Comparison("A", "B", accuracy=[AccuracyDelta("b1", {"mAP_50_95": 0.28, "mAP_50": 0.44},
                                                              {"mAP_50_95": 0.30, "mAP_50": 0.45},
                                                              delta_interval={"mAP_50_95": [-0.01, 0.05],
                                                                              "mAP_50": None})])
    assert check_gate(parse_gate("map:+0.01"), comparison).status == "failed"


@requires_coco
@requires_yolox
def test_a_detections_file_replaced_since_its_cell_was_scored_is_found(runs):
    """b's detections file copied over a copy of a's: the submission still records a's SHA-256. validate passed it
    and compare called A and B the same detections (by the recorded digests) while diffing other boxes."""
    target = runs / "a_replaced"
    if not target.exists():
        shutil.copytree(runs / "a", target)
        (mine,) = (target / "detections").glob("*.json")
        (theirs,) = (runs / "b" / "detections").glob("*.json")
        shutil.copyfile(theirs, mine)
    checked = run_in_process("validate", str(target))
    assert checked.returncode == 1 and "is not the file this submission scored (SHA-256" in checked.stdout, \
        checked.stdout
    assert run_in_process("validate", str(runs / "a")).returncode == 0
    comparison = compare_paths(runs / "a", [target], intervals=ImageSets(100, COCO_DIR))[0]
    (acc,) = comparison.accuracy
    assert acc.delta_interval is None
    assert "B: its detections file" in acc.delta_interval_unavailable
    assert "is not the one it was scored from" in acc.delta_interval_unavailable
    assert any("B: its detections file" in n and "the diff is of the files as they are" in n
               for n in comparison.notes), comparison.notes


def test_an_accuracy_gate_on_other_images_fails_as_not_comparable():
    """48 images against 96: the delta is as much the images' as the model's. It failed the gate as a fall, or,
    the runs the other way round, passed it, both as if the model had been judged."""
    from harness.results.compare import AccuracyDelta, Comparison
    from harness.results.compare_gates import check_gate, parse_gate

    other = "A and B scored different image sets (coco2017 subset48 vs coco2017 subset96, ...)"
    for a, b in ((0.36, 0.27), (0.27, 0.36)):
        comparison = Comparison("A", "B", accuracy=[AccuracyDelta("b1", {"mAP_50_95": a}, {"mAP_50_95": b},
                                                                  other_images=other)])
        result = check_gate(parse_gate("map:-0.005"), comparison)
        assert result.status == "failed" and f"b1: not comparable ({other})" in result.detail
    same = Comparison("A", "B", accuracy=[AccuracyDelta("b1", {"mAP_50_95": 0.27}, {"mAP_50_95": 0.36})])
    assert check_gate(parse_gate("map:-0.005"), same).status == "ok"
    # masks against boxes: the table says not comparable, and the gate has nothing to check (it gated the delta)
    for a, b in ((0.36, 0.27), (0.27, 0.36)):
        mixed = Comparison("A", "B", accuracy=[AccuracyDelta("b1", {"mAP_50_95": a}, {"mAP_50_95": b},
                                                             unavailable="one side scores masks ...")])
        assert check_gate(parse_gate("map:-0.005"), mixed).status == "unchecked"
