"""The report: aggregation, claim verdicts, figures and README from a results tree whose numbers the test chooses.

Accuracies are picked per (dataset, variant) cell so each claim's verdict is known in advance:
  dsA/linA  C1 holds (attn_only worse than random), C2 holds, C3 holds and surpasses softmax
  dsA/linB  C1 fails (attn_only gives half the benefit), C2 fails (the MLPs alone give a quarter), C3 fails
  dsB/linA  C1, C2, C3 hold (C3 within its margin, below softmax)
  dsB/linB  C1 fails on attention added on top (attention alone not evaluable: attn_only missing, one run
            failed with a log, one never ran), C2 fails, C3 holds
Each seed is the cell's mean -/+ (SPREAD + JITTER[init]): the means are the numbers below, and each paired
difference moves by a few 1e-5 from seed to seed (the runs have no per-image predictions), because a contrast
with no variance at all is no test; its t stays far past any boundary, so the verdicts are as known.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from linvit.claims.judge import evaluate_claims
from linvit.claims.verdicts import NOT_EVALUABLE
from linvit.config import NO_DESIGN
from linvit.figure_registry import figure_names
from linvit.grid import Cell, all_cells
from linvit.predictions import PREDICTIONS, write_predictions
from linvit.report import ResultsError, collect, cost_table, load_predictions, summarize, write_report
from linvit.stats.paired import FAILS, HOLDS, INCONCLUSIVE, TOO_FEW

INITS = ["random", "copy_all", "copy_attn", "copy_mlp", "attn_only", "mlp_only", "copy_mlp_distill", "distill_only"]
CONFIG = {
    "targets": ["dsA", "dsB"], "sizes": ["tiny"], "variants": ["linA", "linB"], "inits": INITS, "seeds": [0, 1],
    "teacher": {"dataset": "pretrainset"},
    # One budget (the default: student.train.steps) and one design: the grid of the claims alone.
    "student": {"train": {"steps": 100}},
    "distill_designs": {"proj_mse": {"losses": ["proj_mse"]}}, "distills": ["proj_mse"],
    "init_strategies": {
        "random": {"copy": [], "distill": False},
        "copy_all": {"copy": ["embed", "attn", "mlp", "norm", "head"], "distill": False},
        "copy_attn": {"copy": ["embed", "attn", "norm", "head"], "distill": False},
        "copy_mlp": {"copy": ["embed", "mlp", "norm", "head"], "distill": False},
        "attn_only": {"copy": ["attn"], "distill": False},
        "mlp_only": {"copy": ["mlp"], "distill": False},
        "copy_mlp_distill": {"copy": ["embed", "mlp", "norm", "head"], "distill": True},
        "distill_only": {"copy": [], "distill": True},
    },
    "claims": {"negligible": 0.25, "most": 0.5, "margin": 0.005, "min_seeds": 2},
}
REFERENCE = {"dsA": 0.80, "dsB": 0.70}
ACC = {
    ("dsA", "linA"): dict(random=0.50, copy_all=0.70, copy_attn=0.55, copy_mlp=0.68, attn_only=0.48,
                          mlp_only=0.62, copy_mlp_distill=0.81, distill_only=0.60),
    ("dsA", "linB"): dict(random=0.50, copy_all=0.70, copy_attn=0.55, copy_mlp=0.62, attn_only=0.60,
                          mlp_only=0.55, copy_mlp_distill=0.79, distill_only=0.60),
    ("dsB", "linA"): dict(random=0.40, copy_all=0.60, copy_attn=0.45, copy_mlp=0.58, attn_only=0.41,
                          mlp_only=0.52, copy_mlp_distill=0.697, distill_only=0.50),
    ("dsB", "linB"): dict(random=0.40, copy_all=0.60, copy_attn=0.45, copy_mlp=0.45, attn_only=0.45,
                          mlp_only=0.42, copy_mlp_distill=0.72, distill_only=0.50),
}
SPREAD = 0.01
# Per role, so that no paired contrast is the same on every seed (that would be paired.NO_TEST); the softmax
# reference (init "reference") moves by SPREAD alone.
JITTER = {init: 1e-5 * (i + 1) for i, init in enumerate(INITS)}
STEPS, TRAIN_TIME, DISTILL_TIME, LAYERS = 100, 10.0, 2.5, 3
DESIGN = "proj_mse"
FAILED_LOG = ["starting run", "RuntimeError: shape mismatch in blocks.0.attn.qkv", "Error: job failed", "exit 1"]


def accuracy(cell: Cell) -> float:
    base = REFERENCE[cell.dataset] if cell.is_reference else ACC[(cell.dataset, cell.variant)][cell.init]
    spread = SPREAD + JITTER.get(cell.init, 0.0)
    return base + (spread if cell.seed else -spread)


def write_cell(results: Path, cell: Cell, acc: float, evaluated: bool = True, train_losses=(),
               task_weight: float = 1.0, distill_steps: int = 20, predictions: bool = False) -> None:
    """A finished run's files as linvit.steps writes them (metrics.json, eval.json, train.jsonl; with
    `predictions`, predictions.npz: the first round(acc x 1000) of 1000 test images right, so every
    run agrees on the easy images, as trained models do)."""
    run_dir = cell.run_dir(results)
    run_dir.mkdir(parents=True, exist_ok=True)
    if predictions:
        label = np.arange(1000) % 4
        pred = np.where(np.arange(1000) < round(acc * 1000), label, (label + 1) % 4)
        write_predictions(run_dir / PREDICTIONS, pred, label, "test-split")
    metrics = {**cell.as_dict(), "test_acc": acc, "test_samples": 1000, "steps": cell.budget,
               "train_time_s": TRAIN_TIME, "images_seen": cell.budget * 32,
               "copied": {"embed": 10, "attn": 0 if cell.init == "copy_mlp" else 40, "attn_extra": 0, "mlp": 80,
                          "norm": 4, "head": 20},
               "distill": ({"design": cell.design, "loss": cell.design, "steps": distill_steps, "time_s": DISTILL_TIME,
                            "final_loss": 0.1} if cell.distills else None),
               "train_losses": [dict(t) for t in train_losses], "task_weight": task_weight}
    (run_dir / "metrics.json").write_text(json.dumps(metrics))
    if evaluated:
        fidelity = {"kl": [0.1 * (layer + 1) for layer in range(LAYERS)],
                    "js": [0.01 * (layer + 1) for layer in range(LAYERS)],
                    "corr": [0.9 - 0.1 * layer for layer in range(LAYERS)]}
        (run_dir / "eval.json").write_text(json.dumps({
            **cell.as_dict(), "params": 5000, "params_attn_extra": 0 if cell.is_reference else 30,
            "throughput_img_s": 900.0, **{f"fidelity_{k}": v for k, v in fidelity.items()},
            **{f"fidelity_{k}_mean": sum(v) / LAYERS for k, v in fidelity.items()}}))
    # Accuracy rises linearly to its final value over five evaluations, with training lines in between.
    lines = []
    for k in range(1, 6):
        step = k * cell.budget // 5
        lines.append({"kind": "train", "step": step, "loss": 2.0 / k, "lr": 1e-3, "elapsed_s": step / 10})
        lines.append({"kind": "eval", "step": step, "epoch": k, "test_acc": acc * k / 5, "samples": 1000,
                      "elapsed_s": step / 10})
    (run_dir / "train.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))


def write_log(results: Path, cell: Cell, lines: list[str]) -> None:
    cell.log_path(results).parent.mkdir(parents=True, exist_ok=True)
    cell.log_path(results).write_text("\n".join(lines) + "\n")


def build_results(results: Path) -> None:
    for cell in all_cells(CONFIG):
        if (cell.dataset, cell.variant) == ("dsB", "linB") and cell.init == "attn_only":
            if cell.seed == 0:
                write_log(results, cell, FAILED_LOG)
            continue  # seed 1 never ran: no log either
        if (cell.dataset, cell.variant, cell.init) == ("dsB", "linB", "distill_only"):
            if cell.seed == 0:
                write_log(results, cell, ["starting run", "killed"])
                continue
            write_cell(results, cell, accuracy(cell), evaluated=False)
            continue
        write_cell(results, cell, accuracy(cell))


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    results, report = root / "results", root / "report"
    build_results(results)
    report.mkdir()
    (report / "notes.txt").write_text("mine")  # a user's file: the report must leave it alone
    written = write_report(CONFIG, results, report)
    return results, report, written


@pytest.fixture(scope="module")
def verdicts(tree):
    results, _, _ = tree
    runs, _ = collect(CONFIG, results)
    return {v.claim: v for v in evaluate_claims(runs, CONFIG, load_predictions(runs))}


def cell_verdict(verdict, dataset, variant):
    return next(c for c in verdict.cells if (c.dataset, c.variant) == (dataset, variant))


def test_runs_table_has_one_row_per_expected_cell_and_missing_reasons(tree):
    results, _, _ = tree
    runs, curves = collect(CONFIG, results)
    assert len(runs) == 2 * 2 * 8 * 2 + 2 * 2  # students + one softmax reference per (dataset, size, seed)
    missing = runs[runs["status"] == "missing"].set_index(["init", "seed"])["reason"]
    assert missing[("attn_only", 0)] == "Error: job failed"  # the last line mentioning an error
    assert missing[("attn_only", 1)] == "not run (no log)"
    assert missing[("distill_only", 0)].startswith("failed (see ") and missing[("distill_only", 0)].endswith(".log)")
    assert missing[("distill_only", 1)].startswith("not evaluated")
    assert len(missing) == 4
    row = runs[(runs["init"] == "copy_mlp_distill") & (runs["status"] == "ok")].iloc[0]
    assert row["total_time_s"] == pytest.approx(TRAIN_TIME + DISTILL_TIME)
    assert row["distill_steps"] == 20 and row["distill_loss"] == DESIGN
    assert (row["design"], row["budget"]) == (DESIGN, STEPS)
    assert set(runs.loc[~runs["init"].str.contains("distill"), "design"]) == {NO_DESIGN}
    assert row["fidelity_js_l2"] == pytest.approx(0.03) and row["fidelity_corr_l0"] == pytest.approx(0.9)
    assert pd.isna(row["train_losses"]) and row["task_weight"] == 1.0
    # Only eval lines become curve rows: 5 per run that wrote a train.jsonl.
    assert len(curves) == 5 * (len(runs) - 3)


def test_csv_columns(tree):
    results, report, written = tree
    with open(results / "runs.csv") as fh:
        columns = next(csv.reader(fh))
    assert columns[:9] == ["dataset", "size", "variant", "init", "design", "budget", "seed", "status", "reason"]
    for col in ["test_acc", "test_samples", "steps", "train_time_s", "images_seen", "distill_steps",
                "distill_time_s", "total_time_s", "train_losses", "task_weight", "params", "params_attn_extra",
                "throughput_img_s", "fidelity_kl_mean", "fidelity_js_mean", "fidelity_corr_mean", "copied_embed",
                "copied_attn", "copied_attn_extra", "copied_mlp", "copied_norm", "copied_head"]:
        assert col in columns
    for metric in ("kl", "js", "corr"):
        assert [c for c in columns if c.startswith(f"fidelity_{metric}_l")] == [
            f"fidelity_{metric}_l{i}" for i in range(LAYERS)]
    with open(results / "curves.csv") as fh:
        assert next(csv.reader(fh)) == ["dataset", "size", "variant", "init", "design", "budget", "seed", "step",
                                        "epoch", "test_acc", "elapsed_s"]
    with open(report / "summary.csv") as fh:
        summary_columns = next(csv.reader(fh))
    assert summary_columns[:11] == ["dataset", "size", "variant", "init", "design", "budget", "n_seeds", "n_expected",
                                    "test_acc_mean", "test_acc_std", "gap_closed"]
    assert {results / "runs.csv", results / "curves.csv", report / "summary.csv", report / "README.md"} <= set(written)


def test_gap_closed_and_seed_statistics(tree):
    results, _, _ = tree
    runs, _ = collect(CONFIG, results)
    summary = summarize(runs, CONFIG).set_index(["dataset", "variant", "init"])
    assert summary.loc[("dsA", "linA", "copy_mlp_distill"), "design"] == DESIGN
    row = summary.loc[("dsA", "linA", "copy_mlp_distill")]
    assert row["test_acc_mean"] == pytest.approx(0.81)
    assert row["test_acc_std"] == pytest.approx((SPREAD + JITTER["copy_mlp_distill"]) * math.sqrt(2))
    assert row["gap_closed"] == pytest.approx((0.81 - 0.50) / (0.80 - 0.50))
    assert summary.loc[("dsB", "linA", "copy_all"), "gap_closed"] == pytest.approx((0.60 - 0.40) / (0.70 - 0.40))
    assert math.isnan(summary.loc[("dsA", "softmax", "reference"), "gap_closed"])
    partial = summary.loc[("dsB", "linB", "attn_only")]
    assert (partial["n_seeds"], partial["n_expected"]) == (0, 2)


def test_c1_holds_where_attention_adds_little_and_fails_elsewhere(verdicts):
    c1 = verdicts["C1"]
    a = cell_verdict(c1, "dsA", "linA")
    assert a.outcome == HOLDS
    assert a.test("attn_alone").estimate == pytest.approx((0.48 - 0.50) / 0.20)
    assert a.test("attn_on_top").estimate == pytest.approx((0.70 - 0.68) / 0.20)
    assert a.test("attn_worse").outcome == HOLDS  # worse than random
    b = cell_verdict(c1, "dsA", "linB")
    assert b.outcome == FAILS and b.test("attn_alone").estimate == pytest.approx(0.5)
    assert cell_verdict(c1, "dsB", "linA").outcome == HOLDS
    # attn_only missing: attention alone is not evaluable, but attention on top fails, (0.60 - 0.45) / 0.20 =
    # 75% of the benefit against at most 25%, and one failing test fails the claim (at alpha / 2).
    partial = cell_verdict(c1, "dsB", "linB")
    assert partial.test("attn_alone").outcome == NOT_EVALUABLE
    assert partial.test("attn_alone").note.startswith("no finished run of attn_only")
    assert partial.test("attn_on_top").outcome == FAILS and partial.outcome == FAILS
    assert c1.verdict == "mixed (2 holds, 2 fails)"
    assert c1.counts[NOT_EVALUABLE] == 0


def test_c2_rests_on_the_mlps_alone_and_on_top(verdicts):
    c2 = verdicts["C2"]
    b = cell_verdict(c2, "dsA", "linB")
    assert b.outcome == FAILS
    assert b.test("mlp_alone").estimate == pytest.approx(0.25) and b.test("mlp_alone").outcome == FAILS
    assert b.test("mlp_on_top").estimate == pytest.approx(0.75) and b.test("mlp_on_top").outcome == HOLDS
    assert b.test("all_but_attn").estimate == pytest.approx(0.6) and not b.test("all_but_attn").decides
    assert cell_verdict(c2, "dsB", "linA").outcome == HOLDS
    assert cell_verdict(c2, "dsB", "linB").outcome == FAILS
    assert c2.verdict == "mixed (2 holds, 2 fails)"


def test_c3_margin_and_surpassing(verdicts):
    c3 = verdicts["C3"]
    a = cell_verdict(c3, "dsA", "linA")
    assert a.outcome == HOLDS and a.test("surpasses").outcome == HOLDS
    assert a.test("gap_closed").estimate == pytest.approx(0.31 / 0.30)
    assert cell_verdict(c3, "dsA", "linB").outcome == FAILS  # 1 pp below softmax, margin 0.5 pp
    within = cell_verdict(c3, "dsB", "linA")
    assert within.outcome == HOLDS and within.test("surpasses").outcome == FAILS  # 0.3 pp below
    assert c3.verdict == "mixed (3 holds, 1 fails)"


def test_c4_combines_cells_and_names_untested_axes(verdicts):
    c4 = verdicts["C4"]
    assert [c.outcome for c in c4.cells] == [HOLDS, FAILS, HOLDS, FAILS]
    assert c4.axes["sizes"] == "not tested (the grid has one: tiny)"
    assert c4.axes["datasets"] == "dsA: mixed (1 holds, 1 fails); dsB: mixed (1 holds, 1 fails)"
    assert c4.verdict == "mixed (2 holds, 2 fails)"


def test_not_evaluable_when_inits_absent_and_too_few_seeds(tree):
    results, _, _ = tree
    config = {**CONFIG, "inits": ["random", "copy_all", "copy_mlp", "copy_mlp_distill"], "seeds": [0],
              "targets": ["dsA"], "variants": ["linA"]}
    runs, _ = collect(config, results)
    verdicts = {v.claim: v for v in evaluate_claims(runs, config, load_predictions(runs))}
    assert verdicts["C1"].verdict == ("not evaluable: no strategy of the grid fills attn_only (copies attn; no "
                                      "distillation; task loss only; `attn_only` is defined but not in inits)")
    # One seed: every test that can run says so, never holds or fails.
    assert verdicts["C3"].verdict == TOO_FEW and verdicts["C3"].cells[0].outcome == TOO_FEW
    c1 = verdicts["C1"].cells[0]
    assert c1.test("attn_on_top").outcome == TOO_FEW and c1.test("attn_alone").outcome == NOT_EVALUABLE
    assert verdicts["C4"].verdict.startswith("not tested")


def test_zero_denominator_is_guarded(tmp_path):
    config = {**CONFIG, "targets": ["dsA"], "variants": ["linA"],
              "inits": ["random", "copy_all", "copy_mlp", "attn_only", "copy_mlp_distill"]}
    for cell in all_cells(config):
        # random matches copy_all and beats the reference: every share and gap closed is undefined.
        acc = {"random": 0.5, "copy_all": 0.5, "reference": 0.4}.get(cell.init, 0.45) + (0.01 if cell.seed else 0)
        write_cell(tmp_path, cell, acc)
    runs, _ = collect(config, tmp_path)
    summary = summarize(runs, config)
    assert summary.loc[summary["init"] != "reference", "gap_closed"].isna().all()
    verdicts = {v.claim: v for v in evaluate_claims(runs, config, load_predictions(runs))}
    c1 = verdicts["C1"].cells[0]
    assert c1.outcome == INCONCLUSIVE and c1.test("attn_alone").outcome == INCONCLUSIVE
    assert c1.test("attn_alone").note
    gap = verdicts["C3"].cells[0].test("gap_closed")
    assert not (math.isfinite(gap.low) and math.isfinite(gap.high))


def test_cost_table_steps_to_reach_random(tree):
    results, _, _ = tree
    runs, curves = collect(CONFIG, results)
    costs = cost_table(runs, curves, CONFIG).set_index(["dataset", "variant", "init"])
    row = costs.loc[("dsA", "linA", f"copy_mlp_distill (design {DESIGN})")]
    # Curves reach 0.2, 0.4, ... of the final accuracy: 0.8 x 0.80 first beats random's 0.49 at step 80.
    assert row["steps_to_random_acc"] == 80 and row["seeds_reaching"] == 2
    assert row["total_time_s_mean"] == pytest.approx(TRAIN_TIME + DISTILL_TIME)
    assert set(costs.loc[("dsA", "linA")].index) == {"random", f"copy_mlp_distill (design {DESIGN})",
                                                      "softmax reference"}
    assert set(costs["budget"]) == {STEPS}


def test_report_files_figures_and_sections(tree):
    _, report, _ = tree
    readme = (report / "README.md").read_text()
    for name in figure_names():  # accuracy by init, curves, accuracy by budget, fidelity by block, attention maps
        png, svg = report / "figures" / f"{name}.png", report / "figures" / f"{name}.svg"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 1000
        assert b"<svg" in svg.read_bytes()[:2000]
        assert f"](figures/{name}.png)" in readme
    for heading in ("## Scale", "## Verdicts", "## Grid covered", "## Summary", "## Figures", "## Claims",
                    "### How the verdicts are reached", "### C1", "### C2", "### C3", "### C4",
                    "## Positive control", "## Cost", "## Missing cells and failed runs"):
        assert heading in readme
    assert "figures/accuracy_by_init.png" in readme
    assert f"`dsB/tiny/linB/attn_only/none/steps{STEPS}/seed0` (missing): Error: job failed" in readme
    assert "**Verdict: mixed (2 holds, 2 fails).** Intervals over 2 seeds, each with its own teacher, and the test " \
           "images." in readme
    # The scale section and the verdicts table say what the intervals are over (a teacher per seed by default).
    scale = readme.split("## Scale")[1].split("\n## ")[0]
    assert ("- 2 seeds per cell (the unit of replication). The verdicts' intervals are over 2 seeds, each with its "
            "own teacher, and the test images.") in scale
    assert "| minimum detectable effect | seeds to decide |" in scale
    verdicts_section = readme.split("## Verdicts")[1].split("\n## ")[0]
    assert ("Every verdict's intervals are over 2 seeds, each with its own teacher, and the test images."
            in verdicts_section)
    # One budget: no per-budget table, and no budget column where every row has the same.
    assert f"| `dsA/tiny/linA/steps{STEPS}` | **claim** | | | | **holds** | | | |" in readme
    assert "| claim | 100 steps |" not in readme and f"All rows: budget {STEPS} steps." in readme
    assert readme.index("## Scale") < readme.index("## Verdicts") < readme.index("### C1")
    assert "| C1 | supported" not in readme and "| C1 | mixed (2 holds, 2 fails) |" in readme
    assert f"- Budgets: {STEPS} steps. A budget is" in readme and "- Distillation designs: `proj_mse`. A design is" in readme
    assert json.loads((report / "claims.json").read_text())[0]["claim"] == "C1"
    assert (report / "notes.txt").read_text() == "mine"
    assert not list(report.rglob("*.tmp")) and not list(report.rglob(".*"))


def test_empty_results_tree_reports_every_cell_missing(tmp_path):
    config = {**CONFIG, "targets": ["dsA"], "variants": ["linA"], "seeds": [0]}
    write_report(config, tmp_path / "results", tmp_path / "report")
    readme = (tmp_path / "report" / "README.md").read_text()
    assert readme.count(": not run (no log)") == len(all_cells(config))
    assert "**Verdict: not evaluable.**" in readme and "no finished run of attn_only, random, copy_all" in readme
    assert (tmp_path / "report" / "figures" / "training_curves.png").stat().st_size > 0


def test_malformed_jsonl_line_makes_the_cell_invalid_naming_file_and_line(tmp_path):
    config = {**CONFIG, "targets": ["dsA"], "variants": ["linA"], "inits": ["random"], "seeds": [0]}
    cell = Cell("dsA", "tiny", "linA", "random", 0, NO_DESIGN, STEPS)
    write_cell(tmp_path, cell, 0.5)
    path = cell.run_dir(tmp_path) / "train.jsonl"
    lines = path.read_text().splitlines()
    lines[2] = '{"kind": "eval", "step": '
    path.write_text("\n".join(lines) + "\n")
    runs, curves = collect(config, tmp_path)
    row = runs.set_index("init").loc["random"]
    assert row["status"] == "invalid" and row["reason"].startswith(f"{path}:3: not valid JSON")
    assert len(curves[curves["init"] == "random"]) == 1  # the eval line before the bad one is kept


def test_mismatched_or_incomplete_metrics_name_the_file_and_key(tmp_path):
    config = {**CONFIG, "targets": ["dsA"], "variants": ["linA"], "inits": ["random"], "seeds": [0]}
    cell = Cell("dsA", "tiny", "linA", "random", 0, NO_DESIGN, STEPS)
    write_cell(tmp_path, cell, 0.5)
    metrics_path = cell.run_dir(tmp_path) / "metrics.json"
    metrics = json.loads(metrics_path.read_text())

    def reason():
        row = collect(config, tmp_path)[0].set_index("init").loc["random"]
        assert row["status"] == "invalid"
        return row["reason"]

    metrics_path.write_text(json.dumps({**metrics, "variant": "linB"}))
    assert reason().startswith(f"{metrics_path}: 'variant' is 'linB'")
    metrics_path.write_text(json.dumps({**metrics, "budget": 2 * STEPS}))  # another budget's run copied here
    assert reason() == f"{metrics_path}: 'budget' is {2 * STEPS} but the file lies in cell {cell.key}"
    metrics_path.write_text(json.dumps({**metrics, "train_losses": [{"loss": "logit_kd", "weight": "high"}]}))
    assert reason() == f"{metrics_path}: 'train_losses[0].weight' is 'high', expected a number"
    del metrics["steps"]
    metrics_path.write_text(json.dumps(metrics))
    assert reason() == f"{metrics_path}: missing key 'steps'"
    with pytest.raises(ResultsError, match="config: missing key 'seeds'"):
        collect({k: v for k, v in config.items() if k != "seeds"}, tmp_path)
    with pytest.raises(ResultsError, match=r"config: missing key 'budgets' \(or 'student.train.steps'"):
        collect({k: v for k, v in config.items() if k != "student"}, tmp_path)
    with pytest.raises(ResultsError, match="'copy_mlp_distill' distills, but no distillation design is given"):
        collect({**{k: v for k, v in config.items() if k not in ("distills", "distill_designs")},
                 "inits": ["random", "copy_mlp_distill"]}, tmp_path)
