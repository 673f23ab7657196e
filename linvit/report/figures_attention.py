"""The attention figures: fidelity to the teacher by block (KL and map correlation) and class-token
attention maps on the patch grid.

Each draw_* function returns an Agg-backed `Figure`; its entry in linvit.figure_registry names it and the
inputs it takes, linvit.report.figures draws and saves it.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from linvit.grid import REFERENCE_INIT
from linvit.report.figures_common import (DPI, NO_DESIGN, REFERENCE_LABEL, REFERENCE_STYLE, _budget_label, _finish,
                                          _finished, _init_colors, _line_label, _lines, _no_results, _panel_grid,
                                          _reference, _select, variant_label)


# (metric, y label, subfigure title) of fidelity_by_block's two rows of panels.
FIDELITY_ROWS = (("kl", "KL(A ‖ Â)", "KL divergence of the student's attention from the teacher's, per block"),
                 ("corr", "map correlation", "Pearson correlation of the student's and the teacher's attention maps"))


def draw_fidelity_by_block(runs: pd.DataFrame, config: dict) -> Figure:
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
    return fig


MAP_PANEL_INCHES = 0.8  # one head's patch grid
MAP_MAX_PIXELS = 12000  # the PNG's longer side at most (dpi lowered for very large grids)
MAP_CMAP = "viridis"


def draw_attention_maps(maps: list[dict]) -> Figure:
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
    return fig


def map_dpi(fig: Figure) -> float:
    """The attention maps' PNG resolution: DPI, lowered so that the longer side stays within MAP_MAX_PIXELS."""
    return min(float(DPI), MAP_MAX_PIXELS / float(max(fig.get_size_inches())))


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


def _block_columns(frame: pd.DataFrame, metric: str) -> list[str]:
    prefix = f"fidelity_{metric}_l"
    cols = [c for c in frame.columns if c.startswith(prefix) and c.removeprefix(prefix).isdigit()]
    return sorted(cols, key=lambda c: _block_index(c, metric))


def _block_index(column: str, metric: str) -> int:
    return int(column.removeprefix(f"fidelity_{metric}_l"))


def _number(value, missing: float = math.inf) -> float:
    """value as a float; `missing` when it is absent, NaN or not a number."""
    try:
        out = float(value)
    except (TypeError, ValueError):
        return missing
    return missing if math.isnan(out) else out
