"""The Snakemake workflow: planning the default grid (also from a fresh clone), declaring what it
reads and writes, lint, a torch-free parse, refusing bad configs, and the smoke grid end to end."""

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time

from pathlib import Path

import pandas as pd
import pytest
import yaml

from linvit import figure_registry, grid
from linvit.bench import bench_grid
from linvit.config import grid_cells, kd_reference
from linvit.attention import available_variants

from conftest import BIN, REPO, patient, run

SNAKEFILE = str(REPO / "Snakefile")
DEFAULT = yaml.safe_load((REPO / "workflow/config/default.yaml").read_text())
SMOKE = yaml.safe_load((REPO / "workflow/config/smoke.yaml").read_text())

# The lints `snakemake --lint` may report, each with the comment in the workflow that explains it.
EXPLAINED_LINTS = {
    "Specify a conda environment or container for each rule.":
        ("workflow/rules/common.smk", '# lint: "Specify a conda environment or container for each rule"'),
}


def snakemake(tmp, *args, check=True, snakefile=SNAKEFILE):
    return run(["snakemake", "-s", snakefile, "--directory", str(tmp), *args], cwd=tmp, check=check)


def expected_jobs(config: dict) -> dict[str, int]:
    """The jobs of a whole grid, counted from linvit.grid and the config, not from the workflow."""
    students, references = grid.student_cells(config), grid.reference_cells(config)
    distilling = {c.distill_key for c in students if c.distills}
    assert len(distilling) == len(grid.distill_cells(config))
    return {"shards": len(set(config["targets"]) | {config["teacher"]["dataset"]}),
            "teacher": len(grid.teacher_keys(config)), "distill": len(distilling), "reference": len(references),
            "student": len(students), "report": 1, "all": 1}


def planned_products(output: str) -> set[str]:
    """Every output, log and benchmark file of the jobs a dry run (-n) prints."""
    products = set()
    for line in output.splitlines():
        m = re.match(r"^\s*(output|log|benchmark): (.+)$", line)
        if m:
            products.update(p.strip() for p in m.group(2).split(","))
    return products


def job_blocks(output: str) -> list[str]:
    """The jobs a dry run prints, one text block each (each starts with a '[date]' line)."""
    return [b for b in re.split(r"^\[.*\d{4}\]$", output, flags=re.M) if re.search(r"^(?:local)?rule \w+:", b, re.M)]


def planned_jobs(output: str) -> list[tuple[str, dict[str, list[str]]]]:
    """(rule, {field: [value, ...]}) of every job a dry run prints (input, output, log, benchmark, ...)."""
    jobs = []
    for block in job_blocks(output):
        rule = re.search(r"^(?:local)?rule (\w+):", block, re.M).group(1)
        jobs.append((rule, {k: [p.strip() for p in v.split(",")] for k, v in re.findall(r"^\s*(\w+): (.+)$", block, re.M)}))
    return jobs


def assert_plan_is_grid_jobs(output: str, config: dict, with_benchmark: bool = False) -> None:
    """linvit.grid.jobs(config) is the plan a dry run printed, job by job: each job's rule, outputs, log,
    benchmark, the files it reads (its declared inputs) and the jobs that write them (`needs`); and
    `all` asks for the report's outputs and every file the report reads."""
    planned = planned_jobs(output)
    by_log = {fields["log"][0]: (rule, fields) for rule, fields in planned if rule != "all"}
    listed = grid.jobs(config, with_benchmark=with_benchmark)
    assert sorted(job.log for job in listed) == sorted(by_log)
    made_by = {path: job.name for job in listed for path in (*job.outputs, job.benchmark) if path}
    for job in listed:
        rule, fields = by_log[job.log]
        assert (rule, set(fields["output"]), fields.get("benchmark", [None])[0]) == \
            (job.rule, set(job.outputs), job.benchmark), job.name
        assert set(fields.get("input", [])) == set(job.reads), job.name
        assert {made_by[p] for p in fields.get("input", []) if p in made_by} == set(job.needs), job.name
    (everything,) = [fields for rule, fields in planned if rule == "all"]
    report = listed[-1]
    assert report.rule == "report" and set(everything["input"]) == {*report.outputs, *report.reads}


def config_error(tmp, config: dict):
    """Run the workflow on `config`; return its exit code and its output."""
    (tmp / "bad.yaml").write_text(yaml.safe_dump(config))
    out = snakemake(tmp, "-n", "--cores", "1", "--configfile", str(tmp / "bad.yaml"), check=False)
    return out.returncode, out.stdout + out.stderr


def job_counts(output: str) -> dict[str, int]:
    counts = {}
    for line in output.splitlines():
        m = re.match(r"^(\w+)\s+(\d+)$", line.strip())
        if m:
            counts[m.group(1)] = int(m.group(2))
    return counts


@pytest.fixture(scope="module")
def default_plan(tmp_path_factory):
    """A dry run of the embedded default grid (workflow/config/default.yaml) in an empty folder."""
    tmp = tmp_path_factory.mktemp("default")
    return tmp, snakemake(tmp, "-n", "--cores", "2")


def test_dry_run_plans_one_student_job_per_cell(default_plan):
    tmp_path, out = default_plan
    counts = job_counts(out.stdout)
    # 1 target x 1 size x (elu's 7 inits + the softmax control's 4, control_inits) x 1 budget x 5 seeds
    assert counts["student"] == 55
    # A teacher per seed (teacher.seed: per_seed, the default): the teacher is replicated like a student.
    assert counts["reference"] == 5 and counts["teacher"] == 5 and counts["shards"] == 2  # target + teacher's
    assert counts["distill"] == 5  # one per seed for elu's distilling strategy (the control runs none)
    # Each training job evaluates its own model (eval.json): no separate evaluation jobs.
    assert "evaluate" not in counts and counts["report"] == 1
    assert {k: v for k, v in counts.items() if k != "total"} == expected_jobs(DEFAULT)
    assert "No validator found" not in out.stdout + out.stderr  # snakemake.utils.validate's draft-07 warning
    assert not (tmp_path / "results").exists()


def test_one_teacher_for_every_seed_is_an_explicit_choice(tmp_path):
    """`teacher.seed: <int>` trains one teacher that every seed copies from (the verdicts are then
    conditional on it); the default, per_seed, one per seed (test above)."""
    config = yaml.safe_load((REPO / "workflow/config/default.yaml").read_text())
    config["teacher"]["seed"] = 3
    (tmp_path / "one.yaml").write_text(yaml.safe_dump(config))
    out = snakemake(tmp_path, "-n", "--cores", "2", "--configfile", str(tmp_path / "one.yaml"))
    assert job_counts(out.stdout)["teacher"] == 1
    teachers = {p.split("/")[3] for p in re.findall(r"results/teacher/micro/seed\d+", out.stdout)}
    assert teachers == {"seed3"}
    assert "--seed 3" in out.stdout or "seed=3" in out.stdout


def test_fresh_clone_plans_the_whole_grid_and_ships_no_rule_output(tmp_path):
    """What a newcomer gets from `git clone` + `bash setup.sh run`: every job of the default grid, and
    no committed file that a rule would write (which would make Snakemake skip or clobber it)."""
    clone = tmp_path / "clone"
    tracked = run(["git", "ls-files", "-z"], cwd=REPO).stdout.split("\0")
    for rel in filter(None, tracked):
        if (REPO / rel).is_file():  # deleted in the working tree: not in a commit made now
            (clone / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / rel, clone / rel)
    assert (clone / "report/reference/README.md").exists()  # the reference runs are still shipped
    assert (clone / "report/reference_decide/state.json").exists()
    assert (clone / "report/reference_c4/state.json").exists()
    out = snakemake(clone, "-n", "--cores", "2", snakefile=str(clone / "Snakefile"))
    text = out.stdout + out.stderr
    assert "Nothing to be done" not in text
    counts = job_counts(out.stdout)
    assert {k: v for k, v in counts.items() if k != "total"} == expected_jobs(DEFAULT)
    products = planned_products(out.stdout)
    assert set(grid.report_files(False)) <= products
    shipped = {rel for rel in tracked if rel}
    assert not shipped & products, f"committed files a rule writes: {sorted(shipped & products)}"
    folders = [p + "/" for p in products if "." not in p.rsplit("/", 1)[-1]]  # directory() outputs
    assert not [rel for rel in shipped for f in folders if rel.startswith(f)]


def test_every_file_a_job_reads_is_declared(tmp_path):
    """Each rule's declared inputs and outputs, as planned for the smoke grid."""
    out = snakemake(tmp_path, "-n", "--cores", "2", "--configfile", str(REPO / "workflow/config/smoke.yaml"))
    jobs = planned_jobs(out.stdout)
    by_rule = {}
    for rule, fields in jobs:
        by_rule.setdefault(rule, []).append(fields)
    teacher = grid.teacher_dir("micro", 0)  # the teacher of student seed 0 (teacher.seed: per_seed)
    for fields in by_rule["teacher"]:
        assert set(fields["output"]) == {f"{teacher}/{f}" for f in grid.MODEL_FILES}
        assert fields["benchmark"] == [grid.benchmark_path("teacher", grid.teacher_key("micro", 0))]
    for fields in by_rule["distill"]:
        assert {f"{teacher}/model.json", f"{teacher}/model.safetensors"} <= set(fields["input"])
        assert {p.rsplit("/", 1)[1] for p in fields["output"]} == set(grid.DISTILL_FILES)
        assert fields["benchmark"][0].startswith(f"{grid.RESULTS}/benchmarks/distill/")
    for rule in ("student", "reference"):
        for fields in by_rule[rule]:
            assert {p.rsplit("/", 1)[1] for p in fields["output"]} == set(grid.STUDENT_FILES)
            assert fields["benchmark"][0].startswith(f"{grid.RESULTS}/benchmarks/students/")
            assert f"{teacher}/model.safetensors" in fields["input"]
            # .../<init>/<design>/steps<budget>/seed<s>/<file>: a design other than none starts from
            # its distillation's whole student.
            design = fields["output"][0].split("/")[-4]
            distilled = [p for p in fields["input"] if p.startswith(f"{grid.RESULTS}/distill/")]
            assert (design != "none") == any(p.endswith(f"/{design}/seed0/model.safetensors") for p in distilled)
            # Logit distillation on a target the teacher does not share labels with reads the softmax
            # reference of the same budget (linvit.config.kd_reference).
            dataset, init, budget = fields["output"][0].split("/")[2], fields["output"][0].split("/")[5], \
                fields["output"][0].split("/")[-3]
            reference = f"{grid.RESULTS}/students/{dataset}/micro/softmax/reference/none/{budget}/seed0/model.safetensors"
            needs = rule == "student" and kd_reference(SMOKE, init, dataset, "micro")
            assert needs == (reference in fields["input"]), fields["output"][0]
    assert "evaluate" not in by_rule  # the training job writes eval.json (grid.STUDENT_FILES)
    assert any(kd_reference(SMOKE, i, "synthetic_b", "micro") for i in SMOKE["inits"])
    (report,) = by_rule["report"]
    assert set(report["output"]) == set(grid.report_files(False))
    cells = grid.all_cells(SMOKE)
    for cell in cells:
        for f in ("metrics.json", "train.jsonl", "eval.json"):
            assert str(cell.run_dir() / f) in report["input"]
        assert str(cell.benchmark_path("students")) in report["input"]
    assert grid.benchmark_path("teacher", grid.teacher_key("micro", 0)) in report["input"]
    assert grid.operator_benchmark_path() not in report["input"]
    # linvit.grid.jobs (the jobs `linvit status` follows, the report's inputs) is this plan.
    assert_plan_is_grid_jobs(out.stdout, SMOKE)
    # With the operator benchmark's CSV present, the report reads it and draws its figure.
    bench = tmp_path / grid.operator_benchmark_path()
    bench.parent.mkdir(parents=True)
    bench.write_text("variant,tokens,seconds\n")
    again = snakemake(tmp_path, "-n", "--cores", "2", "--configfile", str(REPO / "workflow/config/smoke.yaml"))
    report_block = next(b for b in job_blocks(again.stdout) if re.search(r"^(?:local)?rule report:", b, re.M))
    assert grid.operator_benchmark_path() in report_block
    assert all(f in report_block for f in grid.report_files(True))
    assert_plan_is_grid_jobs(again.stdout, SMOKE, with_benchmark=True)


def test_the_default_grid_is_grid_jobs(default_plan):
    """The default grid's plan, a teacher per seed (teacher.seed: per_seed), job by job."""
    assert DEFAULT["teacher"].get("seed", "per_seed") == "per_seed" and len(DEFAULT["seeds"]) > 1
    assert_plan_is_grid_jobs(default_plan[1].stdout, DEFAULT)


def test_replicated_and_pretrained_teachers_are_grid_jobs(tmp_path):
    """A grid of three sizes: one trained (a teacher per seed), one pretrained checkpoint file and one with
    `teachers.<size>.replicates` (a checkpoint file per seed): the plan is grid.jobs, job by job, each
    teacher job reading its own file."""
    config = yaml.safe_load((REPO / "workflow/config/smoke.yaml").read_text())
    files = [tmp_path / name for name in ("one.safetensors", "rep0.safetensors", "rep1.safetensors")]
    for i, file in enumerate(files):
        file.write_bytes(bytes([i]) * 16)  # not the same checkpoint twice
    config.update(sizes=["micro", "deit", "regvit"], seeds=[0, 1], targets=["synthetic_b"], teachers={
        "deit": {"model": "deit_tiny_patch16_224", "file": str(files[0])},
        "regvit": {"model": "vit_base_patch16_224", "replicates": [{"file": str(f)} for f in files[1:]]}})
    (tmp_path / "grid.yaml").write_text(yaml.safe_dump(config))
    out = snakemake(tmp_path, "-n", "--cores", "2", "--configfile", str(tmp_path / "grid.yaml"))
    teachers = {job.name: job.reads for job in grid.jobs(config) if job.rule.startswith("teacher")}
    assert teachers == {"teacher micro/seed0": ("results/data/synthetic",), "teacher micro/seed1": ("results/data/synthetic",),
                        "teacher_pretrained deit": (str(files[0]),),
                        "teacher_replicate regvit/seed0": (str(files[1]),),
                        "teacher_replicate regvit/seed1": (str(files[2]),)}
    assert_plan_is_grid_jobs(out.stdout, config)


def test_a_grid_of_one_axis_at_a_time_plans_only_its_cells(tmp_path):
    """`cells: {around: ...}` (issue 57): the center and each axis varied with the others at the center's value,
    not the product. Snakemake plans exactly grid.jobs; nothing trains outside the listed cells (no student or
    reference of synthetic_b at 6 steps, no elu at 6 steps or on synthetic_b); each (target, size, variant)
    distils once, at its smallest budget."""
    config = yaml.safe_load((REPO / "workflow/config/smoke.yaml").read_text())
    config.update(variants=["focused", "elu"], cells={"around": {"target": "synthetic", "size": "micro",
                                                                 "variant": "focused", "budget": 3}})
    (tmp_path / "grid.yaml").write_text(yaml.safe_dump(config))
    out = snakemake(tmp_path, "-n", "-p", "--cores", "2", "--configfile", str(tmp_path / "grid.yaml"))
    assert_plan_is_grid_jobs(out.stdout, config)
    # The report judges the same cells: its rule hands it `cells` (without it the claims read the product's
    # cells, the unlisted ones "not evaluable", and C4's family is the product's).
    command = next(line for line in (out.stdout + out.stderr).splitlines() if "linvit report --config-json" in line)
    words = shlex.split(command.strip())
    assert grid_cells(json.loads(words[words.index("--config-json") + 1])) == grid_cells(config)
    students = {(c.dataset, c.variant, c.budget) for c in grid.student_cells(config)}
    assert students == {("synthetic", "focused", 3), ("synthetic_b", "focused", 3), ("synthetic", "elu", 3),
                        ("synthetic", "focused", 6)}
    assert {(c.dataset, c.budget) for c in grid.reference_cells(config)} == {("synthetic", 3), ("synthetic_b", 3),
                                                                              ("synthetic", 6)}
    assert {(c.dataset, c.variant, c.budget) for c in grid.distill_cells(config)} == {
        ("synthetic", "focused", 3), ("synthetic_b", "focused", 3), ("synthetic", "elu", 3)}
    full = {k: v for k, v in config.items() if k != "cells"}
    assert len(grid.student_cells(full)) == 2 * len(grid.student_cells(config))  # 8 cells of the product, 4 listed
    listed = {**full, "cells": [{"target": d, "size": "micro", "variant": v, "budget": b} for d, v, b in students]}
    assert grid.jobs(listed) == grid.jobs(config)  # the same cells listed one by one
    # linvit status and linvit decide follow the same cells: status counts grid.jobs, a decide dry run of look 1
    # plans them (two seeds: a plan's first look is at least two)
    out = run(["linvit", "status", "--configfile", str(tmp_path / "grid.yaml"), "--directory", str(tmp_path)],
              cwd=REPO)
    assert f": {len(grid.jobs(config))} jobs, 0 finished" in out.stdout.splitlines()[0]
    (tmp_path / "plan.yaml").write_text(yaml.safe_dump({"seeds": [0, 1], "sequential": {"looks": [2, 3]},
                                                       "claims": {"min_seeds": 2}}))
    out = run(["linvit", "decide", "-n", "--cores", "1", "--directory", str(tmp_path), "--configfile",
               str(tmp_path / "grid.yaml"), str(tmp_path / "plan.yaml")], cwd=REPO)
    counts = {k: v for k, v in job_counts(out.stdout).items() if k not in ("total", "all")}
    assert counts == dict(pd.Series([j.rule for j in grid.jobs({**config, "seeds": [0, 1]})]).value_counts())
    assert not (tmp_path / "results/decide/state.json").exists()


def test_shell_commands_take_paths_from_declared_files_only():
    """No rule re-spells a results path: every path reaches the shell through input/output/params/log."""
    for smk in (REPO / "workflow/rules").glob("*.smk"):
        for m in re.finditer(r"shell:\n((?:\s+\".*\"\n?)+)", smk.read_text()):
            assert "results/" not in m.group(1) and "report/" not in m.group(1), smk.name
            assert not re.search(r"\{[A-Z_]+\}", m.group(1)), smk.name  # a global, not input/output/params


def test_cheap_rules_are_local():
    """The aggregation never goes to a cluster (Snakemake rejects unknown names here); the shards do,
    under the Slurm profile (hours of work on a login node otherwise)."""
    text = (REPO / "Snakefile").read_text()
    block = re.search(r"^localrules:\n((?:    \w+,?\n)+)", text, re.M)
    assert block, "the Snakefile has no localrules block"
    local = set(re.findall(r"\w+", block.group(1)))
    assert local == {"all", "report", "report_from_results"}
    defined = set()
    for smk in [REPO / "Snakefile", *(REPO / "workflow/rules").glob("*.smk")]:
        defined |= set(re.findall(r"^rule (\w+):", smk.read_text(), re.M))
    assert local <= defined


def test_lint_is_clean_but_for_explained_lints(tmp_path):
    out = snakemake(tmp_path, "--lint", check=False)
    text = out.stdout + out.stderr
    assert "Traceback" not in text
    titles = re.findall(r"^    \* (.+?):?$", text, re.M)
    headers = re.findall(r"^Lints for (.+):$", text, re.M)
    assert len(titles) >= len(headers)  # every header has its lints parsed
    unexplained = sorted({t for t in titles if t.rstrip(":") not in EXPLAINED_LINTS})
    assert not unexplained, f"unexplained lints: {unexplained}\n{text[-3000:]}"
    for title, (path, comment) in EXPLAINED_LINTS.items():
        assert comment in (REPO / path).read_text(), f"{path} does not explain the lint {title!r}"
    if not titles:
        assert "Congratulations" in text


def test_planning_the_workflow_imports_neither_torch_nor_timm(tmp_path):
    """Every `snakemake` call parses the Snakefile and the config checks; that must stay fast."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "snakemake", "-s", SNAKEFILE,
                           "--directory", str(tmp_path), "-n", "--cores", "1"],
                          cwd=tmp_path, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    imported = set(re.findall(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$", proc.stderr, re.M))
    assert {"linvit.config", "linvit.grid", "linvit.registry"} <= imported  # the parse ran in this process
    assert "Job stats" in proc.stdout or "Job stats" in proc.stderr
    heavy = sorted(m for m in imported if m.split(".")[0] in ("torch", "timm", "torchvision"))
    assert not heavy, f"planning imported {heavy[:5]}"


@pytest.mark.parametrize("change, key", [
    (lambda c: c.pop("seeds"), "'seeds' is a required property"),
    (lambda c: c.update(seeds=3), "config key seeds: 3 is not of type 'array'"),
    (lambda c: c.update(sizes="micro"), "config key sizes: 'micro' is not of type 'array'"),
    (lambda c: c.update(variants=["softmax", "nope"]), "config key variants: unknown variant 'nope'"),
    (lambda c: c["teacher"].update(seed="each"), "config key teacher.seed: 'each' is not a seed (an integer from 0) "
                                                 "or per_seed"),
    (lambda c: c["datasets"]["synthetic"].update(classes=[1, 1]), "config key datasets.synthetic.classes: label 1 is "
                                                                    "listed twice"),
    # Several checkpoints of one size are replicates, one per seed: every seed needs its own.
    (lambda c: c.update(seeds=[0, 1, 2], teachers={"micro": {"model": "deit_tiny_patch16_224", "replicates": [
        {"file": "a.pth"}, {"file": "b.pth"}]}}), "config key teachers.micro.replicates: seed 2 has no checkpoint "
                                                  "(2 listed, for seeds 0-1)"),
    (lambda c: c.update(seeds=[0, 1], teachers={"micro": {"model": "deit_tiny_patch16_224", "replicates": [
        {"file": "a.pth"}, {"file": "a.pth"}]}}), "config key teachers.micro.replicates[1]: the same checkpoint as "
                                                  "replicates[0]"),
])
def test_config_error_is_one_line_naming_the_key(tmp_path, change, key):
    config = yaml.safe_load((REPO / "workflow/config/smoke.yaml").read_text())
    change(config)
    code, text = config_error(tmp_path, config)
    assert code != 0
    lines = [l for l in text.splitlines() if key in l]
    assert len(lines) == 1, text
    assert len(text.strip().splitlines()) <= 3, text  # the error, where it was raised; no schema dump
    for schema_word in ("additionalProperties", "definitions", "$schema", "Failed validating"):
        assert schema_word not in text
    assert "No validator found" not in text
    assert not (tmp_path / "results").exists()


def test_unknown_variant_fails_before_any_job(tmp_path):
    config = yaml.safe_load((REPO / "workflow/config/smoke.yaml").read_text())
    config["variants"] = ["nope"]
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(config))
    out = snakemake(tmp_path, "--cores", "1", "--configfile", str(tmp_path / "bad.yaml"), check=False)
    assert out.returncode != 0
    known = ", ".join(available_variants())  # softmax included: the control students
    assert f"config key variants: unknown variant 'nope'; known variants: {known}" in out.stdout + out.stderr
    assert not (tmp_path / "results").exists()


def test_the_smoke_grid_runs_every_loss_design_axis_and_budget():
    """The smoke grid exercises every registered distillation loss (in a design or a strategy's
    train_losses), at least three designs, two of the literature's baselines and two budgets."""
    from linvit.registry import names

    used = set()
    for design in SMOKE["distill_designs"].values():
        for phase in design.get("phases") or [design]:
            used |= {t if isinstance(t, str) else t["loss"] for t in phase["losses"]}
    for init in SMOKE["inits"]:
        used |= {t if isinstance(t, str) else t["loss"] for t in SMOKE["init_strategies"][init].get("train_losses", [])}
    assert used == set(names("loss"))
    assert len(SMOKE["distills"]) >= 3 and len(SMOKE["budgets"]) >= 2
    baselines = [i for i in SMOKE["inits"] if SMOKE["init_strategies"][i].get("train_losses")
                 or isinstance(SMOKE["init_strategies"][i]["distill"], str)]
    assert len(baselines) >= 2


def test_the_report_rule_hands_the_report_every_key_it_reads(tmp_path):
    """The report states the images each student saw (student.train.batch_size) and expects the
    control's cells from control_inits: both reach it through the rule's --config-json."""
    out = snakemake(tmp_path, "report", "-n", "-p")
    command = next(line for line in (out.stdout + out.stderr).splitlines() if "linvit report --config-json" in line)
    words = shlex.split(command.strip())
    cfg = json.loads(words[words.index("--config-json") + 1])
    default = yaml.safe_load((REPO / "workflow/config/default.yaml").read_text())
    assert cfg["student"]["train"]["batch_size"] == default["student"]["train"]["batch_size"]
    assert cfg["control_inits"] == default["control_inits"]


SMOKE_PATH = str(REPO / "workflow/config/smoke.yaml")


def killed_while_the_teacher_trains(tmp, config_path: str) -> dict:
    """Start the grid, and once `linvit status` sees its teacher running, SIGKILL Snakemake and every
    process below it (a machine going down). Returns what status said while the teacher ran ("during",
    None if the grid ended before it was seen running) and what `linvit status` says of the killed run."""
    from linvit.runrecord import read_record
    from linvit.status import collect, render
    from test_distributed import _descendants

    config = yaml.safe_load(open(config_path))
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.Popen(["snakemake", "-s", SNAKEFILE, "--directory", str(tmp), "--cores", "2", "--configfile",
                             config_path], cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    teacher, deadline, seen = f"teacher {grid.teacher_key('micro', 0)}", time.time() + patient(300), None
    try:
        while proc.poll() is None and time.time() < deadline:
            status = collect(config, tmp, record=read_record(tmp))
            if {s.job.name: s.state for s in status.jobs}[teacher] == "running":
                seen = status
                break
            time.sleep(0.2)
    finally:
        for pid in [proc.pid, *_descendants(proc.pid)]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait()
    after = run(["linvit", "status"], cwd=tmp, check=False)
    return {"during": render(seen, config_path) if seen else None, "after": after.stdout + after.stderr}


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """The smoke grid run once, as a user would, and what each step said; the tests below read it. Killed
    once its teacher trains, unlocked as `linvit status` then says, run again to the end; then status of
    the finished grid, a second run, a student's eval.json deleted (a dry run, then the file put back),
    Snakemake's HTML report, and the report regenerated from results/ alone. No step stops the others:
    each test checks its own."""
    tmp = tmp_path_factory.mktemp("smoke")
    ran = {"repo_report": sorted(p.name for p in (REPO / "report").iterdir()) if (REPO / "report").exists() else []}
    ran["killed"] = killed_while_the_teacher_trains(tmp, SMOKE_PATH)
    snakemake(tmp, "--unlock", "--configfile", SMOKE_PATH, check=False)
    # As `linvit status` says after a kill: a job killed while writing (shards) left outputs marked incomplete.
    ran["run"] = snakemake(tmp, "--cores", "2", "--rerun-incomplete", "--configfile", SMOKE_PATH, check=False)
    # What the report rule wrote, before anything below rewrites report/.
    ran["written"] = {p.relative_to(tmp).as_posix() for p in (tmp / "report").rglob("*") if p.is_file()} | \
        {f"results/{p.name}" for p in (tmp / "results").glob("*.csv")}
    ran["readme"] = (tmp / "report/README.md").read_text() if (tmp / "report/README.md").exists() else ""
    ran["status"] = run(["linvit", "status"], cwd=tmp, check=False)
    ran["again"] = snakemake(tmp, "--cores", "2", "--configfile", SMOKE_PATH, check=False)
    # A file a job wrote and the report reads, deleted after the grid finished: the next run makes it again.
    lost = next(c for c in grid.student_cells(SMOKE) if c.distills).run_dir(tmp / "results") / "eval.json"
    kept = tmp / "eval.json.kept"
    if lost.exists():
        shutil.move(lost, kept)
    ran["lost"] = lost.relative_to(tmp).as_posix()
    ran["lost_plan"] = snakemake(tmp, "-n", "--cores", "2", "--configfile", SMOKE_PATH, check=False)
    if kept.exists():
        shutil.move(kept, lost)  # its mtime kept: the grid is finished again
    ran["html"] = snakemake(tmp, "--report", str(tmp / "report.html"), "--configfile", SMOKE_PATH, check=False)
    shutil.rmtree(tmp / "report", ignore_errors=True)
    ran["regen"] = snakemake(tmp, "report_from_results", "--cores", "1", "--configfile", SMOKE_PATH, check=False)
    ran["regen_readme"] = (tmp / "report/README.md").read_text() if (tmp / "report/README.md").exists() else ""
    ran["repo_report_after"] = sorted(p.name for p in (REPO / "report").iterdir()) if (REPO / "report").exists() \
        else []
    return tmp, ran


def _ok(proc) -> str:
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-3000:]
    return text


@pytest.mark.slow
def test_status_of_a_grid_killed_while_its_teacher_trains(smoke):
    _, ran = smoke
    during, after = ran["killed"]["during"], ran["killed"]["after"]
    assert during is not None, "the grid ended before its teacher was seen running"
    assert re.search(r"^Snakemake: running \(process \d+", during, re.M)
    assert re.search(r"^teacher +1 +0 +1 +0 +0 +0 +0 +0 ", during, re.M)  # jobs, finished, running, queued, ...
    assert re.search(r"^  running +micro/seed0 .* runs here", during, re.M)
    assert re.search(r"^teacher +1 +0 +0 +0 +1 +0 +0 +0 ", after, re.M)  # interrupted
    assert re.search(r"^  interrupted +micro/seed0 .*the next snakemake runs it again", after, re.M)
    assert "Snakemake: not running, but its locks are left" in after and "snakemake --unlock" in after
    assert "run it with `--rerun-incomplete`" in after
    assert re.search(r"^student +40 +0 +0 +0 +0 +0 +0 +40 ", after, re.M)  # all still to run


@pytest.mark.slow
def test_the_smoke_grid_finishes_every_cell(smoke):
    tmp, ran = smoke
    _ok(ran["run"])
    runs = pd.read_csv(tmp / "results/runs.csv")
    assert len(runs) == len(grid.all_cells(SMOKE)) and (runs["status"] == "ok").all()
    assert set(runs["budget"]) == set(SMOKE["budgets"]) and len(set(runs["design"]) - {"none"}) >= 3
    assert runs["test_acc"].between(0, 1).all() and runs["fidelity_kl_mean"].notna().all()
    assert (runs["params"] > 0).all() and (runs["throughput_img_s"] > 0).all()


@pytest.mark.slow
def test_the_report_writes_its_declared_files(smoke):
    tmp, ran = smoke
    for claim in ("C1", "C2", "C3", "C4"):
        assert claim in ran["readme"]
    for fig in ("accuracy_by_init.png", "training_curves.png"):
        assert (tmp / "report/figures" / fig).stat().st_size > 1000
    # The report wrote exactly the files the `report` rule declares (linvit.grid.report_files).
    assert ran["written"] == set(grid.report_files(False))


@pytest.mark.slow
def test_every_training_job_left_its_benchmark(smoke):
    """The report's cost section and `linvit bench grid` read them: the jobs' wall times over their loops'."""
    tmp, _ = smoke
    for cell in grid.all_cells(SMOKE):
        assert "s\th:m:s" in cell.benchmark_path("students", tmp / "results").read_text()
    assert (tmp / grid.benchmark_path("teacher", "micro/seed0")).exists()
    assert len(list((tmp / "results/benchmarks/distill").rglob("*.tsv"))) == len(grid.distill_cells(SMOKE))
    ratio = {r["metric"]: r["value"] for r in bench_grid(SMOKE, tmp / "results")}
    assert ratio["jobs"] == len(grid.teacher_keys(SMOKE)) + len(grid.distill_cells(SMOKE)) + len(grid.all_cells(SMOKE))
    assert ratio["wall_s"] == pytest.approx(ratio["teacher_wall_s"] + ratio["distill_wall_s"] + ratio["student_wall_s"]
                                            + ratio["reference_wall_s"])
    assert 1 < ratio["wall_over_loops"] == pytest.approx(ratio["wall_s"] / ratio["loop_s"])


@pytest.mark.slow
def test_every_trained_run_has_its_tensorboard_events(smoke):
    tmp, _ = smoke
    for folder in [grid.teacher_dir("micro", 0, tmp / "results"),
                   *(grid.distill_dir(c.dataset, c.size, c.variant, c.init, c.design, c.seed, tmp / "results")
                     for c in grid.distill_cells(SMOKE))]:
        assert list(Path(folder, grid.EVENTS).glob("*tfevents*")), folder
    for cell in grid.all_cells(SMOKE):  # a student's with its evaluation's
        assert len(list((cell.run_dir(tmp / "results") / grid.EVENTS).glob("*tfevents*.evaluate"))) == 1


@pytest.mark.slow
def test_tensorboard_s_hparams_view_lists_every_trained_run_by_its_cell(smoke):
    """TensorBoard's HParams view of results/, read through the hparams plugin: one row per training job of
    grid.jobs (the teacher killed once and run again among them), its hparams the job's cell, its metrics its own."""
    from test_stages import hparams_view

    tmp, _ = smoke
    results = tmp / "results"
    expected, evaluated = {}, {}
    for job in grid.jobs(SMOKE, results):
        if job.rule not in ("teacher", "distill", "reference", "student"):
            continue
        name = f"{Path(job.folder).relative_to(results).as_posix()}/{grid.EVENTS}"
        if job.rule == "teacher":
            size, seed = job.key.split("/seed")
            expected[name] = {"rule": "teacher", "dataset": SMOKE["teacher"]["dataset"], "size": size,
                              "variant": "softmax", "seed": int(seed)}
        else:
            cell = job.cell.as_dict()
            if job.rule == "distill":
                del cell["budget"]  # a distillation serves every budget
            expected[name] = {"rule": job.rule, **cell}
            if job.evaluates:
                evaluated[name] = json.loads(Path(job.folder, "metrics.json").read_text())["test_acc"]
    view = hparams_view(results)
    assert {name: hparams for name, (hparams, _) in view.items()} == expected
    assert {name: view[name][1]["eval/test_acc"] for name in evaluated} == pytest.approx(evaluated)


@pytest.mark.slow
def test_status_of_the_finished_grid(smoke):
    """Every job finished, its time the benchmarks', nothing left."""
    from linvit.jobfiles import read_benchmark
    from linvit.status import duration

    tmp, ran = smoke
    done = _ok(ran["status"])
    jobs = grid.jobs(SMOKE)
    assert (f": {len(jobs)} jobs, {len(jobs)} finished, 0 running, 0 queued, 0 interrupted, 0 failed, 0 blocked, "
            "0 to run") in done
    seconds = sum(read_benchmark(tmp / job.benchmark)["wall_s"] for job in jobs if job.benchmark)
    assert f"Time so far: {duration(seconds)} in finished jobs" in done
    assert "Remaining: nothing\n" in done and re.search(r"^Snakemake: not running(;.*)?$", done, re.M)


@pytest.mark.slow
def test_a_second_run_has_nothing_to_do(smoke):
    _, ran = smoke
    assert "Nothing to be done" in _ok(ran["again"])


@pytest.mark.slow
def test_a_file_the_report_reads_deleted_after_the_grid_finished_is_made_again(smoke):
    """A student's eval.json deleted: the next `snakemake` plans that student again, and the report after it
    (Snakemake tolerates a missing file of a job whose outputs are up to date unless a target needs it:
    `rule all` asks for every file the report reads)."""
    _, ran = smoke
    text = _ok(ran["lost_plan"])
    assert "Nothing to be done" not in text
    assert {k: v for k, v in job_counts(text).items() if k != "total"} == {"student": 1, "report": 1, "all": 1}
    (student,) = [fields for rule, fields in planned_jobs(text) if rule == "student"]
    assert ran["lost"] in student["output"]


@pytest.mark.slow
def test_snakemake_report_captions_every_file_of_the_report_rule(smoke):
    tmp, ran = smoke
    _ok(ran["html"])
    results, categories = snakemake_report_results((tmp / "report.html").read_text())
    assert set(results) == set(grid.report_files(False))
    assert set(categories) == {"Claims", "Accuracy", "Cost", "Attention", "Report"}
    for path, result in results.items():
        caption = re.sub(r"<[^>]+>|\s+", " ", result["caption"] or "")
        assert len(caption.split()) >= 10, path
    for name in figure_registry.figure_names():  # each figure's caption (workflow/report/<name>.rst) is shown with it
        words = " ".join((REPO / f"workflow/report/{name}.rst").read_text().split()[:6])
        for fmt in ("png", "svg"):
            caption = re.sub(r"<[^>]+>|\s+", " ", results[f"report/figures/{name}.{fmt}"]["caption"])
            assert words in caption, (name, words, caption[:200])


@pytest.mark.slow
def test_the_report_regenerates_from_results_alone(smoke):
    """report_from_results trains nothing; the repository's own report/ is never touched by tests."""
    tmp, ran = smoke
    counts = job_counts(_ok(ran["regen"]))
    assert counts.get("report_from_results") == 1 and "student" not in counts and "teacher" not in counts
    assert ran["readme"] and ran["regen_readme"] == ran["readme"]
    assert ran["repo_report"] == ran["repo_report_after"]


def snakemake_report_results(html: str) -> tuple[dict, dict]:
    """What Snakemake's HTML report embeds: its results ({path: {caption, labels, ...}}) and categories
    ({category: {subcategory: [path, ...]}})."""
    import json

    found = []
    for name in ("results", "categories"):
        match = re.search(rf"var {name} = (\{{.*?\}});\s*$", html, re.M)
        assert match, f"no {name} in Snakemake's report"
        found.append(json.loads(match.group(1)))
    return tuple(found)


TOY_WORKFLOW = """
rule all:
    input: expand("c{i}.txt", i=range(4))
rule a:
    output: "a{i}.txt"
    threads: 1
    shell: "sleep 0.3; touch {output}"
rule b:
    input: expand("a{i}.txt", i=range(2))
    output: "b.txt"
    threads: 2
    shell: "sleep 0.3; touch {output}"
rule c:
    input: "b.txt"
    output: "c{i}.txt"
    threads: 1
    shell: "date +%s.%N > {output}.start; sleep 1.5; date +%s.%N > {output}"
"""


def test_snakemake_runs_no_more_threads_than_its_cores(tmp_path):
    # The grid's jobs claim threads so that `--cores N` keeps N cores busy and no more. Snakemake
    # 9.15.0 (what pip resolved without a pin) gave back each finished job's cores twice, and then
    # ran 4 one-thread jobs on 2 cores: the pinned version must not.
    (tmp_path / "Snakefile").write_text(TOY_WORKFLOW)
    run([sys.executable, "-m", "snakemake", "--cores", "2", "--quiet"], cwd=tmp_path)
    spans = [(float((tmp_path / f"c{i}.txt.start").read_text()), float((tmp_path / f"c{i}.txt").read_text()))
             for i in range(4)]
    most = max(sum(start <= t < end for start, end in spans) for t, _ in spans)
    assert most <= 2, f"{most} one-thread jobs ran at once with --cores 2"
