"""The grid's design and its axes, as the claims read them.

A grid is the full product of its axes by default; `cells: {around: ...}` lists a center and each axis varied
with the others at the center's values (one axis at a time); `cells: [...]` lists its cells
(linvit.config.grid_cells). The claims are judged in the cells listed (table.claim_cells), and an axis is read
value by value along cells (`along`):

- the full product, or listed cells: every cell with that value (in the product they span the same combinations
  of the other axes for every value; listed cells may differ in the other axes too);
- around a center: the cells that vary that axis with the others at the center's values, so that the value's
  reading differs from the center's in that axis alone.

C4's reading per axis (judge._c4) and each claim's per axis (`readings`, said by the report) are read this way.
Numbers only: the words are the report's (linvit.report.axes_text).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from linvit.claims.table import linear_variants
from linvit.claims.verdicts import NOT_EVALUABLE, CellVerdict, ClaimVerdict, TestOutcome
from linvit.config import budgets
from linvit.stats.paired import FAILS, HOLDS

PRODUCT, AROUND, LISTED = "full product", "around a center", "listed"
# The axes a claim is read along: the verdicts' name for each (C4's `axes` keys, and budgets) and a cell's field.
AXES = (("datasets", "dataset"), ("sizes", "size"), ("variants", "variant"), ("budgets", "budget"))


def grid_design(config: dict) -> str:
    """PRODUCT (no `cells`), AROUND (`cells: {around: ...}`) or LISTED (`cells: [...]`)."""
    spec = config.get("cells")
    return PRODUCT if spec is None else AROUND if isinstance(spec, dict) else LISTED


def center(config: dict) -> dict | None:
    """The center of a grid around one, as a cell's fields ({dataset, size, variant, budget}); else None."""
    spec = config.get("cells")
    if not isinstance(spec, dict):
        return None
    given = spec["around"]
    return {"dataset": given["target"], "size": given["size"], "variant": given["variant"],
            "budget": int(given["budget"])}


def axis_values(config: dict, axis: str) -> list:
    """An axis's values in the config's order (the variants' without the softmax control, which decides nothing)."""
    if axis == "budgets":
        return budgets(config)
    return linear_variants(config) if axis == "variants" else list(config["targets" if axis == "datasets" else axis])


def along(cells: list[CellVerdict], config: dict, axis: str, value) -> list[CellVerdict]:
    """The cells a value of an axis is read along: those with the value, and around a center the others at the
    center's values."""
    column, mid = dict(AXES)[axis], center(config)
    return [c for c in cells if getattr(c, column) == value
            and (mid is None or all(getattr(c, f) == mid[f] for _, f in AXES if f != column))]


@dataclass
class AxisReading:
    """One claim along one axis: each value of the axis with the cells it is read along."""

    claim: str
    axis: str
    values: list[tuple[object, list[CellVerdict]]] = field(default_factory=list)


def readings(verdicts: list[ClaimVerdict], config: dict) -> list[AxisReading]:
    """C1-C3 along every axis the grid varies (two values or more; budgets included), claim by claim."""
    varied = [axis for axis, _ in AXES if len(axis_values(config, axis)) > 1]
    return [AxisReading(v.claim, axis, [(x, along(v.cells, config, axis, x)) for x in axis_values(config, axis)])
            for v in verdicts if v.claim != "C4" for axis in varied]


def reading_tests(cell: CellVerdict) -> list[TestOutcome]:
    """The deciding tests that make a claim's cell read as it does: those that failed where it fails, every one
    where it holds, else those evaluated that did not hold (what leaves it undecided)."""
    tests = [t for t in cell.tests if t.decides]
    if cell.outcome == FAILS:
        return [t for t in tests if t.outcome == FAILS]
    if cell.outcome == HOLDS:
        return tests
    return [t for t in tests if t.outcome not in (HOLDS, NOT_EVALUABLE)]
