"""The sequential design's calibration by simulation: the experiments behind coverage_sequential.csv and
the checks of the t conversion, at the thresholds and with an images' part. What they run and what they
found: linvit.claims.calibration_sequential, which prints them (and regenerates the packaged table).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from linvit.claims.calibration import SCENARIOS, TEACHER_SD, Scenario, _claim_true, _simulate, _truth
from linvit.claims.table import CLAIMS, Thresholds
from linvit.config import PER_SEED
from linvit.stats import boundaries, multitest, paired, pairing, sequential
from linvit.stats.spending import SPENDING

LOOKS = (5, 10, 15, 20, 30)
ALPHA = 0.025
EXPERIMENTS = 2000  # Monte Carlo error of a 2.5% rate +-0.35%, of a 95% coverage +-0.5%
FUTILITY = (0.1, None)  # the default rule, and none
DISTANCES = (-2, -1, 1, 2)  # SEs at the cap from the threshold (positive: the claim's side); 0 is `at`
SE_EXPERIMENTS = 200  # the SE at the cap: the root mean square of the engine's own SE over these
COLUMNS = ["scenario", "images", "experiments", "looks", "spending", "futility", "statistic", "claim", "truth",
           "threshold", "side", "claim_true", "distance_se", "alpha_holds", "alpha_fails", "level", "coverage",
           "unbounded",
           "wrong_holds", "wrong_fails", "holds", "fails", "undecided", "mean_seeds", "mean_jobs", "fixed_jobs",
           "naive_coverage", "naive_wrong_holds", "naive_wrong_fails", "naive_mean_seeds", "fixed_holds",
           "fixed_fails"]
# The t conversion's check: looks of the default plan, of a short grid and of two looks only.
T_CHECK_LOOKS = ((5, 10, 15, 20, 30), (3, 6, 9, 12), (5, 10))
T_CHECK_PATHS = 1_000_000


@dataclass(frozen=True)
class Deciding:
    """A deciding test of CLAIMS as the simulation runs it."""

    claim: str
    name: str
    statistic: object  # claims.Statistic
    numerator: dict
    denominator: dict | None
    threshold: float
    side: str
    fail_alpha: float

    @property
    def roles(self) -> list[str]:
        return self.statistic.roles

    @property
    def sign(self) -> float:
        """+1 where the claim holds above its threshold, -1 below."""
        return 1.0 if self.side == ">=" else -1.0


def deciding_tests(thresholds: Thresholds | None = None) -> list[Deciding]:
    thresholds = thresholds or Thresholds()
    return [Deciding(claim.name, t.statistic.name, t.statistic, dict(t.statistic.numerator),
                     dict(t.statistic.denominator) if t.statistic.denominator else None,
                     thresholds.value(t.threshold), t.side, ALPHA / len(claim.deciding))
            for claim in CLAIMS for t in claim.deciding]


def se_at_cap(scenario: Scenario, tests: list[Deciding], cap: int, experiments: int = SE_EXPERIMENTS,
              seed: int = 1) -> dict[str, float]:
    """Per test, the SE of its contrast num - threshold x den at the cap (the root mean square of the
    engine's estimate: per-seed variance / cap + the images' part)."""
    rng = np.random.default_rng(seed)
    total = dict.fromkeys((t.name for t in tests), 0.0)
    for _ in range(experiments):
        sample = _simulate(rng, scenario, cap, None, (PER_SEED,), TEACHER_SD)[0][0]
        for t in tests:
            *_, per_seed, image = sequential._parts(sample, t.numerator, t.denominator, t.threshold)
            total[t.name] += per_seed / cap + image
    return {name: math.sqrt(v / experiments) for name, v in total.items()}


def _moved_role(test: Deciding, tests: list[Deciding]) -> str:
    """The role of the test's numerator that neither its denominator nor another deciding test uses."""
    others = {r for t in tests if t is not test for r in t.roles} | set(test.denominator or ())
    free = [r for r in test.numerator if r not in others]
    if not free:
        raise ValueError(f"{test.name}: every role of its numerator is shared; cannot move it alone")
    return free[0]


def distance_scenarios(tests: list[Deciding], distances=DISTANCES, cap: int = LOOKS[-1],
                       base: str = "at") -> tuple[dict[str, Scenario], dict[str, float]]:
    """`base` (every deciding truth at its threshold) with every deciding test moved d SEs at the cap toward
    its claim's side (d > 0) or away (d < 0), one scenario per d; and the SEs used (measured on `base`)."""
    sc = SCENARIOS[base]
    se = se_at_cap(sc, tests, cap)
    out = {}
    for d in distances:
        roles = dict(sc.roles)
        for t in tests:
            role = _moved_role(t, tests)
            mu, sd = roles[role]
            # The contrast moves by weight x shift: d x SE toward the claim's side.
            roles[role] = (mu + t.sign * d * se[t.name] / t.numerator[role], sd)
        out[f"{d:+d} SE"] = replace(sc, roles=roles, about=f"`{base}` with every deciding test {d:+d} SE(cap) "
                                                            "from its threshold")
    return out, se


def _naive(results: list[paired.TestResult], fail_alpha: float) -> tuple[str, int]:
    """The fixed-n test read at each look: (its outcome at the first look that decides, else the last's; that
    look, 0-based), holding at alpha and failing at `fail_alpha`."""
    for k, r in enumerate(results):
        if r.outcome == paired.HOLDS:
            return paired.HOLDS, k
        if r.p_fails <= fail_alpha:  # NaN (no valid test) never fails
            return paired.FAILS, k
    return paired.INCONCLUSIVE, len(results) - 1


def _claim_path(results: list[sequential.SequentialResult], looks: int) -> tuple[str, int]:
    """A claim read by sequential.combine look by look: (its outcome, the look (0-based) it was decided at)."""
    for k in range(looks):
        outcome = sequential.combine([r if r.stopped <= k + 1 else sequential.SequentialResult(
            sequential.CONTINUES, 0, r.level) for r in results])
        if outcome != sequential.CONTINUES:
            return outcome, k
    return sequential.combine(results), looks - 1


def _jobs(stops: dict[str, int], tests: list[Deciding], looks: tuple[int, ...]) -> float:
    """Training jobs: each role its seeds as long as a test that needs it ran, and a teacher per seed."""
    seeds: dict[str, int] = {}
    for t in tests:
        for role in t.roles:
            seeds[role] = max(seeds.get(role, 0), looks[stops[t.name]])
    return sum(seeds.values()) + max(looks[s] for s in stops.values())


def _experiment(samples, tests: list[Deciding], claims: dict[str, list[Deciding]], plans: dict,
                truths: dict[str, float], looks: tuple[int, ...], settings: paired.Settings) -> dict:
    """One experiment's readings, keyed (what, statistic): "seq" per futility setting (outcome, look, covered
    or jobs), "naive" (outcome, look, covered) and "fixed" (the outcome at the cap)."""
    out = {}
    for f, plan in plans.items():
        results = {t.name: sequential.sequential_test(samples, t.numerator, t.denominator, t.threshold, t.side,
                                                      plan, ALPHA, t.fail_alpha) for t in tests}
        for t in tests:
            r = results[t.name]
            out[f, t.name] = (r.outcome, r.stopped - 1, r.looks[-1].low <= truths[t.name] <= r.looks[-1].high)
            out[f, t.name, "unbounded"] = not (math.isfinite(r.looks[-1].low) and math.isfinite(r.looks[-1].high))
        for c, parts in claims.items():
            outcome, k = _claim_path([results[t.name] for t in parts], len(looks))
            stops = {t.name: min(results[t.name].stopped - 1, k) for t in parts}
            out[f, c] = (outcome, k, _jobs(stops, parts, looks))
    fixed = {t.name: [paired.test(x, t.numerator, t.denominator, t.threshold, t.side, settings) for x in samples]
             for t in tests}
    for t in tests:
        outcome, k = _naive(fixed[t.name], t.fail_alpha)
        e = fixed[t.name][k].estimate
        out["naive", t.name] = (outcome, k, e.low <= truths[t.name] <= e.high)
        out["fixed", t.name] = _naive(fixed[t.name][-1:], t.fail_alpha)[0]
    for c, parts in claims.items():  # by multitest.combine at each look, as the report reads a claim
        for k in range(len(looks)):
            outcome = multitest.combine([fixed[t.name][k] for t in parts], settings)
            if outcome in (paired.HOLDS, paired.FAILS):
                break
        out["naive", c] = (outcome, k, math.nan)
        out["fixed", c] = multitest.combine([fixed[t.name][-1] for t in parts], settings)
    return out


def sequential_table(experiments: int = EXPERIMENTS, seed: int = 0, scenarios: dict[str, Scenario] | None = None,
                     looks: tuple[int, ...] = LOOKS, futility=FUTILITY, images: int | None = None,
                     distances=DISTANCES, spending: str = sequential.DEFAULT_PLAN["spending"],
                     log=None) -> pd.DataFrame:
    """The calibration table (see the module doc). `scenarios`: by default calibration.SCENARIOS and the
    `distances` scenarios; `images`: a test-set size for every scenario (default: each its own). The fixed_*
    columns: the fixed-n test (a claim: multitest.combine) on all the cap's seeds, a fixed design's verdict."""
    tests = deciding_tests()
    settings = paired.Settings()
    plans = {f: sequential.Plan(tuple(looks), spending, futility=f) for f in futility}
    if scenarios is None:
        scenarios = {**SCENARIOS, **distance_scenarios(tests, distances, looks[-1])[0]}
    claims = {c.name: [t for t in tests if t.claim == c.name] for c in CLAIMS}
    names = [*(t.name for t in tests), *claims]
    rows = []
    for index, (name, sc) in enumerate(scenarios.items()):
        started = time.time()
        sc = sc if images is None else replace(sc, images=images)
        rng = np.random.default_rng([seed, index])  # each scenario its own stream
        truths = {t.name: _truth(t.statistic, sc.roles) for t in tests}
        true = {t.name: _claim_true(truths[t.name], t.threshold, t.side) for t in tests}
        true.update({c: all(true[t.name] for t in parts) for c, parts in claims.items()})
        se = se_at_cap(sc, tests, looks[-1])
        runs = []
        for _ in range(experiments):
            full = _simulate(rng, sc, looks[-1], None, (PER_SEED,), TEACHER_SD)[0][0]
            samples = [sequential.look_sample(full, list(range(n))) for n in looks]
            runs.append(_experiment(samples, tests, claims, plans, truths, looks, settings))
        common = {"scenario": name, "images": sc.images, "experiments": experiments,
                  "looks": "/".join(map(str, looks)), "spending": spending}
        for f in plans:
            for s in names:
                test = next((t for t in tests if t.name == s), None)
                seq, naive = [r[f, s] for r in runs], [r["naive", s] for r in runs]
                fixed = [r["fixed", s] for r in runs]
                row = {**common, **_rates(seq, naive, true[s], looks, experiments), "futility": _futility(f),
                       "statistic": s, "claim": test.claim if test else s, "claim_true": true[s],
                       "fixed_holds": fixed.count(paired.HOLDS) / experiments,
                       "fixed_fails": fixed.count(paired.FAILS) / experiments, "alpha_holds": ALPHA}
                if test:
                    per_seed = len(test.roles) + 1
                    row.update(truth=truths[s], threshold=test.threshold, side=test.side,
                               distance_se=_distance(test, truths[s], sc, se), alpha_fails=test.fail_alpha,
                               level=1 - ALPHA - test.fail_alpha, coverage=np.mean([c for *_, c in seq]),
                               unbounded=np.mean([r[f, s, "unbounded"] for r in runs]),
                               naive_coverage=np.mean([c for *_, c in naive]),
                               mean_jobs=np.mean([looks[k] for _, k, _ in seq]) * per_seed,
                               fixed_jobs=looks[-1] * per_seed)
                else:
                    roles = {r for t in claims[s] for r in t.roles}
                    row.update(side="all hold", alpha_fails=ALPHA, mean_jobs=np.mean([j for *_, j in seq]),
                               fixed_jobs=looks[-1] * (len(roles) + 1))
                rows.append(row)
        if log:
            log(f"{name}: {experiments} experiments in {time.time() - started:.0f} s")
    return pd.DataFrame(rows, columns=COLUMNS)


def _rates(runs, naive, true: bool, looks, experiments: int) -> dict:
    outcomes = [o for o, *_ in runs]
    return {"wrong_holds": 0.0 if true else outcomes.count(paired.HOLDS) / experiments,
            "wrong_fails": outcomes.count(paired.FAILS) / experiments if true else 0.0,
            "holds": outcomes.count(paired.HOLDS) / experiments, "fails": outcomes.count(paired.FAILS) / experiments,
            "undecided": 1 - (outcomes.count(paired.HOLDS) + outcomes.count(paired.FAILS)) / experiments,
            "mean_seeds": float(np.mean([looks[k] for _, k, *_ in runs])),
            "naive_wrong_holds": 0.0 if true else [o for o, *_ in naive].count(paired.HOLDS) / experiments,
            "naive_wrong_fails": [o for o, *_ in naive].count(paired.FAILS) / experiments if true else 0.0,
            "naive_mean_seeds": float(np.mean([looks[k] for _, k, *_ in naive]))}


def _futility(f) -> str:
    return "none" if f is None else f"{f:g}"


def _distance(test: Deciding, truth: float, sc: Scenario, se: dict[str, float]) -> float:
    """(truth - threshold) toward the claim's side, in SEs of the contrast at the cap (a share's: x the benefit)."""
    scale = sum(w * sc.roles[r][0] for r, w in test.denominator.items()) if test.denominator else 1.0
    return test.sign * (truth - test.threshold) * scale / se[test.name]


AT_THRESHOLD_EXPERIMENTS = 20_000  # per test 20,000 paths a side: a 2.5% rate to +-0.11%, 1.25% to +-0.08%
AT_THRESHOLD_SEED = 55  # the check's own draws (the 12,000 before it were generator seed 2024's)


def at_threshold(experiments: int = AT_THRESHOLD_EXPERIMENTS, seed: int = AT_THRESHOLD_SEED,
                 looks: tuple[int, ...] = LOOKS, spending: str = sequential.DEFAULT_PLAN["spending"],
                 log=None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Scenario `at` (every deciding truth exactly at its threshold), no futility, every deciding test through
    sequential.sequential_test on the same draws: (the rates by look, pooled over the tests of each fail alpha,
    `at_threshold_by_look`'s; the check, `threshold_check`'s: per test and pooled, how often it held and failed
    over the whole sequence against its alpha + 2 Monte Carlo SEs)."""
    tests = deciding_tests()
    plan = sequential.Plan(tuple(looks), spending, futility=None)
    rng = np.random.default_rng(seed)
    counts: dict = {}  # (test, look) -> the fractions' sum, tests read at that look, holds and fails there
    started = time.time()
    for e in range(experiments):
        full = _simulate(rng, SCENARIOS["at"], looks[-1], None, (PER_SEED,), TEACHER_SD)[0][0]
        samples = [sequential.look_sample(full, list(range(n))) for n in looks]
        for t in tests:
            r = sequential.sequential_test(samples, t.numerator, t.denominator, t.threshold, t.side, plan, ALPHA,
                                           t.fail_alpha)
            for look in r.looks:
                c = counts.setdefault((t.name, look.look), {"fraction": 0.0, "n": 0, "holds": 0, "fails": 0})
                c["fraction"] += look.fraction
                c["n"] += 1
            if r.outcome in (paired.HOLDS, paired.FAILS):
                counts[t.name, r.stopped][r.outcome] += 1
        if log and (e + 1) % 2000 == 0:
            log(f"{e + 1:,} experiments in {time.time() - started:.0f} s")
    empty = {"fraction": 0.0, "n": 0, "holds": 0, "fails": 0}
    rows = []
    for fail_alpha in sorted({t.fail_alpha for t in tests}):
        group = [t.name for t in tests if t.fail_alpha == fail_alpha]
        paths = experiments * len(group)
        held = failed = 0
        for k in range(1, len(looks) + 1):
            c = [counts.get((name, k), empty) for name in group]
            held, failed = held + sum(x["holds"] for x in c), failed + sum(x["fails"] for x in c)
            n = sum(x["n"] for x in c)
            t = sum(x["fraction"] for x in c) / n if n else 1.0
            rows.append({"fail_alpha": fail_alpha, "paths": paths, "look": k, "seeds": looks[k - 1],
                         "mean_fraction": t, "holds": held / paths, "holds_allowed": plan.spent(ALPHA, t),
                         "fails": failed / paths, "fails_allowed": plan.spent(fail_alpha, t)})
    check = []
    groups = [([t], f"{t.name} ({t.claim})") for t in tests] + [
        ([t for t in tests if t.fail_alpha == a], "C1, C2's shares pooled" if a < ALPHA else "C3's difference")
        for a in sorted({t.fail_alpha for t in tests}) if sum(t.fail_alpha == a for t in tests) > 1]
    for group, name in groups:
        paths = experiments * len(group)
        row = {"tests": name, "paths": paths}
        for side, alpha in (("holds", ALPHA), ("fails", group[0].fail_alpha)):
            k = sum(counts.get((t.name, look), empty)[side] for t in group for look in range(1, len(looks) + 1))
            rate, se = k / paths, math.sqrt(alpha * (1 - alpha) / paths)
            row.update({side: rate, f"{side}_alpha": alpha, f"{side}_se": se, f"{side}_ok": rate <= alpha + 2 * se})
        check.append(row)
    return pd.DataFrame(rows), pd.DataFrame(check)


def at_threshold_by_look(experiments: int = 12_000, seed: int = 2024, looks: tuple[int, ...] = LOOKS,
                         spending: str = sequential.DEFAULT_PLAN["spending"]) -> pd.DataFrame:
    """Scenario `at` (every deciding truth exactly at its threshold), no futility: per look, how often the
    tests have held and failed by then, pooled over the tests of each fail alpha (C1 and C2's four shares at
    1.25%, C3's difference at 2.5%), against what the spending function allows at that look's mean fraction.
    Exactly at the threshold both rates are the design's own alpha (spent to that look) by construction."""
    return at_threshold(experiments, seed, looks, spending)[0]


IMAGES_SHARES = (0.0, 0.1, 0.3)  # the test images' share of a contrast's variance at the cap


def images_part_table(paths: int = 3000, seed: int = 7, looks: tuple[int, ...] = LOOKS, shares=IMAGES_SHARES,
                      images: int = 200, spending: str = sequential.DEFAULT_PLAN["spending"]) -> pd.DataFrame:
    """A difference exactly at its threshold whose variance at the cap is `share` test images' (an effect per
    image that every seed shares, so the same at every look) and the rest normal seed noise, through
    sequential.sequential_test with alpha 2.5% a side: how often it held and failed, with each look's fraction
    estimated from its own variance (the engine's) and, on the same draws, at its true value (passed in as
    recorded fractions). With seeds alone the two are the same (the per-seed variance cancels in the
    fraction); with an images' part a look whose variance came out low both has a larger T and spends more."""
    plan = sequential.Plan(tuple(looks), spending, futility=None)
    cap, rng, rows = looks[-1], np.random.default_rng(seed), []
    for share in shares:
        w = share / (1 - share) / cap  # the images' part of the mean's variance, the per-seed variance 1
        true = [round((1 / cap + w) / (1 / n + w), 3) for n in looks[:-1]]
        counts = {(mode, side): 0 for mode in ("estimated", "true") for side in (paired.HOLDS, paired.FAILS)}
        for _ in range(paths):
            values = rng.standard_normal((cap, 1)) + math.sqrt(w * images) * rng.standard_normal(images)
            full = pairing.Sample({"a": values, "b": np.zeros_like(values)}, list(range(cap)), images,
                                pairing.SEEDS_AND_IMAGES)
            samples = [sequential.look_sample(full, list(range(n))) for n in looks]
            for mode, fractions in (("estimated", ()), ("true", true)):
                r = sequential.sequential_test(samples, {"a": 1.0, "b": -1.0}, None, 0.0, ">=", plan, ALPHA, ALPHA,
                                               fractions)
                if r.outcome in (paired.HOLDS, paired.FAILS):
                    counts[mode, r.outcome] += 1
        rows.append({"share": share, "paths": paths, "fractions_true": "/".join(f"{t:.3f}" for t in true),
                     **{f"{mode}_{side}": k / paths for (mode, side), k in counts.items()},
                     "mc": math.sqrt(ALPHA * (1 - ALPHA) / paths)})
    return pd.DataFrame(rows)


def t_conversion_table(paths: int = T_CHECK_PATHS, seed: int = 1, looks_list=T_CHECK_LOOKS,
                       alphas=(ALPHA, ALPHA / 2)) -> pd.DataFrame:
    """How often one side's t boundaries are crossed by a paired t statistic of normal seeds (the fewest
    degrees of freedom: the worst case for the conversion) under each spending function: converted from z at
    alpha as is ("plain"), and at sequential.t_alpha's lowered alpha ("corrected"). By simulation with its own
    generator (not t_alpha's paths), both tails counted."""
    rows = []
    for looks in looks_list:
        n = np.array(looks)
        rng = np.random.default_rng(seed)
        hits: dict = {}
        for _ in range(max(paths // 100_000, 1)):
            x = rng.standard_normal((min(paths, 100_000), looks[-1]))
            s, s2 = np.cumsum(x, axis=1)[:, n - 1], np.cumsum(x * x, axis=1)[:, n - 1]
            mean = s / n
            t = mean / np.sqrt((s2 - n * mean * mean) / (n - 1) / n)
            for spending in SPENDING:
                plan = sequential.Plan(looks, spending)
                for alpha in alphas:
                    for name, a in (("plain", alpha), ("corrected", sequential.t_alpha(alpha, plan))):
                        c = np.array([boundaries.t_critical(z, m - 1) for z, m in
                                      zip(boundaries.boundaries(n / looks[-1], a, plan), looks)])
                        key = (spending, alpha, name)
                        hits[key] = hits.get(key, 0) + int((t >= c).any(axis=1).sum() + (t <= -c).any(axis=1).sum())
        total = 2 * max(paths // 100_000, 1) * min(paths, 100_000)
        for (spending, alpha, name), k in hits.items():
            if name == "plain":
                rows.append({"looks": "/".join(map(str, looks)), "spending": spending,
                             "gamma": sequential.Plan(looks, spending).gamma, "alpha": alpha,
                             "plain": k / total, "corrected": hits[spending, alpha, "corrected"] / total,
                             "t_alpha": sequential.t_alpha(alpha, sequential.Plan(looks, spending)),
                             "mc": math.sqrt(alpha * (1 - alpha) / total)})
    return pd.DataFrame(rows)


