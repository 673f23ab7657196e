"""Turn the runs table into per-seed statistics, gap closed, and a verdict for each claim C1-C4.

Every verdict is computed from the grid's own numbers and names them, whichever way they fall:
a claim that does not reproduce is a result. Only runs with status "ok" count; a verdict that needs
an init strategy the grid lacks, or whose results are missing, says "not evaluable" and why.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import pandas as pd

from linvit.grid import REFERENCE_INIT, REFERENCE_VARIANT

# The init strategies each claim compares, by their names in the config's init_strategies.
RANDOM, COPY_ALL, COPY_MLP, ATTN_ONLY, MLP_ONLY, COPY_MLP_DISTILL = (
    "random", "copy_all", "copy_mlp", "attn_only", "mlp_only", "copy_mlp_distill")
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

    def as_dict(self) -> dict:
        return asdict(self)


# ---------------------------------------------------------------------------------------------
# Statistics over seeds


def summarize(runs: pd.DataFrame, config: dict) -> pd.DataFrame:
    """Mean/std over seeds per (dataset, size, variant, init), with gap closed against random and the reference.

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
    summary["gap_closed"] = [_gap_closed(summary, r) for r in summary.itertuples()]
    return _ordered(summary, config)


def _std(values: pd.Series) -> float:
    # Sample std over seeds; undefined (NaN) with a single seed rather than a misleading 0.
    return float(values.std(ddof=1)) if len(values) > 1 else math.nan


def _gap_closed(summary: pd.DataFrame, r) -> float:
    if r.variant == REFERENCE_VARIANT:
        return math.nan
    random = _mean(summary, r.dataset, r.size, r.variant, RANDOM)
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
    cells = [(d, s, v) for d in config["targets"] for s in config["sizes"] for v in config["variants"]]
    inits = list(config["inits"])
    per_cell = {
        "C1": [_c1(_Cell(summary, c), thresholds) for c in cells],
        "C2": [_c2(_Cell(summary, c), thresholds) for c in cells],
        "C3": [_c3(_Cell(summary, c), thresholds) for c in cells],
    }
    needed = {"C1": [RANDOM, COPY_ALL, COPY_MLP, ATTN_ONLY], "C2": [RANDOM, COPY_ALL, COPY_MLP],
              "C3": [COPY_MLP_DISTILL]}
    verdicts = [_overall(claim, per_cell[claim], [i for i in needed[claim] if i not in inits])
                for claim in ("C1", "C2", "C3")]
    verdicts.append(_c4(verdicts, config))
    return verdicts


class _Cell:
    """Means/stds of one (dataset, size, variant) cell, looked up by init; the reference by REFERENCE_INIT."""

    def __init__(self, summary: pd.DataFrame, cell: tuple[str, str, str]):
        self.dataset, self.size, self.variant = cell
        in_cell = summary[(summary["dataset"] == self.dataset) & (summary["size"] == self.size)]
        self.rows = {r.init: r for r in in_cell.itertuples()
                     if r.variant == self.variant or r.variant == REFERENCE_VARIANT}

    def missing(self, inits: list[str]) -> dict[str, str]:
        """The inits among `inits` with no finished seed -> a description saying whether it is absent from the grid."""
        out = {}
        for init in inits:
            name = _name(init)
            if init not in self.rows:
                out[name] = f"{name} (not in the grid)"
            elif self.rows[init].n_seeds == 0:
                out[name] = f"{name} (0 of {self.rows[init].n_expected} seeds finished)"
        return out

    def acc(self, init: str) -> float:
        return self.rows[init].test_acc_mean

    def describe(self, init: str) -> str:
        """'copy_all 71.20% ± 0.30 pp': the mean and its std over seeds, and how many seeds when not all finished."""
        r = self.rows[init]
        name = _name(init)
        spread = " (std n/a (1 seed))" if r.n_seeds == 1 else f" ± {100 * r.test_acc_std:.2f} pp"
        partial = f" ({r.n_seeds} of {r.n_expected} seeds finished)" if r.n_seeds < r.n_expected else ""
        return f"{name} {pct(r.test_acc_mean)}{spread}{partial}"

    def verdict(self, claim: str, holds: bool | None, text: str, **numbers: float) -> CellVerdict:
        return CellVerdict(claim, self.dataset, self.size, self.variant, holds, text, numbers)

    def not_evaluable(self, claim: str, why: str, explanation: str) -> CellVerdict:
        verdict = self.verdict(claim, None, f"not evaluable: {explanation}")
        verdict.why = why
        return verdict

    def missing_results(self, claim: str, missing: dict[str, str]) -> CellVerdict:
        return self.not_evaluable(claim, f"missing results for {', '.join(missing)}",
                                  "missing " + ", ".join(missing.values()))

    def no_benefit(self, claim: str, total_text: str) -> CellVerdict:
        return self.not_evaluable(claim, "copying all weights does not beat random",
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
            f"Strict: {c.describe(ATTN_ONLY)} vs random gives {pct(strict)} of the benefit"
            f"{' (worse than random)' if strict < 0 else ''}; "
            f"symmetric: copy_all vs {c.describe(COPY_MLP)} gives {pct(symmetric)}"
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
        strict_text = (f"strict: {c.describe(MLP_ONLY)} vs random gives {pct(strict)}, "
                       f"which {'also clears' if strict >= t.most else 'does not clear'} the threshold")
    text = (f"{'holds' if holds else 'does not hold'} (threshold: symmetric share >= {pct(t.most)}). "
            f"Symmetric: {c.describe(COPY_MLP)} vs random gives {pct(symmetric)} of the benefit; "
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
        verdict = f"not evaluable: inits not in the grid: {', '.join(absent)}"
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


COST_INITS = [RANDOM, COPY_MLP_DISTILL, REFERENCE_INIT]


def cost_table(runs: pd.DataFrame, curves: pd.DataFrame, config: dict) -> pd.DataFrame:
    """Student compute per cell for random, copy_mlp_distill and the softmax reference (means over finished seeds).

    steps_to_random_acc: the first evaluated step at which a run reaches the final accuracy of the
    random-init run with the same seed, averaged over the seeds that reach it (seeds_reaching says how many).
    Teacher pretraining is not counted: it is shared by every student.
    """
    ok = runs[runs["status"] == "ok"]
    rows = []
    for dataset in config["targets"]:
        for size in config["sizes"]:
            for variant in config["variants"]:
                random_final = ok[(ok["dataset"] == dataset) & (ok["size"] == size) & (ok["variant"] == variant)
                                  & (ok["init"] == RANDOM)].set_index("seed")["test_acc"]
                for init in COST_INITS:
                    run_variant = REFERENCE_VARIANT if init == REFERENCE_INIT else variant
                    if init != REFERENCE_INIT and init not in config["inits"]:
                        continue
                    done = ok[(ok["dataset"] == dataset) & (ok["size"] == size)
                              & (ok["variant"] == run_variant) & (ok["init"] == init)]
                    reach = [] if init == RANDOM else _steps_to_reach(curves, done, random_final)
                    rows.append({"dataset": dataset, "size": size, "variant": variant,
                                 "init": "softmax reference" if init == REFERENCE_INIT else init,
                                 "n_seeds": len(done), "test_acc_mean": done["test_acc"].mean(),
                                 "steps_mean": done["steps"].mean(), "distill_steps_mean": done["distill_steps"].mean(),
                                 "train_time_s_mean": done["train_time_s"].mean(),
                                 "distill_time_s_mean": done["distill_time_s"].mean(),
                                 "total_time_s_mean": done["total_time_s"].mean(),
                                 "steps_to_random_acc": pd.Series(reach, dtype=float).mean(),
                                 "seeds_reaching": len(reach) if init != RANDOM else math.nan})
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


def _cells_phrase(keys: list[str], total: int) -> str:
    return f"all {total} cells" if len(keys) == total and total > 1 else ", ".join(keys)


def _name(init: str) -> str:
    return "softmax reference" if init == REFERENCE_INIT else init


def _key(c: CellVerdict) -> str:
    return f"{c.dataset}/{c.size}/{c.variant}"


def pct(x: float) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{100 * x:.2f}%"


def pp(x: float, sign: bool = False) -> str:
    """An accuracy difference in percentage points."""
    return "n/a" if math.isnan(x) else f"{100 * x:{'+' if sign else ''}.2f} pp"
