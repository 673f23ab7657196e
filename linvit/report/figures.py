"""The report's figures: accuracy by init strategy and design, test accuracy against training step
(both at the grid's largest budget) and against the training budget, attention fidelity by block,
class-token attention maps on the patch grid, gap closed as a heatmap, accuracy against cost (steps
and wall-clock) and against measured throughput.

Figures are drawn on explicit Agg-backed `Figure` objects (no pyplot), so the report never needs a
display, never touches the caller's global matplotlib state, and leaks no open figures. Each is
saved in linvit.grid's FIGURE_FORMATS (PNG for the Markdown report, SVG as vector), each written
atomically, under the names linvit.grid lists as the report's outputs.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import LogLocator, NullFormatter, NullLocator, ScalarFormatter

from linvit.grid import BENCHMARK_FIGURES, CONTROL_VARIANT, FIGURE_FORMATS, REFERENCE_INIT, REPORT_FIGURES
from linvit.registry import SOFTMAX
from linvit.io import atomic_path
from linvit.report import stats
from linvit.report.aggregate import ID_COLUMNS

REFERENCE_LABEL = "softmax reference"
REFERENCE_STYLE = {"color": "black", "linestyle": "--", "linewidth": 1.2}
SEED_COLOR, MEAN_COLOR = "0.55", "C0"
ACCURACY_FIGURE, CURVES_FIGURE = REPORT_FIGURES[:2]
BUDGET_FIGURE, FIDELITY_FIGURE, MAPS_FIGURE, GAP_FIGURE, COST_FIGURE, THROUGHPUT_FIGURE = REPORT_FIGURES[2:8]
# Intervals over seeds: the claims' t interval (linvit.report.stats.seed_interval, n - 1 degrees of
# freedom, at the config's `claims.level`), not seaborn's percentile bootstrap, which covered 79-85% at
# 3-5 seeds (docs/statistics.md). CI_SEED seeds the strip plot's jitter, so reruns draw identical figures.
CI_SEED = 0
CI_LABEL = "t interval over seeds"
NO_DESIGN = "none"  # the design of a cell that does not distill (linvit.config.NO_DESIGN)
(SCALING_FIGURE,) = BENCHMARK_FIGURES
# Metadata without dates keeps reruns byte-stable.
FORMAT_METADATA = {"png": {"Software": None}, "svg": {"Date": None}, "pdf": {"CreationDate": None}}


def write_figures(runs: pd.DataFrame, curves: pd.DataFrame, config: dict, out_dir: str | Path) -> list[Path]:
    """Accuracy by init and the training curves, both at the grid's largest budget (the largest in
    `runs`, which lists every expected cell); curves of runs that did not finish are left out, so the
    two figures show the same runs."""
    runs, curves = _with_axes(runs), _with_axes(curves)
    finished = runs.loc[runs["status"] == "ok", ID_COLUMNS]
    budget = _largest_budget(runs)
    return (accuracy_by_init(runs, config, out_dir, budget=budget)
            + training_curves(curves.merge(finished, on=ID_COLUMNS), config, out_dir, budget=budget))


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


def accuracy_by_init(runs: pd.DataFrame, config: dict, out_dir: str | Path, budget: float | None = None) -> list[Path]:
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
    return save_figure(fig, Path(out_dir) / ACCURACY_FIGURE)


def training_curves(curves: pd.DataFrame, config: dict, out_dir: str | Path, budget: float | None = None) -> list[Path]:
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
    return save_figure(fig, Path(out_dir) / CURVES_FIGURE)


def save_figure(fig: Figure, stem: Path, dpi: float = 150) -> list[Path]:
    """Write the figure in every FIGURE_FORMATS (stem.png, stem.svg), each atomically."""
    paths = []
    for fmt in FIGURE_FORMATS:
        path = stem.with_suffix(f".{fmt}")
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=fmt, dpi=dpi, metadata=FORMAT_METADATA.get(fmt), bbox_inches="tight")
        paths.append(path)
    return paths


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


def attention_scaling(bench: pd.DataFrame, out_dir: str | Path) -> list[Path]:
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
    return save_figure(fig, Path(out_dir) / SCALING_FIGURE)


# -- budgets, fidelity by block, attention maps ---------------------------------------------------

def accuracy_by_budget(runs: pd.DataFrame, config: dict, out_dir: str | Path) -> list[Path]:
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
    return save_figure(fig, Path(out_dir) / BUDGET_FIGURE)


# (metric, y label, subfigure title) of fidelity_by_block's two rows of panels.
FIDELITY_ROWS = (("kl", "KL(A ‖ Â)", "KL divergence of the student's attention from the teacher's, per block"),
                 ("corr", "map correlation", "Pearson correlation of the student's and the teacher's attention maps"))


def fidelity_by_block(runs: pd.DataFrame, config: dict, out_dir: str | Path) -> list[Path]:
    """Attention fidelity to the teacher by block, at each panel's largest budget (with fidelity
    results), mean over seeds: KL(A‖Â) in the upper panels (log axis when every value is positive),
    the maps' Pearson correlation in the lower ones; one line per init strategy and design, the
    softmax reference (fine-tuned teacher against the teacher) dashed black where it was evaluated."""
    ok = _finished(runs)
    lines = _lines(ok, config)
    palette = dict(zip(lines, _init_colors(len(lines))))
    n_cols, n_rows = len(config["targets"]), len(config["sizes"]) * len(config["variants"])
    width, height = 4.2, 3.0
    fig = Figure(figsize=(width * n_cols, 2 * height * n_rows + 0.6), layout="constrained")
    FigureCanvasAgg(fig)
    drawn, reference_drawn = set(), False
    for (metric, ylabel, title), sub in zip(FIDELITY_ROWS, fig.subfigures(2, 1)):
        _, panels = _panel_grid(config, width, height, target=sub)
        sub.suptitle(title)
        columns = _block_columns(ok, metric)
        values = []
        for (dataset, size, variant), ax in panels.items():
            data = _select(ok, dataset, size, variant)
            data = data[data[columns].notna().any(axis=1)] if columns else data.iloc[:0]
            reference = _reference(ok, dataset, size)
            reference = reference[reference[columns].notna().any(axis=1)] if columns else reference.iloc[:0]
            if data.empty:
                _no_results(ax)
                continue
            top = data["budget"].max()
            if not pd.isna(top):
                data = data[data["budget"] == top]
                ax.set_title(f"{ax.get_title()} · budget {_budget_label(top)}")
                if (reference["budget"] == top).any():
                    reference = reference[reference["budget"] == top]
            blocks = []
            for line in lines:
                g = data[(data["init"] == line[0]) & (data["design"] == line[1])]
                mean = g[columns].mean().dropna() if not g.empty else pd.Series(dtype=float)
                if mean.empty:
                    continue
                x = [_block_index(c, metric) for c in mean.index]
                ax.plot(x, mean.to_numpy(), color=palette[line], marker="o", markersize=3.5, linewidth=1.4)
                drawn.add(line), values.extend(mean.to_numpy()), blocks.extend(x)
            mean = reference[columns].mean().dropna() if not reference.empty else pd.Series(dtype=float)
            if not mean.empty:
                x = [_block_index(c, metric) for c in mean.index]
                ax.plot(x, mean.to_numpy(), marker="o", markersize=3, **REFERENCE_STYLE)
                values.extend(mean.to_numpy()), blocks.extend(x)
                reference_drawn = True
            if blocks:
                ax.set_xticks(range(min(blocks), max(blocks) + 1))
        if metric == "kl" and values and min(values) > 0:
            next(iter(panels.values())).set_yscale("log")  # shared y: every panel of the row
        _finish(sub, panels, xlabel="block", ylabel=ylabel, handles=[])
    handles = [Line2D([], [], color=palette[line], marker="o", markersize=3.5, label=_line_label(line))
               for line in lines if line in drawn]
    if reference_drawn:
        handles.append(Line2D([], [], label=REFERENCE_LABEL, **REFERENCE_STYLE))
    if handles:
        fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 5), frameon=False)
    return save_figure(fig, Path(out_dir) / FIDELITY_FIGURE)


MAP_PANEL_INCHES = 0.8  # one head's patch grid
MAP_MAX_PIXELS = 12000  # the PNG's longer side at most (dpi lowered for very large grids)
MAP_CMAP = "viridis"


def attention_maps(maps: list[dict], out_dir: str | Path) -> list[Path]:
    """Class-token attention on the patch grid: one block of panels per (dataset, size, variant),
    laid out like the other figures (a column per dataset, a row per size and variant). In a block,
    rows are the teacher, the softmax reference if recorded, then each (init, design) student at its
    largest budget and first seed; columns are heads. Each panel is the query row's patch part,
    reshaped to the patch grid; the colour scale (0 to the row's largest weight) is shared by the
    heads of a row, with a colour bar at its end.

    `maps`: records {"dataset", "size", "variant", "init", "design", "budget", "seed", "model":
    "teacher" | "student", and linvit.evaluate.class_token_rows' "row", "prefix", "grid", "heads"}.
    """
    records = [dict(r) for r in maps]
    cells = list(dict.fromkeys((r["dataset"], r["size"], r["variant"]) for r in records
                               if r.get("init") != REFERENCE_INIT))
    datasets = list(dict.fromkeys(c[0] for c in cells)) or [None]
    rows = list(dict.fromkeys((c[1], c[2]) for c in cells)) or [(None, None)]
    several_sizes = len({size for size, _ in rows}) > 1
    blocks = {cell: _map_rows(records, *cell) for cell in cells}
    heads = {cell: max((len(rec["heads"]) for _, rec in blocks[cell] if rec and rec.get("heads")), default=1)
             for cell in cells}
    col_heads = [max((heads[c] for c in cells if c[0] == d), default=1) for d in datasets]
    row_models = [max((len(blocks[c]) for c in cells if (c[1], c[2]) == r), default=1) for r in rows]
    width = [n * MAP_PANEL_INCHES + 2.4 for n in col_heads]
    height = [n * MAP_PANEL_INCHES + 0.7 for n in row_models]
    fig = Figure(figsize=(sum(width), sum(height)), layout="constrained")
    FigureCanvasAgg(fig)
    subs = fig.subfigures(len(rows), len(datasets), squeeze=False, width_ratios=width, height_ratios=height)
    for r, (size, variant) in enumerate(rows):
        for c, dataset in enumerate(datasets):
            sub, cell = subs[r][c], (dataset, size, variant)
            if cell not in blocks:
                ax = sub.subplots()
                ax.set_axis_off()
                _no_results(ax)
                if dataset is not None:
                    sub.suptitle(f"{dataset} · {variant_label(variant)}" + (f" · {size}" if several_sizes else ""))
                continue
            _draw_map_block(sub, blocks[cell], heads[cell])
            first = next((rec for _, rec in blocks[cell] if rec), {})
            where = f"{first.get('row', 'class token')} row" + \
                    (f", block {first['block']}" if first.get("block") is not None else "")
            sub.suptitle(f"{dataset} · {variant_label(variant)}" + (f" · {size}" if several_sizes else "")
                         + f" ({where})")
    dpi = min(150.0, MAP_MAX_PIXELS / max(sum(width), sum(height)))
    return save_figure(fig, Path(out_dir) / MAPS_FIGURE, dpi=dpi)


def _map_rows(records: list[dict], dataset: str, size: str, variant: str) -> list[tuple[str, dict | None]]:
    """(row label, record) of one block of attention_maps: the teacher (None when not recorded),
    the softmax reference's student record if any, then each (init, design) student at its largest
    budget and first seed, in order of first appearance."""

    def pick(candidates):  # largest budget (a missing one last), then smallest seed
        return min(candidates, key=lambda r: (-_number(r.get("budget"), -math.inf), _number(r.get("seed"))))

    students = [r for r in records if r.get("model") == "student"]
    same_size = [r for r in records if r["dataset"] == dataset and r["size"] == size]
    teachers = [r for r in same_size if r.get("model") == "teacher"]
    # The teacher recorded with this variant's students, else any of this dataset and size.
    teacher = next((r for r in teachers if r["variant"] == variant), teachers[0] if teachers else None)
    rows = [("teacher", teacher)]
    reference = [r for r in students if r["dataset"] == dataset and r["size"] == size
                 and r.get("init") == REFERENCE_INIT]
    if reference:
        rows.append((REFERENCE_LABEL, pick(reference)))
    mine = [r for r in students if r["dataset"] == dataset and r["size"] == size and r["variant"] == variant
            and r.get("init") != REFERENCE_INIT]
    for init, design in dict.fromkeys((r.get("init"), r.get("design", NO_DESIGN)) for r in mine):
        chosen = pick([r for r in mine if r.get("init") == init and r.get("design", NO_DESIGN) == design])
        rows.append((_line_label((init, design), wrap=True), chosen))
    return rows


def _draw_map_block(sub, rows: list[tuple[str, dict | None]], n_heads: int) -> None:
    """One (dataset, size, variant) block: a row of head panels per model, a colour bar per row."""
    axes = sub.subplots(len(rows), n_heads, squeeze=False)
    kind = next((rec.get("row") for _, rec in rows if rec), None)
    for i, (label, rec) in enumerate(rows):
        images = _patch_images(rec)
        if rec and rec.get("row") not in (None, kind):
            label += f"\n({rec['row']})"
        vmax = float(np.nanmax(images)) if images is not None and np.isfinite(images).any() else 1.0
        im = None
        for h, ax in enumerate(axes[i]):
            ax.set_xticks([]), ax.set_yticks([])
            for spine in ax.spines.values():
                spine.set_visible(False)
            if i == 0:
                ax.set_title(f"head {h}", fontsize=8)
            if h == 0:
                ax.set_ylabel(label, rotation=0, ha="right", va="center", fontsize=8)
            if images is None:
                if h == 0:
                    _no_results(ax)
                continue
            if h < len(images):
                im = ax.imshow(images[h], cmap=MAP_CMAP, vmin=0.0, vmax=max(vmax, 1e-12),
                               interpolation="nearest")
        if im is not None:
            bar = sub.colorbar(im, ax=list(axes[i]), fraction=0.02, pad=0.01, aspect=8)
            bar.ax.tick_params(labelsize=6)


def _patch_images(rec: dict | None) -> np.ndarray | None:
    """(heads, rows, cols) patch parts of a record's query rows; None when absent or malformed."""
    if not rec or not rec.get("heads") or not rec.get("grid"):
        return None
    try:
        heads = np.asarray(rec["heads"], dtype=float)
        gh, gw = (int(g) for g in rec["grid"])
        prefix = int(rec.get("prefix", 0))
    except (TypeError, ValueError):
        return None
    if heads.ndim != 2 or heads.shape[1] - prefix != gh * gw:
        return None
    return heads[:, prefix:].reshape(len(heads), gh, gw)


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


def _block_columns(frame: pd.DataFrame, metric: str) -> list[str]:
    prefix = f"fidelity_{metric}_l"
    cols = [c for c in frame.columns if c.startswith(prefix) and c.removeprefix(prefix).isdigit()]
    return sorted(cols, key=lambda c: _block_index(c, metric))


def _block_index(column: str, metric: str) -> int:
    return int(column.removeprefix(f"fidelity_{metric}_l"))


def _budget_label(b: float) -> str:
    b = float(b)
    if b >= 1000 and b % 1000 == 0:
        return f"{int(b // 1000)}k"
    return f"{b:g}"


def _budget_axis(ax, budgets: list) -> None:
    """log2 x axis with a tick at every budget of the grid, room on both sides (also for one budget)."""
    ax.set_xscale("log", base=2)
    if not budgets:
        return
    ax.set_xticks(budgets, [_budget_label(b) for b in budgets])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xlim(min(budgets) / 2 ** 0.4, max(budgets) * 2 ** 0.4)


def _number(value, missing: float = math.inf) -> float:
    """value as a float; `missing` when it is absent, NaN or not a number."""
    try:
        out = float(value)
    except (TypeError, ValueError):
        return missing
    return missing if math.isnan(out) else out


# -- gap closed, cost, throughput -----------------------------------------------------------------

def gap_closed_heatmap(summary: pd.DataFrame, config: dict, out_dir: str | Path) -> list[Path]:
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
    return save_figure(fig, Path(out_dir) / GAP_FIGURE)


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


def cost_to_accuracy(runs: pd.DataFrame, config: dict, out_dir: str | Path,
                     curves: pd.DataFrame | None = None) -> list[Path]:
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
    return save_figure(fig, Path(out_dir) / COST_FIGURE)


def accuracy_vs_throughput(runs: pd.DataFrame, config: dict, out_dir: str | Path) -> list[Path]:
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
    return save_figure(fig, Path(out_dir) / THROUGHPUT_FIGURE)


def _seed_ci(config: dict):
    """seaborn's `errorbar`: the claims' t interval over seeds at the config's level (stats.seed_interval)."""
    level = stats.Settings.from_config(config).level
    return lambda values: stats.seed_interval(values, level)


def _level_text(config: dict) -> str:
    return f"{100 * stats.Settings.from_config(config).level:g}%"


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
