"""The statistics engine (linvit.stats: pairing, paired, multitest) on hand-made samples whose answers are
known: pairing by seed and image, the t interval with the images' two-way variance, Fieller's interval for
a share, one-sided tests and their agreement with the interval, too few seeds, the minimum detectable
effect, combining a claim's tests and Holm's correction."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as sps

from linvit.predictions import Predictions
from linvit.stats import multitest, paired, pairing
from linvit.stats.paired import FAILS, HOLDS, INCONCLUSIVE, TOO_FEW, Settings
from linvit.stats.pairing import PairingError


def sample_of(per_seed: dict[str, list[float]]) -> pairing.Sample:
    """Runs without per-image predictions: each role's accuracy per seed."""
    runs = {role: [pairing.Run(s, acc) for s, acc in enumerate(accs)] for role, accs in per_seed.items()}
    return pairing.pair(runs)


def runs_of(accs: dict[str, float], seeds=(0, 1, 2), images=2000, digest="split", rng_seed=0) -> dict:
    """Per role, one run per seed whose images are each right with probability acc (a fixed label set)."""
    rng = np.random.default_rng(rng_seed)
    label = np.arange(images) % 10
    out = {}
    for role, acc in accs.items():
        out[role] = []
        for seed in seeds:
            right = rng.random(images) < acc
            out[role].append(pairing.Run(seed, float(right.mean()),
                                       Predictions(np.where(right, label, (label + 1) % 10), label, digest)))
    return out


def grid_of(matrices: dict[str, np.ndarray]) -> pairing.Sample:
    """A sample straight from (seeds x images) 0/1 matrices."""
    seeds, images = next(iter(matrices.values())).shape
    return pairing.Sample({r: m.astype(np.float32) for r, m in matrices.items()}, list(range(seeds)), images,
                        pairing.SEEDS_AND_IMAGES)


def test_a_difference_is_a_t_interval_over_the_seeds_paired_values():
    sample = sample_of({"a": [0.70, 0.72, 0.74], "b": [0.60, 0.60, 0.60]})
    e = paired.estimate(sample, {"a": 1, "b": -1}, None, Settings())
    d = np.array([0.10, 0.12, 0.14])
    half = sps.t.ppf(0.975, 2) * d.std(ddof=1) / math.sqrt(3)
    assert e.estimate == pytest.approx(0.12) and e.df == pytest.approx(2) and e.seeds == 3 and e.images == 0
    assert (e.low, e.high) == (pytest.approx(0.12 - half), pytest.approx(0.12 + half))
    assert e.se == pytest.approx(d.std(ddof=1) / math.sqrt(3)) and e.bounded
    assert sample.mode == pairing.SEEDS_ONLY and sample.images == 0
    # The same t interval for one role's accuracies alone (what the figures draw).
    assert paired.seed_interval(d) == (pytest.approx(0.12 - half), pytest.approx(0.12 + half))
    assert all(math.isnan(x) for x in paired.seed_interval([0.5]))


def test_zero_variance_is_no_test_never_a_decision():
    """A t test on a zero variance estimate has no error rate (issue 55, item 2): identical per-seed
    differences, or two roles with the same runs image by image, give no interval, no p-values and no
    seeds to decide, and the test is inconclusive with the reason named, whichever side its estimate is on."""
    sample = sample_of({"a": [0.70, 0.72, 0.74], "b": [0.60, 0.62, 0.64]})  # 0.10 on every seed
    e = paired.estimate(sample, {"a": 1, "b": -1}, None, Settings())
    assert e.estimate == pytest.approx(0.1) and e.se == pytest.approx(0, abs=1e-9)
    assert math.isnan(e.low) and math.isnan(e.high)
    for threshold in (0.09, 0.11):
        result = paired.test(sample, {"a": 1, "b": -1}, None, threshold, ">=", Settings())
        assert (result.outcome, result.note) == (INCONCLUSIVE, paired.NO_TEST)
        assert math.isnan(result.p_holds) and math.isnan(result.p_fails) and math.isnan(result.seeds_needed)
    # Two roles with the same runs, image by image: the paired difference is 0 on every seed and image.
    runs = runs_of({"a": 0.8})
    runs["b"] = [pairing.Run(r.seed, r.acc, r.predictions) for r in runs["a"]]
    e = paired.estimate(pairing.pair(runs), {"a": 1, "b": -1}, None, Settings())
    assert (e.estimate, e.se) == (0.0, 0.0) and math.isnan(e.low) and math.isnan(e.high)
    assert paired.test(pairing.pair(runs), {"a": 1, "b": -1}, None, -0.01, ">=", Settings()).note == paired.NO_TEST


def test_the_image_term_is_the_two_way_variance_of_a_grand_mean():
    rng = np.random.default_rng(3)
    a = (rng.random((4, 50)) < 0.8).astype(float)
    b = (rng.random((4, 50)) < 0.6).astype(float)
    e = paired.estimate(grid_of({"a": a, "b": b}), {"a": 1, "b": -1}, None, Settings())
    x = a - b
    n, N = x.shape
    rows, cols = x.mean(axis=1), x.mean(axis=0)
    residual = x - rows[:, None] - cols[None, :] + x.mean()
    ms_interaction = (residual ** 2).sum() / ((n - 1) * (N - 1))
    image = max(cols.var(ddof=1) / N - ms_interaction / (n * N), 0.0)
    se = math.sqrt(rows.var(ddof=1) / n + image)
    assert e.se == pytest.approx(se) and e.df == n - 1
    assert e.high - e.low == pytest.approx(2 * sps.t.ppf(0.975, n - 1) * se)


def test_the_image_term_matches_a_known_variance_when_images_differ_strongly():
    """X[s, i] = a_i + e_si: a strong per-image effect (sd 1) that every seed shares, coin-flip-like noise (sd 1)
    and no seed effect. The grand mean's variance over seeds and images is 1 / N + 1 / (n N): the image term,
    1 / N, is twenty times the rest, so leaving it out (or clipping it to 0) gives a fifth of the SE."""
    rng = np.random.default_rng(7)
    n, N = 20, 4000
    x = rng.standard_normal(N)[None, :] + rng.standard_normal((n, N))
    sample = pairing.Sample({"a": x.astype(np.float32)}, list(range(n)), N, pairing.SEEDS_AND_IMAGES)
    e = paired.estimate(sample, {"a": 1}, None, Settings())
    assert e.se ** 2 == pytest.approx(1 / N + 1 / (n * N), rel=0.1)


def test_the_test_images_variance_is_added_and_shrinks_with_more_images():
    widths = []
    for images in (500, 20000):
        sample = pairing.pair(runs_of({"a": 0.80, "b": 0.78}, images=images))
        e = paired.estimate(sample, {"a": 1, "b": -1}, None, Settings())
        widths.append(e.high - e.low)
        assert sample.mode == pairing.SEEDS_AND_IMAGES and e.images == images
    assert widths[1] < widths[0] / 3


def test_fieller_interval_of_a_share_against_a_hand_computation():
    sample = sample_of({"x": [0.60, 0.62, 0.61, 0.66], "r": [0.50, 0.51, 0.49, 0.52], "all": [0.70, 0.71, 0.72, 0.70]})
    e = paired.estimate(sample, {"x": 1, "r": -1}, {"all": 1, "r": -1}, Settings())
    num = np.array([0.10, 0.11, 0.12, 0.14])
    den = np.array([0.20, 0.20, 0.23, 0.18])
    a, b = num.mean(), den.mean()
    (v11, v12), (_, v22) = np.cov(num, den) / 4
    q = sps.t.ppf(0.975, 3)
    # (a - R b)^2 = q^2 (v11 - 2 R v12 + R^2 v22), solved for R.
    qa, qb, qc = b * b - q * q * v22, -2 * (a * b - q * q * v12), a * a - q * q * v11
    root = math.sqrt(qb * qb - 4 * qa * qc)
    assert e.estimate == pytest.approx(a / b)
    assert (e.low, e.high) == (pytest.approx((-qb - root) / (2 * qa)), pytest.approx((-qb + root) / (2 * qa)))
    # Every value inside is a share whose contrast num - R den the t test does not reject; just outside, it does.
    for r, inside in ((e.low + 1e-6, True), (a / b, True), (e.high - 1e-6, True), (e.low - 1e-3, False),
                      (e.high + 1e-3, False)):
        t = (num - r * den).mean() / ((num - r * den).std(ddof=1) / 2)
        assert (abs(t) <= q) == inside


def test_tests_hold_fail_or_straddle_and_agree_with_the_interval():
    sample = pairing.pair(runs_of({"recipe": 0.90, "reference": 0.80}))
    contrast = {"recipe": 1, "reference": -1}
    e = paired.estimate(sample, contrast, None, Settings())
    assert paired.test(sample, contrast, None, e.low - 1e-4, ">=", Settings()).outcome == HOLDS
    assert paired.test(sample, contrast, None, e.low + 1e-4, ">=", Settings()).outcome == INCONCLUSIVE
    assert paired.test(sample, contrast, None, e.high + 1e-4, ">=", Settings()).outcome == FAILS
    assert paired.test(sample, contrast, None, e.high + 1e-4, "<=", Settings()).outcome == HOLDS
    assert paired.test(sample, contrast, None, e.low - 1e-4, "<=", Settings()).outcome == FAILS
    result = paired.test(sample, contrast, None, e.estimate, ">=", Settings())
    assert result.outcome == INCONCLUSIVE and result.p_holds == pytest.approx(0.5) == result.p_fails
    # The p-values are the t distribution's, with n - 1 degrees of freedom.
    result = paired.test(sample, contrast, None, 0.09, ">=", Settings())
    t = (e.estimate - 0.09) / e.se
    assert result.p_holds == pytest.approx(sps.t.sf(t, 2)) and result.p_fails == pytest.approx(sps.t.cdf(t, 2))
    assert result.mde == pytest.approx((sps.t.ppf(0.975, 2) + sps.t.ppf(0.8, 2)) * e.se)


def test_a_share_test_agrees_with_fieller_and_its_mde_is_in_share_units():
    sample = sample_of({"x": [0.60, 0.62, 0.61, 0.66], "r": [0.50, 0.51, 0.49, 0.52], "all": [0.70, 0.71, 0.72, 0.70]})
    num, den = {"x": 1, "r": -1}, {"all": 1, "r": -1}
    e = paired.estimate(sample, num, den, Settings())
    for threshold, side, outcome in ((e.high + 1e-4, "<=", HOLDS), (e.high - 1e-4, "<=", INCONCLUSIVE),
                                     (e.low - 1e-4, "<=", FAILS), (e.low - 1e-4, ">=", HOLDS)):
        assert paired.test(sample, num, den, threshold, side, Settings()).outcome == outcome
    result = paired.test(sample, num, den, 0.5, ">=", Settings())
    contrast = np.array([0.10, 0.11, 0.12, 0.14]) - 0.5 * np.array([0.20, 0.20, 0.23, 0.18])
    se = contrast.std(ddof=1) / 2
    assert result.mde == pytest.approx((sps.t.ppf(0.975, 3) + sps.t.ppf(0.8, 3)) * se / 0.2025)


def test_seeds_needed_to_decide_an_undecided_test_at_its_estimate():
    # Seeds only (no image part): paired differences 0.01, 0.03, -0.01, 0.02 against 0: inconclusive at 4.
    sample = sample_of({"a": [0.61, 0.63, 0.59, 0.62], "b": [0.60, 0.60, 0.60, 0.60]})
    result = paired.test(sample, {"a": 1, "b": -1}, None, 0.0, ">=", Settings())
    d = np.array([0.01, 0.03, -0.01, 0.02])
    assert result.outcome == INCONCLUSIVE

    def detects(m):  # (t(0.975, m - 1) + t(0.8, m - 1)) x sd / sqrt(m) <= the estimate
        return (sps.t.ppf(0.975, m - 1) + sps.t.ppf(0.8, m - 1)) * d.std(ddof=1) / math.sqrt(m) <= d.mean()
    m = int(result.seeds_needed)
    assert m > 4 and detects(m) and not detects(m - 1)
    # Decided tests need no more seeds: NaN.
    assert math.isnan(paired.test(sample, {"a": 1, "b": -1}, None, -0.5, ">=", Settings()).seeds_needed)
    # The estimate exactly at the threshold: no number of seeds decides it.
    assert paired.test(sample, {"a": 1, "b": -1}, None, d.mean(), ">=", Settings()).seeds_needed == math.inf
    # The test images' part does not shrink with seeds: it bounds what seeds can do.
    s = Settings()
    z = sps.norm.ppf(0.975) + sps.norm.ppf(0.8)
    assert paired.seeds_needed(0.01, 1e-4, (0.01 / z) ** 2 * 1.01, s) == math.inf
    assert paired.seeds_needed(0.01, 1e-4, 0.0, s) < paired.seeds_needed(0.01, 1e-4, (0.01 / z) ** 2 / 2, s)
    # Never below min_seeds; too few seeds get a number too.
    assert paired.seeds_needed(1.0, 1e-6, 0.0, Settings(min_seeds=5)) == 5
    two = sample_of({"a": [0.61, 0.63], "b": [0.60, 0.60]})
    result = paired.test(two, {"a": 1, "b": -1}, None, 0.0, ">=", Settings())
    assert result.outcome == TOO_FEW and result.seeds_needed >= 3


def _fewest(distance: float, sd: float, alpha: float) -> int:
    """By hand: the fewest seeds m >= 3 with (t(1 - alpha, m - 1) + t(0.8, m - 1)) x sd / sqrt(m) <= distance."""
    m = 3
    while (sps.t.ppf(1 - alpha, m - 1) + sps.t.ppf(0.8, m - 1)) * sd / math.sqrt(m) > distance:
        m += 1
    return m


def test_seeds_to_fail_a_claim_are_counted_at_its_bonferroni_level():
    # Paired differences 0.01, 0.03, -0.01, 0.02 against a claim "<= 0": on the fail side, inconclusive.
    sample = sample_of({"a": [0.61, 0.63, 0.59, 0.62], "b": [0.60, 0.60, 0.60, 0.60]})
    d = np.array([0.01, 0.03, -0.01, 0.02])
    sd = d.std(ddof=1)
    one = paired.test(sample, {"a": 1, "b": -1}, None, 0.0, "<=", Settings())
    two = paired.test(sample, {"a": 1, "b": -1}, None, 0.0, "<=", Settings(), k=2)
    assert one.outcome == two.outcome == INCONCLUSIVE and one.p_fails == two.p_fails  # k moves no outcome
    assert one.seeds_needed == _fewest(d.mean(), sd, 0.025)
    assert two.seeds_needed == _fewest(d.mean(), sd, 0.025 / 2) > one.seeds_needed
    # To hold, each test of an intersection-union is at alpha: k changes nothing.
    holds = [paired.test(sample, {"a": 1, "b": -1}, None, 0.0, ">=", Settings(), k=k).seeds_needed for k in (1, 2)]
    assert holds[0] == holds[1] == one.seeds_needed


def test_seeds_to_decide_come_with_the_range_for_truths_in_the_50_percent_interval():
    sample = sample_of({"a": [0.61, 0.63, 0.59, 0.62], "b": [0.60, 0.60, 0.60, 0.60]})
    d = np.array([0.01, 0.03, -0.01, 0.02])
    sd = d.std(ddof=1)
    half = sps.t.ppf(0.75, 3) * sd / 2  # the 50% interval of the mean 0.0125: +-0.0065, clear of 0
    result = paired.test(sample, {"a": 1, "b": -1}, None, 0.0, ">=", Settings(), k=2)
    assert result.seeds_needed_low == _fewest(d.mean() + half, sd, 0.025)  # the far end: fewer seeds
    assert result.seeds_needed_high == _fewest(d.mean() - half, sd, 0.025)  # the near end: more
    assert result.seeds_needed_low < result.seeds_needed < result.seeds_needed_high
    # The interval reaching the threshold (0.01: 0.0025 away): some truth in it is the threshold, unbounded.
    near = paired.test(sample, {"a": 1, "b": -1}, None, 0.01, ">=", Settings(), k=2)
    assert near.seeds_needed_high == math.inf and near.seeds_needed_low < near.seeds_needed < math.inf
    # The far end (0.0190 above the threshold) is on the holding side; its near end (0.0040 below) would fail,
    # at alpha / 2: the low end is the fewer of the two.
    ends = (_fewest(0.0025 + half, sd, 0.025), _fewest(half - 0.0025, sd, 0.0125))
    assert near.seeds_needed_low == min(ends)
    # Decided tests: NaN throughout.
    decided = paired.test(sample, {"a": 1, "b": -1}, None, -0.5, ">=", Settings())
    assert all(math.isnan(x) for x in (decided.seeds_needed, decided.seeds_needed_low, decided.seeds_needed_high))


def test_a_share_needs_its_benefit_established_too_the_larger_count():
    """The contrast num - 0.25 den is 0.2 on every seed (min_seeds decides it), but the benefit, 0.03 with
    SD 0.032 over seeds, is not established: its seeds, at the estimate and at the 50% interval's ends,
    are the counts."""
    den = np.array([0.02, 0.06, -0.01, 0.05])
    num = 0.25 * den + 0.2 + np.array([0.001, -0.001, 0.0005, -0.0005])
    sample = sample_of({"x": list(0.5 + num), "r": [0.5] * 4, "all": list(0.5 + den)})
    result = paired.test(sample, {"x": 1, "r": -1}, {"all": 1, "r": -1}, 0.25, "<=", Settings())
    assert result.outcome == INCONCLUSIVE and "not established" in result.note
    sd = den.std(ddof=1)
    half = sps.t.ppf(0.75, 3) * sd / 2
    assert (result.seeds_needed, result.seeds_needed_low, result.seeds_needed_high) == (
        _fewest(den.mean(), sd, 0.025), _fewest(den.mean() + half, sd, 0.025), _fewest(den.mean() - half, sd, 0.025))
    assert result.seeds_needed_low > 3  # more than the contrast alone needs


def test_too_few_seeds_never_decide():
    one = pairing.pair(runs_of({"a": 0.9, "b": 0.5}, seeds=(0,)))
    two = pairing.pair(runs_of({"a": 0.9, "b": 0.5}, seeds=(0, 1)))
    for sample in (one, two):
        result = paired.test(sample, {"a": 1, "b": -1}, None, 0.0, ">=", Settings())
        assert result.outcome == TOO_FEW and result.estimate.estimate == pytest.approx(0.4, abs=0.03)
    assert paired.test(two, {"a": 1, "b": -1}, None, 0.0, ">=", Settings(min_seeds=2)).outcome == HOLDS
    e = paired.estimate(one, {"a": 1, "b": -1}, None, Settings())
    assert math.isnan(e.low) and math.isnan(e.high) and not e.bounded
    assert math.isnan(paired.test(one, {"a": 1, "b": -1}, None, 0.0, ">=", Settings()).mde)
    assert math.isnan(paired.estimate(one, {"a": 1, "b": -1}, {"a": 1}, Settings()).low)
    assert paired.estimate(two, {"a": 1, "b": -1}, None, Settings()).bounded  # an interval, but no verdict


def test_a_share_of_a_benefit_that_is_not_clearly_positive_is_inconclusive():
    sample = sample_of({"x": [0.55, 0.50, 0.52], "r": [0.50, 0.52, 0.50], "all": [0.52, 0.49, 0.51]})
    result = paired.test(sample, {"x": 1, "r": -1}, {"all": 1, "r": -1}, 0.25, "<=", Settings())
    assert result.outcome == INCONCLUSIVE and "not established positive" in result.note
    assert math.isnan(result.p_holds) and math.isnan(result.p_fails)
    assert not result.estimate.bounded and result.estimate.low == -math.inf and result.estimate.high == math.inf
    negative = sample_of({"x": [0.55, 0.56, 0.57], "r": [0.50, 0.51, 0.50], "all": [0.40, 0.41, 0.42]})
    result = paired.test(negative, {"x": 1, "r": -1}, {"all": 1, "r": -1}, 0.25, "<=", Settings())
    assert result.outcome == INCONCLUSIVE and result.note and not result.estimate.bounded
    # Below min_seeds, too few seeds is the reason given (the note stays).
    two = sample_of({"x": [0.55, 0.50], "r": [0.50, 0.52], "all": [0.52, 0.49]})
    result = paired.test(two, {"x": 1, "r": -1}, {"all": 1, "r": -1}, 0.25, "<=", Settings())
    assert result.outcome == TOO_FEW and result.note


def test_combine_needs_every_test_to_hold_and_corrects_failures():
    def r(outcome, p_fails):
        return paired.TestResult(outcome, math.nan, p_fails, None, 0.0, "<=", math.nan)
    s = Settings()
    assert multitest.combine([r(HOLDS, 0.9), r(HOLDS, 0.8)], s) == HOLDS
    assert multitest.combine([r(HOLDS, 0.9), r(FAILS, 0.001)], s) == FAILS
    # A failure at 0.02 is one at the 2.5% level, not at 2.5% / 2: inconclusive for a two-test claim.
    assert multitest.combine([r(HOLDS, 0.9), r(FAILS, 0.02)], s) == INCONCLUSIVE
    assert multitest.combine([r(FAILS, 0.02)], s) == FAILS
    assert multitest.combine([r(TOO_FEW, math.nan), r(HOLDS, 0.9)], s) == TOO_FEW
    assert multitest.combine([r(TOO_FEW, 0.001), r(INCONCLUSIVE, 0.3)], s) == TOO_FEW  # too few never decides
    assert multitest.combine([r(TOO_FEW, math.nan), r(FAILS, 0.001)], s) == FAILS
    assert multitest.combine([r(INCONCLUSIVE, math.nan), r(HOLDS, 0.9)], s) == INCONCLUSIVE
    # k: the claim's deciding tests, also those not given here (one could not be evaluated).
    assert multitest.combine([r(FAILS, 0.02)], s, k=2) == INCONCLUSIVE
    assert multitest.combine([r(FAILS, 0.01)], s, k=2) == FAILS
    assert multitest.combined_p_fails([r(FAILS, 0.01)], k=2) == pytest.approx(0.02)


def test_the_claims_p_value_is_combines_reading_in_any_order():
    def r(outcome, p_fails):
        return paired.TestResult(outcome, math.nan, p_fails, None, 0.0, "<=", math.nan)
    s = Settings()
    cases = [[r(INCONCLUSIVE, math.nan), r(FAILS, 0.001)], [r(TOO_FEW, 1e-6), r(FAILS, 0.01)],
             [r(TOO_FEW, 1e-6), r(HOLDS, 0.9)], [r(HOLDS, 0.9), r(INCONCLUSIVE, 0.02)], [r(FAILS, 0.012)],
             [r(INCONCLUSIVE, math.nan), r(INCONCLUSIVE, math.nan)], [r(TOO_FEW, 0.001), r(TOO_FEW, 0.3)]]
    expected = [0.002, 0.02, 1.0, 0.04, 0.012, math.nan, math.nan]
    for results, p in zip(cases, expected):
        for order in (results, results[::-1]):
            got = multitest.combined_p_fails(order)
            assert got == pytest.approx(p, nan_ok=True), (order, got)
            # combine fails exactly when the Bonferroni p-value is at alpha or below.
            assert (multitest.combine(order, s) == FAILS) == (got <= s.alpha)


def test_holm_steps_down():
    assert multitest.holm([0.01, 0.04, 0.03, math.nan], 0.05) == [True, False, False, False]
    assert multitest.holm([0.001, 0.02, 0.04], 0.05) == [True, True, True]
    assert multitest.holm([0.04, 0.001], 0.05) == [True, True]
    assert multitest.holm([0.03, 0.03], 0.05) == [False, False]
    assert multitest.holm([], 0.05) == []
    # The family is every member, tested or not: a NaN counts in m (0.03 > 0.05 / 2), and is never rejected.
    assert multitest.holm([0.03, math.nan], 0.05) == [False, False]
    assert multitest.holm([0.02, math.nan], 0.05) == [True, False]
    assert multitest.holm([0.001, math.nan, 0.02], 0.05) == [True, False, True]


def test_pairing_intersects_seeds_and_refuses_other_test_sets():
    runs = runs_of({"a": 0.8, "b": 0.7}, seeds=(0, 1, 2))
    runs["b"] = runs["b"][:2]
    sample = pairing.pair(runs)
    assert sample.seeds == [0, 1] and sample.missing == {"b": [2]}  # the seeds b lacks
    assert sample.matrices["a"].shape == (2, 2000) and sample.mode == pairing.SEEDS_AND_IMAGES
    assert sample.describe() == "2 seeds (0, 1) x 2000 test images; seed 2 missing for b"
    with pytest.raises(PairingError, match="^no finished run of b$"):
        pairing.pair({"a": runs["a"], "b": []})
    with pytest.raises(PairingError, match="share no seed"):
        pairing.pair({"a": runs["a"][:1], "b": runs["b"][1:]})
    other = runs_of({"b": 0.7}, digest="other")["b"]
    with pytest.raises(PairingError,
                       match=r"^cannot pair seed 0 with seed 0: different test sets \(split digest") as err:
        pairing.pair({"a": runs["a"], "b": other})
    assert "\n" not in str(err.value)
    fewer = runs_of({"b": 0.7}, images=1000)["b"]
    with pytest.raises(PairingError, match="2000 vs 1000 test images"):
        pairing.pair({"a": runs["a"], "b": fewer})
    p = runs["b"][0].predictions
    relabelled = [pairing.Run(0, 0.7, Predictions(p.pred, (p.label + 1) % 10, p.digest))]
    with pytest.raises(PairingError, match="same test images but different labels"):
        pairing.pair({"a": runs["a"], "b": relabelled})


def test_pairing_matches_images_and_falls_back_to_accuracies_without_predictions():
    runs = runs_of({"a": 0.8, "b": 0.7})
    sample = pairing.pair(runs)
    for role, rs in runs.items():
        assert np.array_equal(sample.matrices[role][1], rs[1].predictions.correct)
    # One run without predictions makes the whole cell seeds-only (no silent half pairing).
    mixed = {**runs, "b": [pairing.Run(r.seed, r.acc) for r in runs["b"]]}
    sample = pairing.pair(mixed)
    assert sample.mode == pairing.SEEDS_ONLY and sample.images == 0 and sample.matrices["a"].shape == (3, 1)
    assert sample.matrices["b"][:, 0].tolist() == [r.acc for r in runs["b"]]
    assert sample.describe() == "3 seeds (0, 1, 2); seeds only (no per-image predictions)"
    one = pairing.pair(runs_of({"a": 0.8}, seeds=(4,)))
    assert one.seeds == [4] and one.describe().startswith("1 seed (4) x 2000 test images")


def test_settings_come_from_the_config_in_one_line():
    assert Settings.from_config({}) == Settings(0.95, 3) and Settings().alpha == pytest.approx(0.025)
    assert Settings.from_config({"claims": {"level": 0.9, "min_seeds": 5, "negligible": 0.2}}) == Settings(0.9, 5)
    assert Settings(0.9).alpha == pytest.approx(0.05)
    with pytest.raises(ValueError, match=r"^config: 'claims.level' is 95, expected a number between 0 and 1 "
                                         r"\(e.g. 0.95\)$"):
        Settings.from_config({"claims": {"level": 95}})
    with pytest.raises(ValueError, match=r"^config: 'claims.min_seeds' is 1, expected a whole number >= 2$"):
        Settings.from_config({"claims": {"min_seeds": 1}})
    for bad in (2.5, True, "3"):
        with pytest.raises(ValueError, match="'claims.min_seeds'"):
            Settings.from_config({"claims": {"min_seeds": bad}})


def test_stats_imports_no_claims():
    """linvit.stats is numbers in, numbers out: each module imports the standard library, numpy, scipy, the
    predictions type and linvit.stats itself, never the claims, the config or the report."""
    import ast
    import sys
    from pathlib import Path

    import linvit.stats

    allowed = {"numpy", "scipy", "linvit.predictions", "linvit.stats"}
    for path in sorted(Path(linvit.stats.__file__).parent.glob("*.py")):
        tree = ast.parse(path.read_text())
        imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.level == 0} | {
            a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        outside = [m for m in imported if m.split(".")[0] not in sys.stdlib_module_names
                   and not any(m == a or m.startswith(a + ".") for a in allowed)]
        assert not outside, (path.name, outside)
