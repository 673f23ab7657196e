"""The figure `claim_tests`: every deciding test of every linear cell against its threshold, one panel per test.

A fixed design draws each cell's estimate with the test's own paired interval (the claims' interval, seeds and
test images paired, at `claims.level`). A sequential plan draws each cell's estimate and repeated interval at
each look against the seeds of that look, the stopping look ringed. Shares are in %, differences in pp; an
unbounded end (a share whose benefit is not established) is clipped to the panel's edge, an arrowhead there.
Drawn as the other figure families draw (an Agg `Figure`, no pyplot); its entry in linvit.figure_registry
names and captions it, linvit.report.figures saves it.
"""

from __future__ import annotations

import math

import seaborn as sns
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from linvit.claims.table import CLAIMS
from linvit.claims.verdicts import NOT_EVALUABLE, ClaimVerdict, TestOutcome
from linvit.report.decisions import deciding_tests

THRESHOLD_STYLE = {"color": "black", "linestyle": "--", "linewidth": 1.0}
_STATISTICS = {t.statistic.name: t.statistic for c in CLAIMS for t in c.tests}


def draw_claim_tests(verdicts: list[ClaimVerdict], looks: list[int] | None) -> Figure:
    """The figure; `looks`: the plan's looks (config `sequential.looks`), None for a fixed design."""
    sequential = bool(looks)
    panels: dict[str, list[tuple[str, TestOutcome]]] = {}
    for claim, key, _, t in deciding_tests(verdicts):
        if t.outcome != NOT_EVALUABLE and (t.looks if sequential else math.isfinite(t.estimate)):
            panels.setdefault(f"{claim} · {t.name}", []).append((key, t))
    cells = list(dict.fromkeys(key for tests in panels.values() for key, _ in tests))
    colors = dict(zip(cells, sns.color_palette("tab10" if len(cells) <= 10 else "husl", len(cells))))
    n = max(len(panels), 1)
    cols = min(n, 3)
    rows = math.ceil(n / cols)
    with sns.axes_style("whitegrid"), sns.plotting_context("paper"):
        fig = Figure(figsize=(4.2 * cols, (3.0 if sequential else 1.4 + 0.3 * len(cells)) * rows),
                     layout="constrained")
        FigureCanvasAgg(fig)
        axes = fig.subplots(rows, cols, squeeze=False).ravel()
    for ax in axes[len(panels):]:
        ax.set_axis_off()
    if not panels:
        axes[0].set_axis_on()
        axes[0].text(0.5, 0.5, "no deciding test could be evaluated", ha="center", va="center",
                     transform=axes[0].transAxes, color="0.4")
    for ax, (title, tests) in zip(axes, panels.items()):
        name = tests[0][1].name
        share = _STATISTICS[name].is_share
        if sequential:
            _looks(ax, tests, colors, looks)
        else:
            _intervals(ax, tests, colors)
        ax.set_title(f"{title} ({tests[0][1].side} {_scaled(tests[0][1].threshold):g}{'%' if share else ' pp'})")
        unit = "share of the benefit (%)" if share else "difference (pp)"
        if sequential:
            ax.set_xlabel("paired seeds at the look")
            ax.set_ylabel(unit)
        else:
            ax.set_xlabel(unit)
    handles = [Line2D([], [], color=colors[c], marker="o", linestyle="-" if sequential else "none", label=c)
               for c in cells]
    handles.append(Line2D([], [], label="threshold", **THRESHOLD_STYLE))
    if sequential:
        handles.append(Line2D([], [], color="black", marker="o", markersize=10, markerfacecolor="none",
                              linestyle="none", label="stopped"))
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 4), frameon=False)
    fig.suptitle("Deciding tests against their thresholds" + (": each look's repeated interval" if sequential
                                                              else ": the claims' paired intervals"))
    return fig


def _scaled(x: float) -> float:
    return 100 * x


def _limits(values: list[float], threshold: float) -> tuple[float, float]:
    finite = [v for v in values if math.isfinite(v)] + [threshold]
    lo, hi = min(finite), max(finite)
    pad = 0.1 * (hi - lo) or max(abs(hi), 1.0) * 0.1
    return lo - pad, hi + pad


def _clip(x: float, lo: float, hi: float) -> float:
    return min(max(x, lo), hi)


def _intervals(ax, tests: list[tuple[str, TestOutcome]], colors: dict) -> None:
    """A fixed design: one row per cell, its estimate and interval horizontal, the threshold a vertical line."""
    threshold = _scaled(tests[0][1].threshold)
    lo, hi = _limits([_scaled(v) for _, t in tests for v in (t.estimate, t.low, t.high)], threshold)
    for y, (key, t) in enumerate(tests):
        est, low, high = (_scaled(v) for v in (t.estimate, t.low, t.high))
        if not (math.isnan(low) or math.isnan(high)):
            ax.plot([_clip(low, lo, hi), _clip(high, lo, hi)], [y, y], color=colors[key], linewidth=1.5)
            for end, marker in ((low, "<"), (high, ">")):
                if math.isinf(end):
                    ax.plot([_clip(end, lo, hi)], [y], marker=marker, color=colors[key])
        ax.plot([est], [y], marker="o", color=colors[key])
    ax.axvline(threshold, **THRESHOLD_STYLE)
    ax.set_xlim(lo, hi)
    ax.set_ylim(-0.6, len(tests) - 0.4)
    ax.set_yticks(range(len(tests)), [key for key, _ in tests])
    ax.invert_yaxis()


def _looks(ax, tests: list[tuple[str, TestOutcome]], colors: dict, looks: list[int]) -> None:
    """A sequential plan: per cell its estimate and repeated interval at each look (x: seeds, every look of the
    plan to the cap), cells slightly apart."""
    threshold = _scaled(tests[0][1].threshold)
    values = [_scaled(x[k]) for _, t in tests for x in t.looks for k in ("estimate", "low", "high")]
    lo, hi = _limits(values, threshold)
    step = (looks[-1] - looks[0]) / len(looks)
    for i, (key, t) in enumerate(tests):
        shift = (i - (len(tests) - 1) / 2) * 0.15 * step / max(len(tests), 1)
        xs = [x["seeds"] + shift for x in t.looks]
        est = [_clip(_scaled(x["estimate"]), lo, hi) for x in t.looks]
        ax.plot(xs, est, color=colors[key], marker="o", markersize=4, linewidth=1.0)
        for xpos, x in zip(xs, t.looks):
            low, high = _scaled(x["low"]), _scaled(x["high"])
            if math.isnan(low) or math.isnan(high):
                continue
            ax.plot([xpos, xpos], [_clip(low, lo, hi), _clip(high, lo, hi)], color=colors[key], linewidth=1.2)
            for end, marker in ((low, "v"), (high, "^")):
                if math.isinf(end):
                    ax.plot([xpos], [_clip(end, lo, hi)], marker=marker, color=colors[key], markersize=5)
        if t.stopped:
            ax.plot([xs[-1]], [est[-1]], marker="o", markersize=11, markerfacecolor="none", color="black",
                    linestyle="none")
    ax.axhline(threshold, **THRESHOLD_STYLE)
    ax.set_ylim(lo, hi)
    ax.set_xticks(list(looks))
    ax.set_xlim(looks[0] - step, looks[-1] + step)
