"""The C4 figures: `c4_forest`, C4 at a glance (every deciding test's final interval in every linear cell against
its threshold, one row per cell, marked by the test's outcome), and `claims_by_budget`, each claim's deciding tests
against the training budget in one cell, the grid's center (do the verdicts survive longer training?).

A test's final interval is its own: under a fixed design the claims' paired interval, under a sequential plan the
repeated interval at the look it stopped at or the last look read (TestOutcome's estimate, low and high are that
look's). Shares are in %, differences in pp, an unbounded end clipped to the panel's edge with an arrowhead, as in
figures_tests. Drawn as the other figure families draw (an Agg `Figure`, no pyplot); the entries in
linvit.figure_registry name and caption them, linvit.report.figures saves them.
"""

from __future__ import annotations

import math
import textwrap

import seaborn as sns
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from linvit.claims.axes import AXES, center
from linvit.claims.verdicts import NOT_EVALUABLE, CellVerdict, ClaimVerdict, TestOutcome
from linvit.report.figures_accuracy import _budget_axis
from linvit.report.figures_common import _no_results
from linvit.report.figures_tests import _STATISTICS, THRESHOLD_STYLE, _clip, _limits, _scaled
from linvit.stats.paired import FAILS, HOLDS, INCONCLUSIVE, TOO_FEW
from linvit.stats.sequential import CONTINUES, FUTILE

# A test's outcome as both figures mark it: colour, marker, legend label (in this order in the legend).
OUTCOME_STYLE = {
    HOLDS: ("#2ca02c", "o", HOLDS),
    FAILS: ("#d62728", "s", FAILS),
    CONTINUES: ("#ff7f0e", "D", "continues (undecided at the last look read)"),
    FUTILE: ("#8c564b", "v", FUTILE),
    INCONCLUSIVE: ("0.45", "o", INCONCLUSIVE),
    TOO_FEW: ("0.6", "X", TOO_FEW),
}
_OTHER = ("0.6", "o")  # an outcome without a style of its own: its word in the legend
_FIELDS = [f for _, f in AXES]  # a cell's dataset, size, variant, budget


def _style(outcome: str) -> tuple[str, str, str]:
    return OUTCOME_STYLE.get(outcome, (*_OTHER, outcome))


def _panels(verdicts: list[ClaimVerdict], keep=lambda cell: True) -> dict[tuple[str, str], list]:
    """(claim, test) -> [(cell, test)] for every deciding test of every linear cell `keep` accepts, claim by claim
    and test by test in the verdicts' order."""
    panels: dict[tuple[str, str], list[tuple[CellVerdict, TestOutcome]]] = {}
    for v in verdicts:
        for cell in v.cells:
            if keep(cell):
                for t in cell.tests:
                    if t.decides:
                        panels.setdefault((v.claim, t.name), []).append((cell, t))
    return panels


def _title(claim: str, t: TestOutcome, wrap: bool = False) -> str:
    """'C1 · attn_alone: attention copied alone (strict) (<= 25%)'; with `wrap`, the statistic's words on lines
    of their own (a narrow panel)."""
    stat = _STATISTICS[t.name]
    threshold = "" if math.isnan(t.threshold) else \
        f" ({t.side} {_scaled(t.threshold):g}{'%' if stat.is_share else ' pp'})"
    if wrap:
        return f"{claim} · {t.name}{threshold}\n" + textwrap.fill(stat.label, 48)
    return f"{claim} · {t.name}: {stat.label}{threshold}"


def _unit(name: str) -> str:
    return "share of the benefit (%)" if _STATISTICS[name].is_share else "difference (pp)"


def cell_labels(cells: list[CellVerdict], config: dict | None) -> dict[str, str]:
    """Each cell's row label: around a center, 'center' or the axis it moves ('variant relu'); otherwise the
    fields that tell the cells apart ('elu/steps800'), the whole key for a single cell."""
    cells = list({c.key: c for c in cells}.values())
    mid = center(config or {})

    def value(cell, f):
        return f"steps{cell.budget}" if f == "budget" else str(getattr(cell, f))
    if mid is not None:
        return {c.key: ", ".join(f"{c.budget} steps" if f == "budget" else f"{f} {value(c, f)}" for f in _FIELDS
                                 if getattr(c, f) != mid[f]) or "center" for c in cells}
    apart = [f for f in _FIELDS if len({getattr(c, f) for c in cells}) > 1]
    return {c.key: "/".join(value(c, f) for f in apart) if apart else c.key for c in cells}


def _where(t: TestOutcome) -> str:
    """The seeds the final interval is on (under a plan: the look it was read at)."""
    if t.looks:
        last = t.looks[-1]
        return f"look {last['look']}, {last['seeds']} seeds"
    return f"{t.seeds} seeds" if t.seeds else ""


def _figure(width: float, height: float, rows: int, cols: int = 1, ratios: list[float] | None = None):
    with sns.axes_style("whitegrid"), sns.plotting_context("paper"):
        fig = Figure(figsize=(width, height), layout="constrained")
        FigureCanvasAgg(fig)
        axes = fig.subplots(rows, cols, squeeze=False, gridspec_kw={"height_ratios": ratios} if ratios else None)
    return fig, axes.ravel()


def _legend(fig: Figure, outcomes: set[str]) -> None:
    order = [o for o in OUTCOME_STYLE if o in outcomes] + sorted(outcomes - set(OUTCOME_STYLE))
    handles = [Line2D([], [], color=_style(o)[0], marker=_style(o)[1], linestyle="-", label=_style(o)[2])
               for o in order]
    handles.append(Line2D([], [], label="threshold", **THRESHOLD_STYLE))
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 3), frameon=False)


def draw_c4_forest(verdicts: list[ClaimVerdict], config: dict) -> Figure:
    """One panel per claim and deciding test (its threshold a dashed vertical line), one row per linear cell: the
    final estimate and interval, marked by the test's outcome, the seeds (and look) it was read on at the right;
    a test not evaluated in a cell says so in its row."""
    panels = _panels(verdicts or [])
    sizes = [len(rows) for rows in panels.values()] or [1]
    fig, axes = _figure(7.5, sum(0.9 + 0.3 * n for n in sizes) + 0.8, len(sizes), ratios=[0.9 + 0.3 * n for n in sizes])
    if not panels:
        axes[0].set_axis_off()
        _no_results(axes[0], "no deciding test in the grid's linear cells")
    labels = cell_labels([c for rows in panels.values() for c, _ in rows], config)
    outcomes = set()
    for ax, ((claim, name), rows) in zip(axes, panels.items()):
        threshold = _scaled(rows[0][1].threshold)
        lo, hi = _limits([_scaled(v) for _, t in rows for v in (t.estimate, t.low, t.high)],
                         threshold if math.isfinite(threshold) else 0.0)
        for y, (cell, t) in enumerate(rows):
            _row(ax, y, t, lo, hi)
            outcomes |= {t.outcome} if math.isfinite(t.estimate) else set()
        if not math.isnan(threshold):
            ax.axvline(threshold, **THRESHOLD_STYLE)
        ax.set_xlim(lo, hi)
        ax.set_ylim(-0.6, len(rows) - 0.4)
        ax.set_yticks(range(len(rows)), [labels[c.key] for c, _ in rows])
        ax.invert_yaxis()
        ax.set_title(_title(claim, rows[0][1]), loc="left")
        ax.set_xlabel(_unit(name))
    _legend(fig, outcomes)
    sequential = any(t.looks for rows in panels.values() for _, t in rows)
    mid = center(config or {})
    at = f" around the center {mid['dataset']}/{mid['size']}/{mid['variant']}/steps{mid['budget']}" if mid else ""
    fig.suptitle(f"C4 at a glance{at}: each deciding test's final "
                 + ("repeated interval (at the look it stopped or the last look read)" if sequential else
                    "paired interval") + " per linear cell")
    return fig


def _row(ax, y: float, t: TestOutcome, lo: float, hi: float) -> None:
    """One cell's test: its interval and estimate, or the outcome in words where it has no estimate."""
    est, low, high = (_scaled(v) for v in (t.estimate, t.low, t.high))
    if not math.isfinite(est):
        words = f"{t.outcome}: {t.note}" if t.outcome == NOT_EVALUABLE and t.note else t.outcome
        ax.text((lo + hi) / 2, y, words[:80], ha="center", va="center", color="0.4", fontsize=7)
        return
    color, marker, _ = _style(t.outcome)
    if not (math.isnan(low) or math.isnan(high)):
        ax.plot([_clip(low, lo, hi), _clip(high, lo, hi)], [y, y], color=color, linewidth=1.6)
        for end, tip in ((low, "<"), (high, ">")):
            if math.isinf(end):
                ax.plot([_clip(end, lo, hi)], [y], marker=tip, color=color)
    ax.plot([est], [y], marker=marker, color=color, markersize=6, linestyle="none")
    where = _where(t)
    if where:
        ax.annotate(where, xy=(1, y), xycoords=("axes fraction", "data"), xytext=(4, 0), textcoords="offset points",
                    ha="left", va="center", fontsize=7, color="0.3")


def budget_cell(verdicts: list[ClaimVerdict], config: dict | None) -> tuple[str, str, str] | None:
    """The (dataset, size, variant) claims_by_budget reads along the budgets: the grid's center, else the linear
    cell with the most budgets (the first in the verdicts' order among equals); None without linear cells."""
    mid = center(config or {})
    if mid is not None:
        return mid["dataset"], mid["size"], mid["variant"]
    found: dict[tuple[str, str, str], set] = {}
    for v in verdicts or []:
        for c in v.cells:
            found.setdefault((c.dataset, c.size, c.variant), set()).add(c.budget)
    return max(found, key=lambda k: len(found[k])) if found else None


def draw_claims_by_budget(verdicts: list[ClaimVerdict], config: dict) -> Figure:
    """One panel per claim and deciding test: at each budget (log2 axis) of one cell (budget_cell) the final
    estimate and interval, marked by the test's outcome, joined across budgets, the threshold dashed. A grid
    with one budget draws its one column."""
    where = budget_cell(verdicts, config)
    panels = {} if where is None else _panels(verdicts, lambda c: (c.dataset, c.size, c.variant) == where)
    n = max(len(panels), 1)
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    fig, axes = _figure(3.8 * cols, 2.9 * rows + 0.8, rows, cols)
    for ax in axes[len(panels):]:
        ax.set_axis_off()
    if not panels:
        _no_results(axes[0], "no deciding test in the grid's linear cells")
    budgets = sorted({c.budget for tests in panels.values() for c, _ in tests})
    outcomes = set()
    for ax, ((claim, name), tests) in zip(axes, panels.items()):
        tests = sorted(tests, key=lambda ct: ct[0].budget)
        threshold = _scaled(tests[0][1].threshold)
        lo, hi = _limits([_scaled(v) for _, t in tests for v in (t.estimate, t.low, t.high)],
                         threshold if math.isfinite(threshold) else 0.0)
        drawn = [(c.budget, _scaled(t.estimate)) for c, t in tests if math.isfinite(t.estimate)]
        ax.plot([b for b, _ in drawn], [_clip(e, lo, hi) for _, e in drawn], color="0.6", linewidth=0.9)
        for cell, t in tests:
            outcomes |= _point(ax, cell.budget, t, lo, hi, threshold)
        if not math.isnan(threshold):
            ax.axhline(threshold, **THRESHOLD_STYLE)
        ax.set_ylim(lo, hi)
        _budget_axis(ax, budgets)
        ax.set_title(_title(claim, tests[0][1], wrap=True), fontsize=8)
        ax.set_xlabel("training budget (student steps)")
        ax.set_ylabel(_unit(name))
    _legend(fig, outcomes)
    if where is not None:
        cells = {(c.dataset, c.size, c.variant) for v in verdicts for c in v.cells}
        which = (" (the grid's center)" if center(config or {}) else
                 " (the linear cell with the most budgets)" if len(cells) > 1 else "")
        one = f": one budget, {budgets[0]} steps" if len(budgets) == 1 else ""
        fig.suptitle(f"Deciding tests against the training budget at {'/'.join(where)}{which}{one}")
    return fig


def _point(ax, budget: int, t: TestOutcome, lo: float, hi: float, threshold: float) -> set[str]:
    """One budget's test: its interval and estimate, or the outcome in words at the threshold; the outcome drawn."""
    est, low, high = (_scaled(v) for v in (t.estimate, t.low, t.high))
    if not math.isfinite(est):
        ax.text(budget, threshold if math.isfinite(threshold) else (lo + hi) / 2, t.outcome, ha="center",
                va="bottom", color="0.4", fontsize=7)
        return set()
    color, marker, _ = _style(t.outcome)
    if not (math.isnan(low) or math.isnan(high)):
        ax.plot([budget, budget], [_clip(low, lo, hi), _clip(high, lo, hi)], color=color, linewidth=1.4)
        for end, tip in ((low, "v"), (high, "^")):
            if math.isinf(end):
                ax.plot([budget], [_clip(end, lo, hi)], marker=tip, color=color, markersize=5)
    ax.plot([budget], [est], marker=marker, color=color, markersize=6, linestyle="none")
    return {t.outcome}
