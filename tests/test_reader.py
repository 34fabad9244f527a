"""One reader of results: report, compare and aggregate agree on which file stands for a cell."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from conftest import CORPUS

from harness.results.aggregate import aggregate
from harness.results.compare import compare_sides, load_side
from harness.results.reader import CellIdentity, latest_wins, load_run
from harness.results.validate import validate_paths

SUBMISSIONS = CORPUS / "submissions"


@pytest.fixture
def site_doc():
    if not SUBMISSIONS.is_dir():
        pytest.skip(f"vision-analysis corpus not found at {CORPUS}")
    doc = json.loads(next(SUBMISSIONS.glob("yolox-s__pytorch__cuda__nvidia_geforce_rtx_5070_ti__*.json")).read_text())
    doc.setdefault("runtime", {})["backend"] = "pytorch"
    return doc


def _run_folder(root, docs):
    (root / "submissions").mkdir(parents=True)
    for i, doc in enumerate(docs):
        doc = copy.deepcopy(doc)
        doc["submission_id"] = f"reader-{i}"
        (root / "submissions" / f"s{i}.json").write_text(json.dumps(doc))
    (root / "run.json").write_text(json.dumps({"run_id": root.name, "config": {}, "cells": []}))
    return root


def test_latest_wins_compares_times_not_their_text(tmp_path, site_doc):
    """"10:00:00Z" sorts after "10:00:00.250000Z" as text ('Z' > '.'), yet is the earlier time: report, compare and
    aggregate all keep the file written a quarter of a second later."""
    early, late = copy.deepcopy(site_doc), copy.deepcopy(site_doc)
    early["created_at"], late["created_at"] = "2026-11-20T10:00:00Z", "2026-11-20T10:00:00.250000Z"
    early["memory"]["peak_ram_mb"], late["memory"]["peak_ram_mb"] = 111.0, 222.0  # tells the two apart
    run = _run_folder(tmp_path / "r", [late, early])  # the later one first: file order must not decide

    report_cells = load_run(run).cells
    assert [c.doc["memory"]["peak_ram_mb"] for c in report_cells] == [222.0]
    compared = load_side(run)
    assert [e.doc["memory"]["peak_ram_mb"] for e in compared.entries] == [222.0] and compared.superseded == 1
    board = aggregate(validate_paths([run], None).reports)
    kept = [r for r in board["cube"] if Path(r["file"]).name.startswith("s")]
    assert [r["peak_ram_mb"] for r in kept] == [222.0]


def test_two_backends_with_one_format_stay_two_cells(tmp_path, site_doc):
    """ONNX Runtime's TensorRT provider and a native engine both say format tensorrt / provider cuda: the report
    keeps both cells; compare pairs one and says which it left out, never silently."""
    ort, native = copy.deepcopy(site_doc), copy.deepcopy(site_doc)
    for doc, backend in ((ort, "onnxruntime"), (native, "tensorrt")):
        doc["runtime"].update(backend=backend, format="tensorrt", provider="cuda")
    run = _run_folder(tmp_path / "r", [ort, native])
    assert sorted(c.key.backend for c in load_run(run).cells) == ["onnxruntime", "tensorrt"]
    side = load_side(run)
    assert len(side.entries) == 1 and len(side.clashes) == 1
    comparison = compare_sides(side, load_side(run))
    assert any("not compared" in note for note in comparison.notes)


def test_latest_wins_orders_undated_first_and_breaks_ties_by_name():
    items = [("b", None), ("a", "2026-01-01T00:00:00Z"), ("c", "2026-01-01T00:00:00Z")]
    from datetime import datetime

    def when(item):
        return datetime.fromisoformat(item[1].replace("Z", "+00:00")) if item[1] else None

    winners, losers = latest_wins(items, key=lambda i: 0, when=when, name=lambda i: i[0])
    assert winners == [("c", "2026-01-01T00:00:00Z")] and [old[0] for old, _ in losers] == ["b", "a"]


def test_identity_tells_apart_everything_a_cell_is_measured_by(site_doc):
    base = CellIdentity.of_doc(site_doc)
    for path, value in (("config.conf", 0.25), ("hardware.id", "other-box"), ("runtime.backend", "onnxruntime"),
                        ("config.batch_size", 64), ("runtime.precision", "fp16")):
        doc = copy.deepcopy(site_doc)
        block, key = path.split(".")
        doc[block][key] = value
        assert CellIdentity.of_doc(doc) != base, path
