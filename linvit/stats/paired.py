"""The statistics behind the claim verdicts: paired t and Fieller intervals over seeds, with the
test images' sampling variance added, and one-sided tests against a claim's threshold.

A claim's statistic is a contrast of roles paired by seed and test image (linvit.stats.pairing): each
seed s gives its paired value L_s (the mean of X over images) and each image i its seed-mean m_i. The
estimate is the grand mean of X; its variance around the truth (the expectation over seeds and over the
population of test images) is estimated by

    var_s(L_s) / n  +  var_i(m_i) / N  -  MS_interaction / (n N)

(n seeds, N images; the image terms are 0 without per-image predictions, and the image part is set
to 0 where it comes out negative): the variance of a grand mean in a two-way (seeds x images)
random-effects layout. The first term is seed-to-seed variation; the second is the sampling of the
test images, which every seed shares and so does not average out over seeds; both carry the
seed-by-image interaction (for 0/1 outcomes, mostly coin-flip noise), which the third takes out
once. The interval is mean +- t(n - 1) x SE: n - 1 degrees of freedom, the conservative end of
Welch-Satterthwaite's range (Satterthwaite's own estimate undercovered at 3 seeds in the calibration;
leaving the image term out undercovered at 10 seeds on 360 images; counting the interaction twice
made intervals up to a third wider than needed). A ratio's interval is Fieller's: the set of values R
whose contrast num - R x den is not rejected by the same t test; it is unbounded when the
denominator is not clearly positive (its one-sided lower bound at alpha is not above 0).

A test of the claim `statistic <side> threshold` is a t test of the contrast num - threshold x den
(a difference: num - threshold): `p_holds` is its one-sided p-value against the claim's being false,
`p_fails` against its being true. At `level` (default 0.95) each side is tested at alpha = (1 -
level) / 2, so a test holds or fails exactly when the level interval lies wholly on one side of the
threshold. A ratio whose denominator is not established positive is inconclusive (no p-values).
Fewer than `min_seeds` paired seeds (default 3): "too few seeds", never holds or fails. `mde` is
the distance from the threshold that the test would detect with 80% power,
(t(1 - alpha, n - 1) + t(0.8, n - 1)) x SE (a share's: over the mean denominator). An undecided test
(inconclusive, too few seeds) gives `seeds_needed`: the paired seeds m at which it would decide with
80% power if the truth were its estimate, with SE(m)^2 = per-seed variance / m + the images' part
(which more seeds do not shrink), holding at alpha or failing at alpha / k (k: its claim's deciding
tests, as multitest.combine reads a failure); a share also needs its denominator established. That is
"observed power", as noisy as the estimate, so `seeds_needed_low` / `_high` give the range for
truths at either end of the estimate's 50% interval (high is inf when that interval reaches the
threshold).

A claim with several deciding tests combines them in linvit.stats.multitest. The method's calibration by
simulation is linvit.claims.calibration (docs/statistics.md).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import special

from linvit.stats.pairing import Contrast, Sample, contrast_moments

HOLDS, FAILS, INCONCLUSIVE, TOO_FEW = "holds", "fails", "inconclusive", "too few seeds"
OUTCOMES = (HOLDS, FAILS, INCONCLUSIVE, TOO_FEW)
DEFAULTS = {"level": 0.95, "min_seeds": 3}
POWER = 0.8  # of the minimum detectable effect
# A contrast whose standard error is this small has none: every paired seed (and image) gave the same value,
# e.g. identical or collapsed runs. A t test on a zero variance estimate has no error rate, so it decides
# nothing (accuracies are on [0, 1]: one test image of 10^5 moves a contrast by 1e-5).
ZERO_SE = 1e-12
NO_TEST = "no test: the contrast has zero variance (identical or collapsed runs?)"


@dataclass(frozen=True)
class Settings:
    """The interval level (each one-sided test at (1 - level) / 2) and the fewest paired seeds that decide."""

    level: float = DEFAULTS["level"]
    min_seeds: int = DEFAULTS["min_seeds"]

    @classmethod
    def from_config(cls, config: dict) -> Settings:
        given = config.get("claims") or {}
        if not isinstance(given, dict):
            raise ValueError(f"config: 'claims' must be a mapping, got {given!r}")
        level, min_seeds = given.get("level", DEFAULTS["level"]), given.get("min_seeds", DEFAULTS["min_seeds"])
        if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 1:
            raise ValueError(f"config: 'claims.level' is {level!r}, expected a number between 0 and 1 (e.g. 0.95)")
        if isinstance(min_seeds, bool) or not isinstance(min_seeds, int) or min_seeds < 2:
            raise ValueError(f"config: 'claims.min_seeds' is {min_seeds!r}, expected a whole number >= 2")
        return cls(float(level), min_seeds)

    @property
    def alpha(self) -> float:
        """The error of each one-sided test: (1 - level) / 2."""
        return (1 - self.level) / 2


@dataclass(frozen=True)
class Estimate:
    """A statistic's point estimate and its `level` interval (NaN bounds below two seeds; +-inf where
    Fieller's interval is unbounded), the standard error and degrees of freedom of its contrast."""

    estimate: float
    low: float
    high: float
    level: float
    se: float = math.nan
    df: float = math.nan
    seeds: int = 0
    images: int = 0

    @property
    def bounded(self) -> bool:
        return math.isfinite(self.low) and math.isfinite(self.high)


@dataclass(frozen=True)
class TestResult:
    """One claim `statistic <side> threshold` judged on a sample."""

    outcome: str
    p_holds: float
    p_fails: float
    estimate: Estimate
    threshold: float
    side: str
    mde: float
    note: str = ""
    # Undecided tests (inconclusive, too few seeds): the paired seeds that would decide it with POWER if
    # the truth were the current estimate (seeds_needed), and if it were at the low / high-need end of the
    # estimate's 50% interval (the rough range); inf where no number of seeds would; NaN else.
    seeds_needed: float = math.nan
    seeds_needed_low: float = math.nan
    seeds_needed_high: float = math.nan


@functools.lru_cache(maxsize=4096)
def _quantile(p: float, df: float) -> float:
    """The t distribution's p quantile (scipy.special: a ufunc, ~100x quicker than scipy.stats.t)."""
    return float(special.ndtri(p) if math.isinf(df) else special.stdtrit(df, p))


def _cdf(x: float, df: float) -> float:
    return float(special.ndtr(x) if math.isinf(df) else special.stdtr(df, x))


def _p_below(mean: float, se: float, df: float) -> float:
    """One-sided p-value against 'the contrast is >= 0' (small: clearly below 0)."""
    if not se > ZERO_SE:
        return math.nan  # no variance, no test (NO_TEST)
    return _cdf(mean / se, df)


def _statistic(sample: Sample, numerator: Contrast, denominator: Contrast | None):
    """(n, N, means, covariance) of the numerator (and denominator) contrast."""
    n, N, means, seed, image = contrast_moments(sample, numerator, denominator)
    return n, N, means, seed + image


def _se(cov: np.ndarray, w: Sequence[float]) -> float:
    w = np.asarray(w, dtype=np.float64)
    return math.sqrt(max(float(w @ cov @ w), 0.0))


def estimate(sample: Sample, numerator: Contrast, denominator: Contrast | None, settings: Settings) -> Estimate:
    """A difference's t interval or a ratio's Fieller interval at `settings.level` (see the module doc)."""
    return _estimate(*_statistic(sample, numerator, denominator), denominator is not None, settings)


def _estimate(n: int, N: int, means: np.ndarray, cov: np.ndarray, ratio_of: bool, settings: Settings) -> Estimate:
    level, df = settings.level, float(n - 1)
    if not ratio_of:
        mean = float(means[0])
        if n < 2:
            return Estimate(mean, math.nan, math.nan, level, math.nan, math.nan, n, N)
        se = _se(cov, [1.0])
        if not se > ZERO_SE:  # no variance: no interval (NO_TEST)
            return Estimate(mean, math.nan, math.nan, level, se, df, n, N)
        q = _quantile(1 - settings.alpha, df)
        return Estimate(mean, mean - q * se, mean + q * se, level, se, df, n, N)
    a, b = float(means[0]), float(means[1])
    ratio = a / b if b != 0 else (math.copysign(math.inf, a) if a else math.nan)
    if n < 2:
        return Estimate(ratio, math.nan, math.nan, level, math.nan, math.nan, n, N)
    q = _quantile(1 - settings.alpha, df)
    # Fieller: the R with (a - R b)^2 <= q^2 (v11 - 2 R v12 + R^2 v22), a quadratic in R. With the
    # denominator established positive (b > q sd(b), i.e. qa > 0) it is a bounded interval. Otherwise it
    # is unbounded (or two rays), or, for a clearly negative benefit, an interval of a ratio that no
    # longer reads as a share: no bounds.
    qa = b * b - q * q * cov[1, 1]
    qb = -2 * (a * b - q * q * cov[0, 1])
    qc = a * a - q * q * cov[0, 0]
    disc = qb * qb - 4 * qa * qc
    if not float(np.abs(cov).max()) > ZERO_SE ** 2:  # no variance: no interval (NO_TEST)
        low, high = math.nan, math.nan
    elif b > 0 and qa > 0 and disc >= 0:
        root = math.sqrt(disc)
        low, high = (-qb - root) / (2 * qa), (-qb + root) / (2 * qa)
    else:
        low, high = -math.inf, math.inf
    # The SE reported for a share: the delta method's, the contrast num - R den over den.
    se = _se(cov, [1.0, -ratio]) / abs(b) if b and math.isfinite(ratio) else math.inf
    return Estimate(ratio, low, high, level, se, df, n, N)


MAX_SEEDS = 100_000  # seeds_needed: more than this reads as unreachable


def seeds_needed(distance: float, per_seed: float, image: float, settings: Settings,
                 alpha: float | None = None) -> float:
    """The fewest paired seeds m (at least min_seeds) at which a one-sided t test at `alpha` (default
    settings.alpha) detects a true contrast `distance` from 0 with POWER, (t(1 - alpha, m - 1) + t(POWER,
    m - 1)) x SE(m) <= distance, where SE(m)^2 = per_seed / m + image: the seed-to-seed variance of one
    seed's paired value shrinks with seeds, the test images' sampling (`image`, the variance of the mean
    over images) does not. inf when no number of seeds reaches it (the estimate at the threshold, or the
    images' part alone too wide)."""
    alpha = settings.alpha if alpha is None else alpha
    if not distance > 0 or not math.isfinite(distance):
        return math.inf
    z = _quantile(1 - alpha, math.inf) + _quantile(POWER, math.inf)
    room = (distance / z) ** 2 - image  # what the seed part may take, at normal quantiles (a lower bound)
    if not room > 0:
        return math.inf
    m = max(settings.min_seeds, 2, math.floor(per_seed / room))
    while m <= MAX_SEEDS:
        if (_quantile(1 - alpha, m - 1) + _quantile(POWER, m - 1)) * math.sqrt(per_seed / m + image) <= distance:
            return float(m)
        m = m + 1 if m < 1000 else math.ceil(m * 1.01)  # t quantiles settle: coarser steps far out
    return math.inf


def test(sample: Sample, numerator: Contrast, denominator: Contrast | None, threshold: float, side: str,
         settings: Settings, k: int = 1) -> TestResult:
    """The claim `numerator [/ denominator] <side> threshold` (side '<=' or '>='), by one-sided t tests
    of its contrast on each side (see the module doc). k: the deciding tests of its claim, which fails
    only at alpha / k: what seeds_needed sizes a failure for (the outcome itself is at alpha)."""
    if side not in ("<=", ">="):
        raise ValueError(f"side must be '<=' or '>=', got {side!r}")
    n, N, means, seed, image = contrast_moments(sample, numerator, denominator)
    cov = seed + image
    est = _estimate(n, N, means, cov, denominator is not None, settings)  # one projection for both
    if n < 2:
        return TestResult(TOO_FEW, math.nan, math.nan, est, threshold, side, math.nan)
    df = float(n - 1)
    q = _quantile(1 - settings.alpha, df)
    note = ""
    if denominator is None:
        mean, se, scale = float(means[0]) - threshold, _se(cov, [1.0]), 1.0
    else:
        # num / den <side> thr  <=>  num - thr den <side> 0, as long as den > 0.
        d_mean = float(means[1])
        if not d_mean - q * _se(cov, [0.0, 1.0]) > 0:
            note = "the denominator (benefit) is not established positive"
        mean, se = float(means[0] - threshold * means[1]), _se(cov, [1.0, -threshold])
        scale = d_mean if d_mean > 0 else math.nan  # the MDE in share units
    sign = 1.0 if side == "<=" else -1.0  # the claim holds when sign x contrast < 0
    p_holds, p_fails = _p_below(sign * mean, se, df), _p_below(-sign * mean, se, df)
    mde = (q + _quantile(POWER, df)) * se / scale
    if note:  # no valid test of the share: no p-values
        p_holds = p_fails = math.nan
    if not se > ZERO_SE:
        note = NO_TEST
    if n < settings.min_seeds:
        outcome = TOO_FEW
    elif note:
        outcome = INCONCLUSIVE
    elif p_holds <= settings.alpha:
        outcome = HOLDS
    elif p_fails <= settings.alpha:
        outcome = FAILS
    else:
        outcome = INCONCLUSIVE
    needed = (math.nan,) * 3
    if outcome in (INCONCLUSIVE, TOO_FEW) and note != NO_TEST:  # no variance: nothing to size seeds by
        needed = _seeds_needed(n, means, seed, image, denominator is not None, threshold, sign * mean, k, settings)
    return TestResult(outcome, p_holds, p_fails, est, threshold, side, mde, note, *needed)


def _seeds_needed(n: int, means: np.ndarray, seed: np.ndarray, image: np.ndarray, ratio_of: bool,
                  threshold: float, against: float, k: int, settings: Settings) -> tuple[float, float, float]:
    """seeds_needed for the test's contrast num - threshold x den (`against`: its estimate, signed so
    that below 0 is the claim's side) with the truth at the estimate, and the (low, high) range for
    truths in the estimate's 50% interval: the ends, high inf when the interval reaches the threshold.
    To hold: at alpha; to fail: at alpha / k (the claim's Bonferroni level). A share needs its
    denominator established positive too (at each point the larger count)."""
    w = np.array([1.0, -threshold] if ratio_of else [1.0])
    per_seed, image_part = n * float(w @ seed @ w), float(w @ image @ w)
    half = _quantile(0.75, n - 1) * math.sqrt(max(per_seed / n + image_part, 0.0))

    def need(truth: float) -> float:
        alpha = settings.alpha if truth < 0 else settings.alpha / k
        return seeds_needed(abs(truth), per_seed, image_part, settings, alpha)

    ends = (need(against - half), need(against + half))
    needed, low = need(against), min(ends)
    high = math.inf if (against - half) * (against + half) <= 0 else max(ends)
    if ratio_of:
        d, d_seed, d_image = float(means[1]), n * float(seed[1, 1]), float(image[1, 1])
        d_half = _quantile(0.75, n - 1) * math.sqrt(max(d_seed / n + d_image, 0.0))
        needed = max(needed, seeds_needed(d, d_seed, d_image, settings))
        low = max(low, seeds_needed(d + d_half, d_seed, d_image, settings))
        high = max(high, seeds_needed(d - d_half, d_seed, d_image, settings))
    return needed, low, high


def seed_interval(values: Sequence[float], level: float = DEFAULTS["level"]) -> tuple[float, float]:
    """The `level` t interval of a mean over seeds, mean +- t(1 - alpha, n - 1) x sd / sqrt(n): the claims'
    interval for one role's accuracy when only its per-seed accuracies are at hand (the figures). NaN
    bounds below two values."""
    x = np.asarray(values, dtype=np.float64)
    x = x[np.isfinite(x)]
    if len(x) < 2:
        return math.nan, math.nan
    half = _quantile(1 - (1 - level) / 2, len(x) - 1) * float(x.std(ddof=1)) / math.sqrt(len(x))
    return float(x.mean()) - half, float(x.mean()) + half

