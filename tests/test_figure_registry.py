"""A report figure is one entry of linvit.figure_registry: a toy figure registered here is drawn and saved
by the report, listed among its files and the `report` rule's, and carries its caption and category; the
registry refuses a bad entry; every registered figure has its Snakemake caption file and its row, with its
caption, in docs/report.md."""

from __future__ import annotations

import re

import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from conftest import REPO
from linvit import figure_registry
from linvit.figure_registry import FIGURES, figure, figure_names, register_figure, report_flags
from linvit.grid import all_cells, report_files
from linvit.report import write_report
from test_report_outputs import SMALL, tree

TOY_CAPTION = "Finished runs per init strategy, a toy figure registered by the test."
DRAWN = []  # the (runs, config) draw_toy was called with


def draw_toy(runs, config) -> Figure:
    """The number of finished runs per init strategy, as bars."""
    DRAWN.append((runs, config))
    fig = Figure(figsize=(3, 2))
    FigureCanvasAgg(fig)
    counts = runs[runs["status"] == "ok"].groupby("init").size()
    fig.add_subplot().bar(list(counts.index), list(counts.values))
    return fig


@pytest.fixture
def toy():
    """The toy figure registered after the report's own for the test, and no longer afterwards."""
    entry = register_figure("toy_runs", f"{__name__}:draw_toy", ("runs", "config"), TOY_CAPTION, "Accuracy")
    DRAWN.clear()
    yield entry
    FIGURES.remove(entry)


def test_a_registered_figure_is_drawn_saved_listed_and_captioned(tmp_path, toy):
    results, report = tree(tmp_path)
    assert f"{report}/figures/toy_runs.png" in report_files(False, report, results)
    assert report_files(True, report, results)[-6:-2] == [f"{report}/figures/{name}.{fmt}"
                                                            for name in ("toy_runs", "attention_scaling")
                                                            for fmt in ("png", "svg")]  # the benchmark's last
    written = write_report(SMALL, results, report)  # raises unless it wrote exactly report_files
    png, svg = report / "figures" / "toy_runs.png", report / "figures" / "toy_runs.svg"
    assert png in written and svg in written
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and b"<svg" in svg.read_bytes()[:2000]
    (runs, config), = DRAWN
    assert config is SMALL and len(runs) == len(all_cells(SMALL))
    readme = (report / "README.md").read_text()
    figures_section = readme.split("## Figures\n")[1].split("\n## ")[0]
    assert figures_section.rstrip().endswith(
        f"![toy runs](figures/toy_runs.png)\n\n{TOY_CAPTION} (toy runs; vector: [toy_runs.svg](figures/toy_runs.svg))")
    assert '<img alt="toy runs" src="data:image/png;base64,' in (report / "index.html").read_text()
    # Snakemake's report: its caption file and category (workflow/rules/report.smk reads report_flags).
    assert report_flags(f"{report}/figures/toy_runs.svg") == {
        "caption": "../report/toy_runs.rst", "category": "Accuracy", "labels": {"figure": "toy runs", "format": "svg"}}


def test_the_report_rule_flags_its_figures_from_the_registry():
    smk = (REPO / "workflow" / "rules" / "report.smk").read_text()
    assert "figure_registry.report_flags(path)" in smk
    assert not any(f'"{name}"' in smk for name in figure_names(with_benchmark=True))  # no figure spelled there
    assert report_flags("report/figures/claim_tests.png")["category"] == "Claims"
    assert report_flags("report/summary.csv") is None and report_flags("report/figures/nope.png") is None


def test_the_toy_is_gone_after_its_test_and_the_report_figures_keep_their_order():
    assert "toy_runs" not in figure_names(with_benchmark=True)
    assert figure_names() == ("accuracy_by_init", "training_curves", "accuracy_by_budget", "claims_by_budget",
                              "fidelity_by_block", "attention_maps", "gap_closed_heatmap", "cost_to_accuracy",
                              "accuracy_vs_throughput", "claim_tests", "c4_forest")
    assert figure_names(with_benchmark=True)[-1] == "attention_scaling"


@pytest.mark.parametrize("change, message", [
    (dict(name="accuracy_by_init"), "already registered"),
    (dict(name="Toy runs"), "not a file stem"),
    (dict(draw="draw_toy"), "is not 'module:function'"),
    (dict(inputs=("runs", "teachers")), "unknown input 'teachers'"),
    (dict(category="Misc"), "category 'Misc'"),
])
def test_a_bad_entry_is_refused(change, message):
    entry = dict(name="toy_bad", draw=f"{__name__}:draw_toy", inputs=("runs", "config"), caption="", category="Cost")
    before = list(FIGURES)
    with pytest.raises(ValueError, match=re.escape(message)):
        register_figure(**{**entry, **change})
    assert FIGURES == before


def test_the_registry_needs_no_matplotlib():
    source = (REPO / "linvit" / "figure_registry.py").read_text()
    imports = set(re.findall(r"^(?:from|import) ([\w.]+)", source, flags=re.M))
    assert imports == {"__future__", "re", "dataclasses"}, imports
    assert figure_registry.FIGURE_FORMATS == ("png", "svg")


@pytest.mark.parametrize("name", figure_names(with_benchmark=True))
def test_every_figure_has_its_snakemake_caption(name):
    caption = REPO / "workflow" / "report" / f"{name}.rst"
    assert caption.is_file(), f"{caption.relative_to(REPO)}: the figure's caption in `snakemake --report`"
    assert len(caption.read_text().split()) >= 10


def test_docs_report_lists_every_figure_with_its_caption():
    """docs/report.md's figure table is the registry's: a row per figure, in order, its text the caption (a
    figure without one, under the README's Operator scaling section, is said in words of the table's own)."""
    text = (REPO / "docs" / "report.md").read_text()
    table = text.split("| figure | what it shows |\n| --- | --- |\n")[1].split("\n\n")[0]
    rows = [re.fullmatch(r"\| `(\w+)` \| (.*) \|", line).groups() for line in table.splitlines()]
    expected = "\n".join(f"| `{e.name}` | {e.caption} |" for e in FIGURES)
    assert [name for name, _ in rows] == list(figure_names(with_benchmark=True)), expected
    for name, shown in rows:
        assert shown == (figure(name).caption or shown) and shown, f"docs/report.md, `{name}`:\n{expected}"
