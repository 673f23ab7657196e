"""report/README.md's sections: scale, verdicts, grid covered, summary, figures, claims, decisions, positive
control, designs and baselines, cost, missing cells, provenance, in that order (`render_readme`), each from
the report's tables. linvit.report.render writes the files; the two sections that come with files of their
own (the operator benchmark's, the harness benchmarks') are written there.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from linvit.claims.judge import intervals_over
from linvit.claims.roles import COPY_MLP_DISTILL, resolve_roles
from linvit.claims.verdicts import ClaimVerdict
from linvit.config import NO_DESIGN, REFERENCE_INIT, budgets, design_names, design_specs, pretrained
from linvit.figure_registry import figure
from linvit.grid import CONTROL_VARIANT, Cell, shards_dir, teacher_of
from linvit.io import read_json
from linvit.report.aggregate import STATUSES, rule_costs
from linvit.report.claims_text import (budget_markdown, claims_markdown, control_markdown, coverage_section,
                                       mde_markdown, roles_markdown, rules_markdown, verdicts_table)
from linvit.report.decisions import displayed, seed_ranges, section as decisions_section
from linvit.report.tables import designs_table, pct, training_text, unequal_distillation
from linvit.stats.sequential import Plan


def render_readme(config: dict, runs: pd.DataFrame, summary: pd.DataFrame, verdicts: list[ClaimVerdict],
                  costs: pd.DataFrame, figures: list[Path], scaling: str = "", jobs: pd.DataFrame | None = None,
                  designs: pd.DataFrame | None = None, harness: str = "", provenance: str = "",
                  results: str | Path = "results") -> str:
    designs = designs_table(summary, config) if designs is None else designs
    random = resolve_roles(config)["random"].strategy
    gap = (f"Gap closed = (acc_init - acc_{random}) / (acc_softmax_reference - acc_{random}), against `{random}`, "
           "the strategy that copies nothing and trains on the task loss alone, and the softmax reference, both "
           "trained with the same budget (see Claims)." if random else
           "Gap closed is not available: no strategy of the grid copies nothing and trains on the task loss alone "
           "(the random role, see Claims).")
    # The verdicts in the words of the design that produced them (claims.json keeps the engine's: linvit decide
    # reads it); the Decisions section reads the engine's and says the same.
    shown = displayed(config, verdicts, results)
    plan = Plan.from_config(config)
    summary_table, constant = _drop_constant(
        display_summary(summary)[["dataset", "size", "variant", "budget", "init", "design", "seeds", "test acc",
                                  "gap closed"]], ["budget", "design"])
    sections = [
        "# linvit report\n\nRegenerated from `results/` by `linvit.report`; every number below comes from the "
        "runs' own result files. Accuracies are top-1 on each target's test split; std is over seeds.",
        "## Scale\n\n" + scale_markdown(config, runs, results) + "\n\n" + mde_markdown(shown, config),
        "## Verdicts\n\n" + verdicts_table(shown) + "\n\nEach claim's tests, intervals and minimum detectable "
        "effects are under [Claims](#claims); the softmax control under [Positive control](#positive-control).",
        "## Grid covered\n\n" + _grid_section(config, runs),
        "## Summary\n\n" + gap + constant + " Full table: [summary.csv](summary.csv), [summary.md](summary.md).\n\n"
        + _markdown(summary_table),
        "## Figures\n\n" + _figures_section(figures),
        "## Claims\n\n" + _roles_section(config) + "\n\n### How the verdicts are reached\n\n"
        + rules_markdown(config) + "\n\n" + coverage_section(config) + "\n\n" + _budgets_section(shown)
        + claims_markdown(shown, plan, config),
        decisions_section(config, verdicts, jobs, results),  # '' under a fixed design
        "## Positive control\n\n" + control_markdown(shown, config),
        "## Distillation designs and baselines\n\n" + _designs_section(designs, config),
        "## Cost\n\n" + _cost_section(costs, jobs, config),
        "## Missing cells and failed runs\n\n" + _missing_section(runs),
    ]
    if scaling:
        sections.insert(-1, scaling)
    if harness:
        sections.insert(-1, harness)
    if provenance:
        sections.append("## Provenance\n\n" + provenance)
    return "\n\n".join(s.rstrip() for s in sections if s) + "\n"


def scale_markdown(config: dict, runs: pd.DataFrame, results: str | Path) -> str:
    """At what scale the grid ran (model, images seen as a fraction of an epoch, the teacher's accuracy)
    and what that scale can and cannot say about the paper: said before any verdict."""
    results = Path(results)
    train = (config.get("student") or {}).get("train") or {}
    batch = int(train.get("batch_size", 0) or 0)
    lines = []
    for size in config["sizes"]:
        params = runs.loc[(runs["size"] == size) & (runs["init"] == REFERENCE_INIT), "params"] \
            if "params" in runs else pd.Series(dtype=float)
        params_text = f"{int(params.dropna().iloc[0]):,} parameters" if params.notna().any() else "parameters n/a"
        folders = dict.fromkeys(teacher_of(config, size, seed, results) for seed in config["seeds"])
        entry = pretrained(config, size)
        if entry is not None:  # loaded, not trained here: no test accuracy of ours to show
            loaded = (f"its {len(folders)} softmax teachers are pretrained checkpoints of `{entry.get('model')}`, "
                      f"one per seed (`teachers.{size}.replicates`)" if len(folders) > 1 else
                      f"its softmax teacher is the pretrained checkpoint `{entry.get('model')}`")
            lines.append(f"- Model `{size}` ({params_text}); {loaded}.")
            continue
        accs = [_read_json(Path(f) / "metrics.json").get("test_acc") for f in folders]
        accs = [a for a in accs if isinstance(a, (int, float))]
        on = (config.get("teacher") or {}).get("dataset", "its pretraining data")
        if len(folders) > 1:
            reach = (f"its {len(folders)} softmax teachers reach {pct(min(accs))} to {pct(max(accs))}"
                     f"{'' if len(accs) == len(folders) else f' ({len(folders) - len(accs)} without metrics)'}"
                     if accs else f"its {len(folders)} softmax teachers: n/a (no teacher metrics)")
        else:
            reach = f"its softmax teacher reaches {pct(accs[0]) if accs else 'n/a (no teacher metrics)'}"
        lines.append(f"- Model `{size}` ({params_text}); {reach} on {on}'s test split.")
    for dataset in config["targets"]:
        info = _read_json(Path(shards_dir(dataset, results)) / "_info.json")
        n_train = ((info.get("splits") or {}).get("train") or {}).get("samples")
        n_test = ((info.get("splits") or {}).get("test") or {}).get("samples")
        for budget in budgets(config):
            seen = budget * batch
            epoch = f" = {seen / n_train:.2f} of an epoch of its {n_train:,} training images" if n_train else ""
            lines.append(f"- Target `{dataset}`: each student sees {budget} steps x {batch} = {seen:,} images"
                         f"{epoch}; {n_test:,} test images" if n_test else
                         f"- Target `{dataset}`: each student sees {budget} steps x {batch} = {seen:,} images{epoch}")
    seeds = len(config["seeds"])
    per_cell = f"{seeds} seed{'s' if seeds != 1 else ''} per cell"
    if config.get("sequential"):  # later looks add seeds only where a test is undecided (Decisions section)
        per_cell += (f" at look 1, up to {config['sequential']['looks'][-1]} for the roles of a test still "
                     "undecided (a sequential plan)")
    lines.append(f"- {per_cell} (the unit of replication). The verdicts' intervals are {intervals_over(config)}.")
    harness = ", with teachers pretrained by the harness" if not any(pretrained(config, s) for s in config["sizes"]) \
        else ""
    return ("\n".join(lines) + "\n\nAt this scale the verdicts test whether the paper's effects appear in small "
            f"ViTs trained for a fraction of an epoch{harness}; they cannot say "
            "whether the effects hold for DeiT/ViT models pretrained on ImageNet and trained to convergence, where "
            "the paper works (workflow/config/paper.yaml). The smallest effect each test could have seen (its MDE) "
            "is in the claims' tables.")


def _read_json(path: Path) -> dict:
    """The file's JSON object, or {} when it is missing or unreadable: the scale section then says n/a."""
    try:
        return read_json(path)
    except (OSError, ValueError):
        return {}


def display_summary(summary: pd.DataFrame) -> pd.DataFrame:
    """The summary with readable strings: accuracy in %, std in percentage points, 'n/a' for undefined."""
    out = summary[["dataset", "size", "variant", "init", "design", "budget"]].copy()
    out["seeds"] = [f"{r.n_seeds}/{r.n_expected}" for r in summary.itertuples()]
    out["test acc"] = [_acc_text(r.test_acc_mean, r.test_acc_std, r.n_seeds) for r in summary.itertuples()]
    out["gap closed"] = [_num(g, ".3f") for g in summary["gap_closed"]]
    out["steps"] = [_num(s, ".0f") for s in summary["steps_mean"]]
    out["distill steps"] = [_num(s, ".0f") for s in summary["distill_steps_mean"]]
    out["train + distill time (s)"] = [_num(t, ".1f") for t in summary["total_time_s_mean"]]
    out["params"] = [_num(p, ".0f") for p in summary["params_mean"]]
    out["throughput (img/s)"] = [_num(t, ".1f") for t in summary["throughput_img_s_mean"]]
    out["fidelity KL"] = [_num(k, ".4f") for k in summary["fidelity_kl_mean_mean"]]
    out["fidelity JS"] = [_num(k, ".4f") for k in summary["fidelity_js_mean_mean"]]
    out["map corr."] = [_num(k, ".3f") for k in summary["fidelity_corr_mean_mean"]]
    return out


def _drop_constant(frame: pd.DataFrame, columns: list[str]) -> tuple[pd.DataFrame, str]:
    """Leave out those of `columns` that hold one value in every row, and say it in a sentence instead
    (' All rows: budget 200 steps.'), so a grid without the axis reads as before."""
    notes, drop = [], []
    for col in columns:
        values = frame[col].unique() if col in frame and len(frame) else []
        if len(values) == 1:
            drop.append(col)
            notes.append(f"{col} {values[0]} steps" if col == "budget" else f"{col} {values[0]}")
    return frame.drop(columns=drop), (f" All rows: {', '.join(notes)}." if notes else "")


def _grid_section(config: dict, runs: pd.DataFrame) -> str:
    strategies = config.get("init_strategies") or {}
    grid_budgets = budgets(config)
    lines = [
        f"- Targets: {', '.join(map(str, config['targets']))}",
        f"- Sizes: {', '.join(map(str, config['sizes']))}",
        "- Variants: " + ", ".join(f"{v} (control)" if v == CONTROL_VARIANT else str(v) for v in config["variants"]),
        f"- Seeds: {_seeds_line(config)}",
        f"- Teacher pretrained on: {(config.get('teacher') or {}).get('dataset', 'not given in the config')}",
        f"- Budgets: {', '.join(f'{b} steps' for b in grid_budgets)}. A budget is the number of training steps "
        "each student, and the softmax reference it is compared with, gets on the target (stage 2); every "
        "comparison below (gap closed, claims, designs) is made between runs of the same budget.",
    ]
    used = _designs_used(config)
    if used:
        lines.append("- Distillation designs: " + ", ".join(f"`{d}`" for d in used) + ". A design is the "
                     "recipe of the distillation before training (stage 1): its losses, which parameters train, "
                     "and its phases; every design gets the same distillation steps (`distill.train.steps`), so "
                     "designs compare at equal distillation compute.")
        specs = design_specs(config)
        lines += [f"  - `{d}`: {_design_text(specs.get(d))}" for d in used]
    lines.append("- Init strategies:")
    filled = {}
    for match in resolve_roles(config).values():
        if match.strategy:
            filled.setdefault(match.strategy, []).append(match.role.name)
    for init in config["inits"]:
        spec = strategies.get(init)
        if spec is None:
            lines.append(f"  - `{init}`: not defined under init_strategies")
            continue
        groups = ", ".join(spec.get("copy") or []) or "nothing"
        description = f" ({spec['description']})" if spec.get("description") else ""
        roles = f" (the claims' {' and '.join(filled[init])} role)" if init in filled else ""
        distill = spec.get("distill")
        if isinstance(distill, str):
            how = f"distilled by the fixed design `{distill}`"
        elif distill:
            how = "distilled by each of the grid's designs (" + (", ".join(f"`{d}`" for d in design_names(config))
                                                                or "none given") + ")"
        else:
            how = "no distillation"
        training = training_text(spec)
        trains = "" if training == "task" else f"; trains on {training}"
        lines.append(f"  - `{init}`{description}: copies {groups}; {how}{trains}{roles}")
    counts = runs["status"].value_counts()
    # Failure statuses are named when they occur; "missing" always, so a complete grid says "0 missing".
    states = [f"{int(counts.get(s, 0))} {'finished' if s == 'ok' else s}" for s in STATUSES
              if s in ("ok", "missing") or counts.get(s, 0)]
    lines.append(f"- Cells: {len(runs)} expected (students and softmax references), {', '.join(states)}")
    return "\n".join(lines)


def _seeds_line(config: dict) -> str:
    """The grid's seeds; under a sequential plan every seed its looks used: the configured ones (look 1) and those
    later looks added (`added_seeds`) to the roles of undecided tests, with the cap."""
    seeds = ", ".join(map(str, config["seeds"]))
    plan = config.get("sequential")
    if not isinstance(plan, dict) or not plan.get("looks"):
        return seeds
    first = [int(s) for s in config["seeds"]]
    added = sorted({int(s) for a in config.get("added_seeds") or [] if isinstance(a, dict)
                    for s in a.get("seeds") or []} - set(first))
    used = seed_ranges(tuple(first + added))
    later = (f"; {seed_ranges(tuple(added))} added by later looks to the roles of undecided tests" if added else
             "; no later look added seeds")
    return (f"{used} ({seed_ranges(tuple(first))} the grid as configured, look 1{later}; the plan's cap: "
            f"{plan['looks'][-1]} seeds)")


def _designs_used(config: dict) -> list[str]:
    """The designs the grid's strategies run with: the `distills` axis (when a strategy takes it), then
    the fixed designs, in config order."""
    strategies = config.get("init_strategies") or {}
    used = []
    for init in config["inits"]:
        distill = (strategies.get(init) or {}).get("distill")
        used += [distill] if isinstance(distill, str) else design_names(config) if distill else []
    return [d for d in dict.fromkeys(used) if d != NO_DESIGN]


def _design_text(spec: dict | None) -> str:
    """A design's description, else its losses ('out_mse + map_ce x0.1'; phases joined by ', then ')."""
    if not isinstance(spec, dict):
        return "not defined under distill_designs"
    if spec.get("description"):
        return str(spec["description"])
    phases = spec.get("phases") or [spec]
    text = ", then ".join(training_text({"task_weight": 0, "train_losses": p.get("losses") or []}) for p in phases)
    frozen = all(p.get("freeze", spec.get("freeze", True)) for p in phases)
    return text + ("" if frozen else " (all parameters train)")


def _figures_section(figures: list[Path]) -> str:
    """Each figure's PNG with its caption (its entry's in linvit.figure_registry) and a link to its SVG."""
    blocks = []
    for png in (f for f in figures if f.suffix == ".png"):
        name, caption = png.stem.replace("_", " "), figure(png.stem).caption
        blocks.append(f"![{name}]({png.as_posix()})\n\n{caption + ' ' if caption else ''}({name}; vector: "
                      f"[{png.with_suffix('.svg').name}]({png.with_suffix('.svg').as_posix()}))")
    return "\n\n".join(blocks)


def _roles_section(config: dict) -> str:
    return ("The claims compare init strategies by what they copy from the teacher, not by name: each role "
            "below is filled by the strategy of the grid's `inits` whose `init_strategies` entry has that "
            "content (`attn_extra` is never copied, so it is ignored). A role trains on the task loss alone, so "
            "a strategy with `train_losses` (a literature baseline such as logit KD) never fills one. A "
            "distilling role is compared at its strategy's primary design: the one it names, else the first "
            "of `distills`. Each claim is judged per (dataset, size, variant, budget) cell, against the random "
            "role and the softmax reference of the same budget.\n\n" + roles_markdown(config))


def _budgets_section(verdicts: list[ClaimVerdict]) -> str:
    """The claim x budget table (skipped for a single budget: the verdicts say it all)."""
    if not verdicts or len(verdicts[0].by_budget) < 2:
        return ""
    return ("Each claim at each budget: in how many of the cells where it can be evaluated it holds.\n\n"
            + budget_markdown(verdicts) + "\n\n")


def _designs_section(designs: pd.DataFrame | None, config: dict) -> str:
    """Every distilling (init, design) and literature baseline beside the paper's recipe, per cell and
    budget: accuracy, gap closed, distillation steps and time, total time."""
    if designs is None or designs.empty:
        return ("No distilling strategy and no literature baseline (a strategy with `train_losses` or a fixed "
                "design) in the grid.")
    recipe = resolve_roles(config)[COPY_MLP_DISTILL]
    table = pd.DataFrame({
        "cell": [f"{r.dataset}/{r.size}/{r.variant}" for r in designs.itertuples()],
        "budget": designs["budget"],
        "strategy": [f"`{i}`" if i != REFERENCE_INIT else "softmax reference" for i in designs["init"]],
        "design": [("—" if d == NO_DESIGN else f"`{d}`") + (" *" if c else "")
                   for d, c in zip(designs["design"], designs["claims_design"])],
        "kind": designs["kind"],
        "stage-2 loss": designs["training"],
        "seeds": [f"{n}/{e}" for n, e in zip(designs["n_seeds"], designs["n_expected"])],
        "test acc": [_acc_text(m, sd, n) for m, sd, n in
                     zip(designs["test_acc_mean"], designs["test_acc_std"], designs["n_seeds"])],
        "gap closed": [_num(g, ".3f") for g in designs["gap_closed"]],
        "distill steps": [_num(x, ".0f") for x in designs["distill_steps_mean"]],
        "distill time (s)": [_num(x, ".1f") for x in designs["distill_time_s_mean"]],
        "total time (s)": [_num(x, ".1f") for x in designs["total_time_s_mean"]],
    })
    table, constant = _drop_constant(table, ["cell", "budget"])
    recipe_text = (f"the paper's recipe (`{recipe.strategy}`, the copy_mlp_distill role, under each of its designs; "
                   "* marks the design the claims use)" if recipe.strategy else
                   "the paper's recipe (no strategy of the grid fills the copy_mlp_distill role)")
    text = ("Every distilling strategy under each of its designs, and the literature's baselines (strategies with "
            f"`train_losses` or one fixed design), beside {recipe_text} and the softmax reference. All designs get "
            "the same distillation steps (`distill.train.steps`), so they compare at equal distillation compute; "
            "total time = distillation + training (means over finished seeds; the teacher's pretraining is shared "
            f"and not counted).{constant}\n\n" + _markdown(table))
    unequal = unequal_distillation(designs)
    if unequal:
        text += ("\n\nNot at equal distillation compute (mean distillation steps differ):\n"
                 + "\n".join(f"- {u}" for u in unequal))
    return text


def _cost_section(costs: pd.DataFrame, jobs: pd.DataFrame | None, config: dict) -> str:
    parts = [_rule_cost_section(jobs, config)] if jobs is not None else []
    if costs.empty:
        parts.append("No cells to compare.")
        return "\n\n".join(parts)
    table = costs[["dataset", "size", "variant", "budget", "init"]].copy()
    table["seeds"] = costs["n_seeds"]
    table["test acc"] = [pct(a) for a in costs["test_acc_mean"]]
    table["train steps"] = [_num(s, ".0f") for s in costs["steps_mean"]]
    table["distill steps"] = [_num(s, ".0f") for s in costs["distill_steps_mean"]]
    table["train time (s)"] = [_num(t, ".1f") for t in costs["train_time_s_mean"]]
    table["distill time (s)"] = [_num(t, ".1f") for t in costs["distill_time_s_mean"]]
    table["total time (s)"] = [_num(t, ".1f") for t in costs["total_time_s_mean"]]
    table["steps to random's final acc"] = [
        _reach_text(s, n, k) for s, n, k in zip(costs["steps_to_random_acc"], costs["seeds_reaching"], costs["n_seeds"])]
    table, constant = _drop_constant(table, ["budget"])
    parts.append("Student compute per cell and budget for the random and copy_mlp_distill roles and the softmax "
                 "reference (means over finished seeds, as measured inside training); the teacher's pretraining is "
                 "shared by every student and not counted. The last column is the first evaluated training step at "
                 "which a run reaches the final accuracy of the random-role run with the same seed and budget."
                 + constant + "\n\n" + _markdown(table))
    return "\n\n".join(parts)


def _rule_cost_section(jobs: pd.DataFrame, config: dict) -> str:
    """Wall-clock and peak memory per rule from Snakemake's benchmark files (results/benchmarks/)."""
    problems = [p for p in jobs["problem"] if p]
    notes = "".join(f"\n- unreadable benchmark: {p}" for p in problems)
    if not jobs["wall_s"].notna().any():
        return ("No benchmark files under results/benchmarks/ (the runs were not made by Snakemake, or not yet): "
                "no wall-clock or memory per job." + notes)
    costs = rule_costs(jobs, config)
    table = pd.DataFrame({
        "rule": costs["rule"],
        "jobs benchmarked": [f"{b} of {j}" for b, j in zip(costs["benchmarked"], costs["jobs"])],
        "wall-clock total (s)": [_num(x, ".1f") for x in costs["wall_s_total"]],
        "wall-clock per job (s)": [_num(x, ".1f") for x in costs["wall_s_mean"]],
        "peak memory (MB)": [_num(x, ".0f") for x in costs["max_rss_mb_peak"]],
        "cpu time total (s)": [_num(x, ".1f") for x in costs["cpu_time_s_total"]],
    })
    return ("Per Snakemake rule, from its benchmark files (`results/benchmarks/<rule>/...tsv`): distillations per "
            "init strategy and design (one job per cell and seed, shared by every budget), students per init "
            "strategy (every design and budget); wall-clock seconds "
            "(mean over a job's repeats) summed over jobs, and per job; peak memory is the highest max_rss of any "
            "job. Totals add job times, so they exceed the elapsed time when jobs ran in parallel. CPU time is "
            "what Snakemake's sampler saw (every 0.5 s for a job's first 15 s, then every 30 s): a lower bound, "
            "missing what a job used after its last sample. Per run, "
            "runs.csv has train_wall_s and train_max_rss_mb (the job that trained and evaluated the run).\n\n"
            + _markdown(table) + notes)


def _reach_text(step: float, reaching: float, seeds: int) -> str:
    if math.isnan(reaching) or seeds == 0:
        return "n/a"  # the random row itself, or nothing finished
    if reaching == 0:
        return f"not reached ({seeds} seeds)"
    return f"{step:.0f} ({reaching:.0f} of {seeds} seeds)"


def _missing_section(runs: pd.DataFrame) -> str:
    """Every cell that is not ok, with its status (missing, diverged, invalid) and the reason."""
    failed = runs[runs["status"] != "ok"]
    if failed.empty:
        return "none"
    return "\n".join(f"- `{Cell(r.dataset, r.size, r.variant, r.init, int(r.seed), r.design, int(r.budget)).key}` "
                     f"({r.status}): {r.reason}" for r in failed.itertuples())


def _markdown(frame: pd.DataFrame) -> str:
    # disable_numparse: the cells are already formatted strings; tabulate would otherwise re-format them.
    return frame.to_markdown(index=False, disable_numparse=True) if not frame.empty else "(no rows)"


def _acc_text(mean: float, std: float, n: int) -> str:
    if n == 0:
        return "missing"
    return f"{pct(mean)} ± n/a (1 seed)" if n == 1 else f"{pct(mean)} ± {100 * std:.2f} pp"


def _num(x: float, fmt: str) -> str:
    return "n/a" if x is None or pd.isna(x) else format(x, fmt)
