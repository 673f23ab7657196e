"""The statistics behind the claim verdicts: paired t and Fieller intervals over seeds, with the
test images' sampling variance added, and one-sided tests against a claim's threshold.

Seeds are the unit of replication. A claim's statistic compares roles trained with the same seeds
on the same test images, so it is paired on both (`pair`): the roles' runs are matched by seed (the
seeds every role finished; the others are named) and image by image (runs on other test sets are a
one-line `PairingError`, never paired silently). Without per-image predictions the cell is paired
by seed on the runs' accuracies alone.

A statistic is a contrast of accuracies, L = sum_r w_r acc_r (a difference: {a: 1, b: -1}), or a ratio
of two contrasts (a share of a benefit). For a contrast, X[s, i] = sum_r w_r c[r, s, i] (c: 1 where
run (r, s) is right on image i); each seed s gives its paired value L_s (the mean of X over images)
and each image i its seed-mean m_i. The estimate is the grand mean of X; its variance around the
truth (the expectation over seeds and over the population of test images) is estimated by

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
tests, as `combine` reads a failure); a share also needs its denominator established. That is
"observed power", as noisy as the estimate, so `seeds_needed_low` / `_high` give the range for
truths at either end of the estimate's 50% interval (high is inf when that interval reaches the
threshold).

A claim with several deciding tests holds when all hold (an intersection-union test, at alpha with
no correction) and fails when one fails at alpha / k (Bonferroni, Holm's first step; k counts every
deciding test, also one that could not be evaluated). `holm` corrects across a family whose size is
fixed by the design: a NaN p-value counts in it and is never rejected. The method's calibration by
simulation is linvit.report.calibration (docs/statistics.md).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import special

from linvit.predictions import Predictions

HOLDS, FAILS, INCONCLUSIVE, TOO_FEW = "holds", "fails", "inconclusive", "too few seeds"
OUTCOMES = (HOLDS, FAILS, INCONCLUSIVE, TOO_FEW)
DEFAULTS = {"level": 0.95, "min_seeds": 3}
SEEDS_AND_IMAGES, SEEDS_ONLY = "seeds and test images", "seeds only (no per-image predictions)"
POWER = 0.8  # of the minimum detectable effect
# A contrast whose standard error is this small has none: every paired seed (and image) gave the same value,
# e.g. identical or collapsed runs. A t test on a zero variance estimate has no error rate, so it decides
# nothing (accuracies are on [0, 1]: one test image of 10^5 moves a contrast by 1e-5).
ZERO_SE = 1e-12
NO_TEST = "no test: the contrast has zero variance (identical or collapsed runs?)"

Contrast = Mapping[str, float]  # role -> weight: the statistic sum_r w_r acc_r


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


class PairingError(ValueError):
    """Runs that cannot be paired image by image (different test sets)."""


@dataclass(frozen=True)
class Run:
    """One finished run of a role: its seed, test accuracy and per-image predictions (None when it has none)."""

    seed: int
    acc: float
    predictions: Predictions | None = None
    name: str = ""  # for messages: the file or run key


@dataclass
class Sample:
    """The paired data of one claim cell: per role, a (seeds x images) correctness matrix (seeds in
    `seeds` order, images in the test split's order), or (seeds x 1) accuracies without predictions.
    Its moments are computed once, on first use by `estimate` or `test`, for as long as `matrices` is
    the same dict."""

    matrices: dict[str, np.ndarray]
    seeds: list[int]
    images: int  # 0: no per-image predictions
    mode: str
    missing: dict[str, list[int]] = field(default_factory=dict)  # role -> seeds it lacks that others have

    def describe(self) -> str:
        """'3 seeds (0, 1, 2) x 10000 test images', '3 seeds (0, 1, 2); seeds only (no per-image
        predictions)', with the seeds a role lacks named."""
        seeds = f"{len(self.seeds)} seed{'s' if len(self.seeds) != 1 else ''} ({', '.join(map(str, self.seeds))})"
        used = f"{seeds} x {self.images} test images" if self.images else seeds
        note = "" if self.mode == SEEDS_AND_IMAGES else f"; {self.mode}"
        gaps = "; ".join(f"seed{'s' if len(s) > 1 else ''} {', '.join(map(str, s))} missing for {role}"
                         for role, s in self.missing.items())
        return used + note + (f"; {gaps}" if gaps else "")


def pair(runs: Mapping[str, list[Run]]) -> Sample:
    """Pair the roles' runs by seed (the seeds all roles have) and by test image; PairingError when
    two runs' test sets differ (or a role has no run). Without predictions for every paired run, the
    matrices hold the runs' accuracies (seeds only)."""
    by_seed = {role: {r.seed: r for r in rs} for role, rs in runs.items()}
    empty = [role for role, rs in by_seed.items() if not rs]
    if empty:
        raise PairingError(f"no finished run of {', '.join(empty)}")
    common = sorted(set.intersection(*(set(s) for s in by_seed.values())))
    every = set().union(*(set(s) for s in by_seed.values()))
    missing = {role: sorted(every - set(s)) for role, s in by_seed.items() if every - set(s)}
    if not common:
        raise PairingError("the roles share no seed (" + "; ".join(
            f"{role}: seeds {', '.join(map(str, sorted(s)))}" for role, s in by_seed.items()) + ")")
    chosen = {role: [s[seed] for seed in common] for role, s in by_seed.items()}
    if all(r.predictions is not None for rs in chosen.values() for r in rs):
        first = chosen[next(iter(chosen))][0]
        for rs in chosen.values():
            for r in rs:
                _same_test_set(first, r)
        matrices = {role: np.stack([r.predictions.correct for r in rs]).astype(np.float32)
                    for role, rs in chosen.items()}
        mode = SEEDS_AND_IMAGES
        return Sample(matrices, common, first.predictions.samples, mode, missing)
    matrices = {role: np.array([[r.acc] for r in rs], dtype=np.float64) for role, rs in chosen.items()}
    return Sample(matrices, common, 0, SEEDS_ONLY, missing)


def _same_test_set(a: Run, b: Run) -> None:
    pa, pb = a.predictions, b.predictions
    what = f"cannot pair {a.name or f'seed {a.seed}'} with {b.name or f'seed {b.seed}'}"
    if pa.samples != pb.samples:
        raise PairingError(f"{what}: {pa.samples} vs {pb.samples} test images")
    if pa.digest != pb.digest:
        raise PairingError(f"{what}: different test sets (split digest {pa.digest[:12]} vs {pb.digest[:12]})")
    if not np.array_equal(pa.label, pb.label):
        raise PairingError(f"{what}: same test images but different labels")


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


class _Moments:
    """Every role's mean accuracy over the paired seeds and images, and the (co)variance of those means
    in two parts: seeds (covariance of the per-seed accuracies / n) and test images (covariance of the
    per-image seed-means / N, less the seed-by-image interaction, which the seed part already carries).
    Computed once per sample (`Sample` caches it): every statistic of a cell is a projection of these
    (role x role) matrices, so a cell's ten tests cost one pass over its data."""

    def __init__(self, sample: Sample):
        self.roles = list(sample.matrices)
        c = np.stack([sample.matrices[r] for r in self.roles]).astype(np.float64)  # (roles, seeds, images)
        k, n, N = c.shape
        self.n, self.N = n, sample.images
        rows, cols = c.mean(axis=2), c.mean(axis=1)  # per-seed accuracies, per-image seed-means
        self.means = rows.mean(axis=1)
        self.seed = np.cov(rows, ddof=1).reshape(k, k) / n if n > 1 else np.full((k, k), np.nan)
        self.image = np.zeros((k, k))
        if self.N > 1:
            self.image = np.cov(cols, ddof=1).reshape(k, k) / N
            if n > 1:
                # The interaction's cross-products from the raw ones (no residual matrices):
                # sum_si c c' - N sum_s rows rows' - n sum_i cols cols' + nN mean mean'.
                flat = c.reshape(k, n * N)
                interaction = (flat @ flat.T - N * rows @ rows.T - n * cols @ cols.T
                               + n * N * np.outer(self.means, self.means)) / ((n - 1) * (N - 1))
                self.image -= interaction / (n * N)

    def project(self, parts: Sequence[Contrast]) -> tuple[np.ndarray, np.ndarray]:
        """The contrasts' means and the covariance of those means: seed part plus image part, the image
        part's negative directions set to 0 (its unbiased estimate can dip below 0 when it is tiny)."""
        means, seed, image = self.project_parts(parts)
        return means, seed + image

    def project_parts(self, parts: Sequence[Contrast]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The contrasts' means, and their covariance's seed part (which shrinks as 1 / seeds) and image
        part (which does not: every seed shares the test images), apart."""
        unknown = {r for p in parts for r in p} - set(self.roles)
        if unknown:
            raise KeyError(f"no runs of {', '.join(sorted(unknown))} in the sample")
        w = np.array([[float(p.get(r, 0.0)) for r in self.roles] for p in parts])
        image = w @ self.image @ w.T
        if len(parts) == 1:
            image = np.clip(image, 0.0, None)
        else:
            vals, vecs = np.linalg.eigh(image)
            image = (vecs * np.clip(vals, 0.0, None)) @ vecs.T
        return w @ self.means, w @ self.seed @ w.T, image


def _moments(sample: Sample) -> _Moments:
    cached = sample.__dict__.get("_moments")
    if cached is None or cached[0] is not sample.matrices:
        cached = sample.__dict__["_moments"] = (sample.matrices, _Moments(sample))
    return cached[1]


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
    n, N, means, seed, image = _statistic_parts(sample, numerator, denominator)
    return n, N, means, seed + image


def _statistic_parts(sample: Sample, numerator: Contrast, denominator: Contrast | None):
    """(n, N, means, the covariance's seed part, its image part) of the numerator (and denominator)."""
    m = _moments(sample)
    return m.n, m.N, *m.project_parts([numerator] if denominator is None else [numerator, denominator])


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
    n, N, means, seed, image = _statistic_parts(sample, numerator, denominator)
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


def combine(results: Sequence, settings: Settings, k: int | None = None) -> str:
    """A claim whose deciding tests must all hold (each result has `outcome` and `p_fails`): holds when
    every one holds, fails when one fails at alpha / k (Bonferroni; k: the claim's deciding tests, by
    default len(results)), too few seeds when one has too few and none fails, else inconclusive."""
    if not results:
        return INCONCLUSIVE
    k = len(results) if k is None else k
    if any(not math.isnan(r.p_fails) and r.p_fails <= settings.alpha / k and r.outcome != TOO_FEW
           for r in results):
        return FAILS
    outcomes = [r.outcome for r in results]
    if all(o == HOLDS for o in outcomes):
        return HOLDS
    return TOO_FEW if TOO_FEW in outcomes else INCONCLUSIVE


def combined_p_fails(results: Sequence, k: int | None = None) -> float:
    """The claim's p-value against it holding, as `combine` reads it: k x the smallest p_fails (Bonferroni
    over its k deciding tests, by default len(results), capped at 1) among the tests that can decide (not
    too few seeds) and have one (a share whose denominator is not established has none); NaN when none
    does. Independent of the tests' order, so combine's "fails" and this p-value at alpha always agree."""
    usable = [r.p_fails for r in results if r.outcome != TOO_FEW and not math.isnan(r.p_fails)]
    return min(1.0, (len(results) if k is None else k) * min(usable)) if usable else math.nan


def holm(p_values: Sequence[float], alpha: float) -> list[bool]:
    """Holm's step-down rejections at family-wise error alpha over every member of the family: a NaN
    p-value (a member the data could not test) still counts in its size m and is never rejected, so the
    correction is fixed by the design, not by which members the data happened to test."""
    order = sorted((p, i) for i, p in enumerate(p_values) if not math.isnan(p))
    rejected = [False] * len(p_values)
    m = len(p_values)
    for rank, (p, i) in enumerate(order):
        if p > alpha / (m - rank):
            break
        rejected[i] = True
    return rejected
