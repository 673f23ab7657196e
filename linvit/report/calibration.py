"""The verdicts' calibration: simulated grids whose truth is known, judged by the claims' own tests.

Each scenario gives every role a population accuracy mu_r and a seed-to-seed SD sigma_r. One
simulated experiment draws, per role and seed, a model accuracy q = mu_r + sigma_r x N(0, 1), and per
test image a difficulty z_i ~ N(0, 1) that every model shares; model (r, s) is right on image i when
rho z_i + sqrt(1 - rho^2) e_rsi < Phi^-1(q), so roles agree on most images, as trained models do,
and the expected accuracy over images is exactly q. The truth of a difference is then mu_a - mu_b,
and of a share (mu_a - mu_b) / (mu_top - mu_bottom). Every test of linvit.report.claims.CLAIMS runs
on each experiment through linvit.report.stats, exactly as the report runs it.

Reported per (scenario, seeds, statistic): how often the `level` interval covers the truth; how
often a verdict is wrong (holds where the truth is on the fails side, or fails where it is on the
claim's side; a truth exactly at the threshold counts as the claim being true); how often a test
decides at all; and the median minimum detectable effect. The rows named C1 and C2 judge the
claims' combined verdicts.

    python -m linvit.report.calibration      # regenerates linvit/report/coverage.csv, prints the table
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats as sps

from linvit.report import stats
from linvit.report.claims import CLAIMS, REFERENCE, Thresholds

COVERAGE_CSV = Path(__file__).with_name("coverage.csv")
SEEDS = (3, 5, 10)
EXPERIMENTS = 1000
RHO = 0.8  # how much the roles' errors share the same images
# Role -> (mean accuracy, seed-to-seed SD), in fractions. "fmnist" and "digits": a reference run's
# numbers (the three-seed default grid of 3 December 2026, report/reference at 7bc517a; copy_attn was
# not in it, so its numbers are made up), each at its test split's size. "boundary": every deciding
# statistic's truth exactly at its threshold, the worst case for a wrong "fails".
SCENARIOS = {
    "fmnist": (5000, {"random": (0.5212, 0.0213), "copy_all": (0.8107, 0.0010), "copy_attn": (0.6500, 0.0300),
                      "copy_mlp": (0.7167, 0.0019), "attn_only": (0.6170, 0.0721), "mlp_only": (0.5008, 0.0087),
                      "copy_mlp_distill": (0.7874, 0.0057), REFERENCE: (0.8417, 0.0012)}),
    "digits": (360, {"random": (0.4685, 0.0197), "copy_all": (0.8926, 0.0089), "copy_attn": (0.7000, 0.0500),
                     "copy_mlp": (0.7843, 0.0526), "attn_only": (0.6991, 0.0658), "mlp_only": (0.5130, 0.0274),
                     "copy_mlp_distill": (0.8065, 0.0725), REFERENCE: (0.9417, 0.0173)}),
    "boundary": (2000, {"random": (0.50, 0.02), "copy_all": (0.70, 0.01), "copy_attn": (0.60, 0.02),
                        "copy_mlp": (0.65, 0.01), "attn_only": (0.55, 0.04), "mlp_only": (0.60, 0.02),
                        "copy_mlp_distill": (0.79, 0.01), REFERENCE: (0.80, 0.01)}),
}
COLUMNS = ["scenario", "images", "seeds", "statistic", "truth", "threshold", "side", "coverage", "wrong",
           "decided", "median_mde"]


def simulate_sample(rng: np.random.Generator, roles: dict[str, tuple[float, float]], seeds: int,
                    images: int) -> stats.Sample:
    """One simulated experiment: per role a (seeds x images) 0/1 correctness matrix."""
    z = rng.standard_normal(images)
    matrices = {}
    for role, (mu, sd) in roles.items():
        q = np.clip(mu + sd * rng.standard_normal(seeds), 0.01, 0.99)
        cut = sps.norm.ppf(q)[:, None]
        latent = RHO * z[None, :] + math.sqrt(1 - RHO * RHO) * rng.standard_normal((seeds, images))
        matrices[role] = (latent < cut).astype(np.float32)
    return stats.Sample(matrices, list(range(seeds)), images, stats.SEEDS_AND_IMAGES)


def _truth(stat, roles: dict[str, tuple[float, float]]) -> float:
    num = sum(w * roles[r][0] for r, w in stat.numerator)
    return num / sum(w * roles[r][0] for r, w in stat.denominator) if stat.denominator else num


def _claim_side(truth: float, threshold: float, side: str) -> bool:
    """Whether the truth satisfies the claim (a truth exactly at the threshold does)."""
    eps = 1e-12
    return truth <= threshold + eps if side == "<=" else truth >= threshold - eps


def coverage_table(seeds=SEEDS, experiments: int = EXPERIMENTS, seed: int = 0,
                   settings: stats.Settings | None = None) -> pd.DataFrame:
    settings = settings or stats.Settings()
    thresholds = Thresholds()
    rng = np.random.default_rng(seed)
    rows = []
    for scenario, (images, roles) in SCENARIOS.items():
        for n in seeds:
            records: dict[str, dict] = {}
            claims: dict[str, list] = {c.name: [] for c in CLAIMS}
            for _ in range(experiments):
                sample = simulate_sample(rng, roles, n, images)
                for claim in CLAIMS:
                    deciding = []
                    for t in claim.tests:
                        stat = t.statistic
                        num, den = dict(stat.numerator), dict(stat.denominator) if stat.denominator else None
                        truth = _truth(stat, roles)
                        rec = records.setdefault(stat.name, {"truth": truth, "covered": 0, "wrong": 0,
                                                             "decided": 0, "mde": [], "threshold": math.nan,
                                                             "side": ""})
                        if t.threshold is None:
                            e = stats.estimate(sample, num, den, settings)
                        else:
                            thr = thresholds.value(t.threshold)
                            result = stats.test(sample, num, den, thr, t.side, settings)
                            e = result.estimate
                            true = _claim_side(truth, thr, t.side)
                            rec.update(threshold=thr, side=t.side)
                            rec["decided"] += result.outcome in (stats.HOLDS, stats.FAILS)
                            rec["wrong"] += (result.outcome == stats.HOLDS and not true) or \
                                (result.outcome == stats.FAILS and true)
                            rec["mde"].append(result.mde)
                            if t.decides:
                                deciding.append((result, true))
                        rec["covered"] += e.low <= truth <= e.high
                    if len(deciding) > 1:
                        outcome = stats.combine([r for r, _ in deciding], settings)
                        all_true = all(true for _, true in deciding)
                        claims[claim.name].append((outcome, all_true))
            for name, rec in records.items():
                mde = [m for m in rec["mde"] if math.isfinite(m)]
                rows.append({"scenario": scenario, "images": images, "seeds": n, "statistic": name,
                             "truth": rec["truth"], "threshold": rec["threshold"], "side": rec["side"],
                             "coverage": rec["covered"] / experiments,
                             "wrong": rec["wrong"] / experiments if rec["side"] else math.nan,
                             "decided": rec["decided"] / experiments if rec["side"] else math.nan,
                             "median_mde": float(np.median(mde)) if mde else math.nan})
            for name, results in claims.items():
                if not results:
                    continue
                wrong = sum((o == stats.HOLDS and not t) or (o == stats.FAILS and t) for o, t in results)
                decided = sum(o in (stats.HOLDS, stats.FAILS) for o, _ in results)
                rows.append({"scenario": scenario, "images": images, "seeds": n, "statistic": name,
                             "truth": math.nan, "threshold": math.nan, "side": "all hold",
                             "coverage": math.nan, "wrong": wrong / experiments, "decided": decided / experiments,
                             "median_mde": math.nan})
    return pd.DataFrame(rows, columns=COLUMNS)


def coverage_markdown(table: pd.DataFrame | None = None) -> str:
    """The table as markdown: per statistic and scenario, coverage and wrong verdicts at 3, 5, 10 seeds."""
    table = pd.read_csv(COVERAGE_CSV) if table is None else table
    seeds = sorted(table["seeds"].unique())
    head = (["statistic", "scenario (test images)", "truth"] + [f"coverage {n} seeds" for n in seeds]
            + [f"wrong {n} seeds" for n in seeds])
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (statistic, scenario), g in table.groupby(["statistic", "scenario"], sort=False):
        g = g.set_index("seeds")
        truth = g["truth"].iloc[0]
        cells = [statistic, f"{scenario} ({int(g['images'].iloc[0])})",
                 "" if math.isnan(truth) else f"{truth:+.3f}"]
        cells += [_pct(g.loc[n, "coverage"]) for n in seeds] + [_pct(g.loc[n, "wrong"]) for n in seeds]
        rows.append("| " + " | ".join(cells) + " |")
    low = table["coverage"].min()
    worst = table["wrong"].max()
    n = _experiments_note()
    return (f"Lowest coverage {100 * low:.1f}%, highest wrong-verdict rate {100 * worst:.1f}% ({n}). "
            + "\n\n" + "\n".join(rows))


def _experiments_note() -> str:
    return f"{EXPERIMENTS:,} simulated experiments per scenario and seed count"


def _pct(x: float) -> str:
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
