"""The sequential design: a claim's test read at planned looks, with its error rate spent across them.

A grid with a `sequential:` plan (linvit decide) trains its seeds in looks: look 1 is the grid as
configured, and each later look adds seeds, up to `looks[k]` paired seeds, only to the roles that an
undecided test still needs. Rereading a fixed-n interval after adding seeds is optional stopping (its
stated error no longer holds); here every look has its own boundary, from an alpha-spending function
fixed in the plan, so that over the whole sequence a test holds wrongly at most `alpha` and fails wrongly
at most `fail_alpha` (alpha / k for a claim of k deciding tests, the Bonferroni split of `multitest.combine`).

The method (Jennison and Turnbull 2000, ch. 7 and 19; Lan and DeMets 1983):

- Each test keeps its statistic: a contrast, or a share through num - threshold x den, paired by seed and
  test image as in linvit.stats.pairing. At look k (its first n_k seeds in the design's seed order) it has
  the estimate, SE_k^2 = per-seed variance / n_k + the test images' part, and T_k = estimate / SE_k.
- The information fraction t_k = I_k / I_cap with I = 1 / SE^2, from look k's own variance estimates:
  t_k = (v / n_cap + w) / (v / n_k + w), v the per-seed variance, w the images' part, which more seeds do
  not shrink (so the information saturates: a test whose images dominate gains little from seeds). The
  fractions of earlier looks are those computed at those looks, so no look is re-decided with later data.
- Each side's boundary at look k spends alpha(t_k) - alpha(t_{k-1}) of its error under the canonical joint
  distribution of (Z_1, ..., Z_k) (corr sqrt(t_i / t_j)), given the earlier boundaries: the usual
  recursive numerical integration on a grid (linvit.stats.boundaries). The two sides are computed apart, each as a
  one-sided design: stopping at the other side only removes paths, so each side stays within its alpha.
  No well-kept Python package does this (PyPI's group sequential packages are young one-author ports);
  it is ~40 lines of numpy on scipy's normal distribution.
- The z boundary is converted to the t scale by its nominal significance, c_t = t^-1(Phi(c_z), n_k - 1):
  the same error per look, with n - 1 degrees of freedom as the fixed design uses. That alone is liberal:
  each look's T has its own variance estimate, so the T's of two looks are less correlated than the Z's
  whose overlap the recursion credits (the calibration measured 3-13% more error than alpha for paired
  t statistics of normal seeds at looks of 3-30 seeds, the most for spending early, e.g. 7% for the
  default plan at 5, 10, 15, 20, 30). So each side spends a lowered alpha (`t_alpha`): the one whose
  converted boundaries, at the planned fractions n_k / cap, cross with probability alpha for a paired t
  statistic of normal seeds (the fewest degrees of freedom the engine has; its test images' part only
  adds more), found once per plan and alpha by simulation with a fixed generator seed, two Monte Carlo
  SEs on the safe side.
- At the cap every side spends what is left (t = 1).
- Repeated confidence intervals: at look k, the values of the statistic that neither side's boundary
  rejects (a share's by Fieller, with each side's critical value): they cover the truth at every look at
  once with probability at least 1 - alpha - fail_alpha. A test that stopped early reports its stopping
  look's interval; its point estimate is biased away from the threshold (it stopped because it was far).
- Futility (non-binding): from look `futility_from` on, a test whose conditional power at the cap
  (under its current trend, to cross either side's cap boundary) is below `futility` stops as
  "undecided within the cap". The boundaries ignore it, so it can only lower the error rates.
- C4 across cells and budgets: each failure counts at its own fail side, spent at fail_alpha / m for
  a family of m (claim, cell, budget) tests (Bonferroni over the family, valid under any stopping; Holm's
  step-down needs p-values that a non-binding stop does not give), with every gate of the test's own decision
  (`fails_at`): a test that cannot fail in its cell cannot fail C4 there.

The calibration under this stopping rule is linvit.claims.calibration_sequential (docs/statistics.md, "The
sequential design").
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field

import numpy as np
from scipy import special

from linvit.stats import paired
from linvit.stats.boundaries import boundaries, conditional_power, t_critical
from linvit.stats.pairing import Sample, contrast_moments
from linvit.stats.spending import SPENDING

# Hwang-Shih-DeCani with gamma 0 spends alpha in proportion to the information. O'Brien-Fleming's would
# waste look 1: at 5 seeds (4 degrees of freedom, t ~ 0.2) its boundary is |T| > 90 on the t scale. In a
# simulation of the reference cell (fmnist scenario, looks 5-30) it needed 16 seeds on average for C1's
# tests where O'Brien-Fleming needed 20, and decided as often (90% against 92% for attn_on_top).
DEFAULT_PLAN = {"spending": "hwang_shih_decani", "gamma": 0.0, "futility": 0.1, "futility_from": 2}
# Outcomes of a sequential test beyond paired's holds and fails.
CONTINUES = "continues"  # undecided at its last look, with looks left: the next look adds seeds
FUTILE = "undecided within the cap"  # stopped: it cannot plausibly decide by the cap (or reached it)
WAITS = "waits"  # the look's seeds are not all finished yet


@dataclass(frozen=True)
class Plan:
    """A sequential plan (`sequential:` in the config): the looks as numbers of paired seeds (the last is
    the cap), the spending function (linvit.stats.spending's names; `gamma`: its parameter) and the non-binding
    futility rule (conditional power at the cap below `futility`, from look `futility_from` on; None: no
    futility stop)."""

    looks: tuple[int, ...]
    spending: str = DEFAULT_PLAN["spending"]
    gamma: float = DEFAULT_PLAN["gamma"]
    futility: float | None = DEFAULT_PLAN["futility"]
    futility_from: int = DEFAULT_PLAN["futility_from"]

    @classmethod
    def from_config(cls, config: dict) -> Plan | None:
        """The config's plan, or None for a fixed design (no `sequential:`). ValueError naming the key."""
        given = config.get("sequential")
        if given is None:
            return None
        if not isinstance(given, dict):
            raise ValueError(f"config key sequential: a mapping of looks, spending and futility, got {given!r}")
        looks = given.get("looks")
        if (not isinstance(looks, list) or len(looks) < 2
                or any(isinstance(n, bool) or not isinstance(n, int) for n in looks)
                or any(b <= a for a, b in zip(looks, looks[1:]))):
            raise ValueError(f"config key sequential.looks: {looks!r}, expected at least two increasing "
                             "numbers of seeds (the last is the cap), e.g. [5, 10, 15, 20, 30]")
        n_seeds = len(config.get("seeds") or [])
        if looks[0] != n_seeds:
            raise ValueError(f"config key sequential.looks: starts at {looks[0]}, but look 1 is the grid as "
                             f"configured: its first entry must be the number of seeds ({n_seeds})")
        min_seeds = (config.get("claims") or {}).get("min_seeds", paired.DEFAULTS["min_seeds"])
        if looks[0] < min_seeds:
            raise ValueError(f"config key sequential.looks: starts at {looks[0]} seeds, below claims.min_seeds "
                             f"({min_seeds})")
        spending = given.get("spending", DEFAULT_PLAN["spending"])
        if spending not in SPENDING:
            raise ValueError(f"config key sequential.spending: {spending!r}, expected one of "
                             f"{', '.join(SPENDING)}")
        futility = given.get("futility", DEFAULT_PLAN["futility"])
        if futility is not None and (isinstance(futility, bool) or not isinstance(futility, (int, float))
                                     or not 0 < futility < 1):
            raise ValueError(f"config key sequential.futility: {futility!r}, expected a conditional power "
                             "between 0 and 1 (e.g. 0.1), or null for no futility stop")
        start = given.get("futility_from", DEFAULT_PLAN["futility_from"])
        if isinstance(start, bool) or not isinstance(start, int) or not 2 <= start <= len(looks):
            raise ValueError(f"config key sequential.futility_from: {start!r}, expected a look between 2 and "
                             f"{len(looks)}")
        gamma = given.get("gamma", DEFAULT_PLAN["gamma"])
        if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not math.isfinite(gamma):
            raise ValueError(f"config key sequential.gamma: {gamma!r}, expected a finite number")
        return cls(tuple(looks), spending, float(gamma), None if futility is None else float(futility), start)

    @property
    def cap(self) -> int:
        return self.looks[-1]

    def spent(self, alpha: float, t: float) -> float:
        return alpha if t >= 1 else SPENDING[self.spending].function(alpha, t, self.gamma)

    def as_dict(self) -> dict:
        return {**asdict(self), "looks": list(self.looks)}

    def fingerprint(self) -> str:
        """The plan's identity: a run whose plan changes after its first look is refused (linvit decide)."""
        return hashlib.sha256(json.dumps(self.as_dict(), sort_keys=True).encode()).hexdigest()[:16]


_T_PATHS = 400_000  # t_alpha's simulated paths; both tails: a one-sided 1.25% to +-1% (relative)


@functools.lru_cache(maxsize=8)
def _t_paths(looks: tuple[int, ...]) -> np.ndarray:
    """Paired t statistics of normal seeds at each look, one path per row, and their negatives (both tails)."""
    rng = np.random.default_rng(47)
    n = np.array(looks)
    parts = []
    for _ in range(4):  # in chunks: (paths x cap) normals at once would be large
        x = rng.standard_normal((_T_PATHS // 4, looks[-1]))
        s, s2 = np.cumsum(x, axis=1)[:, n - 1], np.cumsum(x * x, axis=1)[:, n - 1]
        mean = s / n
        parts.append(mean / np.sqrt((s2 - n * mean * mean) / (n - 1) / n))
    t = np.concatenate(parts)
    return np.concatenate([t, -t])


@functools.lru_cache(maxsize=256)
def _t_alpha(looks: tuple[int, ...], spending: str, gamma: float, alpha: float) -> float:
    paths = _t_paths(looks)
    plan = Plan(looks, spending, gamma, None)
    fractions = [n / looks[-1] for n in looks]

    def error(a):
        c = [t_critical(z, n - 1) for z, n in zip(boundaries(fractions, a, plan), looks)]
        return float(np.mean((paths >= np.array(c)).any(axis=1)))

    target = alpha - 2 * math.sqrt(alpha * (1 - alpha) / len(paths))  # two Monte Carlo SEs to spare
    if error(alpha) <= target:
        return alpha
    low, high = alpha / 4, alpha  # error(low) <= target: bisection on the log scale to 0.1%
    while high / low > 1.001:
        mid = math.sqrt(low * high)
        low, high = (mid, high) if error(mid) <= target else (low, mid)
    return low


def t_alpha(alpha: float, plan: Plan) -> float:
    """The alpha whose boundaries, converted to t (t_critical, n_k - 1 degrees of freedom), cross with
    probability `alpha` for a paired t statistic of normal seeds at the plan's looks (see the module doc).
    Calibrated at the planned fractions n_k / cap, which are exactly the fractions sequential_test estimates
    with seeds alone (the per-seed variance cancels). With an images' part the estimated fractions spend a
    little more where T is large, but n_k - 1 degrees of freedom are conservative there by more; converting at
    a look's effective degrees of freedom would not be (linvit.claims.sequential_simulation.images_part_table
    and docs/statistics.md, "The t conversion, and its correction")."""
    if alpha <= 0 or len(plan.looks) < 2:
        return alpha
    return _t_alpha(tuple(plan.looks), plan.spending, float(plan.gamma), float(alpha))


@dataclass
class Look:
    """One look of a sequential test: its seeds, estimate and repeated interval, the statistic T on the
    hold side's scale (positive toward holding), both sides' boundaries on that scale (t), the
    information fraction, the conditional power at the cap, and the outcome at this look."""

    look: int
    seeds: int
    estimate: float
    low: float
    high: float
    statistic: float
    hold_bound: float
    fail_bound: float
    fraction: float
    power: float
    outcome: str
    note: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class SequentialResult:
    """A test over its looks: the final outcome (holds, fails, continues, undecided within the cap),
    the look it stopped at (0 while it continues), the level of its repeated intervals, and every look."""

    outcome: str
    stopped: int
    level: float
    looks: list[Look] = field(default_factory=list)

    @property
    def last(self) -> Look | None:
        return self.looks[-1] if self.looks else None


def _parts(sample: Sample, numerator, denominator, threshold: float):
    """(estimate of the contrast num - threshold x den, its per-seed variance, its images' part, the
    denominator's mean and SE, the ratio's moments) for one look's sample."""
    n, _, means, seed, image = contrast_moments(sample, numerator, denominator)
    w = np.array([1.0, -threshold] if denominator is not None else [1.0])
    # A difference's contrast is num - threshold (a share's num - threshold x den, already in w).
    mean = float(w @ means) - (threshold if denominator is None else 0.0)
    return n, means, seed + image, mean, n * float(w @ seed @ w), max(float(w @ image @ w), 0.0)


def _established(means, cov, q: float) -> bool:
    """A share's denominator (the benefit) clearly positive at critical value q: b - q x SE(b) > 0."""
    return math.isfinite(q) and float(means[1]) - q * math.sqrt(max(float(cov[1, 1]), 0.0)) > 0


def _interval(means, cov, ratio: bool, q_low: float, q_high: float) -> tuple[float, float]:
    """The values not rejected below (at q_low) and above (at q_high): t bounds, or Fieller's for a ratio."""
    if not ratio:
        se = math.sqrt(max(float(cov[0, 0]), 0.0))
        return float(means[0]) - q_low * se, float(means[0]) + q_high * se
    a, b = float(means[0]), float(means[1])

    def fieller(q):
        qa = b * b - q * q * cov[1, 1]
        qb = -2 * (a * b - q * q * cov[0, 1])
        qc = a * a - q * q * cov[0, 0]
        disc = qb * qb - 4 * qa * qc
        if math.isfinite(q) and b > 0 and qa > 0 and disc >= 0:
            root = math.sqrt(disc)
            return (-qb - root) / (2 * qa), (-qb + root) / (2 * qa)
        return -math.inf, math.inf

    return fieller(q_low)[0], fieller(q_high)[1]


def sequential_test(samples: Sequence[Sample], numerator, denominator, threshold: float, side: str,
                    plan: Plan, alpha: float, fail_alpha: float, fractions: Sequence[float] = ()) -> SequentialResult:
    """Read a test at its looks. `samples[k]` is look k + 1's paired sample (its first looks[k] seeds, or fewer
    where a run could not finish: the look's fraction and degrees of freedom are then those of the seeds it
    has); fewer samples than looks: the later looks have not run. `fractions`: information fractions of earlier
    looks as recorded (else computed from each look's own sample). Stops at the first look that decides
    (or, from plan.futility_from on, whose conditional power at the cap is below plan.futility)."""
    if side not in ("<=", ">="):
        raise ValueError(f"side must be '<=' or '>=', got {side!r}")
    sign = -1.0 if side == "<=" else 1.0  # on the hold side's scale: positive toward holding
    ratio = denominator is not None
    result = SequentialResult(CONTINUES, 0, 1 - alpha - fail_alpha)
    ts: list[float] = []
    for k, sample in enumerate(samples[:len(plan.looks)]):
        n, means, cov, mean, per_seed, image = _parts(sample, numerator, denominator, threshold)
        if not 2 <= n <= plan.looks[k]:
            raise ValueError(f"look {k + 1} has at most {plan.looks[k]} paired seeds and at least 2, its sample "
                             f"has {n}")
        n_k = n  # a run that could not finish leaves its look fewer seeds: spent at the information it has
        if k < len(fractions):
            t = float(fractions[k])
        elif k == len(plan.looks) - 1:
            t = 1.0
        else:
            info_now = per_seed / n_k + image
            t = (per_seed / plan.cap + image) / info_now if info_now > 0 else n_k / plan.cap
            # Information only grows: a look whose variance estimate moved keeps a little above the last, and
            # below 1 by 1e-3 for each look after it (images-dominated: equal fractions would divide by zero).
            t = min(max(t, (ts[-1] if ts else 0.0) + 1e-3), 1 - 1e-3 * (len(plan.looks) - 1 - k))
            # To 1e-3: a boundary moves by far less than a seed's worth, and equal fractions share one
            # integration (the calibration reads thousands of tests).
            t = round(t, 3)
        ts.append(t)
        df = float(n_k - 1)
        a_hold, a_fail = t_alpha(alpha, plan), t_alpha(fail_alpha, plan)
        z_hold, z_fail = boundaries(ts, a_hold, plan)[-1], boundaries(ts, a_fail, plan)[-1]
        c_hold, c_fail = t_critical(z_hold, df), t_critical(z_fail, df)
        w = np.array([1.0, -threshold] if ratio else [1.0])
        se = math.sqrt(max(float(w @ cov @ w), 0.0))
        estimate = float(means[0] / means[1]) if ratio and means[1] != 0 else float(means[0])
        power = math.nan
        if not se > paired.ZERO_SE:
            # A t test with a zero variance estimate has no error rate: this look tests nothing.
            outcome = FUTILE if k == len(plan.looks) - 1 else CONTINUES
            result.looks.append(Look(k + 1, n_k, estimate, math.nan, math.nan, math.nan, c_hold, c_fail, t, power,
                                     outcome, paired.NO_TEST))
            if outcome != CONTINUES:
                result.outcome, result.stopped = outcome, k + 1
                break
            continue
        statistic = sign * mean / se
        # The repeated interval: the statistic's side toward holding is bounded by the hold boundary.
        q_low, q_high = (c_fail, c_hold) if side == "<=" else (c_hold, c_fail)
        low, high = _interval(means, cov, ratio, q_low, q_high)
        # A share decides on a side only where its interval is bounded on that side: its denominator (the
        # benefit) established positive at that side's own critical value (Fieller's interval at q is
        # bounded exactly when b > q x SE(b)), so a decision and its repeated interval always agree.
        hold_ok, fail_ok = (_established(means, cov, c_hold), _established(means, cov, c_fail)) if ratio \
            else (True, True)
        note = "" if hold_ok and fail_ok else (
            "the denominator (benefit) is not established positive" if not (hold_ok or fail_ok) else
            f"the denominator (benefit) is not established positive at the "
            f"{'hold' if not hold_ok else 'fail'} boundary (that side of its interval is unbounded)")
        if hold_ok and statistic >= c_hold:
            outcome = paired.HOLDS
        elif fail_ok and statistic <= -c_fail:
            outcome = paired.FAILS
        elif k == len(plan.looks) - 1:
            outcome = FUTILE
            note = note or "reached the cap undecided"
        else:
            # Conditional power at the cap, on the z scale (the statistic by its t significance).
            z_now = float(special.ndtri(special.stdtr(df, statistic))) if math.isfinite(statistic) else statistic
            cap_t = boundaries([*ts, 1.0], a_hold, plan)[-1], boundaries([*ts, 1.0], a_fail, plan)[-1]
            power = conditional_power(z_now, t, *cap_t)
            outcome = CONTINUES
            if plan.futility is not None and k + 1 >= plan.futility_from and power < plan.futility:
                outcome = FUTILE
                note = f"conditional power at the cap {power:.2f} < {plan.futility:g}"
        result.looks.append(Look(k + 1, n_k, estimate, low, high, statistic, c_hold, c_fail, t, power, outcome,
                                 note))
        if outcome != CONTINUES:
            result.outcome, result.stopped = outcome, k + 1
            break
    return result


def fails_at(looks: Sequence[dict], alpha: float, plan: Plan, share: tuple[float, str] | None = None) -> bool:
    """Whether a test's recorded looks (Look.as_dict) fail at a fail side that spends `alpha` (at most the test's
    own) instead of its own: C4 reads each failure at its share of the family's alpha (Bonferroni), on the same
    looks and fractions. Every gate of the test's own decision applies: only a look that failed at the test's own
    fail side can (a look with zero variance tests nothing, a share whose benefit is not established at that side
    decides nothing), and there the statistic must cross the smaller alpha's boundary c and, for a share
    (`share`: its threshold and side), its benefit be established at c too (b - c SE(b) > 0: that side of its
    repeated interval bounded at c). The benefit's t statistic is read back from the look's repeated interval
    (benefit_t), so the recorded looks suffice."""
    fractions = []
    for look in looks:
        fractions.append(look["fraction"])
        if look["outcome"] != paired.FAILS:  # the test's own gates: it did not fail here at its own alpha
            continue
        c = t_critical(boundaries(fractions, t_alpha(alpha, plan), plan)[-1], look["seeds"] - 1)
        if not look["statistic"] <= -c:
            continue
        # At the test's own boundary its gate was this look's; past it, the benefit must be established at c.
        if share is None or c <= look["fail_bound"] or benefit_t(look, *share) > c:
            return True
    return False


def benefit_t(look: dict, threshold: float, side: str) -> float:
    """A share's benefit b / SE(b) at a recorded look, from its estimate r, repeated interval and statistic T.
    With g(R) = var(num - R den) / den^2 (a quadratic in R whose leading coefficient is (SE(b) / b)^2), Fieller's
    bounds at critical value q solve (r - R)^2 = q^2 g(R), and T^2 = (r - threshold)^2 / g(threshold): three
    values of g, which fix it. 0 where the interval is unbounded on a side (the benefit is not established at
    that side's critical value) or the look has no statistic."""
    r, low, high, t = look["estimate"], look["low"], look["high"], look["statistic"]
    if not all(math.isfinite(x) for x in (r, low, high, t)) or t == 0:
        return 0.0
    q_low, q_high = ((look["fail_bound"], look["hold_bound"]) if side == "<="
                     else (look["hold_bound"], look["fail_bound"]))
    points = [(low, (r - low) ** 2 / q_low ** 2), (high, (r - high) ** 2 / q_high ** 2),
              (threshold, (r - threshold) ** 2 / t ** 2)]
    (x0, g0), (x1, g1), (x2, g2) = points
    if len({x0, x1, x2}) < 3:
        return 0.0
    curvature = ((g2 - g1) / (x2 - x1) - (g1 - g0) / (x1 - x0)) / (x2 - x0)  # (SE(b) / b)^2
    return 1 / math.sqrt(curvature) if curvature > 0 else math.inf


def combine(results: Sequence[SequentialResult]) -> str:
    """A claim whose deciding tests must all hold, read sequentially: fails as soon as one test fails (each
    fails at its fail_alpha, the claim's alpha split over its tests), holds when every one held, continues
    while one continues, else undecided within the cap."""
    outcomes = [r.outcome for r in results]
    if paired.FAILS in outcomes:
        return paired.FAILS
    if outcomes and all(o == paired.HOLDS for o in outcomes):
        return paired.HOLDS
    return CONTINUES if CONTINUES in outcomes else FUTILE


def look_sample(sample: Sample, seeds: Sequence[int]) -> Sample | None:
    """The part of a paired sample on exactly `seeds` (a look's), None when one of them is not paired yet."""
    index = {s: i for i, s in enumerate(sample.seeds)}
    if any(s not in index for s in seeds):
        return None
    rows = [index[s] for s in seeds]
    return Sample({r: m[rows] for r, m in sample.matrices.items()}, list(seeds), sample.images, sample.mode)
