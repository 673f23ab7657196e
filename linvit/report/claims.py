"""Turn the runs table into per-seed statistics, gap closed, and a verdict for each claim C1-C4.

Every verdict is computed from the grid's own numbers and names them, whichever way they fall:
a claim that does not reproduce is a result. Only runs with status "ok" count; a verdict that needs
a strategy the grid lacks, or whose results are missing, says "not evaluable" and why.

The claims compare roles, and a role is defined by what a strategy copies from the teacher, not by
its name (an init strategy is added or renamed in the config with no code changes):

    random            copies nothing, no distillation
    copy_all          copies embed, attn, mlp, norm, head, no distillation
    copy_mlp          copies embed, mlp, norm, head (all but attn), no distillation
    attn_only         copies attn, no distillation
    mlp_only          copies mlp, no distillation
    copy_mlp_distill  copies embed, mlp, norm, head, attention distilled

`resolve_roles` finds, among the grid's `inits`, the strategy whose `init_strategies` entry has each
content (`attn_extra` in a copy list is ignored: it is never copied). Several strategies with the same
content: the first in `inits` fills the role, and the report names the others.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import pandas as pd

from linvit.grid import REFERENCE_INIT, REFERENCE_VARIANT
from linvit.groups import GROUPS


@dataclass(frozen=True)
class Role:
    """What the claims compare: a set of copied parameter groups and whether attention is distilled."""

    name: str
    copy: frozenset
    distill: bool

    @property
    def content(self) -> str:
        groups = ", ".join(g for g in GROUPS if g in self.copy) or "nothing"
        return f"copies {groups}; {'attention distilled' if self.distill else 'no distillation'}"


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
    """Which strategy of the grid fills a role; `strategy` is None when none does."""

    role: Role
    strategy: str | None
    duplicates: tuple[str, ...] = ()    # further strategies in inits with the same content, not used
    outside_grid: tuple[str, ...] = ()  # strategies with the content that are defined but not in inits

    @property
    def label(self) -> str:
        """The user's strategy name, with the role when the two differ: 'baseline (as random)'."""
        if self.strategy is None or self.strategy == self.role.name:
            return self.role.name
        return f"{self.strategy} (as {self.role.name})"

    def absent(self) -> str:
        """'attn_only (copies attn; no distillation; `attn_only` is defined but not in inits)'."""
        hint = "".join(f"; `{n}` is defined but not in inits" for n in self.outside_grid)
        return f"{self.role.name} ({self.role.content}{hint})"


def strategy_content(spec: dict) -> tuple[frozenset, bool]:
    """(copied groups, distills) of an init_strategies entry; attn_extra is never copied, so it is dropped."""
    copy = frozenset(g for g in (spec.get("copy") or []) if g != "attn_extra")
    return copy, bool(spec.get("distill", False))


def resolve_roles(config: dict) -> dict[str, RoleMatch]:
    """Each role -> the strategy among the config's `inits` with that content (the first in `inits` order)."""
    strategies = {name: spec for name, spec in (config.get("init_strategies") or {}).items() if isinstance(spec, dict)}
    matches = {}
    for role in ROLES.values():
        same = [name for name, spec in strategies.items() if strategy_content(spec) == (role.copy, role.distill)]
        in_grid = [init for init in dict.fromkeys(config["inits"]) if init in same]
        matches[role.name] = RoleMatch(role, in_grid[0] if in_grid else None, tuple(in_grid[1:]),
                                       tuple(n for n in same if n not in in_grid))
    return matches


DEFAULT_THRESHOLDS = {"negligible": 0.25, "most": 0.5, "match_tolerance": 0.005}
STATEMENTS = {
    "C1": "Copying softmax attention weights into a linear ViT barely helps, and can be worse than random initialization.",
    "C2": "Copying the MLP weights carries most of the benefit of the pretrained model.",
    "C3": "Copied MLPs plus distilled attention close the gap to the softmax model, and can surpass it.",
    "C4": "C1-C3 hold across linear variants, model sizes and datasets.",
}
CELL = ["dataset", "size", "variant"]
SUMMARY_METRICS = ["steps", "train_time_s", "distill_time_s", "total_time_s", "params", "throughput_img_s", "fidelity_kl_mean"]


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


@dataclass
class CellVerdict:
    """One claim in one (dataset, size, variant) cell: holds is None when it cannot be evaluated there."""

    claim: str
    dataset: str
    size: str
    variant: str
    holds: bool | None
    text: str
    numbers: dict[str, float] = field(default_factory=dict)
    why: str = ""  # when not evaluable: a short reason, shared by cells that fail the same way


@dataclass
class ClaimVerdict:
    claim: str
    statement: str
    verdict: str
    detail: str
    holds_in: int
    evaluable: int
    cells: list[CellVerdict]
    roles: dict[str, str | None] = field(default_factory=dict)  # role -> the strategy that filled it

    def as_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------------------------------------
# Statistics over seeds


def summarize(runs: pd.DataFrame, config: dict) -> pd.DataFrame:
    """Mean/std over seeds per (dataset, size, variant, init), with gap closed against the random role and the reference.

    Students and the softmax reference (variant 'softmax', init 'reference') each get rows; gap closed
    is left empty for the reference and wherever its denominator is not positive.
    """
    ok = runs[runs["status"] == "ok"]
    rows = []
    for (dataset, size, variant, init), expected in runs.groupby(CELL + ["init"], sort=False):
        done = ok.loc[ok.index.intersection(expected.index)]
        row = {"dataset": dataset, "size": size, "variant": variant, "init": init,
               "n_seeds": len(done), "n_expected": len(expected),
               "test_acc_mean": done["test_acc"].mean(), "test_acc_std": _std(done["test_acc"])}
        row.update({f"{m}_mean": done[m].mean() for m in SUMMARY_METRICS})
        rows.append(row)
    summary = pd.DataFrame(rows, columns=["dataset", "size", "variant", "init", "n_seeds", "n_expected",
                                          "test_acc_mean", "test_acc_std", "gap_closed"]
                           + [f"{m}_mean" for m in SUMMARY_METRICS])
    random = resolve_roles(config)[RANDOM].strategy
    summary["gap_closed"] = [_gap_closed(summary, r, random) for r in summary.itertuples()]
    return _ordered(summary, config)


def _std(values: pd.Series) -> float:
    # Sample std over seeds; undefined (NaN) with a single seed rather than a misleading 0.
    return float(values.std(ddof=1)) if len(values) > 1 else math.nan


def _gap_closed(summary: pd.DataFrame, r, random_init: str | None) -> float:
    if r.variant == REFERENCE_VARIANT or random_init is None:
        return math.nan
    random = _mean(summary, r.dataset, r.size, r.variant, random_init)
    reference = _mean(summary, r.dataset, r.size, REFERENCE_VARIANT, REFERENCE_INIT)
    denominator = reference - random
    if math.isnan(denominator) or denominator <= 0:
        return math.nan
    return (r.test_acc_mean - random) / denominator


def _mean(summary: pd.DataFrame, dataset, size, variant, init) -> float:
    match = summary[(summary["dataset"] == dataset) & (summary["size"] == size)
                    & (summary["variant"] == variant) & (summary["init"] == init)]
    return float(match["test_acc_mean"].iloc[0]) if len(match) else math.nan


def _ordered(frame: pd.DataFrame, config: dict) -> pd.DataFrame:
    """Sort rows in the config's order (reference first in each cell), not alphabetically."""
    orders = {"dataset": config["targets"], "size": config["sizes"],
              "variant": [REFERENCE_VARIANT, *config["variants"]], "init": [REFERENCE_INIT, *config["inits"]]}
    keys = {col: frame[col].map({v: i for i, v in enumerate(order)}) for col, order in orders.items()}
    index = pd.DataFrame(keys).sort_values(list(orders)).index
    return frame.loc[index].reset_index(drop=True)


# ---------------------------------------------------------------------------------------------
# Verdicts


def evaluate_claims(runs: pd.DataFrame, config: dict) -> list[ClaimVerdict]:
    """Verdicts for C1-C4 with the numbers behind them, per cell and overall."""
    thresholds = Thresholds.from_config(config)
    summary = summarize(runs, config)
    roles = resolve_roles(config)
    cells = [(d, s, v) for d in config["targets"] for s in config["sizes"] for v in config["variants"]]
    checks = {"C1": _c1, "C2": _c2, "C3": _c3}
    verdicts = []
    for claim, check in checks.items():
        per_cell = [check(_Cell(summary, c, roles), thresholds) for c in cells]
        absent = [roles[r].absent() for r in REQUIRED_ROLES[claim] if roles[r].strategy is None]
        verdict = _overall(claim, per_cell, absent)
        verdict.roles = {r: roles[r].strategy for r in CLAIM_ROLES[claim]}
        verdicts.append(verdict)
    verdicts.append(_c4(verdicts, config))
    return verdicts


class _Cell:
    """Means/stds of one (dataset, size, variant) cell, looked up by role; the reference by REFERENCE_INIT."""

    def __init__(self, summary: pd.DataFrame, cell: tuple[str, str, str], roles: dict[str, RoleMatch]):
        self.dataset, self.size, self.variant = cell
        self.roles = roles
        in_cell = summary[(summary["dataset"] == self.dataset) & (summary["size"] == self.size)]
        self.rows = {r.init: r for r in in_cell.itertuples()
                     if r.variant == self.variant or r.variant == REFERENCE_VARIANT}

    def _init(self, role: str) -> str | None:
        return REFERENCE_INIT if role == REFERENCE_INIT else self.roles[role].strategy

    def label(self, role: str) -> str:
        return "softmax reference" if role == REFERENCE_INIT else self.roles[role].label

    def missing(self, roles: list[str]) -> dict[str, str]:
        """The roles among `roles` with no finished seed -> a description: no strategy fills it, or seeds unfinished."""
        out = {}
        for role in roles:
            init = self._init(role)
            if init is None:
                out[role] = f"{self.roles[role].absent()}: no init strategy in the grid has this content"
            elif init not in self.rows:
                out[role] = f"{self.label(role)} (not in the grid)"
            elif self.rows[init].n_seeds == 0:
                out[role] = f"{self.label(role)} (0 of {self.rows[init].n_expected} seeds finished)"
        return out

    def acc(self, role: str) -> float:
        return self.rows[self._init(role)].test_acc_mean

    def describe(self, role: str) -> str:
        """'copy_all 71.20% ± 0.30 pp': the mean and its std over seeds, and how many seeds when not all finished."""
        r = self.rows[self._init(role)]
        spread = " (std n/a (1 seed))" if r.n_seeds == 1 else f" ± {100 * r.test_acc_std:.2f} pp"
        partial = f" ({r.n_seeds} of {r.n_expected} seeds finished)" if r.n_seeds < r.n_expected else ""
        return f"{self.label(role)} {pct(r.test_acc_mean)}{spread}{partial}"

    def verdict(self, claim: str, holds: bool | None, text: str, **numbers: float) -> CellVerdict:
        return CellVerdict(claim, self.dataset, self.size, self.variant, holds, text, numbers)

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


def _c1(c: _Cell, t: Thresholds) -> CellVerdict:
    missing = c.missing([RANDOM, COPY_ALL, COPY_MLP, ATTN_ONLY])
    if missing:
        return c.missing_results("C1", missing)
    total, total_text = _benefit(c)
    if total <= 0:
        return c.no_benefit("C1", total_text)
    strict = (c.acc(ATTN_ONLY) - c.acc(RANDOM)) / total
    symmetric = (c.acc(COPY_ALL) - c.acc(COPY_MLP)) / total
    holds = strict <= t.negligible and symmetric <= t.negligible
    text = (f"{'holds' if holds else 'does not hold'} (threshold: both shares <= {pct(t.negligible)}). "
            f"Strict: {c.describe(ATTN_ONLY)} vs {c.label(RANDOM)} gives {pct(strict)} of the benefit"
            f"{' (worse than random)' if strict < 0 else ''}; "
            f"symmetric: {c.label(COPY_ALL)} vs {c.describe(COPY_MLP)} gives {pct(symmetric)}"
            f"{' (copying attention on top of the rest hurts)' if symmetric < 0 else ''}; {total_text}.")
    return c.verdict("C1", holds, text, strict_fraction=strict, symmetric_fraction=symmetric, total_benefit=total)


def _c2(c: _Cell, t: Thresholds) -> CellVerdict:
    missing = c.missing([RANDOM, COPY_ALL, COPY_MLP])
    if missing:
        return c.missing_results("C2", missing)
    total, total_text = _benefit(c)
    if total <= 0:
        return c.no_benefit("C2", total_text)
    symmetric = (c.acc(COPY_MLP) - c.acc(RANDOM)) / total
    holds = symmetric >= t.most
    numbers = {"symmetric_fraction": symmetric, "total_benefit": total}
    if c.missing([MLP_ONLY]):
        strict_text = f"strict share not available ({c.missing([MLP_ONLY])[MLP_ONLY]})"
    else:
        strict = (c.acc(MLP_ONLY) - c.acc(RANDOM)) / total
        numbers["strict_fraction"] = strict
        strict_text = (f"strict: {c.describe(MLP_ONLY)} vs {c.label(RANDOM)} gives {pct(strict)}, "
                       f"which {'also clears' if strict >= t.most else 'does not clear'} the threshold")
    text = (f"{'holds' if holds else 'does not hold'} (threshold: symmetric share >= {pct(t.most)}). "
            f"Symmetric: {c.describe(COPY_MLP)} vs {c.label(RANDOM)} gives {pct(symmetric)} of the benefit; "
            f"{strict_text}; {total_text}.")
    return c.verdict("C2", holds, text, **numbers)


def _c3(c: _Cell, t: Thresholds) -> CellVerdict:
    missing = c.missing([COPY_MLP_DISTILL, REFERENCE_INIT])
    if missing:
        return c.missing_results("C3", missing)
    student, reference = c.acc(COPY_MLP_DISTILL), c.acc(REFERENCE_INIT)
    difference = student - reference
    holds = student >= reference - t.match_tolerance
    numbers = {"difference": difference}
    if c.missing([RANDOM]):
        gap_text = f"gap closed not available ({c.missing([RANDOM])[RANDOM]})"
    elif reference - c.acc(RANDOM) <= 0:
        gap_text = (f"gap closed undefined: the softmax reference does not beat random "
                    f"(denominator {pp(reference - c.acc(RANDOM))})")
    else:
        gap = (student - c.acc(RANDOM)) / (reference - c.acc(RANDOM))
        numbers["gap_closed"] = gap
        gap_text = f"gap closed {gap:.3f} (vs {c.describe(RANDOM)})"
    text = (f"{'holds' if holds else 'does not hold'} (threshold: within {pp(t.match_tolerance)} of the reference or above). "
            f"{c.describe(COPY_MLP_DISTILL)} vs {c.describe(REFERENCE_INIT)}: difference {pp(difference, sign=True)}, "
            f"{'surpasses' if difference > 0 else 'does not surpass'} the softmax model; {gap_text}.")
    return c.verdict("C3", holds, text, **numbers)


def _overall(claim: str, cells: list[CellVerdict], absent: list[str]) -> ClaimVerdict:
    evaluable = [c for c in cells if c.holds is not None]
    holding = sum(c.holds for c in evaluable)
    # Cells that cannot be evaluated for the same reason are named together, to keep the verdict one line.
    by_reason: dict[str, list[str]] = {}
    for c in cells:
        if c.holds is None:
            by_reason.setdefault(c.why, []).append(_key(c))
    skipped = [f"{why} in {_cells_phrase(keys, len(cells))}" for why, keys in by_reason.items()]
    if absent:
        verdict = f"not evaluable: no init strategy in the grid has the content of {'; '.join(absent)}"
    elif not cells:
        verdict = "not evaluable: the grid has no cells"
    elif not evaluable:
        verdict = "not evaluable: " + "; ".join(skipped)
    elif holding == len(evaluable):
        verdict = "supported"
    elif holding == 0:
        verdict = "not supported"
    else:
        verdict = f"partly supported ({holding} of {len(evaluable)} cells)"
    detail = f"Holds in {holding} of {len(evaluable)} evaluable cells ({len(cells)} in the grid)"
    if skipped and evaluable:
        detail += "; not evaluable: " + "; ".join(skipped)
    return ClaimVerdict(claim, STATEMENTS[claim], verdict, detail + ".", holding, len(evaluable), cells)


def _c4(verdicts: list[ClaimVerdict], config: dict) -> ClaimVerdict:
    """C1-C3 together, per cell; and which axes the grid spans at all."""
    cells = []
    for parts in zip(*(v.cells for v in verdicts)):
        where = (parts[0].dataset, parts[0].size, parts[0].variant)
        unknown = ", ".join(p.claim for p in parts if p.holds is None)
        failing = ", ".join(p.claim for p in parts if p.holds is False)
        if unknown:
            cells.append(CellVerdict("C4", *where, None, f"not evaluable: {unknown} not evaluable here",
                                     why=f"{unknown} not evaluable"))
        else:
            cells.append(CellVerdict("C4", *where, not failing,
                                     f"does not hold: {failing} fail" if failing else "C1-C3 all hold"))
    axes = {"datasets": config["targets"], "sizes": config["sizes"], "variants": config["variants"]}
    spanned = [f"{len(v)} {k}" for k, v in axes.items() if len(v) > 1]
    single = [f"{k} (the grid has 1: {v[0]})" for k, v in axes.items() if len(v) == 1]
    result = _overall("C4", cells, [])
    if not spanned:
        result.verdict = "not evaluable: the grid spans a single dataset, size and variant"
    counts = "; ".join(f"{v.claim} holds in {v.holds_in} of {v.evaluable} evaluable cells" for v in verdicts)
    scope = f"Tested across {', '.join(spanned) or 'nothing'}"
    if single:
        scope += f"; untested across {', '.join(single)}"
    result.detail = f"{scope}. {counts}. {result.detail}"
    return result


COST_ROLES = [RANDOM, COPY_MLP_DISTILL, REFERENCE_INIT]


def cost_table(runs: pd.DataFrame, curves: pd.DataFrame, config: dict) -> pd.DataFrame:
    """Student compute per cell for the random and copy_mlp_distill roles and the softmax reference
    (means over finished seeds); `init` names the strategy that fills the role.

    steps_to_random_acc: the first evaluated step at which a run reaches the final accuracy of the
    random-role run with the same seed, averaged over the seeds that reach it (seeds_reaching says how many).
    Teacher pretraining is not counted: it is shared by every student.
    """
    ok = runs[runs["status"] == "ok"]
    roles = resolve_roles(config)
    random_init = roles[RANDOM].strategy
    rows = []
    for dataset in config["targets"]:
        for size in config["sizes"]:
            for variant in config["variants"]:
                random_final = ok[(ok["dataset"] == dataset) & (ok["size"] == size) & (ok["variant"] == variant)
                                  & (ok["init"] == random_init)].set_index("seed")["test_acc"]
                for role in COST_ROLES:
                    reference = role == REFERENCE_INIT
                    init = REFERENCE_INIT if reference else roles[role].strategy
                    if init is None:
                        continue  # no strategy of the grid fills the role
                    done = ok[(ok["dataset"] == dataset) & (ok["size"] == size)
                              & (ok["variant"] == (REFERENCE_VARIANT if reference else variant)) & (ok["init"] == init)]
                    reach = [] if role == RANDOM else _steps_to_reach(curves, done, random_final)
                    rows.append({"dataset": dataset, "size": size, "variant": variant,
                                 "init": "softmax reference" if reference else roles[role].label,
                                 "n_seeds": len(done), "test_acc_mean": done["test_acc"].mean(),
                                 "steps_mean": done["steps"].mean(), "distill_steps_mean": done["distill_steps"].mean(),
                                 "train_time_s_mean": done["train_time_s"].mean(),
                                 "distill_time_s_mean": done["distill_time_s"].mean(),
                                 "total_time_s_mean": done["total_time_s"].mean(),
                                 "steps_to_random_acc": pd.Series(reach, dtype=float).mean(),
                                 "seeds_reaching": len(reach) if role != RANDOM else math.nan})
    return pd.DataFrame(rows)


def _steps_to_reach(curves: pd.DataFrame, done: pd.DataFrame, random_final: pd.Series) -> list[float]:
    steps = []
    for run in done.itertuples():
        if run.seed not in random_final.index:
            continue
        curve = curves[(curves["dataset"] == run.dataset) & (curves["size"] == run.size)
                       & (curves["variant"] == run.variant) & (curves["init"] == run.init) & (curves["seed"] == run.seed)]
        reached = curve[curve["test_acc"] >= random_final[run.seed]].sort_values("step")
        if len(reached):
            steps.append(float(reached["step"].iloc[0]))
    return steps


def claims_markdown(verdicts: list[ClaimVerdict]) -> str:
    """One section per claim: statement, verdict, detail, and the per-cell numbers."""
    parts = []
    for v in verdicts:
        parts.append(f"### {v.claim}: {v.statement}\n\n**Verdict: {v.verdict}.** {v.detail}\n")
        parts.extend(f"- `{_key(c)}`: {c.text}" for c in v.cells)
        parts.append("")
    return "\n".join(parts)


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
        used = f"`{match.strategy}`" if match.strategy else "none in the grid: not evaluable"
        rows.append(f"| {match.role.name} | {match.role.content} | {used} | {'; '.join(notes)} |")
    return "\n".join(rows)


def _cells_phrase(keys: list[str], total: int) -> str:
    return f"all {total} cells" if len(keys) == total and total > 1 else ", ".join(keys)


def _key(c: CellVerdict) -> str:
    return f"{c.dataset}/{c.size}/{c.variant}"


def pct(x: float) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{100 * x:.2f}%"


def pp(x: float, sign: bool = False) -> str:
    """An accuracy difference in percentage points."""
    return "n/a" if math.isnan(x) else f"{100 * x:{'+' if sign else ''}.2f} pp"
