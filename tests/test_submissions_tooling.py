"""`va-bench validate` / `aggregate` / `schema` on the site's real corpus and on hostile input."""

import copy
import io
import json
from pathlib import Path

import pytest
from conftest import CORPUS, requires_corpus, run_in_process

from harness.catalogue import size_ranks
from harness.errors import UsageError
from harness.results.aggregate import aggregate
from harness.results.site_rules import schema_findings
from harness.results.validate import EXTENDED_SCHEMA, validate_file, validate_paths

SUBMISSIONS = CORPUS / "submissions"
SUPPORT = CORPUS / "support-matrix.json"
SCHEMA = json.loads(EXTENDED_SCHEMA.read_text())


def va_bench(*args):
    return run_in_process(*args)


@pytest.fixture(scope="module")
def corpus_reports():
    if not SUBMISSIONS.is_dir():
        pytest.skip(f"vision-analysis corpus not found at {CORPUS}: set VA_BENCH_CORPUS")
    return validate_paths([SUBMISSIONS], json.loads(SUPPORT.read_text())).reports


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
    reports = validate_paths([plan.run_dir / "submissions"], None).reports
    assert len(reports) == 2
    for r in reports:
        assert r.errors == [], r.to_dict()


def test_the_extended_schema_declares_every_block_a_run_writes(ort_run):
    """`va-bench schema` is the extended schema: energy, layers, profiler, software, and timing's samples, tail and
    warm-up were written but not declared (they validated only because extra properties are allowed)."""
    plan, _ = ort_run
    ours = json.loads(EXTENDED_SCHEMA.read_text())
    timing = ours["properties"]["timing"]["properties"]
    docs = [json.loads(path.read_text()) for path in sorted((plan.run_dir / "submissions").glob("*.json"))]
    assert any(d["layers"] for d in docs) and any(d["profiler"] for d in docs)  # the passes' blocks are checked too
    for doc in docs:
        assert set(doc) - set(ours["properties"]) == set(), doc["submission_id"]
        assert set(doc["timing"]) - set(timing) == set(), doc["submission_id"]
        assert schema_findings(doc, ours) == [], doc["submission_id"]
    assert {"server", "repeats"} <= set(ours["properties"]) | set(timing)  # written by options this run did not use


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
    reports = {r.path.name: r for r in validate_paths([tmp_path], None).reports}
    assert set(reports) == {*HOSTILE, "wrong_types.json", "big.json"}
    for name, report in reports.items():
        assert report.errors, name
    assert "MiB" in reports["big.json"].errors[0].message
    assert "nested too deeply" in reports["deep.json"].errors[0].message
    assert "not valid JSON" in reports["nan.json"].errors[0].message
    result = va_bench("validate", tmp_path)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert va_bench("validate", tmp_path / "nope").returncode == 2


def _leaf_paths(obj, path=()):
    if isinstance(obj, dict):
        for key, value in obj.items():
            yield from _leaf_paths(value, (*path, key))
    elif isinstance(obj, list) and obj:
        yield from _leaf_paths(obj[0], (*path, 0))
    else:
        yield path


def test_every_field_of_a_real_submission_may_be_hostile(tmp_path, ort_run):
    """Each leaf of a real corpus file and of one of ours replaced by a wrong type or an absurd number:
    validate and aggregate report it (or accept it), never crash."""
    plan, _ = ort_run
    ours = json.loads(next((plan.run_dir / "submissions").glob("*.json")).read_text())
    theirs = json.loads(next(SUBMISSIONS.glob("yolox-s__pytorch__cuda__*.json")).read_text()) \
        if SUBMISSIONS.is_dir() else ours
    hostile = ["x", -1, 10**30, 1e308, True, None, [], {}, "1e400"]
    reports, crashes = [], {}
    for k, doc in enumerate((theirs, ours)):
        for n, path in enumerate(_leaf_paths(doc)):
            for m, value in enumerate(hostile):
                mutated = json.loads(json.dumps(doc))
                target = mutated
                for key in path[:-1]:
                    target = target[key]
                target[path[-1]] = value
                file = tmp_path / f"s{k}_{n}_{m}.json"
                file.write_text(json.dumps(mutated).replace('"1e400"', "1e400"))
                try:
                    reports.append(validate_file(file, None, SCHEMA))
                    aggregate(reports[-1:])
                except Exception as exc:  # noqa: BLE001 - collect every crash, not the first
                    crashes.setdefault(f"{type(exc).__name__}: {exc}", (path, value))
    assert not crashes, crashes
    assert len(reports) > 500
    aggregate(reports)
    assert all(r.errors for r in reports if "1e400" in r.path.read_text())


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
    return validate_paths([folder], None).reports


def _variant(doc, **changes):
    doc = copy.deepcopy(doc)
    for dotted, value in changes.items():
        block, key = dotted.split("__")
        doc[block][key] = value
    return doc


def _timed(doc, scale):
    """The doc timed `scale` times slower, every figure consistently (latency x scale, rates / scale)."""
    doc = copy.deepcopy(doc)
    total = doc["timing"]["total_ms"]
    for key, value in total.items():
        if isinstance(value, (int, float)):
            total[key] = value * scale
    doc["throughput"]["fps_mean"] = 1000.0 / total["mean"]
    doc["throughput"]["fps_p50"] = 1000.0 / total["p50"]
    return doc


def test_a_zero_where_a_rate_or_batch_time_belongs_is_degenerate(tmp_path, base_doc):
    doc = copy.deepcopy(base_doc)
    doc["throughput"] = {**(doc.get("throughput") or {}), "fps_mean": 0}
    doc["timing"]["batch_ms"] = {"mean": 0.0, "p50": 0.0, "min": 0.0, "max": 0.0}
    (report,) = _write(tmp_path / "zeros", [doc])
    paths = {f.path for f in report.findings if f.rule == "degenerate"}
    assert {"throughput.fps_mean", "timing.batch_ms.mean", "timing.batch_ms.p50"} <= paths, paths
    (clean,) = _write(tmp_path / "real", [base_doc])
    assert not {f.path for f in clean.findings if f.path.startswith(("throughput", "timing.batch_ms"))}


def test_the_leaderboard_fits_80_columns_with_every_figure_whole(tmp_path, base_doc):
    """Names wrap, figures never lose a digit, on the worst row the columns meet (TF32 on, overlapped timing, a
    four-digit rate, flags) and on the corpus's longest hardware id, which heads its rows whole."""
    from rich.console import Console

    from harness.views.leaderboard import leaderboard_table

    doc = _variant(base_doc, model__id="rtdetr-r101", runtime__format="tensorrt", runtime__precision="fp16")
    board = aggregate(_write(tmp_path / "wide", [doc]))
    (row,) = board["leaderboard"]
    worst = {**row, "model": "yolov9e2e-t", "format": "onnx", "provider": "tensorrt", "precision": "fp32",
             "tf32": "on", "timing_mode": "overlapped", "dataset_variant": "mini500", "accuracy_shown": 0.45231,
             "subset": True, "latency_ms_p50": 1234.5, "fps_mean": 1187.4, "flags": ["a", "b"]}
    board = {**board, "leaderboard": [row, worst]}
    console = Console(width=80, record=True)
    console.print(leaderboard_table(board))
    text = console.export_text()
    assert max(map(len, text.splitlines())) <= 80 and "…" not in text, text
    assert "nvidia_geforce_rtx_5070_ti" in text and "rtdetr-r101" in text and "tensorrt/cuda" in text, text
    assert all(figure in text for figure in ("0.4523*", "1234", "1187", "fp32+tf32")), text
    p50 = row["latency_ms_p50"]
    assert 10 <= p50 < 100 and f"{p50:.1f}" in text, text  # three significant digits of this row's p50
    (line,) = [line for line in text.splitlines() if "1187" in line]
    assert line.rstrip().endswith(" 2"), line  # its two flags counted


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
    old = _timed(base_doc, 2.0)
    old["created_at"] = "2026-01-01T00:00:00Z"
    new = _timed(base_doc, 1.0)
    new["created_at"] = "2026-02-01T00:00:00Z"
    board = aggregate(_write(tmp_path / "dup", [old, new]))
    (row,) = board["cube"]
    assert row["fps_mean"] == new["throughput"]["fps_mean"] and row["superseded"] == [str(tmp_path / "dup" / "s0.json")]


def test_two_runtimes_of_one_format_and_provider_stay_separate_rows(tmp_path, base_doc):
    """ONNX Runtime's TensorRT provider and a native TensorRT engine both record format tensorrt on provider cuda:
    their rows never replace each other (the newer took the other's place, said only as "superseded"), the tables
    name the runtime that ran each, and a site file (no runtime.backend) keeps its format as its runtime."""
    from rich.console import Console

    from harness.views.leaderboard import leaderboard_table

    native = _timed(_variant(base_doc, runtime__format="tensorrt", runtime__backend="tensorrt"), 1.0)
    native["created_at"] = "2026-01-01T00:00:00Z"
    provider = _timed(_variant(base_doc, runtime__format="tensorrt", runtime__backend="onnxruntime"), 1.5)
    provider["created_at"] = "2026-02-01T00:00:00Z"  # newer: it replaced the native engine's row
    board = aggregate(_write(tmp_path / "trt", [native, provider]))
    assert board["counts"]["superseded"] == 0 and len(board["cube"]) == 2
    assert sorted(r["backend"] for r in board["leaderboard"]) == ["onnxruntime", "tensorrt"]
    console = Console(width=80, record=True)
    console.print(leaderboard_table(board))
    text = console.export_text()
    assert "tensorrt/cuda (onnxruntime)" in text and text.count("tensorrt/cuda") == 2, text
    site = aggregate(_write(tmp_path / "site", [base_doc]))
    assert [r["backend"] for r in site["cube"]] == [base_doc["runtime"]["format"]]
    # a site onnx row names no runtime: ONNX Runtime's, so va-bench's run of that cell replaces it (latest wins)
    site_onnx = _variant(base_doc, runtime__format="onnx", runtime__provider="cpu")
    ours = _variant(site_onnx, runtime__backend="onnxruntime")
    ours["created_at"] = "2099-01-01T00:00:00Z"
    merged = aggregate(_write(tmp_path / "onnx", [site_onnx, ours]))
    assert merged["counts"]["superseded"] == 1 and [r["backend"] for r in merged["cube"]] == ["onnxruntime"]


def test_a_run_of_another_preprocessing_is_another_row_and_its_accuracy_is_gated(tmp_path, base_doc):
    """A later run with --preprocess pil replaced the cv2 run's row and became the canonical mAP in silence (no
    agreement-gate finding), though its pixels and so its mAP differ; compare named no difference."""
    from harness.results.compare import compare_paths

    cv2 = _variant(base_doc, runtime__preprocess={"implementation": "cv2", "default": "cv2"})
    cv2["created_at"] = "2026-01-01T00:00:00Z"
    pil = _variant(base_doc, runtime__preprocess={"implementation": "pil", "default": "cv2"})
    pil["accuracy"] = {**pil["accuracy"], "mAP_50_95": pil["accuracy"]["mAP_50_95"] - 0.0147}
    pil["created_at"] = "2026-02-01T00:00:00Z"
    board = aggregate(_write(tmp_path / "both", [cv2, pil]), reference_hardware=base_doc["hardware"]["id"],
                      leaderboard_variant=_write(tmp_path / "one", [cv2])[0].submission.dataset_variant)
    assert board["counts"]["superseded"] == 0 and sorted(r["preprocess"] for r in board["cube"]) == ["default", "pil"]
    (gate,) = board["agreement_gate"]  # the family's own run is the canonical number, the newer pil one compared
    assert (gate["canonical_preprocess"], gate["other_preprocess"]) == ("default", "pil")
    assert gate["delta_points"] == pytest.approx(-1.47)
    (row,) = board["leaderboard"]
    assert row["preprocess"] == "default" and row["file"].endswith("s0.json")
    # a site file (no preprocessing recorded) and the family's own va-bench run are one coordinate: latest wins
    both = aggregate(_write(tmp_path / "site", [base_doc, {**cv2, "created_at": "2099-01-01T00:00:00Z"}]))
    assert both["counts"]["superseded"] == 1 and [r["preprocess"] for r in both["cube"]] == ["default"]
    (comparison,) = compare_paths(tmp_path / "one", [tmp_path / "both" / "s1.json"])
    assert comparison.differ["preprocess"] == ("default", "pil")
    (site_vs_ours,) = compare_paths(tmp_path / "site" / "s0.json", [tmp_path / "site" / "s1.json"])
    assert "preprocess" not in site_vs_ours.differ  # the site's file names none: the family's own, as va-bench's


def test_overlapped_and_latency_runs_stay_separate_rows(tmp_path, base_doc):
    latency = _timed(base_doc, 1.5)
    latency["created_at"] = "2026-01-01T00:00:00Z"
    overlapped = _variant(_timed(base_doc, 1.0), timing__mode="overlapped")
    overlapped["created_at"] = "2026-02-01T00:00:00Z"  # newer, yet it must not replace the latency run
    board = aggregate(_write(tmp_path / "modes", [latency, overlapped]))
    rates = {"latency": latency["throughput"]["fps_mean"], "overlapped": overlapped["throughput"]["fps_mean"]}
    assert sorted((r["timing_mode"], r["fps_mean"]) for r in board["cube"]) == sorted(rates.items())
    assert board["counts"]["superseded"] == 0
    assert [(r["timing_mode"], r["fps_mean"]) for r in board["leaderboard"]] == [("latency", rates["latency"])]
    only_overlapped = aggregate(_write(tmp_path / "only_overlapped", [overlapped]))
    assert [r["timing_mode"] for r in only_overlapped["leaderboard"]] == ["overlapped"]


def test_hardware_id_is_trusted_else_derived(tmp_path, base_doc):
    jetson = copy.deepcopy(base_doc)
    del jetson["hardware"]["id"]
    jetson["hardware"]["gpu"] = "Orin (nvgpu)"
    trusted = _variant(base_doc, hardware__gpu="Orin (nvgpu)")  # id present: kept as is
    board = aggregate(_write(tmp_path / "hw", [jetson, trusted]))
    assert sorted(r["hardware"] for r in board["cube"]) == ["jetson_orin", "nvidia_geforce_rtx_5070_ti"]
    # the site's schema refuses a file without its id (or an empty one): a row the plan mends says so
    board = aggregate(_write(tmp_path / "empty", [_variant(jetson, hardware__id=""), trusted]))
    for boards in (board, aggregate(_write(tmp_path / "hw2", [jetson, trusted]))):
        derived = {r["hardware"]: [f for f in r["flags"] if f.startswith("derived: hardware.id jetson_orin from")]
                   for r in boards["cube"]}
        assert [len(d) for d in derived.values()] == [1, 0] and list(derived) == ["jetson_orin",
                                                                                  "nvidia_geforce_rtx_5070_ti"]


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
    our_rows = {key(r["model"], r["hardware"], r["format"], r["provider"], r["precision"], Path(r["file"]).name)
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
    assert va_bench("aggregate", SUBMISSIONS, "--tolerance", "nan").returncode == 2  # NaN would gate nothing


@requires_corpus
@pytest.mark.parametrize("matrix, expected", [
    ({}, "`models` is not a list"),  # every file would be off the board, and the command would pass
    ({"models": 5, "runtimes": []}, "`models` is not a list"),
    ({"models": ["yolox-nano"], "runtimes": [5]}, "`runtimes` is not a list"),
    ([], "want an object"),
])
def test_a_support_matrix_of_another_shape_is_refused(tmp_path, matrix, expected):
    path = tmp_path / "matrix.json"
    path.write_text(json.dumps(matrix))
    for command in ("validate", "aggregate"):
        result = va_bench(command, SUBMISSIONS, "--support-matrix", path)
        assert result.returncode == 2 and expected in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1


# --- results side ------------------------------------------------------------------------


def _errors(report, rule):
    return [f for f in report.findings if f.rule == rule and f.severity == "error"]


def test_string_where_the_site_reads_a_number_is_an_error_and_not_aggregated(tmp_path, base_doc):
    bad = copy.deepcopy(base_doc)
    bad["timing"]["total_ms"]["p50"] = "57.3"
    bad["config"]["batch_size"] = 1.0
    bad["memory"]["peak_ram_mb"] = None  # may be unavailable: null is fine here
    good = _variant(base_doc, hardware__id="other_box")
    reports = _write(tmp_path / "types", [bad, good])
    typed = {f.path: f for f in reports[0].findings if f.rule == "type.number"}
    assert set(typed) == {"timing.total_ms.p50", "config.batch_size"}
    assert "must be a number" in typed["timing.total_ms.p50"].message
    assert "must be an integer" in typed["config.batch_size"].message
    assert not [f for f in reports[1].findings if f.rule.startswith("type")]
    board = aggregate(reports)
    assert [r["hardware"] for r in board["cube"]] == ["other_box"] and board["counts"]["excluded"] == 1


@requires_corpus
def test_every_number_the_site_reads_is_typed_in_the_real_corpus(corpus_reports):
    assert not [f for r in corpus_reports for f in r.findings if f.rule.startswith("type")]
    # the corpus's own non-standard runs: hailo yolov8 (iou 0.6, max_det 100), yolox (0.65); the two yolov9 rows
    # at (0.65, 500) are RF100-VL's, whose protocol that is (not a non-standard COCO one)
    protocol = _findings(corpus_reports, "nonstandard-protocol")
    assert len(protocol) == 8 and all(f.severity == "warning" for _, f in protocol)
    assert not [n for n, _ in protocol if "rtx_5060_ti" in n]
    assert not [n for n, _ in protocol if n.startswith(("yolo11", "yolo26", "yolov5u"))]  # their family's iou 0.7


def test_nonstandard_protocol_is_a_warning_unless_the_family_documents_it(tmp_path, base_doc):
    standard = base_doc  # yolox: conf 0.001, iou 0.6, max_det 300
    loose = _variant(base_doc, config__conf=0.25, config__max_det=100)
    ultralytics = _variant(base_doc, config__iou=0.7, model__family="yolov8")
    yolox_07 = _variant(base_doc, config__iou=0.7)
    reports = _write(tmp_path / "protocol", [standard, loose, ultralytics, yolox_07])
    found = [[f for f in r.findings if f.rule == "nonstandard-protocol"] for r in reports]
    assert [len(f) for f in found] == [0, 1, 0, 1]
    assert found[1][0].severity == "warning" and "conf 0.25, max_det 100" in found[1][0].message


def test_ap_read_at_another_cap_than_cocos_is_another_protocol(tmp_path, base_doc):
    """`--eval-max-det 500` reads AP at 500 detections per image: not COCO's AP, so a warning, and its accuracy never
    stands for (or supersedes) a run's at COCO's 100, whose file may state [1, 10, 100] or nothing (the site's)."""
    stated = _variant(base_doc, eval__maxDets=[1, 10, 100])
    at_500 = _variant(base_doc, eval__maxDets=[1, 10, 100, 500], accuracy__mAP_50_95=0.5)
    at_500["created_at"] = "2099-01-01T00:00:00Z"
    reports = _write(tmp_path / "cap", [base_doc, stated, at_500])
    found = [[f for f in r.findings if f.rule == "nonstandard-protocol"] for r in reports]
    assert [len(f) for f in found] == [0, 0, 1] and "eval.maxDets [1, 10, 100, 500]" in found[2][0].message
    board = aggregate(reports)
    rows = sorted(board["cube"], key=lambda r: r["file"])
    assert len(rows) == 2 and rows[0]["eval_cap"] in (None, 100) and len(rows[0]["superseded"]) == 1  # one row
    assert rows[1]["eval_cap"] == 500 and rows[0]["accuracy_shown"] != 0.5


def test_the_leaderboard_shows_a_model_at_its_published_input_size_whatever_else_was_swept(tmp_path, base_doc):
    """yolox-s is published at 640: two 320 px rows (two runtimes) do not outvote its one 640 row."""
    small = [_variant(_variant(base_doc, config__input_size=320, model__input_size=320), runtime__format=fmt,
                      runtime__provider=provider)
             for fmt, provider in (("onnx", "CPUExecutionProvider"), ("openvino", "CPU"))]
    board = aggregate(_write(tmp_path / "sizes", [base_doc, *small]))
    assert [r["input_size"] for r in board["cube"]].count(320) == 2
    assert [(r["model"], r["input_size"]) for r in board["leaderboard"]] == [("yolox-s", 640)]


def test_a_topk_model_at_the_thresholds_its_validator_applies_ran_the_sites_protocol(tmp_path):
    """The site's rows of NMS-free models state conf 0.001 / max_det 300; libreyolo's validator scores them at conf 0
    and the model's query count, which is what a run of ours records: the same protocol, one accuracy lineage."""
    if not SUBMISSIONS.is_dir():
        pytest.skip(f"vision-analysis corpus not found at {CORPUS}")
    site = json.loads(next(SUBMISSIONS.glob("dfine-n__tensorrt__cuda__jetson_orin__*.json")).read_text())
    ours = _variant(site, config__conf=0.0)
    ours["created_at"] = "2099-01-01T00:00:00Z"
    seg = json.loads(next(SUBMISSIONS.glob("rfdetr-seg-n__*.json")).read_text())
    seg_ours = _variant(seg, config__conf=0.0, config__max_det=100)  # rfdetr-seg-n's 100 queries
    seg_other = _variant(seg, config__conf=0.0, config__max_det=50)
    reports = _write(tmp_path / "topk", [site, ours, seg_ours, seg_other])
    found = [[f for f in r.findings if f.rule == "nonstandard-protocol"] for r in reports]
    assert [len(f) for f in found] == [0, 0, 0, 1]
    board = aggregate(reports[:2])
    rows = [r for r in board["cube"] if r["model"] == "dfine-n"]
    assert len(rows) == 1 and rows[0]["file"].endswith("s1.json") and len(rows[0]["superseded"]) == 1


def test_figures_that_contradict_each_other_are_errors_and_kept_off_the_leaderboard(tmp_path, base_doc):
    """The rate the site ranks by is 1000 / the per-image latency; a file that says otherwise (or whose percentiles,
    stage split, batch or input size, mAP_50 contradict its other figures) is refused, the real one is not."""
    total = base_doc["timing"]["total_ms"]
    mean = total["mean"]
    broken = [
        _variant(base_doc, throughput__fps_mean=round(10_000 / mean, 2)),  # ten times the measured rate
        _variant(base_doc, timing__total_ms={**total, "p50": total["p99"] + 1}),  # p50 above p95 and p99
        _variant(base_doc, timing__total_ms={**total, "inference_ms": mean * 2}),  # stages past the total
        _variant(base_doc, timing__batch_size=8),  # config.batch_size is 1
        _variant(base_doc, model__input_size=416),  # config.input_size is 640
        _variant(base_doc, accuracy__mAP_50=base_doc["accuracy"]["mAP_50_95"] / 2),
    ]
    reports = _write(tmp_path / "inconsistent", [base_doc, *broken])
    found = [[f.path for f in r.errors if f.rule == "inconsistent"] for r in reports]
    assert found == [[], ["throughput.fps_mean"], ["throughput.fps_p50", "timing.total_ms"], ["timing.total_ms"],
                     ["timing.batch_size"],
                     ["model.input_size"], ["accuracy.mAP_50"]]
    board = aggregate(reports)
    assert board["counts"]["included"] == 1 and board["counts"]["excluded"] == len(broken)


@requires_corpus
def test_every_corpus_row_is_consistent(corpus_reports):
    assert not [f for r in corpus_reports for f in r.findings if f.rule == "inconsistent"]


def test_a_coco_row_scored_through_a_class_map_is_refused_for_publication(tmp_path, base_doc):
    """A class map on COCO (person and car swapped) changes the mAP: the row is not the model's on COCO's classes,
    and must neither pass validate nor stand in the cube beside (or over) the unmapped row."""
    mapped = copy.deepcopy(base_doc)
    mapped["repro"] = {"dataset": {"class_map": {"file": "swap.yaml", "entries": {"person": "car", "car": "person"},
                                                 "sha256": "0" * 64}}}
    reports = _write(tmp_path / "mapped", [mapped, base_doc])
    assert [len(_errors(r, "class-map")) for r in reports] == [1, 0]
    board = aggregate(reports)
    assert board["counts"]["excluded"] == 1 and [Path(r["file"]).name for r in board["cube"]] == ["s1.json"]


def test_random_weights_are_refused_for_publication(tmp_path, base_doc):
    by_model = _variant(base_doc, model__weights="random")
    by_repro = copy.deepcopy(base_doc)
    by_repro["repro"] = {"weights": {"file": "none", "sha256": None, "source": "random"}}
    reports = _write(tmp_path / "random", [by_model, by_repro, base_doc])
    assert [len(_errors(r, "random-weights")) for r in reports] == [1, 1, 0]
    board = aggregate(reports)
    assert board["counts"]["excluded"] == 2 and [Path(r["file"]).name for r in board["cube"]] == ["s2.json"]
    # why, as the summary line says it: not the site's rules (it takes them), ours
    assert (board["counts"]["by_site_rules"], board["counts"]["unpublishable"]) == (0, 2)
    assert [e["rules"] for e in board["excluded"]] == [["random-weights"]] * 2
    unscored = copy.deepcopy(base_doc)
    del unscored["accuracy"]  # the site's schema requires it
    _write(tmp_path / "mixed", [by_model, unscored, base_doc])
    done = run_in_process("aggregate", str(tmp_path / "mixed"))
    assert "3 files, 1 included, 2 excluded (1 by the site's rules, 1 by va-bench's rules (random-weights))" in \
        " ".join(done.stdout.split()), done.stdout


def _with_weights(doc, sha256=None, source="--weights", created="2026-01-01T00:00:00Z"):
    doc = copy.deepcopy(doc)
    doc["repro"] = {"weights": {"file": "w.onnx", "sha256": sha256, "source": source}}
    doc["created_at"] = created
    return doc


def test_other_weights_never_supersede_a_run(tmp_path, base_doc):
    official = _with_weights(base_doc, "a" * 64, created="2026-01-01T00:00:00Z")
    other = _with_weights(base_doc, "b" * 64, created="2026-02-01T00:00:00Z")  # newer, other weights
    rerun = _with_weights(base_doc, "a" * 64, created="2026-03-01T00:00:00Z")  # newer, same weights
    no_sha = _with_weights(base_doc, None, source="plugin")
    board = aggregate(_write(tmp_path / "weights", [official, other, rerun, no_sha]))
    rows = {r["weights"]: r for r in board["cube"]}
    assert set(rows) == {f"sha256:{'a' * 64}", f"sha256:{'b' * 64}", "source:plugin"}
    assert rows[f"sha256:{'a' * 64}"]["superseded"] == [str(tmp_path / "weights" / "s0.json")]
    assert rows[f"sha256:{'b' * 64}"]["superseded"] == []
    assert board["counts"]["superseded"] == 1


def _full_val(doc, m, hardware="a100", created="2026-01-01T00:00:00Z", tf32=None, device="gpu"):
    doc = _variant(doc, accuracy__mAP_50_95=m, hardware__id=hardware, dataset__num_images=5000,
                   eval__numImages=5000, timing__num_images=5000, runtime__device=device)
    doc["benchmark"]["libreyolo_commit"] = "5f12ee96d5f3099eaede265187a5df70a5f70c08"
    doc["created_at"] = created
    if tf32 is not None:
        doc["runtime"]["tf32"] = tf32
    return doc


TF32_ON = {"mode": "on", "matmul_allow_tf32": True, "cudnn_allow_tf32": True, "float32_matmul_precision": "high"}
TF32_OFF = {"mode": "off", "matmul_allow_tf32": False, "cudnn_allow_tf32": False,
            "float32_matmul_precision": "highest"}
TF32_DEFAULT = {"mode": "default", "matmul_allow_tf32": False, "cudnn_allow_tf32": True,
                "float32_matmul_precision": "highest"}


def test_tf32_on_fp32_never_becomes_the_canonical_fp32_accuracy(tmp_path, base_doc):
    off = _full_val(base_doc, 0.450, created="2026-01-01T00:00:00Z", tf32=TF32_OFF)
    on = _full_val(base_doc, 0.447, created="2026-02-01T00:00:00Z", tf32=TF32_ON)  # newer, same a100
    board = aggregate(_write(tmp_path / "tf32", [off, on]))
    canonical = {c["precision"]: c for c in board["canonical_accuracy"]}
    assert canonical["fp32"]["mAP_50_95"] == 0.450 and canonical["fp32"]["file"] == str(tmp_path / "tf32" / "s0.json")
    assert canonical["fp32+tf32"]["mAP_50_95"] == 0.447
    assert sorted(r["tf32"] for r in board["cube"]) == ["off", "on"]  # two rows: TF32 on never supersedes off
    # TF32-on alone on the reference: still not canonical fp32; an fp32 run elsewhere is
    elsewhere = _full_val(base_doc, 0.451, hardware="nvidia_geforce_rtx_5070_ti", tf32=TF32_OFF)
    default = _full_val(base_doc, 0.446, created="2026-03-01T00:00:00Z", tf32=TF32_DEFAULT)  # cudnn TF32 on
    board = aggregate(_write(tmp_path / "tf32_alone", [on, elsewhere, default]))
    canonical = {c["precision"]: c for c in board["canonical_accuracy"]}
    assert canonical["fp32"]["mAP_50_95"] == 0.451 and canonical["fp32"]["policy"].startswith("fallback")
    assert canonical["fp32+tf32"]["mAP_50_95"] in (0.447, 0.446)
    # on a CPU the TF32 flags do nothing: fp32 stays fp32
    cpu = _full_val(base_doc, 0.452, hardware="a100", tf32=TF32_DEFAULT, device="cpu")
    board = aggregate(_write(tmp_path / "tf32_cpu", [cpu]))
    assert [c["precision"] for c in board["canonical_accuracy"]] == ["fp32"]


def test_int8_accuracy_is_each_runtimes_own(tmp_path, base_doc):
    """Each runtime quantises and calibrates its own way: LiteRT's int8 row never shows OpenVINO's int8 mAP (it did,
    with 0.3033 against its own 0.2207, flagged only by the agreement gate)."""
    def int8(fmt, m):
        doc = _full_val(base_doc, m)
        doc["runtime"]["precision"], doc["runtime"]["format"] = "int8", fmt
        return doc

    board = aggregate(_write(tmp_path / "int8", [int8("openvino", 0.303), int8("tflite", 0.221)]))
    canonical = {c["precision"]: c["mAP_50_95"] for c in board["canonical_accuracy"]}
    assert canonical == {"int8 (openvino)": 0.303, "int8 (tflite)": 0.221}
    assert not board["agreement_gate"]


def test_another_input_size_never_becomes_the_canonical_accuracy(tmp_path, base_doc):
    native = _full_val(base_doc, 0.450, created="2026-01-01T00:00:00Z")
    small = _full_val(base_doc, 0.300, created="2026-02-01T00:00:00Z")  # newer, same a100, 320 px
    small["config"]["input_size"] = small["model"]["input_size"] = 320
    board = aggregate(_write(tmp_path / "sizes", [native, small]))
    canonical = {c["input_size"]: c["mAP_50_95"] for c in board["canonical_accuracy"]}
    assert canonical == {native["config"]["input_size"]: 0.450, 320: 0.300}
    assert board["agreement_gate"] == []  # different sizes are different accuracies, not drift


def test_other_thresholds_never_become_the_canonical_accuracy(tmp_path, base_doc):
    """A run at --conf 0.25 (newer, same a100, same coordinate) scores lower than the site's protocol (conf
    0.001): it is its own accuracy identity and its own row, never the number shown for protocol rows."""
    standard = _full_val(base_doc, 0.450, created="2026-01-01T00:00:00Z")
    loose = _full_val(base_doc, 0.410, created="2026-02-01T00:00:00Z")
    loose["config"]["conf"] = 0.25
    elsewhere = _full_val(base_doc, 0.449, hardware="nvidia_geforce_rtx_5070_ti")  # standard protocol
    board = aggregate(_write(tmp_path / "protocol", [standard, loose, elsewhere]))
    canonical = {c["conf"]: c for c in board["canonical_accuracy"]}
    assert set(canonical) == {standard["config"]["conf"], 0.25}
    assert canonical[standard["config"]["conf"]]["mAP_50_95"] == 0.450
    assert Path(canonical[standard["config"]["conf"]]["file"]).name == "s0.json"
    assert (canonical[0.25]["mAP_50_95"], canonical[0.25]["iou"], canonical[0.25]["max_det"]) == (
        0.410, standard["config"]["iou"], standard["config"]["max_det"])
    assert board["agreement_gate"] == []  # other thresholds are another accuracy, not drift
    cube = {(r["hardware"], r["conf"]): r for r in board["cube"]}
    assert len(cube) == 3 and board["counts"]["superseded"] == 0  # the newer loose run replaces nothing
    assert cube[("a100", standard["config"]["conf"])]["accuracy_shown"] == 0.450
    assert cube[("nvidia_geforce_rtx_5070_ti", standard["config"]["conf"])]["accuracy_shown"] == 0.450
    assert cube[("a100", 0.25)]["accuracy_shown"] == 0.410
    a100 = next(r for r in board["leaderboard"] if r["hardware"] == "a100")  # one row: the standard run's
    assert (a100["conf"], a100["accuracy_shown"]) == (standard["config"]["conf"], 0.450)
    assert "protocol (conf, iou, max_det, eval cap)" in board["policy"]["accuracy_identity"]


def test_only_batch_one_rows_are_on_the_leaderboard(tmp_path, base_doc):
    """A batch sweep: every batch size is a cube row, the leaderboard shows the batch-1 one alone."""
    docs = [_variant(_timed(base_doc, b / 2), config__batch_size=b, timing__batch_size=b) for b in (2, 4, 1, 8)]
    board = aggregate(_write(tmp_path / "sweep", docs))
    assert sorted(r["batch_size"] for r in board["cube"]) == [1, 2, 4, 8]
    assert [(r["batch_size"], Path(r["file"]).name) for r in board["leaderboard"]] == [(1, "s2.json")]


def test_canonical_accuracy_prefers_batch_one_then_the_newest_run(tmp_path, base_doc):
    """Three full-val runs on the reference a100 of one accuracy identity: a batch-8 run newest of all, and two
    batch-1 runs (latency mode and a newer overlapped one): the newest batch-1 run's mAP is the canonical one."""
    old = _full_val(base_doc, 0.450, created="2026-01-01T00:00:00Z")
    newer = _variant(_full_val(base_doc, 0.452, created="2026-02-01T00:00:00Z"), timing__mode="overlapped")
    b8 = _variant(_full_val(base_doc, 0.440, created="2026-03-01T00:00:00Z"), config__batch_size=8,
                  timing__batch_size=8)
    for docs in ([old, newer, b8], [b8, newer, old]):
        board = aggregate(_write(tmp_path / f"canonical{docs[0] is b8}", docs))
        assert len(board["cube"]) == 3 and board["counts"]["superseded"] == 0
        (canonical,) = board["canonical_accuracy"]
        assert canonical["mAP_50_95"] == 0.452 and canonical["policy"] == "reference"
        assert Path(canonical["file"]).name == f"s{docs.index(newer)}.json"


def test_leaderboard_rows_are_ordered_by_accuracy_within_each_runtime(tmp_path, base_doc):
    """Three models with canonical full-val mAPs 0.40 (s), 0.45 (m), 0.30 (l) on the a100 and timed on a second
    machine: each machine's rows read m, s, l (highest mAP first), not by name or speed."""
    maps = {"yolox-s": 0.40, "yolox-m": 0.45, "yolox-l": 0.30}
    docs = []
    for k, (model, m) in enumerate(maps.items()):
        named = _variant(_timed(base_doc, 1 + k), model__id=model, model__variant=model[-1])
        docs += [_full_val(named, m), _variant(named, accuracy__mAP_50_95=m)]
    board = aggregate(_write(tmp_path / "order", docs))
    rows = [(r["hardware"], r["model"], r["accuracy_shown"]) for r in board["leaderboard"]]
    expected = sorted(maps.items(), key=lambda kv: -kv[1])
    assert rows == [(hw, model, m) for hw in ("a100", "nvidia_geforce_rtx_5070_ti") for model, m in expected]


def test_leaderboard_accuracy_is_pinned_to_full_val(tmp_path, base_doc):
    subset = _variant(base_doc, accuracy__mAP_50_95=0.40)  # mini500 on the 5070 Ti
    board = aggregate(_write(tmp_path / "only_subset", [subset]))
    (row,) = board["leaderboard"]
    assert row["accuracy_shown"] is None and "no canonical full" in row["accuracy_source"]
    assert board["cube"][0]["accuracy_shown"] == 0.40 and board["cube"][0]["subset"] is True  # the cube keeps it
    board = aggregate(_write(tmp_path / "only_subset_mini", [subset]), leaderboard_variant="mini500")
    (row,) = board["leaderboard"]
    assert row["accuracy_shown"] == 0.40 and row["subset"] is True
    assert board["policy"]["leaderboard_variant"] == "mini500"

    full_a100 = _full_val(base_doc, 0.45)
    full_here = _full_val(base_doc, 0.449, hardware="nvidia_geforce_rtx_5070_ti")
    board = aggregate(_write(tmp_path / "with_full", [subset, full_a100, full_here]))
    assert len(board["cube"]) == 3  # every variant stays in the cube
    rows = {r["hardware"]: r for r in board["leaderboard"]}
    assert set(rows) == {"a100", "nvidia_geforce_rtx_5070_ti"}  # one row per coordinate
    assert rows["nvidia_geforce_rtx_5070_ti"]["dataset_variant"] == "full"  # the full-val run's timing
    assert all(r["accuracy_shown"] == 0.45 and r["subset"] is False for r in rows.values())
    with pytest.raises(UsageError, match="--leaderboard-variant 'mini50'"):
        aggregate(_write(tmp_path / "typo", [subset]), leaderboard_variant="mini50")
    # a misspelt reference or fallback hardware would silently take the canonical accuracy from another machine
    for given in ({"reference_hardware": "a10"}, {"fallback_hardware": ["rpi5", "jetsn_orin"]}):
        with pytest.raises(UsageError, match="hardware 'a10'|hardware 'jetsn_orin'"):
            aggregate(_write(tmp_path / "typo", [subset]), **given)


def _run_folder(root, doc, detections):
    """outputs/<run_id>/ as `run` writes it: run.json, submissions/, detections/, a trace."""
    (root / "submissions").mkdir(parents=True)
    (root / "detections").mkdir()
    (root / "run.json").write_text(json.dumps({"run_id": root.name, "cells": []}))
    (root / "trace.json").write_text(json.dumps({"traceEvents": []}))
    doc = copy.deepcopy(doc)
    doc["artifacts"] = {"detections": "detections/m.json"}
    (root / "submissions" / "s.json").write_text(json.dumps(doc))
    (root / "detections" / "m.json").write_text(json.dumps(detections))
    return root


DETS = [{"image_id": 139, "category_id": 1, "bbox": [1.0, 2.0, 30.5, 40.0], "score": 0.9},
        {"image_id": 139, "category_id": 3, "bbox": [5.0, 6.0, 7.0, 8.0], "score": 0.1}]


def test_validate_a_run_folder_reads_only_its_submissions_and_checks_detections(tmp_path, base_doc):
    run = _run_folder(tmp_path / "outputs" / "r1", base_doc, DETS)
    validation = validate_paths([run], None)
    assert [r.path.name for r in validation.reports] == ["s.json"]
    assert not _findings(validation.reports, "detections")
    note, unchecked = validation.notes  # the second: no --support-matrix was given
    assert "run folder" in note and "3 other JSON files skipped: detections/, run.json, trace.json" in note
    assert "allow-lists of models and runtimes were not checked" in unchecked
    # pointed at outputs/ with several runs: each run folder is read the same way
    broken = [dict(DETS[0], bbox=[None, None, None, None]), DETS[1], dict(DETS[1], score=None)]
    other = _variant(base_doc, hardware__id="box2")
    other["submission_id"] = "another-run"
    _run_folder(tmp_path / "outputs" / "r2", other, broken)
    child = tmp_path / "outputs" / "r2" / "repeats" / "process-2"  # a --repeats process's own run folder
    child.mkdir(parents=True)
    (child / "run.json").write_text("{}")
    validation = validate_paths([tmp_path / "outputs"], None)
    assert len(validation.reports) == 2 and len(validation.notes) == 3  # the nested run is part of r2's
    ((name, finding),) = _findings(validation.reports, "detections")
    assert finding.severity == "error" and "2 of 3 detections are unusable" in finding.message
    assert "[0] bbox [None, None, None, None]" in finding.message
    board = aggregate(validation.reports)
    assert sorted(r["accuracy_trusted"] for r in board["cube"]) == [False, True]
    result = va_bench("validate", tmp_path / "outputs" / "r2")
    assert result.returncode == 1 and "run folder" in result.stdout and "unusable" in result.stdout
    # a folder of many run folders: every run folder's submissions, and one note for them all
    for k in range(3, 7):
        copy_of = _variant(base_doc, hardware__id=f"box{k}")
        copy_of["submission_id"] = f"run-{k}"
        _run_folder(tmp_path / "outputs" / f"r{k}", copy_of, DETS)
    validation = validate_paths([tmp_path / "outputs"], None)
    assert len(validation.reports) == 6 and all(r.path.parent.name == "submissions" for r in validation.reports)
    note, _ = validation.notes
    assert note.startswith("6 run folders: reading their submissions/*.json only (6 files; ")
    assert "skipped: detections/, repeats/, run.json, trace.json" in note


def test_a_campaign_or_fleet_folder_s_own_record_is_no_submission(tmp_path, base_doc):
    """campaign.json (a campaign's recipe) and fleet.json (a fleet's plan) beside the submissions are skipped with a
    note, not validated as broken submissions."""
    for name in ("campaign.json", "fleet.json"):
        folder = tmp_path / name.split(".")[0]
        (folder / "submissions").mkdir(parents=True)
        (folder / "submissions" / "row.json").write_text(json.dumps(base_doc))
        (folder / name).write_text(json.dumps({"recipe": {"model": "yolox-nano"}}))
        validation = validate_paths([folder], None)
        assert [r.path.name for r in validation.reports] == ["row.json"]
        assert any(name in note and "not submissions" in note for note in validation.notes)
        printed = va_bench("aggregate", str(folder), "--json")  # the notes the text prints, in the JSON too
        assert any(name in note for note in json.loads(printed.stdout)["notes"]), printed.stdout[-500:]
    (tmp_path / "loose").mkdir()  # a submission that happens to be called so is one
    (tmp_path / "loose" / "campaign.json").write_text(json.dumps(base_doc))
    assert [r.path.name for r in validate_paths([tmp_path / "loose"], None).reports] == ["campaign.json"]


def test_detections_reference_cannot_leave_the_run_folder(tmp_path, base_doc):
    run = _run_folder(tmp_path / "r1", base_doc, DETS)
    (tmp_path / "secret.json").write_text(json.dumps([{"bbox": None}]))
    doc = json.loads((run / "submissions" / "s.json").read_text())
    doc["artifacts"]["detections"] = "../../secret.json"
    (run / "submissions" / "s.json").write_text(json.dumps(doc))
    ((_, finding),) = _findings(validate_paths([run], None).reports, "detections")
    assert finding.severity == "warning" and "secret.json is not in" in finding.message  # looked in detections/


@pytest.mark.parametrize("command", ["validate", "aggregate"])
def test_empty_input_is_exit_2_with_one_line(tmp_path, command):
    (tmp_path / "empty").mkdir()
    result = va_bench(command, tmp_path / "empty")
    assert result.returncode == 2
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "no submission files" in lines[0] and "Traceback" not in result.stderr


def test_json_writer_refuses_nan_and_keeps_none(tmp_path):
    from harness.files import NonFiniteNumberError, atomic_write_json

    for bad, where in (({"timing": {"total_ms": {"p50": float("nan")}}}, "timing.total_ms.p50"),
                       ([{"bbox": [1.0, float("inf"), 2.0, 3.0]}], "$[0].bbox[1]")):
        with pytest.raises(NonFiniteNumberError) as err:
            atomic_write_json(tmp_path / "x.json", bad)
        assert where in str(err.value) and err.value.exit_code == 1
        assert list(tmp_path.iterdir()) == []  # nothing written, no temp file left
    atomic_write_json(tmp_path / "ok.json", {"peak_vram_mb": None, "p50": 1.5})
    assert json.loads((tmp_path / "ok.json").read_text()) == {"peak_vram_mb": None, "p50": 1.5}


def test_a_larger_variant_measured_faster_is_a_size_order_finding(tmp_path, base_doc):
    """yolox-s (base_doc) and yolox-m/l at the same coordinate: m 20 % faster than s is a finding naming both
    rows; l 5 % faster than s is within the margin; another batch size is another coordinate."""
    m = _variant(_timed(base_doc, 0.8), model__id="yolox-m", model__variant="m")
    large = _variant(_timed(base_doc, 0.95), model__id="yolox-l", model__variant="l")
    other_batch = _variant(m, config__batch_size=8, timing__batch_size=8)
    board = aggregate(_write(tmp_path / "sizes", [base_doc, m, large, other_batch]), size_ranks=size_ranks())
    (finding,) = board["size_order"]
    assert (finding["smaller"]["model"], finding["larger"]["model"]) == ("yolox-s", "yolox-m")
    assert (finding["smaller"]["file"], finding["larger"]["file"]) == tuple(str(tmp_path / "sizes" / f"s{i}.json")
                                                                            for i in (0, 1))
    assert finding["faster_pct"] == pytest.approx(20.0, abs=0.05)
    assert board["counts"]["size_order_findings"] == 1


def test_size_order_findings_on_the_real_corpus_equal_a_plain_count(corpus_reports):
    """Independent count over the raw files: every pair of one family's variants (catalogue order) at the same
    hardware/format/provider/precision/input/batch where the larger one's p50 is > 10 % lower (COCO rows: the
    RF100-VL section's are timed on other data)."""
    import yaml

    from harness.catalogue import CATALOGUE, SIZES, ULTRALYTICS_PATTERNS

    order = {pattern.format(s): (family, i) for family, pattern in ULTRALYTICS_PATTERNS.items()
             for i, s in enumerate(SIZES)}
    for key, block in yaml.safe_load(CATALOGUE.read_text())["libreyolo"]["families"].items():
        order.update({m: (key, i) for i, m in enumerate(block["models"])})  # a block's ids: one size order
    groups = {}
    for path in sorted(SUBMISSIONS.glob("*.json")):
        d = json.loads(path.read_text())
        if d["model"]["id"] in order and "rf100vl" not in d:
            key = (order[d["model"]["id"]][0], d["hardware"]["id"], d["runtime"]["format"], d["runtime"]["provider"],
                   d["runtime"]["precision"], d["config"]["input_size"], d["config"]["batch_size"],
                   d["config"]["conf"], d["config"]["iou"], d["config"]["max_det"])
            groups.setdefault(key, []).append((order[d["model"]["id"]][1], d["timing"]["total_ms"]["p50"]))
    expected = sum(1 for rows in groups.values() for small_rank, small in rows for large_rank, large in rows
                   if large_rank > small_rank and large < 0.9 * small)
    board = aggregate(corpus_reports, size_ranks=size_ranks())
    assert expected > 0 and len(board["size_order"]) == expected


def test_rf100vl_rows_are_known_for_what_they_are(corpus_reports, tmp_path):
    """The corpus's two RF100-VL rows: RF100-VL's protocol (iou 0.65, max_det 500) is not a non-standard COCO
    one; their real defects stay flagged (peak_ram_mb 0, an unpinned commit); aggregate lists them in their own
    section and never on the COCO leaderboard. A doctored mean or a false valid_submission is found."""
    rf = [r for r in corpus_reports if r.submission is not None and r.submission.is_rf100vl]
    assert sorted(r.path.name.split("__")[0] for r in rf) == ["yolov9s", "yolov9t"]
    for report in rf:
        rules = {(f.rule, f.path) for f in report.findings}
        assert not any(rule == "nonstandard-protocol" for rule, _ in rules)
        assert ("degenerate", "memory.peak_ram_mb") in rules and ("commit_guard", "repro.harness_commit") in rules
        assert not any(rule == "rf100vl" for rule, _ in rules)  # its mean is its datasets' mean
    board = aggregate(corpus_reports)
    assert [r["model"] for r in board["rf100vl"]] == ["yolov9s", "yolov9t"]
    assert {r["variant"] for r in board["rf100vl"]} == {"full100"}
    files = {str(r.path) for r in rf}
    assert files == {row["file"] for row in board["rf100vl"]}
    assert not any(row["file"] in files for row in board["leaderboard"])
    doc = json.loads(rf[0].path.read_text())
    doc["accuracy"]["mAP_50_95"] += 0.01
    doc["rf100vl"]["datasets"] = doc["rf100vl"]["datasets"][:3]
    (tmp_path / "doctored.json").write_text(json.dumps(doc))
    (report,) = validate_paths([tmp_path / "doctored.json"], None).reports
    messages = [f.message for f in report.findings if f.rule == "rf100vl"]
    assert any("is not the mean of the 3 datasets' mAP_50_95" in m for m in messages)
    assert any("valid_submission is true with 3 of 100 datasets" in m for m in messages)
    assert report.submission.rf100vl_variant == "partial3"
    # measured under another protocol than the version it states (NMS IoU 0.7, max_det and COCOeval's cap 100)
    doc = json.loads(rf[0].path.read_text())
    doc["config"].update(iou=0.7, max_det=100)
    doc["eval"]["maxDets"] = [1, 10, 100]
    doc["rf100vl"]["protocol"].update(nms_iou=0.7, max_det=100)
    (tmp_path / "other_protocol.json").write_text(json.dumps(doc))
    (report,) = validate_paths([tmp_path / "other_protocol.json"], None).reports
    messages = [f.message for f in report.findings if f.rule == "rf100vl"]
    assert "rf100vl.protocol.nms_iou 0.7 is not rf100vl.libreyolo.v1's 0.65" in messages
    assert "rf100vl.protocol.max_det 100 is not rf100vl.libreyolo.v1's 500" in messages
    assert "valid_submission is true but iou 0.7 is not the protocol's 0.65" in messages
    assert any("maxDets [1, 10, 100] lack the protocol's 500" in m for m in messages)
    # a partial row as the harness wrote them before (expected_datasets the campaign's 4): flagged, not failed
    doc = json.loads(rf[0].path.read_text())
    doc["rf100vl"].update(valid_submission=False, datasets=doc["rf100vl"]["datasets"][:3])
    doc["rf100vl"]["protocol"]["expected_datasets"] = 4
    (tmp_path / "old_partial.json").write_text(json.dumps(doc))
    (report,) = validate_paths([tmp_path / "old_partial.json"], None).reports
    assert [f.severity for f in report.findings if f.path == "rf100vl.protocol.expected_datasets"] == ["warning"]



def test_another_dataset_never_mixes_with_coco_rows(tmp_path, base_doc):
    """The same model, hardware and coordinates on another dataset (same variant name, "sample"): its own row,
    neither superseding nor superseded, never canonical COCO accuracy, never on the COCO leaderboard."""
    coco = _variant(base_doc, dataset__variant="sample")
    other = _variant(coco, dataset__id="my-data", dataset__split="valid")
    other["created_at"] = "2030-01-01T00:00:00Z"
    other["accuracy"]["mAP_50_95"], other["accuracy"]["mAP_50"] = 0.9, 0.95
    board = aggregate(_write(tmp_path / "mixed", [coco, other]))
    assert len(board["cube"]) == 2 and board["counts"]["superseded"] == 0
    assert {r["section"] for r in board["cube"]} == {"coco", "other"}
    assert (board["counts"]["rf100vl_rows"], board["counts"]["other_dataset_rows"]) == (0, 1)  # not RF100-VL's
    assert all(c["mAP_50_95"] != 0.9 for c in board["canonical_accuracy"])
    assert all(r["section"] == "coco" for r in board["leaderboard"])


def test_a_derived_hardware_id_tells_machines_apart_and_keeps_the_sites_ids():
    from harness.hardware import derive_hardware_id

    assert derive_hardware_id(None, "AMD EPYC", 2) == "cpu_amd_epyc_2c"
    assert derive_hardware_id(None, "AMD EPYC", 64) == "cpu_amd_epyc_64c"
    assert derive_hardware_id("Orin (nvgpu)", "ARMv8 Processor rev 1 (v8l)", 8) == "jetson_orin"
    assert derive_hardware_id("Raspberry Pi 5 Model B Rev 1.0", "Cortex-A76", 4) == "rpi5"
    assert derive_hardware_id("NVIDIA GeForce RTX 5070 Ti", "AMD Ryzen", 16) == "nvidia_geforce_rtx_5070_ti"


def test_names_that_act_on_a_terminal_are_errors_and_never_printed_raw(tmp_path, base_doc):
    """A model id carrying an escape sequence and a forged line: validate says so; aggregate prints it escaped."""
    hostile = "evil\x1b[2J\nerror: forged line"
    doc = _variant(base_doc, model__id=hostile, hardware__driver_version="595\nGPU")
    doc["timing"]["batch_samples_ms"] = ["a", -1, None]
    (report,) = _write(tmp_path / "subs", [doc])
    found = {(f.rule, f.path, f.severity) for f in report.findings}
    assert ("identifier", "model.id", "error") in found
    assert ("identifier", "hardware.driver_version", "warning") in found  # a description, not a coordinate
    assert ("timing", "timing.batch_samples_ms", "error") in found
    result = va_bench("validate", tmp_path / "subs")
    lines = result.stdout.splitlines()
    assert "\x1b" not in result.stdout and not any(line.startswith("error: forged") for line in lines)
    board = va_bench("aggregate", tmp_path / "subs")
    assert "\x1b" not in board.stdout + board.stderr


def test_the_terminal_escape_shows_control_characters_and_keeps_names():
    from harness.views.text import escape

    assert escape("yolox-nano [b8]") == "yolox-nano \\[b8]"
    assert escape("evil\x1b[2J\nx") == "evil\\x1b[2J\\x0ax"
    assert escape("a\u202eb") == "a\\u202eb"  # a right-to-left override would reorder what follows


def test_aggregate_of_files_that_are_no_submissions_says_so(tmp_path, base_doc):
    (tmp_path / "list.json").write_text("[1, 2]")
    (tmp_path / "cut.json").write_text('{"schema_version": "va.sub')
    refused = va_bench("aggregate", tmp_path)
    assert refused.returncode == 2 and "none of the 2 files is a va.submission.v1" in refused.stderr, refused.stderr
    _write(tmp_path / "mixed", [base_doc])
    (tmp_path / "mixed" / "list.json").write_text("[1, 2]")
    mixed = va_bench("aggregate", tmp_path / "mixed")
    assert mixed.returncode == 0 and "2 files, 1 included, 1 excluded (1 not submissions)" in mixed.stdout, mixed.stdout


# documents beside a site's submissions that are no submission at all: a support matrix, a JSON Schema, a COCO
# annotation file, `{}` (file name, content, what the note and the finding call it)
OTHER_DOCUMENTS = {
    "site": [("support-matrix.json", {"schema_version": "va.support-matrix.v1", "models": []},
              "schema_version 'va.support-matrix.v1'"),
             ("schema.json", {"$schema": "https://json-schema.org/draft/2020-12/schema"}, "a JSON Schema")],
    "coco": [("instances_val2017.json", {"info": {}, "images": [{"id": 1}], "annotations": [],
                                         "categories": [{"id": 1, "name": "a"}]}, "a COCO annotation file"),
             ("empty.json", {}, "an empty JSON object")],
}


@pytest.mark.parametrize("kind", OTHER_DOCUMENTS)
def test_documents_of_other_kinds_are_named_not_validated_as_broken_submissions(tmp_path, base_doc, kind):
    """Other documents beside the submissions (OTHER_DOCUMENTS: a support matrix, a JSON Schema, a COCO annotation
    file, `{}`): skipped with a note inside a folder; named one by one, one line each (not the schema's dozens of
    missing fields), and aggregate of only them is exit 2. A misspelt schema_version, or an object with some field of
    a submission, is a broken submission all the same."""
    folder = tmp_path / "site"
    _write(folder, [base_doc])
    documents = OTHER_DOCUMENTS[kind]
    for name, doc, _ in documents:
        (folder / name).write_text(json.dumps(doc))
    validation = validate_paths([folder], None)
    assert [r.path.name for r in validation.reports] == ["s0.json"]
    assert any("skipped 2 JSON document(s) of other kinds" in n and all(what in n for _, _, what in documents)
               for n in validation.notes), validation.notes
    name, _, what = documents[0]
    report = validate_file(folder / name, None, SCHEMA)
    assert [f.message for f in report.findings] == [f"not a va.submission.v1 ({what})"]
    refused = va_bench("aggregate", *(folder / name for name, _, _ in documents))
    assert refused.returncode == 2 and "none of the 2 files is a va.submission.v1" in refused.stderr, refused.stderr
    misspelt = dict(base_doc, schema_version="va.submision.v1")  # a broken submission, never skipped as another kind
    (folder / "misspelt.json").write_text(json.dumps(misspelt))
    kept = {k: v for k, v in base_doc.items() if k in ("submission_id", "accuracy")}
    (folder / "broken.json").write_text(json.dumps(kept))
    reports = {r.path.name: r for r in validate_paths([folder], None).reports}
    assert reports["misspelt.json"].errors and reports["broken.json"].errors


def test_two_folders_with_one_file_name_keep_their_rows_apart(tmp_path, base_doc):
    """Rows name their file as given (two folders' files may share a name): the newer file wins and the older is
    named superseded by its own path, never the same name twice."""
    newer = copy.deepcopy(base_doc)
    newer["created_at"], newer["submission_id"] = "2030-01-01T00:00:00Z", "newer"
    for folder, doc in (("a", base_doc), ("b", newer)):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "s0.json").write_text(json.dumps(doc))
    board = aggregate(validate_paths([tmp_path / "a", tmp_path / "b"], None).reports)
    (row,) = board["cube"]
    assert row["file"] == str(tmp_path / "b" / "s0.json") and row["superseded"] == [str(tmp_path / "a" / "s0.json")]


@requires_corpus
def test_the_leaderboard_variant_is_one_of_the_coco_boards(corpus_reports):
    variant = next(r.submission.dataset_variant for r in corpus_reports
                   if r.submission is not None and r.submission.is_rf100vl)
    with pytest.raises(UsageError, match="is not a dataset variant of these files") as err:
        aggregate(corpus_reports, leaderboard_variant=variant)
    assert variant not in str(err.value).split("use one of")[1]


@requires_corpus
def test_the_size_order_table_names_provider_and_precision_whole(corpus_reports):
    """Grouped by hardware (its id heads the group, whole); runtime (format/provider), precision, input and batch
    sizes in their own columns, none cut, within 80 columns."""
    from rich.console import Console

    from harness.views.leaderboard import size_order_table

    board = aggregate(corpus_reports, size_ranks=size_ranks())
    console = Console(width=80, record=True, file=io.StringIO())
    console.print(size_order_table(board))
    lines = console.export_text().splitlines()
    assert max(len(line) for line in lines) <= 80
    for f in board["size_order"]:
        assert f["hardware"] in lines
        assert any(line.startswith(f"{f['format']}/{f['provider']}") and f" {f['precision']} " in line
                   and f["smaller"]["model"] in line and f["larger"]["model"] in line for line in lines), f


# --- rules that refuse a bad file and keep a good one (each against a hand-made case) ----------------------------


def _rules(report, severity="error"):
    return sorted({(f.rule, f.path) for f in report.findings if f.severity == severity})


def test_a_zero_latency_an_accuracy_in_percent_and_a_zero_batch_sample_are_no_measurements(tmp_path, base_doc):
    total = base_doc["timing"]["total_ms"]
    docs = [_variant(base_doc, timing__total_ms={**total, "p50": 0.0}),
            _variant(base_doc, accuracy__mAP_50_95=44.27, accuracy__mAP_50=62.99),  # percent, not a fraction
            _variant(base_doc, timing__batch_samples_ms=[20.1, 0.0, 19.8])]
    zero_p50, percent, zero_sample = _write(tmp_path / "unmeasured", docs)
    assert ("degenerate", "timing.total_ms.p50") in _rules(zero_p50)
    assert {("degenerate", "accuracy.mAP_50_95"), ("degenerate", "accuracy.mAP_50")} <= set(_rules(percent))
    assert ("timing", "timing.batch_samples_ms") in _rules(zero_sample)
    (real,) = _write(tmp_path / "real", [_variant(base_doc, timing__batch_samples_ms=[20.1, 19.9, 19.8])])
    assert not [f for f in real.errors if f.rule == "timing" or f.path.startswith(("timing.total_ms", "accuracy"))]


def test_figures_given_twice_agree_to_rounding_and_no_further(tmp_path, base_doc):
    """fps = 1000 / per-image ms within 1 % (a rate 0.9 % off is rounding, 5 % off is another measurement);
    p50 <= p95 <= p99; the stage split within 2 % of the mean it splits (1 % over is rounding, 10 % is not)."""
    total = base_doc["timing"]["total_ms"]
    mean = total["mean"]
    ok = [_variant(base_doc, throughput__fps_mean=1000 / mean * 1.009),
          _variant(base_doc, timing__total_ms={**total, "inference_ms": total["inference_ms"] + 0.01 * mean})]
    bad = [_variant(base_doc, throughput__fps_mean=1000 / mean * 1.05),
           _variant(base_doc, timing__total_ms={**total, "p99": total["p95"] - 1.0}),  # p95 above p99
           _variant(base_doc, timing__total_ms={**total, "inference_ms": total["inference_ms"] + 0.1 * mean})]
    reports = _write(tmp_path / "twice", ok + bad)
    found = [[f.path for f in r.errors if f.rule == "inconsistent"] for r in reports]
    assert found == [[], [], ["throughput.fps_mean"], ["timing.total_ms"], ["timing.total_ms"]]
    order, split = (next(f.message for f in r.errors if f.rule == "inconsistent") for r in reports[3:])
    assert order.startswith("percentiles out of order") and "more than the mean" in split


def test_a_dataset_variant_s_image_count_and_image_set_agree(tmp_path, base_doc):
    """mini500 is 500 images and COCO val2017 5000: a file that says otherwise (a declared variant, or the image
    set's fingerprint) is refused, as is an eval.numImages that disagrees with dataset.num_images."""
    from harness.data.variants import KNOWN_FINGERPRINTS

    def counted(doc, n, **dataset):
        doc = _variant(doc, dataset__num_images=n, eval__numImages=n, timing__num_images=n)
        doc["dataset"].update(dataset)
        return doc
    docs = [counted(base_doc, 400, variant="mini500"), counted(base_doc, 4999, variant="full"),
            counted(base_doc, 400, image_id_sha256=KNOWN_FINGERPRINTS["mini500"][1]),  # the mini500 ids, 400 of them
            _variant(base_doc, eval__numImages=5000),
            counted(base_doc, 500, variant="mini500", image_id_sha256=KNOWN_FINGERPRINTS["mini500"][1])]
    reports = _write(tmp_path / "counts", docs)
    found = [[f.message for f in r.errors if f.rule == "dataset_fingerprint"] for r in reports]
    assert found == [["variant mini500 has 500 images, file says 400"],
                     ["variant full has 5000 images, file says 4999"],
                     ["image ids are the mini500 set but num_images is 400"],
                     ["eval.numImages 5000 disagrees with dataset.num_images 500"], []]


def test_an_int8_row_publishes_only_with_a_passing_fp32_comparison(tmp_path, base_doc):
    """MLPerf's rule: int8 keeps >= 99 % of the fp32 mAP. A verdict that does not say it passed (kept 0.984, passed
    unset) is a failing row; a missing comparison is a warning; a passing one is clean."""
    int8 = _variant(base_doc, runtime__precision="int8")
    m = base_doc["accuracy"]["mAP_50_95"]
    verdicts = [{"mAP_50_95": m / 0.984, "int8_mAP_50_95": m, "kept": 0.984, "passed": None},
                {"mAP_50_95": m / 0.984, "int8_mAP_50_95": m, "kept": 0.984, "passed": False},
                {"mAP_50_95": m / 0.995, "int8_mAP_50_95": m, "kept": 0.995, "passed": True}, None]
    docs = [_variant(int8, eval__int8_vs_fp32=v) if v else int8 for v in verdicts]
    reports = _write(tmp_path / "int8", docs)
    found = [[f.severity for f in r.findings if f.rule == "int8-accuracy"] for r in reports]
    assert found == [["error"], ["error"], [], ["warning"]]


def test_invisible_format_characters_in_a_name_are_found(tmp_path, base_doc):
    """Unicode format characters (category Cf: a right-to-left override, a zero-width space) reorder or hide text
    as control characters do: an error in a coordinate, a warning in a description."""
    doc = _variant(base_doc, model__id="yolox\u202e-s", model__name="yolox\u200b-s")
    (report,) = _write(tmp_path / "cf", [doc])
    found = {(f.path, f.severity) for f in report.findings if f.rule == "identifier"}
    assert found == {("model.id", "error"), ("model.name", "warning")}


def test_a_detection_with_a_negative_height_or_a_boolean_id_is_unusable(tmp_path):
    from harness.results.validate import detections_findings

    good = {"image_id": 139, "category_id": 1, "bbox": [1.0, 2.0, 30.5, 40.0], "score": 0.9}
    for bad, problem in (({**good, "bbox": [1.0, 2.0, 30.5, -4.0]}, "negative width or height"),
                         ({**good, "image_id": True}, "image_id True is not an integer"),
                         ({**good, "category_id": False}, "category_id False is not an integer")):
        path = tmp_path / "d.json"
        path.write_text(json.dumps([good, bad]))
        (finding,) = detections_findings(path)
        assert finding.severity == "error" and "1 of 2 detections are unusable" in finding.message
        assert problem in finding.message, finding.message
    path.write_text(json.dumps([good, {**good, "bbox": [0.0, 0.0, 0.0, 0.0]}]))  # a zero-size box is a box
    assert detections_findings(path) == []


def test_an_rf100vl_row_that_claims_validity_under_another_protocol_is_refused(tmp_path):
    if not SUBMISSIONS.is_dir():
        pytest.skip(f"vision-analysis corpus not found at {CORPUS}")
    doc = json.loads(next(SUBMISSIONS.glob("yolov9t__*rtx_5060_ti__*.json")).read_text())
    assert doc["rf100vl"]["valid_submission"] is True
    doc["rf100vl"]["protocol"]["nms_iou"] = 0.7
    claimed = copy.deepcopy(doc)
    doc["rf100vl"]["valid_submission"] = False
    reports = _write(tmp_path / "rf", [claimed, doc])
    found = [[f.severity for f in r.findings if f.path == "rf100vl.protocol.nms_iou"] for r in reports]
    assert found == [["error"], ["warning"]]


def test_two_files_with_one_submission_id_are_refused_and_kept_out(tmp_path, base_doc):
    folder = tmp_path / "dup"
    folder.mkdir()
    for name, hw in (("a.json", "box_a"), ("b.json", "box_b")):
        (folder / name).write_text(json.dumps(_variant(base_doc, hardware__id=hw)))  # one id, two machines
    reports = validate_paths([folder], None).reports
    # which of the two is meant is not the files' names to say: both are errors, each naming the other
    assert [[f.message for f in r.errors if f.rule == "site.unique_id"] for r in reports] == [
        [f"duplicate submission_id {base_doc['submission_id']} (also in {other}): give each submission its own id"]
        for other in ("b.json", "a.json")]
    assert aggregate(reports)["cube"] == []
    # a file refused already claims no id: the one good file keeps it
    broken = _variant(base_doc, hardware__id="box_a")
    del broken["accuracy"]
    (folder / "a.json").write_text(json.dumps(broken))
    reports = validate_paths([folder], None).reports
    assert [any(f.rule.startswith(("schema", "site.")) for f in r.errors) for r in reports] == [True, False]
    assert not [f for r in reports for f in r.findings if f.rule == "site.unique_id"]
    assert [r["hardware"] for r in aggregate(reports)["cube"]] == ["box_b"]
    # a copy of one submission (a publishing folder beside the run's) is one submission, a warning; and a file
    # whose hardware.id aggregate derives claims its id as any file aggregate takes
    (folder / "a.json").write_text((folder / "b.json").read_text())
    reports = validate_paths([folder], None).reports
    assert not [f for r in reports for f in r.errors if f.rule == "site.unique_id"]
    assert [[f.rule for f in r.findings if f.path == "submission_id"] for r in reports] == [[], ["duplicate-copy"]]
    assert len(aggregate(reports)["cube"]) == 1
    derived = _variant(base_doc, hardware__id="")
    derived["hardware"]["gpu"] = "Orin (nvgpu)"
    (folder / "a.json").write_text(json.dumps(derived))
    reports = validate_paths([folder], None).reports
    assert [[f.rule for f in r.errors if f.rule == "site.unique_id"] for r in reports] == [["site.unique_id"]] * 2


def test_one_file_reached_through_two_paths_is_read_once(tmp_path, base_doc):
    """A folder and a file in it, or one name twice: one submission, never its own duplicate submission_id (an error
    that kept it off the leaderboard); a note says it was read once."""
    folder = tmp_path / "runs"
    _write(folder, [base_doc])
    file = folder / "s0.json"
    for paths in ([folder, file], [file, file], [folder, tmp_path / "runs" / ".." / "runs"]):
        validation = validate_paths(paths, None)
        assert [r.path.name for r in validation.reports] == ["s0.json"], paths
        assert not [f for r in validation.reports for f in r.errors if f.rule == "site.unique_id"], paths
        assert "1 file(s) reached through more than one of the paths given: each read once" in validation.notes
        assert aggregate(validation.reports)["counts"]["included"] == 1


def test_site_rules_on_signs_types_and_the_support_matrix(tmp_path, base_doc):
    """The site's rules: a negative figure in a block it reads, a boolean or null where it reads a number, a
    runtime the support matrix does not allow (provider, precision), a model-library commit it does not pin."""
    if not SUPPORT.is_file():
        pytest.skip(f"vision-analysis corpus not found at {CORPUS}")
    support = json.loads(SUPPORT.read_text())
    total = base_doc["timing"]["total_ms"]
    docs = {"negative_std": _variant(base_doc, timing__total_ms={**total, "std": -0.5}),
            "negative_gflops": _variant(base_doc, model_stats__gflops=-13.46),
            "bool_batch": _variant(base_doc, config__batch_size=True),
            "null_p50": _variant(base_doc, timing__total_ms={**total, "p50": None}),
            "fp16_pytorch": _variant(base_doc, runtime__precision="fp16"),  # the matrix: pytorch is fp32 only
            "rocm": _variant(base_doc, runtime__provider="rocm"),
            "commit": _variant(base_doc, benchmark__libreyolo_commit="f" * 40),
            "unknown_commit": _variant(base_doc, benchmark__libreyolo_commit="unknown")}
    folder = tmp_path / "site"
    folder.mkdir()
    for name, doc in docs.items():
        doc["submission_id"] = name
        (folder / f"{name}.json").write_text(json.dumps(doc))
    reports = {r.path.stem: r for r in validate_paths([folder], support).reports}
    site = {name: {(f.rule, f.path) for f in r.errors if f.rule.startswith(("site.", "type"))}
            for name, r in reports.items()}
    assert ("site.non_negative", "timing.total_ms.std") in site["negative_std"]
    assert ("site.non_negative", "model_stats.gflops") in site["negative_gflops"]
    assert ("type.number", "config.batch_size") in site["bool_batch"]
    assert ("type.number", "timing.total_ms.p50") in site["null_p50"]
    assert site["fp16_pytorch"] == {("site.support_matrix", "runtime.precision")}
    assert site["rocm"] == {("site.support_matrix", "runtime.provider")}
    assert site["commit"] == {("site.support_matrix", "benchmark.libreyolo_commit")}
    assert site["unknown_commit"] == set()
    board = aggregate(list(reports.values()))
    assert [Path(r["file"]).stem for r in board["cube"]] == ["unknown_commit"]


def test_ap_read_at_fewer_detections_than_coco_s_100_is_another_protocol(tmp_path, base_doc):
    (report,) = _write(tmp_path / "cap50", [_variant(base_doc, eval__maxDets=[1, 10, 50])])
    (finding,) = [f for f in report.findings if f.rule == "nonstandard-protocol"]
    assert "eval.maxDets [1, 10, 50]" in finding.message and finding.severity == "warning"


def test_the_agreement_gate_flags_drift_either_way_beyond_the_tolerance(tmp_path, base_doc):
    """Canonical 0.450 on the reference a100; the same accuracy identity elsewhere at 0.455 (+0.5 points) and at
    0.448 (-0.2 points): only the first is past 0.3 points; at a tolerance of 0.6 neither is."""
    docs = [_full_val(base_doc, 0.450), _full_val(base_doc, 0.455, hardware="nvidia_geforce_rtx_5070_ti"),
            _full_val(base_doc, 0.448, hardware="jetson_orin")]
    reports = _write(tmp_path / "gate", docs)
    (g,) = aggregate(reports)["agreement_gate"]
    assert (g["canonical_hardware"], g["other_hardware"]) == ("a100", "nvidia_geforce_rtx_5070_ti")
    assert g["delta_points"] == pytest.approx(0.5)
    assert aggregate(reports, tolerance_points=0.6)["agreement_gate"] == []


def test_size_order_compares_one_dataset_variant_and_distinct_sizes_only(tmp_path, base_doc):
    """yolox-m 20 % faster than yolox-s, but timed on another image set: no finding; two ids of one size (an alias)
    are not a smaller and a larger model."""
    m_elsewhere = _variant(_timed(base_doc, 0.8), model__id="yolox-m", model__variant="m", dataset__variant="sample")
    board = aggregate(_write(tmp_path / "variants", [base_doc, m_elsewhere]), size_ranks=size_ranks())
    assert board["size_order"] == []
    alias = _variant(_timed(base_doc, 0.8), model__id="yolox-s-alias")
    ranks = {"yolox-s": ("yolox", 2), "yolox-s-alias": ("yolox", 2)}
    assert aggregate(_write(tmp_path / "alias", [base_doc, alias]), size_ranks=ranks)["size_order"] == []


def test_the_newest_run_wins_whatever_its_file_name_or_time_zone(tmp_path, base_doc):
    """s0 at 02:00 UTC is newer than s1 stamped 10:00+09:00 (01:00 UTC): s0 wins, s1 is superseded."""
    new = _timed(base_doc, 1.0)
    new["created_at"] = "2026-01-01T02:00:00Z"
    old = _timed(base_doc, 2.0)
    old["created_at"] = "2026-01-01T10:00:00+09:00"
    board = aggregate(_write(tmp_path / "zones", [new, old]))
    (row,) = board["cube"]
    assert Path(row["file"]).name == "s0.json" and row["superseded"] == [str(tmp_path / "zones" / "s1.json")]


def test_a_memory_figure_of_zero_is_shown_as_unmeasured(tmp_path, base_doc):
    doc = copy.deepcopy(base_doc)
    doc["memory"] = {"peak_ram_mb": 0.0, "peak_vram_mb": 86.6}
    (row,) = aggregate(_write(tmp_path / "zero", [doc]))["cube"]
    assert (row["peak_ram_mb"], row["peak_vram_mb"]) == (None, 86.6)


def test_a_file_on_another_dataset_is_told_the_site_would_list_it_as_coco(tmp_path, base_doc):
    """The site puts every file that is not RF100-VL on its COCO board: a run on one's own data is refused for
    publication (kept for one's own comparisons); COCO val2017 and RF100-VL files are not."""
    other = _variant(base_doc, dataset__id="my-data", dataset__split="valid")
    reports = _write(tmp_path / "datasets", [base_doc, other])
    assert [[(f.path, f.severity) for f in r.findings if f.rule == "dataset"] for r in reports] == [
        [], [("dataset.id", "error")]]
    assert "on its COCO detection board" in reports[1].errors[0].message
    if SUBMISSIONS.is_dir():
        seg = json.loads(next(SUBMISSIONS.glob("rfdetr-seg-n__*.json")).read_text())
        (own,) = _write(tmp_path / "seg", [_variant(seg, dataset__id="my-data")])
        assert [f.message for f in own.errors if f.rule == "dataset"][0].count("COCO segmentation board") == 1
        rf = json.loads(next(SUBMISSIONS.glob("yolov9t__*rtx_5060_ti__*.json")).read_text())
        (rf_report,) = _write(tmp_path / "rf", [rf])
        assert not [f for f in rf_report.findings if f.rule == "dataset"]


def test_a_detections_file_is_checked_a_result_at_a_time_and_once_per_file(tmp_path, base_doc, monkeypatch):
    """validate reads a detections file one result at a time, with json's own strictness (a trailing comma is not
    JSON), and checks a file once however many names it has (the hard link of a cell whose detections were an
    earlier cell's)."""
    import os

    from harness.results import validate as validate_module

    run = _run_folder(tmp_path / "r", base_doc, DETS)
    second = copy.deepcopy(base_doc)
    second["submission_id"], second["artifacts"] = "b2", {"detections": "detections/m2.json"}
    second["config"]["batch_size"] = second["timing"]["batch_size"] = 2
    os.link(run / "detections" / "m.json", run / "detections" / "m2.json")
    (run / "submissions" / "s2.json").write_text(json.dumps(second))
    checked = []
    real = validate_module.detections_findings
    monkeypatch.setattr(validate_module, "detections_findings", lambda f: checked.append(f.name) or real(f))
    validation = validate_paths([run], None)
    assert len(validation.reports) == 2 and len(checked) == 1 and not _findings(validation.reports, "detections")
    (run / "detections" / "m.json").unlink()
    (run / "detections" / "m.json").write_text(json.dumps(DETS)[:-1] + ",]")
    ((_, finding), *_) = _findings(validate_paths([run], None).reports, "detections")
    assert finding.severity == "error" and "m.json is not valid JSON" in finding.message


def _dominated(point, others) -> bool:
    """Brute force: another point at least as fast and as accurate, and better in one."""
    latency, accuracy = point
    return any(ol <= latency and oa >= accuracy and (ol < latency or oa > accuracy) for ol, oa in others)


def test_speed_accuracy_fronts_are_the_undominated_rows_of_each_runtime():
    """Random latencies and accuracies on a coarse grid (ties in either figure and whole points repeated), two
    runtimes on one hardware: the front is exactly the rows no other row of their runtime dominates (brute force);
    a row without accuracy is off the comparison."""
    import random
    from dataclasses import replace

    from harness.results.aggregate import PerfRow, fronts, mark_speed_accuracy_fronts

    rng = random.Random(3)
    fields = {f: None for f in PerfRow.__dataclass_fields__ if f not in ("superseded", "flags")}
    rows = []
    for k in range(400):
        fields.update(model=f"m{k}", hardware="box", format=rng.choice(["onnx", "pytorch"]), provider="cpu",
                      precision="fp32", tf32="off", latency_ms_p50=float(rng.randint(1, 30)),
                      accuracy_shown=None if k % 37 == 0 else rng.randint(20, 50) / 100)
        rows.append(PerfRow(**fields))
    scored = [r for r in rows if r.accuracy_shown is not None and r.format == "onnx"]
    fastest = min(scored, key=lambda r: (r.latency_ms_p50, -r.accuracy_shown))  # always on the front
    rows.append(replace(fastest, model="the same point again"))  # neither dominates the other: both on it
    mark_speed_accuracy_fronts(rows)
    assert fastest.speed_accuracy_front and rows[-1].speed_accuracy_front
    for row in rows:
        if row.accuracy_shown is None:
            assert row.speed_accuracy_front is None
            continue
        others = [(o.latency_ms_p50, o.accuracy_shown) for o in rows
                  if o is not row and o.format == row.format and o.accuracy_shown is not None]
        assert row.speed_accuracy_front == (not _dominated((row.latency_ms_p50, row.accuracy_shown), others)), \
            row.model
    listed = fronts(rows)
    assert sorted(g["format"] for g in listed) == ["onnx", "pytorch"]
    assert sum(len(g["front"]) for g in listed) == sum(r.speed_accuracy_front is True for r in rows)
    assert all(g["front"] == sorted(g["front"], key=lambda f: f["latency_ms_p50"]) for g in listed)


def test_speed_accuracy_fronts_on_the_real_corpus(corpus_reports):
    """Every detection leaderboard row placed on or off its runtime's front agrees with a brute-force dominance check
    over the rows of its hardware, format, provider and precision."""
    board = aggregate(corpus_reports)
    rows = board["leaderboard"]
    placed = [r for r in rows if r["speed_accuracy_front"] is not None]
    assert len(placed) == sum(r["accuracy_shown"] is not None and r["latency_ms_p50"] is not None for r in rows)
    key = ("hardware", "format", "provider", "precision", "tf32")
    for row in placed:
        others = [(o["latency_ms_p50"], o["accuracy_shown"]) for o in placed
                  if o is not row and all(o[k] == row[k] for k in key)]
        assert row["speed_accuracy_front"] == (not _dominated((row["latency_ms_p50"], row["accuracy_shown"]),
                                                              others))
    on_front = sum(r["speed_accuracy_front"] for r in placed)
    assert 0 < on_front < len(placed)
    assert on_front == sum(len(g["front"]) for g in board["speed_accuracy_fronts"]["detection"])


def test_the_speed_accuracy_plot_draws_the_boards_fronts(corpus_reports, tmp_path, base_doc):
    """`aggregate --plot`: one panel per hardware id, each runtime's front line the board's own front (models,
    latencies, accuracies); a board with nothing to place is refused (exit 2) before any file is written."""
    from harness.report.plots import speed_accuracy

    board = aggregate(corpus_reports)
    plot = speed_accuracy(board)
    assert plot.png.startswith(b"\x89PNG")
    for group in board["speed_accuracy_fronts"]["detection"]:
        runtime = f"{group['format']}/{group['provider']} {group['precision']}" + \
            ("+tf32" if group["tf32"] == "on" else "")
        assert plot.data[group["hardware"]][runtime] == [(f["model"], f["latency_ms_p50"], f["accuracy_shown"])
                                                         for f in group["front"]]
    out = va_bench("aggregate", SUBMISSIONS, "--plot", tmp_path / "fronts.png", "-o", tmp_path / "board.json")
    assert out.returncode == 0 and (tmp_path / "fronts.png").read_bytes().startswith(b"\x89PNG")
    # the test's own files have no canonical full-val accuracy: nothing to place
    _write(tmp_path / "few", [base_doc])
    empty = va_bench("aggregate", tmp_path / "few", "--plot", tmp_path / "none.png", "-o", tmp_path / "none.json")
    assert empty.returncode == 2 and "--plot" in empty.stderr and "nothing to draw" in empty.stderr
    assert not (tmp_path / "none.png").exists() and not (tmp_path / "none.json").exists()
    # a name that says another format is refused, not written as a PNG under it
    svg = va_bench("aggregate", SUBMISSIONS, "--plot", tmp_path / "fronts.svg")
    assert svg.returncode == 2 and "the figure is a PNG" in svg.stderr and not (tmp_path / "fronts.svg").exists()


def test_a_repro_dataset_that_is_no_object_is_a_finding_not_a_crash(tmp_path, base_doc):
    doc = copy.deepcopy(base_doc)
    doc["repro"] = {"dataset": "coco2017-val"}
    reports = _write(tmp_path / "odd", [doc, base_doc])
    assert reports[0].errors and not _errors(reports[1], "class-map")
    assert aggregate(reports)["counts"]["included"] == 1


def test_a_support_matrix_that_is_no_file_is_named_for_what_it_is(tmp_path):
    """--support-matrix given a folder, a missing path or a non-matrix: one line saying which, and the fix."""
    from harness.results.validate import load_support_matrix

    for given, said in ((tmp_path, "is a folder"), (tmp_path / "gone.json", "no such file")):
        with pytest.raises(UsageError, match=f"--support-matrix {given}: {said}.*give the site's support-matrix"):
            load_support_matrix(given)
    (tmp_path / "other.json").write_text('{"models": []}')
    with pytest.raises(UsageError, match="not a support matrix"):
        load_support_matrix(tmp_path / "other.json")


def test_a_run_folder_whose_cells_did_not_finish_is_named_as_one(tmp_path):
    """validate and aggregate asked whether it was a run folder at all."""
    run = tmp_path / "runs" / "r1"
    run.mkdir(parents=True)
    (run / "run.json").write_text(json.dumps({"run_id": "r1", "cells": [{"cell": "m b1", "status": "running"}]}))
    for command in ("validate", "aggregate"):
        done = run_in_process(command, str(run))
        assert done.returncode == 2 and f"{run} is a run folder without a finished cell (see its run.json); " \
            f"finish it with va-bench run --resume r1 --output-dir {tmp_path / 'runs'}" in done.stderr, done.stderr
    (run / "run.json").write_text(json.dumps({"run_id": "r1", "cells": [{"cell": "m b1", "status": "failed"}]}))
    assert run_in_process("validate", str(run)).stderr.strip().endswith(f"--output-dir {tmp_path / 'runs'} "
                                                                         "--retry-failed")


def test_an_rf100vl_row_of_other_datasets_is_no_valid_row(tmp_path):
    """100 datasets of anything made a "valid" RF100-VL row: the site's valid rows are of RF100-VL's own 100 (their
    names the site's rows list; harness/data/rf100vl_datasets.json is checked against both rows here)."""
    from harness.results.campaign import rf100vl_names

    if not SUBMISSIONS.is_dir():
        pytest.skip(f"vision-analysis corpus not found at {CORPUS}")
    rows = [json.loads(p.read_text()) for p in sorted(SUBMISSIONS.glob("*.json"))]
    rows = [d for d in rows if "rf100vl" in d]
    assert rows and all({x["dataset"] for x in d["rf100vl"]["datasets"]} == rf100vl_names() for d in rows)
    doc = copy.deepcopy(rows[0])
    for k, entry in enumerate(doc["rf100vl"]["datasets"][:2]):
        entry["dataset"] = f"my-dataset-{k}"
    (report,) = _write(tmp_path / "other", [doc])
    (finding,) = [f for f in report.errors if f.path == "rf100vl.valid_submission"]
    assert "2 of its datasets are not RF100-VL's (my-dataset-0, my-dataset-1)" in finding.message
    (clean,) = _write(tmp_path / "own", [rows[0]])
    assert not [f for f in clean.errors if f.path == "rf100vl.valid_submission"]


def test_an_rf100vl_row_is_checked_for_repeated_datasets_its_count_and_its_flags_type(tmp_path):
    """A dataset listed twice (another of the 100 missing), a num_datasets that is not the list's length, and a
    valid_submission that is not a boolean were all accepted, and aggregate listed the first as a valid row."""
    if not SUBMISSIONS.is_dir():
        pytest.skip(f"vision-analysis corpus not found at {CORPUS}")
    doc = json.loads(next(SUBMISSIONS.glob("yolov9t__*rtx_5060_ti__*.json")).read_text())
    doc["memory"]["peak_ram_mb"] = None  # the corpus row's own error (a 0): the row is otherwise clean
    repeated, counted, flagged = (copy.deepcopy(doc) for _ in range(3))
    repeated["rf100vl"]["datasets"][1]["dataset"] = first = doc["rf100vl"]["datasets"][0]["dataset"]
    counted["dataset"]["num_datasets"] = 90
    flagged["rf100vl"]["valid_submission"] = "yes"
    # a partial row as the site's harness writes it: its num_datasets the scored ones, the skipped listed apart
    partial = copy.deepcopy(doc)
    skipped = [partial["rf100vl"]["datasets"].pop()["dataset"] for _ in range(3)]
    partial["rf100vl"].update(skipped_datasets=skipped, valid_submission=False)
    partial["dataset"].update(num_datasets=97, num_datasets_selected=100)
    for key in ("mAP_50_95", "mAP_50", "mAP_75", "AR100", "AR_max_det"):
        values = [d[key] for d in partial["rf100vl"]["datasets"]]
        if key in partial["accuracy"]:
            partial["accuracy"][key] = sum(values) / len(values)
    (partial_report,) = _write(tmp_path / "partial", [partial])
    assert [(f.path, f.message) for f in partial_report.errors] == []
    reports = _write(tmp_path / "rf", [doc, repeated, counted, flagged])
    found = [[(f.path, f.message) for f in r.errors] for r in reports]
    assert found[0] == []
    assert found[1] == [("rf100vl.datasets", f"listed more than once: {first} (each dataset counts once in the "
                                             "row's mean)")]
    assert found[2] == [("dataset.num_datasets", "dataset.num_datasets 90 disagrees with the 100 datasets listed in "
                                                 "rf100vl.datasets")]
    assert found[3] == [("rf100vl.valid_submission", "rf100vl.valid_submission must be true or false, got str "
                                                     "'yes'")]
    board = aggregate(reports)
    assert [r["file"] for r in board["rf100vl"]] == [str(reports[0].path)]


def test_a_segmentation_rows_box_figures_and_its_task_are_checked(tmp_path):
    """The bbox_* keys escaped the checks the mask keys get (a string, below mAP_50_95), and model.task was never
    read: a task the site has no board for, or mask figures under the detection task, went to the detection board."""
    if not SUBMISSIONS.is_dir():
        pytest.skip(f"vision-analysis corpus not found at {CORPUS}")
    seg = json.loads(next(SUBMISSIONS.glob("rfdetr-seg-n__*.json")).read_text())
    a = seg["accuracy"]
    docs = [seg, _variant(seg, accuracy__bbox_mAP_50="0.68"), _variant(seg, accuracy__bbox_mAP_50=0.1),
            _variant(seg, accuracy__bbox_mAP_50_95=None), _variant(seg, model__task="keypoints"),
            _variant(seg, model__task="detect"), _variant(seg, model__task=None)]
    reports = _write(tmp_path / "seg", docs)
    errors = [[(f.rule, f.path) for f in r.errors] for r in reports]
    assert errors[0] == [] and not [f for f in reports[0].findings if f.rule == "task"]
    assert errors[1] == [("type.number", "accuracy.bbox_mAP_50")]
    assert errors[2] == [("inconsistent", "accuracy.bbox_mAP_50")]
    assert "bbox_mAP_50 0.1 is below bbox_mAP_50_95 " + f"{a['bbox_mAP_50_95']:g}" in reports[2].errors[0].message
    assert errors[3] == [("type.number", "accuracy.bbox_mAP_50_95")]
    assert errors[4] == [("task", "model.task")] and "'keypoints' is not a task" in reports[4].errors[0].message
    assert errors[5] == errors[6] == [("task", "model.task")]
    assert "model.task is missing but the row's figures are of masks (accuracy.bbox_mAP_50_95)" in \
        reports[6].errors[0].message
    assert [r["file"] for r in aggregate(reports)["cube"]] == [str(reports[0].path)]
    # a segmentation model run with --no-masks: a detection row, its config saying why it has no masks
    no_masks = copy.deepcopy(seg)
    no_masks["model"]["task"] = "detect"
    no_masks["accuracy"] = {k: v for k, v in a.items() if not k.startswith("bbox_")}
    no_masks["config"]["masks"] = "off (--no-masks): boxes only"
    (report,) = _write(tmp_path / "no-masks", [no_masks])
    assert not [f for f in report.findings if f.rule == "task"]
    no_masks["config"]["masks"] = {"maps": "prototypes"}  # a mask spec: masks were made
    (report,) = _write(tmp_path / "masks-spec", [no_masks])
    assert [(f.rule, f.severity) for f in report.findings if f.rule == "task"] == [("task", "error")]
    boxless = copy.deepcopy(seg)
    boxless["accuracy"] = {k: v for k, v in a.items() if not k.startswith("bbox_")}
    (report,) = _write(tmp_path / "boxless", [boxless])
    assert [(f.rule, f.severity) for f in report.findings if f.rule == "task"] == [("task", "warning")]


def test_two_datasets_of_one_folder_name_stay_two_rows(tmp_path, base_doc):
    """A user's dataset is named by its folder: two runs on different ground truth in folders of one name were one
    row, the later replacing the earlier. Their annotations' fingerprints keep them apart; the same dataset run twice
    is still one row, latest wins."""
    docs = []
    for sha, when in (("a" * 64, "2026-11-01T00:00:00Z"), ("b" * 64, "2026-11-02T00:00:00Z"),
                      ("a" * 64, "2026-11-03T00:00:00Z")):
        doc = _variant(base_doc, dataset__id="mydata")
        doc["created_at"] = when
        doc["repro"] = {"dataset": {"annotations_sha256": sha}}
        docs.append(doc)
    board = aggregate(_write(tmp_path / "own", docs))
    rows = sorted((r["dataset"], len(r["superseded"])) for r in board["cube"])
    assert rows == [(f"mydata/{base_doc['dataset'].get('split') or 'val2017'}@{'a' * 12}", 1),
                    (f"mydata/{base_doc['dataset'].get('split') or 'val2017'}@{'b' * 12}", 0)]


def test_validate_says_when_the_sites_allow_lists_were_not_checked(tmp_path, base_doc):
    """Without --support-matrix a pytorch bf16 row (the site allows fp32 only there) got "0 errors, 0 warnings",
    and aggregate put it on the board: the run of the check said nothing of what it left out."""
    from harness.results.validate import is_site_rule
    from harness.views.commands import validation_json

    bf16 = _variant(base_doc, runtime__format="pytorch", runtime__precision="bf16")
    _write(tmp_path / "bf16", [bf16])
    plain = validate_paths([tmp_path / "bf16"], None)
    assert any("allow-lists of models and runtimes were not checked" in n for n in plain.notes)
    assert not any(is_site_rule(f) for f in plain.reports[0].errors)
    checked = validate_paths([tmp_path / "bf16"], json.loads(SUPPORT.read_text()))
    assert any(is_site_rule(f) for f in checked.reports[0].errors)
    assert not any("allow-lists" in n for n in checked.notes)
    summary = validation_json(checked)
    assert summary["warnings"] == sum(f.severity == "warning" for f in checked.reports[0].findings)
