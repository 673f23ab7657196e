"""The claims in words: the rules (generated from linvit.report.claims.CLAIMS), the verdict tables,
the positive control, the minimum detectable effects and the roles, as markdown for the report."""

from __future__ import annotations

import math

from linvit.config import CHECKPOINTS, NO_DESIGN, ONE_TEACHER, PER_SEED, replicated, teacher_design
from linvit.report import stats
from linvit.report.claims import (CLAIMS, CONTROL_NARROWED, CONTROL_VARIANT, NOT_EVALUABLE, ClaimVerdict,
                                  Thresholds, TestOutcome, intervals_over, linear_variants)
from linvit.report.roles import resolve_roles

_STATISTICS = {t.statistic.name: t.statistic for c in CLAIMS for t in c.tests}
_THRESHOLD_KEYS = {"negligible": "`claims.negligible`", "most": "`claims.most`", "-margin": "`claims.margin`",
                   "zero": "0"}


def number(name: str, x: float) -> str:
    """A share in %, a difference in pp (signed); 'n/a' for NaN, ±inf as such."""
    if x is None or math.isnan(x):
        return "n/a"
    if math.isinf(x):
        return "+inf" if x > 0 else "-inf"
    share = _STATISTICS[name].is_share if name in _STATISTICS else False
    return f"{100 * x:+.1f}%" if share else f"{100 * x:+.2f} pp"


def interval(t: TestOutcome) -> str:
    """'+12.3% [+5.0%, +19.6%]'; the estimate alone when there is no interval."""
    if math.isnan(t.low) or math.isnan(t.high):
        return f"{number(t.name, t.estimate)} [no interval]"
    return f"{number(t.name, t.estimate)} [{number(t.name, t.low)}, {number(t.name, t.high)}]"


def _threshold_text(name: str, t: Thresholds) -> str:
    value = t.value(name)
    shown = f"{100 * value:g}%" if name in ("negligible", "most") else f"{100 * value:+g} pp"
    return shown + (f" ({_THRESHOLD_KEYS[name]})" if name != "zero" else "")


def rules_markdown(config: dict) -> str:
    """How the verdicts are reached, in words, generated from CLAIMS and the config's `claims`."""
    s, t = stats.Settings.from_config(config), Thresholds.from_config(config)
    level = f"{100 * s.level:g}%"
    lines = [
        f"Seeds are the unit of replication. Each test pairs its roles' runs by seed (the seeds every role "
        f"finished) and by test image. Its statistic is a difference of accuracies, or a share of a benefit "
        f"(a ratio of two differences). The {level} interval (`claims.level`) is a t interval over the per-seed "
        f"paired values with n - 1 degrees of freedom, the variance of the test images' sampling added; a share's interval is Fieller's, unbounded when its denominator is not clearly positive. A "
        f"test **holds** when its interval lies wholly on the claim's side of the threshold, **fails** when it "
        f"lies wholly on the other side (each a one-sided test at {100 * s.alpha:g}%), and is **inconclusive** "
        f"otherwise. With fewer than {s.min_seeds} seeds (`claims.min_seeds`) a test is **too few seeds**, never "
        f"holds or fails. A claim holds in a cell when all its deciding tests hold, and fails when one fails at "
        f"the Bonferroni level across them. The minimum detectable effect (MDE) is the distance from the "
        f"threshold that the test would detect with 80% power at the cell's seeds and images. For a deciding "
        f"test that is undecided (inconclusive or too few seeds), *seeds to decide* is the number of paired "
        f"seeds{_teachers_too(config)} at which it would hold (at {100 * s.alpha:g}%) or fail (at the claim's "
        f"Bonferroni level) with 80% power if the truth were its current estimate (the seed-to-seed variance "
        f"shrinking with seeds, the test images' sampling not; a share also needs its benefit established): "
        f"what a larger run would need. It is rough (observed power: the estimate taken for the truth), so the "
        f"range for truths in the estimate's 50% interval is given beside it. Every interval is "
        f"{claims_intervals(config)}.",
        "",
    ]
    for claim in CLAIMS:
        lines.append(f"- **{claim.name}**: {claim.statement}")
        for test in claim.tests:
            stat = test.statistic
            what = f"{stat.label}: `{stat.formula()}`"
            if test.threshold is None:
                lines.append(f"  - reported: {what}, with its interval")
            else:
                role = "decides" if test.decides else "reported"
                lines.append(f"  - {role}: {what} {test.side} {_threshold_text(test.threshold, t)}")
        if claim.note:
            lines.append(f"  - {claim.note}")
    lines.append("- **C4**: C1-C3 per linear cell and budget; holds in a cell when all three hold there (each at "
                 f"{100 * s.alpha:g}%: holding everywhere needs every cell to hold, so no correction is needed), "
                 "and fails there only when a claim's failure survives Holm's correction across every (claim, "
                 f"cell, budget) of the grid, one family: a failure read anywhere, at any budget, is spurious at "
                 f"most {100 * s.alpha:g}% of the time. An axis (datasets, sizes, variants) that the grid does not "
                 "vary is *not tested*.")
    lines.append("- A claim is *supported* when it holds in every cell where it is judged, *not supported* when it "
                 "fails in every one, and otherwise *mixed* with the counts. Cells of the softmax control variant "
                 "decide nothing: they are shown beside the linear variants (positive control).")
    return "\n".join(lines)


def coverage_section(config: dict | None = None) -> str:
    """The engine's calibration by simulation (linvit.report.calibration's packaged table): the rows of the
    teacher design(s) this grid uses (`teacher.seed`; a pretrained checkpoint is one teacher, `replicates` one per
    seed), all without
    a config."""
    from linvit.report.calibration import coverage_markdown

    designs = None
    applies = ""
    if config and config.get("sizes"):
        used = {PER_SEED if replicated(config, size) else ONE_TEACHER for size in config["sizes"]}
        designs = tuple(d for d in (PER_SEED, ONE_TEACHER) if d in used)
        per_seed = ("a teacher (or checkpoint) per seed, so the intervals cover the teacher-to-teacher variation "
                    "too (the first table)")
        one = ("one teacher (or checkpoint) for every seed: conditional on it the verdicts are calibrated (the "
               "'given the teacher' columns), but read as statements about teachers in general their intervals "
               "undercover, the more so the more seeds (the 'coverage' columns)")
        applies = (f" This grid uses {per_seed}." if used == {PER_SEED} else f" This grid uses {one}."
                   if used == {ONE_TEACHER} else f" Some sizes of this grid use {per_seed}; others {one}.")
    text = ("The engine's calibration, by simulation of grids whose truth is known (shaped like a reference run; "
            "`python -m linvit.report.calibration` regenerates it): how often the 95% interval covers the truth, "
            "and how often a verdict is wrong (holds where the truth fails, or the other way round)." + applies
            + "\n\n" + coverage_markdown(designs=designs))
    if config and config.get("sequential") is not None:
        # A sequential grid reads its tests at looks: its calibration is the one under that stopping rule,
        # with what it saves against a fixed design at the cap.
        from linvit.report.calibration_sequential import sequential_markdown

        text += ("\n\n**Under the sequential design** (this grid's plan is read this way; "
                 "`python -m linvit.report.calibration_sequential` regenerates it): the repeated intervals' coverage "
                 "at the stopping look, wrong verdicts over the whole sequence, naive rereading of the fixed-n "
                 "interval at the same looks beside it, and the expected seeds and training jobs against a fixed "
                 "design at the cap.\n\n" + sequential_markdown())
    return text


def claims_markdown(verdicts: list[ClaimVerdict]) -> str:
    """One section per claim: statement, verdict, and per cell every test with its interval and MDE."""
    parts = []
    notes = {c.name: c.note for c in CLAIMS}
    for v in verdicts:
        over = f" Intervals {v.intervals}." if v.intervals else ""
        parts.append(f"### {v.claim}: {v.statement}\n\n**Verdict: {v.verdict}.**{over} {counts_text(v.counts)}")
        if v.claim == "C4":
            parts.append("\n".join(f"- across {axis}: {text}" for axis, text in v.axes.items()))
            parts += [f"- `{c.key}`: {c.outcome}" + (f" ({c.why})" if c.why else "") + " — "
                      + ", ".join(f"{k} {o}" for k, o in c.parts.items()) for c in v.cells]
            continue
        if notes.get(v.claim):
            parts.append(notes[v.claim])
        rows = ["| cell | test | statistic | estimate [interval] | threshold | outcome | MDE | seeds to decide | "
                "seeds x images |", "|---|---|---|---|---|---|---|---|---|"]
        for c in v.cells:
            rows.append(f"| `{c.key}` | **claim** | | | | **{c.outcome}**{_why(c.why)} | | | |")
            rows += [_test_row(c.key, t) for t in c.tests]
        parts.append("\n".join(rows))
    return "\n\n".join(parts)


def _why(why: str) -> str:
    return f": {why}" if why else ""


def _test_row(key: str, t: TestOutcome) -> str:
    stat = _STATISTICS[t.name]
    label = stat.label + ("" if t.decides else " (reported)")
    if t.outcome == NOT_EVALUABLE:
        return f"| | {label} | `{stat.formula()}` | n/a | | {NOT_EVALUABLE}: {t.note} | | | |"
    threshold = "" if math.isnan(t.threshold) else f"{t.side} {number(t.name, t.threshold)}"
    mde = "" if math.isnan(t.mde) else number(t.name, t.mde).lstrip("+")
    note = f" ({t.note})" if t.note else ""
    return (f"| | {label} | `{stat.formula()}` | {interval(t)} | {threshold} | {t.outcome or 'reported'}{note} | "
            f"{mde} | {seeds_text(t)} | {t.seeds} x {t.images or 'n/a'} |")


def seeds_text(t: TestOutcome) -> str:
    """A deciding test's seeds to decide, with the rough range for truths in its estimate's 50% interval:
    '22 (to fail; 10-59 in the 50% interval)', '... 10-∞ ...' where that interval reaches the threshold;
    'none at this estimate (...)' where no number of seeds would at the estimate; '' for a decided test or a
    reported one."""
    if not t.decides or math.isnan(t.seeds_needed):
        return ""

    def count(m: float) -> str:
        return "∞" if math.isinf(m) else f"{int(m):,}"
    span = "" if math.isnan(t.seeds_needed_low) else f"{count(t.seeds_needed_low)}-{count(t.seeds_needed_high)}"
    if math.isinf(t.seeds_needed):
        return "none at this estimate" + (f" ({span} in the 50% interval)" if span else "")
    holds_side = (t.estimate <= t.threshold) == (t.side == "<=")
    return f"{count(t.seeds_needed)} (to {'hold' if holds_side else 'fail'}" + (
        f"; {span} in the 50% interval)" if span else ")")


def _teachers_too(config: dict) -> str:
    """' (each with its own teacher: as many teachers)' where every size has a teacher per seed (trained, or
    its own pretrained checkpoint: ' (each with its own checkpoint: as many checkpoints)')."""
    designs = {teacher_design(config, s) for s in config.get("sizes") or []}
    if designs == {PER_SEED}:
        return " (each with its own teacher: as many teachers)"
    if designs == {CHECKPOINTS}:
        return " (each with its own checkpoint: as many checkpoints)"
    if designs and designs <= {PER_SEED, CHECKPOINTS}:
        return " (each with its own teacher or checkpoint: as many of them)"
    return ""


def claims_intervals(config: dict) -> str:
    """intervals_over for a full config; a generic phrase for a config of the `claims:` keys alone."""
    return intervals_over(config) if config.get("sizes") and "seeds" in config else "over the grid's seeds"


def counts_text(counts: dict[str, int]) -> str:
    shown = [f"{n} {o}" for o, n in counts.items() if n]
    return "Cells: " + (", ".join(shown) if shown else "none") + "."


def control_markdown(verdicts: list[ClaimVerdict], config: dict) -> str:
    """The positive control: each attention and MLP statistic on softmax students (no boundary) beside
    each linear variant, per dataset, size and budget."""
    if CONTROL_VARIANT not in config["variants"]:
        return ("The grid has no softmax control: add `softmax` to `variants` to see how much the attention "
                "carries between softmax ViTs (the Attention Transfer setting) beside how much it carries across "
                "the softmax-to-linear boundary.")
    variants = [CONTROL_VARIANT, *linear_variants(config)]
    header = ["dataset", "size", "budget", "statistic", *[f"{v} (control)" if v == CONTROL_VARIANT else v
                                                          for v in variants]]
    rows = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for v in verdicts:
        if v.claim == "C4":
            continue
        cells = {(c.dataset, c.size, c.budget, c.variant): c for c in [*v.controls, *v.cells]}
        for dataset, size, budget in dict.fromkeys((c.dataset, c.size, c.budget) for c in v.controls):
            for name in [t.name for t in v.controls[0].tests] if v.controls[0].tests else []:
                if name in ("gap_closed",):
                    continue
                control = cells.get((dataset, size, budget, CONTROL_VARIANT))
                narrowed = control.test(name) if control else None
                if narrowed is not None and narrowed.note.startswith(CONTROL_NARROWED):
                    continue  # the control does not run this statistic's strategies
                values = []
                for variant in variants:
                    cell = cells.get((dataset, size, budget, variant))
                    test = cell.test(name) if cell else None
                    values.append("n/a" if test is None or test.outcome == NOT_EVALUABLE else interval(test))
                rows.append(f"| {dataset} | {size} | {budget} | {v.claim} {_STATISTICS[name].label} | "
                            + " | ".join(values) + " |")
    return ("The same statistics on softmax students (softmax-to-softmax: the Attention Transfer setting, where "
            "attention weights are reported to transfer) beside each linear variant, with their intervals. If the "
            "attention's share is large in the control and small across the boundary, the boundary is what stops "
            "it; if it is small in both, nothing transfers at this scale.\n\n" + "\n".join(rows))


def budget_markdown(verdicts: list[ClaimVerdict]) -> str:
    """Claim x budget: the verdict at each budget."""
    budgets_ = [b["budget"] for b in verdicts[0].by_budget] if verdicts else []
    rows = ["| claim | " + " | ".join(f"{b} steps" for b in budgets_) + " |", "|---|" + "---|" * len(budgets_)]
    for v in verdicts:
        rows.append(f"| {v.claim} | " + " | ".join(b["verdict"] for b in v.by_budget) + " |")
    return "\n".join(rows)


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


def verdicts_table(verdicts: list[ClaimVerdict]) -> str:
    """One line per claim: its verdict (the table a reader sees first), then what the intervals are over."""
    rows = ["| claim | verdict | cells |", "|---|---|---|"]
    rows += [f"| {v.claim} | {v.verdict} | {counts_text(v.counts).removeprefix('Cells: ').rstrip('.')} |"
             for v in verdicts]
    over = list(dict.fromkeys(v.intervals for v in verdicts if v.intervals))
    return "\n".join(rows) + (f"\n\nEvery verdict's intervals are {over[0]}." if len(over) == 1 else "")


def mde_markdown(verdicts: list[ClaimVerdict], config: dict | None = None) -> str:
    """Per deciding test and cell: the smallest effect (distance from its threshold) the grid could have
    detected with 80% power at its seeds, before any verdict is read; and for an undecided one, the
    seeds that would decide it with 80% power if the truth were its estimate."""
    rows = ["| claim | test | cell | seeds x images | threshold | minimum detectable effect | seeds to decide |",
            "|---|---|---|---|---|---|---|"]
    for v in verdicts:
        for c in v.cells:
            for t in c.tests:
                if not t.decides or math.isnan(t.threshold):
                    continue
                mde = "n/a" if math.isnan(t.mde) else number(t.name, t.mde).lstrip("+")
                size = f"{t.seeds} x {t.images or 'n/a'}" if t.outcome != NOT_EVALUABLE else "n/a"
                rows.append(f"| {v.claim} | {_STATISTICS[t.name].label} | `{c.key}` | {size} | "
                            f"{t.side} {number(t.name, t.threshold)} | {mde} | {seeds_text(t)} |")
    teachers = _teachers_too(config or {})
    return ("The smallest effect each deciding test could have detected (80% power at the level of the verdicts), "
            "as a distance from its threshold: a true value closer to the threshold than this is likely to "
            "read as inconclusive. For an undecided test, *seeds to decide* is the number of paired seeds"
            f"{teachers} that would decide it with 80% power if the truth were its current estimate (the test "
            "images' sampling does not shrink with seeds, so some estimates are out of reach): what a larger "
            "run needs. It is rough (observed power), so the range for truths in the estimate's 50% interval "
            "follows it (∞: that interval reaches the threshold).\n\n" + "\n".join(rows))
