"""The statistics engine (linvit.report.stats) on hand-made samples whose answers are known: pairing by
seed and image, the t interval with the images' variance, Fieller's interval for a share, one-sided
tests, too few seeds, combining a claim's tests and Holm's correction."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from linvit.predictions import Predictions
from linvit.report import stats
from linvit.report.stats import FAILS, HOLDS, INCONCLUSIVE, TOO_FEW, PairingError, Settings


def sample_of(per_seed: dict[str, list[float]]) -> stats.Sample:
    """Runs without per-image predictions: each role's accuracy per seed."""
    runs = {role: [stats.Run(s, acc) for s, acc in enumerate(accs)] for role, accs in per_seed.items()}
    return stats.pair(runs)


def runs_of(accs: dict[str, float], seeds=(0, 1, 2), images=2000, digest="split", rng_seed=0) -> dict:
    rng = np.random.default_rng(rng_seed)
    label = np.arange(images) % 10
    out = {}
    for role, acc in accs.items():
        out[role] = []
        for seed in seeds:
            right = rng.random(images) < acc
            out[role].append(stats.Run(seed, float(right.mean()),
                                       Predictions(np.where(right, label, (label + 1) % 10), label, digest)))
    return out


def test_a_difference_is_a_t_interval_over_the_seeds_paired_values():
    sample = sample_of({"a": [0.70, 0.72, 0.74], "b": [0.60, 0.60, 0.60]})
    e = stats.estimate(sample, {"a": 1, "b": -1}, None, Settings())
    d = np.array([0.10, 0.12, 0.14])
    half = sps.t.ppf(0.975, 2) * d.std(ddof=1) / math.sqrt(3)
    assert e.estimate == pytest.approx(0.12) and e.df == pytest.approx(2)
    assert (e.low, e.high) == (pytest.approx(0.12 - half), pytest.approx(0.12 + half))
    assert sample.mode == stats.SEEDS_ONLY and sample.images == 0


def test_the_test_images_variance_is_added_and_shrinks_with_more_images():
    widths = []
    for images in (500, 20000):
        sample = stats.pair(runs_of({"a": 0.80, "b": 0.78}, images=images))
        e = stats.estimate(sample, {"a": 1, "b": -1}, None, Settings())
        widths.append(e.high - e.low)
        assert sample.mode == stats.SEEDS_AND_IMAGES and e.images == images
    assert widths[1] < widths[0] / 3


def test_fieller_interval_of_a_share_against_a_hand_computation():
    sample = sample_of({"x": [0.60, 0.62, 0.61, 0.66], "r": [0.50, 0.51, 0.49, 0.52], "all": [0.70, 0.71, 0.72, 0.70]})
    e = stats.estimate(sample, {"x": 1, "r": -1}, {"all": 1, "r": -1}, Settings())
    num = np.array([0.10, 0.11, 0.12, 0.14])
    den = np.array([0.20, 0.20, 0.23, 0.18])
    assert e.estimate == pytest.approx(num.mean() / den.mean())
    # Every value inside the interval is a share whose contrast num - R den the t test does not reject.
    for r in (e.low + 1e-6, e.estimate, e.high - 1e-6):
        t = (num - r * den).mean() / ((num - r * den).std(ddof=1) / 2)
        assert abs(t) <= sps.t.ppf(0.975, 3) + 1e-6
    for r in (e.low - 1e-3, e.high + 1e-3):
        t = (num - r * den).mean() / ((num - r * den).std(ddof=1) / 2)
        assert abs(t) > sps.t.ppf(0.975, 3)


def test_tests_hold_fail_or_straddle_and_agree_with_the_interval():
    sample = stats.pair(runs_of({"recipe": 0.90, "reference": 0.80}))
    contrast = {"recipe": 1, "reference": -1}
    assert stats.test(sample, contrast, None, -0.005, ">=", Settings()).outcome == HOLDS
    assert stats.test(sample, contrast, None, 0.20, ">=", Settings()).outcome == FAILS
    result = stats.test(sample, contrast, None, 0.10, ">=", Settings())
    assert result.outcome == INCONCLUSIVE and result.estimate.low < 0.10 < result.estimate.high
    assert result.mde > 0 and result.p_holds > 0.025 and result.p_fails > 0.025


def test_too_few_seeds_never_decide():
    one = stats.pair(runs_of({"a": 0.9, "b": 0.5}, seeds=(0,)))
    two = stats.pair(runs_of({"a": 0.9, "b": 0.5}, seeds=(0, 1)))
    for sample in (one, two):
        assert stats.test(sample, {"a": 1, "b": -1}, None, 0.0, ">=", Settings()).outcome == TOO_FEW
    assert stats.test(two, {"a": 1, "b": -1}, None, 0.0, ">=", Settings(min_seeds=2)).outcome == HOLDS
    e = stats.estimate(one, {"a": 1, "b": -1}, None, Settings())
    assert math.isnan(e.low) and not e.bounded


def test_a_share_of_a_benefit_that_is_not_clearly_positive_is_inconclusive():
    sample = sample_of({"x": [0.55, 0.50, 0.52], "r": [0.50, 0.52, 0.50], "all": [0.52, 0.49, 0.51]})
    result = stats.test(sample, {"x": 1, "r": -1}, {"all": 1, "r": -1}, 0.25, "<=", Settings())
    assert result.outcome == INCONCLUSIVE and "not established positive" in result.note
    assert not result.estimate.bounded


def test_combine_needs_every_test_to_hold_and_corrects_failures():
    def r(outcome, p_fails):
        return stats.TestResult(outcome, math.nan, p_fails, None, 0.0, "<=", math.nan)
    s = Settings()
    assert stats.combine([r(HOLDS, 0.9), r(HOLDS, 0.8)], s) == HOLDS
    assert stats.combine([r(HOLDS, 0.9), r(FAILS, 0.001)], s) == FAILS
    # A failure at 0.02 is one at the 2.5% level, not at 2.5% / 2: inconclusive for a two-test claim.
    assert stats.combine([r(HOLDS, 0.9), r(FAILS, 0.02)], s) == INCONCLUSIVE
    assert stats.combine([r(TOO_FEW, math.nan), r(HOLDS, 0.9)], s) == TOO_FEW


def test_holm_steps_down():
    assert stats.holm([0.01, 0.04, 0.03, math.nan], 0.05) == [True, False, False, False]
    assert stats.holm([0.001, 0.02, 0.04], 0.05) == [True, True, True]


def test_pairing_intersects_seeds_and_refuses_other_test_sets():
    runs = runs_of({"a": 0.8, "b": 0.7}, seeds=(0, 1, 2))
    runs["b"] = runs["b"][:2]
    sample = stats.pair(runs)
    assert sample.seeds == [0, 1] and sample.missing == {"b": [2]}  # the seeds b lacks
    assert "seed 2 missing for b" in sample.describe()
    with pytest.raises(PairingError, match="^no finished run of b$"):
        stats.pair({"a": runs["a"], "b": []})
    other = runs_of({"b": 0.7}, digest="other")["b"]
    with pytest.raises(PairingError, match="different test sets"):
        stats.pair({"a": runs["a"], "b": other})


def test_settings_come_from_the_config_in_one_line():
    assert Settings.from_config({}) == Settings(0.95, 3)
    assert Settings.from_config({"claims": {"level": 0.9, "min_seeds": 5}}) == Settings(0.9, 5)
    with pytest.raises(ValueError, match=r"^config: 'claims.level' is 95, expected a number between 0 and 1"):
        Settings.from_config({"claims": {"level": 95}})
    with pytest.raises(ValueError, match=r"^config: 'claims.min_seeds' is 1, expected a whole number >= 2$"):
        Settings.from_config({"claims": {"min_seeds": 1}})
