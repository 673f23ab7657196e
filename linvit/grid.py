"""The experiment grid: which cells a config asks for, and where every file of a run lives.

Snakemake (workflow/rules/common.smk) and the report both read the grid and the paths from here, so
the DAG and the list of expected results can never disagree, and each path is spelled once. The
path functions take plain strings, so the rules pass Snakemake wildcards ("{size}") through them.

    results/data/<dataset>/                              shards and _info.json (rule shards)
    results/teacher/<size>/                              the softmax teacher (rule teacher, or
                                                         teacher_pretrained for config.teachers)
    results/distill/<dataset>/<size>/<variant>/seed<s>/  distilled attention (rule distill)
    results/students/<dataset>/<size>/<variant>/<init>/seed<s>/   students and the softmax reference
    results/logs/<rule>/...log, results/benchmarks/<rule>/...tsv   per job
    results/benchmark/attention.csv                      the operator benchmark (rule benchmark)
    results/runs.csv, results/curves.csv, report/...     the report (report_files)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .config import REFERENCE_INIT
from .registry import SOFTMAX

REFERENCE_VARIANT = SOFTMAX  # the softmax reference runs the teacher's own attention
RESULTS = "results"
REPORT = "report"


@dataclass(frozen=True, order=True)
class Cell:
    """One trained model of the grid: a linear student, or the softmax reference (variant 'softmax')."""

    dataset: str
    size: str
    variant: str
    init: str
    seed: int

    @property
    def is_reference(self) -> bool:
        return self.variant == REFERENCE_VARIANT

    @property
    def key(self) -> str:
        return run_key(self.dataset, self.size, self.variant, self.init, self.seed)

    @property
    def rule(self) -> str:
        """The Snakemake rule that trains this cell."""
        return "reference" if self.is_reference else "student"

    def run_dir(self, results: str | Path = RESULTS) -> Path:
        return Path(run_dir(self.dataset, self.size, self.variant, self.init, self.seed, results))

    def log_path(self, results: str | Path = RESULTS, stage: str = "students") -> Path:
        """Log of this cell's training ('students') or evaluation ('evaluate') job."""
        return Path(log_path(stage, self.key, results))

    def benchmark_path(self, stage: str = "students", results: str | Path = RESULTS) -> Path:
        """Benchmark TSV of this cell's training ('students') or evaluation ('evaluate') job."""
        return Path(benchmark_path(stage, self.key, results))

    def as_dict(self) -> dict:
        return {"dataset": self.dataset, "size": self.size, "variant": self.variant,
                "init": self.init, "seed": self.seed}


# Files of a trained model's folder (teacher, student, softmax reference).
MODEL_FILES = ("metrics.json", "model.json", "model.safetensors", "config.json", "train.jsonl")
# Files of a pretrained teacher's folder (loaded, not trained: no training log).
PRETRAINED_FILES = ("metrics.json", "model.json", "model.safetensors", "config.json")
# Files of a distillation folder.
DISTILL_FILES = ("metrics.json", "attention.safetensors", "config.json", "train.jsonl")


def run_key(dataset: str, size: str, variant: str, init: str, seed) -> str:
    """A trained model's path below its rule's folder (students, logs, benchmarks)."""
    return f"{dataset}/{size}/{variant}/{init}/seed{seed}"


def distill_key(dataset: str, size: str, variant: str, seed) -> str:
    """A distillation's path below its rule's folder (distill, logs, benchmarks)."""
    return f"{dataset}/{size}/{variant}/seed{seed}"


def shards_dir(dataset: str, results: str | Path = RESULTS) -> str:
    return f"{results}/data/{dataset}"


def teacher_dir(size: str, results: str | Path = RESULTS) -> str:
    return f"{results}/teacher/{size}"


def distill_dir(dataset: str, size: str, variant: str, seed, results: str | Path = RESULTS) -> str:
    return f"{results}/distill/{distill_key(dataset, size, variant, seed)}"


def run_dir(dataset: str, size: str, variant: str, init: str, seed, results: str | Path = RESULTS) -> str:
    return f"{results}/students/{run_key(dataset, size, variant, init, seed)}"


def log_path(rule: str, key: str, results: str | Path = RESULTS) -> str:
    """The log of one job: `key` is the job's path below its rule (a size, a cell key, ...)."""
    return f"{results}/logs/{rule}/{key}.log"


def benchmark_path(rule: str, key: str, results: str | Path = RESULTS) -> str:
    """Snakemake's benchmark TSV of one job (wall-clock s, max_rss MB, cpu_time, ...)."""
    return f"{results}/benchmarks/{rule}/{key}.tsv"


def operator_benchmark_path(results: str | Path = RESULTS) -> str:
    """The operator benchmark's CSV (`linvit benchmark`, rule benchmark), which the report reads if it exists."""
    return f"{results}/benchmark/attention.csv"


# What the report (linvit/report/render.py) writes, and nothing else: the `report` rule declares
# exactly these as its outputs. Names under report/, then under results/.
REPORT_FILES = ("README.md", "summary.csv", "summary.md", "claims.json")
REPORT_FIGURES = ("accuracy_by_init", "training_curves", "accuracy_by_budget", "fidelity_by_block", "attention_maps")
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


def student_cells(config: dict) -> list[Cell]:
    """Every (target dataset, size, linear variant, init strategy, seed) the config asks for."""
    return [Cell(d, s, v, i, int(seed))
            for d in config["targets"] for s in config["sizes"] for v in config["variants"]
            for i in config["inits"] for seed in config["seeds"]]


def reference_cells(config: dict) -> list[Cell]:
    """The softmax reference per (target, size, seed): the teacher trained on the target with the students' budget."""
    return [Cell(d, s, REFERENCE_VARIANT, REFERENCE_INIT, int(seed))
            for d in config["targets"] for s in config["sizes"] for seed in config["seeds"]]


def all_cells(config: dict) -> list[Cell]:
    return reference_cells(config) + student_cells(config)
