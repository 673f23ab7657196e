"""The report's figures: every one registered in linvit.figure_registry, drawn from the report's tables and saved.

Each entry names its drawing function (in its family's module) and the inputs it takes; `FigureInputs` holds
those inputs, `draw_figure` draws one figure and saves it, `draw_figures` every figure of the report's
Figures section (or of its Operator scaling section). The families:

- figures_accuracy: accuracy by init strategy and design, test accuracy against training step (both
  at the grid's largest budget) and against the training budget, the gap closed as a heatmap;
- figures_attention: attention fidelity by block, class-token attention maps on the patch grid;
- figures_cost: accuracy against cost (steps and wall-clock) and against measured throughput, and the
  operator benchmark's time against tokens;
- figures_tests: every deciding test of the claims against its threshold, look by look;
- figures_c4: C4 at a glance (every deciding test's final interval per linear cell, by outcome) and each
  claim's deciding tests against the training budget at the grid's center;

with figures_common's panels, styles and reading of runs and curves. The functions below named after a
figure draw and save it from the inputs a caller holds (the tests', say); a new figure needs none.

Figures are drawn on explicit Agg-backed `Figure` objects (no pyplot), so the report never needs a
display, never touches the caller's global matplotlib state, and leaks no open figures. Each is
saved in FIGURE_FORMATS (PNG for the Markdown report, SVG as vector), each written atomically, under
the names linvit.grid lists as the report's outputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from pathlib import Path

import matplotlib
import pandas as pd
from matplotlib.figure import Figure

from linvit.claims.verdicts import ClaimVerdict
from linvit.figure_registry import FIGURE_FORMATS, FIGURES, figure
from linvit.io import atomic_path
from linvit.report.aggregate import ID_COLUMNS, attention_records
from linvit.report.figures_common import DPI, _largest_budget, _with_axes
# Read through this module by callers and tests: the line order and labels every figure shares.
from linvit.report.figures_accuracy import Plotted, plotted  # noqa: F401
from linvit.report.figures_common import _lines, _reference, _select, variant_label  # noqa: F401

# Metadata without dates keeps reruns byte-stable.
FORMAT_METADATA = {"png": {"Software": None}, "svg": {"Date": None}, "pdf": {"CreationDate": None}}


@dataclass
class FigureInputs:
    """What the registered figures are drawn from: linvit.figure_registry.INPUTS, each None until given.
    `of_report` gives them all from the report's tables."""

    config: dict
    runs: pd.DataFrame | None = None
    curves: pd.DataFrame | None = None
    finished_curves: pd.DataFrame | None = None
    budget: float | None = None
    summary: pd.DataFrame | None = None
    verdicts: list[ClaimVerdict] | None = None
    looks: list[int] | None = None
    maps: list[dict] | None = None
    bench: pd.DataFrame | None = None

    @classmethod
    def of_report(cls, config: dict, runs: pd.DataFrame, curves: pd.DataFrame, summary: pd.DataFrame | None = None,
                  verdicts: list[ClaimVerdict] | None = None, results: str | Path | None = None) -> FigureInputs:
        """The budget is the grid's largest (the largest in `runs`, which lists every expected cell), and the
        finished curves leave out runs that did not finish, so accuracy_by_init and training_curves show the
        same runs; the attention maps are read from `results` (none without it)."""
        axes = _with_axes(runs)
        finished = axes.loc[axes["status"] == "ok", ID_COLUMNS]
        return cls(config, runs, curves, _with_axes(curves).merge(finished, on=ID_COLUMNS), _largest_budget(axes),
                   summary, verdicts, (config.get("sequential") or {}).get("looks"),
                   None if results is None else attention_records(runs, results))


def draw_figure(name: str, inputs: FigureInputs, out_dir: str | Path) -> list[Path]:
    """Draw the registered figure `name` from its inputs and save it in out_dir (out_dir/name.png, .svg)."""
    entry = figure(name)
    fig = _function(entry.draw)(*(getattr(inputs, key) for key in entry.inputs))
    return save_figure(fig, Path(out_dir) / entry.name, dpi=_function(entry.dpi)(fig) if entry.dpi else DPI)


def draw_figures(inputs: FigureInputs, out_dir: str | Path, benchmark: bool = False) -> list[Path]:
    """Every registered figure of the Figures section, in order (with `benchmark`: those of the operator
    benchmark instead), each drawn and saved."""
    return [path for entry in FIGURES if entry.benchmark == benchmark for path in draw_figure(entry.name, inputs, out_dir)]


def _function(ref: str):
    module, name = ref.split(":")
    return getattr(import_module(module), name)


def write_figures(runs: pd.DataFrame, curves: pd.DataFrame, config: dict, out_dir: str | Path) -> list[Path]:
    """Accuracy by init and the training curves, both at the grid's largest budget, of the same runs
    (FigureInputs.of_report)."""
    inputs = FigureInputs.of_report(config, runs, curves)
    return draw_figure("accuracy_by_init", inputs, out_dir) + draw_figure("training_curves", inputs, out_dir)


def accuracy_by_init(runs: pd.DataFrame, config: dict, out_dir: str | Path, budget: float | None = None) -> list[Path]:
    """At `budget`, by default the largest in `runs`."""
    return draw_figure("accuracy_by_init", FigureInputs(config, runs=runs, budget=budget), out_dir)


def training_curves(curves: pd.DataFrame, config: dict, out_dir: str | Path, budget: float | None = None) -> list[Path]:
    """All of `curves`, at `budget`, by default the largest in `curves`."""
    return draw_figure("training_curves", FigureInputs(config, finished_curves=curves, budget=budget), out_dir)


def accuracy_by_budget(runs: pd.DataFrame, config: dict, out_dir: str | Path) -> list[Path]:
    return draw_figure("accuracy_by_budget", FigureInputs(config, runs=runs), out_dir)


def gap_closed_heatmap(summary: pd.DataFrame, config: dict, out_dir: str | Path) -> list[Path]:
    return draw_figure("gap_closed_heatmap", FigureInputs(config, summary=summary), out_dir)


def fidelity_by_block(runs: pd.DataFrame, config: dict, out_dir: str | Path) -> list[Path]:
    return draw_figure("fidelity_by_block", FigureInputs(config, runs=runs), out_dir)


def attention_maps(maps: list[dict], out_dir: str | Path) -> list[Path]:
    """From attention records (linvit.report.aggregate.attention_records)."""
    return draw_figure("attention_maps", FigureInputs({}, maps=maps), out_dir)


def cost_to_accuracy(runs: pd.DataFrame, config: dict, out_dir: str | Path,
                     curves: pd.DataFrame | None = None) -> list[Path]:
    return draw_figure("cost_to_accuracy", FigureInputs(config, runs=runs, curves=curves), out_dir)


def accuracy_vs_throughput(runs: pd.DataFrame, config: dict, out_dir: str | Path) -> list[Path]:
    return draw_figure("accuracy_vs_throughput", FigureInputs(config, runs=runs), out_dir)


def attention_scaling(bench: pd.DataFrame, out_dir: str | Path) -> list[Path]:
    """The operator benchmark's figure."""
    return draw_figure("attention_scaling", FigureInputs({}, bench=bench), out_dir)


def claim_tests(verdicts: list[ClaimVerdict], looks: list[int] | None, out_dir: str | Path) -> list[Path]:
    """`looks`: the plan's looks (config `sequential.looks`), None for a fixed design."""
    return draw_figure("claim_tests", FigureInputs({}, verdicts=verdicts, looks=looks), out_dir)


def save_figure(fig: Figure, stem: Path, dpi: float = DPI) -> list[Path]:
    """Write the figure in every FIGURE_FORMATS (stem.png, stem.svg), each atomically."""
    paths = []
    for fmt in FIGURE_FORMATS:
        path = stem.with_suffix(f".{fmt}")
        # A fixed salt: matplotlib otherwise salts an SVG's clip-path ids with a fresh uuid, so the same
        # figure would never come out byte-identical twice (a committed reference could not be regenerated).
        with atomic_path(path) as tmp, matplotlib.rc_context({"svg.hashsalt": "linvit"}):
            fig.savefig(tmp, format=fmt, dpi=dpi, metadata=FORMAT_METADATA.get(fmt), bbox_inches="tight")
        paths.append(path)
    return paths
