"""The server scenario on a virtual clock, against an independent discrete-event simulation: a server with a
fixed service time (M/D/1 under Poisson arrivals) is served by the harness's scheduler and simulated here with
Lindley's recursion on the same seeded arrivals; the search for the highest rate holding a p99 bound lands
within 5 % of the rate this simulation finds. The real-time version is a bench figure (docs/benchmarks.md)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import COCO_DIR, requires_coco, requires_yolox, run_in_process

from harness.measure.server import VirtualClock, find_max_qps, poisson_arrivals, serve

SERVICE_S = 0.010  # a model whose every query takes 10 ms
QUERIES = 20_000


def _lindley_p99_ms(qps: float, queries: int = QUERIES, seed: int = 0) -> float:
    """Response times of a FIFO single server with a fixed service time: W(k+1) = max(0, W(k) + S - gap(k+1))."""
    gaps = np.random.default_rng(seed).exponential(1.0 / qps, queries)  # the same seeded Poisson process,
    gaps *= queries / qps / gaps.sum()  # given its count: the last query arrives at queries / qps
    wait, response = 0.0, np.empty(queries)
    for k in range(queries):
        if k:
            wait = max(0.0, wait + SERVICE_S - gaps[k])
        response[k] = wait + SERVICE_S
    return float(np.percentile(response, 99) * 1000)


def _harness_trial(qps: float, bound_ms: float, queries: int = QUERIES):
    clock = VirtualClock()
    return serve(poisson_arrivals(qps, queries), lambda i: clock.advance(SERVICE_S), clock, bound_ms, qps)


@pytest.mark.parametrize("qps", [20.0, 60.0, 90.0])
def test_p99_at_a_fixed_rate_equals_a_discrete_event_simulation(qps):
    result = _harness_trial(qps, bound_ms=50.0)
    assert result.latency_ms["p99"] == pytest.approx(_lindley_p99_ms(qps), abs=1e-3)  # rounded to 1e-4 ms
    assert result.latency_ms["p50"] >= SERVICE_S * 1000 - 1e-9  # every query is served for its 10 ms at least
    assert result.held == (result.latency_ms["p99"] <= 50.0)


def test_the_search_lands_within_5_percent_of_the_md1_rate_holding_the_bound():
    bound = 40.0  # 4 service times
    low, high = 10.0, 100.0
    for _ in range(40):  # the rate the independent simulation says holds the bound, to 1e-4 relative
        middle = (low + high) / 2
        low, high = (middle, high) if _lindley_p99_ms(middle, 5000) <= bound else (low, middle)
    truth = low
    found, trials = find_max_qps(lambda q: _harness_trial(q, bound, 5000), 5.0, 100.0)
    assert found == pytest.approx(truth, rel=0.05) and 0.3 < truth * SERVICE_S < 0.9  # a utilisation, not an edge
    assert all(t.held == (t.latency_ms["p99"] <= bound) for t in trials) and len(trials) <= 12


@pytest.mark.parametrize("queries", [100, 1000])
def test_the_load_offered_is_the_rate_asked_for(queries):
    # one seed's raw exponential gaps offered 0.85 of the rate at 100 queries: a held rate would be overstated
    arrivals = poisson_arrivals(10.0, queries)
    assert arrivals[-1] == pytest.approx(queries / 10.0, rel=1e-12) and np.all(np.diff(arrivals) > 0)
    gaps = np.diff(arrivals, prepend=0.0)
    assert 0.5 < gaps.std() / gaps.mean() < 1.5  # still exponential-like spacing (coefficient of variation ~1)


@pytest.mark.parametrize("queries", [10, 100])
def test_an_idle_server_achieves_the_rate_offered_not_more(queries):
    """Queries served at once (no service time) end when they arrive: N queries over the N / qps window."""
    clock = VirtualClock()
    result = serve(poisson_arrivals(20.0, queries), lambda i: None, clock, 50.0, 20.0)
    assert result.achieved_qps == pytest.approx(20.0, rel=1e-12)


def test_a_rate_no_trial_holds_is_said():
    found, trials = find_max_qps(lambda q: _harness_trial(q, 5.0, 200), 50.0, 100.0)  # the bound < one service
    assert found is None and trials[-1].qps == 50.0 and not any(t.held for t in trials)


@requires_coco
@requires_yolox
def test_the_server_scenario_runs_and_is_recorded(tmp_path):
    """A real run (tiny trials: the figures are a bench's): the block is in the submission under `server`, beside
    the site's fields, with every trial of the search."""
    result = run_in_process("run", "--scenario", "server", "--qps", "5", "--latency-bound", "1000", "--find-max-qps",
                            "--server-queries", "10", "--limit", "4", "--warmup-batches", "1", "--warmup-seconds",
                            "0", "--min-timed-batches", "2", "--no-energy", "--draw-images", "0", "--coco-dir",
                            str(COCO_DIR), "--output-dir", str(tmp_path), "--run-id", "server")
    assert result.returncode == 0, result.stderr
    assert "server at 5 qps" in result.stdout and "highest rate holding p99 <= 1000 ms" in result.stdout
    (path,) = list((tmp_path / "server" / "submissions").glob("*.json"))
    server = json.loads(path.read_text())["server"]
    assert server["at_qps"]["queries"] == 10 and server["at_qps"]["bound_held"] is True
    assert f"{server['at_qps']['achieved_qps']:.2f} qps achieved)" in result.stdout  # the rate met, beside the asked
    # the report has the trials (it had none: the page read as a latency run's)
    from harness.report.sections import server_table
    from harness.results.reader import load_run

    table = server_table(load_run(tmp_path / "server"))
    trials = [server["at_qps"], *server["search"]["trials"]]
    assert [r[3] for r in table.rows] == ["at --qps", *(f"search {n}" for n in range(1, len(trials)))]
    assert [(r[4], r[7]) for r in table.rows] == [(f"{t['qps']:.2f}", f"{t['latency_ms']['p99']:.1f}") for t in trials]
    log = tmp_path / "BENCHMARKS.md"
    assert run_in_process("report", str(tmp_path / "server"), "--log", str(log)).returncode == 0
    assert "<h2 id='server'>Server scenario</h2>" in (tmp_path / "server" / "report.html").read_text()
    logged = log.read_text()  # the benchmark log has the trials too (it had only the reproduce command's qps)
    assert "Server scenario (each trial's" in logged
    assert all(f"| {t['qps']:.2f} |" in logged for t in trials), logged
    assert server["search"]["trials"] and all(t["queries"] == 10 for t in server["search"]["trials"])
    samples = json.loads((tmp_path / "server" / server["samples"]).read_text())["trials"]
    trials = [server["at_qps"], *server["search"]["trials"]]
    assert [t["qps"] for t in samples] == [t["qps"] for t in trials]
    for t, kept in zip(trials, samples, strict=True):  # every figure checkable from the samples recorded
        latencies, queued = np.asarray(kept["latency_samples_ms"]), np.asarray(kept["queue_samples_ms"])
        assert len(latencies) == len(queued) == 10 and np.all(queued <= latencies)
        assert t["latency_ms"]["p99"] == pytest.approx(np.percentile(latencies, 99), abs=1e-3)
        assert t["latency_ms"]["mean"] == pytest.approx(latencies.mean(), abs=1e-3)
        assert t["queue_ms_p99"] == pytest.approx(np.percentile(queued, 99), abs=1e-3)
    # a bound below the fastest query: no rate can hold it, said without a search (it would take the longest trials)
    hopeless = run_in_process("run", "--scenario", "server", "--latency-bound", "0.01", "--find-max-qps",
                              "--server-queries", "10", "--limit", "4", "--warmup-batches", "1", "--warmup-seconds",
                              "0", "--min-timed-batches", "2", "--no-energy", "--draw-images", "0", "--coco-dir",
                              str(COCO_DIR), "--output-dir", str(tmp_path), "--run-id", "hopeless")
    assert hopeless.returncode == 0, hopeless.stderr
    (path,) = list((tmp_path / "hopeless" / "submissions").glob("*.json"))
    search = json.loads(path.read_text())["server"]["search"]
    assert search["trials"] == [] and "no rate can hold it" in search["why_none"]
    refused = run_in_process("run", "--scenario", "server", "--latency-bound", "50", "--batch-sizes", "4", "--qps", "9")
    assert refused.returncode == 2 and "--batch-sizes 1" in refused.stderr
