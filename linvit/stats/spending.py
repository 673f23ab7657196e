"""The alpha-spending functions of the sequential design, as one registry.

A spending function gives the cumulative error spent by information fraction t in [0, 1] (alpha at
t = 1), from (alpha, t, gamma); `gamma` is the plan's parameter, which a function may ignore. Each is one
`@register_spending` entry: its name (what `sequential.spending` in a config names; the config accepts
exactly the registered names) and its label, how the report and the calibration tables name it: a format
string of `name` (the name, as the text quotes it) and `gamma` (e.g. '{name} (gamma {gamma:g})' for a
function that reads gamma). Adding one is one entry here (docs/architecture.md, "Adding a spending function").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from scipy import special


@dataclass(frozen=True)
class Spending:
    """A registered spending function: its name, the function (alpha, t, gamma) -> the error spent by t,
    and its label (a format string of `name` and `gamma`)."""

    name: str
    function: Callable[[float, float, float], float]
    label: str = "{name}"

    def describe(self, gamma: float, quote: str = "") -> str:
        """The label: 'hwang_shih_decani (gamma 0)', or with quote '`' '`hwang_shih_decani` (gamma 0)'."""
        return self.label.format(name=f"{quote}{self.name}{quote}", gamma=gamma)


SPENDING: dict[str, Spending] = {}


def register_spending(name: str, label: str = "{name}"):
    """Register the decorated function (alpha, t, gamma) -> error spent by t as spending function `name`."""
    def add(fn):
        SPENDING[name] = Spending(name, fn, label)
        return fn
    return add


@register_spending("obrien_fleming")
def _obrien_fleming(alpha: float, t: float, gamma: float) -> float:
    """Lan-DeMets' O'Brien-Fleming-type: almost nothing early, most of alpha at the cap."""
    if t <= 0:
        return 0.0
    return float(2 * special.ndtr(-special.ndtri(1 - alpha / 2) / math.sqrt(min(t, 1.0))))


@register_spending("pocock")
def _pocock(alpha: float, t: float, gamma: float) -> float:
    """Lan-DeMets' Pocock-type: spends evenly, so it stops early more often and needs more at the cap."""
    return alpha * math.log(1 + (math.e - 1) * min(max(t, 0.0), 1.0))


@register_spending("hwang_shih_decani", label="{name} (gamma {gamma:g})")
def _hsd(alpha: float, t: float, gamma: float) -> float:
    """Hwang-Shih-DeCani: gamma -4 is close to O'Brien-Fleming, 1 to Pocock, 0 spends linearly."""
    t = min(max(t, 0.0), 1.0)
    if gamma == 0:
        return alpha * t
    return alpha * (1 - math.exp(-gamma * t)) / (1 - math.exp(-gamma))


def spending_label(name: str, gamma: float, quote: str = "") -> str:
    """The registered label of spending function `name` at `gamma` (Spending.describe)."""
    return SPENDING[name].describe(gamma, quote)
