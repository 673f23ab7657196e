"""The report's figures: accuracy by init strategy, and test accuracy against training step.

Figures are drawn on explicit Agg-backed `Figure` objects (no pyplot), so the report never needs a
display, never touches the caller's global matplotlib state, and leaks no open figures. Each is
saved in linvit.grid's FIGURE_FORMATS (PNG for the Markdown report, SVG as vector), each written
atomically, under the names linvit.grid lists as the report's outputs.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import seaborn as sns
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from linvit.grid import BENCHMARK_FIGURES, FIGURE_FORMATS, REFERENCE_INIT, REFERENCE_VARIANT, REPORT_FIGURES
from linvit.io import atomic_path
from linvit.report.aggregate import ID_COLUMNS

REFERENCE_LABEL = "softmax reference"
REFERENCE_STYLE = {"color": "black", "linestyle": "--", "linewidth": 1.2}
SEED_COLOR, MEAN_COLOR = "0.55", "C0"
ACCURACY_FIGURE, CURVES_FIGURE = REPORT_FIGURES
(SCALING_FIGURE,) = BENCHMARK_FIGURES
# Metadata without dates keeps reruns byte-stable.
FORMAT_METADATA = {"png": {"Software": None}, "svg": {"Date": None}, "pdf": {"CreationDate": None}}


def write_figures(runs: pd.DataFrame, curves: pd.DataFrame, config: dict, out_dir: str | Path) -> list[Path]:
    """Both figures; curves of runs that did not finish are left out, so the two figures show the same runs."""
    finished = runs.loc[runs["status"] == "ok", ID_COLUMNS]
    return accuracy_by_init(runs, config, out_dir) + training_curves(curves.merge(finished, on=ID_COLUMNS), config, out_dir)


def accuracy_by_init(runs: pd.DataFrame, config: dict, out_dir: str | Path) -> list[Path]:
    """Final test accuracy per init strategy: seed points, mean with std bars, reference as a dashed line."""
    ok = runs[runs["status"] == "ok"]
    inits = list(config["inits"])
    fig, panels = _panel_grid(config, width=max(3.2, 0.45 * len(inits) + 1.0), height=3.0)
    for (dataset, size, variant), ax in panels.items():
        data = _select(ok, dataset, size, variant)
        reference = _select(ok, dataset, size, REFERENCE_VARIANT)["test_acc"]
        if data.empty and reference.empty:
            _no_results(ax)
            continue
        if not data.empty:
            sns.stripplot(data=data, x="init", y="test_acc", order=inits, ax=ax, color=SEED_COLOR, size=4, jitter=0.12)
            sns.pointplot(data=data, x="init", y="test_acc", order=inits, ax=ax, errorbar="sd", color=MEAN_COLOR,
                          linestyle="none", markers="_", markersize=14, err_kws={"linewidth": 1.2})
        if not reference.empty:
            ax.axhline(reference.mean(), **REFERENCE_STYLE)
        ax.set_xticks(range(len(inits)), inits, rotation=45, ha="right")
    handles = [Line2D([], [], color=SEED_COLOR, marker="o", linestyle="none", markersize=4, label="seed"),
               Line2D([], [], color=MEAN_COLOR, marker="_", linestyle="none", markersize=14, label="mean ± std over seeds")]
    if (ok["variant"] == REFERENCE_VARIANT).any():
        handles.append(Line2D([], [], label=REFERENCE_LABEL, **REFERENCE_STYLE))
    _finish(fig, panels, xlabel="init strategy", ylabel="test accuracy", handles=handles)
    return save_figure(fig, Path(out_dir) / ACCURACY_FIGURE)


def training_curves(curves: pd.DataFrame, config: dict, out_dir: str | Path) -> list[Path]:
    """Test accuracy against step per init (hue; band = std over seeds), softmax reference dashed."""
    inits = list(config["inits"])
    palette = dict(zip(inits, _init_colors(len(inits))))
    fig, panels = _panel_grid(config, width=4.2, height=3.0)
    for (dataset, size, variant), ax in panels.items():
        data = _select(curves, dataset, size, variant)
        reference = _select(curves, dataset, size, REFERENCE_VARIANT)
        if data.empty and reference.empty:
            _no_results(ax)
            continue
        if not data.empty:
            sns.lineplot(data=data, x="step", y="test_acc", hue="init", hue_order=inits, palette=palette,
                         errorbar="sd", ax=ax, legend=False)
        if not reference.empty:
            sns.lineplot(data=reference, x="step", y="test_acc", errorbar="sd", ax=ax,
                         label=REFERENCE_LABEL, legend=False, **REFERENCE_STYLE)
    # Lines drawn with legend=False: build one shared legend from the fixed palette, listing only drawn inits.
    shown = set(curves.loc[curves["variant"] != REFERENCE_VARIANT, "init"])
    handles = [Line2D([], [], color=palette[i], label=i) for i in inits if i in shown]
    if (curves["init"] == REFERENCE_INIT).any():
        handles.append(Line2D([], [], label=REFERENCE_LABEL, **REFERENCE_STYLE))
    _finish(fig, panels, xlabel="training step", ylabel="test accuracy", handles=handles)
    return save_figure(fig, Path(out_dir) / CURVES_FIGURE)


def save_figure(fig: Figure, stem: Path) -> list[Path]:
    """Write the figure in every FIGURE_FORMATS (stem.png, stem.svg), each atomically."""
    paths = []
    for fmt in FIGURE_FORMATS:
        path = stem.with_suffix(f".{fmt}")
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=fmt, dpi=150, metadata=FORMAT_METADATA.get(fmt), bbox_inches="tight")
        paths.append(path)
    return paths


def _panel_grid(config: dict, width: float, height: float) -> tuple[Figure, dict]:
    """One column per dataset, one row per variant (per variant and size when the grid has several sizes)."""
    datasets, sizes, variants = config["targets"], config["sizes"], config["variants"]
    rows = [(size, variant) for size in sizes for variant in variants]
    with sns.axes_style("whitegrid"), sns.plotting_context("paper"):
        fig = Figure(figsize=(width * len(datasets), height * len(rows)), layout="constrained")
        FigureCanvasAgg(fig)
        axes = fig.subplots(len(rows), len(datasets), squeeze=False, sharey=True)
    panels = {}
    for r, (size, variant) in enumerate(rows):
        for c, dataset in enumerate(datasets):
            ax = axes[r][c]
            ax.set_title(f"{dataset} · {variant}" + (f" · {size}" if len(sizes) > 1 else ""))
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
    return frame[(frame["dataset"] == dataset) & (frame["size"] == size) & (frame["variant"] == variant)]


def _no_results(ax) -> None:
    ax.text(0.5, 0.5, "no results", ha="center", va="center", transform=ax.transAxes, color="0.4")


def attention_scaling(bench: pd.DataFrame, out_dir: str | Path) -> list[Path]:
    """Forward+backward seconds against tokens, log-log, one line per operator (softmax dashed)."""
    fig = Figure(figsize=(6.5, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    linear = [v for v in bench["variant"].unique() if v != REFERENCE_VARIANT]
    colors = dict(zip(linear, _init_colors(len(linear))))
    for variant, g in bench.groupby("variant", sort=False):
        g = g.sort_values("tokens")
        style = REFERENCE_STYLE if variant == REFERENCE_VARIANT else {"color": colors[variant], "linewidth": 1.5}
        ax.plot(g["tokens"], g["seconds"], marker="o", markersize=3, label=variant, **style)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tokens N")
    ax.set_ylabel("forward + backward time (s)")
    ax.legend(fontsize=8, ncol=2, frameon=False)
    ax.grid(True, which="both", alpha=0.3)
    return save_figure(fig, Path(out_dir) / SCALING_FIGURE)
