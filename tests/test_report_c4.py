"""The report of a C4 grid (issue 57): the `c4_forest` figure (every deciding test's final interval per linear cell
against its threshold, marked by outcome), `claims_by_budget` (the deciding tests against budget at the grid's
center), and the Decisions section's cost against the full product of the axes at the cap beside the fixed design
of the cells listed. Verdicts from test_claims_axes' grid of one axis at a time (results trees written there, no
training) or built by hand; the cost from a jobs table built here."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from matplotlib.colors import to_hex
from test_claims_axes import AROUND_GRID, judged
from test_report import STEPS
from test_report_decisions import CPU, SEQ

from linvit.claims.verdicts import NOT_EVALUABLE, CellVerdict, ClaimVerdict
from linvit.claims.verdicts import TestOutcome as Outcome  # not collected as a test class
from linvit.config import grid_cells
from linvit.figure_registry import figure
from linvit.grid import jobs as grid_jobs
from linvit.report.axes_text import axes_markdown
from linvit.report.decisions_cost import cost, spending
from linvit.report.figures import FigureInputs, draw_figure
from linvit.report.figures_c4 import (OUTCOME_STYLE, budget_cell, cell_labels, draw_c4_forest,
                                      draw_claims_by_budget)
from linvit.stats.paired import FAILS, HOLDS
from linvit.stats.sequential import CONTINUES, FUTILE

PANELS = ["C1 · attn_alone", "C1 · attn_on_top", "C2 · mlp_alone", "C2 · mlp_on_top", "C3 · matches"]
ROWS = ["center", "dataset dsB", "size small", "variant linB", "200 steps"]  # the product's order, filtered


@pytest.fixture(scope="module")
def around(tmp_path_factory):
    """test_claims_axes' grid: linA holds every claim, linB fails every one, dsB's linA reads as linB."""
    return judged(tmp_path_factory.mktemp("around"), AROUND_GRID)


def panels(fig):
    return [ax for ax in fig.axes if ax.get_title(loc="left") or ax.get_title()]


def marks(ax) -> list[tuple[float, float, str, str]]:
    """(x, y, colour, marker) of each estimate's marker (a one-point line without a line style)."""
    return [(line.get_xdata()[0], line.get_ydata()[0], to_hex(line.get_color()), line.get_marker())
            for line in ax.get_lines() if len(line.get_xdata()) == 1 and line.get_linestyle() == "None"]


def test_the_forest_draws_each_test_per_cell_against_its_threshold_by_outcome(around):
    fig = draw_c4_forest(around, AROUND_GRID)
    axes = panels(fig)
    assert [ax.get_title(loc="left").split(":")[0] for ax in axes] == PANELS  # grouped by claim, then test
    for ax, (claim, name) in zip(axes, [p.split(" · ") for p in PANELS]):
        labels = [t.get_text() for t in ax.get_yticklabels()]
        assert sorted(labels) == sorted(ROWS)  # one row per linear cell, named by the axis it moves
        verdict = next(v for v in around if v.claim == claim)
        tests = [c.test(name) for c in verdict.cells]
        # The threshold: a vertical line at the test's own (a share in %, a difference in pp).
        assert any(list(line.get_xdata()) == [100 * tests[0].threshold] * 2 for line in ax.get_lines())
        got = sorted(marks(ax), key=lambda m: m[1])
        assert len(got) == len(tests)
        for (x, y, color, marker), label in zip(got, labels):
            t = next(c.test(name) for c in verdict.cells if cell_labels(verdict.cells, AROUND_GRID)[c.key] == label)
            assert x == pytest.approx(100 * t.estimate)
            assert (color, marker) == (to_hex(OUTCOME_STYLE[t.outcome][0]), OUTCOME_STYLE[t.outcome][1])
            assert t.outcome == (FAILS if label in ("dataset dsB", "variant linB") else HOLDS)
        assert {t.get_text() for t in ax.texts} == {"5 seeds"}  # the seeds each interval is on, at the right
    assert "around the center dsA/tiny/linA/steps100" in fig.get_suptitle()
    assert "paired interval" in fig.get_suptitle()
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == [HOLDS, FAILS, "threshold"]


def sequential_verdicts() -> list[ClaimVerdict]:
    """One claim over two cells under a plan: a test that continues at look 2, one undecided within the cap, one
    held at look 1 with an unbounded upper end, one not evaluable."""
    def look(k, seeds):
        return {"look": k, "seeds": seeds}

    def cell(variant, tests):
        return CellVerdict("C1", "dsA", "tiny", variant, 100, CONTINUES, tests=tests)
    cells = [cell("linA", [Outcome("attn_alone", CONTINUES, 0.3, 0.1, 0.5, threshold=0.25, side="<=",
                                       looks=[look(1, 3), look(2, 6)]),
                           Outcome("attn_on_top", HOLDS, 0.1, -math.inf, 0.2, threshold=0.25, side="<=",
                                       stopped=1, looks=[look(1, 3)])]),
             cell("linB", [Outcome("attn_alone", FUTILE, 0.26, 0.05, 0.45, threshold=0.25, side="<=",
                                       stopped=3, looks=[look(1, 3), look(2, 6), look(3, 10)]),
                           Outcome("attn_on_top", NOT_EVALUABLE, note="no finished run of copy_mlp")])]
    return [ClaimVerdict("C1", cells=cells)]


def test_the_forest_under_a_plan_reads_the_final_look_and_says_what_is_not_evaluated():
    config = {**SEQ, "targets": ["dsA"], "variants": ["linA", "linB"]}
    fig = draw_c4_forest(sequential_verdicts(), config)
    alone, on_top = panels(fig)
    assert [t.get_text() for t in alone.get_yticklabels()] == ["linA", "linB"]  # what tells the cells apart
    assert [t.get_text() for t in alone.texts] == ["look 2, 6 seeds", "look 3, 10 seeds"]
    assert [m[2:] for m in marks(alone)] == [(to_hex(OUTCOME_STYLE[o][0]), OUTCOME_STYLE[o][1])
                                            for o in (CONTINUES, FUTILE)]
    # The unbounded lower end: clipped to the panel's edge with an arrowhead; the other cell says why it has no row.
    lo, _ = on_top.get_xlim()
    assert any(line.get_marker() == "<" and line.get_xdata()[0] == pytest.approx(lo) for line in on_top.get_lines())
    assert "not evaluable: no finished run of copy_mlp" in [t.get_text() for t in on_top.texts]
    assert "repeated interval (at the look it stopped or the last look read)" in fig.get_suptitle()
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == [HOLDS, "continues (undecided at the last look read)", FUTILE, "threshold"]


def test_the_forest_of_one_cell_has_a_row_per_test_and_nothing_to_draw_says_so():
    one = [ClaimVerdict("C1", cells=[CellVerdict("C1", "dsA", "tiny", "linA", 100, HOLDS, tests=[
        Outcome("attn_alone", HOLDS, 0.1, 0.0, 0.2, threshold=0.25, side="<=", seeds=3)])])]
    fig = draw_c4_forest(one, {})
    ax, = panels(fig)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["dsA/tiny/linA/steps100"]
    assert [t.get_text() for t in ax.texts] == ["3 seeds"]
    empty = draw_c4_forest([], {})
    assert "no deciding test in the grid's linear cells" in [t.get_text() for t in empty.axes[0].texts]


def test_claims_by_budget_draws_each_test_at_each_budget_of_the_center(around, tmp_path):
    fig = draw_claims_by_budget(around, AROUND_GRID)
    axes = [ax for ax in fig.axes if ax.get_title()]
    assert [ax.get_title().split(" (")[0] for ax in axes] == PANELS
    for ax, (claim, name) in zip(axes, [p.split(" · ") for p in PANELS]):
        verdict = next(v for v in around if v.claim == claim)
        along = {c.budget: c.test(name) for c in verdict.cells if (c.dataset, c.size, c.variant) == ("dsA", "tiny",
                                                                                                       "linA")}
        assert sorted(along) == [100, 200]
        assert [(x, y) for x, y, _, _ in marks(ax)] == [(b, pytest.approx(100 * along[b].estimate)) for b in (100, 200)]
        assert any(list(line.get_ydata()) == [100 * along[100].threshold] * 2 for line in ax.get_lines())
        assert [t.get_text() for t in ax.get_xticklabels()] == ["100", "200"]
    assert fig.get_suptitle() == "Deciding tests against the training budget at dsA/tiny/linA (the grid's center)"
    # Registered, drawn and saved as the report draws it.
    for name in ("claims_by_budget", "c4_forest"):
        assert figure(name).inputs == ("verdicts", "config") and figure(name).category == "Claims"
        png, svg = draw_figure(name, FigureInputs(AROUND_GRID, verdicts=around), tmp_path)
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and b"<svg" in svg.read_bytes()[:2000]


def test_claims_by_budget_with_one_budget_is_one_column():
    verdicts = sequential_verdicts()
    assert budget_cell(verdicts, {}) == ("dsA", "tiny", "linA")  # no center: the first cell with the most budgets
    fig = draw_claims_by_budget(verdicts, {})
    alone = next(ax for ax in fig.axes if ax.get_title().startswith("C1 · attn_alone"))
    assert [x for x, *_ in marks(alone)] == [100]
    assert fig.get_suptitle().endswith("dsA/tiny/linA (the linear cell with the most budgets): one budget, "
                                             "100 steps")


def test_the_axes_text_points_to_the_budget_figure_where_budgets_vary(around):
    text = axes_markdown(around, AROUND_GRID)
    assert "the figure `claims_by_budget` draws each deciding test's interval at each budget" in text
    one_budget = {**AROUND_GRID, "budgets": [100]}
    assert "claims_by_budget" not in axes_markdown(around, one_budget)


# -- the Decisions section's cost: the full product at the cap beside the cells listed -----------------------

LISTED = {**SEQ, "targets": ["dsA", "dsB"], "cells": {"around": {"target": "dsA", "size": "tiny", "variant": "linA",
                                                                 "budget": STEPS}}}


def jobs_frame(config: dict, cpu: dict) -> pd.DataFrame:
    """A job per training job of `config` (no file: GPU time not recorded), its CPU the kind's."""
    kinds = ["teacher" if j.rule.startswith("teacher") else j.rule for j in grid_jobs(config) if j.benchmark]
    return pd.DataFrame({"rule": kinds, "cpu_time_s": [cpu[k] for k in kinds], "path": "/nonexistent"})


def test_a_grid_of_listed_cells_is_costed_against_the_full_product_at_the_cap_too():
    # Around dsA/linA: dsB/linA and dsA/linB listed, dsB/linB not.
    assert sorted(grid_cells(LISTED)) == [("dsA", "tiny", "linA", STEPS), ("dsA", "tiny", "linB", STEPS),
                                          ("dsB", "tiny", "linA", STEPS)]
    s = spending(LISTED, jobs_frame(LISTED, CPU), 9)
    # At the cap (9 seeds): a teacher per seed either way, a reference per (target, size, budget): 2 x 9 either
    # way; distillations per (target, size, variant): 3 cells listed against 4; students 7 roles per cell.
    got = {k.kind: (k.jobs, k.fixed_jobs, k.product_jobs) for k in s.kinds}
    assert got == {"teacher": (3, 9, 9), "distill": (9, 27, 36), "student": (63, 189, 252),
                   "reference": (6, 18, 18)}
    text = cost(s)
    assert "| jobs, full product at the cap | CPU-hours, full product at the cap (est.) |" in text
    hours = {n: sum(k[i] * CPU[kind] for kind, k in got.items()) / 3600 for i, n in ((0, "spent"), (1, "fixed"),
                                                                                       (2, "product"))}
    assert f"| total | 81 | 81 | {hours['spent']:,.2f} | | 243 | {hours['fixed']:,.2f} | 315 | " \
           f"{hours['product']:,.2f} |" in text
    assert ("Jobs: 81 so far against 243 for the fixed design of the same cells, a saving of 67%, and 315 for the "
            "full product at the cap, a saving of 74%.") in text
    assert (f"CPU-hours: {hours['spent']:,.2f} so far against {hours['fixed']:,.2f} for the fixed design of the same "
            f"cells, a saving of {100 * (1 - hours['spent'] / hours['fixed']):.0f}%, and {hours['product']:,.2f} for "
            f"the full product at the cap, a saving of {100 * (1 - hours['spent'] / hours['product']):.0f}%.") in text
    assert "the config without `cells`" in text


def test_a_full_product_grid_says_the_fixed_design_alone():
    s = spending(SEQ, jobs_frame(SEQ, CPU), 9)
    assert not s.listed and all(k.product_jobs is None for k in s.kinds)
    text = cost(s)
    assert "full product" not in text and "of the same cells" not in text
    assert "| jobs fixed at the cap | CPU-hours fixed at the cap (est.) |\n|---|---|---|---|---|---|---|\n" in text
