"""The operator benchmark times softmax and the operators in alternating rounds and keeps medians, so
that a slow spell of a shared machine lands on every operator of a round, not on one operator."""

import pytest

import linvit.benchmark as benchmark


def test_operators_are_timed_in_alternating_rounds_and_keep_their_median(monkeypatch):
    calls = []
    real_time = benchmark._time

    def recorded(step, sync, min_seconds):
        real_time(step, sync, 0.0)  # the real pass still runs
        calls.append(step)
        # a machine slowed during the second round: every operator of that round is slow
        return 100.0 if len(calls) in (3, 4) else float(len(calls))

    monkeypatch.setattr(benchmark, "_time", recorded)
    df = benchmark.run_benchmark(["elu"], tokens=(16,), repeats=3, min_seconds=0.0)
    # rounds (softmax, elu) x 3, each round timing every operator once, in order
    assert len(calls) == 6 and len(set(calls)) == 2
    assert calls[0::2] == [calls[0]] * 3 and calls[1::2] == [calls[1]] * 3
    seconds = df.set_index("variant").seconds
    # medians over rounds: softmax of (1, 100, 5), elu of (2, 100, 6); the slow round drops out
    assert seconds["softmax"] == 5.0 and seconds["elu"] == 6.0
    assert df.set_index("variant").speedup_vs_softmax["elu"] == pytest.approx(5 / 6)
    # the spread of that run: fastest and slowest rounds, and the per-round (paired) speedups
    row = df.set_index("variant").loc["elu"]
    assert (row.rounds, row.seconds_low, row.seconds_high) == (3, 2.0, 100.0)
    assert row.speedup_low == pytest.approx(1 / 2) and row.speedup_high == pytest.approx(1.0)
    assert "round_seconds" not in df


def test_rounds_below_one_are_refused_before_any_timing(monkeypatch):
    monkeypatch.setattr(benchmark, "_stepper", lambda *a, **k: pytest.fail("timed"))
    with pytest.raises(ValueError, match=r"^--rounds must be 1 or more, got 0$"):
        benchmark.run_benchmark(["elu"], tokens=(16,), repeats=0)
