"""The report's figures, each named and saved here: one function per figure of linvit.grid's
REPORT_FIGURES (and BENCHMARK_FIGURES), drawn by its family's module:

- figures_accuracy: accuracy by init strategy and design, test accuracy against training step (both
  at the grid's largest budget) and against the training budget, the gap closed as a heatmap;
- figures_attention: attention fidelity by block, class-token attention maps on the patch grid;
- figures_cost: accuracy against cost (steps and wall-clock) and against measured throughput, and the
  operator benchmark's time against tokens;
- figures_tests: every deciding test of the claims against its threshold;

with figures_common's panels, styles and reading of runs and curves.

Figures are drawn on explicit Agg-backed `Figure` objects (no pyplot), so the report never needs a
display, never touches the caller's global matplotlib state, and leaks no open figures. Each is
saved in linvit.grid's FIGURE_FORMATS (PNG for the Markdown report, SVG as vector), each written
atomically, under the names linvit.grid lists as the report's outputs.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from matplotlib.figure import Figure

from linvit.claims.verdicts import ClaimVerdict
from linvit.grid import BENCHMARK_FIGURES, FIGURE_FORMATS, REPORT_FIGURES
from linvit.io import atomic_path
from linvit.report.aggregate import ID_COLUMNS
from linvit.report.figures_accuracy import (draw_accuracy_by_budget, draw_accuracy_by_init, draw_gap_closed_heatmap,
                                            draw_training_curves)
from linvit.report.figures_attention import draw_attention_maps, draw_fidelity_by_block, map_dpi
from linvit.report.figures_common import DPI, _largest_budget, _with_axes
from linvit.report.figures_cost import draw_accuracy_vs_throughput, draw_attention_scaling, draw_cost_to_accuracy
from linvit.report.figures_tests import draw_claim_tests
# Read through this module by callers and tests: the line order and labels every figure shares.
from linvit.report.figures_accuracy import Plotted, plotted  # noqa: F401
from linvit.report.figures_common import _lines, _reference, _select, variant_label  # noqa: F401

(ACCURACY_FIGURE, CURVES_FIGURE, BUDGET_FIGURE, FIDELITY_FIGURE, MAPS_FIGURE, GAP_FIGURE, COST_FIGURE,
 THROUGHPUT_FIGURE, TESTS_FIGURE) = REPORT_FIGURES
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


def accuracy_by_init(runs: pd.DataFrame, config: dict, out_dir: str | Path, budget: float | None = None) -> list[Path]:
    """figures_accuracy.draw_accuracy_by_init, saved."""
    return save_figure(draw_accuracy_by_init(runs, config, budget), Path(out_dir) / ACCURACY_FIGURE)


def training_curves(curves: pd.DataFrame, config: dict, out_dir: str | Path, budget: float | None = None) -> list[Path]:
    """figures_accuracy.draw_training_curves, saved."""
    return save_figure(draw_training_curves(curves, config, budget), Path(out_dir) / CURVES_FIGURE)


def accuracy_by_budget(runs: pd.DataFrame, config: dict, out_dir: str | Path) -> list[Path]:
    """figures_accuracy.draw_accuracy_by_budget, saved."""
    return save_figure(draw_accuracy_by_budget(runs, config), Path(out_dir) / BUDGET_FIGURE)


def gap_closed_heatmap(summary: pd.DataFrame, config: dict, out_dir: str | Path) -> list[Path]:
    """figures_accuracy.draw_gap_closed_heatmap, saved."""
    return save_figure(draw_gap_closed_heatmap(summary, config), Path(out_dir) / GAP_FIGURE)


def fidelity_by_block(runs: pd.DataFrame, config: dict, out_dir: str | Path) -> list[Path]:
    """figures_attention.draw_fidelity_by_block, saved."""
    return save_figure(draw_fidelity_by_block(runs, config), Path(out_dir) / FIDELITY_FIGURE)


def attention_maps(maps: list[dict], out_dir: str | Path) -> list[Path]:
    """figures_attention.draw_attention_maps, saved at a resolution that keeps a large grid's PNG bounded."""
    fig = draw_attention_maps(maps)
    return save_figure(fig, Path(out_dir) / MAPS_FIGURE, dpi=map_dpi(fig))


def cost_to_accuracy(runs: pd.DataFrame, config: dict, out_dir: str | Path,
                     curves: pd.DataFrame | None = None) -> list[Path]:
    """figures_cost.draw_cost_to_accuracy, saved."""
    return save_figure(draw_cost_to_accuracy(runs, config, curves), Path(out_dir) / COST_FIGURE)


def accuracy_vs_throughput(runs: pd.DataFrame, config: dict, out_dir: str | Path) -> list[Path]:
    """figures_cost.draw_accuracy_vs_throughput, saved."""
    return save_figure(draw_accuracy_vs_throughput(runs, config), Path(out_dir) / THROUGHPUT_FIGURE)


def attention_scaling(bench: pd.DataFrame, out_dir: str | Path) -> list[Path]:
    """figures_cost.draw_attention_scaling (the operator benchmark), saved."""
    return save_figure(draw_attention_scaling(bench), Path(out_dir) / SCALING_FIGURE)


def claim_tests(verdicts: list[ClaimVerdict], looks: list[int] | None, out_dir: str | Path) -> list[Path]:
    """figures_tests.draw_claim_tests, saved; `looks`: the plan's looks (config `sequential.looks`),
    None for a fixed design."""
    return save_figure(draw_claim_tests(verdicts, looks), Path(out_dir) / TESTS_FIGURE)


def save_figure(fig: Figure, stem: Path, dpi: float = DPI) -> list[Path]:
    """Write the figure in every FIGURE_FORMATS (stem.png, stem.svg), each atomically."""
    paths = []
    for fmt in FIGURE_FORMATS:
        path = stem.with_suffix(f".{fmt}")
        with atomic_path(path) as tmp:
            fig.savefig(tmp, format=fmt, dpi=dpi, metadata=FORMAT_METADATA.get(fmt), bbox_inches="tight")
        paths.append(path)
    return paths
