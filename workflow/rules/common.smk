# The grid, wildcard constraints and every path; the grid and the paths come from linvit.grid, so the
# jobs Snakemake plans, the files they declare and the cells the report expects are the same list.
# Nothing here imports torch or timm (tests/test_workflow.py checks that a dry run does not).
#
# lint: "Specify a conda environment or container for each rule" is left on purpose: every rule runs
# the `linvit` command of the project's own environment (setup.sh's .venv, or environment.yml), which
# installs this package from the checkout (`pip install -e .`); a per-rule conda env built from a copy
# of environment.yml under .snakemake/conda could not install it. tests/test_workflow.py allows this
# lint and no other.
import inspect
import json
import os
import shlex

from linvit import grid
from linvit.config import (CHECKPOINTS, NO_DESIGN, checkpoint, design_specs, file_stamp, kd_reference, teacher_design,
                           trained_sizes)
from linvit.sizes import size_factor  # SIZE_SCALE lives there: `linvit status` scales job times by it too

try:  # where Snakemake looks for a callable's parameters before it inspects its signature
    from snakemake.common import FUNC_OVERWRITE_PARAMS_ATTR
except ImportError:  # another Snakemake: it inspects every call, as before
    FUNC_OVERWRITE_PARAMS_ATTR = None


def planned(fn):
    """`fn` with its parameters recorded once. Snakemake inspects the signature of an input, params
    or resources function at every call (several per job): a fifth of a large grid's dry run
    (cProfile of `linvit bench plan`). Every function the rules take goes through this."""
    if FUNC_OVERWRITE_PARAMS_ATTR:
        setattr(fn, FUNC_OVERWRITE_PARAMS_ATTR, inspect.signature(fn).parameters)
    return fn


# The operator benchmark is not part of `all` (it should run on an otherwise idle machine), so the
# report takes its CSV as an input only when it exists when the workflow is parsed: then a newer CSV
# reruns the report, and its scaling figure is a declared output. Without it the report has no
# scaling section and declares no scaling figure; `snakemake benchmark` followed by `snakemake`
# adds both (the report reruns because its set of inputs changed).
WITH_BENCHMARK = os.path.exists(grid.operator_benchmark_path())
# The one list of the grid's jobs (linvit.grid.jobs, what `linvit status` follows), the report's last.
JOBS = grid.jobs(config, with_benchmark=WITH_BENCHMARK)
REPORT_JOB = next(job for job in JOBS if job.rule == "report")
TEACHER = config.get("teacher", {})
TRAINED_SIZES = trained_sizes(config)  # teachers the harness trains; the other sizes are loaded
LOADED_SIZES = [s for s in config["sizes"] if s not in TRAINED_SIZES]
# Loaded sizes with one checkpoint (rule teacher_pretrained) or one per seed (rule teacher_replicate).
REPLICATED_SIZES = [s for s in LOADED_SIZES if teacher_design(config, s) == CHECKPOINTS]
CHECKPOINT_SIZES = [s for s in LOADED_SIZES if s not in REPLICATED_SIZES]


def _alternatives(names):
    # A regex matching none of nothing: a rule whose wildcard may take no value never matches.
    return "|".join(sorted(names)) if names else "(?!)"


wildcard_constraints:
    dataset=_alternatives(config["datasets"]),
    size=_alternatives(config["sizes"]),
    variant=_alternatives(config["variants"]),
    init=_alternatives(config["init_strategies"]),
    design=_alternatives([*design_specs(config), NO_DESIGN]),
    budget=r"\d+",
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


def shards_config(dataset):
    """The dataset's entry without what the models see of it (transform, labels): editing an
    augmentation reruns the training jobs, never the (possibly hours-long) sharding."""
    spec = {k: v for k, v in config["datasets"][dataset].items() if k not in ("transform", "labels")}
    return json.dumps({"datasets": {dataset: spec}, **({"shards": config["shards"]} if "shards" in config else {})},
                      sort_keys=True)


def input_keys(dataset):
    """The config keys that decide what a model sees of `dataset` (linvit.inputs): its transform and
    label space. A job that trains or evaluates on it reads them, so editing them reruns those jobs."""
    return (f"datasets.{dataset}.transform", f"datasets.{dataset}.labels")


# Resources per rule. `resources:` in the config gives each rule's threads, mem_mb, runtime
# (minutes) and gpu for the smallest model (micro) on a first attempt; a job of a larger size gets
# them times its size's factors (linvit.sizes.SIZE_SCALE, overridden per size by `resources.scale`), and a job
# Snakemake retries (--retries, the Slurm profile's 2) gets mem_mb and runtime times its attempt
# (a job Slurm killed for time or memory comes back with more; it resumes from its checkpoint/).
# On a cluster these become sbatch's --cpus-per-task, --mem, -t and --gpus; locally, threads are
# capped by --cores and the rest constrain nothing unless --resources names them.
GROWS_WITH_ATTEMPT = ("mem_mb", "runtime")


def resource_value(rule_name, key, default, size=None, attempt=1):
    """The value of resource `key` for a job of `rule_name` on a model of `size`, at `attempt`."""
    value = config.get("resources", {}).get(rule_name, {}).get(key, default)
    if size is not None and value:
        value = value * size_factor(config, size, key)
    if key in GROWS_WITH_ATTEMPT:
        value = value * attempt
    return max(1, round(value)) if value else 0


def res(rule_name, key, default):
    """A threads/resources callable: `resource_value` for the job's size wildcard and attempt
    (rules without a size, the shards and the report, get the configured value times attempt)."""
    if key == "threads":
        return planned(lambda wildcards: resource_value(rule_name, key, default, wildcards.get("size")))
    return planned(lambda wildcards, attempt: resource_value(rule_name, key, default, wildcards.get("size"), attempt))


@planned
def launcher(wc, threads, resources):
    """A params function: how a training job starts. With `gpu` above 1, torchrun starts that many
    processes of the same `linvit` command on one node, one per GPU, which train data-parallel
    (linvit/distributed.py); with one GPU or none, the command runs alone."""
    n = int(resources.gpu)
    return f"torchrun --standalone --nproc-per-node {n} --no-python" if n > 1 else ""


@planned
def rank_threads(wc, threads, resources):
    """A params function: torch threads per process, the job's CPUs shared by its torchrun processes."""
    return max(1, threads // max(1, int(resources.gpu)))


def files(folder, names):
    """{key: path} for files `names` of `folder`, keyed by the name with '.' as '_' (model_json, ...)."""
    return {name.replace(".", "_"): f"{folder}/{name}" for name in names}


@planned
def out_folder(wc, output):
    """A params function: the folder of a job's outputs (what `linvit ... --out` takes)."""
    return os.path.dirname(output[0])


def strategy(init):
    return config["init_strategies"][init]


# Wildcard patterns of the paths, spelled by linvit.grid.
SHARDS = grid.shards_dir("{dataset}")
TEACHER_KEY = grid.teacher_key("{size}", "{seed}")  # a trained teacher: one per teacher seed
TEACHER_DIR = grid.teacher_dir("{size}", "{seed}")
PRETRAINED_DIR = grid.teacher_dir("{size}")  # a pretrained teacher: one per size
DISTILL_KEY = grid.distill_key("{dataset}", "{size}", "{variant}", "{init}", "{design}", "{seed}")
DISTILL = grid.distill_dir("{dataset}", "{size}", "{variant}", "{init}", "{design}", "{seed}")
RUN_KEY = grid.run_key("{dataset}", "{size}", "{variant}", "{init}", "{seed}", "{design}", "{budget}")
RUN = grid.run_dir("{dataset}", "{size}", "{variant}", "{init}", "{seed}", "{design}", "{budget}")
_REF = ("{dataset}", "{size}", grid.REFERENCE_VARIANT, grid.REFERENCE_INIT, "{seed}", NO_DESIGN, "{budget}")
REFERENCE_KEY = grid.run_key(*_REF)
REFERENCE = grid.run_dir(*_REF)


@planned
def teacher_model(wc):
    """What a job reads of the teacher it copies from (grid.teacher_of: its seed's own by default, the one
    teacher under `teacher.seed: <int>`, or the pretrained one): its architecture and weights."""
    folder = grid.teacher_of(config, wc.size, wc.seed)
    return {"teacher_json": f"{folder}/model.json", "teacher_weights": f"{folder}/model.safetensors"}


def _checkpoint(wc):
    """The checkpoint a pretrained-teacher job loads (linvit.config.checkpoint): the size's one, or seed's."""
    return checkpoint(config, wc.size, wc.get("seed"))


@planned
def teacher_file(wc):
    """A pretrained teacher's weights file, when it comes from one (else timm's hub or cache)."""
    file = _checkpoint(wc).get("file")
    return {"weights": os.path.expanduser(file)} if file else {}


@planned
def checkpoint_config(wc):
    """A pretrained-teacher job's config: its own checkpoint alone, so that editing another replicate
    reruns only that replicate's job, and its file's resolved path, size and mtime (file_stamp), so that
    a file replaced by another (an older copy escapes Snakemake's mtime check) reruns it; the job's
    config.json records them."""
    entry = _checkpoint(wc)
    stamp = file_stamp(entry)
    return json.dumps({"teachers": {wc.size: entry}, **({"teacher_file": stamp} if stamp else {})}, sort_keys=True)


def in_folder(key):
    """A params function: the folder of input `key` (what `linvit ... --teacher/--run/--distilled` take)."""
    return planned(lambda wc, input: os.path.dirname(input[key]))


@planned
def student_inputs(wc):
    """Shards and teacher; after a distillation (design other than none), the distilled student
    (stage 1); for logit distillation on a target whose labels the teacher does not share, the
    softmax reference of the same budget, which then gives the logits (linvit.config.kd_reference)."""
    inputs = {"shards": grid.shards_dir(wc.dataset), **teacher_model(wc)}
    if wc.design != NO_DESIGN:
        distill = grid.distill_dir(wc.dataset, wc.size, wc.variant, wc.init, wc.design, wc.seed)
        inputs.update(distilled_metrics=f"{distill}/metrics.json", distilled_json=f"{distill}/model.json",
                      distilled_weights=f"{distill}/model.safetensors")
    if kd_reference(config, wc.init, wc.dataset, wc.size):
        ref = grid.run_dir(wc.dataset, wc.size, grid.REFERENCE_VARIANT, grid.REFERENCE_INIT, wc.seed,
                           NO_DESIGN, wc.budget)
        inputs.update(kd_metrics=f"{ref}/metrics.json", kd_json=f"{ref}/model.json",
                      kd_weights=f"{ref}/model.safetensors")
    return inputs


@planned
def distilled_option(wc, input):
    """`--distilled FOLDER` after a distillation, `--kd-teacher FOLDER` with a logit teacher, else nothing."""
    options = []
    if "distilled_weights" in input.keys():
        options.append(f"--distilled {shlex.quote(os.path.dirname(input.distilled_weights))}")
    if "kd_weights" in input.keys():
        options.append(f"--kd-teacher {shlex.quote(os.path.dirname(input.kd_weights))}")
    return " ".join(options)


def report_inputs(wc):
    """Everything the report reads that a job writes (linvit.grid.report_reads: per cell its metrics,
    training log, evaluation, predictions and benchmark TSV, the teachers' and distillations' benchmark
    TSVs, ...): the report job's `reads` in grid.jobs. `rule all` asks for them too, so a file deleted
    after the grid finished is a missing target: the next `snakemake` runs its job again, and the report
    after it (Snakemake tolerates a missing input of a job whose outputs are up to date)."""
    return list(REPORT_JOB.reads)
