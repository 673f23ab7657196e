"""The sequential design is calibrated (linvit.claims.calibration_sequential): on simulated grids whose truth is
known (a teacher per seed, looks at 5, 10, 15, 20, 30 seeds), its repeated intervals cover the truth at the
stopping look at least 93% of the time and its verdicts are wrong no more often than each side's alpha, with
futility and without; naive rereading of the fixed-n test at the same looks is wrong far more often; the
t conversion of the boundaries, liberal as it was, is corrected; and the packaged table and docs are the
code's. The packaged table is checked as it is (its regeneration takes about 20 minutes); small fresh runs
check the code that made it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from linvit.claims.calibration import SCENARIOS
from linvit.claims.calibration_sequential import SEQUENTIAL_CSV, sequential_markdown, t_conversion_markdown
from linvit.claims.sequential_simulation import (ALPHA, DISTANCES, EXPERIMENTS, LOOKS, _jobs, at_threshold,
                                                 deciding_tests, distance_scenarios, images_part_table,
                                                 sequential_table, t_conversion_table)
from linvit.stats import sequential

DOCS = Path(__file__).parents[1] / "docs" / "statistics.md"


@pytest.fixture(scope="module")
def conversion() -> pd.DataFrame:
    return t_conversion_table()  # as the docs show it: 1,000,000 paths, about 3 s


@pytest.fixture(scope="module")
def packaged() -> pd.DataFrame:
    return pd.read_csv(SEQUENTIAL_CSV, keep_default_na=False, na_values=[""])


def consistent(rate: float, alpha: float, n: int) -> bool:
    """A measured rate consistent with a true one at most alpha (one-sided binomial test at 1%)."""
    return sps.binomtest(round(rate * n), n, alpha, alternative="greater").pvalue > 0.01


def test_the_packaged_table_covers_every_scenario_and_setting(packaged):
    assert (packaged["experiments"] == EXPERIMENTS).all() and EXPERIMENTS == 2000
    assert set(packaged["looks"]) == {"/".join(map(str, LOOKS))} == {"5/10/15/20/30"}
    assert set(packaged["spending"]) == {sequential.DEFAULT_PLAN["spending"]}
    assert set(packaged["scenario"]) == set(SCENARIOS) | {f"{d:+d} SE" for d in DISTANCES}
    assert set(packaged["futility"]) == {"0.1", "none"}
    names = {t.name for t in deciding_tests()} | {"C1", "C2", "C3"}
    assert all(set(g["statistic"]) == names for _, g in packaged.groupby(["scenario", "futility"]))


def test_repeated_intervals_cover_the_truth_at_the_stopping_look(packaged):
    tests = packaged.dropna(subset=["coverage"])
    assert len(tests) == 8 * 2 * 5
    low = tests[tests["coverage"] < 0.93]
    assert low.empty, low.to_string()


def test_verdicts_are_wrong_at_most_as_often_as_each_side_allows(packaged):
    """Per row, wrong holds against alpha (2.5%) and wrong fails against the row's fail alpha (1.25% for C1 and
    C2's tests, 2.5% for C3's and a claim's), each consistent with the target by a one-sided binomial test;
    pooled exactly at the thresholds (`at`, where a failure is wrong at its alpha by construction) too."""
    for _, row in packaged.iterrows():
        assert consistent(row["wrong_holds"], row["alpha_holds"], EXPERIMENTS), row.to_dict()
        assert consistent(row["wrong_fails"], row["alpha_fails"], EXPERIMENTS), row.to_dict()
    at = packaged[(packaged["scenario"] == "at") & packaged["coverage"].notna()]
    for alpha, g in at.groupby("alpha_fails"):
        assert consistent(g["wrong_fails"].mean(), alpha, EXPERIMENTS * len(g)), (alpha, g["wrong_fails"].mean())


def test_futility_never_adds_a_wrong_verdict(packaged):
    """On the same draws a non-binding futility stop only ends paths early undecided: wrong verdicts with it
    are a subset of those without it, row by row, and it saves seeds where the truth is near the threshold."""
    keyed = packaged.set_index(["scenario", "statistic", "futility"])
    with_, without = keyed.xs("0.1", level="futility"), keyed.xs("none", level="futility")
    assert (with_["wrong_holds"] <= without["wrong_holds"] + 1e-12).all()
    assert (with_["wrong_fails"] <= without["wrong_fails"] + 1e-12).all()
    assert (with_["mean_seeds"] <= without["mean_seeds"] + 1e-12).all()
    assert (with_.loc["at", "mean_seeds"] < 0.7 * without.loc["at", "mean_seeds"]).all()


def test_naive_rereading_is_wrong_well_above_its_level(packaged):
    """Exactly at the threshold, the fixed-n test read at five looks and stopped at the first verdict fails
    wrongly far above its level (each look spends it afresh), where the sequential design keeps it."""
    at = packaged[(packaged["scenario"] == "at") & (packaged["futility"] == "none")].set_index("statistic")
    for name in ("attn_alone", "attn_on_top", "mlp_alone", "mlp_on_top", "matches", "C1", "C2", "C3"):
        row = at.loc[name]
        assert row["naive_wrong_fails"] > 2 * row["alpha_fails"], row.to_dict()
        assert row["naive_wrong_fails"] > 1.5 * row["wrong_fails"], row.to_dict()


def test_a_small_run_shows_the_same():
    """A fresh run of the code (the `at` scenario, 240 experiments on 300 test images: the image count does not
    matter here): naive rereading's wrong failures pooled over the five tests are at least three times the
    sequential design's (about five times when written), and the table is whole."""
    table = sequential_table(experiments=240, scenarios={"at": SCENARIOS["at"]}, images=300)
    assert len(table) == 2 * 8 and set(table["images"]) == {300}
    tests = table[table["coverage"].notna()]
    assert (tests["coverage"] >= 0.9).all()
    none = tests[tests["futility"] == "none"]
    assert none["naive_wrong_fails"].sum() >= 3 * max(none["wrong_fails"].sum(), 1 / 240), none.to_string()
    keyed = table.set_index(["statistic", "futility"])
    assert (keyed.xs("0.1", level="futility")["wrong_fails"] <= keyed.xs("none", level="futility")["wrong_fails"]
            ).all()


def test_the_check_at_the_thresholds_reads_each_test_and_side():
    """A small run of the check (the docs' is 20,000 experiments): every deciding test a row, and the shares
    pooled, each side against its own alpha + 2 Monte Carlo SEs."""
    by_look, check = at_threshold(experiments=30)
    assert len(by_look) == 2 * len(LOOKS)
    assert len(check) == 6 and set(check["paths"]) == {30, 120}
    rows = check.set_index("tests")
    assert rows.loc["matches (C3)", "fails_alpha"] == ALPHA and rows.loc["attn_alone (C1)", "fails_alpha"] == ALPHA / 2
    assert rows.loc["matches (C3)", "holds_se"] == pytest.approx((ALPHA * (1 - ALPHA) / 30) ** 0.5)


def test_with_seeds_alone_the_estimated_fractions_are_the_planned():
    """The per-seed variance cancels in the fraction: without an images' part the engine's estimated fractions
    are n_k / cap, so each path is read exactly as at its true fractions (the case t_alpha is calibrated on)."""
    table = images_part_table(paths=40, shares=(0.0,)).iloc[0]
    assert table["fractions_true"] == "0.167/0.333/0.500/0.667"
    assert (table["estimated_holds"], table["estimated_fails"]) == (table["true_holds"], table["true_fails"])


def test_the_distance_scenarios_put_each_test_its_distance_from_the_threshold(packaged):
    tests = deciding_tests()
    moved, se = distance_scenarios(tests, distances=(-2, 1))
    for d, sc in zip((-2, 1), moved.values()):
        for t in tests:
            num = sum(w * sc.roles[r][0] for r, w in t.numerator.items())
            den = sum(w * sc.roles[r][0] for r, w in t.denominator.items()) if t.denominator else 1.0
            assert t.sign * (num - t.threshold * den) == pytest.approx(d * se[t.name], rel=1e-9)
    # The packaged rows sit where they say, measured on their own scenario (the SE moves a little with it).
    for d in DISTANCES:
        rows = packaged[(packaged["scenario"] == f"{d:+d} SE") & packaged["coverage"].notna()]
        assert np.allclose(rows["distance_se"], d, rtol=0.1), rows["distance_se"].tolist()
    at = packaged[(packaged["scenario"] == "at") & packaged["coverage"].notna()]
    assert np.allclose(at["distance_se"], 0, atol=1e-9)


def test_jobs_count_each_role_while_a_test_needing_it_runs():
    """C1 on the default grid: attn_alone (attn_only, random, copy_all) stopped at look 2 (10 seeds) and
    attn_on_top (copy_all, copy_mlp, random) at look 5 (30): attn_only trains 10 seeds, the rest and the
    teacher 30: 10 + 3 x 30 + 30 jobs, against 5 x 30 for a fixed design at the cap."""
    c1 = [t for t in deciding_tests() if t.claim == "C1"]
    assert _jobs({"attn_alone": 1, "attn_on_top": 4}, c1, LOOKS) == 10 + 3 * 30 + 30
    assert _jobs({"attn_alone": 4, "attn_on_top": 4}, c1, LOOKS) == 5 * 30


def test_the_t_conversion_was_liberal_and_is_corrected(conversion):
    """Converting each look's z boundary to t by its nominal significance is liberal for paired t statistics
    of normal seeds (the spending plan's default spends early); sequential.t_alpha brings it within alpha."""
    table = conversion
    default = table[(table["looks"] == "5/10/15/20/30") & (table["spending"] == sequential.DEFAULT_PLAN["spending"])]
    assert (default["plain"] > default["alpha"] + 3 * default["mc"]).all(), default.to_string()
    assert (table["corrected"] <= table["alpha"] + 3 * table["mc"]).all(), table.to_string()
    assert (table["t_alpha"] <= table["alpha"]).all()


def test_the_docs_show_the_packaged_tables(conversion):
    text = sequential_markdown()
    assert text.startswith("2,000 simulated experiments per scenario")
    assert "| attn_alone | at (2000) | +0.250 | &le; +0.25 | fails (1.25%) |" in text
    assert "| C1 | 5 | 150 |" in text and "0 SE (`at`)" in text
    docs = DOCS.read_text()
    assert "## The sequential design" in docs and text in docs
    assert t_conversion_markdown(conversion) in docs
    assert "python -m linvit.claims.calibration_sequential" in docs


def test_the_docs_show_the_check_at_the_thresholds():
    """docs/statistics.md carries the check's command and tables (their numbers are a 13-minute run's)."""
    docs = DOCS.read_text()
    assert "python -m linvit.claims.calibration_sequential --at-threshold" in docs
    assert "| test | paths a side | held (alpha; limit alpha + 2 SE) | failed (alpha; limit) | within |" in docs
    assert "| matches (C3) | 20,000 |" in docs and "--images-part" in docs
