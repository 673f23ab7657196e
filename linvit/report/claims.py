"""Turn the runs table into per-seed statistics, gap closed, and a verdict for each claim C1-C4.

Every verdict is computed from the grid's own numbers and names them, whichever way they fall:
a claim that does not reproduce is a result. Only runs with status "ok" count; a verdict that needs
a strategy the grid lacks, or whose results are missing, says "not evaluable" and why.

A claim cell is (dataset, size, variant, budget): students are compared with the random role and the
softmax reference trained with the same budget (stage-2 steps), and each claim gets a verdict per
budget as well as overall.

The claims compare roles, and a role is defined by what a strategy copies from the teacher, not by
its name (an init strategy is added or renamed in the config with no code changes):

    random            copies nothing, no distillation
    copy_all          copies embed, attn, mlp, norm, head, no distillation
    copy_mlp          copies embed, mlp, norm, head (all but attn), no distillation
    attn_only         copies attn, no distillation
    mlp_only          copies mlp, no distillation
    copy_mlp_distill  copies embed, mlp, norm, head, attention distilled

and every role trains on the task loss alone: a strategy with `train_losses` (logit KD, attention
transfer) or a `task_weight` other than 1 is a baseline of its own, never a role (a random student
with logit KD is not "random"). A distilling role is compared at its strategy's primary design: the
design it names (`distill: <design>`), else the first of `distills`.

Each cell's verdict is statistical (linvit.report.stats): a paired bootstrap over seeds and test
images gives the claim's statistic an interval, and the cell "holds" when the interval clears the
threshold on the claim's side, "fails" when it clears the other side, and is "inconclusive" when it
straddles it. A claim is "supported" when every evaluable cell holds, "not supported" when every one
fails, else "mixed" (with the counts) or "inconclusive".

`resolve_roles` finds, among the grid's `inits`, the strategy whose `init_strategies` entry has each
content (`attn_extra` in a copy list is ignored: it is never copied). Several strategies with the same
content: the first in `inits` fills the role, and the report names the others.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np
import pandas as pd

from linvit.config import NO_DESIGN, budgets, design_names, design_specs
from linvit.grid import REFERENCE_INIT, REFERENCE_VARIANT
from linvit.groups import GROUPS
from linvit.report import stats
from linvit.report.stats import FAILS, HOLDS, INCONCLUSIVE, PairingError


@dataclass(frozen=True)
class Role:
    """What the claims compare: a set of copied parameter groups and whether attention is distilled;
    every role trains on the task loss alone (no `train_losses`, task_weight 1)."""

    name: str
    copy: frozenset
    distill: bool

    @property
    def content(self) -> str:
        groups = ", ".join(g for g in GROUPS if g in self.copy) or "nothing"
        return f"copies {groups}; {'attention distilled' if self.distill else 'no distillation'}; task loss only"


_COPYABLE = frozenset({"embed", "attn", "mlp", "norm", "head"})
ROLES = {role.name: role for role in (
    Role("random", frozenset(), False),
    Role("copy_all", _COPYABLE, False),
    Role("copy_mlp", _COPYABLE - {"attn"}, False),
    Role("attn_only", frozenset({"attn"}), False),
    Role("mlp_only", frozenset({"mlp"}), False),
    Role("copy_mlp_distill", _COPYABLE - {"attn"}, True),
)}
RANDOM, COPY_ALL, COPY_MLP, ATTN_ONLY, MLP_ONLY, COPY_MLP_DISTILL = ROLES
# The roles each claim compares (C4 combines C1-C3).
CLAIM_ROLES = {"C1": [RANDOM, COPY_ALL, COPY_MLP, ATTN_ONLY], "C2": [RANDOM, COPY_ALL, COPY_MLP, MLP_ONLY],
               "C3": [COPY_MLP_DISTILL, RANDOM]}
# Roles without which a claim cannot be evaluated at all (the others only add a reported number).
REQUIRED_ROLES = {"C1": [RANDOM, COPY_ALL, COPY_MLP, ATTN_ONLY], "C2": [RANDOM, COPY_ALL, COPY_MLP],
                  "C3": [COPY_MLP_DISTILL]}


@dataclass(frozen=True)
class RoleMatch:
    """Which strategy of the grid fills a role (None when none does), and at which design."""

    role: Role
    strategy: str | None
    duplicates: tuple[str, ...] = ()    # further strategies in inits with the same content, not used
    outside_grid: tuple[str, ...] = ()  # strategies with the content that are defined but not in inits
    # The design the claims use: 'none' for a role that does not distill; for a distilling one the
    # strategy's primary design (None when the config gives it none).
    design: str | None = NO_DESIGN
    trains_more: tuple[str, ...] = ()   # strategies in inits that copy and distill alike but add training losses

    @property
    def label(self) -> str:
        """The user's strategy name, with the role when the two differ: 'baseline (as random)'; a
        distilling role adds its design: 'copy_mlp_distill (design map_ce)'."""
        notes = [] if self.strategy is None or self.strategy == self.role.name else [f"as {self.role.name}"]
        if self.strategy is not None and self.design not in (None, NO_DESIGN):
            notes.append(f"design {self.design}")
        name = self.role.name if self.strategy is None else self.strategy
        return f"{name} ({', '.join(notes)})" if notes else name

    @property
    def key(self) -> tuple[str, str] | None:
        """(init, design) of the runs that stand for the role, None when the grid has none."""
        return None if self.strategy is None or self.design is None else (self.strategy, self.design)

    def absent(self) -> str:
        """'attn_only (copies attn; no distillation; task loss only; `attn_only` is defined but not in inits)'."""
        hint = "".join(f"; `{n}` is defined but not in inits" for n in self.outside_grid)
        return f"{self.role.name} ({self.role.content}{hint})"


def strategy_content(spec: dict) -> tuple[frozenset, bool, bool]:
    """(copied groups, distills, trains on the task loss alone) of an init_strategies entry; attn_extra
    is never copied, so it is dropped. `distill` may be a design's name (a fixed design): it distills."""
    copy = frozenset(g for g in (spec.get("copy") or []) if g != "attn_extra")
    plain = not spec.get("train_losses") and spec.get("task_weight", 1) in (None, 1)
    return copy, bool(spec.get("distill", False)), plain


def primary_design(config: dict, spec: dict) -> str | None:
    """The design the claims use for a strategy: 'none' when it does not distill, the design it names,
    else the first of `distills` (linvit.config.design_names); None when the config gives none."""
    distill = spec.get("distill", False)
    if isinstance(distill, str):
        return distill
    if not distill:
        return NO_DESIGN
    names = design_names(config)
    return names[0] if names else None


def strategy_designs(config: dict, spec: dict) -> list[str]:
    """Every design a strategy runs with (linvit.config.designs, from its entry)."""
    distill = spec.get("distill", False)
    if isinstance(distill, str):
        return [distill]
    return design_names(config) if distill else [NO_DESIGN]


def is_baseline(spec: dict) -> bool:
    """A literature baseline: a strategy that adds training losses (or reweighs the task's), which
    never fills a role, or that names one fixed distillation design."""
    return not strategy_content(spec)[2] or isinstance(spec.get("distill"), str)


def resolve_roles(config: dict) -> dict[str, RoleMatch]:
    """Each role -> the strategy among the config's `inits` with that content (the first in `inits` order)."""
    strategies = {name: spec for name, spec in (config.get("init_strategies") or {}).items() if isinstance(spec, dict)}
    inits = list(dict.fromkeys(config["inits"]))
    matches = {}
    for role in ROLES.values():
        same = [name for name, spec in strategies.items() if strategy_content(spec) == (role.copy, role.distill, True)]
        in_grid = [init for init in inits if init in same]
        more = tuple(init for init in inits if init in strategies
                     and strategy_content(strategies[init]) == (role.copy, role.distill, False))
        chosen = in_grid[0] if in_grid else None
        design = primary_design(config, strategies[chosen]) if chosen else NO_DESIGN
        matches[role.name] = RoleMatch(role, chosen, tuple(in_grid[1:]), tuple(n for n in same if n not in in_grid),
                                       design, more)
    return matches


DEFAULT_THRESHOLDS = {"negligible": 0.25, "most": 0.5, "match_tolerance": 0.005}
STATEMENTS = {
    "C1": "Copying softmax attention weights into a linear ViT barely helps, and can be worse than random initialization.",
    "C2": "Copying the MLP weights carries most of the benefit of the pretrained model.",
    "C3": "Copied MLPs plus distilled attention close the gap to the softmax model, and can surpass it.",
    "C4": "C1-C3 hold across linear variants, model sizes and datasets.",
}
CELL = ["dataset", "size", "variant", "budget"]  # a claim cell: students and reference of one budget
# One summary row per (cell, init, design): the statistics over seeds.
SUMMARY_KEYS = ["dataset", "size", "variant", "init", "design", "budget"]
SUMMARY_METRICS = ["steps", "distill_steps", "train_time_s", "distill_time_s", "total_time_s", "params",
                   "throughput_img_s", "fidelity_kl_mean", "fidelity_js_mean", "fidelity_corr_mean"]
SUMMARY_COLUMNS = SUMMARY_KEYS + ["n_seeds", "n_expected", "test_acc_mean", "test_acc_std", "gap_closed"] \
    + [f"{m}_mean" for m in SUMMARY_METRICS]


@dataclass(frozen=True)
class Thresholds:
    negligible: float
    most: float
    match_tolerance: float

    @classmethod
    def from_config(cls, config: dict) -> Thresholds:
        given = config.get("claims") or {}
        if not isinstance(given, dict):
            raise ValueError(f"config: 'claims' must be a mapping of threshold name -> number, got {given!r}")
        values = {}
        for key, default in DEFAULT_THRESHOLDS.items():
            value = given.get(key, default)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"config: 'claims.{key}' is {value!r}, expected a number")
            values[key] = float(value)
        return cls(**values)


NOT_EVALUABLE = "not evaluable"


@dataclass
class CellVerdict:
    """One claim in one (dataset, size, variant, budget) cell.

    outcome: holds, fails, inconclusive (the interval straddles the threshold, or there is none) or
    not evaluable; holds is True / False for holds / fails and None otherwise. statistic, estimate,
    low, high: the deciding statistic (for C1, the share with the higher upper bound), its point
    estimate and interval at `level`; numbers: every statistic, with its `<name>_low` / `<name>_high`
    bounds; seeds and images: what the interval resampled (images 0: seeds only)."""

    claim: str
    dataset: str
    size: str
    variant: str
    budget: int
    holds: bool | None
    text: str
    numbers: dict[str, float] = field(default_factory=dict)
    why: str = ""  # when not evaluable: a short reason, shared by cells that fail the same way
    outcome: str = ""  # from holds when not given (True: holds, False: fails, None: not evaluable)
    statistic: str = ""
    estimate: float = math.nan
    low: float = math.nan
    high: float = math.nan
    level: float = math.nan
    seeds: int = 0
    images: int = 0
    method: str = ""

    def __post_init__(self):
        if not self.outcome:
            self.outcome = {True: HOLDS, False: FAILS}.get(self.holds, NOT_EVALUABLE)

    @property
    def evaluable(self) -> bool:
        return self.outcome != NOT_EVALUABLE


@dataclass
class ClaimVerdict:
    claim: str
    statement: str
    verdict: str
    detail: str
    holds_in: int
    evaluable: int
    cells: list[CellVerdict]
    fails_in: int = 0
    inconclusive_in: int = 0
    roles: dict[str, str | None] = field(default_factory=dict)  # role -> the strategy that filled it
    designs: dict[str, str | None] = field(default_factory=dict)  # distilling role -> the design used
    # Per budget: {"budget", "verdict", "holds_in", "fails_in", "inconclusive_in", "evaluable", "cells"},
    # in the config's budget order.
    by_budget: list[dict] = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------------------------------------
# Statistics over seeds


def summarize(runs: pd.DataFrame, config: dict) -> pd.DataFrame:
    """Mean/std over seeds per (dataset, size, variant, init, design, budget), with gap closed against
    the random role and the softmax reference of the same budget.

    Students and the softmax reference (variant 'softmax', init 'reference') each get rows; gap closed
    is left empty for the reference and wherever its denominator is not positive.
    """
    ok = runs[runs["status"] == "ok"]
    rows = []
    for key, expected in runs.groupby(SUMMARY_KEYS, sort=False):
        done = ok.loc[ok.index.intersection(expected.index)]
        row = {**dict(zip(SUMMARY_KEYS, key)), "n_seeds": len(done), "n_expected": len(expected),
               "test_acc_mean": done["test_acc"].mean(), "test_acc_std": _std(done["test_acc"])}
        row.update({f"{m}_mean": _mean_of(done, m) for m in SUMMARY_METRICS})
        rows.append(row)
    summary = pd.DataFrame(rows, columns=SUMMARY_COLUMNS)
    random = resolve_roles(config)[RANDOM].strategy
    means = _means(summary)
    summary["gap_closed"] = [_gap_closed(means, r, random) for r in summary.itertuples()]
    return _ordered(summary, config)


def _mean_of(frame: pd.DataFrame, column: str) -> float:
    if column not in frame:
        return math.nan
    return float(pd.to_numeric(frame[column], errors="coerce").astype("float64").mean())


def _std(values: pd.Series) -> float:
    # Sample std over seeds; undefined (NaN) with a single seed rather than a misleading 0.
    return float(values.std(ddof=1)) if len(values) > 1 else math.nan


def _means(summary: pd.DataFrame) -> dict[tuple, float]:
    """(dataset, size, variant, init, design, budget) -> mean accuracy over finished seeds."""
    return {tuple(getattr(r, k) for k in SUMMARY_KEYS): r.test_acc_mean for r in summary.itertuples()}


def _gap_closed(means: dict, r, random_init: str | None) -> float:
    if r.variant == REFERENCE_VARIANT or random_init is None:
        return math.nan
    random = means.get((r.dataset, r.size, r.variant, random_init, NO_DESIGN, r.budget), math.nan)
    reference = means.get((r.dataset, r.size, REFERENCE_VARIANT, REFERENCE_INIT, NO_DESIGN, r.budget), math.nan)
    denominator = reference - random
    if math.isnan(denominator) or denominator <= 0:
        return math.nan
    return (r.test_acc_mean - random) / denominator


def design_order(config: dict) -> list[str]:
    """Designs in the config's order: 'none', the `distills` axis, the inits' fixed designs, the rest."""
    strategies = config.get("init_strategies") or {}
    fixed = [strategies[init]["distill"] for init in config["inits"]
             if isinstance(strategies.get(init), dict) and isinstance(strategies[init].get("distill"), str)]
    return list(dict.fromkeys([NO_DESIGN, *design_names(config), *fixed, *design_specs(config)]))


def _ordered(frame: pd.DataFrame, config: dict) -> pd.DataFrame:
    """Sort rows in the config's order (per budget, the reference first in each cell), not alphabetically."""
    orders = {"dataset": config["targets"], "size": config["sizes"], "budget": budgets(config),
              "variant": [REFERENCE_VARIANT, *config["variants"]], "init": [REFERENCE_INIT, *config["inits"]],
              "design": design_order(config)}
    keys = {col: frame[col].map({v: i for i, v in enumerate(order)}) for col, order in orders.items()}
    index = pd.DataFrame(keys, index=frame.index).sort_values(list(orders), kind="stable").index
    return frame.loc[index].reset_index(drop=True)


# ---------------------------------------------------------------------------------------------
# Verdicts


def claim_cells(config: dict) -> list[tuple[str, str, str, int]]:
    """Every (dataset, size, variant, budget) claim cell, budget by budget."""
    return [(d, s, v, int(b)) for b in budgets(config) for d in config["targets"] for s in config["sizes"]
            for v in config["variants"]]


def evaluate_claims(runs: pd.DataFrame, config: dict, predictions: dict | None = None) -> list[ClaimVerdict]:
    """Verdicts for C1-C4 with the numbers and intervals behind them, per cell, per budget and overall.

    predictions: (dataset, size, variant, init, design, budget, seed) -> linvit.predictions.Predictions;
    by default read from the runs' `predictions` column (linvit.report.aggregate.load_predictions)."""
    from linvit.report.aggregate import load_predictions  # aggregate is the reader of result files

    thresholds = Thresholds.from_config(config)
    settings = stats.Settings.from_config(config)
    if predictions is None:
        predictions = load_predictions(runs)
    summary = summarize(runs, config)
    ok = runs[runs["status"] == "ok"]
    roles = resolve_roles(config)
    cells = claim_cells(config)
    checks = {"C1": _c1, "C2": _c2, "C3": _c3}
    verdicts = []
    for claim, check in checks.items():
        per_cell = [check(_Cell(summary, c, roles, ok, predictions, settings), thresholds) for c in cells]
        absent = [roles[r].absent() for r in REQUIRED_ROLES[claim] if roles[r].strategy is None]
        verdict = _overall(claim, per_cell, absent)
        verdict.roles = {r: roles[r].strategy for r in CLAIM_ROLES[claim]}
        verdict.designs = {r: roles[r].design for r in CLAIM_ROLES[claim] if ROLES[r].distill}
        _per_budget(verdict, absent, config)
        verdicts.append(verdict)
    verdicts.append(_c4(verdicts, config))
    return verdicts


def _per_budget(verdict: ClaimVerdict, absent: list[str], config: dict, fixed: str | None = None) -> None:
    """The claim's verdict at each budget; with several budgets, the overall verdict names them.
    `fixed`: a verdict that holds at every budget (C4 on a grid that spans nothing)."""
    verdict.by_budget = []
    for budget in budgets(config):
        sub = _overall(verdict.claim, [c for c in verdict.cells if c.budget == budget], absent)
        verdict.by_budget.append({"budget": budget, "verdict": fixed or sub.verdict, "holds_in": sub.holds_in,
                                  "fails_in": sub.fails_in, "inconclusive_in": sub.inconclusive_in,
                                  "evaluable": sub.evaluable, "cells": len(sub.cells)})
    if len(verdict.by_budget) < 2 or verdict.verdict.startswith("not evaluable"):
        return
    shorts = [_short(b["verdict"]) for b in verdict.by_budget]
    steps = ", ".join(str(b["budget"]) for b in verdict.by_budget)
    if verdict.verdict == "supported" and set(shorts) == {"supported"}:
        verdict.verdict += f" at every budget ({steps} steps)"
    elif verdict.verdict == "not supported" and set(shorts) == {"not supported"}:
        verdict.verdict += f" at any budget ({steps} steps)"
    else:
        verdict.verdict += "; " + ", ".join(f"at {b['budget']} steps {v}" for b, v in zip(verdict.by_budget, shorts))


def _short(verdict: str) -> str:
    return "not evaluable" if verdict.startswith("not evaluable") else verdict


def _sides(t: Thresholds) -> dict[str, tuple[str, float, str]]:
    """Per claim: (statistic, side, threshold) the verdict compares (stats.decide)."""
    return {"C1": ("strict and symmetric shares", "<=", t.negligible), "C2": ("symmetric share", ">=", t.most),
            "C3": ("difference", ">=", -t.match_tolerance)}


class _Cell:
    """Means/stds of one (dataset, size, variant, budget) cell, looked up by role; the reference by REFERENCE_INIT."""

    def __init__(self, summary: pd.DataFrame, cell: tuple[str, str, str, int], roles: dict[str, RoleMatch],
                 ok: pd.DataFrame | None = None, predictions: dict | None = None,
                 settings: stats.Settings | None = None):
        self.dataset, self.size, self.variant, self.budget = cell
        self.roles = roles
        self.settings = settings or stats.Settings()
        self.predictions = predictions or {}
        in_cell = summary[(summary["dataset"] == self.dataset) & (summary["size"] == self.size)
                          & (summary["budget"] == self.budget)]
        self.rows = {(r.init, r.design): r for r in in_cell.itertuples()
                     if r.variant == self.variant or r.variant == REFERENCE_VARIANT}
        self.ok = pd.DataFrame() if ok is None else ok[(ok["dataset"] == self.dataset) & (ok["size"] == self.size)
                                                       & (ok["budget"] == self.budget)]

    def runs(self, role: str) -> list[stats.Run]:
        """The role's finished runs in this cell, each with its per-image predictions when it has them."""
        init, design = self._key(role)
        variant = REFERENCE_VARIANT if role == REFERENCE_INIT else self.variant
        done = _select(self.ok, variant, init, design) if len(self.ok) else self.ok
        out = []
        for r in done.itertuples():
            key = (r.dataset, r.size, r.variant, r.init, r.design, r.budget, r.seed)
            out.append(stats.Run(int(r.seed), float(r.test_acc), self.predictions.get(key),
                                 f"{self.label(role)} seed {r.seed}"))
        return out

    def bootstrap(self, roles: list[str], statistics: dict, extra_roles: tuple = (), extra_statistics=None
                  ) -> tuple[stats.Sample, dict[str, stats.Interval], str]:
        """The roles' runs paired (stats.pair; PairingError when they cannot be) and every statistic's
        interval; then the statistics that also need `extra_roles` (a reported number, not the verdict's:
        a role missing a seed must not take it from the verdict), on the same draws when those roles have
        the same seeds and kind of data. Returns (sample, intervals, why the extra statistics are missing)."""
        runs = {role: self.runs(role) for role in [*roles, *extra_roles]}
        sample = stats.pair({role: runs[role] for role in roles})
        if not extra_roles:
            return sample, stats.bootstrap(sample, statistics, self.settings), ""
        try:
            full = stats.pair(runs)
        except PairingError as err:
            return sample, stats.bootstrap(sample, statistics, self.settings), str(err)
        if (full.seeds, full.mode) == (sample.seeds, sample.mode):
            return sample, stats.bootstrap(full, {**statistics, **extra_statistics}, self.settings), ""
        intervals = stats.bootstrap(sample, statistics, self.settings)
        intervals.update(stats.bootstrap(full, extra_statistics, self.settings))
        return sample, intervals, ""

    def _key(self, role: str) -> tuple[str, str] | None:
        return (REFERENCE_INIT, NO_DESIGN) if role == REFERENCE_INIT else self.roles[role].key

    def label(self, role: str) -> str:
        return "softmax reference" if role == REFERENCE_INIT else self.roles[role].label

    def missing(self, roles: list[str]) -> dict[str, str]:
        """The roles among `roles` with no finished seed -> a description: no strategy fills it, or seeds unfinished."""
        out = {}
        for role in roles:
            key = self._key(role)
            if role != REFERENCE_INIT and self.roles[role].strategy is None:
                out[role] = f"{self.roles[role].absent()}: no init strategy in the grid has this content"
            elif key is None:
                out[role] = f"{self.label(role)} (no distillation design: set `distills` or distill_designs)"
            elif key not in self.rows:
                out[role] = f"{self.label(role)} (not in the grid)"
            elif self.rows[key].n_seeds == 0:
                out[role] = f"{self.label(role)} (0 of {self.rows[key].n_expected} seeds finished)"
        return out

    def acc(self, role: str) -> float:
        return self.rows[self._key(role)].test_acc_mean

    def describe(self, role: str) -> str:
        """'copy_all 71.20% ± 0.30 pp': the mean and its std over seeds, and how many seeds when not all finished."""
        r = self.rows[self._key(role)]
        spread = " (std n/a (1 seed))" if r.n_seeds == 1 else f" ± {100 * r.test_acc_std:.2f} pp"
        partial = f" ({r.n_seeds} of {r.n_expected} seeds finished)" if r.n_seeds < r.n_expected else ""
        return f"{self.label(role)} {pct(r.test_acc_mean)}{spread}{partial}"

    def verdict(self, claim: str, holds: bool | None, text: str, **numbers: float) -> CellVerdict:
        return CellVerdict(claim, self.dataset, self.size, self.variant, self.budget, holds, text, numbers)

    def judged(self, claim: str, outcome: str, deciding: str, sample: stats.Sample,
               intervals: dict[str, stats.Interval], text: str) -> CellVerdict:
        """A statistical verdict: outcome, the deciding statistic's interval, every statistic with its bounds."""
        numbers = {}
        for name, i in intervals.items():
            numbers.update({name: i.estimate, f"{name}_low": i.low, f"{name}_high": i.high})
        d = intervals[deciding]
        if sample.mode == stats.NO_INTERVAL:
            text = f"{INCONCLUSIVE}: {stats.NO_INTERVAL}. {text}"
        holds = {HOLDS: True, FAILS: False}.get(outcome)
        return CellVerdict(claim, self.dataset, self.size, self.variant, self.budget, holds,
                           f"{text} Paired over {sample.describe()}.", numbers, outcome=outcome,
                           statistic=deciding, estimate=d.estimate, low=d.low, high=d.high, level=d.level,
                           seeds=len(sample.seeds), images=sample.images, method=sample.mode)

    def unpaired(self, claim: str, err: PairingError) -> CellVerdict:
        return self.not_evaluable(claim, "runs on different test sets", f"runs cannot be paired: {err}")

    def not_evaluable(self, claim: str, why: str, explanation: str) -> CellVerdict:
        verdict = self.verdict(claim, None, f"not evaluable: {explanation}")
        verdict.why = why
        return verdict

    def missing_results(self, claim: str, missing: dict[str, str]) -> CellVerdict:
        names = ", ".join(self.label(role) for role in missing)
        return self.not_evaluable(claim, f"missing results for {names}", "missing " + ", ".join(missing.values()))

    def no_benefit(self, claim: str, total_text: str) -> CellVerdict:
        return self.not_evaluable(claim, f"{self.label(COPY_ALL)} does not beat {self.label(RANDOM)}",
                                  f"copying all weights does not beat random ({total_text}), so shares of it are undefined")


def _benefit(c: _Cell) -> tuple[float, str]:
    """The total pretrained benefit acc(copy_all) - acc(random); the fractions below are shares of it."""
    total = c.acc(COPY_ALL) - c.acc(RANDOM)
    return total, f"total pretrained benefit = {c.describe(COPY_ALL)} - {c.describe(RANDOM)} = {pp(total)}"


def _share_text(i: stats.Interval) -> str:
    return stats.interval_text(i, unit="%")


def _diff_text(i: stats.Interval) -> str:
    return stats.interval_text(i, unit=" pp")


_BENEFIT = stats.difference(COPY_ALL, RANDOM)


def _c1(c: _Cell, t: Thresholds) -> CellVerdict:
    missing = c.missing([RANDOM, COPY_ALL, COPY_MLP, ATTN_ONLY])
    if missing:
        return c.missing_results("C1", missing)
    total, total_text = _benefit(c)
    if total <= 0:
        return c.no_benefit("C1", total_text)
    try:
        sample, iv, _ = c.bootstrap([RANDOM, COPY_ALL, COPY_MLP, ATTN_ONLY], {
            "strict_fraction": stats.share(ATTN_ONLY, RANDOM, COPY_ALL, RANDOM),
            "symmetric_fraction": stats.share(COPY_ALL, COPY_MLP, COPY_ALL, RANDOM), "total_benefit": _BENEFIT})
    except PairingError as err:
        return c.unpaired("C1", err)
    strict, symmetric = iv["strict_fraction"], iv["symmetric_fraction"]
    outcome = stats.combine([stats.decide(strict, t.negligible, "<="), stats.decide(symmetric, t.negligible, "<=")])
    binding = max(("strict_fraction", "symmetric_fraction"), key=lambda n: (iv[n].high, iv[n].estimate))
    text = (f"{outcome} (threshold: both shares <= {pct(t.negligible)}). "
            f"Strict: {c.describe(ATTN_ONLY)} vs {c.label(RANDOM)} gives {_share_text(strict)} of the benefit"
            f"{' (worse than random)' if strict.estimate < 0 else ''}; "
            f"symmetric: {c.label(COPY_ALL)} vs {c.describe(COPY_MLP)} gives {_share_text(symmetric)}"
            f"{' (copying attention on top of the rest hurts)' if symmetric.estimate < 0 else ''}; {total_text} "
            f"({_diff_text(iv['total_benefit'])}).")
    return c.judged("C1", outcome, binding, sample, iv, text)


def _c2(c: _Cell, t: Thresholds) -> CellVerdict:
    missing = c.missing([RANDOM, COPY_ALL, COPY_MLP])
    if missing:
        return c.missing_results("C2", missing)
    total, total_text = _benefit(c)
    if total <= 0:
        return c.no_benefit("C2", total_text)
    statistics = {"symmetric_fraction": stats.share(COPY_MLP, RANDOM, COPY_ALL, RANDOM), "total_benefit": _BENEFIT}
    strict_missing = c.missing([MLP_ONLY])
    extra = () if strict_missing else (MLP_ONLY,)
    try:
        sample, iv, unpaired = c.bootstrap([RANDOM, COPY_ALL, COPY_MLP], statistics, extra,
                                           {"strict_fraction": stats.share(MLP_ONLY, RANDOM, COPY_ALL, RANDOM)})
    except PairingError as err:
        return c.unpaired("C2", err)
    symmetric = iv["symmetric_fraction"]
    outcome = stats.decide(symmetric, t.most, ">=")
    if strict_missing:
        strict_text = f"strict share not available ({strict_missing[MLP_ONLY]})"
    elif unpaired:
        strict_text = f"strict share not available (runs cannot be paired: {unpaired})"
    else:
        strict = iv["strict_fraction"]
        clears = stats.decide(strict, t.most, ">=")
        word = {HOLDS: "also clears", FAILS: "does not clear"}.get(clears, "straddles")
        strict_text = (f"strict: {c.describe(MLP_ONLY)} vs {c.label(RANDOM)} gives {_share_text(strict)}, "
                       f"which {word} the threshold")
    text = (f"{outcome} (threshold: symmetric share >= {pct(t.most)}). "
            f"Symmetric: {c.describe(COPY_MLP)} vs {c.label(RANDOM)} gives {_share_text(symmetric)} of the benefit; "
            f"{strict_text}; {total_text} ({_diff_text(iv['total_benefit'])}).")
    return c.judged("C2", outcome, "symmetric_fraction", sample, iv, text)


def _c3(c: _Cell, t: Thresholds) -> CellVerdict:
    missing = c.missing([COPY_MLP_DISTILL, REFERENCE_INIT])
    if missing:
        return c.missing_results("C3", missing)
    statistics = {"difference": stats.difference(COPY_MLP_DISTILL, REFERENCE_INIT)}
    random_missing = c.missing([RANDOM])
    denominator = math.nan if random_missing else c.acc(REFERENCE_INIT) - c.acc(RANDOM)
    extra = (RANDOM,) if not random_missing and denominator > 0 else ()
    try:
        sample, iv, unpaired = c.bootstrap([COPY_MLP_DISTILL, REFERENCE_INIT], statistics, extra,
                                           {"gap_closed": stats.share(COPY_MLP_DISTILL, RANDOM, REFERENCE_INIT, RANDOM)})
    except PairingError as err:
        return c.unpaired("C3", err)
    difference = iv["difference"]
    outcome = stats.decide(difference, -t.match_tolerance, ">=")
    if random_missing:
        gap_text = f"gap closed not available ({random_missing[RANDOM]})"
    elif unpaired:
        gap_text = f"gap closed not available (runs cannot be paired: {unpaired})"
    elif "gap_closed" not in iv:
        gap_text = (f"gap closed undefined: the softmax reference does not beat random "
                    f"(denominator {pp(denominator)})")
    else:
        gap = iv["gap_closed"]
        gap_text = f"gap closed {stats.interval_text(gap, scale=1.0, unit='')} (vs {c.describe(RANDOM)})"
    surpass = {HOLDS: "surpasses", FAILS: "does not surpass"}.get(_above_zero(difference), "may or may not surpass")
    text = (f"{outcome} (threshold: within {pp(t.match_tolerance)} of the reference or above). "
            f"{c.describe(COPY_MLP_DISTILL)} vs {c.describe(REFERENCE_INIT)}: difference {_diff_text(difference)}, "
            f"{surpass} the softmax model; {gap_text}.")
    return c.judged("C3", outcome, "difference", sample, iv, text)


def _above_zero(i: stats.Interval) -> str:
    """Whether the recipe surpasses the reference: the interval above 0, below or at most 0, or straddling."""
    if not i.bounded:
        return HOLDS if i.estimate > 0 else FAILS
    return HOLDS if i.low > 0 else FAILS if i.high <= 0 else INCONCLUSIVE


def _overall(claim: str, cells: list[CellVerdict], absent: list[str]) -> ClaimVerdict:
    evaluable = [c for c in cells if c.evaluable]
    counts = {o: sum(c.outcome == o for c in evaluable) for o in stats.OUTCOMES}
    # Cells that cannot be evaluated for the same reason are named together, to keep the verdict one line.
    by_reason: dict[str, list[str]] = {}
    for c in cells:
        if not c.evaluable:
            by_reason.setdefault(c.why, []).append(_key(c))
    skipped = [f"{why} in {_cells_phrase(keys, len(cells))}" for why, keys in by_reason.items()]
    if absent:
        verdict = f"not evaluable: no init strategy in the grid has the content of {'; '.join(absent)}"
    elif not cells:
        verdict = "not evaluable: the grid has no cells"
    elif not evaluable:
        verdict = "not evaluable: " + "; ".join(skipped)
    else:
        verdict = outcome_word(counts)
    detail = f"{counts_text(counts)} of {len(evaluable)} evaluable cells ({len(cells)} in the grid)"
    if skipped and evaluable:
        detail += "; not evaluable: " + "; ".join(skipped)
    return ClaimVerdict(claim, STATEMENTS[claim], verdict, detail + ".", counts[HOLDS], len(evaluable), cells,
                        fails_in=counts[FAILS], inconclusive_in=counts[INCONCLUSIVE])


def outcome_word(counts: dict[str, int]) -> str:
    """'supported' (every evaluable cell holds), 'not supported' (every one fails), 'inconclusive' (every
    one inconclusive), else 'mixed (2 hold, 1 fail, 0 inconclusive)'."""
    n = sum(counts.values())
    if counts[HOLDS] == n:
        return "supported"
    if counts[FAILS] == n:
        return "not supported"
    if counts[INCONCLUSIVE] == n:
        return f"inconclusive ({n} of {n} cells)"
    return f"mixed ({counts[HOLDS]} hold, {counts[FAILS]} fail, {counts[INCONCLUSIVE]} inconclusive)"


def counts_text(counts: dict[str, int]) -> str:
    return f"Holds in {counts[HOLDS]}, fails in {counts[FAILS]}, inconclusive in {counts[INCONCLUSIVE]}"


def _c4(verdicts: list[ClaimVerdict], config: dict) -> ClaimVerdict:
    """C1-C3 together, per cell: holds when all hold, fails when any fails, else inconclusive; and which
    axes the grid spans at all."""
    cells = []
    for parts in zip(*(v.cells for v in verdicts)):
        where = (parts[0].dataset, parts[0].size, parts[0].variant, parts[0].budget)
        unknown = ", ".join(p.claim for p in parts if not p.evaluable)
        failing = ", ".join(p.claim for p in parts if p.outcome == FAILS)
        open_ = ", ".join(p.claim for p in parts if p.outcome == INCONCLUSIVE)
        if unknown:
            cells.append(CellVerdict("C4", *where, None, f"not evaluable: {unknown} not evaluable here",
                                     why=f"{unknown} not evaluable"))
        elif failing:
            cells.append(CellVerdict("C4", *where, False, f"{FAILS}: {failing} "
                                     f"{'fails' if ',' not in failing else 'fail'}"
                                     + (f" ({open_} inconclusive)" if open_ else "")))
        elif open_:
            cells.append(CellVerdict("C4", *where, None, f"{INCONCLUSIVE}: {open_} inconclusive, the others hold",
                                     outcome=INCONCLUSIVE))
        else:
            cells.append(CellVerdict("C4", *where, True, f"{HOLDS}: C1-C3 all hold"))
    axes = {"datasets": config["targets"], "sizes": config["sizes"], "variants": config["variants"]}
    spanned = [f"{len(v)} {k}" for k, v in axes.items() if len(v) > 1]
    single = [f"{k} (the grid has 1: {v[0]})" for k, v in axes.items() if len(v) == 1]
    result = _overall("C4", cells, [])
    fixed = None
    if not spanned:
        fixed = result.verdict = "not evaluable: the grid spans a single dataset, size and variant"
    counts = "; ".join(f"{v.claim} holds in {v.holds_in}, fails in {v.fails_in}, inconclusive in "
                       f"{v.inconclusive_in} of {v.evaluable} evaluable cells" for v in verdicts)
    scope = f"Tested across {', '.join(spanned) or 'nothing'}"
    if single:
        scope += f"; untested across {', '.join(single)}"
    grid_budgets = budgets(config)
    if len(grid_budgets) > 1:
        scope += f"; at {len(grid_budgets)} budgets ({', '.join(map(str, grid_budgets))} steps), each judged on its own"
    result.detail = f"{scope}. {counts}. {result.detail}"
    _per_budget(result, [], config, fixed)
    return result


COST_ROLES = [RANDOM, COPY_MLP_DISTILL, REFERENCE_INIT]


def cost_table(runs: pd.DataFrame, curves: pd.DataFrame, config: dict) -> pd.DataFrame:
    """Student compute per cell and budget for the random and copy_mlp_distill roles (the latter at its
    primary design) and the softmax reference (means over finished seeds); `init` names the strategy
    that fills the role (with its design).

    steps_to_random_acc: the first evaluated step at which a run reaches the final accuracy of the
    random-role run with the same seed and budget, averaged over the seeds that reach it (seeds_reaching
    says how many). Teacher pretraining is not counted: it is shared by every student.
    """
    ok = runs[runs["status"] == "ok"]
    roles = resolve_roles(config)
    rows = []
    for dataset, size, variant, budget in _cost_cells(config):
        in_cell = ok[(ok["dataset"] == dataset) & (ok["size"] == size) & (ok["budget"] == budget)]
        random_key = roles[RANDOM].key
        random_final = (_select(in_cell, variant, *random_key).set_index("seed")["test_acc"]
                        if random_key else pd.Series(dtype=float))
        for role in COST_ROLES:
            reference = role == REFERENCE_INIT
            key = (REFERENCE_INIT, NO_DESIGN) if reference else roles[role].key
            if key is None:
                continue  # no strategy of the grid fills the role
            done = _select(in_cell, REFERENCE_VARIANT if reference else variant, *key)
            reach = [] if role == RANDOM else _steps_to_reach(curves, done, random_final)
            rows.append({"dataset": dataset, "size": size, "variant": variant, "budget": budget,
                         "init": "softmax reference" if reference else roles[role].label, "design": key[1],
                         "n_seeds": len(done), "test_acc_mean": done["test_acc"].mean(),
                         "steps_mean": _mean_of(done, "steps"), "distill_steps_mean": _mean_of(done, "distill_steps"),
                         "train_time_s_mean": done["train_time_s"].mean(),
                         "distill_time_s_mean": done["distill_time_s"].mean(),
                         "total_time_s_mean": done["total_time_s"].mean(),
                         "steps_to_random_acc": pd.Series(reach, dtype=float).mean(),
                         "seeds_reaching": len(reach) if role != RANDOM else math.nan})
    return pd.DataFrame(rows)


DEFAULT_RECIPE_TOLERANCE = 0.01  # config claims.recipe_tolerance: "within 1 point" of the reference
RECIPE_COLUMNS = ["dataset", "size", "variant", "budget", "recipe", "tolerance", "n_seeds", "seeds_reaching",
                  "reference_acc_mean", "recipe_steps_mean", "recipe_student_steps_mean", "distill_steps_mean",
                  "random_steps_mean", "speedup_mean", "reason"]


def recipe_tolerance(config: dict) -> float:
    value = (config.get("claims") or {}).get("recipe_tolerance", DEFAULT_RECIPE_TOLERANCE)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"config: 'claims.recipe_tolerance' is {value!r}, expected a fraction >= 0 (0.01 = 1 point)")
    return float(value)


def recipe_cost(runs: pd.DataFrame, curves: pd.DataFrame, config: dict, per_seed: bool = False) -> pd.DataFrame:
    """The recipe's cost, per cell and budget: the steps the copy_mlp_distill role (at its primary
    design) needs to come within `claims.recipe_tolerance` (default 0.01, one point) of the softmax
    reference's final accuracy of the same seed, against the steps the random role needs to reach its
    own final accuracy.

    Per seed: recipe_student_steps is the first evaluated step on the recipe's curve (curves.csv) at or
    above reference final - tolerance; recipe_steps adds the run's distillation steps; random_steps is
    the first evaluated step at which the random run reaches its own final accuracy; speedup is
    random_steps / recipe_steps. A seed counts only when the recipe, the reference and random all
    finished it. A seed whose recipe never comes within the tolerance is NaN, and `reason` says so
    (with the recipe's best accuracy against the target); nothing is extrapolated.

    Columns (per_seed=False, one row per cell and budget): dataset, size, variant, budget, recipe (the
    strategy filling the role, with its design), tolerance, n_seeds (seeds with all three runs),
    seeds_reaching, reference_acc_mean, recipe_steps_mean, recipe_student_steps_mean,
    distill_steps_mean (over the seeds that reach), random_steps_mean, speedup_mean, reason ("" when
    every seed reaches). per_seed=True: one row per seed with `seed` and the same columns unaveraged.
    """
    tolerance = recipe_tolerance(config)
    roles = resolve_roles(config)
    recipe, random = roles[COPY_MLP_DISTILL], roles[RANDOM]
    ok = runs[runs["status"] == "ok"]
    seed_rows, rows = [], []
    for dataset, size, variant, budget in _cost_cells(config):
        where = {"dataset": dataset, "size": size, "variant": variant, "budget": budget,
                 "recipe": recipe.label, "tolerance": tolerance}
        if recipe.key is None or random.key is None:
            absent = recipe if recipe.key is None else random
            rows.append({**where, "n_seeds": 0, "seeds_reaching": 0,
                         "reason": f"no strategy of the grid fills {absent.absent()}"})
            continue
        in_cell = ok[(ok["dataset"] == dataset) & (ok["size"] == size) & (ok["budget"] == budget)]
        by_seed = {name: _select(in_cell, v, *key).set_index("seed")
                   for name, v, key in (("recipe", variant, recipe.key), ("random", variant, random.key),
                                        ("reference", REFERENCE_VARIANT, (REFERENCE_INIT, NO_DESIGN)))}
        seeds = sorted(set.intersection(*(set(f.index) for f in by_seed.values())))
        cell_rows = []
        for seed in seeds:
            rec, ran, ref = (by_seed[n].loc[seed] for n in ("recipe", "random", "reference"))
            target = float(ref["test_acc"]) - tolerance
            rec_curve = _curve(curves, dataset, size, variant, *recipe.key, budget, seed)
            ran_curve = _curve(curves, dataset, size, variant, *random.key, budget, seed)
            student = _first_step(rec_curve, target)
            distill = float(rec["distill_steps"]) if pd.notna(rec["distill_steps"]) else 0.0
            random_steps = _first_step(ran_curve, float(ran["test_acc"]))
            reason = ""
            if math.isnan(student):
                best = rec_curve["test_acc"].max() if len(rec_curve) else math.nan
                reason = (f"seed {seed}: the recipe never comes within {pp(tolerance)} of the reference "
                          f"(best {pct(best)}, target {pct(target)})")
            elif math.isnan(random_steps):
                reason = f"seed {seed}: the random run's curve has no evaluation at its final accuracy"
            recipe_steps = student + distill
            cell_rows.append({**where, "seed": seed, "reference_acc": float(ref["test_acc"]),
                              "recipe_student_steps": student, "distill_steps": distill if not math.isnan(student)
                              else math.nan, "recipe_steps": recipe_steps, "random_steps": random_steps,
                              "speedup": random_steps / recipe_steps if recipe_steps > 0 else math.nan,
                              "reason": reason})
        seed_rows += cell_rows
        frame = pd.DataFrame(cell_rows)
        reasons = [r["reason"] for r in cell_rows if r["reason"]]
        if not seeds:
            reasons = ["no seed finished by the recipe, random and the softmax reference alike"]
        row = {**where, "n_seeds": len(seeds),
               "seeds_reaching": int(frame["recipe_student_steps"].notna().sum()) if len(frame) else 0,
               "reason": "; ".join(reasons)}
        for column in ("reference_acc", "recipe_steps", "recipe_student_steps", "distill_steps", "random_steps",
                       "speedup"):
            row[f"{column}_mean"] = frame[column].mean() if len(frame) else math.nan
        rows.append(row)
    if per_seed:
        columns = ["dataset", "size", "variant", "budget", "seed", "recipe", "tolerance", "reference_acc",
                   "recipe_steps", "recipe_student_steps", "distill_steps", "random_steps", "speedup", "reason"]
        return pd.DataFrame(seed_rows, columns=columns)
    return pd.DataFrame(rows, columns=RECIPE_COLUMNS)


def _curve(curves: pd.DataFrame, dataset, size, variant, init, design, budget, seed) -> pd.DataFrame:
    if curves.empty:
        return curves
    return curves[(curves["dataset"] == dataset) & (curves["size"] == size) & (curves["variant"] == variant)
                  & (curves["init"] == init) & (curves["design"] == design) & (curves["budget"] == budget)
                  & (curves["seed"] == seed)]


def _first_step(curve: pd.DataFrame, target: float) -> float:
    """The first evaluated step at or above `target` (NaN when none is)."""
    reached = curve[curve["test_acc"] >= target - 1e-12] if len(curve) else curve
    return float(reached["step"].min()) if len(reached) else math.nan


def _cost_cells(config: dict) -> list[tuple[str, str, str, int]]:
    """The claim cells, cell by cell (each cell's budgets side by side)."""
    return [(d, s, v, int(b)) for d in config["targets"] for s in config["sizes"] for v in config["variants"]
            for b in budgets(config)]


def _select(frame: pd.DataFrame, variant: str, init: str, design: str) -> pd.DataFrame:
    return frame[(frame["variant"] == variant) & (frame["init"] == init) & (frame["design"] == design)]


def _steps_to_reach(curves: pd.DataFrame, done: pd.DataFrame, random_final: pd.Series) -> list[float]:
    steps = []
    for run in done.itertuples():
        if run.seed not in random_final.index:
            continue
        curve = curves[(curves["dataset"] == run.dataset) & (curves["size"] == run.size)
                       & (curves["variant"] == run.variant) & (curves["init"] == run.init)
                       & (curves["design"] == run.design) & (curves["budget"] == run.budget)
                       & (curves["seed"] == run.seed)]
        reached = curve[curve["test_acc"] >= random_final[run.seed]].sort_values("step")
        if len(reached):
            steps.append(float(reached["step"].iloc[0]))
    return steps


# ---------------------------------------------------------------------------------------------
# Distillation designs and the literature's baselines


RECIPE, DISTILLING, BASELINE, REFERENCE_KIND = "paper's recipe", "distilling", "baseline", "softmax reference"
DESIGN_COLUMNS = ["dataset", "size", "variant", "budget", "init", "design", "kind", "claims_design", "training",
                  "n_seeds", "n_expected", "test_acc_mean", "test_acc_std", "gap_closed", "distill_steps_mean",
                  "distill_time_s_mean", "train_time_s_mean", "total_time_s_mean"]


def design_entries(config: dict) -> list[tuple[str, str, str]]:
    """(init, design, kind) of every distilling (init, design) and literature baseline of the grid, in
    this order (each in the config's order): the paper's recipe (the strategy filling copy_mlp_distill)
    under each of its designs, further `distill: true` strategies under each design, and the baselines (strategies with
    training losses or one fixed design)."""
    strategies = config.get("init_strategies") or {}
    recipe = resolve_roles(config)[COPY_MLP_DISTILL].strategy
    entries = []
    for init in dict.fromkeys(config["inits"]):
        spec = strategies.get(init)
        if not isinstance(spec, dict):
            continue
        if init == recipe:
            kind = RECIPE
        elif is_baseline(spec):
            kind = BASELINE
        elif spec.get("distill"):
            kind = DISTILLING
        else:
            continue
        entries += [(init, design, kind) for design in strategy_designs(config, spec)]
    kinds = [RECIPE, DISTILLING, BASELINE]
    return sorted(entries, key=lambda e: kinds.index(e[2]))  # stable: the config's order within a kind


def designs_table(summary: pd.DataFrame, config: dict) -> pd.DataFrame:
    """Per cell and budget: every design_entries row with its accuracy (mean, std over seeds), gap
    closed, distillation steps and time, and total time (distillation + training), then the softmax
    reference for scale. Empty when the grid has no distilling strategy and no baseline.

    Every design gets the same distillation budget (distill.train.steps), so designs compare at equal
    distillation compute; `claims_design` marks the design the claims use for the recipe."""
    entries = design_entries(config)
    if not entries:
        return pd.DataFrame(columns=DESIGN_COLUMNS)
    strategies = config.get("init_strategies") or {}
    recipe = resolve_roles(config)[COPY_MLP_DISTILL]
    entries.append((REFERENCE_INIT, NO_DESIGN, REFERENCE_KIND))
    index = {tuple(getattr(r, k) for k in SUMMARY_KEYS): r for r in summary.itertuples()}
    rows = []
    for dataset, size, variant, budget in _cost_cells(config):
        for init, design, kind in entries:
            reference = init == REFERENCE_INIT
            r = index.get((dataset, size, REFERENCE_VARIANT if reference else variant, init, design, budget))
            row = {"dataset": dataset, "size": size, "variant": variant, "budget": budget, "init": init,
                   "design": design, "kind": kind, "claims_design": kind == RECIPE and design == recipe.design,
                   "training": "task" if reference else training_text(strategies[init])}
            if r is None:
                row.update(n_seeds=0, n_expected=0)
            else:
                row.update({k: getattr(r, k) for k in ("n_seeds", "n_expected", "test_acc_mean", "test_acc_std",
                                                        "gap_closed", "distill_steps_mean", "distill_time_s_mean",
                                                        "train_time_s_mean", "total_time_s_mean")})
            rows.append(row)
    return pd.DataFrame(rows, columns=DESIGN_COLUMNS)


def training_text(spec: dict) -> str:
    """A strategy's stage-2 loss: 'task' alone, or 'task x0.5 + logit_kd x0.5' (a weight of 1 unwritten,
    the task's cross-entropy left out when its weight is 0)."""
    task_weight = spec.get("task_weight", 1)
    task_weight = 1 if task_weight is None else task_weight
    parts = [] if task_weight == 0 else ["task" if task_weight == 1 else f"task x{task_weight:g}"]
    for term in spec.get("train_losses") or []:
        name, weight = (term, 1) if isinstance(term, str) else (term.get("loss"), term.get("weight", 1))
        parts.append(name if weight == 1 else f"{name} x{weight:g}" if isinstance(weight, (int, float))
                     else f"{name} x{weight}")
    return " + ".join(parts) or "nothing"


def unequal_distillation(table: pd.DataFrame) -> list[str]:
    """The cells whose distilling rows did not get the same mean distillation steps (so the designs
    there do not compare at equal distillation compute), each as 'cell: init/design N steps, ...'."""
    notes = []
    if table.empty:
        return notes
    distilled = table[table["design"] != NO_DESIGN].dropna(subset=["distill_steps_mean"])
    for (dataset, size, variant, budget), g in distilled.groupby(CELL, sort=False):
        if g["distill_steps_mean"].nunique() > 1:
            steps = ", ".join(f"{r.init}/{r.design} {r.distill_steps_mean:.0f}" for r in g.itertuples())
            notes.append(f"{dataset}/{size}/{variant} at {budget} steps: {steps}")
    return notes


# ---------------------------------------------------------------------------------------------
# Markdown


def claims_markdown(verdicts: list[ClaimVerdict]) -> str:
    """One section per claim: statement, verdict, detail, a table of each cell's deciding statistic with
    its interval, and the per-cell text."""
    parts = []
    for v in verdicts:
        parts.append(f"### {v.claim}: {v.statement}\n\n**Verdict: {v.verdict}.** {v.detail}\n")
        judged = [c for c in v.cells if c.statistic]
        if judged:
            level = f"{100 * judged[0].level:g}%"
            parts += [f"| cell | verdict | statistic | estimate | {level} interval | seeds | test images |",
                      "|---|---|---|---|---|---|---|"]
            parts += [f"| `{_key(c)}` | {c.outcome} | {c.statistic} | {_number(c.statistic, c.estimate)} | "
                      f"{_bounds(c)} | {c.seeds} | {c.images or 'n/a (seeds only)'} |" for c in judged]
            parts.append("")
        parts.extend(f"- `{_key(c)}`: {c.text}" for c in v.cells)
        parts.append("")
    return "\n".join(parts)


def _number(statistic: str, x: float) -> str:
    """A share as a percentage, a difference in pp (signed); 'n/a' for NaN."""
    if x is None or math.isnan(x):
        return "n/a"
    return f"{100 * x:+.2f} pp" if statistic == "difference" else f"{100 * x:+.2f}%"


def _bounds(c: CellVerdict) -> str:
    if math.isnan(c.low) or math.isnan(c.high):
        return "none"
    return f"[{_number(c.statistic, c.low)}, {_number(c.statistic, c.high)}]"


def budget_markdown(verdicts: list[ClaimVerdict]) -> str:
    """Claim x budget: the verdict at each budget with how many evaluable cells hold, fail, are inconclusive."""
    budgets_ = [b["budget"] for b in verdicts[0].by_budget] if verdicts else []
    rows = ["| claim | " + " | ".join(f"{b} steps" for b in budgets_) + " |",
            "|---|" + "---|" * len(budgets_)]
    for v in verdicts:
        rows.append(f"| {v.claim} | " + " | ".join(_budget_cell(b) for b in v.by_budget) + " |")
    return "\n".join(rows)


def _budget_cell(b: dict) -> str:
    if b["verdict"].startswith("not evaluable") or not b["evaluable"]:
        return "not evaluable"
    word = b["verdict"].split(" (")[0]
    skipped = b["cells"] - b["evaluable"]
    return (f"{word}: {b['holds_in']} hold, {b.get('fails_in', 0)} fail, {b.get('inconclusive_in', 0)} "
            f"inconclusive of {b['evaluable']} cells" + (f" ({skipped} not evaluable)" if skipped else ""))


def roles_markdown(config: dict) -> str:
    """The roles the claims compare, by content, and the strategy of the grid that fills each."""
    rows = ["| role | content | strategy used | notes |", "|---|---|---|---|"]
    for match in resolve_roles(config).values():
        notes = []
        if match.duplicates:
            names = ", ".join(f"`{n}`" for n in match.duplicates)
            notes.append(f"{names} {'has' if len(match.duplicates) == 1 else 'have'} the same content; "
                         f"the first in `inits` is used")
        if match.outside_grid:
            notes.append(", ".join(f"`{n}`" for n in match.outside_grid) + " defined but not in `inits`")
        if match.trains_more:
            names = ", ".join(f"`{n}`" for n in match.trains_more)
            notes.append(f"{names} {'copies' if len(match.trains_more) == 1 else 'copy'} the same but "
                         f"{'trains' if len(match.trains_more) == 1 else 'train'} with added losses: a baseline, "
                         f"not this role")
        if match.strategy is None:
            used = "none in the grid: not evaluable"
        elif match.design is None:
            used = f"`{match.strategy}`, no distillation design given: not evaluable"
        elif match.design != NO_DESIGN:
            used = f"`{match.strategy}`, design `{match.design}`"
        else:
            used = f"`{match.strategy}`"
        rows.append(f"| {match.role.name} | {match.role.content} | {used} | {'; '.join(notes)} |")
    return "\n".join(rows)


def _cells_phrase(keys: list[str], total: int) -> str:
    return f"all {total} cells" if len(keys) == total and total > 1 else ", ".join(keys)


def _key(c: CellVerdict) -> str:
    return f"{c.dataset}/{c.size}/{c.variant}/steps{c.budget}"


def pct(x: float) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{100 * x:.2f}%"


def pp(x: float, sign: bool = False) -> str:
    """An accuracy difference in percentage points."""
    return "n/a" if math.isnan(x) else f"{100 * x:{'+' if sign else ''}.2f} pp"
