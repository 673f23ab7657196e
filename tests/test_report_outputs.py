"""The report writes exactly the files linvit.grid.report_files lists (the `report` rule's outputs), no more."""

from __future__ import annotations

from pathlib import Path

from test_report import CONFIG, accuracy, write_cell

from linvit.grid import all_cells, operator_benchmark_path, report_files
from linvit.report import write_report

SMALL = {**CONFIG, "targets": ["dsA"], "variants": ["linA"], "seeds": [0],
         "inits": ["random", "copy_all", "copy_mlp", "attn_only", "copy_mlp_distill"]}


def files_under(*roots: Path) -> set[Path]:
    return {p for root in roots for p in root.rglob("*") if p.is_file()}


def tree(root: Path) -> tuple[Path, Path]:
    results, report = root / "results", root / "report"
    for cell in all_cells(SMALL):
        write_cell(results, cell, accuracy(cell))
    return results, report


def test_write_report_writes_exactly_the_listed_files(tmp_path):
    results, report = tree(tmp_path)
    before = files_under(results)
    written = write_report(SMALL, results, report)
    listed = {Path(p) for p in report_files(False, report, results)}
    assert sorted(written) == sorted(listed)
    assert files_under(results, report) - before == listed  # nothing else appeared
    assert not any("attention_scaling" in p.name for p in listed)


def test_the_scaling_figure_only_with_the_operator_benchmark(tmp_path):
    results, report = tree(tmp_path)
    bench = Path(operator_benchmark_path(results))
    bench.parent.mkdir(parents=True)
    rows = ["variant,tokens,seconds,speedup_vs_softmax,scope"]
    for variant, base in (("softmax", 1e-3), ("elu", 2e-3)):
        for tokens in (256, 1024, 4096):
            seconds = base * (tokens / 256) ** (2 if variant == "softmax" else 1)
            rows.append(f"{variant},{tokens},{seconds},{(1e-3 * (tokens / 256) ** 2) / seconds},core")
    bench.write_text("\n".join(rows) + "\n")
    before = files_under(results)
    written = write_report(SMALL, results, report)
    listed = {Path(p) for p in report_files(True, report, results)}
    assert set(written) == listed and files_under(results, report) - before == listed
    assert {report / "figures" / "attention_scaling.png", report / "figures" / "attention_scaling.svg"} <= listed
    assert "## Operator scaling" in (report / "README.md").read_text()
