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

import os
from dataclasses import dataclass
from pathlib import Path

from .config import (CHECKPOINT, CHECKPOINTS, NO_DESIGN, REFERENCE_INIT, budgets, checkpoint, designs, grid_cells,
                     kd_reference, teacher_design, teacher_seed, trained_sizes)
from .figure_registry import FIGURE_FORMATS, figure_names
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
# The figures are linvit.figure_registry's, each report/figures/<name>.<format> for FIGURE_FORMATS.
REPORT_FILES = ("README.md", "summary.csv", "summary.md", "claims.json", "index.html")
RESULTS_TABLES = ("runs.csv", "curves.csv")


def report_files(with_benchmark: bool, report: str | Path = REPORT, results: str | Path = RESULTS) -> list[str]:
    """Every file the report writes: its README, tables, claims and figures, and results/{runs,curves}.csv.

    `with_benchmark`: whether the operator benchmark's CSV exists (then its figures are drawn too).
    """
    return ([f"{report}/{name}" for name in REPORT_FILES]
            + [f"{report}/figures/{fig}.{fmt}" for fig in figure_names(with_benchmark) for fmt in FIGURE_FORMATS]
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
    listed = grid_cells(config)
    cells = [Cell(d, s, v, i, int(seed), design, int(b))
             for d in config["targets"] for s in config["sizes"] for v in config["variants"]
             for i in inits_of(config, v) for design in designs(config, i) for b in budgets(config)
             for seed in config["seeds"] if (d, s, v, int(b)) in listed]
    return cells + [c for c in added_cells(config) if not c.is_reference]


def added_cells(config: dict) -> list[Cell]:
    """The runs a sequential look added (`added_seeds`, written by linvit decide): seeds beyond the
    configured ones, for the roles an undecided test still needs (students, and 'reference' runs)."""
    return [Cell(a["dataset"], a["size"], a["variant"], a["init"], int(seed), a["design"], int(a["budget"]))
            for a in config.get("added_seeds") or [] for seed in a["seeds"]]


def reference_cells(config: dict) -> list[Cell]:
    """The softmax reference per (target, size, budget, seed): the teacher trained on the target with
    the students' budget."""
    used = {(d, s, b) for d, s, _, b in grid_cells(config)}
    cells = [Cell(d, s, REFERENCE_VARIANT, REFERENCE_INIT, int(seed), NO_DESIGN, int(b))
             for d in config["targets"] for s in config["sizes"] for b in budgets(config)
             for seed in config["seeds"] if (d, s, int(b)) in used]
    return cells + [c for c in added_cells(config) if c.is_reference]


def distill_cells(config: dict) -> list[Cell]:
    """One student cell per distillation the grid runs (its cell's smallest budget stands for all)."""
    first: dict[tuple, int] = {}
    for d, s, v, b in grid_cells(config):
        first[d, s, v] = min(b, first.get((d, s, v), b))
    return [c for c in student_cells(config) if c.distills and c.budget == first[c.dataset, c.size, c.variant]]


def all_cells(config: dict) -> list[Cell]:
    return reference_cells(config) + student_cells(config)


@dataclass(frozen=True)
class Job:
    """One job of the workflow's DAG, as workflow/rules/*.smk declare it: its rule, its key (the path
    below the rule's log and benchmark folders), the files it writes, its log and Snakemake benchmark
    file, the jobs whose outputs it reads (`needs`, as Job.name), the cell it trains (if any), the
    folder it writes into (`folder`) and every file it reads (`reads`: its declared inputs, the files
    of the jobs it needs and a pretrained teacher's weights file; the rules take theirs from here or
    spell the same paths, and tests/test_workflow.py checks both against Snakemake's plan)."""

    rule: str
    key: str
    outputs: tuple[str, ...]
    log: str
    benchmark: str | None = None
    needs: tuple[str, ...] = ()
    cell: Cell | None = None
    folder: str = ""
    reads: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.rule} {self.key}"

    @property
    def evaluates(self) -> bool:
        """The job that trains and evaluates its cell (stage 2: a student or the softmax reference),
        not a distillation the cell starts from."""
        return self.cell is not None and self.rule == self.cell.rule


# The folder of a rule's logs and benchmarks below results/logs/ and results/benchmarks/, where it is not the
# rule's name: every teacher's is teacher/, and the students share theirs with the softmax references.
LOG_FOLDERS = {"teacher_pretrained": "teacher", "teacher_replicate": "teacher", "student": "students",
               "reference": "students"}


def jobs(config: dict, results: str | Path = RESULTS, report: str | Path = REPORT,
         with_benchmark: bool = False) -> list[Job]:
    """Every job `snakemake` runs for a config (but `all`), in an order where a job comes after those it
    needs: shards, teachers, distillations, softmax references, students (each evaluating its model),
    the report. This is the workflow's one list of jobs: the report rule's inputs (common.smk), the
    report's reasons for a missing cell (report.aggregate.failure), the benchmark and result folders
    (aggregate.benchmark_jobs, bench) and `linvit status` are read from it.
    `with_benchmark`: whether the operator benchmark's CSV exists (the report then reads it and draws
    one more figure). tests/test_workflow.py checks this list against the jobs a dry run plans."""
    trained = trained_sizes(config)
    teacher_data = [config["teacher"]["dataset"]] if trained else []
    datasets = list(dict.fromkeys([*config["targets"], *teacher_data]))
    made_by: dict[str, str] = {}  # every declared output -> the name of the job that writes it
    out: list[Job] = []

    def add(rule, key, folder, outputs, benchmark=None, reads=(), cell=None) -> Job:
        log = log_path(LOG_FOLDERS.get(rule, rule), key, results)
        needs = tuple(dict.fromkeys(made_by[path] for path in reads if path in made_by))
        job = Job(rule, key, tuple(outputs), log, benchmark, needs, cell, str(folder), tuple(reads))
        made_by.update((path, job.name) for path in (*job.outputs, *([benchmark] if benchmark else [])))
        out.append(job)
        return job

    shards = {d: add("shards", d, shards_dir(d, results), (shards_dir(d, results),)) for d in datasets}
    teachers = {}
    for size, seed in _size_seeds(config):
        t = teacher_seed(config, size, seed)
        key = teacher_key(size, t)
        if key in teachers:
            continue
        folder = teacher_dir(size, t, results)
        if size in trained:
            reads = (shards[teacher_data[0]].folder,)
        else:  # a pretrained checkpoint: no training files, no shards read; its weights file if it names one
            file = checkpoint(config, size, t).get("file")
            reads = (os.path.expanduser(file),) if file else ()
        teachers[key] = add(teacher_rule(config, size), key, folder,
                            _files(folder, MODEL_FILES if size in trained else PRETRAINED_FILES),
                            benchmark_path("teacher", key, results), reads)

    def inputs(cell: Cell) -> tuple[str, ...]:  # what every job of a cell reads: its shards and its teacher
        teacher = teacher_dir(cell.size, teacher_seed(config, cell.size, cell.seed), results)
        return shards[cell.dataset].folder, f"{teacher}/model.json", f"{teacher}/model.safetensors"

    distills = {}
    for c in distill_cells(config):
        folder = distill_dir(c.dataset, c.size, c.variant, c.init, c.design, c.seed, results)
        distills[c.distill_key] = add("distill", c.distill_key, folder, _files(folder, DISTILL_FILES),
                                      benchmark_path("distill", c.distill_key, results), inputs(c), c)
    trains = {}
    for c in all_cells(config):  # the references first: a student of logit losses may read one
        reads = inputs(c)
        if c.distills:  # stage 2 starts from the whole distilled student
            reads += _files(distills[c.distill_key].folder, ("metrics.json", "model.json", "model.safetensors"))
        if not c.is_reference and kd_reference(config, c.init, c.dataset, c.size):  # its logit teacher
            reference = Cell(c.dataset, c.size, REFERENCE_VARIANT, REFERENCE_INIT, c.seed, NO_DESIGN, c.budget)
            reads += _files(trains[reference.key].folder, ("metrics.json", "model.json", "model.safetensors"))
        trains[c.key] = add(c.rule, c.key, c.run_dir(results), _files(c.run_dir(results), STUDENT_FILES),
                            benchmark_path("students", c.key, results), reads, c)
    add("report", "all", report, report_files(with_benchmark, report, results),
        reads=report_reads(config, teachers.values(), distills.values(), trains.values(), results, with_benchmark))
    return out


# What the report reads of a stage-2 job's folder (linvit.report.aggregate): metrics, the training log
# (curves), the evaluation, the per-image predictions (the claims' statistics); of a trained teacher's,
# its metrics (the scale section).
REPORT_READS = ("metrics.json", "train.jsonl", "eval.json", "predictions.npz")


def report_reads(config: dict, teachers, distills, trains, results: str | Path = RESULTS,
                 with_benchmark: bool = False) -> tuple[str, ...]:
    """Every file the report reads that a job writes, and so every input of the `report` rule: each cell's
    REPORT_READS, every training job's benchmark TSV (the cost section), the trained teachers' metrics,
    the targets' shards (their sizes: the scale section) and the operator benchmark's CSV if it exists.
    Logs are read only for a missing cell, which the report rule never sees (it waits for every cell)."""
    reads = [shards_dir(d, results) for d in config["targets"]]
    for job in teachers:
        if job.rule == "teacher":
            reads.append(f"{job.folder}/metrics.json")
        reads.append(job.benchmark)
    reads += [job.benchmark for job in distills]
    for job in trains:
        reads += [*_files(job.folder, REPORT_READS), job.benchmark]
    if with_benchmark:
        reads.append(operator_benchmark_path(results))
    return tuple(reads)


def _files(folder: str | Path, names) -> tuple[str, ...]:
    return tuple(f"{folder}/{name}" for name in names)
