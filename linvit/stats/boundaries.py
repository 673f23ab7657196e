"""One side's group-sequential boundaries: the error a plan's spending function allows by each look,
turned into z boundaries by the recursive numerical integration of Jennison and Turnbull (2000, ch. 19),
their conversion to the t scale, and the conditional power at the cap (linvit.stats.sequential reads
a test's looks against them; the method is in its module doc).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from scipy import optimize, special

if TYPE_CHECKING:
    from linvit.stats.sequential import Plan

# The numerical integration: a grid on the z scale, Simpson's weights, paths below the boundary.
_LOW, _POINTS = -8.0, 401  # to 1e-5 of the boundaries of a 801-point grid from -9, 10x quicker


def _grid(upper: float) -> tuple[np.ndarray, np.ndarray]:
    hi = min(upper, 8.0)
    z = np.linspace(_LOW, hi, _POINTS)
    w = np.full(_POINTS, 2.0)
    w[1::2] = 4.0
    w[0] = w[-1] = 1.0
    return z, w * (hi - _LOW) / (3 * (_POINTS - 1))


def _boundaries(fractions: tuple[float, ...], spent: tuple[float, ...]) -> tuple[float, ...]:
    """z boundaries c_1..c_k with P(Z_j < c_j for j < k, Z_k >= c_k) = spent[k] - spent[k - 1] under the
    null, Z the canonical joint normal at information fractions `fractions` (increasing, last <= 1)."""
    return _state(fractions, spent)[0]


@functools.lru_cache(maxsize=4096)
def _state(fractions: tuple[float, ...], spent: tuple[float, ...]):
    """(boundaries, and the density of Z_k on its grid over the paths that have not crossed): each look
    extends its prefix's cached state, so reading look after look (and the cap after each, for the
    conditional power) integrates every step once."""
    k = len(fractions) - 1
    t, total = fractions[k], spent[k]
    target = total - (spent[k - 1] if k else 0.0)
    if k == 0:
        bounds: tuple[float, ...] = ()

        def cross(c):
            return float(special.ndtr(-c))
    else:
        bounds, density, z_prev, w_prev = _state(fractions[:-1], spent[:-1])
        t0 = fractions[k - 1]
        step = math.sqrt(t - t0)

        def cross(c):
            return float(np.sum(w_prev * density * special.ndtr((z_prev * math.sqrt(t0) - c * math.sqrt(t)) / step)))
    if target <= 1e-15:
        c = math.inf
    else:
        c = optimize.brentq(lambda c: cross(c) - target, -10.0, 40.0, xtol=1e-10)
    # The density of Z_k over paths still below c (for the next look).
    z, w = _grid(c)
    if k == 0:
        new = np.exp(-z * z / 2) / math.sqrt(2 * math.pi)
    else:
        x = (z[:, None] * math.sqrt(t) - z_prev[None, :] * math.sqrt(t0)) / step
        kernel = np.exp(-x * x / 2) / math.sqrt(2 * math.pi) * (math.sqrt(t) / step)
        new = kernel @ (w_prev * density)
    return (*bounds, c), new, z, w


def boundaries(fractions: Sequence[float], alpha: float, plan: Plan) -> list[float]:
    """One side's z boundaries at looks with information fractions `fractions`, spending `alpha` by the
    plan's function (the last fraction 1 spends what is left)."""
    fr = tuple(round(float(t), 12) for t in fractions)
    return list(_boundaries(fr, tuple(plan.spent(alpha, t) for t in fr)))


def t_critical(z: float, df: float) -> float:
    """A z boundary on the t scale with `df` degrees of freedom: the same one-sided significance."""
    if math.isinf(z):
        return z
    p = float(special.ndtr(-z))
    return float(-special.stdtrit(df, p)) if p > 0 else math.inf


def conditional_power(z: float, t: float, c_hold: float, c_fail: float) -> float:
    """The chance that a test at look fraction t with statistic z (on its hold side's z scale: positive
    toward holding) crosses the hold side's cap boundary c_hold or the fail side's c_fail (z scale) at the
    cap, if its current trend z / sqrt(t) is the truth. 0 for a test at the cap."""
    if t >= 1:
        return 0.0
    b = z * math.sqrt(t)
    mean, sd = b + (z / math.sqrt(t)) * (1 - t), math.sqrt(1 - t)
    return float(special.ndtr((mean - c_hold) / sd) + special.ndtr((-c_fail - mean) / sd))
