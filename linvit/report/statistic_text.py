"""A statistic's numbers in the report's words: a share in %, a difference in pp, an estimate with its interval.
The claims' text (claims_text), their reading along the grid's axes (axes_text) and the Decisions section say
every number through these."""

from __future__ import annotations

import math

from linvit.claims.table import CLAIMS
from linvit.claims.verdicts import TestOutcome

STATISTICS = {t.statistic.name: t.statistic for c in CLAIMS for t in c.tests}


def number(name: str, x: float) -> str:
    """A share in %, a difference in pp (signed); 'n/a' for NaN, ±inf as such."""
    if x is None or math.isnan(x):
        return "n/a"
    if math.isinf(x):
        return "+inf" if x > 0 else "-inf"
    share = STATISTICS[name].is_share if name in STATISTICS else False
    return f"{100 * x:+.1f}%" if share else f"{100 * x:+.2f} pp"


def interval(t: TestOutcome) -> str:
    """'+12.3% [+5.0%, +19.6%]'; the estimate alone when there is no interval."""
    if math.isnan(t.low) or math.isnan(t.high):
        return f"{number(t.name, t.estimate)} [no interval]"
    return f"{number(t.name, t.estimate)} [{number(t.name, t.low)}, {number(t.name, t.high)}]"
