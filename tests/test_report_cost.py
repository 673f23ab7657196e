"""Snakemake's benchmark TSVs become per-run wall-clock and peak memory columns, and a per-rule cost table."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from test_report import CONFIG, DESIGN, STEPS, accuracy, write_cell

from linvit.config import NO_DESIGN
from linvit.grid import Cell, all_cells, benchmark_path, distill_key, teacher_key
from linvit.report import collect, collect_benchmarks, write_report

CFG = {**CONFIG, "targets": ["dsA"], "variants": ["linA"], "seeds": [0], "inits": ["random", "copy_mlp_distill"]}
HEADER = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time"


def tsv(path, *rows) -> None:
    """One benchmark file: one row per repeat, (seconds, max_rss MB, cpu seconds); None is Snakemake's NA."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [HEADER]
    for s, rss, cpu in rows:
        rss_text = "NA" if rss is None else f"{rss:.2f}"
        lines.append(f"{s:.4f}\t0:00:{int(s):02d}\t{rss_text}\t900.00\t100.00\t110.00\t0.10\t0.20\t95.00\t{cpu:.2f}")
    path.write_text("\n".join(lines) + "\n")


def cell(init: str) -> Cell:
    return Cell("dsA", "tiny", "softmax" if init == "reference" else "linA", init, 0,
                DESIGN if "distill" in init else NO_DESIGN, STEPS)


@pytest.fixture()
def results(tmp_path):
    root = tmp_path / "results"
    for c in all_cells(CFG):
        write_cell(root, c, accuracy(c))
    tsv(benchmark_path("teacher", teacher_key("tiny", 0), root), (100.0, 500.0, 180.0))  # seed 0's own teacher
    tsv(benchmark_path("distill", distill_key("dsA", "tiny", "linA", "copy_mlp_distill", DESIGN, 0), root),
        (20.0, 300.0, 19.0))
    tsv(cell("random").benchmark_path("students", root), (10.0, 200.0, 9.0), (12.0, 220.0, 11.0))  # two repeats
    tsv(cell("copy_mlp_distill").benchmark_path("students", root), (15.0, 250.0, 14.0))
    # The reference's training job left no benchmark (run by hand): its columns are NaN.
    return root


def test_runs_get_wall_clock_and_peak_memory_per_job(results):
    runs = collect(CFG, results)[0].set_index("init")
    # Repeats: mean seconds, highest peak memory.
    assert runs.loc["random", ["train_wall_s", "train_max_rss_mb"]].tolist() == [11.0, 220.0]
    assert runs.loc["copy_mlp_distill", "train_wall_s"] == 15.0
    assert math.isnan(runs.loc["reference", "train_wall_s"]) and math.isnan(runs.loc["reference", "train_max_rss_mb"])
    write_report(CFG, results, results.parent / "report")
    header = (results / "runs.csv").read_text().splitlines()[0].split(",")
    assert {"train_wall_s", "train_max_rss_mb"} <= set(header)


def test_cost_per_rule_with_totals(results):
    costs = collect_benchmarks(CFG, results).set_index("rule")
    assert costs.loc["teacher", ["jobs", "benchmarked", "wall_s_total", "max_rss_mb_peak"]].tolist() == [1, 1, 100.0, 500.0]
    assert costs.loc[f"distill: copy_mlp_distill/{DESIGN}", ["jobs", "wall_s_total"]].tolist() == [1, 20.0]
    assert costs.loc["student: random", "wall_s_total"] == 11.0
    assert costs.loc["student: copy_mlp_distill", "max_rss_mb_peak"] == 250.0
    assert costs.loc["reference", ["jobs", "benchmarked"]].tolist() == [1, 0]
    assert math.isnan(costs.loc["reference", "wall_s_total"])
    assert "evaluate" not in costs.index  # the training jobs evaluate their models
    assert costs.loc["total", ["jobs", "benchmarked"]].tolist() == [5, 4]
    assert costs.loc["total", "wall_s_total"] == pytest.approx(100 + 20 + 11 + 15)
    assert costs.loc["total", "max_rss_mb_peak"] == 500.0
    assert costs.loc["total", "cpu_time_s_total"] == pytest.approx(180 + 19 + 10 + 14)
    write_report(CFG, results, results.parent / "report")
    readme = (results.parent / "report" / "README.md").read_text()
    cost = readme.split("## Cost")[1].split("\n## ")[0]
    assert "| teacher " in cost and "| student: copy_mlp_distill " in cost and "| total " in cost
    assert f"| distill: copy_mlp_distill/{DESIGN} " in cost
    assert "| 1 of 1 " in cost and "| 0 of 1 " in cost and "| 146.0 " in cost
    assert "CPU time is what Snakemake's sampler saw" in cost and "a lower bound" in cost


def test_no_benchmarks_give_nan_columns_and_no_error(tmp_path):
    for c in all_cells(CFG):
        write_cell(tmp_path, c, accuracy(c))
    runs, _ = collect(CFG, tmp_path)
    assert runs[["train_wall_s", "train_max_rss_mb"]].isna().all().all()
    assert (runs["status"] == "ok").all()
    write_report(CFG, tmp_path, tmp_path / "report")
    assert "No benchmark files" in (tmp_path / "report" / "README.md").read_text()


def test_a_malformed_benchmark_is_named_not_fatal(results):
    broken = cell("random").benchmark_path("students", results)
    broken.write_text("garbage without the columns\n1\n")
    runs = collect(CFG, results)[0].set_index("init")
    assert math.isnan(runs.loc["random", "train_wall_s"]) and runs.loc["random", "status"] == "ok"
    write_report(CFG, results, results.parent / "report")
    assert f"{broken}: no 's' column" in (results.parent / "report" / "README.md").read_text()
