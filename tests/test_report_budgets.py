"""The report on a grid with two budgets, two distillation designs and two literature baselines.

One dataset, size and variant; budgets 100 and 400 steps (stage 2); the recipe copy_mlp_distill is
crossed with the designs proj_mse (its primary design, the first of `distills`) and map_ce; deit_kd
copies nothing but adds logit KD (so it is not the random role, though it comes first in inits);
lolcats names one fixed design. Accuracies are chosen so that at 100 steps C1 and C3 fail (C3 would
hold with map_ce, which the claims do not use) and at 400 steps every claim holds; C2 holds at both.
Every role moves alike with the seed, so paired differences are exact (min_seeds 2).
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
from test_report import CONFIG, DISTILL_TIME, SPREAD, TRAIN_TIME, write_cell, write_log

# As test_report's: no paired contrast the same on every seed (zero variance is no test).
JITTER = {init: 1e-7 * (i + 1) for i, init in enumerate(
    ["random", "copy_all", "copy_attn", "copy_mlp", "attn_only", "mlp_only", "copy_mlp_distill", "deit_kd", "lolcats"])}

from linvit.claims.judge import evaluate_claims
from linvit.claims.roles import resolve_roles
from linvit.config import NO_DESIGN
from linvit.grid import Cell, all_cells, benchmark_path, distill_cells, distill_key
from linvit.report import collect, collect_benchmarks, load_predictions, summarize, write_report
from linvit.report.aggregate import attention_records
from linvit.report.tables import designs_table
from linvit.stats.paired import FAILS, HOLDS
from test_report_cost import tsv

DEIT = {"copy": [], "distill": False, "task_weight": 0.5, "train_losses": [{"loss": "logit_kd", "weight": 0.5}]}
GRID = {
    **CONFIG, "targets": ["dsA"], "variants": ["linA"], "seeds": [0, 1], "budgets": [100, 400],
    "inits": ["deit_kd", "random", "copy_all", "copy_attn", "copy_mlp", "attn_only", "mlp_only", "copy_mlp_distill",
              "lolcats"],
    "distills": ["proj_mse", "map_ce"],
    "distill_designs": {"proj_mse": {"losses": ["proj_mse"]},
                        "map_ce": {"losses": ["map_ce"], "description": "Hedgehog: map cross-entropy"},
                        "lolcats": {"losses": ["out_mse", {"loss": "map_ce", "weight": 0.1}]}},
    "init_strategies": {**CONFIG["init_strategies"], "deit_kd": DEIT,
                        "lolcats": {"copy": ["embed", "attn", "mlp", "norm", "head"], "distill": "lolcats"}},
}
REFERENCE = {100: 0.60, 400: 0.80}
ACC = {
    100: {("random", NO_DESIGN): 0.40, ("copy_all", NO_DESIGN): 0.60, ("copy_mlp", NO_DESIGN): 0.52,
          ("copy_attn", NO_DESIGN): 0.45, ("attn_only", NO_DESIGN): 0.50, ("mlp_only", NO_DESIGN): 0.52, ("copy_mlp_distill", "proj_mse"): 0.58,
          ("copy_mlp_distill", "map_ce"): 0.62, ("deit_kd", NO_DESIGN): 0.30, ("lolcats", "lolcats"): 0.55},
    400: {("random", NO_DESIGN): 0.50, ("copy_all", NO_DESIGN): 0.70, ("copy_mlp", NO_DESIGN): 0.68,
          ("copy_attn", NO_DESIGN): 0.55,
          ("attn_only", NO_DESIGN): 0.48, ("mlp_only", NO_DESIGN): 0.62, ("copy_mlp_distill", "proj_mse"): 0.81,
          ("copy_mlp_distill", "map_ce"): 0.70, ("deit_kd", NO_DESIGN): 0.55, ("lolcats", "lolcats"): 0.75},
}


def accuracy(cell: Cell) -> float:
    base = REFERENCE[cell.budget] if cell.is_reference else ACC[cell.budget][(cell.init, cell.design)]
    spread = SPREAD + JITTER.get(cell.init, 0.0)
    return base + (spread if cell.seed else -spread)


def write(results: Path, cell: Cell, **kw) -> None:
    spec = GRID["init_strategies"].get(cell.init, {})
    write_cell(results, cell, accuracy(cell), train_losses=spec.get("train_losses", ()),
               task_weight=spec.get("task_weight", 1.0), **kw)


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    root = tmp_path_factory.mktemp("budgets")
    for cell in all_cells(GRID):
        write(root / "results", cell)
    written = write_report(GRID, root / "results", root / "report")
    return root / "results", root / "report", written


@pytest.fixture(scope="module")
def verdicts(tree):
    runs, _ = collect(GRID, tree[0])
    return {v.claim: v for v in evaluate_claims(runs, GRID, load_predictions(runs))}


def test_cells_and_paths_carry_design_and_budget(tree):
    results, _, _ = tree
    runs, curves = collect(GRID, results)
    # 2 budgets x 2 seeds x (1 reference + 8 single-design strategies + the recipe under 2 designs)
    assert len(runs) == 2 * 2 * (1 + 8 + 2) and (runs["status"] == "ok").all()
    assert set(runs["budget"]) == {100, 400} and set(curves["budget"]) == {100, 400}
    pairs = set(zip(runs["init"], runs["design"]))
    assert {("copy_mlp_distill", "proj_mse"), ("copy_mlp_distill", "map_ce"), ("lolcats", "lolcats"),
            ("deit_kd", NO_DESIGN), ("reference", NO_DESIGN)} <= pairs
    assert (results / "students/dsA/tiny/linA/copy_mlp_distill/map_ce/steps400/seed1/metrics.json").exists()
    deit = runs[runs["init"] == "deit_kd"].iloc[0]
    assert (deit["train_losses"], deit["task_weight"]) == ("logit_kd:0.5", 0.5)
    # The curves of a 400-step run end at step 400.
    assert curves.loc[curves["budget"] == 400, "step"].max() == 400


def test_summary_and_gap_closed_per_budget(tree):
    runs, _ = collect(GRID, tree[0])
    summary = summarize(runs, GRID).set_index(["init", "design", "budget"])
    assert summary.loc[("copy_mlp_distill", "map_ce", 100), "gap_closed"] == pytest.approx((0.62 - 0.40) / 0.20)
    assert summary.loc[("copy_mlp_distill", "proj_mse", 400), "gap_closed"] == pytest.approx((0.81 - 0.50) / 0.30)
    # Gap closed is against random, never against deit_kd (which copies nothing too, but trains with KD).
    assert summary.loc[("deit_kd", NO_DESIGN, 400), "gap_closed"] == pytest.approx((0.55 - 0.50) / 0.30)
    assert summary.loc[("random", NO_DESIGN, 100), "gap_closed"] == pytest.approx(0.0)
    assert summary.loc[("reference", NO_DESIGN, 400), "test_acc_mean"] == pytest.approx(0.80)
    assert summary.loc[("copy_mlp_distill", "map_ce", 100), "n_seeds"] == 2
    # Rows in the config's order: per budget, the reference first.
    assert list(summary.index.get_level_values("budget")[:11]) == [100] * 11
    assert summary.index[0] == ("reference", NO_DESIGN, 100)


def test_roles_skip_strategies_with_training_losses():
    roles = resolve_roles(GRID)
    assert roles["random"].strategy == "random" and roles["random"].trains_more == ("deit_kd",)
    assert (roles["copy_mlp_distill"].strategy, roles["copy_mlp_distill"].design) == ("copy_mlp_distill", "proj_mse")
    assert roles["copy_all"].strategy == "copy_all"  # lolcats copies all too, but distills


def test_claims_per_budget(verdicts):
    c1, c2, c3, c4 = (verdicts[c] for c in ("C1", "C2", "C3", "C4"))
    assert [(c.budget, c.outcome) for c in c1.cells] == [(100, FAILS), (400, HOLDS)]
    assert c1.cells[0].test("attn_alone").estimate == pytest.approx(0.5)
    assert c1.verdict == "mixed (1 holds, 1 fails); at 100 steps not supported, at 400 steps supported"
    assert c2.verdict == "supported at every budget (100, 400 steps)"
    assert [(b["budget"], b["counts"][HOLDS]) for b in c2.by_budget] == [(100, 1), (400, 1)]
    # C3 uses the recipe's primary design (proj_mse, 0.58 < 0.60 at 100 steps), not the better map_ce.
    assert [c.outcome for c in c3.cells] == [FAILS, HOLDS]
    assert c3.cells[0].test("matches").estimate == pytest.approx(0.58 - 0.60)
    assert c3.designs == {"copy_mlp_distill": "proj_mse"}
    assert c4.verdict == "not tested: the grid varies no dataset, size or linear variant"
    assert all(b["verdict"] == c4.verdict for b in c4.by_budget)


def test_designs_table_at_equal_distillation_compute(tree):
    runs, _ = collect(GRID, tree[0])
    table = designs_table(summarize(runs, GRID), GRID)
    at100 = table[table["budget"] == 100].set_index(["init", "design"])
    assert list(at100.index) == [("copy_mlp_distill", "proj_mse"), ("copy_mlp_distill", "map_ce"),
                                 ("deit_kd", NO_DESIGN), ("lolcats", "lolcats"), ("reference", NO_DESIGN)]
    assert list(at100["kind"]) == ["paper's recipe", "paper's recipe", "baseline", "baseline", "softmax reference"]
    assert list(at100["claims_design"]) == [True, False, False, False, False]
    assert at100.loc[("deit_kd", NO_DESIGN), "training"] == "task x0.5 + logit_kd x0.5"
    assert at100.loc[("copy_mlp_distill", "map_ce"), "test_acc_mean"] == pytest.approx(0.62)
    assert at100.loc[("copy_mlp_distill", "map_ce"), "test_acc_std"] == pytest.approx(
        (SPREAD + JITTER["copy_mlp_distill"]) * math.sqrt(2))
    assert at100.loc[("lolcats", "lolcats"), "distill_steps_mean"] == 20
    assert at100.loc[("lolcats", "lolcats"), "total_time_s_mean"] == pytest.approx(TRAIN_TIME + DISTILL_TIME)
    assert at100.loc[("deit_kd", NO_DESIGN), "total_time_s_mean"] == pytest.approx(TRAIN_TIME)


def test_readme_budgets_designs_and_baselines(tree):
    _, report, written = tree
    readme = (report / "README.md").read_text()
    assert "- Budgets: 100 steps, 400 steps. A budget is the number of training steps" in readme
    assert "- Distillation designs: `proj_mse`, `map_ce`, `lolcats`. A design is the recipe" in readme
    assert "  - `map_ce`: Hedgehog: map cross-entropy" in readme
    assert "  - `lolcats`: out_mse + map_ce x0.1" in readme
    assert "  - `deit_kd`: copies nothing; no distillation; trains on task x0.5 + logit_kd x0.5" in readme
    assert "  - `lolcats`: copies embed, attn, mlp, norm, head; distilled by the fixed design `lolcats`" in readme
    assert "| claim | 100 steps | 400 steps |" in readme
    assert "| C1 | not supported | supported |" in readme
    assert ("| C4 | not tested: the grid varies no dataset, size or linear variant | not tested: the grid varies "
            "no dataset, size or linear variant |") in readme
    assert "**Verdict: mixed (1 holds, 1 fails); at 100 steps not supported, at 400 steps supported.**" in readme
    assert "`deit_kd` copies the same but trains with added losses: a baseline, not this role" in readme
    designs = re.sub(r" +", " ", readme.split("## Distillation designs and baselines")[1].split("\n## ")[0])
    assert "All rows: cell dsA/tiny/linA." in designs
    assert ("| 100 | `copy_mlp_distill` | `proj_mse` * | paper's recipe | task | 2/2 | 58.00% ± 1.41 pp | 0.900 | 20 "
            "| 2.5 | 12.5 |") in designs
    assert ("| 100 | `deit_kd` | — | baseline | task x0.5 + logit_kd x0.5 | 2/2 | 30.00% ± 1.41 pp | -0.500 | 0 "
            "| 0.0 | 10.0 |") in designs
    assert "Not at equal distillation compute" not in designs
    summary = re.sub(r" +", " ", readme.split("## Summary")[1].split("\n## ")[0])
    assert "| dsA | tiny | linA | 400 | copy_mlp_distill | map_ce | 2/2 | 70.00% ± 1.41 pp | 0.667 |" in summary
    assert "| `dsA/tiny/linA/steps400` | **claim** | | | | **holds** | | | |" in readme
    assert written


def test_unequal_distillation_steps_are_called_out(tmp_path):
    for cell in all_cells(GRID):
        write(tmp_path, cell, distill_steps=10 if cell.design == "lolcats" else 20)
    write_report(GRID, tmp_path, tmp_path / "report")
    readme = (tmp_path / "report" / "README.md").read_text()
    assert "Not at equal distillation compute (mean distillation steps differ):" in readme
    assert ("- dsA/tiny/linA at 100 steps: copy_mlp_distill/proj_mse 20, copy_mlp_distill/map_ce 20, "
            "lolcats/lolcats 10") in readme


def test_distill_jobs_are_counted_per_init_and_design(tmp_path):
    for cell in all_cells(GRID):
        write(tmp_path, cell)
    # One distillation per (init, design, seed), shared by both budgets.
    assert len(distill_cells(GRID)) == 3 * 2
    for i, cell in enumerate(distill_cells(GRID)):
        tsv(benchmark_path("distill", cell.distill_key, tmp_path), (10.0 + i, 100.0, 5.0))
    costs = collect_benchmarks(GRID, tmp_path).set_index("rule")
    assert [r for r in costs.index if r.startswith("distill")] == [
        "distill: copy_mlp_distill/proj_mse", "distill: copy_mlp_distill/map_ce", "distill: lolcats/lolcats"]
    assert costs.loc["distill: copy_mlp_distill/proj_mse", ["jobs", "wall_s_total"]].tolist() == [2, 10.0 + 11.0]
    assert costs.loc["distill: lolcats/lolcats", ["jobs", "wall_s_total"]].tolist() == [2, 14.0 + 15.0]
    # Students per init strategy: the recipe's 2 designs x 2 budgets x 2 seeds.
    assert costs.loc["student: copy_mlp_distill", "jobs"] == 8 and costs.loc["student: deit_kd", "jobs"] == 4
    assert costs.loc["reference", "jobs"] == 4


def test_a_failed_distillation_or_kd_reference_explains_the_student(tmp_path):
    for cell in all_cells(GRID):
        write(tmp_path, cell)
    # The map_ce distillation of seed 0 failed: both budgets' students never ran.
    for budget in (100, 400):
        cell = Cell("dsA", "tiny", "linA", "copy_mlp_distill", 0, "map_ce", budget)
        for name in ("metrics.json", "eval.json", "train.jsonl"):
            (cell.run_dir(tmp_path) / name).unlink()
    log = tmp_path / "logs/distill" / f"{distill_key('dsA', 'tiny', 'linA', 'copy_mlp_distill', 'map_ce', 0)}.log"
    log.parent.mkdir(parents=True)
    log.write_text("RuntimeError: out of memory\n")
    # deit_kd on dsA (not the teacher's labels) takes its logits from the reference of its budget,
    # which failed at 400 steps for seed 1.
    reference = Cell("dsA", "tiny", "softmax", "reference", 1, NO_DESIGN, 400)
    student = Cell("dsA", "tiny", "linA", "deit_kd", 1, NO_DESIGN, 400)
    for cell in (reference, student):
        for name in ("metrics.json", "eval.json", "train.jsonl"):
            (cell.run_dir(tmp_path) / name).unlink()
    write_log(tmp_path, reference, ["linvit: error: training diverged: loss became nan at step 12"])
    runs = collect(GRID, tmp_path)[0].set_index(["init", "design", "budget", "seed"])
    for budget in (100, 400):
        assert runs.loc[("copy_mlp_distill", "map_ce", budget, 0), "reason"] == (
            f"distillation failed ({log}): RuntimeError: out of memory")
    assert runs.loc[("copy_mlp_distill", "proj_mse", 100, 0), "status"] == "ok"
    row = runs.loc[("deit_kd", NO_DESIGN, 400, 1)]
    assert row["status"] == "diverged"
    assert row["reason"] == (f"softmax reference diverged ({reference.log_path(tmp_path)}): "
                             "linvit: error: training diverged: loss became nan at step 12")
    assert runs.loc[("random", NO_DESIGN, 400, 1), "reason"] == ""  # random does not wait for the reference


def test_attention_records_from_eval_json(tmp_path):
    config = {**GRID, "budgets": [100], "seeds": [0], "inits": ["random", "copy_mlp_distill"], "distills": ["map_ce"]}
    for cell in all_cells(config):
        write(tmp_path, cell)
    cell = Cell("dsA", "tiny", "linA", "copy_mlp_distill", 0, "map_ce", 100)
    path = cell.run_dir(tmp_path) / "eval.json"
    row = {"row": "class token", "block": 2, "prefix": 1, "grid": [2, 2], "tokens": 5, "heads": [[0.2] * 5] * 3}
    path.write_text(json.dumps({**json.loads(path.read_text()), "cls_attention": {"teacher": row, "student": row}}))
    records = attention_records(collect(config, tmp_path)[0], tmp_path)
    assert [(r["init"], r["design"], r["budget"], r["model"]) for r in records] == [
        ("copy_mlp_distill", "map_ce", 100, "teacher"), ("copy_mlp_distill", "map_ce", 100, "student")]
    assert records[0]["grid"] == [2, 2] and len(records[0]["heads"]) == 3 and records[0]["block"] == 2


def test_the_overall_verdict_names_the_budgets():
    from linvit.claims.judge import _overall, _per_budget
    from linvit.claims.verdicts import NOT_EVALUABLE, CellVerdict

    def verdict(outcomes: list[str]):
        cells = [CellVerdict("C2", "dsA", "tiny", "linA", b, o) for b, o in zip([100, 100, 400, 400], outcomes)]
        v = _overall("C2", "", cells, [])
        _per_budget(v, [], GRID)
        return v.verdict

    assert verdict([FAILS] * 4) == "not supported at any budget (100, 400 steps)"
    assert verdict([HOLDS] * 4) == "supported at every budget (100, 400 steps)"
    assert verdict([HOLDS, FAILS, HOLDS, HOLDS]) == (
        "mixed (3 holds, 1 fails); at 100 steps mixed (1 holds, 1 fails), at 400 steps supported")
    assert verdict([NOT_EVALUABLE, NOT_EVALUABLE, HOLDS, HOLDS]) == (
        "supported in the cells judged (2 of 4); at 100 steps not evaluable, at 400 steps supported")
