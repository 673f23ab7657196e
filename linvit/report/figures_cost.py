"""The cost figures: test accuracy against cost (steps and wall-clock of training plus distillation)
and against measured throughput, and the operator benchmark's time against tokens.

Each draw_* function returns an Agg-backed `Figure`; its entry in linvit.figure_registry names it and the
inputs it takes, linvit.report.figures draws and saves it.
"""

from __future__ import annotations

import math

import pandas as pd
import seaborn as sns
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import LogLocator, NullFormatter, ScalarFormatter

from linvit.registry import SOFTMAX
from linvit.report.aggregate import ID_COLUMNS
from linvit.report.figures_common import (CI_LABEL, REFERENCE_LABEL, REFERENCE_STYLE, _at_budget, _at_steps, _finish,
                                          _finished, _init_colors, _is_reference, _largest_budget, _level_text,
                                          _line_label, _lines, _no_results, _panel_grid, _reference, _seed_ci,
                                          _select, _with_axes, variant_label)


# (x column of cost_frame, axis label, subfigure title) of cost_to_accuracy's two rows of panels.
COST_ROWS = (("cost_steps", "student + distillation steps",
              "Test accuracy against steps (a distilled strategy's distillation steps added)"),
             ("cost_seconds", "train + distill seconds",
              "Test accuracy against wall-clock (train_time_s + distill_time_s, mean over seeds)"))
# With one budget, the points are each run's evaluations along its training (curves.csv).
COST_ROWS_ALONG = (("cost_steps", "student + distillation steps",
                    "Test accuracy along training (a distilled strategy's distillation steps added; "
                    "before the last step, on the first eval_samples test images)"),
                   ("cost_seconds", "train + distill seconds",
                    "Test accuracy along training against wall-clock (elapsed_s + distill_time_s, mean over seeds)"))


def _column(frame: pd.DataFrame, col: str) -> pd.Series:
    """`frame[col]` as numbers (NaN where it does not parse, or where the table has no such column)."""
    return pd.to_numeric(frame[col], errors="coerce") if col in frame else pd.Series(math.nan, index=frame.index)


def cost_frame(runs: pd.DataFrame) -> pd.DataFrame:
    """The finished runs with their cost: `cost_steps` = budget (the student's steps; `steps` where a
    table has no budget) + distillation steps (0 for a strategy that does not distill), and
    `cost_seconds` = train_time_s + distill_time_s; each replaced by its mean over the seeds of the
    same (dataset, size, variant, init, design, budget), so seeds share an x and seaborn's interval
    is over seeds."""
    ok = _finished(runs)
    number = lambda col: _column(ok, col)
    steps = number("budget").fillna(number("steps"))
    ok = ok.assign(cost_steps=steps + number("distill_steps").fillna(0.0),
                   cost_seconds=number("train_time_s") + number("distill_time_s").fillna(0.0))
    keys = ["dataset", "size", "variant", "init", "design", "budget"]
    for col in ("cost_steps", "cost_seconds"):
        ok[col] = ok.groupby(keys, dropna=False)[col].transform("mean")
    return ok


def cost_frame_along(runs: pd.DataFrame, curves: pd.DataFrame) -> pd.DataFrame:
    """The finished runs' evaluations along training (curves.csv rows) with their cost: `cost_steps` =
    the evaluation's step + the run's distillation steps, `cost_seconds` = its elapsed_s + the run's
    distill_time_s, the latter's mean over seeds at each step (seeds share an x, as in cost_frame)."""
    ok = _finished(runs)
    number = lambda col: _column(ok, col)
    ok = ok.assign(distill_steps=number("distill_steps").fillna(0.0), distill_time_s=number("distill_time_s").fillna(0.0))
    points = _with_axes(curves).merge(ok[ID_COLUMNS + ["distill_steps", "distill_time_s"]], on=ID_COLUMNS)
    points = points.assign(cost_steps=pd.to_numeric(points["step"], errors="coerce") + points["distill_steps"],
                           cost_seconds=pd.to_numeric(points["elapsed_s"], errors="coerce") + points["distill_time_s"])
    keys = ["dataset", "size", "variant", "init", "design", "budget", "step"]
    points["cost_seconds"] = points.groupby(keys, dropna=False)["cost_seconds"].transform("mean")
    return points


def draw_cost_to_accuracy(runs: pd.DataFrame, config: dict, curves: pd.DataFrame | None = None) -> Figure:
    """Test accuracy against cost, one line per init strategy [design] through its budgets, the softmax
    reference dashed black: above against steps (student steps, plus the distillation's for a distilled
    strategy), below against wall-clock seconds of training plus distillation; the teacher's
    pretraining is shared and not counted. Points: mean over seeds, bars: their t interval over seeds.
    A grid of one budget has one point per line that way: given `curves`, its lines then go through
    each run's evaluations along training instead (cost_frame_along)."""
    along = curves is not None and _with_axes(runs)["budget"].nunique(dropna=False) <= 1 and not curves.empty
    data = cost_frame_along(runs, curves) if along else cost_frame(runs)
    lines = _lines(data, config)
    labels = [_line_label(line) for line in lines]
    palette = dict(zip(labels, _init_colors(len(labels))))
    data = data.assign(line=[_line_label(p) for p in zip(data["init"], data["design"])])
    n_cols, n_rows = len(config["targets"]), len(config["sizes"]) * len(config["variants"])
    width, height = 4.2, 3.0
    fig = Figure(figsize=(width * n_cols, 2 * height * n_rows + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    drawn, reference_drawn = set(), False
    for (x, xlabel, title), sub in zip(COST_ROWS_ALONG if along else COST_ROWS, fig.subfigures(2, 1)):
        _, panels = _panel_grid(config, width, height, target=sub)
        sub.suptitle(title)
        for (dataset, size, variant), ax in panels.items():
            mine = _select(data, dataset, size, variant).dropna(subset=[x, "test_acc"])
            reference = _reference(data, dataset, size).dropna(subset=[x, "test_acc"])
            if mine.empty and reference.empty:
                _no_results(ax)
                continue
            if not mine.empty:
                sns.lineplot(data=mine, x=x, y="test_acc", hue="line", hue_order=labels, palette=palette,
                             errorbar=_seed_ci(config), err_style="bars", marker="o", markersize=4, ax=ax,
                             legend=False)
                drawn.update(mine["line"])
            if not reference.empty:
                sns.lineplot(data=reference, x=x, y="test_acc", errorbar=_seed_ci(config), err_style="bars",
                             marker="o", markersize=3, ax=ax, legend=False, **REFERENCE_STYLE)
                reference_drawn = True
            if (pd.concat([mine[x], reference[x]]) > 0).all():
                _log_x(ax)
        _finish(sub, panels, xlabel=xlabel, ylabel="test accuracy", handles=[])
    handles = [Line2D([], [], color=palette[label], marker="o", markersize=4, label=label)
               for label in labels if label in drawn]
    if reference_drawn:
        handles.append(Line2D([], [], label=REFERENCE_LABEL, **REFERENCE_STYLE))
    if handles:
        handles.append(Line2D([], [], color="0.3", marker="|", linestyle="none", markersize=8,
                              label=f"{_level_text(config)} {CI_LABEL}"))
        fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 5), frameon=False)
    return fig


def draw_accuracy_vs_throughput(runs: pd.DataFrame, config: dict) -> Figure:
    """Test accuracy at the grid's largest budget against measured forward throughput (`throughput_img_s`
    of eval.json, log axis), one marker per (operator, init strategy [design]): colour = init [design],
    shape = operator, the softmax reference a black star. Means over seeds, bars: the t interval of
    the accuracy over seeds. One panel per dataset (and size): the operators side by side, so the
    trade-off a user buys (speed against accuracy) reads across a panel."""
    budget = _largest_budget(_with_axes(runs))  # the grid's, as in accuracy_by_init
    ok = _at_budget(_finished(runs), budget).dropna(subset=["test_acc"])
    ok = ok.assign(throughput=pd.to_numeric(ok["throughput_img_s"], errors="coerce") if "throughput_img_s" in ok
                   else math.nan)
    variants = list(config["variants"])  # softmax among them: the control students, not the reference
    ok = ok[ok["variant"].isin(variants) | _is_reference(ok)].dropna(subset=["throughput"])
    lines = _lines(ok, config)
    labels = [_line_label(line) for line in lines]
    palette = dict(zip(labels, _init_colors(len(labels))))
    markers = dict(zip(variants, ["o", "s", "^", "D", "v", "P", "X", "<", ">", "p", "h", "8"] * 2))
    panels = _dataset_panels(config)
    with sns.axes_style("whitegrid"), sns.plotting_context("paper"):
        fig = Figure(figsize=(4.4 * len(config["targets"]), 3.4 * len(config["sizes"])), layout="constrained")
        FigureCanvasAgg(fig)
        axes = fig.subplots(len(config["sizes"]), len(config["targets"]), squeeze=False, sharey=True)
    # Seeds share their cell's mean throughput as x, so seaborn's interval is over seeds (accuracy only).
    ok["throughput"] = ok.groupby(["dataset", "size", "variant", "init", "design"])["throughput"].transform("mean")
    ok = ok.assign(line=[_line_label(p) for p in zip(ok["init"], ok["design"])])
    common = dict(x="throughput", y="test_acc", errorbar=_seed_ci(config), err_style="bars", legend=False,
                  err_kws={"capsize": 2})
    for (dataset, size), (r, c) in panels.items():
        ax = axes[r][c]
        ax.set_title(f"{dataset}" + (f" · {size}" if len(config["sizes"]) > 1 else ""))
        cell = ok[(ok["dataset"] == dataset) & (ok["size"] == size)]
        if cell.empty:
            _no_results(ax)
            continue
        students = cell[~_is_reference(cell)]
        if not students.empty:
            # hue x style: one group per (init [design], operator), each a single x, drawn as a marker.
            sns.lineplot(data=students, hue="line", hue_order=labels, palette=palette, style="variant",
                         style_order=variants, markers=markers, dashes=False, markersize=7, ax=ax, **common)
        reference = cell[_is_reference(cell)]
        if not reference.empty:
            sns.lineplot(data=reference, color="black", marker="*", markersize=12, ax=ax, **common)
        if (cell["throughput"] > 0).all():
            _log_x(ax)
        ax.set_xlabel("throughput (images/s, this machine)")
        ax.set_ylabel("test accuracy" if c == 0 else "")
    handles = [Line2D([], [], color=palette[label], marker="o", linestyle="none", label=label) for label in labels]
    handles += [Line2D([], [], color="0.3", marker=markers[v], linestyle="none", label=f"operator {variant_label(v)}")
                for v in variants if ((ok["variant"] == v) & ~_is_reference(ok)).any()]
    if _is_reference(ok).any():
        handles.append(Line2D([], [], color="black", marker="*", markersize=9, linestyle="none", label=REFERENCE_LABEL))
    if handles:
        fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 4), frameon=False)
    at = _at_steps(budget)
    fig.suptitle("Accuracy against throughput" + (f" at the largest budget: {at}" if at else "")
                 + f" (mean, {_level_text(config)} {CI_LABEL})")
    return fig


def draw_attention_scaling(bench: pd.DataFrame) -> Figure:
    """Forward+backward seconds against tokens, log-log, one line per operator (softmax dashed)."""
    fig = Figure(figsize=(6.5, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    linear = [v for v in bench["variant"].unique() if v != SOFTMAX]  # operators (softmax: SDPA, dashed)
    colors = dict(zip(linear, _init_colors(len(linear))))
    for variant, g in bench.groupby("variant", sort=False):
        g = g.sort_values("tokens")
        style = REFERENCE_STYLE if variant == SOFTMAX else {"color": colors[variant], "linewidth": 1.5}
        ax.plot(g["tokens"], g["seconds"], marker="o", markersize=3, label=variant, **style)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tokens N")
    ax.set_ylabel("forward + backward time (s)")
    ax.legend(fontsize=8, ncol=2, frameon=False)
    ax.grid(True, which="both", alpha=0.3)
    return fig


def _dataset_panels(config: dict) -> dict[tuple[str, str], tuple[int, int]]:
    """(dataset, size) -> (row, column) of a figure with one panel per dataset, a row per size."""
    return {(dataset, size): (r, c) for r, size in enumerate(config["sizes"])
            for c, dataset in enumerate(config["targets"])}


def _log_x(ax) -> None:
    """Log x axis labelled in plain numbers at 1, 2, 5 x 10^k (cost and throughput span less than a decade)."""
    ax.set_xscale("log")
    ax.xaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    ax.xaxis.set_major_formatter(ScalarFormatter())
    ax.xaxis.set_minor_formatter(NullFormatter())
