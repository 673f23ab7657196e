"""The verdicts: numbers only (the words are the report's), and claims.json's one writer and one reader.

`evaluate_claims` (linvit.claims.judge) returns a `ClaimVerdict` per claim, each with a `CellVerdict` per
(dataset, size, variant, budget) cell and a `TestOutcome` per test. The report writes them to claims.json
(`write_verdicts`); linvit decide reads them back (`read_verdicts`).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from linvit.io import write_text
from linvit.stats import sequential
from linvit.stats.paired import FAILS, HOLDS, INCONCLUSIVE, TOO_FEW

NOT_EVALUABLE = "not evaluable"
NOT_TESTED = "not tested"  # C4 on a grid that varies no dataset, size or linear variant (and each of its cells)


@dataclass
class TestOutcome:
    """One test in one cell: numbers only (outcome '' for a statistic reported without a threshold)."""

    name: str
    outcome: str
    estimate: float = math.nan
    low: float = math.nan
    high: float = math.nan
    level: float = math.nan
    p_holds: float = math.nan
    p_fails: float = math.nan
    mde: float = math.nan
    seeds_needed: float = math.nan  # undecided: paired seeds to decide it with 80% power at the estimate
    seeds_needed_low: float = math.nan  # ... and the range for truths in the estimate's 50% interval
    seeds_needed_high: float = math.nan
    threshold: float = math.nan
    side: str = ""
    decides: bool = True
    seeds: int = 0
    images: int = 0
    note: str = ""
    # Under a sequential plan (`sequential:`): the look the test stopped at (0 while it continues) and each
    # look's numbers (linvit.stats.sequential.Look.as_dict); low and high are the last look's repeated
    # interval, at `level` = 1 - alpha - the fail side's alpha.
    stopped: int = 0
    looks: list = field(default_factory=list)


@dataclass
class CellVerdict:
    """One claim in one (dataset, size, variant, budget) cell: the claim's outcome (holds, fails,
    inconclusive, too few seeds, not evaluable; C4's cells "not tested" where the grid varies nothing),
    each test's numbers, and `p_fails`, the claim's Bonferroni p-value against it holding
    (multitest.combined_p_fails; C4 corrects these across cells and budgets)."""

    claim: str
    dataset: str
    size: str
    variant: str
    budget: int
    outcome: str
    tests: list[TestOutcome] = field(default_factory=list)
    why: str = ""  # when not evaluable
    p_fails: float = math.nan
    control: bool = False
    parts: dict[str, str] = field(default_factory=dict)  # C4: claim -> its outcome in this cell

    @property
    def evaluable(self) -> bool:
        return self.outcome != NOT_EVALUABLE

    @property
    def key(self) -> str:
        return f"{self.dataset}/{self.size}/{self.variant}/steps{self.budget}"

    def test(self, name: str) -> TestOutcome | None:
        return next((t for t in self.tests if t.name == name), None)


@dataclass
class ClaimVerdict:
    claim: str
    statement: str = ""
    verdict: str = ""
    counts: dict[str, int] = field(default_factory=dict)
    cells: list[CellVerdict] = field(default_factory=list)  # the linear variants'; the control's: `controls`
    controls: list[CellVerdict] = field(default_factory=list)
    roles: dict[str, str | None] = field(default_factory=dict)  # role -> the strategy that fills it
    designs: dict[str, str | None] = field(default_factory=dict)  # distilling role -> the design used
    by_budget: list[dict] = field(default_factory=list)  # {"budget", "verdict", "counts"}
    axes: dict[str, str] = field(default_factory=dict)  # C4: axis -> what the grid says about it
    intervals: str = ""  # what its intervals are over (intervals_over): seeds, teachers, test images

    def as_dict(self) -> dict:
        return asdict(self)


# Why a control cell's test is not evaluated where `control_inits` leaves out one of its strategies.
CONTROL_NARROWED = "not in the control (control_inits)"

OUTCOME_ORDER = (HOLDS, FAILS, INCONCLUSIVE, TOO_FEW, NOT_EVALUABLE)
SEQUENTIAL_OUTCOMES = (sequential.CONTINUES, sequential.FUTILE)  # a sequential design's undecided cells
# A claim cell whose continuing tests the next look gives seeds (linvit.decide.Driver.next_added): continuing,
# or not evaluable because another of its tests is blocked (a failure of one still stands: judge._judge).
STILL_OPEN = (sequential.CONTINUES, NOT_EVALUABLE)


def outcome_counts(cells: list[CellVerdict]) -> dict[str, int]:
    """Cells per outcome (and per NOT_TESTED, for C4's cells on a grid that varies nothing, and per
    sequential outcome where a cell has one)."""
    counts = {o: sum(c.outcome == o for c in cells) for o in OUTCOME_ORDER}
    for o in SEQUENTIAL_OUTCOMES:
        if any(c.outcome == o for c in cells):
            counts[o] = sum(c.outcome == o for c in cells)
    untested = sum(c.outcome == NOT_TESTED for c in cells)
    return {**counts, NOT_TESTED: untested} if untested else counts


def outcome_word(counts: dict[str, int]) -> str:
    """'supported' (every evaluable cell holds), 'not supported' (every one fails), 'too few seeds',
    'inconclusive', 'not evaluable', else 'mixed (1 holds, 1 fails, ...)'. Where some cells are not
    evaluable, a verdict says that it speaks for the others: 'supported in the cells judged (1 of 4)'."""
    judged = {o: n for o, n in counts.items() if o not in (NOT_EVALUABLE, NOT_TESTED)}
    n, blocked = sum(judged.values()), counts.get(NOT_EVALUABLE, 0)
    if n == 0:
        return NOT_EVALUABLE
    for outcome, word in ((HOLDS, "supported"), (FAILS, "not supported"), (TOO_FEW, TOO_FEW),
                          (INCONCLUSIVE, INCONCLUSIVE), *((o, o) for o in SEQUENTIAL_OUTCOMES)):
        if judged.get(outcome, 0) == n:
            return f"{word} in the cells judged ({n} of {n + blocked})" if blocked else word
    return "mixed (" + ", ".join(f"{k} {o}" for o, k in judged.items() if k) + ")"


def verdicts_json(verdicts: list[ClaimVerdict]) -> str:
    """claims.json's text: every verdict with its cells and tests, NaN and infinities as JSON's NaN and Infinity."""
    return json.dumps([v.as_dict() for v in verdicts], indent=2, default=_number) + "\n"


def _number(value):
    # numpy scalars from pandas reach the verdicts' numbers; NaN stays a float (json writes NaN).
    return float(value)


def write_verdicts(path: str | Path, verdicts: list[ClaimVerdict]) -> Path:
    """Write claims.json (atomically); the path written."""
    return write_text(path, verdicts_json(verdicts))


def read_verdicts(path: str | Path) -> list[ClaimVerdict]:
    """claims.json as write_verdicts wrote it: the verdicts with their cells and tests. A field the file lacks
    takes its default, one it has that the verdicts do not is ignored, and a cell's claim is its verdict's.
    OSError where the file cannot be read; ValueError where it is not JSON or holds no verdicts."""
    data = json.loads(Path(path).read_text())
    if not isinstance(data, list):
        raise ValueError(f"expected a list of verdicts, got {type(data).__name__}")
    return [_claim_verdict(v) for v in data]


def _claim_verdict(data) -> ClaimVerdict:
    claim = _fields(ClaimVerdict, data).get("claim")
    cells = {k: [_cell(c, claim) for c in data.get(k) or []] for k in ("cells", "controls")}
    return _build(ClaimVerdict, data, **cells)


def _cell(data, claim: str | None) -> CellVerdict:
    tests = [_build(TestOutcome, t) for t in _fields(CellVerdict, data).get("tests") or []]
    return _build(CellVerdict, {"claim": claim, **data}, tests=tests)


def _fields(cls, data) -> dict:
    """The entries of `data` (a mapping) that name fields of the dataclass `cls`."""
    if not isinstance(data, dict):
        raise ValueError(f"expected a mapping of {cls.__name__}'s fields, got {type(data).__name__}")
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def _build(cls, data, **given):
    try:
        return cls(**{**_fields(cls, data), **given})
    except TypeError as err:  # a field without a default is missing
        raise ValueError(f"{cls.__name__}: {err}") from None
