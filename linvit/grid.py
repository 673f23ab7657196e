"""The experiment grid: which cells a config asks for, and where every file of a run lives.

Snakemake (workflow/rules/common.smk) and the report both read the grid and the paths from here, so
the DAG and the list of expected results can never disagree, and each path is spelled once. The
path functions take plain strings, so the rules pass Snakemake wildcards ("{size}") through them.

    results/data/<dataset>/                              shards and _info.json (rule shards)
    results/teacher/<size>/seed<t>/                      a softmax teacher the harness trains, one per
                                                         student seed by default (rule teacher)
    results/teacher/<size>/                              a pretrained teacher (rule teacher_pretrained,
                                                         config.teachers)
    results/teacher/<size>/seed<s>/                      or, where teachers.<size>.replicates lists several
                                                         checkpoints, seed s's (rule teacher_replicate)
    results/distill/<dataset>/<size>/<variant>/<init>/<design>/seed<s>/
                                                         stage 1: the student after distillation (rule distill)
    results/students/<dataset>/<size>/<variant>/<init>/<design>/steps<budget>/seed<s>/
                                                         stage 2: students and the softmax reference
                                                         (.../softmax/reference/none/...); softmax
                                                         control students: .../softmax/<init>/<design>/...
    results/logs/<rule>/...log, results/benchmarks/<rule>/...tsv   per job
    <a trained model's folder>/tb/                       its TensorBoard events (EVENTS; linvit.events)
    results/benchmark/attention.csv                      the operator benchmark (rule benchmark)
    results/decide/                                      a sequential run's state (linvit decide; decide_dir)
    results/runs.csv, results/curves.csv, report/...     the report (report_files)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .config import (CHECKPOINT, CHECKPOINTS, NO_DESIGN, REFERENCE_INIT, budgets, designs, kd_reference, teacher_design,
                     teacher_seed, trained_sizes)
from .registry import SOFTMAX

# The softmax reference runs the teacher's own attention; it is identified by its init (REFERENCE_INIT),
# never by this variant alone: `variants` may list softmax too, as a control (softmax students
# initialized by the same strategies as the linear ones), whose cells are students like any other.
REFERENCE_VARIANT = SOFTMAX
CONTROL_VARIANT = SOFTMAX  # the variant of the control students, when `variants` lists it
RESULTS = "results"
REPORT = "report"


@dataclass(frozen=True, order=True)
class Cell:
    """One trained model of the grid: a student (of a linear variant, or of softmax, the control), or
    the softmax reference (init 'reference', variant 'softmax').

    `design` is the distillation design of a distilling init strategy ('none' for the others and the
    reference); `budget` the student's training steps (stage 2), which the reference gets too.
    """

    dataset: str
    size: str
    variant: str
    init: str
    seed: int
    design: str
    budget: int

    @property
    def is_reference(self) -> bool:
        """The softmax reference: its init, not its variant (a softmax control student's is softmax too)."""
        return self.init == REFERENCE_INIT

    @property
    def is_control(self) -> bool:
        """A softmax student: the control of the softmax-to-linear transfer (`softmax` in `variants`)."""
        return self.variant == CONTROL_VARIANT and not self.is_reference

    @property
    def key(self) -> str:
        return run_key(self.dataset, self.size, self.variant, self.init, self.seed, self.design, self.budget)

    @property
    def rule(self) -> str:
        """The Snakemake rule that trains this cell."""
        return "reference" if self.is_reference else "student"

    def run_dir(self, results: str | Path = RESULTS) -> Path:
        return Path(run_dir(self.dataset, self.size, self.variant, self.init, self.seed, self.design, self.budget,
                            results))

    def log_path(self, results: str | Path = RESULTS, stage: str = "students") -> Path:
        """Log of this cell's job (stage 'students': the job trains and evaluates it)."""
        return Path(log_path(stage, self.key, results))

    def benchmark_path(self, stage: str = "students", results: str | Path = RESULTS) -> Path:
        """Benchmark TSV of this cell's job (stage 'students': the job trains and evaluates it)."""
        return Path(benchmark_path(stage, self.key, results))

    @property
    def distills(self) -> bool:
        return self.design != NO_DESIGN

    @property
    def distill_key(self) -> str:
        """The key of the distillation this cell starts from (only when it `distills`)."""
        return distill_key(self.dataset, self.size, self.variant, self.init, self.design, self.seed)

    def as_dict(self) -> dict:
        return {"dataset": self.dataset, "size": self.size, "variant": self.variant,
                "init": self.init, "design": self.design, "budget": self.budget, "seed": self.seed}


# Files of a trained model's folder (teacher, student, softmax reference).
MODEL_FILES = ("metrics.json", "model.json", "model.safetensors", "config.json", "train.jsonl")
# Files of a pretrained teacher's folder (loaded, not trained: no training log).
PRETRAINED_FILES = ("metrics.json", "model.json", "model.safetensors", "config.json")
# Files of a distillation folder: the whole student after stage 1 (a design may train more than its
# attention), which stage 2 starts from.
DISTILL_FILES = MODEL_FILES
# Files of a stage-2 folder (students and the softmax reference): a trained model's, plus every test
# image's prediction from the final evaluation (linvit.predictions), which the claims' statistics pair,
# and the evaluation the same job makes of the trained model (eval.json: fidelity, parameters, throughput).
STUDENT_FILES = (*MODEL_FILES, "predictions.npz", "eval.json")
# The subfolder of a trained model's folder (teacher, distillation, student, reference) where its
# TensorBoard event files go (linvit.events): never a declared output, so `tensorboard --logdir results/`
# shows every run of a grid while it trains.
EVENTS = "tb"


def run_key(dataset: str, size: str, variant: str, init: str, seed, design, budget) -> str:
    """A trained model's path below its rule's folder (students, logs, benchmarks)."""
    return f"{dataset}/{size}/{variant}/{init}/{design}/steps{budget}/seed{seed}"


def distill_key(dataset: str, size: str, variant: str, init: str, design: str, seed) -> str:
    """A distillation's path below its rule's folder (distill, logs, benchmarks). One per cell and
    design, shared by every budget: stage 1 does not depend on how long stage 2 trains."""
    return f"{dataset}/{size}/{variant}/{init}/{design}/seed{seed}"


def shards_dir(dataset: str, results: str | Path = RESULTS) -> str:
    return f"{results}/data/{dataset}"


def teacher_key(size: str, seed=None) -> str:
    """A teacher's path below its rule's folder (teacher, logs, benchmarks): `<size>/seed<t>` for a
    teacher the harness trains with seed t, `<size>` for a pretrained one (seed None)."""
    return str(size) if seed is None else f"{size}/seed{seed}"


def teacher_dir(size: str, seed=None, results: str | Path = RESULTS) -> str:
    return f"{results}/teacher/{teacher_key(size, seed)}"


def teacher_of(config: dict, size: str, seed, results: str | Path = RESULTS) -> str:
    """The folder of the teacher that student seed `seed` of `size` copies from (linvit.config.teacher_seed):
    its own teacher by default, the one teacher under `teacher.seed: <int>`, or the pretrained one."""
    return teacher_dir(size, teacher_seed(config, size, seed), results)


def teacher_rule(config: dict, size: str) -> str:
    """The rule that makes the teachers of `size`: `teacher` trains them, `teacher_pretrained` loads a
    pretrained checkpoint, `teacher_replicate` one of several (`teachers.<size>.replicates`, one per seed)."""
    design = teacher_design(config, size)
    return {CHECKPOINT: "teacher_pretrained", CHECKPOINTS: "teacher_replicate"}.get(design, "teacher")


def teacher_keys(config: dict) -> list[str]:
    """Every teacher the grid uses, as teacher_key: one per size and teacher seed, in seed order."""
    return list(dict.fromkeys(teacher_key(size, teacher_seed(config, size, seed))
                              for size, seed in _size_seeds(config)))


def _size_seeds(config: dict) -> list[tuple[str, int]]:
    """Every (size, seed) some cell trains: the configured seeds of every size, then the seeds a sequential
    look added (`added_seeds`), in seed order."""
    pairs = [(size, int(seed)) for size in config["sizes"] for seed in config["seeds"]]
    pairs += [(a["size"], int(seed)) for a in config.get("added_seeds") or [] for seed in a["seeds"]]
    return sorted(dict.fromkeys(pairs), key=lambda p: (config["sizes"].index(p[0]), p[1]))


def distill_dir(dataset: str, size: str, variant: str, init: str, design: str, seed,
                results: str | Path = RESULTS) -> str:
    return f"{results}/distill/{distill_key(dataset, size, variant, init, design, seed)}"


def run_dir(dataset: str, size: str, variant: str, init: str, seed, design, budget,
            results: str | Path = RESULTS) -> str:
    return f"{results}/students/{run_key(dataset, size, variant, init, seed, design, budget)}"


def log_path(rule: str, key: str, results: str | Path = RESULTS) -> str:
    """The log of one job: `key` is the job's path below its rule (a size, a cell key, ...)."""
    return f"{results}/logs/{rule}/{key}.log"


def benchmark_path(rule: str, key: str, results: str | Path = RESULTS) -> str:
    """Snakemake's benchmark TSV of one job (wall-clock s, max_rss MB, cpu_time, ...)."""
    return f"{results}/benchmarks/{rule}/{key}.tsv"


def decide_dir(results: str | Path = RESULTS) -> str:
    """The sequential driver's folder (linvit decide): state.json (the looks), look.yaml, driver.lock."""
    return f"{results}/decide"


def operator_benchmark_path(results: str | Path = RESULTS) -> str:
    """The operator benchmark's CSV (`linvit benchmark`, rule benchmark), which the report reads if it exists."""
    return f"{results}/benchmark/attention.csv"


# What the report (linvit/report/render.py) writes, and nothing else: the `report` rule declares
# exactly these as its outputs. Names under report/, then under results/.
REPORT_FILES = ("README.md", "summary.csv", "summary.md", "claims.json", "index.html")
REPORT_FIGURES = ("accuracy_by_init", "training_curves", "accuracy_by_budget", "fidelity_by_block", "attention_maps",
                  "gap_closed_heatmap", "cost_to_accuracy", "accuracy_vs_throughput", "claim_tests")
BENCHMARK_FIGURES = ("attention_scaling",)  # only when the operator benchmark's CSV exists
FIGURE_FORMATS = ("png", "svg")
RESULTS_TABLES = ("runs.csv", "curves.csv")


def report_files(with_benchmark: bool, report: str | Path = REPORT, results: str | Path = RESULTS) -> list[str]:
    """Every file the report writes: its README, tables, claims and figures, and results/{runs,curves}.csv.

    `with_benchmark`: whether the operator benchmark's CSV exists (then the scaling figure is drawn).
    """
    figures = REPORT_FIGURES + (BENCHMARK_FIGURES if with_benchmark else ())
    return ([f"{report}/{name}" for name in REPORT_FILES]
            + [f"{report}/figures/{fig}.{fmt}" for fig in figures for fmt in FIGURE_FORMATS]
            + [f"{results}/{name}" for name in RESULTS_TABLES])


def inits_of(config: dict, variant: str) -> list[str]:
    """The init strategies a variant's students take: `inits`, or for the softmax control
    `control_inits` where the config narrows it (the control needs only the strategies whose
    statistics it shows beside the linear variants)."""
    if variant == CONTROL_VARIANT and config.get("control_inits") is not None:
        return list(config["control_inits"])
    return list(config["inits"])


def student_cells(config: dict) -> list[Cell]:
    """Every (target dataset, size, variant, init strategy, design, budget, seed) the config asks for:
    a distilling init strategy once per design it takes (linvit.config.designs). A softmax variant
    gives the control students (their init a strategy's, never 'reference'), by `inits_of`."""
    cells = [Cell(d, s, v, i, int(seed), design, int(b))
             for d in config["targets"] for s in config["sizes"] for v in config["variants"]
             for i in inits_of(config, v) for design in designs(config, i) for b in budgets(config)
             for seed in config["seeds"]]
    return cells + [c for c in added_cells(config) if not c.is_reference]


def added_cells(config: dict) -> list[Cell]:
    """The runs a sequential look added (`added_seeds`, written by linvit decide): seeds beyond the
    configured ones, for the roles an undecided test still needs (students, and 'reference' runs)."""
    return [Cell(a["dataset"], a["size"], a["variant"], a["init"], int(seed), a["design"], int(a["budget"]))
            for a in config.get("added_seeds") or [] for seed in a["seeds"]]


def reference_cells(config: dict) -> list[Cell]:
    """The softmax reference per (target, size, budget, seed): the teacher trained on the target with
    the students' budget."""
    cells = [Cell(d, s, REFERENCE_VARIANT, REFERENCE_INIT, int(seed), NO_DESIGN, int(b))
             for d in config["targets"] for s in config["sizes"] for b in budgets(config)
             for seed in config["seeds"]]
    return cells + [c for c in added_cells(config) if c.is_reference]


def distill_cells(config: dict) -> list[Cell]:
    """One student cell per distillation the grid runs (the smallest budget stands for all)."""
    first = min(budgets(config))
    return [c for c in student_cells(config) if c.distills and c.budget == first]


def all_cells(config: dict) -> list[Cell]:
    return reference_cells(config) + student_cells(config)


@dataclass(frozen=True)
class Job:
    """One job of the workflow's DAG, as workflow/rules/*.smk declare it: its rule, its key (the path
    below the rule's log and benchmark folders), the files it writes, its log and Snakemake benchmark
    file, and the jobs whose outputs it reads (`needs`, as Job.name)."""

    rule: str
    key: str
    outputs: tuple[str, ...]
    log: str
    benchmark: str | None = None
    needs: tuple[str, ...] = ()
    cell: Cell | None = None

    @property
    def name(self) -> str:
        return f"{self.rule} {self.key}"


def jobs(config: dict, results: str | Path = RESULTS, report: str | Path = REPORT,
         with_benchmark: bool = False) -> list[Job]:
    """Every job `snakemake` runs for a config (but `all`), in an order where a job comes after those it
    needs: shards, teachers, distillations, softmax references, students (each evaluating its model),
    the report.
    `with_benchmark`: whether the operator benchmark's CSV exists (the report then draws one more
    figure). tests/test_workflow.py checks this list against the jobs a dry run plans."""
    trained = trained_sizes(config)
    teacher_data = [config["teacher"]["dataset"]] if trained else []
    datasets = list(dict.fromkeys([*config["targets"], *teacher_data]))
    shards = {d: Job("shards", d, (shards_dir(d, results),), log_path("shards", d, results)) for d in datasets}
    out = list(shards.values())
    teachers = {}
    for size, seed in _size_seeds(config):
        t = teacher_seed(config, size, seed)
        key = teacher_key(size, t)
        if key not in teachers:
            loaded = size not in trained  # a pretrained checkpoint: no training files, no shards read
            teachers[key] = Job(teacher_rule(config, size), key,
                                _files(teacher_dir(size, t, results), PRETRAINED_FILES if loaded else MODEL_FILES),
                                log_path("teacher", key, results), benchmark_path("teacher", key, results),
                                () if loaded else (shards[teacher_data[0]].name,))
    out += teachers.values()

    def inputs(cell: Cell) -> tuple[str, ...]:  # shards and the teacher every cell's jobs read
        return shards[cell.dataset].name, teachers[teacher_key(cell.size, teacher_seed(config, cell.size,
                                                                                      cell.seed))].name

    distills = {}
    for c in distill_cells(config):
        distills[c.distill_key] = Job("distill", c.distill_key, _files(
            distill_dir(c.dataset, c.size, c.variant, c.init, c.design, c.seed, results), DISTILL_FILES),
            log_path("distill", c.distill_key, results), benchmark_path("distill", c.distill_key, results),
            inputs(c), c)
    out += distills.values()
    trains = {}
    for c in all_cells(config):  # the references first: a student of logit losses may read one
        needs = inputs(c)
        if c.distills:
            needs += (distills[c.distill_key].name,)
        if not c.is_reference and kd_reference(config, c.init, c.dataset, c.size):
            reference = Cell(c.dataset, c.size, REFERENCE_VARIANT, REFERENCE_INIT, c.seed, NO_DESIGN, c.budget)
            needs += (trains[reference.key].name,)
        trains[c.key] = Job(c.rule, c.key, _files(c.run_dir(results), STUDENT_FILES), str(c.log_path(results)),
                            str(c.benchmark_path("students", results)), needs, c)
    out += trains.values()
    # The report reads every training job's files (eval.json among a stage-2 job's) and benchmark.
    read = [*teachers.values(), *distills.values(), *trains.values()]
    out.append(Job("report", "all", tuple(report_files(with_benchmark, report, results)),
                   log_path("report", "all", results), None, tuple(job.name for job in read)))
    return out


def _files(folder: str | Path, names) -> tuple[str, ...]:
    return tuple(f"{folder}/{name}" for name in names)
