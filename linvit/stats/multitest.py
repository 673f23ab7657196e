"""A claim's deciding tests combined, and corrections across a family of tests.

A claim with several deciding tests holds when all hold (an intersection-union test, at alpha with
no correction) and fails when one fails at alpha / k (Bonferroni, Holm's first step; k counts every
deciding test, also one that could not be evaluated). `holm` corrects across a family whose size is
fixed by the design: a NaN p-value counts in it and is never rejected.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from linvit.stats.paired import FAILS, HOLDS, INCONCLUSIVE, TOO_FEW, Settings


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
