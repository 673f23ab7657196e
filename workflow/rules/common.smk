# The grid, wildcard constraints and every path; the grid and the paths come from linvit.grid, so the
# jobs Snakemake plans, the files they declare and the cells the report expects are the same list.
# Nothing here imports torch or timm (tests/test_workflow.py checks that a dry run does not).
#
# lint: "Specify a conda environment or container for each rule" is left on purpose: every rule runs
# the `linvit` command of the project's own environment (setup.sh's .venv, or environment.yml), which
# installs this package from the checkout (`pip install -e .`); a per-rule conda env built from a copy
# of environment.yml under .snakemake/conda could not install it. tests/test_workflow.py allows this
# lint and no other.
import json
import os
import shlex

from linvit import grid
from linvit.grid import all_cells

CELLS = all_cells(config)
TEACHER_DATASET = config["teacher"]["dataset"]
TEACHER_SEED = config["teacher"].get("seed", 0)


def _alternatives(names):
    return "|".join(sorted(names))


wildcard_constraints:
    dataset=_alternatives(config["datasets"]),
    size=_alternatives(config["sizes"]),
    variant=_alternatives(config["variants"]),
    init=_alternatives(config["init_strategies"]),
    seed=r"\d+",


def job_config(*keys):
    """The parts of the config a job reads, as JSON: a job reruns only when those parts change.

    A key the config does not have is left out: the schema makes the required ones present, and
    the steps give the optional ones (shards, evaluation, claims) their defaults.
    """
    parts = {}
    for key in keys:
        node, target = config, parts
        *parents, last = key.split(".")
        for p in parents:
            node, target = node.get(p, {}), target.setdefault(p, {})
        if last in node:
            target[last] = node[last]
    return json.dumps(parts, sort_keys=True)


def res(rule_name, key, default):
    return config.get("resources", {}).get(rule_name, {}).get(key, default)


def files(folder, names):
    """{key: path} for files `names` of `folder`, keyed by the name with '.' as '_' (model_json, ...)."""
    return {name.replace(".", "_"): f"{folder}/{name}" for name in names}


def out_folder(wc, output):
    """A params function: the folder of a job's outputs (what `linvit ... --out` takes)."""
    return os.path.dirname(output[0])


def strategy(init):
    return config["init_strategies"][init]


# Wildcard patterns of the paths, spelled by linvit.grid.
SHARDS = grid.shards_dir("{dataset}")
TEACHER = grid.teacher_dir("{size}")
DISTILL_KEY = grid.distill_key("{dataset}", "{size}", "{variant}", "{seed}")
DISTILL = grid.distill_dir("{dataset}", "{size}", "{variant}", "{seed}")
RUN_KEY = grid.run_key("{dataset}", "{size}", "{variant}", "{init}", "{seed}")
RUN = grid.run_dir("{dataset}", "{size}", "{variant}", "{init}", "{seed}")
REFERENCE_KEY = grid.run_key("{dataset}", "{size}", grid.REFERENCE_VARIANT, grid.REFERENCE_INIT, "{seed}")
REFERENCE = grid.run_dir("{dataset}", "{size}", grid.REFERENCE_VARIANT, grid.REFERENCE_INIT, "{seed}")


def teacher_model(wc):
    """What a job reads of the teacher: its architecture (model.json) and weights."""
    folder = grid.teacher_dir(wc.size)
    return {"teacher_json": f"{folder}/model.json", "teacher_weights": f"{folder}/model.safetensors"}


def in_folder(key):
    """A params function: the folder of input `key` (what `linvit ... --teacher/--run/--distilled` take)."""
    return lambda wc, input: os.path.dirname(input[key])


def student_inputs(wc):
    """Shards and teacher; for a distilling strategy, the distillation's metrics and attention weights."""
    inputs = {"shards": grid.shards_dir(wc.dataset), **teacher_model(wc)}
    if strategy(wc.init)["distill"]:
        distill = grid.distill_dir(wc.dataset, wc.size, wc.variant, wc.seed)
        inputs.update(distilled_metrics=f"{distill}/metrics.json",
                      distilled_weights=f"{distill}/attention.safetensors")
    return inputs


def distilled_option(wc, input):
    """`--distilled FOLDER` for a distilling strategy, else nothing."""
    if "distilled_weights" in input.keys():
        return f"--distilled {shlex.quote(os.path.dirname(input.distilled_weights))}"
    return ""


# The operator benchmark is not part of `all` (it should run on an otherwise idle machine), so the
# report takes its CSV as an input only when it exists when the workflow is parsed: then a newer CSV
# reruns the report, and its scaling figure is a declared output. Without it the report has no
# scaling section and declares no scaling figure; `snakemake benchmark` followed by `snakemake`
# adds both (the report reruns because its set of inputs changed).
WITH_BENCHMARK = os.path.exists(grid.operator_benchmark_path())


def report_inputs(wc):
    """Everything the report reads: per cell its metrics, training log (curves), evaluation and the
    benchmark TSVs of its jobs (the cost section), the teachers' and distillations' benchmark TSVs,
    and the operator benchmark's CSV if there is one. Logs are read only for a missing cell, which
    the report rule never sees (it waits for every cell; see onerror and report_from_results)."""
    inputs = []
    for cell in CELLS:
        run = cell.run_dir()
        inputs += [f"{run}/metrics.json", f"{run}/train.jsonl", f"{run}/eval.json",
                   str(cell.benchmark_path("students")), str(cell.benchmark_path("evaluate"))]
        if not cell.is_reference and strategy(cell.init)["distill"]:
            inputs.append(grid.benchmark_path("distill", grid.distill_key(cell.dataset, cell.size,
                                                                          cell.variant, cell.seed)))
    inputs += [grid.benchmark_path("teacher", size) for size in config["sizes"]]
    if WITH_BENCHMARK:
        inputs.append(grid.operator_benchmark_path())
    return sorted(set(inputs))
