"""A campaign over a fake RF100-VL download (four tiny datasets cut from the sample, each with its own classes,
and a fine-tuned-shaped libreyolo checkpoint per dataset): one row in the site's RF100-VL shape whose means are
its datasets', that validates and that the site's rule puts in its RF100-VL section; resumable; a dataset with a
broken annotation file is skipped and named, and the row is partial."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import COCO_DIR, YOLOX_NANO, requires_coco, requires_yolox, run_in_process
from rf100vl_fake import DATASETS, IMAGES, fake_rf100vl


@pytest.fixture
def quick_runs(monkeypatch):
    """Each dataset's run with one warm-up batch and no warm-up time (it ran until its batch times settled, up to 10 s
    a dataset on a busy machine), and the fewest timed batches: these tests check rows, means and files, not how a
    run times."""
    from harness.run import campaign

    monkeypatch.setattr(campaign, "CAMPAIGN_DEFAULTS", {**campaign.CAMPAIGN_DEFAULTS, "warmup_batches": 1,
                                                        "warmup_seconds": 0.0, "min_timed_batches": 2})


def _campaign(tmp_path: Path, *extra: str):
    return run_in_process("campaign", "--rf100vl", str(tmp_path / "rf"), "--weights-root", str(tmp_path / "w"),
                          "--model", "yolox-nano", "--output-dir", str(tmp_path / "out"), "--campaign-id", "c1",
                          "--json", *extra)


@requires_coco
def test_rf100vl_campaign_row(tmp_path, quick_runs):
    from harness.results.site_rules import is_rf100vl
    from harness.results.validate import validate_paths

    fake_rf100vl(tmp_path / "rf", tmp_path / "w")
    result = _campaign(tmp_path)
    assert result.returncode == 1, result.stderr  # a dataset was skipped: the row is partial
    printed = json.loads(result.stdout)  # --json: what the text says, for scripts; progress still on stderr
    assert printed["variant"] == "partial3" and printed["invalid_reasons"][0] == "3 of 100 datasets scored"
    assert printed["skipped"][0]["name"] == "broken" and "not valid JSON" in printed["skipped"][0]["reason"]
    assert "broken" in result.stderr
    (path,) = (tmp_path / "out" / "c1" / "submissions").glob("*.json")
    doc = json.loads(path.read_text())
    block = doc["rf100vl"]
    assert [d["dataset"] for d in block["datasets"]] == list(DATASETS)
    assert block["skipped_datasets"] == ["broken"] and block["valid_submission"] is False
    assert any(r.startswith("broken: ") and "not valid JSON" in r for r in block["invalid_reasons"])
    assert block["protocol"] == {"version": "rf100vl.libreyolo.v1", "nms_iou": 0.65, "max_det": 500,
                                 "expected_datasets": 100}  # the protocol's, not the download's count
    assert block["invalid_reasons"][0] == "3 of 100 datasets scored"  # a download of 4: partial either way
    assert [d["dataset_version"] for d in block["datasets"]] == [2, 1, 3]  # integers, as the site's rows
    assert [d["num_classes"] for d in block["datasets"]] == [2, 2, 3]
    # each accuracy key is the unweighted mean of the datasets' own runs (read from their submissions)
    runs = [json.loads(next((tmp_path / "out" / "c1" / "datasets" / n / "submissions").glob("*.json")).read_text())
            for n in DATASETS]
    for key in ("mAP_50_95", "mAP_50", "AR100", "AR_max_det"):
        values = [r["accuracy"][key] for r in runs]
        assert doc["accuracy"][key] == pytest.approx(sum(values) / len(values), abs=1e-12), key
    assert len({r["accuracy"]["mAP_50_95"] for r in runs}) > 1  # the datasets' figures differ: a real mean
    # the row's split is the one its datasets' runs loaded; runs on different splits are not one row
    from harness.results.campaign import DatasetResult, campaign_submission

    names = list(DATASETS)
    mixed = [DatasetResult(n, None, "w", r) for n, r in zip(names, runs, strict=True)]
    mixed[0] = DatasetResult(names[0], None, "w", {**runs[0], "dataset": {**runs[0]["dataset"], "split": "valid"}})
    row = campaign_submission(mixed, 3, {})
    assert row["dataset"]["split"] == "test+valid"
    assert "its datasets were scored on different splits (test, valid); one row is one split" in \
        row["rf100vl"]["invalid_reasons"]
    assert doc["eval"]["maxDets"] == [1, 10, 100, 500] and doc["config"]["iou"] == 0.65
    # counted as the site's rows count: the 3 scored datasets, the campaign's 4 as selected
    assert doc["dataset"] == {"id": "rf100_vl", "split": "test", "num_images": 3 * IMAGES, "num_datasets": 3,
                              "num_datasets_selected": 4}
    assert is_rf100vl(doc)
    (report,) = validate_paths([path], json.loads((COCO_DIR.parents[1] / "corpus" / "vision-analysis" /
                                                  "support-matrix.json").read_text())).reports
    errors = {f.rule for f in report.errors}
    assert errors <= {"site.support_matrix", "commit_guard"}, [f.to_dict() for f in report.findings]
    # the campaign's folder: its row only (its dataset runs are its parts, at RF100-VL's protocol, not COCO files)
    folder = validate_paths([tmp_path / "out" / "c1"], None)
    assert [r.path for r in folder.reports] == [path] and any("campaign's dataset runs" in n for n in folder.notes)
    assert not any(f.rule in ("rf100vl", "nonstandard-protocol", "schema") for f in report.findings)
    # `report` works on one run folder: the campaign's is refused with where its datasets' runs are (it wrote an
    # empty report)
    reported = run_in_process("report", str(tmp_path / "out" / "c1"))
    assert reported.returncode == 2 and "is a campaign" in reported.stderr, reported.stderr
    assert str(tmp_path / "out" / "c1" / "datasets") in reported.stderr
    assert not (tmp_path / "out" / "c1" / "report.html").exists()
    csv_lines = (tmp_path / "out" / "c1" / "datasets.csv").read_text().splitlines()
    assert len(csv_lines) == 5 and any(line.startswith("broken,skipped,") for line in csv_lines)
    assert (tmp_path / "out" / "c1" / "datasets.png").read_bytes().startswith(b"\x89PNG")
    from harness.report.plots import campaign_datasets

    plot = campaign_datasets([(n, r["accuracy"]["mAP_50_95"], None) for n, r in zip(DATASETS, runs, strict=True)]
                             + [("broken", None, "not valid JSON")], doc["accuracy"]["mAP_50_95"])
    assert plot.data["mAP_50_95"][-1] is None and plot.notes == ["broken: skipped (not valid JSON)"]

    # resumed: the finished datasets are read back, the row is the same but for its time stamp and id
    datasets = tmp_path / "out" / "c1" / "datasets"
    (datasets / "pets" / "run.json").unlink()  # as if killed during "pets"
    kept = (datasets / "street" / "run.json").stat().st_mtime_ns
    (datasets / "street").rename(datasets / ".street.incoming")  # as if killed while a fleet's copy moved in
    (datasets / ".cars-and-people.incoming").mkdir()  # an unfinished copy beside a finished run: dropped
    again = _campaign(tmp_path)
    assert again.returncode == 1, again.stderr
    assert (datasets / "street" / "run.json").stat().st_mtime_ns == kept  # moved into place, not run again
    assert not list(datasets.glob(".*.incoming"))
    redo = json.loads(path.read_text())
    for d in (doc, redo):
        for key in ("created_at", "submission_id", "timing", "throughput", "memory", "metadata"):
            d.pop(key)
    assert redo == doc
    # labels edited since a dataset was scored: that dataset runs again (its old figure would mix two datasets)
    street = tmp_path / "rf" / "street" / "test" / "_annotations.coco.json"
    edited = json.loads(street.read_text())
    edited["annotations"] = edited["annotations"][1:]
    street.write_text(json.dumps(edited))
    pets = (datasets / "pets" / "run.json").stat().st_mtime_ns
    relabelled = _campaign(tmp_path)
    assert relabelled.returncode == 1, relabelled.stderr
    assert "street: ground truth" in relabelled.stderr and "since it was scored: it runs again" in relabelled.stderr
    assert (datasets / "street" / "run.json").stat().st_mtime_ns != kept  # scored again, on the labels it has now
    assert (datasets / "pets" / "run.json").stat().st_mtime_ns == pets  # the others read back
    # a campaign file cut short (a full disk, an editor) is named in one line, not a traceback
    (tmp_path / "out" / "c1" / "campaign.json").write_text('{"recipe": {')
    broken = _campaign(tmp_path)
    assert broken.returncode == 2 and "campaign.json: not valid JSON" in broken.stderr, broken.stderr
    assert "Traceback" not in broken.stderr


class _FakeVersion(SimpleNamespace):
    pass


class _FakeDataset:
    """What the `rf100vl` package hands out: a name, the Roboflow project's versions, and a download."""

    def __init__(self, name: str):
        self.name = name
        self.rf_project = SimpleNamespace(versions=lambda: [_FakeVersion(id=f"rf100-vl/{name}/10"),
                                                            _FakeVersion(id=f"rf100-vl/{name}/4")])

    downloads = 0
    fail: set[str] = set()  # names whose download stops midway

    def download(self, path: str) -> None:
        _FakeDataset.downloads += 1
        (Path(path) / "test").mkdir(parents=True)
        if self.name in _FakeDataset.fail:
            raise ConnectionError("the connection dropped")
        (Path(path) / "test" / "_annotations.coco.json").write_text("{}")


def test_data_fetch_rf100vl(tmp_path, monkeypatch):
    dest = tmp_path / "rf"
    monkeypatch.delenv("ROBOFLOW_API_KEY", raising=False)
    no_key = run_in_process("data", "fetch", "rf100vl", "--dest", str(dest))
    assert no_key.returncode == 2 and "set ROBOFLOW_API_KEY" in no_key.stderr and len(no_key.stderr.splitlines()) == 1
    monkeypatch.setitem(sys.modules, "rf100vl", None)  # not installed
    missing = run_in_process("data", "fetch", "rf100vl", "--dest", str(dest), env={"ROBOFLOW_API_KEY": "k"})
    assert missing.returncode == 2 and "pip install rf100vl" in missing.stderr
    fake = SimpleNamespace(get_rf100vl_projects=lambda: [_FakeDataset("aquarium"), _FakeDataset("-grccs")])
    monkeypatch.setitem(sys.modules, "rf100vl", fake)
    done = run_in_process("data", "fetch", "rf100vl", "--dest", str(dest), env={"ROBOFLOW_API_KEY": "k"})
    assert done.returncode == 0, done.stderr
    # the latest version by number (10, not "4" > "10"), recorded as the site's rows record it: an integer
    assert json.loads((dest / "rf100vl_versions.json").read_text()) == {"aquarium": 10, "-grccs": 10}
    assert (dest / "aquarium" / "test" / "_annotations.coco.json").is_file() and _FakeDataset.downloads == 2
    again = run_in_process("data", "fetch", "rf100vl", "--dest", str(dest), env={"ROBOFLOW_API_KEY": "k"})
    assert again.returncode == 0 and _FakeDataset.downloads == 2  # what is there is not downloaded again
    (dest / "rf100vl_versions.json").write_text('{"aquarium": "4",')  # cut short
    cut = run_in_process("data", "fetch", "rf100vl", "--dest", str(dest), env={"ROBOFLOW_API_KEY": "k"})
    assert cut.returncode == 2 and "rf100vl_versions.json: not valid JSON; delete it" in cut.stderr, cut.stderr
    assert len(cut.stderr.strip().splitlines()) == 1
    # a download that stops midway leaves no folder a campaign would take for a dataset; the options of COCO's
    # download are refused, not ignored
    fake = SimpleNamespace(get_rf100vl_projects=lambda: [_FakeDataset("aquarium"), _FakeDataset("bees")])
    monkeypatch.setitem(sys.modules, "rf100vl", fake)
    (dest / "rf100vl_versions.json").write_text('{"aquarium": 10}')
    monkeypatch.setattr(_FakeDataset, "fail", {"bees"})
    dropped = run_in_process("data", "fetch", "rf100vl", "--dest", str(dest), env={"ROBOFLOW_API_KEY": "k"})
    assert dropped.returncode == 1 and "ConnectionError: the connection dropped" in dropped.stderr, dropped.stderr
    assert not (dest / "bees").exists() and (dest / "aquarium").is_dir()
    mirror = run_in_process("data", "fetch", "rf100vl", "--dest", str(dest), "--base-url", "file:///x",
                            env={"ROBOFLOW_API_KEY": "k"})
    assert mirror.returncode == 2 and "--base-url applies to `data fetch coco`" in mirror.stderr, mirror.stderr


@requires_coco
def test_campaign_refuses_mixed_setups_and_bad_files(tmp_path, quick_runs):
    """Resuming a campaign id with other options is refused (its finished datasets would mix); a YAML without
    datasets, or with two names that make one folder, is refused in one line."""
    fake_rf100vl(tmp_path / "rf", tmp_path / "w")
    # a split no dataset has: nothing is scored, and the corrected command is not refused as another campaign
    # (each dataset refused before it ran: bad input, exit 2, and no campaign folder holding only its recipe)
    nothing = _campaign(tmp_path, "--split", "valid")
    assert nothing.returncode == 2 and "could be scored" in nothing.stderr, nothing.stderr
    assert "none ran: fix the datasets named above" in nothing.stderr and not (tmp_path / "out").exists()
    deep = run_in_process("campaign", "--rf100vl", str(tmp_path / "rf"), "--weights-root", str(tmp_path / "w"),
                          "--model", "yolox-nano", "--output-dir", str(tmp_path / "a" / "b" / "out"), "--split",
                          "valid")
    assert deep.returncode == 2 and not (tmp_path / "a").exists()  # nor the folders above --output-dir it made
    first = _campaign(tmp_path)
    assert first.returncode == 1, first.stderr
    other = _campaign(tmp_path, "--backend", "onnxruntime")
    assert other.returncode == 2 and "was started with other backends: " in other.stderr, other.stderr
    assert "-> ['onnxruntime']" in other.stderr  # the option that changed, with its values
    empty = tmp_path / "empty.yaml"
    empty.write_text("model: yolox-nano\ndatasets: []\n")
    result = run_in_process("campaign", str(empty), "--output-dir", str(tmp_path / "o2"))
    assert result.returncode == 2 and "lists no datasets" in result.stderr
    # a weights root without a single dataset's weights: refused before a folder is made (an empty datasets/ and a
    # campaign.json were left, and the error pointed there)
    (tmp_path / "no-weights").mkdir()
    bare = run_in_process("campaign", "--rf100vl", str(tmp_path / "rf"), "--weights-root", str(tmp_path / "no-weights"),
                          "--model", "yolox-nano", "--output-dir", str(tmp_path / "o4"), "--campaign-id", "c4")
    assert bare.returncode == 2 and "no folder of it holds the weights" in bare.stderr, bare.stderr
    assert not (tmp_path / "o4").exists()
    weights = tmp_path / "w.onnx"
    weights.write_bytes(b"weights")
    twins = tmp_path / "twins.yaml"
    twins.write_text(f"model: yolox-nano\ndatasets:\n  - {{name: a b, dataset: x, weights: {weights}}}\n"
                     f"  - {{name: a-b, dataset: y, weights: {weights}}}\n")
    result = run_in_process("campaign", str(twins), "--output-dir", str(tmp_path / "o3"))
    assert result.returncode == 2 and "names two datasets alike" in result.stderr
    # every mistake of the file, and options no run takes, in one line before anything is written
    annotations = tmp_path / "ann.json"
    annotations.write_text("{}")
    one = f"  - {{name: a, dataset: {annotations}, weights: {weights}}}\n"
    for text, expected in ((f"model: yolox-nano\nspilt: valid\ndatasets:\n{one}", "unknown key 'spilt'"),
                           (f"model: yolox-nano\noptions: [1, 2]\ndatasets:\n{one}", "`options` is not a mapping"),
                           ("model: yolox-nano\ndatasets:\n  - {name: a, dataset: x, weights: null}\n",
                            "datasets[0].weights None is not a file"),
                           (f"model: yolox-nano\ndatasets:\n  - {{name: a, dataset: x, weights: {tmp_path}}}\n",
                            "is not a file"),
                           (f"model: null\ndatasets:\n{one}", "`model` is None, not a model id"),
                           (f"model: yolox-nano\ndatasets:\n  - {{name: a, dataset: x, wieghts: {weights}}}\n",
                            "datasets[0] needs name, dataset and weights"),
                           (f"model: yolox-nano\ndatasets:\n  - {{name: a, dataset: x, weights: {weights}}}\n",
                            f"datasets[0] (a): --dataset {tmp_path / 'x'}: no such file or folder")):  # the file's
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        result = run_in_process("campaign", str(bad), "--output-dir", str(tmp_path / "o4"))
        assert result.returncode == 2 and expected in result.stderr, (text, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and not (tmp_path / "o4").exists()
    good = tmp_path / "good.yaml"
    good.write_text(f"model: yolox-nano\ndatasets:\n{one}")
    for args, expected in ((["--backend", "bogus"], "bogus"), (["--device", "tpu"], "tpu"),
                           (["--device", "cuda"], "no CUDA device"), (["--model", "yolov9t"], "--model applies")):
        result = run_in_process("campaign", str(good), "--output-dir", str(tmp_path / "o5"), *args)
        assert result.returncode == 2 and expected in result.stderr, result.stderr
        assert not (tmp_path / "o5").exists()
    # options a campaign's one-cell-per-dataset row cannot take: refused before the folder exists, not a skip each
    for option, expected in (("batch_sizes: [1, 2]", "batch_sizes [1, 2] are several"),
                             ("accuracy: false", "drop accuracy: false"), ("subset: mini500", "subset 'mini500'"),
                             ("repeats: 3", "drop repeats"),
                             ("class_map: /nonexistent.yaml", "class_map /nonexistent.yaml: no such file")):
        bad = tmp_path / "options.yaml"
        bad.write_text(f"model: yolox-nano\noptions: {{{option}}}\ndatasets:\n{one}")
        result = run_in_process("campaign", str(bad), "--output-dir", str(tmp_path / "o6"))
        assert result.returncode == 2 and expected in result.stderr, (option, result.stderr)
        assert not (tmp_path / "o6").exists()
    # the file's own backend stands unless the command line names one
    from harness.run.campaign import read_campaign_file

    chosen = tmp_path / "chosen.yaml"
    chosen.write_text(f"model: yolox-nano\noptions: {{backends: [onnxruntime]}}\ndatasets:\n{one}")
    assert read_campaign_file(chosen, {}).options["backends"] == ["onnxruntime"]
    assert read_campaign_file(chosen, {"backends": ["pytorch"]}).options["backends"] == ["pytorch"]
    assert read_campaign_file(good, {}).options["backends"] == ["pytorch"]  # the campaign's default
    # one process per campaign folder: a second would replace the dataset run the first is writing
    from harness.run.state import lock_folder

    (tmp_path / "o7" / "busy").mkdir(parents=True)
    held = lock_folder(tmp_path / "o7" / "busy", "held by the test")
    try:
        result = run_in_process("campaign", str(good), "--output-dir", str(tmp_path / "o7"), "--campaign-id", "busy")
        assert result.returncode == 2 and "is being run by another va-bench process" in result.stderr, result.stderr
    finally:
        os.close(held)
    device = run_in_process("campaign", str(good), "--output-dir", str(tmp_path / "o8"), "--campaign-id", "nul")
    assert device.returncode == 2 and "device name on Windows" in device.stderr and not (tmp_path / "o8").exists()
    (tmp_path / "a-file").write_text("")
    result = run_in_process("campaign", str(good), "--output-dir", str(tmp_path / "a-file"))
    assert result.returncode == 2 and "not a folder" in result.stderr, result.stderr


def test_a_campaign_files_datasets_take_its_split(tmp_path):
    """The campaign's split (default test) is taken from Roboflow export roots; an annotation file or a split's
    folder is one split already and takes none; a dataset's own split is its own; a path no run can read is the
    file's error; relative paths are read from the file's folder."""
    from harness.errors import UsageError
    from harness.run.campaign import entry_split, read_campaign_file

    path, weights = tmp_path / "c.yaml", tmp_path / "w.onnx"
    weights.write_bytes(b"weights")
    for split in ("test", "valid"):
        (tmp_path / "root" / split).mkdir(parents=True)
        (tmp_path / "root" / split / "_annotations.coco.json").write_text("{}")
    (tmp_path / "ann.json").write_text("{}")
    datasets = [("root", tmp_path / "root", ""), ("picked", tmp_path / "root", ", split: valid"),
                ("file", tmp_path / "ann.json", ""), ("folder", tmp_path / "root" / "valid", "")]
    path.write_text("model: yolox-nano\ndatasets:\n" + "".join(
        f"  - {{name: {name}, dataset: {dataset}, weights: {weights}{extra}}}\n" for name, dataset, extra in datasets))
    campaign = read_campaign_file(path, {})
    assert campaign.split == "test"
    assert [entry_split(campaign, e) for e in campaign.entries] == ["test", "valid", None, None]
    path.write_text(f"model: yolox-nano\ndatasets:\n  - {{name: a, dataset: {tmp_path / 'ann.json'}, "
                    f"weights: {weights}, split: test}}\n")
    with pytest.raises(UsageError, match=r"datasets\[0\] \(a\).*--split applies to a Roboflow export folder"):
        read_campaign_file(path, {})
    # relative paths are the file's, not the shell's folder (as a YOLO data.yaml's are)
    path.write_text("model: yolox-nano\ndatasets:\n  - {name: r, dataset: root, weights: w.onnx}\n")
    (entry,) = read_campaign_file(path, {}).entries
    assert (entry.dataset, entry.weights) == (str(tmp_path / "root"), str(weights))


def test_a_fully_scored_row_that_is_not_valid_says_why():
    """Every dataset scored on two machines: the count says full, and the reason the row is not valid is shown."""
    from rich.console import Console

    from harness.views.commands import print_campaign

    reason = "its datasets were measured on different hardware (a, b); one row is one machine's: run it on one"
    doc = {"accuracy": {"mAP_50_95": 0.5}, "rf100vl": {
        "datasets": [{"dataset": "x"}, {"dataset": "y"}], "protocol": {"expected_datasets": 2},
        "skipped_datasets": [], "valid_submission": False, "invalid_reasons": [reason]}}
    console = Console(record=True, width=200)
    print_campaign(console, "row.json", doc, [])
    text = console.export_text()
    assert "2 of 2 datasets scored (full2)" in text and f"not valid: {reason}" in text
    # a campaign of one's own two datasets, one skipped: the count says how many it listed, the reason is whole
    long_reason = "the dataset's categories a, b are not classes of m " + "x" * 400 + "; map them with a class map"
    doc["rf100vl"].update(datasets=[{"dataset": "x"}], protocol={"expected_datasets": 100}, skipped_datasets=["y"],
                          invalid_reasons=["1 of 100 datasets scored (the campaign lists 2)", f"y: {long_reason}"])
    results = [SimpleNamespace(name="x", reason=None), SimpleNamespace(name="y", reason=long_reason)]
    console = Console(record=True, width=1000)
    print_campaign(console, "row.json", doc, results)
    text = console.export_text()
    assert "1 of 100 datasets scored (the campaign lists 2) (partial1)" in text
    assert f"skipped y: {long_reason}" in text and text.count("not valid") == 0


def test_a_row_measured_under_other_options_is_not_rf100vl():
    from harness.results.campaign import protocol_problems

    protocol = {"conf": 0.001, "iou": 0.65, "max_det": 500}
    assert protocol_problems(protocol, [1, 10, 100, 500]) == []
    assert protocol_problems({**protocol, "iou": 0.7, "max_det": 100}, [1, 10, 100]) == [
        "iou 0.7 is not the protocol's 0.65", "max_det 100 is not the protocol's 500",
        "COCOeval's maxDets [1, 10, 100] lack the protocol's 500"]


@pytest.mark.parametrize("name", ["_x", "-grccs", "a" * 150, "a b/c", "...", "x" * 99 + "_y", "ünïcode", ""])
def test_every_dataset_name_makes_a_run_id(name):
    """A dataset's folder is its run's id: whatever its name, a plain one (a name starting with '_' was refused
    as if the user had given a bad --run-id)."""
    import re

    from harness.config import SAFE_ID
    from harness.run.campaign import _slug

    assert re.fullmatch(SAFE_ID, _slug(name))


@requires_coco
def test_a_campaign_of_yolo_datasets(tmp_path, quick_runs):
    """A campaign file's datasets may be YOLO datasets (their YAML, or the folder holding it): each is run on the
    campaign's split, its classes matched by name to its fine-tuned checkpoint's, and the row is the mean of the
    datasets' own runs; a dataset whose labels are broken is skipped and named, the others go on."""
    from yolo_datasets import one_image, yolo_dataset

    libreyolo = pytest.importorskip("libreyolo")
    entries = []
    for k, (name, classes) in enumerate((("people", ["person"]), ("traffic", ["person", "car"]))):
        names = "".join(f"  {i}: {c}\n" for i, c in enumerate(classes))
        yaml_path = yolo_dataset(tmp_path / name, images=6, split_folder="test/images",
                                 yaml_text=f"test: test/images\nnames:\n{names}")
        index = {"0": "0", "2": "1"} if len(classes) == 2 else {"0": "0"}  # COCO's person 0 and car 2, renumbered
        for labels in (tmp_path / name / "test" / "labels").iterdir():
            rows = [line.split(" ", 1) for line in labels.read_text().splitlines()]
            labels.write_text("".join(f"{index[c]} {rest}\n" for c, rest in rows if c in index))
        wrapper = libreyolo.LibreYOLOX._from_scratch(size="n", nb_classes=len(classes), device="cpu", seed=k)
        wrapper.names = dict(enumerate(classes))
        wrapper.save(str(tmp_path / f"{name}.pt"))
        entries.append((name, yaml_path.parent if k else yaml_path, tmp_path / f"{name}.pt"))
    broken = one_image(tmp_path / "broken", "0 320 240 64 48\n", "test: images\nnames: [person]\n")
    entries.append(("broken", broken, tmp_path / "people.pt"))
    campaign = tmp_path / "c.yaml"
    campaign.write_text("model: yolox-nano\nsplit: test\ndatasets:\n" + "".join(
        f"  - {{name: {name}, dataset: {dataset}, weights: {weights}}}\n" for name, dataset, weights in entries))
    result = run_in_process("campaign", str(campaign), "--output-dir", str(tmp_path / "out"), "--campaign-id", "y",
                            "--json")
    assert result.returncode == 1, result.stderr  # "broken" is skipped: the row is partial
    printed = json.loads(result.stdout)
    assert printed["skipped"][0]["name"] == "broken" and "pixel coordinates" in printed["skipped"][0]["reason"]
    runs = {n: json.loads(next((tmp_path / "out" / "y" / "datasets" / n / "submissions").glob("*.json")).read_text())
            for n in ("people", "traffic")}
    assert {n: (r["dataset"]["id"], r["dataset"]["split"]) for n, r in runs.items()} == {
        "people": ("people", "test"), "traffic": ("traffic", "test")}
    (row,) = (tmp_path / "out" / "y" / "submissions").glob("*.json")
    mean = sum(r["accuracy"]["mAP_50_95"] for r in runs.values()) / 2
    assert json.loads(row.read_text())["accuracy"]["mAP_50_95"] == pytest.approx(mean, abs=1e-12)
    assert {n: (r["dataset"]["num_images"], r["dataset"]["num_categories"]) for n, r in runs.items()} == {
        "people": (6, 1), "traffic": (6, 2)}


def test_a_campaigns_class_map_is_shared_by_its_datasets(monkeypatch, tmp_path):
    """A campaign's `class_map` serves every dataset, so its dataset runs take it as shared: a key naming another
    dataset's category is no stray there (a run's own --class-map refuses one)."""
    from harness.run import campaign as campaign_module
    from harness.run import plan

    seen = {}

    def prepare(config, **kwargs):
        seen.update(kwargs)
        raise campaign_module.UsageError("stop here")

    monkeypatch.setattr(plan, "prepare", prepare)
    entry = campaign_module.CampaignEntry("pets", str(tmp_path), str(tmp_path / "w.pt"), None, "test")
    camp = campaign_module.Campaign("yolox-nano", [entry], "test", {"class_map": str(tmp_path / "m.yaml")})
    result = campaign_module.run_dataset(camp, entry, tmp_path / "datasets", [], None)
    assert result.reason == "stop here" and seen == {"shared_class_map": True}


@requires_coco
@requires_yolox
def test_a_campaign_stopped_mid_dataset_says_to_run_the_campaign_again(tmp_path):
    """It printed the dataset run's own resume line (va-bench run --resume <dataset> --output-dir .../datasets), which
    finishes that one run, not the campaign."""
    from harness.errors import RunInterrupted
    from harness.run.campaign import Campaign, CampaignEntry, run_dataset

    def stopped(plan, argv, progress):
        raise RunInterrupted("SIGINT after 0 of 1 cells; resume with: va-bench run --resume a ...", 130)

    from yolo_datasets import yolo_dataset

    campaign = Campaign("yolox-nano", [CampaignEntry("a", str(yolo_dataset(tmp_path / "d", images=2)),
                                                     str(YOLOX_NANO))], "val", {"backends": ["onnxruntime"]})
    argv = ["campaign", "c.yaml", "--output-dir", "out dir"]
    with pytest.raises(RunInterrupted) as stop:
        run_dataset(campaign, campaign.entries[0], tmp_path / "datasets", argv, None, execute=stopped)
    assert stop.value.exit_code == 130
    assert str(stop.value) == (f"stopped during dataset a; the campaign's finished datasets are kept in "
                               f"{tmp_path / 'datasets'}: to continue, run the same command again: va-bench campaign "
                               "c.yaml --output-dir 'out dir'")


def test_the_rows_dataset_fingerprint_is_the_sites_own():
    """The site's RF100-VL rows: their image_id_sha256 recomputed by the harness's own hashing from the datasets each
    row lists, version ids as the rows state them (integers: "2" would hash to another fingerprint, which is why a
    fetch records integers)."""
    from conftest import CORPUS

    from harness.results.campaign import canonical_sha256

    rows = [d for d in (json.loads(p.read_text()) for p in sorted((CORPUS / "submissions").glob("*.json")))
            if "rf100vl" in d] if CORPUS.is_dir() else []
    if not rows:
        pytest.skip("no RF100-VL rows in the corpus")
    for row in rows:
        identities = row["repro"]["dataset"]["datasets"]
        assert all(isinstance(i["version_id"], int) for i in identities)
        assert canonical_sha256(identities) == row["repro"]["dataset"]["image_id_sha256"]
        as_text = [{**i, "version_id": str(i["version_id"])} for i in identities]
        assert canonical_sha256(as_text) != row["repro"]["dataset"]["image_id_sha256"]


def test_a_campaign_of_a_users_own_datasets_that_scored_them_all_succeeds():
    """Not RF100-VL's datasets, so not a valid RF100-VL row; but the campaign did all it was asked (exit 0), as
    one of fewer than 100 did before the names were checked."""
    from harness.results.campaign import count_reason, not_rf100vl, scored_as_listed

    names = ["people", "traffic"]
    reasons = [count_reason(2, 2), not_rf100vl(names)]
    block = {"datasets": [{"dataset": n} for n in names], "invalid_reasons": reasons, "valid_submission": False}
    assert reasons[1] == "2 of its datasets are not RF100-VL's (people, traffic): a row of other datasets is not " \
                         "RF100-VL's"
    assert scored_as_listed(block, 2)
    assert not scored_as_listed({**block, "invalid_reasons": [*reasons, "its datasets were measured on different "
                                                                        "hardware (a, b)"]}, 2)


def test_versions_recorded_as_text_by_an_earlier_fetch_are_read_as_numbers(tmp_path):
    """A download made before fetches recorded integers ({"pets": "2"}) kept its strings, so its row hashed another
    dataset fingerprint than the site's; a campaign file's `version: "4"` too."""
    from harness.run.campaign import read_campaign_file, rf100vl_campaign

    for name in ("pets", "street"):
        (tmp_path / "rf" / name / "test").mkdir(parents=True)
        (tmp_path / "w" / name).mkdir(parents=True)
        (tmp_path / "w" / name / "best.pt").write_bytes(b"w")
    (tmp_path / "rf" / "rf100vl_versions.json").write_text(json.dumps({"pets": "2", "street": 3}))
    campaign = rf100vl_campaign(tmp_path / "rf", tmp_path / "w", "yolox-nano", "test", {})
    assert [e.version for e in campaign.entries] == [2, 3]
    (tmp_path / "ann.json").write_text("{}")
    path = tmp_path / "c.yaml"
    path.write_text(f"model: yolox-nano\ndatasets:\n  - {{name: a, dataset: {tmp_path / 'ann.json'}, weights: "
                    f"{tmp_path / 'w' / 'pets' / 'best.pt'}, version: '4'}}\n")
    assert [e.version for e in read_campaign_file(path, {}).entries] == [4]


def test_a_folder_the_fetch_did_not_finish_is_skipped_as_such(tmp_path):
    """A dataset folder the versions file does not list (a download cut short by an older va-bench, or by hand) was
    run as a dataset and skipped as "holds no COCO annotations"; it is named for what it is."""
    from harness.run.campaign import rf100vl_campaign, settled

    for name in ("pets", "street"):
        (tmp_path / "rf" / name / "test").mkdir(parents=True)
        (tmp_path / "w" / name).mkdir(parents=True)
        (tmp_path / "w" / name / "best.pt").write_bytes(b"w")
    (tmp_path / "rf" / "rf100vl_versions.json").write_text(json.dumps({"pets": 2}))
    campaign = rf100vl_campaign(tmp_path / "rf", tmp_path / "w", "yolox-nano", "test", {})
    pets, street = campaign.entries
    assert pets.skipped is None and settled(campaign, pets, tmp_path / "datasets") is None  # to run
    result = settled(campaign, street, tmp_path / "datasets")
    assert result.submission is None and result.reason.startswith("its download did not finish (not in "
                                                                  "rf100vl_versions.json)")
