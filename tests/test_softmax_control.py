"""`softmax` in `variants`: the control students (softmax ViTs initialized by the same strategies as
the linear ones, the Attention Transfer setting), kept apart from the softmax reference, which is
identified by its init ('reference'), never by its variant."""

from __future__ import annotations

import copy

import pandas as pd
import pytest
import yaml
from safetensors.torch import load_file

from linvit import grid
from linvit.config import NO_DESIGN, REFERENCE_INIT, validate
from linvit.models import model_variant
from linvit.steps import load_model, run_distill, run_evaluate, run_shards, run_student, run_teacher
from linvit.transfer import parameter_group

from conftest import REPO
from test_workflow import expected_jobs, job_counts, planned_products, snakemake

SMOKE = yaml.safe_load((REPO / "workflow/config/smoke.yaml").read_text())


def with_softmax(config: dict) -> dict:
    config = copy.deepcopy(config)
    config["variants"] = [*config["variants"], "softmax"]
    return config


def test_a_config_with_softmax_among_its_variants_validates():
    config = copy.deepcopy(SMOKE)
    config["variants"] = ["elu", "softmax"]
    assert validate(config) is config


def test_softmax_students_are_cells_of_their_own_beside_the_reference():
    config = with_softmax(SMOKE)
    students, references = grid.student_cells(config), grid.reference_cells(config)
    control = [c for c in students if c.variant == "softmax"]
    assert {c.init for c in control} == set(config["inits"]) and len(control) == len(students) // 2
    assert all(c.is_control and not c.is_reference and c.rule == "student" for c in control)
    assert all(c.is_reference and not c.is_control and c.rule == "reference" for c in references)
    assert not {c.key for c in students} & {c.key for c in references}
    assert not {c.run_dir() for c in students} & {c.run_dir() for c in references}
    # The reference is identified by its init, never by the variant alone.
    assert grid.Cell("d", "micro", "softmax", "copy_all", 0, NO_DESIGN, 3).is_reference is False
    assert grid.Cell("d", "micro", "softmax", REFERENCE_INIT, 0, NO_DESIGN, 3).is_reference is True
    first = str(grid.reference_cells(config)[0].run_dir())
    assert first.startswith("results/students/synthetic/micro/softmax/reference/none/")
    distilled = [c for c in grid.distill_cells(config) if c.variant == "softmax"]
    assert {c.init for c in distilled} == {"copy_mlp_distill", "mohawk"}


def test_control_inits_narrows_the_control_students_only():
    config = with_softmax(SMOKE)
    config["control_inits"] = ["random", "copy_all"]
    assert validate(config) is config
    students = grid.student_cells(config)
    assert {c.init for c in students if c.variant == "softmax"} == {"random", "copy_all"}
    assert {c.init for c in students if c.variant != "softmax"} == set(config["inits"])
    assert not [c for c in grid.distill_cells(config) if c.variant == "softmax"]


def test_control_inits_outside_inits_is_one_line_naming_the_key():
    config = with_softmax(SMOKE)
    config["control_inits"] = ["random", "warm"]
    with pytest.raises(Exception, match=r"^config key control_inits: 'warm' not in inits \("):
        validate(config)


CONFIG = {
    "seeds": [0], "sizes": ["micro"], "variants": ["elu", "softmax"], "targets": ["synthetic"],
    "inits": ["copy_all", "copy_mlp_distill", "attention_transfer"],
    "datasets": {"synthetic": {"source": "synthetic", "num_classes": 4, "train_samples": 64, "test_samples": 16}},
    "shards": {"samples_per_shard": 64},
    "teacher": {"dataset": "synthetic", "train": {"steps": 4, "batch_size": 16, "lr": 2e-3}},
    "student": {"train": {"steps": 2, "batch_size": 16, "lr": 1e-3}},
    "distill": {"train": {"steps": 3, "batch_size": 16, "lr": 1e-2}},
    "distill_designs": {"outputs": {"losses": ["proj_mse"]}, "maps": {"losses": ["map_ce"]},
                        "mohawk": {"phases": [{"losses": ["map_fro"]}, {"losses": ["block_l2"]}]}},
    "distills": ["outputs", "maps", "mohawk"],
    "init_strategies": {
        "copy_all": {"copy": ["embed", "attn", "mlp", "norm", "head"], "distill": False},
        "copy_mlp_distill": {"copy": ["embed", "mlp", "norm", "head"], "distill": True},
        "attention_transfer": {"copy": [], "distill": False,
                               "train_losses": [{"loss": "map_ce", "weight": 3.0, "forced": False}]},
        "deit_kd": {"copy": [], "distill": False, "task_weight": 0.5,
                    "train_losses": [{"loss": "logit_kd", "weight": 0.5}]},
    },
    "evaluation": {"fidelity_samples": 4, "throughput_batch": 4},
}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("control")
    run_shards(CONFIG, "synthetic", root / "shards", workers=1)
    run_teacher(CONFIG, "micro", 0, root / "shards", root / "teacher")
    return root


def test_a_softmax_copy_all_student_and_the_reference_land_in_different_folders(world, tmp_path, quiet_machine):
    control = grid.Cell("synthetic", "micro", "softmax", "copy_all", 0, NO_DESIGN, 2)
    reference = grid.reference_cells({**CONFIG, "budgets": [2]})[0]
    runs = {}
    for cell in (control, reference):
        out = cell.run_dir(tmp_path)
        runs[cell.init] = run_student(CONFIG, cell.dataset, cell.size, cell.variant, cell.init, cell.seed,
                                      world / "teacher", world / "shards", out, budget=cell.budget)
        assert (out / "metrics.json").exists() and (out / "predictions.npz").exists()
    assert control.run_dir(tmp_path) != reference.run_dir(tmp_path)
    assert control.run_dir(tmp_path).relative_to(tmp_path).parts[3:6] == ("softmax", "copy_all", "none")
    assert reference.run_dir(tmp_path).relative_to(tmp_path).parts[3:6] == ("softmax", "reference", "none")
    m, ref = runs["copy_all"], runs[REFERENCE_INIT]
    assert (m["variant"], m["init"], ref["variant"], ref["init"]) == ("softmax", "copy_all", "softmax", "reference")
    model, arch = load_model(control.run_dir(tmp_path))
    assert arch["variant"] == "softmax" and model_variant(model) == "softmax"
    # A softmax ViT: its attn group is the teacher's qkv/proj, attn_extra is empty.
    assert m["copied"]["attn"] > 0 and m["copied"]["attn_extra"] == 0
    # copy_all copies what the reference copies: the same run, so the control's ceiling is the reference.
    assert m["test_acc"] == pytest.approx(ref["test_acc"])
    e = run_evaluate(CONFIG, control.run_dir(tmp_path), world / "teacher", world / "shards",
                     control.run_dir(tmp_path) / "eval.json")
    assert e["variant"] == "softmax" and e["init"] == "copy_all" and e["params_attn_extra"] == 0


@pytest.mark.parametrize("design", ["outputs", "maps", "mohawk"])
def test_a_softmax_student_distills_from_the_softmax_teacher(world, tmp_path, design, quiet_machine):
    d = run_distill(CONFIG, "synthetic", "micro", "softmax", "copy_mlp_distill", design, 0, world / "teacher",
                    world / "shards", tmp_path / "d")
    assert d["variant"] == "softmax" and d["distill_loss"] >= 0 and d["copied"]["attn"] == 0
    model, _ = load_model(tmp_path / "d")
    assert model_variant(model) == "softmax"
    teacher = load_file(str(world / "teacher" / "model.safetensors"))
    state = model.state_dict()
    # Frozen: the copied MLPs stay the teacher's; the attention (qkv, proj) trained.
    assert all((state[n] == teacher[n]).all() for n in state if parameter_group(n) == "mlp")
    attn = [n for n in state if parameter_group(n) == "attn"]
    assert attn and all(parameter_group(n) != "attn_extra" for n in state)
    m = run_student(CONFIG, "synthetic", "micro", "softmax", "copy_mlp_distill", 0, world / "teacher",
                    world / "shards", tmp_path / "s", distilled_dir=tmp_path / "d", design=design, budget=2)
    assert m["distill"]["design"] == design and 0 <= m["test_acc"] <= 1


@pytest.mark.parametrize("init", ["attention_transfer", "deit_kd"])
def test_a_softmax_student_trains_with_losses_against_the_teacher(world, tmp_path, init, quiet_machine):
    m = run_student(CONFIG, "synthetic", "micro", "softmax", init, 0, world / "teacher", world / "shards",
                    tmp_path / "s", budget=2)
    assert m["variant"] == "softmax" and m["train_losses"] and m["copied"]["attn"] == 0


def test_the_reference_init_is_the_softmax_reference_only(world, tmp_path):
    with pytest.raises(ValueError, match="init 'reference' is the softmax reference: its variant is 'softmax'"):
        run_student(CONFIG, "synthetic", "micro", "elu", REFERENCE_INIT, 0, world / "teacher", world / "shards",
                    tmp_path / "s", budget=2)
    assert not (tmp_path / "s").exists()


def test_the_smoke_grid_with_softmax_plans_student_jobs_for_it(tmp_path):
    config = with_softmax(SMOKE)
    (tmp_path / "control.yaml").write_text(yaml.safe_dump(config))
    out = snakemake(tmp_path, "-n", "--cores", "2", "--configfile", str(tmp_path / "control.yaml"))
    counts = {k: v for k, v in job_counts(out.stdout).items() if k != "total"}
    assert counts == expected_jobs(config)
    assert counts["student"] == 2 * job_counts(snakemake(tmp_path, "-n", "--cores", "2", "--configfile",
                                                         str(REPO / "workflow/config/smoke.yaml")).stdout)["student"]
    products = planned_products(out.stdout)
    control = grid.Cell("synthetic", "micro", "softmax", "copy_all", 0, NO_DESIGN, 3)
    reference = grid.Cell("synthetic", "micro", "softmax", REFERENCE_INIT, 0, NO_DESIGN, 3)
    distilled = grid.distill_dir("synthetic", "micro", "softmax", "copy_mlp_distill", "maps", 0)
    for path in (f"{control.run_dir()}/metrics.json", f"{reference.run_dir()}/metrics.json",
                 f"{control.run_dir()}/eval.json", f"{distilled}/metrics.json"):
        assert path in products, path
    assert not (tmp_path / "results").exists()


def _runs() -> pd.DataFrame:
    rows = []
    for seed in (0, 1):
        rows.append({"dataset": "dsA", "size": "micro", "variant": "softmax", "init": REFERENCE_INIT,
                     "design": NO_DESIGN, "budget": 10, "seed": seed, "status": "ok", "test_acc": 0.9})
        for variant, acc in (("elu", 0.5), ("softmax", 0.8)):
            for init in ("random", "copy_all"):
                rows.append({"dataset": "dsA", "size": "micro", "variant": variant, "init": init,
                             "design": NO_DESIGN, "budget": 10, "seed": seed, "status": "ok",
                             "test_acc": acc + (0.05 if init == "copy_all" else 0)})
    return pd.DataFrame(rows)


def test_the_figures_show_the_control_as_a_variant_and_the_reference_apart(tmp_path):
    from linvit.report import figures

    runs = _runs()
    control = figures._select(runs, "dsA", "micro", "softmax")
    assert set(control["init"]) == {"random", "copy_all"} and len(control) == 4
    assert set(figures._reference(runs, "dsA", "micro")["init"]) == {REFERENCE_INIT}
    assert figures._lines(runs, {"inits": ["random", "copy_all"]}) == [("random", NO_DESIGN), ("copy_all", NO_DESIGN)]
    assert figures.variant_label("softmax") == "softmax (control)" and figures.variant_label("elu") == "elu"
    config = {"targets": ["dsA"], "sizes": ["micro"], "variants": ["elu", "softmax"], "inits": ["random", "copy_all"]}
    paths = figures.accuracy_by_init(runs, config, tmp_path) + figures.accuracy_by_budget(runs, config, tmp_path)
    assert all(p.exists() for p in paths)
    summary = runs.groupby(["dataset", "size", "variant", "init", "design", "budget"], as_index=False)["test_acc"] \
        .mean().assign(gap_closed=lambda f: (f["init"] == "copy_all").astype(float))
    assert all(p.exists() for p in figures.gap_closed_heatmap(summary, config, tmp_path))


def test_the_cost_table_files_a_control_student_under_rule_student(tmp_path):
    from linvit.report.aggregate import benchmark_jobs

    jobs = benchmark_jobs(with_softmax(SMOKE), tmp_path)
    students = jobs[jobs["key"].str.contains("/softmax/") & jobs["folder"].str.contains("/students/")]
    assert set(students["rule"]) == {"student", "reference"}
    assert set(students.loc[students["rule"] == "reference", "key"].str.split("/").str[3]) == {REFERENCE_INIT}
    assert (students.loc[students["rule"] == "student", "init"] != "").all()
