"""The report's figures, one registered entry each, read without matplotlib or pandas.

An entry is all the harness needs of a figure: its name (the files report/figures/<name>.png and .svg),
the function that draws it, by dotted name ("module:function", imported only when the report draws:
linvit.grid, the Snakefile and `linvit status` read this list without matplotlib), the inputs that
function takes (FigureInputs' fields, in order), the caption under it in report/README.md, and its
category in Snakemake's own report. The rest follows from the list: `grid.report_files` (the report
rule's outputs), the rule's categories and captions (workflow/rules/report.smk, the caption file
workflow/report/<name>.rst), the drawing and saving (linvit.report.figures.draw_figures), README.md's
Figures section (linvit.report.readme) and the figure table of docs/report.md (tests check both).

The order of FIGURES is the order of the report's files and of its Figures section. Stdlib only: this
module sits below linvit.grid.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

FIGURE_FORMATS = ("png", "svg")  # each figure's files, in this order: the PNG for the Markdown report, the SVG as vector
# What a drawing function may take (linvit.report.figures.FigureInputs builds each from the report's tables).
INPUTS = {
    "config": "the grid's config",
    "runs": "every expected run, any status (results/runs.csv)",
    "curves": "every evaluation during training (results/curves.csv)",
    "finished_curves": "the curves of finished runs, design and budget filled in",
    "budget": "the grid's largest budget (of runs)",
    "summary": "means over seeds and gap closed (report/summary.csv)",
    "verdicts": "the claims' verdicts (report/claims.json)",
    "looks": "the sequential plan's looks (config `sequential.looks`), None for a fixed design",
    "maps": "the class token's attention rows of every finished run (linvit.report.aggregate.attention_records)",
    "bench": "the operator benchmark's table (results/benchmark/attention.csv; benchmark figures only)",
}
CATEGORIES = ("Claims", "Accuracy", "Cost", "Attention")  # a figure's category in `snakemake --report`


@dataclass(frozen=True)
class FigureEntry:
    name: str  # report/figures/<name>.<format>; README shows it as the name with spaces
    draw: str  # "module:function" returning an Agg-backed matplotlib Figure
    inputs: tuple[str, ...]  # INPUTS the function takes, positionally
    caption: str  # the sentence under the figure in report/README.md ("" for none)
    category: str  # one of CATEGORIES
    benchmark: bool = False  # drawn only when the operator benchmark ran, in README's Operator scaling section
    dpi: str = ""  # "module:function" giving the PNG's resolution from the drawn figure; "": the report's DPI

    def __post_init__(self):
        problems = ([f"name {self.name!r} is not a file stem of lowercase letters, digits and _"]
                    if not re.fullmatch(r"[a-z][a-z0-9_]*", self.name) else [])
        problems += [f"{ref} {value!r} is not 'module:function'" for ref, value in (("draw", self.draw), ("dpi", self.dpi))
                     if (value or ref == "draw") and not re.fullmatch(r"[\w.]+:\w+", value)]
        problems += [f"unknown input {key!r} (one of {', '.join(INPUTS)})" for key in self.inputs if key not in INPUTS]
        problems += [] if self.category in CATEGORIES else [f"category {self.category!r} is not one of {CATEGORIES}"]
        if problems:
            raise ValueError(f"figure {self.name!r}: " + "; ".join(problems))


FIGURES: list[FigureEntry] = []


def register_figure(name: str, draw: str, inputs: tuple[str, ...], caption: str, category: str, *,
                    benchmark: bool = False, dpi: str = "") -> FigureEntry:
    """Add a figure to the report (after those registered before it); a name already registered is refused."""
    if any(entry.name == name for entry in FIGURES):
        raise ValueError(f"figure {name!r} is already registered")
    entry = FigureEntry(name, draw, tuple(inputs), caption, category, benchmark, dpi)
    FIGURES.append(entry)
    return entry


def figure(name: str) -> FigureEntry:
    """The registered entry of `name`."""
    for entry in FIGURES:
        if entry.name == name:
            return entry
    raise KeyError(f"no figure {name!r} is registered (linvit.figure_registry)")


def figure_names(with_benchmark: bool = False) -> tuple[str, ...]:
    """The registered figures' names, in order: those of the Figures section, and with `with_benchmark` (the
    operator benchmark's CSV exists) the benchmark's after them."""
    return (tuple(e.name for e in FIGURES if not e.benchmark)
            + (tuple(e.name for e in FIGURES if e.benchmark) if with_benchmark else ()))


def report_flags(path: str) -> dict | None:
    """The flags of `report(path, ...)` in workflow/rules/report.smk (Snakemake's own report) for a figure's file,
    report/figures/<name>.<format>: its caption file workflow/report/<name>.rst (relative to the rules), its
    category and labels; None for a file that is not a registered figure's."""
    folder, _, file = path.rpartition("/")
    name, _, fmt = file.rpartition(".")
    if not folder.endswith("figures") or fmt not in FIGURE_FORMATS or name not in figure_names(with_benchmark=True):
        return None
    entry = figure(name)
    return {"caption": f"../report/{entry.name}.rst", "category": entry.category,
            "labels": {"figure": entry.name.replace("_", " "), "format": fmt}}


# -- the report's figures ---------------------------------------------------------------------------------

register_figure(
    "accuracy_by_init", "linvit.report.figures_accuracy:draw_accuracy_by_init", ("runs", "config", "budget"),
    "Final test accuracy per init strategy [design] at the grid's largest budget: seeds as points, the mean with its "
    "t interval over seeds (the claims' level, `claims.level`), the softmax reference dashed.", "Accuracy")
register_figure(
    "training_curves", "linvit.report.figures_accuracy:draw_training_curves", ("finished_curves", "config", "budget"),
    "Test accuracy against training step per init strategy [design] at the grid's largest budget (band: std over "
    "seeds), the softmax reference dashed.", "Accuracy")
register_figure(
    "accuracy_by_budget", "linvit.report.figures_accuracy:draw_accuracy_by_budget", ("runs", "config"),
    "Test accuracy against the training budget (log2 axis), one line per init strategy and design through the mean "
    "over seeds, the softmax reference dashed.", "Accuracy")
register_figure(
    "claims_by_budget", "linvit.report.figures_c4:draw_claims_by_budget", ("verdicts", "config"),
    "Each claim's deciding tests against the training budget (log2 axis) in one cell, the grid's center (else the "
    "linear cell with the most budgets): the estimate and final interval at each budget (under a sequential plan the "
    "repeated interval at the look it stopped or the last look read), marked by the test's outcome, the threshold "
    "dashed: do the verdicts survive longer training? A grid with one budget draws its one column.", "Claims")
register_figure(
    "fidelity_by_block", "linvit.report.figures_attention:draw_fidelity_by_block", ("runs", "config"),
    "Attention fidelity to the teacher per block at the largest budget (mean over seeds): KL(A ‖ Â) above, the maps' "
    "correlation below.", "Attention")
register_figure(
    "attention_maps", "linvit.report.figures_attention:draw_attention_maps", ("maps",),
    "The class token's attention on the patch grid, one panel per head: the teacher, then the softmax reference and "
    "each student (largest budget, first seed).", "Attention",
    dpi="linvit.report.figures_attention:map_dpi")  # a lower resolution keeps a large grid's PNG bounded
register_figure(
    "gap_closed_heatmap", "linvit.report.figures_accuracy:draw_gap_closed_heatmap", ("summary", "config"),
    "Gap closed at the grid's largest budget (0: the random role, 1: the softmax reference), operator x init strategy "
    "[design], one panel per dataset; empty cells are undefined.", "Claims")
register_figure(
    "cost_to_accuracy", "linvit.report.figures_cost:draw_cost_to_accuracy", ("runs", "config", "curves"),
    "Test accuracy against cost, one line per init strategy [design] through its budgets (with one budget: through "
    "each run's evaluations along training), the softmax reference dashed: against steps (a distilled strategy's "
    "distillation steps added) and against train + distill seconds; bars are t intervals over seeds (the claims' "
    "level).", "Cost")
register_figure(
    "accuracy_vs_throughput", "linvit.report.figures_cost:draw_accuracy_vs_throughput", ("runs", "config"),
    "Test accuracy at the largest budget against measured forward throughput (images/s on the evaluating machine), "
    "per operator and init strategy [design], the softmax reference a star; bars are t intervals over seeds (the "
    "claims' level).", "Cost")
register_figure(
    "claim_tests", "linvit.report.figures_tests:draw_claim_tests", ("verdicts", "looks"),
    "Each deciding test of each linear cell against its threshold (dashed), one panel per test: under a fixed design "
    "its estimate and paired interval (the claims' own, at `claims.level`); under a sequential plan its estimate and "
    "repeated interval at each look against the seeds of that look, the stopping look ringed. An unbounded end (a "
    "share whose benefit is not established) is clipped to the panel's edge.", "Claims")
register_figure(
    "c4_forest", "linvit.report.figures_c4:draw_c4_forest", ("verdicts", "config"),
    "C4 at a glance: each deciding test's final interval in each linear cell against its threshold (dashed), one "
    "panel per claim and test, one row per cell (around a center: named by the axis it moves), marked by the test's "
    "outcome (holds, fails, continues or undecided within the cap, inconclusive or too few seeds): under a fixed "
    "design the paired interval, under a sequential plan the repeated interval at the look it stopped or the last "
    "look read, its look and seeds at the right. An unbounded end is clipped to the panel's edge.", "Claims")
# No caption: the Operator scaling section's text above it says what it shows.
register_figure("attention_scaling", "linvit.report.figures_cost:draw_attention_scaling", ("bench",), "", "Attention",
                benchmark=True)
