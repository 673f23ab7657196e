"""What every figure family shares: the softmax reference's style and label, the t interval over seeds,
the panel grid (a column per dataset, a row per variant and size), and the reading of runs and curves
(finished runs, the largest budget, the students' (init, design) lines in one order with one label).

linvit.figure_registry names the figures and linvit.report.figures saves them; figures_accuracy,
figures_attention, figures_cost and figures_tests draw them with these pieces.
"""

from __future__ import annotations

import math

import pandas as pd
import seaborn as sns
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from linvit.grid import CONTROL_VARIANT, REFERENCE_INIT
from linvit.stats import paired

DPI = 150  # save_figure's resolution for the PNG (attention_maps lowers it for very large grids)
REFERENCE_LABEL = "softmax reference"
REFERENCE_STYLE = {"color": "black", "linestyle": "--", "linewidth": 1.2}
SEED_COLOR, MEAN_COLOR = "0.55", "C0"
# Intervals over seeds: the claims' t interval (linvit.stats.paired.seed_interval, n - 1 degrees of
# freedom, at the config's `claims.level`), not seaborn's percentile bootstrap, which covered 79-85% at
# 3-5 seeds (docs/statistics.md). CI_SEED seeds the strip plot's jitter, so reruns draw identical figures.
CI_SEED = 0
CI_LABEL = "t interval over seeds"
NO_DESIGN = "none"  # the design of a cell that does not distill (linvit.config.NO_DESIGN)


def _panel_grid(config: dict, width: float, height: float, target=None) -> tuple[Figure, dict]:
    """One column per dataset, one row per variant (per variant and size when the grid has several sizes).

    On a new figure of `width` x `height` inches per panel, or on `target` (a subfigure) when given."""
    datasets, sizes, variants = config["targets"], config["sizes"], config["variants"]
    rows = [(size, variant) for size in sizes for variant in variants]
    with sns.axes_style("whitegrid"), sns.plotting_context("paper"):
        fig = target
        if fig is None:
            fig = Figure(figsize=(width * len(datasets), height * len(rows)), layout="constrained")
            FigureCanvasAgg(fig)
        axes = fig.subplots(len(rows), len(datasets), squeeze=False, sharey=True)
    panels = {}
    for r, (size, variant) in enumerate(rows):
        for c, dataset in enumerate(datasets):
            ax = axes[r][c]
            ax.set_title(f"{dataset} · {variant_label(variant)}" + (f" · {size}" if len(sizes) > 1 else ""))
            panels[(dataset, size, variant)] = ax
    return fig, panels


def _finish(fig: Figure, panels: dict, xlabel: str, ylabel: str, handles: list[Line2D]) -> None:
    for ax in panels.values():
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel if ax.get_subplotspec().is_first_col() else "")
    if handles:
        fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 5), frameon=False)


def _init_colors(n: int) -> list:
    """tab10 without its grey, which would read as the (black, dashed) softmax reference; husl beyond 9 inits."""
    tab10 = sns.color_palette("tab10")
    colors = [c for i, c in enumerate(tab10) if i != 7]
    return colors[:n] if n <= len(colors) else sns.color_palette("husl", n)


def _select(frame: pd.DataFrame, dataset: str, size: str, variant: str) -> pd.DataFrame:
    """The students of `variant` in (dataset, size): softmax control students for variant softmax,
    never the softmax reference (whose variant is softmax too)."""
    return frame[(frame["dataset"] == dataset) & (frame["size"] == size) & (frame["variant"] == variant)
                 & ~_is_reference(frame)]


def _reference(frame: pd.DataFrame, dataset: str, size: str) -> pd.DataFrame:
    """The softmax reference's rows of (dataset, size)."""
    return frame[(frame["dataset"] == dataset) & (frame["size"] == size) & _is_reference(frame)]


def _is_reference(frame: pd.DataFrame) -> pd.Series:
    """Which rows are the softmax reference's: its init (REFERENCE_INIT), never the variant alone (a
    softmax control student's variant is softmax too)."""
    return frame["init"] == REFERENCE_INIT


def variant_label(variant: str) -> str:
    """A variant as figures name it: a softmax student is the control, beside the linear variants."""
    return f"{variant} (control)" if variant == CONTROL_VARIANT else str(variant)


def _no_results(ax, text: str = "no results") -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.4")


def _finished(runs: pd.DataFrame) -> pd.DataFrame:
    """The finished ("ok") runs, with `design` ('none') and `budget` (NaN) filled in when absent."""
    return _with_axes(runs[runs["status"] == "ok"])


def _with_axes(frame: pd.DataFrame) -> pd.DataFrame:
    """A copy of runs or curves with `design` ('none' where absent or empty) and `budget` (numeric;
    NaN where absent: an older table, one budget) filled in."""
    frame = frame.copy()
    if "design" not in frame:
        frame["design"] = NO_DESIGN
    frame["design"] = frame["design"].fillna(NO_DESIGN).astype(str)
    frame["budget"] = pd.to_numeric(frame["budget"], errors="coerce") if "budget" in frame else math.nan
    return frame


def _largest_budget(frame: pd.DataFrame) -> float:
    """The largest budget in `frame` (after _with_axes); NaN when it has none."""
    top = frame["budget"].max() if "budget" in frame else math.nan
    return math.nan if pd.isna(top) else float(top)


def _at_budget(frame: pd.DataFrame, budget: float) -> pd.DataFrame:
    """The rows at `budget`; every row when `budget` is NaN (a table without budgets)."""
    return frame if pd.isna(budget) else frame[frame["budget"] == budget]


def _at_steps(budget: float) -> str:
    """"1600 steps" ("2k steps"); "" for no budget."""
    return "" if pd.isna(budget) else f"{_budget_label(budget)} steps"


def _lines(frame: pd.DataFrame, config: dict) -> list[tuple[str, str]]:
    """The (init, design) pairs of the students in `frame` (after _with_axes): config's init order,
    then designs in the order of config `distills` (else of appearance), designless first. With
    _line_label, the one ordering and labelling of every per-(init, design) figure."""
    students = frame[~_is_reference(frame)]
    inits = list(config["inits"]) + [i for i in dict.fromkeys(students["init"]) if i not in config["inits"]]
    order = list(config.get("distills") or [])
    pairs = list(dict.fromkeys(zip(students["init"], students["design"])))
    rank = {d: k for k, d in enumerate(order)}
    return sorted(pairs, key=lambda p: (inits.index(p[0]), p[1] != NO_DESIGN,
                                        rank.get(p[1], len(order)), pairs.index(p)))


def _line_label(line: tuple[str, str], wrap: bool = False) -> str:
    init, design = line
    if design in (None, "", NO_DESIGN) or (isinstance(design, float) and math.isnan(design)):
        return str(init)
    return f"{init}{chr(10) if wrap else ' '}[{design}]"


def _budget_label(b: float) -> str:
    b = float(b)
    if b >= 1000 and b % 1000 == 0:
        return f"{int(b // 1000)}k"
    return f"{b:g}"


def _seed_ci(config: dict):
    """seaborn's `errorbar`: the claims' t interval over seeds at the config's level (paired.seed_interval)."""
    level = paired.Settings.from_config(config).level
    return lambda values: paired.seed_interval(values, level)


def _level_text(config: dict) -> str:
    return f"{100 * paired.Settings.from_config(config).level:g}%"
