"""The end-of-run summary reads right: an int8 row that fails its accuracy rule is marked and warned about,
an overlapped group says what its latencies are, and a group without mAP says why."""

from __future__ import annotations

from types import SimpleNamespace

from rich.console import Console

from harness.views.tables import group_table, int8_failing, run_warnings


def _record(label, mode="latency", m=0.3034, reference=None, reason=None):
    stat = SimpleNamespace(mean=10.0, p50=10.0, p95=12.0)
    accuracy = None if m is None else SimpleNamespace(stats={"mAP_50_95": m}, reference=reference)
    return SimpleNamespace(
        cell=SimpleNamespace(label=label, batch_size=1),
        timing=SimpleNamespace(images_per_s=100.0, batch_ms=stat, stages_ms={"forward": stat}, mode=mode, warnings=[]),
        accuracy=accuracy, accuracy_reason=reason, invariance=None, memory={}, energy={}, runtime={})


def _caption(records) -> str:
    statuses = [SimpleNamespace(cell=r.cell, state="ok") for r in records]
    key = SimpleNamespace(model="m", backend="openvino", precision="int8", label="m openvino int8 416")
    console = Console(width=200, record=True)
    console.print(group_table(key, statuses, {r.cell.label: r for r in records}))
    return " ".join(console.export_text().split())  # the caption wraps at the table's width


def test_a_failing_int8_row_is_marked_and_warned_about():
    failing = {"failing": "int8 keeps 97.0 % of the fp32 mAP (0.3034 vs 0.3128); below 99 %: this row is marked "
                          "failing", "passed": False}
    bad, good = _record("int8 b1", reference=failing), _record("int8 b2", reference={"passed": True})
    assert int8_failing(bad) and not int8_failing(good)
    assert run_warnings([bad, good]) == [f"int8 b1: {failing['failing']}"]
    text = _caption([bad, good])
    assert "0.3034!" in text and "mAP!: int8 keeps < 99 % of fp32's mAP (failing)" in text


def test_overlapped_latency_and_a_missing_map_are_explained():
    text = _caption([_record("b1", mode="overlapped", m=None, reason="random weights: a timing-only run")])
    assert "overlapped: p50/p95 ms per batch from its start to its result, queueing included" in text
    assert "mAP -: random weights: a timing-only run" in text


def test_the_split_adds_up_with_the_transfer_in_the_forward():
    from harness.views.tables import stage_split

    record = _record("b1")
    ms = lambda v: SimpleNamespace(mean=v)  # noqa: E731
    record.timing.batch_ms = SimpleNamespace(mean=10.0)
    record.timing.stages_ms = {"preprocess": ms(1.0), "transfer": ms(2.0), "forward": ms(5.0), "postprocess": ms(2.0)}
    assert stage_split(record) == "10/70/20"


def test_an_overlapped_streams_fill_is_no_variation():
    """A steady stream (one worker: the first batch has no queue ahead of it) is not warned of; a stream that
    does vary still is."""
    from harness.run.executor import stream_warnings

    steady = [58.98, 102.06, 101.05, 100.95, 101.2, 100.8, 101.4, 100.9, 101.1, 102.24]  # a real one: CV 13.8 % whole
    assert stream_warnings(steady, depth=2) == []
    varying = steady[:2] + [60.0, 140.0] * 4
    assert any(w.startswith("high variation") for w in stream_warnings(varying, depth=2))
    assert stream_warnings(steady[:3], depth=2)[0].startswith("only 3 samples")


def test_the_sites_split_of_total_ms_by_hand():
    """timing.total_ms's split per image, batch 4. Latency mode: each stage's mean / 4, the input's transfer counted
    in inference_ms. Overlapped mode (an 8 ms interval per image): inference as in latency mode (over the forwards
    in flight), the rest of the interval shared 3:1 as the measured pre- and post-processing times are."""
    from harness.results.submission import site_split

    def record(mode, interval=None, in_flight=None, **stages):
        timing = SimpleNamespace(mode=mode, image_ms=SimpleNamespace(mean=interval),
                                 stages_ms={k: SimpleNamespace(mean=v) for k, v in stages.items()})
        return SimpleNamespace(cell=SimpleNamespace(batch_size=4), runtime={"host": {"forwards_in_flight": in_flight}},
                               timing=timing)

    per_batch = {"preprocess": 12.0, "transfer": 4.0, "forward": 20.0, "postprocess": 4.0}
    assert site_split(record("latency", 10.0, **per_batch)) == {"preprocess_ms": 3.0, "inference_ms": 6.0,
                                                                "postprocess_ms": 1.0}
    assert site_split(record("overlapped", 8.0, **per_batch)) == {"preprocess_ms": 1.5, "inference_ms": 6.0,
                                                                  "postprocess_ms": 0.5}  # host: 8 - 6 = 2 ms
    assert site_split(record("overlapped", 8.0, in_flight=2, **per_batch)) == {
        "preprocess_ms": 3.75, "inference_ms": 3.0, "postprocess_ms": 1.25}  # host: 8 - 6 / 2 = 5 ms
    no_transfer = {k: v for k, v in per_batch.items() if k != "transfer"}
    assert site_split(record("latency", 9.0, **no_transfer))["inference_ms"] == 5.0
