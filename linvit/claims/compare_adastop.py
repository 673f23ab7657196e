"""linvit's sequential design beside AdaStop (Mathieu et al., TMLR 2024), on the same simulated draws.

AdaStop (PyPI `adastop`, its `MultipleAgentsComparator`) decides, interim by interim, whether agents differ:
a two-sided permutation test over several agents (here two), its level spent linearly over K interims of n
seeds per agent, no interval, no margin, the agents' seeds unpaired. linvit's design
(linvit.stats.sequential) is a paired one-sided t test against a threshold at each look, Lan-DeMets
spending per side, repeated intervals and a futility rule. This script gives both the same draws and counts
how often each finds a difference, in which direction and after how many seeds.

Each path draws two roles' accuracies for `cap` seeds (30) at once:

    acc_r[s] = 0.80 + truth x [r = a] + SD x (sqrt(shared) u[s] + sqrt(1 - shared) e_r[s])

u the per-seed effect both roles of seed s share, e independent N(0, 1); SD 2 pp per role. "paired" noise
shares half of each role's seed variance (`shared` 0.5, as calibration.SCENARIOS' `at`), so the difference
a - b has SD 2 pp against 2.8 pp without; "unpaired" shares none (0). The normals are drawn once per path
(generator seed [seed, path]) and every (noise, truth) and every procedure reads them, so the procedures
differ only in how they decide. The truth is a - b in accuracy units: 0 (any decision is an error), 1 pp
and 2 pp (deciding a > b is power).

The procedures, each on the first n seeds of both roles at its looks:

- AdaStop: MultipleAgentsComparator(n=5, K=6, B=10000, alpha, beta=0): interims at 5, 10, ..., 30 seeds
  per agent; "larger" / "smaller" is a decision, "equal" at the end none; its permutations' seed is the
  path's. At alpha 0.05, as documented, and at 0.025, where its error is 5% (see ADASTOP_ALPHAS).
- linvit: sequential.sequential_test of a - b >= 0 (threshold 0) on the paired sample (pairing.pair, looks read
  by sequential.look_sample as linvit decide reads them), alpha 2.5% on the hold side (a > b) and 2.5% on the
  fail side (a < b), so 5% in all, as AdaStop's documented alpha; the default spending. At AdaStop's looks
  (5, 10, ..., 30) with the default futility rule (conditional power 0.1 from look 2) and without it, and
  at the default plan's looks (5, 10, 15, 20, 30) with futility.

Reported per (noise, procedure): the error at truth 0 (any decision; the target is 5%), the power at 1 and
2 pp (deciding a > b), and the mean seeds per role at each truth. The numbers: docs/statistics.md,
"Beside AdaStop".

    pip install -e '.[compare]'                   # adastop, pinned (also in the test extra)
    python -m linvit.claims.compare_adastop        # 500 paths per (noise, truth); --paths, --jobs, --csv
"""

from __future__ import annotations

import argparse
import math
import os
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import numpy as np
import pandas as pd

from linvit.stats import paired, pairing, sequential

ADASTOP = "adastop==0.1.3"  # the version measured (pyproject.toml's `compare` and `test` extras)
BASE, SD = 0.80, 0.02
NOISE = {"paired": 0.5, "unpaired": 0.0}  # the share of a role's seed variance that a seed's roles share
TRUTHS = (0.0, 0.01, 0.02)
PATHS = 500
SEED = 55
N, K, B = 5, 6, 10_000  # AdaStop: seeds per interim, interims, permutations
ALPHA = 0.05  # the two-sided error: linvit spends ALPHA / 2 on each side
# AdaStop's alpha: as documented (ALPHA), and half of it. adastop 0.1.3 sets its boundary on the signed
# permutation values (one tail) but rejects on the absolute difference (both tails), so with two agents it
# errs about twice its alpha: with one interim of 5 seeds it rejects on exactly 24 of the 252 relabellings
# of a pooled sample at alpha 0.05 (9.5%) and 12 (4.8%) at 0.025 (a test checks). At ALPHA / 2 its error is
# linvit's.
ADASTOP_ALPHAS = (ALPHA, ALPHA / 2)
LOOKS = tuple(N * (k + 1) for k in range(K))
DEFAULT_LOOKS = (5, 10, 15, 20, 30)
CONTRAST = {"a": 1.0, "b": -1.0}
LARGER, SMALLER, NONE = "a > b", "a < b", "none"


def _plans() -> dict[str, sequential.Plan]:
    futility = sequential.DEFAULT_PLAN["futility"]
    return {
        "linvit, looks 5-30 by 5, futility": sequential.Plan(LOOKS, futility=futility),
        "linvit, looks 5-30 by 5, no futility": sequential.Plan(LOOKS, futility=None),
        "linvit, looks 5, 10, 15, 20, 30, futility": sequential.Plan(DEFAULT_LOOKS, futility=futility),
    }


def adastop_name(alpha: float) -> str:
    return f"AdaStop, interims 5-30 by 5, alpha {alpha:g}"


PROCEDURES = (*(adastop_name(a) for a in ADASTOP_ALPHAS), *_plans())


def comparator_class():
    """AdaStop's MultipleAgentsComparator, or SystemExit in one line when the package is missing."""
    try:
        from adastop import MultipleAgentsComparator
    except ImportError:
        raise SystemExit(f"compare_adastop: needs the adastop package: pip install -e '.[compare]' "
                         f"(or pip install {ADASTOP})") from None
    return MultipleAgentsComparator


def draw(seed: int, path: int, cap: int = LOOKS[-1]) -> np.ndarray:
    """A path's normals: rows u (shared by a seed's roles), e_a, e_b; `cap` seeds each."""
    return np.random.default_rng([seed, path]).standard_normal((3, cap))


def accuracies(normals: np.ndarray, truth: float, shared: float) -> tuple[np.ndarray, np.ndarray]:
    """Roles a and b's per-seed accuracies from a path's normals (module doc)."""
    u, e_a, e_b = normals
    own = math.sqrt(1 - shared)
    a = BASE + truth + SD * (math.sqrt(shared) * u + own * e_a)
    b = BASE + SD * (math.sqrt(shared) * u + own * e_b)
    return a, b


@dataclass(frozen=True)
class Outcome:
    decision: str  # LARGER, SMALLER or NONE
    seeds: int  # per role, at the look or interim where it stopped


def run_linvit(a: np.ndarray, b: np.ndarray, plan: sequential.Plan) -> Outcome:
    """linvit's sequential test of a - b >= 0 on the paired seeds, at the plan's looks."""
    runs = {"a": [pairing.Run(s, float(x)) for s, x in enumerate(a)],
            "b": [pairing.Run(s, float(x)) for s, x in enumerate(b)]}
    full = pairing.pair(runs)
    samples = [sequential.look_sample(full, full.seeds[:n]) for n in plan.looks]
    r = sequential.sequential_test(samples, CONTRAST, None, 0.0, ">=", plan, ALPHA / 2, ALPHA / 2)
    decision = {paired.HOLDS: LARGER, paired.FAILS: SMALLER}.get(r.outcome, NONE)
    return Outcome(decision, r.looks[-1].seeds)


class _Comparisons(np.ndarray):
    """AdaStop's comparisons, (0, 1) here. It keys them by str(row) inside its permutation loops, where
    numpy's array printing is most of its time; these rows print the same string ("[0 1]") without it, so
    every decision, boundary and seed count is the same as with its default `comparisons=None` (a test
    checks), in half the time."""

    def __str__(self):
        if self.ndim != 1:
            return np.ndarray.__str__(self)
        return "[" + " ".join(str(int(x)) for x in self.tolist()) + "]"


def adastop_comparator(seed: int, alpha: float = ALPHA, fast: bool = True, k: int = K):
    """AdaStop's comparator for two agents as this comparison runs it (`fast`: `_Comparisons`)."""
    comparisons = np.array([[0, 1]]).view(_Comparisons) if fast else None
    return comparator_class()(n=N, K=k, B=B, comparisons=comparisons, alpha=alpha, beta=0, seed=seed)


def run_adastop(a: np.ndarray, b: np.ndarray, seed: int, alpha: float = ALPHA, fast: bool = True) -> Outcome:
    """AdaStop on roles a and b, interim k reading the first N x k seeds of each, as its docstring runs it."""
    comparator = adastop_comparator(seed, alpha, fast)
    for k in range(K):
        comparator.partial_compare({"a": a[:N * (k + 1)], "b": b[:N * (k + 1)]}, verbose=False)
        if comparator.is_finished:
            break
    decision = next(iter(comparator.decisions.values()))
    return Outcome({"larger": LARGER, "smaller": SMALLER}.get(decision, NONE), comparator.n_iters["a"])


def run_path(seed: int, path: int, truths: Sequence[float] = TRUTHS, noises: dict[str, float] | None = None,
             adastop: bool = True) -> list[dict]:
    """One path's draws under every (noise, truth), each read by every procedure: one row per reading."""
    normals = draw(seed, path)
    plans = _plans()
    adastop_seed = int(np.random.SeedSequence([seed, path]).generate_state(1)[0] % 2**31)
    rows = []
    for noise, shared in (NOISE if noises is None else noises).items():
        for truth in truths:
            a, b = accuracies(normals, truth, shared)
            outcomes = {name: run_linvit(a, b, plan) for name, plan in plans.items()}
            if adastop:
                for alpha in ADASTOP_ALPHAS:
                    outcomes[adastop_name(alpha)] = run_adastop(a, b, adastop_seed, alpha)
            rows += [{"noise": noise, "shared": shared, "truth": truth, "path": path, "procedure": name,
                      "decision": o.decision, "seeds": o.seeds} for name, o in outcomes.items()]
    return rows


def _chunk(args) -> list[dict]:
    seed, paths, truths, noises, adastop = args
    return [row for p in paths for row in run_path(seed, p, truths, noises, adastop)]


def simulate(paths: int = PATHS, seed: int = SEED, truths: Sequence[float] = TRUTHS,
             noises: dict[str, float] | None = None, adastop: bool = True, jobs: int = 1) -> pd.DataFrame:
    """Every reading of `paths` paths (one row per path, noise, truth and procedure)."""
    if adastop:
        comparator_class()  # fail before any work
    sequential.t_alpha(ALPHA / 2, sequential.Plan(LOOKS))  # once, before the workers (each would redo it)
    sequential.t_alpha(ALPHA / 2, sequential.Plan(DEFAULT_LOOKS))
    chunks = [(seed, range(i, paths, jobs), tuple(truths), dict(NOISE if noises is None else noises), adastop)
              for i in range(jobs)]
    if jobs == 1:
        rows = _chunk(chunks[0])
    else:
        with ProcessPoolExecutor(jobs) as pool:
            rows = [row for part in pool.map(_chunk, chunks) for row in part]
    return pd.DataFrame(rows).sort_values(["noise", "truth", "procedure", "path"], ignore_index=True)


def summary(readings: pd.DataFrame) -> pd.DataFrame:
    """Per (noise, procedure, truth): paths, how often it decided a > b and a < b, mean seeds per role."""
    g = readings.groupby(["noise", "shared", "procedure", "truth"], sort=False)
    out = g.agg(paths=("path", "size"), mean_seeds=("seeds", "mean"),
                larger=("decision", lambda d: float(np.mean(d == LARGER))),
                smaller=("decision", lambda d: float(np.mean(d == SMALLER)))).reset_index()
    out["decided"] = out["larger"] + out["smaller"]
    return out


def markdown(summ: pd.DataFrame) -> str:
    """One row per (noise, procedure): error at truth 0, power at each other truth, mean seeds at each."""
    truths = sorted(summ["truth"].unique())
    head = ["noise (shared)", "procedure"]
    for t in truths:
        head += (["error at 0 (any decision)", "seeds at 0"] if t == 0 else
                 [f"power at {100 * t:g} pp (a > b)", f"seeds at {100 * t:g} pp"])
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    order = {p: i for i, p in enumerate(PROCEDURES)}
    for (noise, shared, proc), rows in sorted(summ.groupby(["noise", "shared", "procedure"], sort=False),
                                              key=lambda x: (-x[0][1], order.get(x[0][2], 99))):
        cells = [f"{noise} ({shared:g})", proc]
        for t in truths:
            r = rows[rows["truth"] == t].iloc[0]
            cells += [f"{100 * (r['decided'] if t == 0 else r['larger']):.1f}%", f"{r['mean_seeds']:.1f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--paths", type=int, default=PATHS, help=f"paths per (noise, truth) (default {PATHS})")
    parser.add_argument("--seed", type=int, default=SEED, help=f"the draws' generator seed (default {SEED})")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="worker processes")
    parser.add_argument("--shared", type=float, default=NOISE["paired"],
                        help=f"the paired noise's shared share of the seed variance (default {NOISE['paired']})")
    parser.add_argument("--csv", help="also write every reading's summary to this CSV")
    args = parser.parse_args(argv)
    if not 0 <= args.shared < 1:
        parser.error(f"--shared {args.shared}: expected a share in [0, 1)")
    comparator_class()
    start = time.monotonic()
    noises = {**NOISE, "paired": args.shared}
    summ = summary(simulate(args.paths, args.seed, noises=noises, jobs=max(1, args.jobs)))
    took = time.monotonic() - start
    if args.csv:
        summ.to_csv(args.csv, index=False)
    err = math.sqrt(ALPHA * (1 - ALPHA) / args.paths)
    print(f"{args.paths} paths per (noise, truth), generator seed {args.seed}, {ADASTOP}; Monte Carlo error "
          f"+-{100 * err:.2f}% at 5%, at most +-{100 * math.sqrt(0.25 / args.paths):.2f}% on a power; "
          f"{took:.0f} s with {args.jobs} worker{'s' if args.jobs != 1 else ''}")
    print(markdown(summ))


if __name__ == "__main__":
    main()
