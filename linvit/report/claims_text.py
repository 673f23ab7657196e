"""The claims in words: the rules (generated from linvit.claims.table.CLAIMS), the verdict tables, the
minimum detectable effects and the roles, as markdown for the report (the claims along the grid's axes, the
verdict per budget and the positive control: linvit.report.axes_text)."""

from __future__ import annotations

import math

from linvit.claims.judge import intervals_over
from linvit.claims.roles import resolve_roles
from linvit.claims.table import CLAIMS, Thresholds, claim_cells, linear_variants
from linvit.claims.verdicts import NOT_EVALUABLE, CellVerdict, ClaimVerdict, TestOutcome
from linvit.config import CHECKPOINTS, NO_DESIGN, ONE_TEACHER, PER_SEED, replicated, teacher_design
from linvit.config import budgets
from linvit.grid import CONTROL_VARIANT
# The claims along the grid's axes, the verdict per budget and the positive control (axes_text), and the numbers'
# words (statistic_text), are modules of their own; the report takes them from here too.
from linvit.report.axes_text import axes_markdown, budget_markdown, control_markdown  # noqa: F401
from linvit.report.statistic_text import STATISTICS as _STATISTICS, interval, number  # noqa: F401
from linvit.stats import paired, sequential
from linvit.stats.spending import spending_label

# What the report calls a test or claim cell that the engine leaves "continues" (sequential.CONTINUES) once the
# sequence is over (linvit.report.decisions.displayed): no look will add seeds for it, so it cannot continue.
UNDECIDED_AT_END = "undecided when the sequence ended"
_THRESHOLD_KEYS = {"negligible": "`claims.negligible`", "most": "`claims.most`", "-margin": "`claims.margin`",
                   "zero": "0"}


def _threshold_text(name: str, t: Thresholds) -> str:
    value = t.value(name)
    shown = f"{100 * value:g}%" if name in ("negligible", "most") else f"{100 * value:+g} pp"
    return shown + (f" ({_THRESHOLD_KEYS[name]})" if name != "zero" else "")


def _pct(x: float) -> str:
    return f"{100 * x:.4g}%"


def _fail_alphas(alpha: float) -> dict[str, tuple[float, float]]:
    """Per claim of CLAIMS: its fail side's alpha (alpha / k, k its deciding tests) and its repeated intervals'
    level, 1 - alpha - alpha / k."""
    return {c.name: (alpha / len(c.deciding), 1 - alpha - alpha / len(c.deciding)) for c in CLAIMS}


def _by_value(values: dict[str, float], what: str) -> str:
    """'96.25% for C1 and C2's tests, 95% for C3's' from {claim: value}."""
    groups: dict[str, list[str]] = {}
    for claim, x in values.items():
        groups.setdefault(_pct(x), []).append(claim)
    parts = []
    for i, (value, claims) in enumerate(groups.items()):
        names = " and ".join([", ".join(claims[:-1]), claims[-1]] if len(claims) > 2 else claims)
        parts.append(f"{value} for {names}'s{f' {what}' if i == 0 else ''}")
    return ", ".join(parts)


def _family(config: dict) -> str:
    """C4's family: 'm = 3 (claims) x 2 (cells) x 1 (budget) = 6' ('m = 3 claims x 5 linear cells listed in
    `cells` (each with its budget) = 15' for a grid of `cells`), or per cell for a config of `claims:` alone."""
    try:
        cells = len(config["targets"]) * len(config["sizes"]) * len(linear_variants(config))
        n_budgets = len(budgets(config))
    except (KeyError, TypeError, ValueError):
        return f"m = {len(CLAIMS)} per (dataset, size, linear variant, budget) cell"
    if config.get("cells") is not None:
        listed = sum(c[2] != CONTROL_VARIANT for c in claim_cells(config))
        return (f"m = {len(CLAIMS)} claims x {listed} linear cell{'s' if listed != 1 else ''} listed in `cells` "
                f"(each with its budget) = {len(CLAIMS) * listed}")
    return (f"m = {len(CLAIMS)} claims x {cells} linear cell{'s' if cells != 1 else ''} x {n_budgets} "
            f"budget{'s' if n_budgets != 1 else ''} = {len(CLAIMS) * cells * n_budgets}")


def _sequential_rules(config: dict, plan: sequential.Plan) -> list[str]:
    """The rules under a sequential plan (linvit.stats.sequential): repeated intervals at their levels,
    one-sided boundaries spent over the looks, Bonferroni for C4."""
    s = paired.Settings.from_config(config)
    a = _pct(s.alpha)
    split = _fail_alphas(s.alpha)
    futility = (f", or from look {plan.futility_from} on when its conditional power at the cap is below "
                f"{plan.futility:g} (futility, non-binding: the boundaries ignore it)" if plan.futility is not None
                else "")
    spent_by = spending_label(plan.spending, plan.gamma, "`")
    rules = (
        f"Seeds are the unit of replication. Each test pairs its roles' runs by seed (the seeds every role "
        f"finished) and by test image. Its statistic is a difference of accuracies, or a share of a benefit (a ratio "
        f"of two differences). The grid runs a sequential plan (`sequential:`; see Decisions): each deciding test "
        f"is read at looks of {', '.join(map(str, plan.looks))} paired seeds (look k: the first n_k seeds in the "
        f"design's order; the cap: {plan.cap}). At a look its statistic T is a t statistic over the per-seed paired "
        f"values with n - 1 degrees of freedom, the variance of the test images' sampling added (a share's through "
        f"num - threshold x den), on the hold side's scale, against two one-sided boundaries that spend the test's "
        f"error across its looks by {spent_by} over the information fraction: {a} to hold wrongly "
        f"(half of 1 - `claims.level`) and {a} / k to fail wrongly (k: its claim's deciding tests: "
        f"{_by_value({c: x for c, (x, _) in split.items()}, 'tests')}). A test **holds** at the first look where T "
        f"reaches the hold boundary, **fails** where it reaches the fail boundary (a share only once its benefit is "
        f"established positive), **continues** to the next look otherwise, and is **undecided within the cap** when "
        f"it reaches the cap without crossing{futility}. Its interval is its last look's repeated interval: the "
        f"values neither boundary of that look rejects (a share's by Fieller, unbounded when its denominator is not "
        f"clearly positive), which covers the truth at every look at once with probability at least 1 - {a} - {a} "
        f"/ k: {_by_value({c: x for c, (_, x) in split.items()}, 'tests')}. A test that stopped before the cap has a "
        f"point estimate biased away from the threshold; its repeated interval stays valid. A test whose look-1 "
        f"seeds have not all finished is **too few seeds**. A claim holds in a cell when all its deciding tests "
        f"hold, and fails when one fails (each at {a} / k: Bonferroni across them). A deciding test has no fixed-n "
        f"minimum detectable effect or seeds to decide: its seeds are the plan's looks, and the Decisions section "
        f"gives its conditional power at the cap. The reported tests are not read at looks: each has a fixed-n t "
        f"interval at {_pct(s.level)} (`claims.level`) on the seeds its roles have, a number the stopping rule "
        f"chose, so its nominal level does not hold under that rule. Every interval is {claims_intervals(config)}.")
    c4 = (f"- **C4**: C1-C3 per linear cell and budget; holds in a cell when all three hold there (each at its own "
          f"level: holding everywhere needs every cell to hold, so no correction is needed), and fails there only "
          f"when one of a claim's tests crosses a fail side spent at {a} / (k m) on its own looks: Bonferroni across "
          f"every (claim, cell, budget) of the grid, one family ({_family(config)}), so a failure read anywhere is "
          f"spurious at most {a} of the time (Holm's step-down needs p-values that a non-binding stop does not "
          f"give). Otherwise a cell **continues** while one of its claims does, and is **undecided within the cap** "
          f"when none does (a claim that fails at its own level but not at the family's included). An axis "
          f"(datasets, sizes, variants) that the grid does not vary is *not tested*.")
    return [rules, c4]


def rules_markdown(config: dict) -> str:
    """How the verdicts are reached, in words, generated from CLAIMS and the config's `claims` (and its
    `sequential:` plan, whose rules differ: _sequential_rules)."""
    s, t = paired.Settings.from_config(config), Thresholds.from_config(config)
    plan = sequential.Plan.from_config(config) if config.get("sequential") is not None else None
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
    if plan is not None:
        rules, c4 = _sequential_rules(config, plan)
        lines[0] = rules
        lines.append(c4)
        lines.append("- A claim is *supported* when it holds in every cell where it is judged, *not supported* when "
                     "it fails in every one, and otherwise *mixed* with the counts; a cell still undecided reads "
                     f"*{sequential.CONTINUES}* while a later look may add seeds for it, and *{UNDECIDED_AT_END}* "
                     "once no look will. Cells of the softmax control variant decide nothing: they "
                     "are shown beside the linear variants (positive control).")
        return "\n".join(lines)
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
    """The engine's calibration by simulation (linvit.claims.calibration's packaged table): the rows of the
    teacher design(s) this grid uses (`teacher.seed`; a pretrained checkpoint is one teacher, `replicates` one per
    seed), all without
    a config."""
    from linvit.claims.calibration import coverage_markdown

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
            "`python -m linvit.claims.calibration` regenerates it): how often the 95% interval covers the truth, "
            "and how often a verdict is wrong (holds where the truth fails, or the other way round)." + applies
            + "\n\n" + coverage_markdown(designs=designs))
    if config and config.get("sequential") is not None:
        # A sequential grid reads its tests at looks: its calibration is the one under that stopping rule,
        # with what it saves against a fixed design at the cap.
        from linvit.claims.calibration_sequential import sequential_markdown

        text += ("\n\n**Under the sequential design** (this grid's plan is read this way; "
                 "`python -m linvit.claims.calibration_sequential` regenerates it): the repeated intervals' coverage "
                 "at the stopping look, wrong verdicts over the whole sequence, naive rereading of the fixed-n "
                 "interval at the same looks beside it, and the expected seeds and training jobs against a fixed "
                 "design at the cap.\n\n" + sequential_markdown())
    return text


def claims_markdown(verdicts: list[ClaimVerdict], plan: sequential.Plan | None = None,
                    config: dict | None = None) -> str:
    """One section per claim: statement, verdict, and per cell every test with its interval and MDE. Under a
    sequential `plan`, the verdict says per cell which test decided it and how close it was (decided_by), and a
    note under each table says that the reported tests' intervals are fixed-n. With the `config`, C4's section
    reads each claim along each axis the grid varies, after the grid's design (axes_markdown)."""
    parts = []
    notes = {c.name: c.note for c in CLAIMS}
    for v in verdicts:
        over = f" Intervals {v.intervals}." if v.intervals else ""
        how = [(c, decided_by(c, plan)) for c in v.cells] if plan is not None and v.claim != "C4" else []
        if len(how) == 1 and how[0][1]:
            head = f"**Verdict: {v.verdict}** {how[0][1]}."
        else:
            head = f"**Verdict: {v.verdict}.**"
        parts.append(f"### {v.claim}: {v.statement}\n\n{head}{over} {counts_text(v.counts)}")
        if len(how) > 1:
            parts.append("\n".join(f"- `{c.key}`: {c.outcome} {text}" for c, text in how if text))
        if v.claim == "C4":
            parts.append("\n".join(f"- across {axis}: {text}" for axis, text in v.axes.items()))
            parts.append(axes_markdown(verdicts, config) if config is not None else "")
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
        if plan is not None:
            parts.append(reported_note(v.cells))
    return "\n\n".join(p for p in parts if p)


def reported_note(cells: list[CellVerdict]) -> str:
    """Under a sequential plan: the reported (non-deciding) tests' intervals are fixed-n, on seed counts that the
    stopping rule chose, so their nominal level does not hold ('' when the cells have none)."""
    reported = [t for c in cells for t in c.tests if not t.decides and t.outcome != NOT_EVALUABLE]
    if not reported:
        return ""
    seeds = sorted({t.seeds for t in reported})
    levels = sorted({t.level for t in reported if not math.isnan(t.level)})
    level = f"{100 * levels[0]:g}% " if len(levels) == 1 else ""
    on = (f"{seeds[0]} seeds" if len(seeds) == 1 else f"{seeds[0]} to {seeds[-1]} seeds")
    return (f"The rows marked (reported) are not read at looks: each interval is a fixed-n {level}t interval "
            f"(`claims.level`) on the seeds its roles have ({on}), a number the stopping rule chose, so its nominal "
            "level does not hold under that rule and its outcome describes, it does not test. The deciding rows' "
            "intervals are repeated intervals (their level is in Decisions).")


def decided_by(cell: CellVerdict, plan: sequential.Plan) -> str:
    """Which deciding test decided a claim's cell under a sequential plan, and how close it was: 'at look 2 (10
    seeds): attention copied alone (strict) crossed its fail boundary (T = -3.66 against -3.65, information
    fraction 0.374 where 0.333 was planned); attention added on top of everything else (symmetric) undecided at
    [+13.8%, +62.8%]', from each test's looks (statistic, bounds, fraction). '' where no test has a look."""
    deciding = [t for t in cell.tests if t.decides]
    read = [t for t in deciding if t.looks]
    if not read:
        return ""
    crossed = [t for t in read if t.outcome in (paired.HOLDS, paired.FAILS)]
    lead = None
    if cell.outcome == paired.FAILS:  # the first failure decides the cell
        crossed.sort(key=lambda t: t.outcome != paired.FAILS)
        lead = min((t.looks[-1] for t in crossed if t.outcome == paired.FAILS), key=lambda x: x["look"], default=None)
    elif cell.outcome == paired.HOLDS:  # the last of the holds decides it
        lead = max((t.looks[-1] for t in crossed), key=lambda x: x["look"], default=None)
    last = lead or max((t.looks[-1] for t in read), key=lambda x: x["look"])
    head = f"{'at' if lead else 'after'} look {last['look']} ({last['seeds']} seeds)"
    phrases = [_crossed(t, plan, last["look"]) for t in crossed]
    phrases += [_undecided(t) for t in deciding if t not in crossed]
    return f"{head}: " + "; ".join(phrases)


def _crossed(t: TestOutcome, plan: sequential.Plan, lead: int) -> str:
    x = t.looks[-1]
    holds = t.outcome == paired.HOLDS
    bound = x["hold_bound"] if holds else -x["fail_bound"]
    at = "" if x["look"] == lead else f" at look {x['look']}"
    seeds = "" if x["look"] == lead else f"{x['seeds']} seeds: "
    planned = plan.looks[x["look"] - 1] / plan.cap if x["look"] <= len(plan.looks) else math.nan
    return (f"{_STATISTICS[t.name].label} crossed its {'hold' if holds else 'fail'} boundary{at} ({seeds}T = "
            f"{x['statistic']:.2f} against {bound:.2f}, information fraction {x['fraction']:.3f} where "
            f"{planned:.3f} was planned)")


def _undecided(t: TestOutcome) -> str:
    label = _STATISTICS[t.name].label
    if not t.looks:
        return f"{label} {t.outcome}" + (f" ({t.note})" if t.note else "")
    word = sequential.FUTILE if t.outcome == sequential.FUTILE else "undecided"
    return f"{label} {word} at [{number(t.name, t.low)}, {number(t.name, t.high)}]"


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
    if (config or {}).get("sequential") is not None:
        return ("Under the sequential plan a deciding test has no fixed-n minimum detectable effect or seeds to "
                "decide (n/a below): the seeds it gets are the plan's looks, up to the cap, and the Decisions "
                "section gives its conditional power at the cap at each look. The table gives the seeds x images of "
                "each deciding test's last look.\n\n" + "\n".join(rows))
    return ("The smallest effect each deciding test could have detected (80% power at the level of the verdicts), "
            "as a distance from its threshold: a true value closer to the threshold than this is likely to "
            "read as inconclusive. For an undecided test, *seeds to decide* is the number of paired seeds"
            f"{teachers} that would decide it with 80% power if the truth were its current estimate (the test "
            "images' sampling does not shrink with seeds, so some estimates are out of reach): what a larger "
            "run needs. It is rough (observed power), so the range for truths in the estimate's 50% interval "
            "follows it (∞: that interval reaches the threshold).\n\n" + "\n".join(rows))
