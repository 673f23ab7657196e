"""The Decisions section's cost: the jobs and CPU-hours (and GPU-hours where recorded) of a sequential run's
looks so far, per job kind, against a fixed design at the cap (every role of every cell with the cap's seeds
from the start), each kind costed at its measured mean. A grid that lists its cells (`cells:`) is also set
against the full product of its axes at the cap, at the same means: what one axis at a time saved besides the
looks. Numbers in `spending`, words in `cost`."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from linvit.config import seed_sequence
from linvit.grid import jobs as grid_jobs
from linvit.report.aggregate import COST_RULES

GPU_COLUMN = "gpu_time"  # seconds, by analogy with cpu_time; Snakemake's benchmark files have none today


@dataclass
class KindCost:
    """One job kind (teacher, distill, student, reference): the grid's jobs so far and a fixed grid's at the cap."""

    kind: str
    jobs: int
    benchmarked: int
    cpu_s: float  # measured, summed over the benchmarked jobs
    cpu_mean_s: float  # per benchmarked job
    fixed_jobs: int
    product_jobs: int | None = None  # the full product of the axes at the cap (a grid with `cells:`); else None

    @property
    def cpu_spent_s(self) -> float:
        """Measured, the jobs without a benchmark file counted at the kind's mean (NaN: none measured)."""
        missing = self.jobs - self.benchmarked
        return (self.cpu_s if self.benchmarked else 0.0) + (missing * self.cpu_mean_s if missing else 0.0)

    @property
    def cpu_fixed_s(self) -> float:
        return self.fixed_jobs * self.cpu_mean_s if self.fixed_jobs else 0.0

    @property
    def cpu_product_s(self) -> float:
        return self.product_jobs * self.cpu_mean_s if self.product_jobs else 0.0


@dataclass
class Spending:
    kinds: list[KindCost]
    cap_seeds: int
    gpu_s: float | None = None  # None: no benchmark file has a GPU column
    gpu_fixed_s: float | None = None
    gpu_product_s: float | None = None  # the full product's, where `listed` and GPU time is recorded

    @property
    def listed(self) -> bool:
        """The grid lists its cells: the full product at the cap is costed beside the fixed design."""
        return any(k.product_jobs is not None for k in self.kinds)

    @property
    def product_jobs(self) -> int:
        return sum(k.product_jobs or 0 for k in self.kinds)

    @property
    def cpu_product_s(self) -> float:
        return math.fsum(k.cpu_product_s for k in self.kinds)

    @property
    def jobs(self) -> int:
        return sum(k.jobs for k in self.kinds)

    @property
    def fixed_jobs(self) -> int:
        return sum(k.fixed_jobs for k in self.kinds)

    @property
    def benchmarked(self) -> int:
        return sum(k.benchmarked for k in self.kinds)

    @property
    def cpu_s(self) -> float:
        return math.fsum(k.cpu_spent_s for k in self.kinds)

    @property
    def cpu_fixed_s(self) -> float:
        return math.fsum(k.cpu_fixed_s for k in self.kinds)


def _kind(rule: str) -> str:
    return "teacher" if rule.startswith("teacher") else rule


def spending(config: dict, jobs: pd.DataFrame, cap: int) -> Spending:
    """The grid's jobs so far (config with its added seeds) per kind, with their measured CPU, against a fixed
    grid of every role at the cap's seeds (grid.jobs of the config without a plan's added seeds), each kind
    costed at its measured mean; a grid with `cells:` also against the full product of its axes at the cap
    (the same config without `cells`), at the same means."""
    fixed = {k: v for k, v in config.items() if k != "added_seeds"}
    fixed["seeds"] = seed_sequence(config, cap)
    counts = _job_counts(fixed)
    product = None if config.get("cells") is None else _job_counts({k: v for k, v in fixed.items() if k != "cells"})
    kinds = []
    for kind in COST_RULES:
        rows = jobs[jobs["rule"] == kind]
        cpu = pd.to_numeric(rows["cpu_time_s"], errors="coerce").dropna()
        if len(rows) or counts.get(kind, 0) or (product is not None and product.get(kind, 0)):
            kinds.append(KindCost(kind, len(rows), len(cpu), float(cpu.sum()),
                                  float(cpu.mean()) if len(cpu) else math.nan, int(counts.get(kind, 0)),
                                  None if product is None else int(product.get(kind, 0))))
    out = Spending(kinds, cap)
    gpu = _gpu_seconds(jobs)
    if gpu is not None:
        spent, means = gpu
        out.gpu_s = math.fsum(spent.values())
        out.gpu_fixed_s = math.fsum(k.fixed_jobs * means.get(k.kind, math.nan) for k in kinds if k.fixed_jobs)
        if out.listed:
            out.gpu_product_s = math.fsum(k.product_jobs * means.get(k.kind, math.nan) for k in kinds
                                          if k.product_jobs)
    return out


def _job_counts(config: dict) -> pd.Series:
    """The training jobs (those with a benchmark file) of grid.jobs(config) per kind."""
    return pd.Series([_kind(j.rule) for j in grid_jobs(config) if j.benchmark is not None]).value_counts()


def _gpu_seconds(jobs: pd.DataFrame) -> tuple[dict, dict] | None:
    """GPU seconds per kind (summed, and mean per benchmarked job) from the benchmark files' GPU_COLUMN, a file
    without it counting 0; None when no file has it."""
    values: dict[str, list[float]] = {}
    found = False
    for row in jobs.itertuples():
        path = Path(row.path)
        if not path.exists():
            continue
        try:
            frame = pd.read_csv(path, sep="\t")
        except (OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError):
            continue  # the cost table names unreadable files
        value = pd.to_numeric(frame[GPU_COLUMN], errors="coerce").mean() if GPU_COLUMN in frame else math.nan
        found = found or not math.isnan(value)
        values.setdefault(row.rule, []).append(0.0 if math.isnan(value) else float(value))
    if not found:
        return None
    return ({k: math.fsum(v) for k, v in values.items()}, {k: math.fsum(v) / len(v) for k, v in values.items()})


def _hours(seconds: float) -> str:
    """CPU-hours: two decimals from an hour on, three significant digits below (a small grid's minutes)."""
    if seconds is None or math.isnan(seconds):
        return "n/a"
    hours = seconds / 3600
    return f"{hours:,.2f}" if hours >= 1 else f"{hours:.3g}"


def cost(s: Spending) -> str:
    listed = s.listed  # a grid with `cells:`: the full product at the cap in two more columns and in each sentence
    table = ["| job kind | jobs so far | benchmarked | CPU-hours so far | CPU-hours per job | jobs fixed at the cap | "
             "CPU-hours fixed at the cap (est.) |" + (" jobs, full product at the cap | CPU-hours, full product at the "
                                                     "cap (est.) |" if listed else ""),
             "|---|---|---|---|---|---|---|" + ("---|---|" if listed else "")]
    for k in s.kinds:
        table.append(f"| {k.kind} | {k.jobs} | {k.benchmarked} | {_hours(k.cpu_spent_s)} | {_hours(k.cpu_mean_s)} | "
                     f"{k.fixed_jobs} | {_hours(k.cpu_fixed_s)} |"
                     + (f" {k.product_jobs} | {_hours(k.cpu_product_s)} |" if listed else ""))
    table.append(f"| total | {s.jobs} | {s.benchmarked} | {_hours(s.cpu_s)} | | {s.fixed_jobs} | "
                 f"{_hours(s.cpu_fixed_s)} |" + (f" {s.product_jobs} | {_hours(s.cpu_product_s)} |" if listed else ""))
    if s.benchmarked == 0:
        cpu = ("No benchmark files under results/benchmarks/ (the runs were not made by Snakemake, or not yet): no "
               "CPU-hours to compare.")
    else:
        cpu = f"CPU-hours: {_hours(s.cpu_s)} so far " + _against(s.cpu_s, s.cpu_fixed_s, s.cpu_product_s, listed,
                                                                  _hours) + "."
    gpu = ("GPU-hours: not recorded (the benchmark files have no GPU column; Snakemake's record none)."
           if s.gpu_s is None else
           f"GPU-hours: {_hours(s.gpu_s)} so far against {_hours(s.gpu_fixed_s)} for the fixed design "
           f"(`{GPU_COLUMN}` of the benchmark files), a saving of {_saving(s.gpu_s, s.gpu_fixed_s)}."
           if not listed else
           f"GPU-hours (`{GPU_COLUMN}` of the benchmark files): {_hours(s.gpu_s)} so far "
           + _against(s.gpu_s, s.gpu_fixed_s, s.gpu_product_s, listed, _hours) + ".")
    product = (" The grid lists its cells (`cells:`): the full product of its axes at the cap (`linvit.grid.jobs` of "
               "the config without `cells`: every combination of the axes, every role, the cap's seeds) is costed "
               "too, each kind at the same measured mean per job; its saving is what the sequential plan and the "
               "cells listed save together." if listed else "")
    return (f"The jobs of the looks so far (the grid with its added seeds) against a fixed design at the cap: every "
            f"role of every cell with {s.cap_seeds} seeds from the start (`linvit.grid.jobs` of the config with "
            f"`seeds` at the cap's and no added seeds). Training jobs only (teacher, distill, student, reference: the "
            f"ones with a Snakemake benchmark file); CPU time is the benchmark files' `cpu_time` (a lower bound, as in "
            f"Cost), a job without a file counted at its kind's measured mean; the fixed design's CPU is each kind's "
            f"measured mean per job times its jobs at the cap.{product}\n\n" + "\n".join(table)
            + f"\n\nJobs: {s.jobs} so far " + _against(s.jobs, s.fixed_jobs, s.product_jobs, listed, str) + ". "
            + cpu + " " + gpu)


def _against(spent: float, fixed: float, product: float | None, listed: bool, shown) -> str:
    """'against 162 for the fixed design, a saving of 43%'; for a grid with `cells:`, the fixed design of the same
    cells and the full product at the cap, each with its saving."""
    if not listed:
        return f"against {shown(fixed)} for the fixed design, a saving of {_saving(spent, fixed)}"
    return (f"against {shown(fixed)} for the fixed design of the same cells, a saving of {_saving(spent, fixed)}, and "
            f"{shown(product)} for the full product at the cap, a saving of {_saving(spent, product)}")


def _saving(spent: float, fixed: float) -> str:
    if fixed is None or math.isnan(fixed) or fixed <= 0 or math.isnan(spent):
        return "n/a"
    return f"{100 * (1 - spent / fixed):.0f}%"
