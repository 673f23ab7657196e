"""The claims over a grid that lists its cells (issue 57): a grid of one axis at a time (`cells: {around: ...}`)
judged end to end from results trees written here (no training). The claims are judged in the cells listed and
nowhere else, C4's family is every (claim, cell, budget) listed (Holm's under a fixed design, Bonferroni's under a
plan), each axis is read along the cells that vary it with the others at the center's, and the report says per
claim and axis where the claim holds or fails with its deciding tests' intervals, which design the grid used and
what it cannot see."""

from __future__ import annotations

import pytest
from test_claims import ACC, BASE, OFFSET
from test_report import write_cell

from linvit.claims import judge
from linvit.claims.axes import AROUND, LISTED, PRODUCT, grid_design, readings
from linvit.claims.table import Design, claim_cells
from linvit.config import grid_cells
from linvit.grid import all_cells
from linvit.report import collect, load_predictions
from linvit.report.claims_text import claims_markdown, rules_markdown
from linvit.report.tables import _cost_cells
from linvit.stats import multitest, sequential
from linvit.stats.paired import FAILS

CENTER = {"target": "dsA", "size": "tiny", "variant": "linA", "budget": 100}
# Two values on every axis: the product has 16 cells, one axis at a time around the center 5.
AROUND_GRID = {**BASE, "targets": ["dsA", "dsB"], "sizes": ["tiny", "small"], "variants": ["linA", "linB"],
               "budgets": [100, 200], "seeds": [0, 1, 2, 3, 4], "cells": {"around": CENTER}}
LISTED_CELLS = [(d, s, v, b) for d, s, v, b in sorted(grid_cells(AROUND_GRID))]


def accuracy(cell) -> float:
    """linA: every claim holds, linB: every one fails (test_claims' ACC); on dsB linA reads as linB does, so a
    reading of linA over every cell that has it would be mixed, while along the center's line it holds."""
    variant = "linB" if cell.dataset == "dsB" else cell.variant
    base = 0.80 if cell.is_reference else ACC[variant][cell.init]
    return round(base + OFFSET[cell.seed], 3)


def judged(tmp_path, config, monkeypatch=None):
    for cell in all_cells(config):
        write_cell(tmp_path, cell, accuracy(cell), predictions=True)
    runs, _ = collect(config, tmp_path)
    return judge.evaluate_claims(runs, config, load_predictions(runs))


def test_the_claims_are_judged_in_the_cells_listed_and_c4s_family_is_theirs(tmp_path, monkeypatch):
    families = []
    holm = multitest.holm
    monkeypatch.setattr(multitest, "holm", lambda p, alpha: families.append(len(p)) or holm(p, alpha))
    verdicts = {v.claim: v for v in judged(tmp_path, AROUND_GRID)}
    listed = [("dsA", "tiny", "linA", 100), ("dsB", "tiny", "linA", 100), ("dsA", "small", "linA", 100),
              ("dsA", "tiny", "linB", 100), ("dsA", "tiny", "linA", 200)]
    assert sorted(claim_cells(AROUND_GRID)) == sorted(listed) and len(grid_cells({**AROUND_GRID, "cells": None})) == 16
    # In the product's order (budget by budget), filtered: the full product's order is kept.
    assert claim_cells(AROUND_GRID) == [c for c in claim_cells({**AROUND_GRID, "cells": None}) if c in listed]
    assert _cost_cells(AROUND_GRID) == [c for c in _cost_cells({**AROUND_GRID, "cells": None}) if c in listed]
    for claim in ("C1", "C2", "C3", "C4"):
        assert sorted((c.dataset, c.size, c.variant, c.budget) for c in verdicts[claim].cells) == sorted(listed)
    assert families == [3 * 5]  # Holm over every (claim, cell, budget) listed: m = 15, not 3 x 16 = 48
    assert "m = 3 claims x 5 linear cells listed in `cells` (each with its budget) = 15" in rules_markdown(
        {**AROUND_GRID, "sequential": {"looks": [5, 10]}})
    c4 = verdicts["C4"]
    # Along the center's line: linA is the center alone (holds), linB fails; dsB's linA cell reads on the
    # datasets axis only.
    assert c4.axes["variants"] == "linA: supported; linB: not supported"
    assert c4.axes["datasets"] == "dsA: supported; dsB: not supported"
    assert c4.axes["sizes"] == "tiny: supported; small: supported"


def test_under_a_plan_c4_spends_alpha_over_the_cells_listed(monkeypatch):
    """Bonferroni under a sequential plan: each failure is read at alpha / (k m), m = 3 x the cells listed."""
    config = {**AROUND_GRID, "sequential": {"looks": [5, 10]}}
    spent = []
    monkeypatch.setattr(sequential, "fails_at", lambda looks, alpha, plan, share=None: spent.append(alpha) or False)
    from linvit.claims.verdicts import CellVerdict, ClaimVerdict, TestOutcome
    test = TestOutcome("matches", FAILS, looks=[{"look": 1}])
    cells = [CellVerdict("C3", d, s, v, b, FAILS, tests=[test]) for d, s, v, b in claim_cells(config)]
    verdicts = [ClaimVerdict(name, cells=[CellVerdict(name, c.dataset, c.size, c.variant, c.budget, c.outcome,
                                                      tests=c.tests) for c in cells]) for name in ("C1", "C2", "C3")]
    judge._c4(verdicts, config, judge.paired.Settings(), Design.from_config(config))
    assert {round(a * 15 / 0.025, 9) for a in spent} == {0.5, 1.0}  # alpha / (k x 15): C1 and C2's k is 2, C3's 1


def test_each_axis_is_read_along_its_values_and_the_words_say_the_design(tmp_path):
    verdicts = judged(tmp_path, AROUND_GRID)
    found = readings(verdicts, AROUND_GRID)
    assert [(r.claim, r.axis) for r in found] == [(c, a) for c in ("C1", "C2", "C3")
                                                  for a in ("datasets", "sizes", "variants", "budgets")]
    values = {"datasets": ["dsA", "dsB"], "sizes": ["tiny", "small"], "variants": ["linA", "linB"],
              "budgets": [100, 200]}
    center = ("dsA", "tiny", "linA", 100)
    for r in found:
        assert [x for x, _ in r.values] == values[r.axis]  # exactly the axis's values
        assert all(len(cells) == 1 for _, cells in r.values)  # one cell each: the center's line
        assert (r.values[0][1][0].dataset, r.values[0][1][0].size, r.values[0][1][0].variant,
                r.values[0][1][0].budget) == center
    text = claims_markdown(verdicts, None, AROUND_GRID)
    assert "around the center `dsA/tiny/linA/steps100`" in text
    assert "One axis at a time: interactions between axes are not seen" in text
    line = next(x for x in text.splitlines() if x.startswith("- C1 by variant: "))
    c1 = {(c.dataset, c.variant, c.size, c.budget): c for c in verdicts[0].cells}
    alone = c1[("dsA", "linA", "tiny", 100)].test("attn_alone")
    assert line.startswith("- C1 by variant: linA holds (attn_alone -10.0% [") and ", linB fails (attn_alone +50.0%" in line
    assert f"{alone.low * 100:+.1f}%" in line
    assert "- C1 by budget: 100 steps holds (" in text and "200 steps holds (" in text
    assert "- C3 by dataset: dsA holds (matches +1.00 pp" in text and "dsB fails (matches -5.00 pp" in text
    # Without the config (the older call) the section is as before: no readings.
    assert "C1 by variant" not in claims_markdown(verdicts)


def test_the_grids_design_is_named(tmp_path):
    listed = {**AROUND_GRID, "cells": [dict(zip(("target", "size", "variant", "budget"), c)) for c in LISTED_CELLS]}
    product = {k: v for k, v in AROUND_GRID.items() if k != "cells"}
    assert [grid_design(c) for c in (product, AROUND_GRID, listed)] == [PRODUCT, AROUND, LISTED]
    from linvit.report.axes_text import design_markdown
    assert "The grid lists its cells (`cells: [...]`, 5 of the product's 16 linear cells)" in design_markdown(listed)
    assert "combinations not listed are not seen" in design_markdown(listed)
    assert design_markdown(product).startswith("The grid is the full product of its axes")


@pytest.mark.parametrize("variants", [["linA"], ["linA", "linB"]])
def test_a_full_product_reads_every_cell_that_has_the_value(tmp_path, variants):
    """The default grid varies no axis: nothing is added to C4's section; a product that varies one reads each
    value over every cell that has it."""
    config = {**BASE, "variants": variants}
    verdicts = judged(tmp_path, config)
    text = claims_markdown(verdicts, None, config)
    assert (text == claims_markdown(verdicts)) == (len(variants) == 1)
    if len(variants) == 2:
        assert "The grid is the full product of its axes" in text and "- C2 by variant: linA holds" in text
