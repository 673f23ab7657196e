"""The report's aggregate tables: the summary over seeds, the distillation designs and baselines,
and the students' compute (cost and the recipe's cost to reach the reference).

Numbers only; the prose that presents them is linvit.report.render's.
"""

from __future__ import annotations

import math

import pandas as pd

from linvit.claims.roles import COPY_MLP_DISTILL, RANDOM, is_baseline, resolve_roles, strategy_designs
from linvit.config import NO_DESIGN, budgets, design_names, design_specs, grid_cells
from linvit.grid import REFERENCE_INIT, REFERENCE_VARIANT, inits_of

CELL = ["dataset", "size", "variant", "budget"]  # a claim cell: students and reference of one budget
# One summary row per (cell, init, design): the statistics over seeds.
SUMMARY_KEYS = ["dataset", "size", "variant", "init", "design", "budget"]
SUMMARY_METRICS = ["steps", "distill_steps", "train_time_s", "distill_time_s", "total_time_s", "params",
                   "throughput_img_s", "fidelity_kl_mean", "fidelity_js_mean", "fidelity_corr_mean"]
SUMMARY_COLUMNS = SUMMARY_KEYS + ["n_seeds", "n_expected", "test_acc_mean", "test_acc_std", "gap_closed"] \
    + [f"{m}_mean" for m in SUMMARY_METRICS]



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
    if r.init == REFERENCE_INIT or random_init is None:
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
              "variant": list(dict.fromkeys([REFERENCE_VARIANT, *config["variants"]])),
              "init": [REFERENCE_INIT, *config["inits"]],
              "design": design_order(config)}
    keys = {col: frame[col].map({v: i for i, v in enumerate(order)}) for col, order in orders.items()}
    index = pd.DataFrame(keys, index=frame.index).sort_values(list(orders), kind="stable").index
    return frame.loc[index].reset_index(drop=True)



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
            if key is None or not (reference or key[0] in inits_of(config, variant)):
                continue  # no strategy of the grid fills the role, or this variant runs none (control_inits)
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
        if recipe.key is not None and recipe.key[0] not in inits_of(config, variant):
            continue  # the control's students take control_inits only
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
    """The claim cells the grid lists (grid_cells), cell by cell (each cell's budgets side by side)."""
    listed = grid_cells(config)
    return [(d, s, v, int(b)) for d in config["targets"] for s in config["sizes"] for v in config["variants"]
            for b in budgets(config) if (d, s, v, int(b)) in listed]


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
            if not (reference or init in inits_of(config, variant)):
                continue  # the control's students take control_inits only
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



def pct(x: float) -> str:
    return "n/a" if x is None or math.isnan(x) else f"{100 * x:.2f}%"


def pp(x: float, sign: bool = False) -> str:
    """An accuracy difference in percentage points."""
    return "n/a" if math.isnan(x) else f"{100 * x:{'+' if sign else ''}.2f} pp"
