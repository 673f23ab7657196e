"""The experiment grid: which cells a config asks for, and where each cell's files live.

Snakemake (workflow/rules/common.smk) and the report both read the grid from here, so the DAG and
the list of expected results can never disagree.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .registry import SOFTMAX

REFERENCE_VARIANT = SOFTMAX  # the softmax reference runs the teacher's own attention
REFERENCE_INIT = "reference"


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
        return f"{self.dataset}/{self.size}/{self.variant}/{self.init}/seed{self.seed}"

    def run_dir(self, results: str | Path = "results") -> Path:
        return Path(results) / "students" / self.key

    def log_path(self, results: str | Path = "results") -> Path:
        return Path(results) / "logs" / "students" / f"{self.key}.log"

    def as_dict(self) -> dict:
        return {"dataset": self.dataset, "size": self.size, "variant": self.variant,
                "init": self.init, "seed": self.seed}


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
