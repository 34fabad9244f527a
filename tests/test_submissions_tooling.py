"""`va-bench validate` / `aggregate` / `schema` on the site's real corpus and on hostile input."""

import copy
import json
import subprocess
import sys

import pytest
from conftest import CORPUS, REPO, requires_corpus

from harness.results.aggregate import aggregate
from harness.results.site_rules import schema_findings
from harness.results.validate import EXTENDED_SCHEMA, validate_paths

SUBMISSIONS = CORPUS / "submissions"
SUPPORT = CORPUS / "support-matrix.json"


def va_bench(*args):
    return subprocess.run([sys.executable, "-m", "harness", *map(str, args)], capture_output=True, text=True,
                          cwd=REPO, timeout=300)


@pytest.fixture(scope="module")
def corpus_reports():
    if not SUBMISSIONS.is_dir():
        pytest.skip(f"vision-analysis corpus not found at {CORPUS}: set VA_BENCH_CORPUS")
    return validate_paths([SUBMISSIONS], json.loads(SUPPORT.read_text()))


def _findings(reports, rule, path_prefix=""):
    return [(r.path.name, f) for r in reports for f in r.findings if f.rule == rule and f.path.startswith(path_prefix)]


@requires_corpus
def test_validate_finds_the_real_problems_in_the_corpus(corpus_reports):
    assert len(corpus_reports) == 708
    zero_ram = _findings(corpus_reports, "degenerate", "memory.peak_ram_mb")
    assert len(zero_ram) == 62 and all(f.severity == "error" for _, f in zero_ram)
    degenerate_timing = _findings(corpus_reports, "degenerate", "timing.total_ms")
    assert sorted(name.split("__")[0] for name, _ in degenerate_timing) == [
        "yolov8l", "yolov8m", "yolov8n", "yolov8s", "yolov8x"]
    assert all("__hailo__" in name for name, _ in degenerate_timing)
    unpinned_full = [(n, f) for n, f in _findings(corpus_reports, "commit_guard") if f.severity == "error"]
    assert len(unpinned_full) == 3 and all("__a100__" in n for n, _ in unpinned_full)
    # the site accepts every one of these files: none breaks its own rules
    assert not [f for r in corpus_reports for f in r.findings if f.rule.startswith(("site.", "schema", "file."))]


@requires_corpus
def test_validate_cli_over_the_corpus(tmp_path):
    result = va_bench("validate", SUBMISSIONS, "--support-matrix", SUPPORT, "--json")
    assert result.returncode == 1
    report = json.loads(result.stdout)
    assert report["files"] == 708 and report["files_with_errors"] == 65


@requires_corpus
def test_extended_schema_is_a_superset_of_the_sites():
    site = json.loads((CORPUS / "schemas" / "submission.v1.json").read_text())
    ours = json.loads(EXTENDED_SCHEMA.read_text())
    assert set(site["required"]) <= set(ours["required"])
    for name, prop in site["properties"].items():
        for key, value in prop.items():
            if key != "properties":
                assert ours["properties"][name][key] == value, (name, key)
    for path in sorted(SUBMISSIONS.glob("*.json"))[::7]:
        assert schema_findings(json.loads(path.read_text()), ours) == [], path.name
    result = va_bench("schema")
    assert result.returncode == 0 and json.loads(result.stdout)["title"] == ours["title"]


def test_our_own_submissions_validate_clean(ort_run):
    plan, _ = ort_run
    reports = validate_paths([plan.run_dir / "submissions"], None)
    assert len(reports) == 2
    for r in reports:
        assert r.errors == [], r.to_dict()


HOSTILE = {
    "not_json.json": b"this is not json {",
    "nan.json": b'{"schema_version": "va.submission.v1", "timing": {"total_ms": {"p50": NaN}}}',
    "huge_number.json": b'{"accuracy": {"mAP_50_95": 1e400}}',
    "huge_int.json": b'{"config": {"batch_size": ' + b"9" * 5000 + b"}}",
    "deep.json": b"[" * 200000 + b"]" * 200000,
    "array.json": b"[1, 2, 3]",
    "latin1.json": '{"model": {"id": "é"}}'.encode("latin-1"),
}


def _wrong_types():
    return {"schema_version": 1, "submission_id": ["x"], "created_at": 5, "model": "yolox", "config": [],
            "hardware": {"id": 3}, "runtime": {"format": None}, "accuracy": {"mAP_50_95": "high"}, "timing": 1,
            "throughput": {}, "model_stats": {}, "metadata": {"benchmark_date": 7}, "benchmark": {}}


def test_hostile_files_give_findings_never_a_crash(tmp_path):
    for name, data in HOSTILE.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "wrong_types.json").write_text(json.dumps(_wrong_types()))
    big = tmp_path / "big.json"
    with open(big, "wb") as fh:
        fh.write(b'{"pad": "')
        fh.write(b"x" * (50 * 2**20))
        fh.write(b'"}')
    reports = {r.path.name: r for r in validate_paths([tmp_path], None)}
    assert set(reports) == {*HOSTILE, "wrong_types.json", "big.json"}
    for name, report in reports.items():
        assert report.errors, name
    assert "MiB" in reports["big.json"].errors[0].message
    assert "nested too deeply" in reports["deep.json"].errors[0].message
    assert "not valid JSON" in reports["nan.json"].errors[0].message
    result = va_bench("validate", tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert va_bench("validate", tmp_path / "nope").returncode == 2


@pytest.fixture(scope="module")
def base_doc():
    if not SUBMISSIONS.is_dir():
        pytest.skip(f"vision-analysis corpus not found at {CORPUS}")
    return json.loads(next(SUBMISSIONS.glob("yolox-s__pytorch__cuda__nvidia_geforce_rtx_5070_ti__*.json")).read_text())


def _write(folder, docs):
    folder.mkdir(exist_ok=True)
    for i, doc in enumerate(docs):
        doc = copy.deepcopy(doc)
        doc["submission_id"] = f"synthetic-{i}"
        (folder / f"s{i}.json").write_text(json.dumps(doc))
    return validate_paths([folder], None)


def _variant(doc, **changes):
    doc = copy.deepcopy(doc)
    for dotted, value in changes.items():
        block, key = dotted.split("__")
        doc[block][key] = value
    return doc


def test_batch_sweep_and_input_sizes_stay_separate_rows(tmp_path, base_doc):
    docs = [_variant(base_doc, config__batch_size=b, timing__batch_size=b) for b in (1, 2, 4, 8)]
    docs += [_variant(base_doc, config__input_size=1280, model__input_size=1280)]
    board = aggregate(_write(tmp_path / "sweep", docs))
    cube = board["cube"]
    assert len(cube) == 5
    assert sorted((r["batch_size"], r["input_size"]) for r in cube) == [(1, 640), (1, 1280), (2, 640), (4, 640),
                                                                         (8, 640)]
    assert board["counts"]["superseded"] == 0


def test_latest_timestamp_wins_within_one_identity(tmp_path, base_doc):
    old = _variant(base_doc, throughput__fps_mean=10.0)
    old["created_at"] = "2026-01-01T00:00:00Z"
    new = _variant(base_doc, throughput__fps_mean=20.0)
    new["created_at"] = "2026-02-01T00:00:00Z"
    board = aggregate(_write(tmp_path / "dup", [old, new]))
    (row,) = board["cube"]
    assert row["fps_mean"] == 20.0 and row["superseded"] == ["s0.json"]


def test_overlapped_and_latency_runs_stay_separate_rows(tmp_path, base_doc):
    latency = _variant(base_doc, throughput__fps_mean=20.0)
    latency["created_at"] = "2026-01-01T00:00:00Z"
    overlapped = _variant(base_doc, throughput__fps_mean=30.0, timing__mode="overlapped")
    overlapped["created_at"] = "2026-02-01T00:00:00Z"  # newer, yet it must not replace the latency run
    board = aggregate(_write(tmp_path / "modes", [latency, overlapped]))
    assert sorted((r["timing_mode"], r["fps_mean"]) for r in board["cube"]) == [("latency", 20.0),
                                                                               ("overlapped", 30.0)]
    assert board["counts"]["superseded"] == 0
    assert [(r["timing_mode"], r["fps_mean"]) for r in board["leaderboard"]] == [("latency", 20.0)]
    only_overlapped = aggregate(_write(tmp_path / "only_overlapped", [overlapped]))
    assert [r["timing_mode"] for r in only_overlapped["leaderboard"]] == ["overlapped"]


def test_hardware_id_is_trusted_else_derived(tmp_path, base_doc):
    jetson = copy.deepcopy(base_doc)
    del jetson["hardware"]["id"]
    jetson["hardware"]["gpu"] = "Orin (nvgpu)"
    trusted = _variant(base_doc, hardware__gpu="Orin (nvgpu)")  # id present: kept as is
    board = aggregate(_write(tmp_path / "hw", [jetson, trusted]))
    assert sorted(r["hardware"] for r in board["cube"]) == ["jetson_orin", "nvidia_geforce_rtx_5070_ti"]


def test_subset_accuracy_is_badged_or_replaced_by_canonical_full(tmp_path, base_doc):
    subset = _variant(base_doc, accuracy__mAP_50_95=0.40)
    board = aggregate(_write(tmp_path / "only_subset", [subset]))
    (row,) = board["cube"]
    assert row["subset"] is True and row["accuracy_shown"] == 0.40 and "mini500" in row["accuracy_source"]

    full = _variant(base_doc, accuracy__mAP_50_95=0.45, hardware__id="a100", dataset__num_images=5000,
                    eval__numImages=5000, timing__num_images=5000)
    full["benchmark"]["libreyolo_commit"] = "5f12ee96d5f3099eaede265187a5df70a5f70c08"
    board = aggregate(_write(tmp_path / "with_full", [subset, full]))
    rows = {r["dataset_variant"]: r for r in board["cube"]}
    assert rows["mini500"]["accuracy_shown"] == 0.45 and rows["mini500"]["subset"] is False
    assert "full-val (a100" in rows["mini500"]["accuracy_source"]
    assert board["canonical_accuracy"][0]["policy"] == "reference"


def test_unpinned_full_val_is_never_canonical(tmp_path, base_doc):
    full = _variant(base_doc, hardware__id="a100", dataset__num_images=5000, eval__numImages=5000)
    full["benchmark"]["libreyolo_commit"] = "unknown"
    board = aggregate(_write(tmp_path / "unpinned", [full]))
    assert board["canonical_accuracy"] == [] and board["cube"][0]["accuracy_shown"] is None


@requires_corpus
def test_aggregate_keeps_every_site_row_and_flags_real_drift(corpus_reports):
    board = aggregate(corpus_reports)
    assert board["counts"]["rows"] == 708 and board["counts"]["excluded"] == 0
    verified = json.loads((CORPUS / "generated" / "verified-results.v1.json").read_text())["results"]

    def key(model, hw, fmt, provider, precision, file):
        return (model, hw, fmt, provider, precision, file)

    site_rows = {key(r["model"]["id"], r["hardware"]["id"], r["runtime"]["format"], r["runtime"]["provider"],
                     r["runtime"]["precision"], r["source_file"]) for r in verified}
    our_rows = {key(r["model"], r["hardware"], r["format"], r["provider"], r["precision"], r["file"])
                for r in board["cube"]}
    assert our_rows == site_rows
    drift = [g for g in board["agreement_gate"] if g["model"] == "yolox-s" and g["precision"] == "fp32"
             and g["dataset_variant"] == "mini500" and g["other_hardware"] == "rpi5" and g["other_format"] == "onnx"]
    (g,) = drift
    assert g["canonical"] == pytest.approx(0.443, abs=0.001) and g["other"] == pytest.approx(0.431, abs=0.001)
    assert g["delta_points"] < -1.0


@requires_corpus
def test_aggregate_cli_strict(tmp_path):
    out = tmp_path / "leaderboard.json"
    lenient = va_bench("aggregate", SUBMISSIONS, "-o", out)
    assert lenient.returncode == 0 and json.loads(out.read_text())["counts"]["rows"] == 708
    assert va_bench("aggregate", SUBMISSIONS, "--strict", "--json").returncode == 1
    assert va_bench("aggregate", SUBMISSIONS, "--tolerance", "-1").returncode == 2
