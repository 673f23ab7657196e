"""The accuracy figures: accuracy by init strategy and design and the training curves (both at the
grid's largest budget), accuracy against the training budget, and the gap closed as a heatmap.

Each draw_* function returns an Agg-backed `Figure`; its entry in linvit.figure_registry names it and the
inputs it takes, linvit.report.figures draws and saves it.
"""

from __future__ import annotations

import contextlib
from typing import NamedTuple

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import NullLocator

from linvit.report.figures_common import (CI_LABEL, CI_SEED, MEAN_COLOR, REFERENCE_LABEL, REFERENCE_STYLE, SEED_COLOR,
                                          _at_budget, _at_steps, _budget_label, _finish, _finished, _init_colors,
                                          _is_reference, _largest_budget, _level_text, _line_label, _lines,
                                          _no_results, _panel_grid, _reference, _seed_ci, _select, _with_axes,
                                          variant_label)


class Plotted(NamedTuple):
    """What a per-(init, design) figure draws: `data`, the rows at `budget` with a `line` column
    (_line_label: "init", or "init [design]" for a distilling strategy; the softmax reference's rows
    keep theirs), `lines`, the students' (init, design) pairs in order, `labels`, their labels, and
    `budget`, the student steps shown (NaN for a table without budgets: every row)."""
    data: pd.DataFrame
    lines: list[tuple[str, str]]
    labels: list[str]
    budget: float


def plotted(frame: pd.DataFrame, config: dict, budget: float | None = None) -> Plotted:
    """`frame` (runs or curves; `design` and `budget` filled in when absent) at `budget`, by default
    its largest, labelled per (init, design). The lines are those of the whole frame (every budget, every
    status), in _lines' order, so categories and colours stay the same across figures and panels."""
    frame = _with_axes(frame)
    budget = _largest_budget(frame) if budget is None else float(budget)
    lines = _lines(frame, config)
    data = _at_budget(frame, budget)
    data = data.assign(line=[_line_label(p) for p in zip(data["init"], data["design"])])
    return Plotted(data, lines, [_line_label(line) for line in lines], budget)


def draw_accuracy_by_init(runs: pd.DataFrame, config: dict, budget: float | None = None) -> Figure:
    """Final test accuracy per init strategy and design ("init [design]"), at the largest budget of
    the grid (or `budget`): seed points, mean with its t interval over seeds (_seed_ci), the reference
    (same budget) as a dashed line."""
    grid = plotted(runs, config, budget)  # every expected cell: the grid's categories and largest budget
    ok = grid.data[grid.data["status"] == "ok"]
    labels = grid.labels
    fig, panels = _panel_grid(config, width=max(3.2, 0.45 * len(labels) + 1.0), height=3.0)
    for (dataset, size, variant), ax in panels.items():
        data = _select(ok, dataset, size, variant).dropna(subset=["test_acc"])
        reference = _reference(ok, dataset, size)["test_acc"].dropna()
        if data.empty and reference.empty:
            _no_results(ax)
            continue
        if not data.empty:
            with _fixed_global_rng(CI_SEED):  # stripplot jitters with np.random's global state
                sns.stripplot(data=data, x="line", y="test_acc", order=labels, ax=ax, color=SEED_COLOR, size=4,
                              jitter=0.12)
            sns.pointplot(data=data, x="line", y="test_acc", order=labels, ax=ax, errorbar=_seed_ci(config),
                          color=MEAN_COLOR, linestyle="none", markers="_", markersize=14, err_kws={"linewidth": 1.2})
        if not reference.empty:
            ax.axhline(reference.mean(), **REFERENCE_STYLE)
        ax.set_xticks(range(len(labels)), labels, rotation=45, ha="right")
    handles = [Line2D([], [], color=SEED_COLOR, marker="o", linestyle="none", markersize=4, label="seed"),
               Line2D([], [], color=MEAN_COLOR, marker="_", linestyle="none", markersize=14,
                      label=f"mean, {_level_text(config)} {CI_LABEL}")]
    if _is_reference(ok).any():
        handles.append(Line2D([], [], label=REFERENCE_LABEL, **REFERENCE_STYLE))
    at = _at_steps(grid.budget)
    _finish(fig, panels, xlabel="init strategy [design]", ylabel="test accuracy" + (f" at {at}" if at else ""),
            handles=handles)
    if at:
        fig.suptitle(f"Largest budget: {at} (student training)")
    return fig


def draw_training_curves(curves: pd.DataFrame, config: dict, budget: float | None = None) -> Figure:
    """Test accuracy against step, one line per init strategy and design (hue; band = std over seeds),
    softmax reference dashed, at the largest budget of `curves` (or `budget`): curves of different
    budgets have different lengths and learning-rate schedules, so they are not mixed."""
    shown = plotted(curves, config, budget)
    palette = dict(zip(shown.labels, _init_colors(len(shown.labels))))
    fig, panels = _panel_grid(config, width=4.2, height=3.0)
    drawn, reference_drawn = set(), False
    for (dataset, size, variant), ax in panels.items():
        data = _select(shown.data, dataset, size, variant).dropna(subset=["step", "test_acc"])
        reference = _reference(shown.data, dataset, size).dropna(subset=["step", "test_acc"])
        if data.empty and reference.empty:
            _no_results(ax)
            continue
        if not data.empty:
            sns.lineplot(data=data, x="step", y="test_acc", hue="line", hue_order=shown.labels, palette=palette,
                         errorbar="sd", ax=ax, legend=False)
            drawn.update(data["line"])
        if not reference.empty:
            sns.lineplot(data=reference, x="step", y="test_acc", errorbar="sd", ax=ax,
                         label=REFERENCE_LABEL, legend=False, **REFERENCE_STYLE)
            reference_drawn = True
    # Lines drawn with legend=False: build one shared legend from the fixed palette, listing only drawn lines.
    handles = [Line2D([], [], color=palette[label], label=label) for label in shown.labels if label in drawn]
    if reference_drawn:
        handles.append(Line2D([], [], label=REFERENCE_LABEL, **REFERENCE_STYLE))
    at = _at_steps(shown.budget)
    _finish(fig, panels, xlabel="training step", ylabel="test accuracy", handles=handles)
    if at:
        fig.suptitle(f"Largest budget: {at} (student training)")
    return fig


def draw_accuracy_by_budget(runs: pd.DataFrame, config: dict) -> Figure:
    """Test accuracy against the training budget (student steps, log2 axis): one line per init strategy
    (a distilling one: per init and design, "init [design]") through the mean over seeds, the seeds
    as points, and the softmax reference dashed black (a horizontal line when it has one budget)."""
    ok = _finished(runs)
    lines = _lines(ok, config)
    palette = dict(zip(lines, _init_colors(len(lines))))
    budgets = sorted(ok["budget"].dropna().unique())
    fig, panels = _panel_grid(config, width=4.2, height=3.0)
    for (dataset, size, variant), ax in panels.items():
        data = _select(ok, dataset, size, variant).dropna(subset=["budget", "test_acc"])
        reference = _reference(ok, dataset, size).dropna(subset=["test_acc"])
        if data.empty and reference.empty:
            _no_results(ax)
            continue
        if data.empty:
            _no_results(ax, "no student results")
        for i, line in enumerate(lines):
            g = data[(data["init"] == line[0]) & (data["design"] == line[1])]
            if g.empty:
                continue
            # Lines side by side at a budget: a small shift along the log axis keeps seed points apart.
            shift = 2.0 ** (0.12 * (i - (len(lines) - 1) / 2) / max(len(lines) - 1, 1))
            ax.scatter(g["budget"] * shift, g["test_acc"], s=10, color=palette[line], alpha=0.45, linewidths=0)
            mean = g.groupby("budget")["test_acc"].mean()
            ax.plot(mean.index * shift, mean.to_numpy(), color=palette[line], marker="o", markersize=3.5,
                    linewidth=1.4)
        if not reference.empty:
            ref = reference.dropna(subset=["budget"]).groupby("budget")["test_acc"].mean()
            if len(ref) > 1:
                ax.plot(ref.index, ref.to_numpy(), marker="o", markersize=3, **REFERENCE_STYLE)
            else:
                ax.axhline(reference["test_acc"].mean(), **REFERENCE_STYLE)
        _budget_axis(ax, budgets)
    handles = [Line2D([], [], color=palette[line], marker="o", markersize=3.5, label=_line_label(line))
               for line in lines]
    if lines:
        handles.append(Line2D([], [], color=SEED_COLOR, marker="o", linestyle="none", markersize=3, alpha=0.6,
                              label="seed (line: mean over seeds)"))
    if _is_reference(ok).any():
        handles.append(Line2D([], [], label=REFERENCE_LABEL, **REFERENCE_STYLE))
    _finish(fig, panels, xlabel="training budget (student steps)", ylabel="test accuracy", handles=handles)
    return fig


def draw_gap_closed_heatmap(summary: pd.DataFrame, config: dict) -> Figure:
    """Gap closed (linvit.report.tables.summarize's `gap_closed`: 0 = the random role, 1 = the softmax
    reference) at the grid's largest budget, as a heatmap of operator (variant) x init strategy
    [design], one panel per dataset (and size, when the grid has several); cells annotated, undefined
    cells (NaN: the reference, or no random/reference to compare with) left empty."""
    summary = _with_axes(summary)
    students = summary[~_is_reference(summary)]
    budget = _largest_budget(summary)
    at = _at_budget(students, budget)
    lines = _lines(students, config)
    labels = [_line_label(line) for line in lines]
    values = pd.to_numeric(at["gap_closed"], errors="coerce").dropna().tolist()
    # 0 (random) and 1 (reference) always on the scale, so colours read the same in every report.
    vmin, vmax = min([0.0, *values]), max([1.0, *values])
    several_sizes = len(config["sizes"]) > 1
    variants = list(config["variants"])
    with sns.axes_style("white"), sns.plotting_context("paper"):
        fig = Figure(figsize=(max(3.5, 0.7 * len(labels) + 2.0) * len(config["targets"]),
                              (0.45 * len(variants) + 2.2) * len(config["sizes"])), layout="constrained")
        FigureCanvasAgg(fig)
        axes = fig.subplots(len(config["sizes"]), len(config["targets"]), squeeze=False)
    drawn = None
    for r, size in enumerate(config["sizes"]):
        for c, dataset in enumerate(config["targets"]):
            ax = axes[r][c]
            ax.set_title(f"{dataset}" + (f" · {size}" if several_sizes else ""))
            cell = at[(at["dataset"] == dataset) & (at["size"] == size)]
            grid = pd.DataFrame(np.nan, index=variants, columns=labels)
            for row in cell.itertuples():
                label = _line_label((row.init, row.design))
                if row.variant in grid.index and label in grid.columns:
                    grid.loc[row.variant, label] = pd.to_numeric(row.gap_closed, errors="coerce")
            grid.index = [variant_label(v) for v in variants]
            if grid.isna().all().all():
                ax.set_axis_off()
                _no_results(ax, "no gap closed (needs the random role and the reference)")
                continue
            drawn = ax
            sns.heatmap(grid.astype(float), ax=ax, annot=True, fmt=".2f", cmap="viridis", vmin=vmin, vmax=vmax,
                        cbar=False, linewidths=0.5, linecolor="white", annot_kws={"fontsize": 7})
            ax.set_xlabel("init strategy [design]")
            ax.set_ylabel("operator" if c == 0 else "")
            ax.tick_params(axis="x", rotation=45)
            for tick in ax.get_xticklabels():
                tick.set_ha("right")
            ax.tick_params(axis="y", rotation=0)
    if drawn is not None:
        fig.colorbar(drawn.collections[0], ax=axes.ravel().tolist(), label="gap closed\n(0 random, 1 reference)",
                     aspect=8)
    at_steps = _at_steps(budget)
    if at_steps:
        fig.suptitle(f"Gap closed at the largest budget: {at_steps} (student training)")
    return fig


def _budget_axis(ax, budgets: list) -> None:
    """log2 x axis with a tick at every budget of the grid, room on both sides (also for one budget)."""
    ax.set_xscale("log", base=2)
    if not budgets:
        return
    ax.set_xticks(budgets, [_budget_label(b) for b in budgets])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlim(min(budgets) / 2 ** 0.4, max(budgets) * 2 ** 0.4)


@contextlib.contextmanager
def _fixed_global_rng(seed: int):
    """numpy's global random state seeded for the block and restored after it: seaborn's strip jitter
    draws from it, and reruns should give the same figure without changing the caller's state."""
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)
