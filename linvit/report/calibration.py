"""The verdicts' calibration: simulated grids whose truth is known, judged by the claims' own tests.

Each scenario gives every role a population accuracy mu_r and a seed-to-seed SD sigma_r. One
simulated experiment draws, per role and seed, a model accuracy q = mu_r + sigma_r x N(0, 1) (part of
the N(0, 1) can be shared by the roles of a seed: `Scenario.shared`), and per test image a difficulty
z_i ~ N(0, 1) that every model shares; model (r, s) is right on image i when
rho z_i + sqrt(1 - rho^2) e_rsi < Phi^-1(q), so roles agree on most images, as trained models do, and
the expected accuracy over images is exactly q. The truth of a difference is then mu_a - mu_b, and of a
share (mu_a - mu_b) / (mu_top - mu_bottom); each experiment draws new seeds and new test images. Every
test of linvit.report.claims.CLAIMS runs on each experiment through linvit.report.stats, exactly as
the report runs it.

Reported per (scenario, seeds, statistic): how often the `level` interval covers the truth; how often
a verdict is wrong (holds where the truth is on the fails side, or fails where it is on the claim's
side; a truth exactly at the threshold counts as the claim being true); how often a test decides at
all; and the median minimum detectable effect. The rows named C1 and C2 judge the claims' combined
verdicts (stats.combine).

    python -m linvit.report.calibration      # regenerates linvit/report/coverage.csv, prints the table
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import special

from linvit.report import stats
from linvit.report.claims import CLAIMS, REFERENCE, Thresholds

COVERAGE_CSV = Path(__file__).with_name("coverage.csv")
SEEDS = (3, 5, 10)
EXPERIMENTS = 1000
RHO = 0.8  # how much the roles' errors fall on the same images


@dataclass(frozen=True)
class Scenario:
    images: int
    roles: dict[str, tuple[float, float]] = field(hash=False)  # role -> (mean accuracy, seed-to-seed SD)
    shared: float = 0.0  # the share of a seed's deviation that every role of that seed has in common
    about: str = ""


# "fmnist" and "digits": the means and seed SDs of a reference run (the three-seed default grid of
# 3 December 2026, report/reference), each at its test split's size; copy_attn was not in it, so its
# numbers are made up. "at": every deciding statistic's truth exactly at its threshold, the worst case
# for a wrong "fails" (an exact test is wrong there at its alpha, 2.5%). "beside": every deciding
# statistic's truth just on the fails side, the worst case for a wrong "holds".
SCENARIOS = {
    "fmnist": Scenario(5000, {
        "random": (0.5212, 0.0213), "copy_all": (0.8107, 0.0010), "copy_attn": (0.6500, 0.0300),
        "copy_mlp": (0.7167, 0.0019), "attn_only": (0.6170, 0.0721), "mlp_only": (0.5008, 0.0087),
        "copy_mlp_distill": (0.7874, 0.0057), REFERENCE: (0.8417, 0.0012)},
        about="the reference run's Fashion-MNIST cell (copy_attn made up)"),
    "digits": Scenario(360, {
        "random": (0.4685, 0.0197), "copy_all": (0.8926, 0.0089), "copy_attn": (0.7000, 0.0500),
        "copy_mlp": (0.7843, 0.0526), "attn_only": (0.6991, 0.0658), "mlp_only": (0.5130, 0.0274),
        "copy_mlp_distill": (0.8065, 0.0725), REFERENCE: (0.9417, 0.0173)},
        about="the reference run's digits cell (copy_attn made up)"),
    "at": Scenario(2000, {
        "random": (0.50, 0.02), "copy_all": (0.70, 0.01), "copy_attn": (0.60, 0.02),
        "copy_mlp": (0.65, 0.01), "attn_only": (0.55, 0.04), "mlp_only": (0.60, 0.02),
        "copy_mlp_distill": (0.79, 0.01), REFERENCE: (0.80, 0.01)}, shared=0.5,
        about="every deciding truth exactly at its threshold; half of a seed's deviation shared by its roles"),
    "beside": Scenario(2000, {
        "random": (0.50, 0.02), "copy_all": (0.70, 0.01), "copy_attn": (0.604, 0.02),
        "copy_mlp": (0.646, 0.01), "attn_only": (0.554, 0.04), "mlp_only": (0.596, 0.02),
        "copy_mlp_distill": (0.788, 0.01), REFERENCE: (0.80, 0.01)}, shared=0.5,
        about="every deciding truth just on its fails side (shares by 0.02, the difference by 0.002)"),
}
COLUMNS = ["scenario", "images", "seeds", "experiments", "statistic", "truth", "threshold", "side", "coverage", "wrong",
           "decided", "median_mde"]


def simulate_sample(rng: np.random.Generator, scenario: Scenario | str, n_seeds: int,
                    images: int | None = None) -> stats.Sample:
    """One simulated experiment: per role a (seeds x images) 0/1 correctness matrix (a scenario's own
    number of test images unless `images` says otherwise)."""
    sc = SCENARIOS[scenario] if isinstance(scenario, str) else scenario
    images = sc.images if images is None else images
    roles = list(sc.roles)
    mu, sd = (np.array([sc.roles[r][i] for r in roles])[:, None] for i in (0, 1))
    deviation = (math.sqrt(sc.shared) * rng.standard_normal(n_seeds)
                 + math.sqrt(1 - sc.shared) * rng.standard_normal((len(roles), n_seeds)))
    q = np.clip(mu + sd * deviation, 0.01, 0.99)  # (roles, seeds): each model's expected accuracy
    z = rng.standard_normal(images)
    # Right when RHO z + sqrt(1 - RHO^2) e < Phi^-1(q), i.e. e < cut; float32 normals: half the time.
    cut = ((special.ndtri(q)[:, :, None] - RHO * z) / math.sqrt(1 - RHO * RHO)).astype(np.float32)
    right = rng.standard_normal(cut.shape, dtype=np.float32) < cut
    return stats.Sample({r: right[k].astype(np.float32) for k, r in enumerate(roles)}, list(range(n_seeds)),
                        images, stats.SEEDS_AND_IMAGES)


def _truth(stat, roles: dict[str, tuple[float, float]]) -> float:
    num = sum(w * roles[r][0] for r, w in stat.numerator)
    return num / sum(w * roles[r][0] for r, w in stat.denominator) if stat.denominator else num


def _claim_true(truth: float, threshold: float, side: str) -> bool:
    """Whether the truth satisfies the claim (a truth exactly at the threshold does; 1e-12: rounding)."""
    return truth <= threshold + 1e-12 if side == "<=" else truth >= threshold - 1e-12


def _wrong(outcome: str, true: bool) -> bool:
    return (outcome == stats.HOLDS and not true) or (outcome == stats.FAILS and true)


def coverage_table(seeds=SEEDS, experiments: int = EXPERIMENTS, seed: int = 0,
                   settings: stats.Settings | None = None) -> pd.DataFrame:
    """Per (scenario, seeds, statistic) the coverage of its interval, and for a tested statistic and each
    claim with several deciding tests the rate of wrong verdicts and of decided ones (see the module doc)."""
    settings = settings or stats.Settings()
    thresholds = Thresholds()
    rng = np.random.default_rng(seed)
    tests = [(claim.name, t, (dict(t.statistic.numerator),
                              dict(t.statistic.denominator) if t.statistic.denominator else None))
             for claim in CLAIMS for t in claim.tests]
    rows = []
    for name, sc in SCENARIOS.items():
        truths = {t.statistic.name: _truth(t.statistic, sc.roles) for _, t, _ in tests}
        for n in seeds:
            covered = {s: 0 for s in truths}
            wrong, decided, mde = {}, {}, {}
            combined = {claim.name: [] for claim in CLAIMS if len(claim.deciding) > 1}
            for _ in range(experiments):
                sample = simulate_sample(rng, sc, n)
                deciding = {c: [] for c in combined}
                for claim, t, (num, den) in tests:
                    s = t.statistic.name
                    if t.threshold is None:
                        e = stats.estimate(sample, num, den, settings)
                    else:
                        result = stats.test(sample, num, den, thresholds.value(t.threshold), t.side, settings)
                        e, true = result.estimate, _claim_true(truths[s], result.threshold, t.side)
                        wrong[s] = wrong.get(s, 0) + _wrong(result.outcome, true)
                        decided[s] = decided.get(s, 0) + (result.outcome in (stats.HOLDS, stats.FAILS))
                        mde.setdefault(s, []).append(result.mde)
                        if t.decides and claim in deciding:
                            deciding[claim].append((result, true))
                    covered[s] += e.low <= truths[s] <= e.high
                for claim, parts in deciding.items():
                    combined[claim].append((stats.combine([r for r, _ in parts], settings),
                                            all(true for _, true in parts)))
            for _, t, _ in tests:
                s = t.statistic.name
                tested = t.threshold is not None
                m = [x for x in mde.get(s, []) if math.isfinite(x)]
                rows.append({"scenario": name, "images": sc.images, "seeds": n, "experiments": experiments,
                             "statistic": s,
                             "truth": truths[s], "threshold": thresholds.value(t.threshold) if tested else math.nan,
                             "side": t.side or "", "coverage": covered[s] / experiments,
                             "wrong": wrong[s] / experiments if tested else math.nan,
                             "decided": decided[s] / experiments if tested else math.nan,
                             "median_mde": float(np.median(m)) if m else math.nan})
            for claim, results in combined.items():
                rows.append({"scenario": name, "images": sc.images, "seeds": n, "experiments": experiments,
                             "statistic": claim,
                             "truth": math.nan, "threshold": math.nan, "side": "all hold", "coverage": math.nan,
                             "wrong": sum(_wrong(o, true) for o, true in results) / experiments,
                             "decided": sum(o in (stats.HOLDS, stats.FAILS) for o, _ in results) / experiments,
                             "median_mde": math.nan})
    return pd.DataFrame(rows, columns=COLUMNS)


def coverage_markdown(table: pd.DataFrame | None = None) -> str:
    """The table as markdown (the packaged coverage.csv by default): a summary per seed count, then per
    statistic and scenario the coverage and the wrong verdicts at each seed count."""
    table = pd.read_csv(COVERAGE_CSV) if table is None else table
    table = table.assign(side=table["side"].fillna(""))
    seeds = sorted(int(n) for n in table["seeds"].unique())
    summary = "; ".join(
        f"{n} seeds: lowest coverage {_pct(g['coverage'].min())}, most wrong verdicts {_pct(g['wrong'].max())}"
        for n, g in table.groupby("seeds"))
    head = (["statistic", "scenario (test images)", "truth", "claim"] + [f"coverage {n} seeds" for n in seeds]
            + [f"wrong {n} seeds" for n in seeds])
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (statistic, scenario), g in table.groupby(["statistic", "scenario"], sort=False):
        g = g.set_index("seeds")
        first = g.iloc[0]
        claim = (f"{first['side']} {first['threshold']:+.2f}" if first["side"] in ("<=", ">=")
                 else first["side"] or "")
        cells = [statistic, f"{scenario} ({int(first['images'])})",
                 "" if math.isnan(first["truth"]) else f"{first['truth']:+.3f}", claim.replace("<=", "&le;")
                 .replace(">=", "&ge;")]
        cells += [_pct(g.loc[n, "coverage"]) for n in seeds] + [_pct(g.loc[n, "wrong"]) for n in seeds]
        rows.append("| " + " | ".join(cells) + " |")
    experiments = int(table["experiments"].max())
    return (f"{experiments:,} simulated experiments per scenario and seed count. {summary}. Scenario `at` puts "
            f"every deciding statistic's truth exactly at its threshold, where a test at 2.5% per side is "
            f"wrong 2.5% of the time by construction (+-{100 * math.sqrt(0.025 * 0.975 / experiments):.1f}% of "
            f"Monte Carlo error at {experiments:,} experiments).\n\n" + "\n".join(rows))


def _pct(x) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.1f}%"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=COVERAGE_CSV)
    parser.add_argument("--experiments", type=int, default=EXPERIMENTS)
    args = parser.parse_args(argv)
    table = coverage_table(experiments=args.experiments)
    table.to_csv(args.out, index=False, float_format="%.6g")
    print(coverage_markdown(table))


if __name__ == "__main__":
    main()
