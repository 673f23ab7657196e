"""The sequential design's calibration: linvit.stats.sequential's looks, judged on simulated grids whose truth
is known, beside naive rereading of the fixed-n test at the same looks.

The data are linvit.claims.calibration's (its noise model, a teacher per seed, `PER_SEED`): each experiment
draws all `LOOKS[-1]` (the cap's) paired seeds at once, and look k reads the first LOOKS[k] of them
(sequential.look_sample), as a grid that adds seeds does. Every deciding test of CLAIMS runs through
sequential.sequential_test with alpha = 2.5% on the hold side and fail_alpha = 2.5% / k for a claim of k
deciding tests, under the plan's default spending (sequential.DEFAULT_PLAN; `--spending` for another), with
the futility rule (conditional power 0.1 from look 2) and without it, on the same draws; each claim's verdict
is sequential.combine's.

Reported per (scenario, futility, test or claim):

- coverage: how often the repeated interval at the look where the test stopped (or the last) covers the truth;
  an unbounded interval covers it, so `unbounded` says how often that interval was unbounded on a side (a
  share whose benefit was not established at that side's boundary, which then decides nothing on it);
- wrong_holds / wrong_fails: how often the test ended holding where the truth is on the fails side, or failing
  where the truth satisfies the claim (a truth exactly at the threshold does), over the whole sequence; the
  targets are alpha and fail_alpha (`alpha_holds`, `alpha_fails`);
- how often it held, failed or stopped undecided, its mean seeds and training jobs against a fixed design at
  the cap: jobs are seeds x (the roles its statistics need + a teacher per seed); a claim's roles each train as
  long as one of its tests that needs them runs, and its tests stop when the claim is decided;
- naive_*: the fixed-n paired.test read at the same looks (its interval, holding at alpha and failing at the
  same fail_alpha), stopping at the first look where it holds or fails: optional stopping; fixed_*: the
  fixed-n test on all the cap's seeds (a fixed design), on the same draws;
- distance_se: the truth's distance from the threshold toward the claim's side, in SEs of the test's contrast
  (num - threshold x den) at the cap, measured on `SE_EXPERIMENTS` simulated cap-sized experiments.

Scenarios: calibration.SCENARIOS (reference-like cells, `at` and `beside` the thresholds) and `at` with every
deciding test moved `DISTANCES` SEs (at the cap) from its threshold, by shifting the one role of its numerator
that no other deciding test uses (the expected seeds and jobs at 0, 1 and 2 SEs on either side).

What it found: converting each look's z boundary to t by its nominal significance (n_k - 1 degrees of freedom)
was liberal, 3-13% more error than alpha for paired t statistics of normal seeds (`t_conversion_table`), and
so was the design at the thresholds; sequential.t_alpha corrects it, and at the thresholds the tests now hold
and fail as often as the spending allows, each side of each test within its alpha + 2 Monte Carlo SEs over
20,000 experiments (`at_threshold`). With an images' part a look's estimated fraction spends a little more
where T is large, and converting at n - 1 degrees of freedom is conservative by more (`images_part_table`).
The numbers: docs/statistics.md, "The sequential design". The simulation is
linvit.claims.sequential_simulation; this module prints its tables and regenerates the packaged one.

    python -m linvit.claims.calibration_sequential   # regenerates linvit/claims/coverage_sequential.csv
    python -m linvit.claims.calibration_sequential --at-threshold   # the check at the thresholds (about 13 min)
    python -m linvit.claims.calibration_sequential --images-part --experiments 4000   # fractions with images
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import pandas as pd

from linvit.claims.calibration import SCENARIOS
from linvit.claims.sequential_simulation import (ALPHA, AT_THRESHOLD_EXPERIMENTS, EXPERIMENTS, at_threshold,
                                                 images_part_table, sequential_table, t_conversion_table)
from linvit.stats import sequential
from linvit.stats.spending import SPENDING, spending_label

SEQUENTIAL_CSV = Path(__file__).with_name("coverage_sequential.csv")

BASE_SCENARIOS = tuple(SCENARIOS)  # the calibration table's; the others are the distance scenarios


def sequential_markdown(table: pd.DataFrame | None = None) -> str:
    """The table as markdown (the packaged coverage_sequential.csv by default): a summary, the calibration
    (coverage, wrong verdicts with and without futility, naive rereading beside) on calibration.SCENARIOS,
    then the expected seeds and jobs at the distance scenarios against a fixed design at the cap."""
    table = pd.read_csv(SEQUENTIAL_CSV, keep_default_na=False, na_values=[""]) if table is None else table
    experiments = int(table["experiments"].max())
    looks = table["looks"].iloc[0]
    cap = int(str(looks).split("/")[-1])

    def mc(p):
        return f"+-{100 * math.sqrt(p * (1 - p) / experiments):.2f}%"

    base = table[table["scenario"].isin(BASE_SCENARIOS)]
    summary = []
    for f, g in base.groupby("futility", sort=False):
        strict = g.loc[g["alpha_fails"] < ALPHA, "wrong_fails"].max()
        summary.append(f"Futility {f}: lowest coverage {_pct(g['coverage'].min())} (an unbounded interval counts as "
                       f"covering; at most {_pct(g['unbounded'].max())} of a test's final intervals were unbounded), "
                       f"most wrong holds "
                       f"{_pct(g['wrong_holds'].max())}, most wrong fails {_pct(g['wrong_fails'].max())} (in C1 and "
                       f"C2's tests, whose target is 1.25%: {_pct(strict)})")
    naive = base[base["futility"] == base["futility"].iloc[0]]
    worst = naive[["naive_wrong_holds", "naive_wrong_fails"]].max(axis=1)
    parts = [f"{experiments:,} simulated experiments per scenario (a teacher per seed), each with all {cap} seeds "
             f"drawn at once and read at looks of {looks.replace('/', ', ')} paired seeds; spending "
             f"`{table['spending'].iloc[0]}`, alpha 2.5% on the hold side and 2.5% / k on the fail side (k: the "
             f"claim's deciding tests: 1.25% for C1 and C2's tests). Monte Carlo error {mc(0.025)} at 2.5%, "
             f"{mc(0.0125)} at 1.25%, {mc(0.95)} at 95%. "
             + ". ".join(summary) + f". Naive rereading (the fixed-n test at each look) is wrong up to "
             f"{_pct(worst.max())} of the time.", _calibration_rows(base)]
    moved = table[~table["scenario"].isin(BASE_SCENARIOS)]
    if not moved.empty:
        parts.append(_seeds_rows(moved, table, cap))
    return "\n\n".join(parts)


def _claim_text(row) -> str:
    if row["side"] not in ("<=", ">="):
        return row["side"]
    return f"{row['side']} {row['threshold']:+.2f}".replace("<=", "&le;").replace(">=", "&ge;")


def _calibration_rows(base: pd.DataFrame) -> str:
    head = ["statistic", "scenario (test images)", "truth", "claim", "wrong would be (target)",
            "coverage (futility 0.1 / none)", "of them unbounded", "wrong (futility 0.1 / none)",
            "mean seeds (futility 0.1 / none)", "naive rereading: wrong", "naive: coverage", "naive: mean seeds"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (statistic, scenario), g in base.groupby(["statistic", "scenario"], sort=False):
        g = g.set_index("futility")
        first = g.iloc[0]
        true = bool(first["claim_true"])
        risk = f"fails ({_pct(first['alpha_fails'], 2)})" if true else f"holds ({_pct(first['alpha_holds'], 2)})"
        wrong = "wrong_fails" if true else "wrong_holds"
        covered = "" if math.isnan(first["coverage"]) else " / ".join(_pct(g.loc[f, "coverage"]) for f in g.index)
        unbounded = "" if math.isnan(first["unbounded"]) else " / ".join(_pct(g.loc[f, "unbounded"]) for f in g.index)
        cells = [statistic, f"{scenario} ({int(first['images'])})",
                 "" if math.isnan(first["truth"]) else f"{first['truth']:+.3f}", _claim_text(first), risk, covered,
                 unbounded,
                 " / ".join(_pct(g.loc[f, wrong], 2) for f in g.index),
                 " / ".join(f"{g.loc[f, 'mean_seeds']:.1f}" for f in g.index),
                 _pct(first[f"naive_{wrong}"], 2), _pct(first["naive_coverage"]), f"{first['naive_mean_seeds']:.1f}"]
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _seeds_rows(moved: pd.DataFrame, table: pd.DataFrame, cap: int) -> str:
    """Per futility setting: per test and claim, at each distance from the threshold (`at` is 0), the mean
    seeds, the mean jobs as a share of a fixed design's at the cap, and how often it decided (beside it,
    how often the fixed design at the cap does)."""
    scenarios = [*(s for s in dict.fromkeys(moved["scenario"]) if s.startswith("-")), "at",
                 *(s for s in dict.fromkeys(moved["scenario"]) if not s.startswith("-"))]
    both = table[table["scenario"].isin(scenarios)]
    names = {s: "0 SE (`at`)" if s == "at" else s for s in scenarios}
    parts = []
    for f, g in both.groupby("futility", sort=False):
        head = ["statistic", "jobs per seed", f"fixed design ({cap} seeds): jobs"] + [names[s] for s in scenarios]
        rows = [f"Futility {f}: mean seeds, mean jobs as a share of the fixed design's, and decided (holds or "
                f"fails; the fixed design at {cap} seeds in brackets), by the truth's distance from the threshold "
                "in SEs at the cap (negative: the claim is false).", "",
                "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for statistic, h in g.groupby("statistic", sort=False):
            h = h.set_index("scenario")
            fixed = float(h["fixed_jobs"].iloc[0])
            cells = [statistic, f"{fixed / cap:g}", f"{fixed:g}"]
            for s in scenarios:
                r = h.loc[s]
                cells.append(f"{r['mean_seeds']:.1f} · {_pct(r['mean_jobs'] / fixed, 0)} · "
                             f"{_pct(r['holds'] + r['fails'], 0)} ({_pct(r['fixed_holds'] + r['fixed_fails'], 0)})")
            rows.append("| " + " | ".join(cells) + " |")
        parts.append("\n".join(rows))
    return "\n\n".join(parts)


def _pct(x, digits: int = 1) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{100 * x:.{digits}f}%"


def at_threshold_markdown(table: pd.DataFrame) -> str:
    head = ["tests (fail alpha)", "look (seeds)", "mean fraction", "held by then (allowed)",
            "failed by then (allowed)"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for _, r in table.iterrows():
        who = "C1, C2's shares" if r["fail_alpha"] < ALPHA else "C3's difference"
        rows.append(f"| {who} ({_pct(r['fail_alpha'], 2)}, {int(r['paths']):,} paths) | {int(r['look'])} "
                    f"({int(r['seeds'])}) | {r['mean_fraction']:.3f} | {_pct(r['holds'], 2)} "
                    f"({_pct(r['holds_allowed'], 2)}) | {_pct(r['fails'], 2)} ({_pct(r['fails_allowed'], 2)}) |")
    return "\n".join(rows)


def threshold_check_markdown(check: pd.DataFrame) -> str:
    """The check: per test (and pooled), held and failed over the whole sequence, each side against its alpha
    + 2 Monte Carlo SEs (the SE of a rate at alpha over the paths)."""
    head = ["test", "paths a side", "held (alpha; limit alpha + 2 SE)", "failed (alpha; limit)", "within"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for _, r in check.iterrows():
        sides = [f"{_pct(r[s], 2)} ({_pct(r[f'{s}_alpha'], 2)}; {_pct(r[f'{s}_alpha'] + 2 * r[f'{s}_se'], 2)})"
                 for s in ("holds", "fails")]
        ok = "yes" if r["holds_ok"] and r["fails_ok"] else "NO"
        rows.append(f"| {r['tests']} | {int(r['paths']):,} | {sides[0]} | {sides[1]} | {ok} |")
    return "\n".join(rows)


def images_part_markdown(table: pd.DataFrame) -> str:
    """Held / failed, and their mean: the model is symmetric about the threshold, so the mean is one side's
    rate over twice the paths (its Monte Carlo error in the last column)."""
    head = ["images' share of the variance at the cap", "true fractions", "paths a side",
            "fractions estimated (the engine): held / failed (mean)", "fractions true: held / failed (mean)",
            "MC error of a mean at 2.5%"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for _, r in table.iterrows():
        cells = [f"{_pct(r[f'{m}_holds'], 2)} / {_pct(r[f'{m}_fails'], 2)} "
                 f"({_pct((r[f'{m}_holds'] + r[f'{m}_fails']) / 2, 2)})" for m in ("estimated", "true")]
        rows.append(f"| {_pct(r['share'], 0)} | {r['fractions_true'].replace('/', ', ')} | {int(r['paths']):,} | "
                    f"{cells[0]} | {cells[1]} | +-{100 * r['mc'] / math.sqrt(2):.2f}% |")
    return "\n".join(rows)


def t_conversion_markdown(table: pd.DataFrame) -> str:
    head = ["looks (seeds)", "spending", "alpha", "error, converted at alpha", "error, at t_alpha", "t_alpha / alpha"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for _, r in table.iterrows():
        rows.append(f"| {r['looks'].replace('/', ', ')} | {spending_label(r['spending'], r['gamma'])} | "
                    f"{_pct(r['alpha'], 2)} | "
                    f"{_pct(r['plain'], 3)} ({r['plain'] / r['alpha']:.3f} x) | "
                    f"{_pct(r['corrected'], 3)} ({r['corrected'] / r['alpha']:.3f} x) | "
                    f"{r['t_alpha'] / r['alpha']:.3f} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=SEQUENTIAL_CSV)
    parser.add_argument("--experiments", type=int, default=None,
                        help=f"experiments per scenario (default {EXPERIMENTS:,}; with --at-threshold "
                             f"{AT_THRESHOLD_EXPERIMENTS:,})")
    parser.add_argument("--spending", choices=list(SPENDING), default=sequential.DEFAULT_PLAN["spending"])
    parser.add_argument("--at-threshold", action="store_true",
                        help="print only the check at the thresholds: the rates by look, pooled, and each test's "
                             f"hold and fail sides against alpha + 2 Monte Carlo SEs ({AT_THRESHOLD_EXPERIMENTS:,} "
                             "experiments unless --experiments says otherwise; about 10 minutes)")
    parser.add_argument("--images-part", action="store_true",
                        help="print only the images' part check: a difference at its threshold whose variance is "
                             "partly the test images', fractions estimated and true (--experiments paths a share, "
                             "default 3,000; 20,000 take about 4 minutes)")
    args = parser.parse_args(argv)
    started = time.time()
    if args.images_part:
        print(images_part_markdown(images_part_table(paths=args.experiments or 3000, spending=args.spending)))
        print(f"\n{time.time() - started:.0f} s")
        return
    if args.at_threshold:
        experiments = AT_THRESHOLD_EXPERIMENTS if args.experiments is None else args.experiments
        by_look, check = at_threshold(experiments, spending=args.spending, log=lambda line: print(line, flush=True))
        print(at_threshold_markdown(by_look) + "\n\n" + threshold_check_markdown(check))
        print(f"\n{time.time() - started:.0f} s")
        return
    print(t_conversion_markdown(t_conversion_table()) + "\n", flush=True)
    table = sequential_table(experiments=args.experiments or EXPERIMENTS, spending=args.spending,
                             log=lambda line: print(line, flush=True))
    table.to_csv(args.out, index=False, float_format="%.6g")
    print(sequential_markdown(table))
    print(f"\n{time.time() - started:.0f} s")


if __name__ == "__main__":
    main()
