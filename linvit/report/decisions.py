"""The report's Decisions section, for a grid with a `sequential:` plan (linvit decide): the plan, each deciding
test's looks (seeds, estimate, repeated interval, T against its boundaries, information fraction, conditional
power, outcome), where and why it stopped and the seeds it used, the looks the driver ran
(results/decide/state.json), and the jobs and CPU-hours spent against a fixed design at the cap.

`evaluate` returns numbers only; `markdown` says them in words. A fixed design (no plan) has no section.
"""

from __future__ import annotations

import copy
import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from linvit.claims.table import CLAIMS, Design
from linvit.claims.verdicts import NOT_EVALUABLE, STILL_OPEN, ClaimVerdict, TestOutcome
from linvit.decide_state import DecideError, read_state
from linvit.report.aggregate import benchmark_jobs
from linvit.report.claims_text import UNDECIDED_AT_END, number
from linvit.stats import paired, sequential
from linvit.stats.paired import INCONCLUSIVE
from linvit.report import decisions_cost
from linvit.stats.spending import spending_label

# Why a test is where it is (the renderer's words are keyed by these). ENDED: undecided, and the sequence is over.
HOLD, FAIL, FUTILITY, CAP, CONTINUES, CLAIM_DONE, WAITS, UNEVALUABLE, ENDED = (
    "hold boundary", "fail boundary", "futility", "cap", "continues", "claim decided", "waits", "not evaluable",
    "ended")
_STATISTICS = {t.statistic.name: t.statistic for c in CLAIMS for t in c.tests}


@dataclass
class TestDecision:
    """One deciding test of one linear cell under the plan."""

    claim: str
    cell: str
    test: TestOutcome
    reason: str
    claim_outcome: str
    seeds: tuple[int, ...] = ()  # the seeds of its last look
    next_seeds: int = 0  # CONTINUES: the seeds of the next look


@dataclass
class Decisions:
    plan: sequential.Plan
    alpha: float
    tests: list[TestDecision]
    spending: decisions_cost.Spending
    looks_run: list[dict] | None = None  # state.json's looks; None: no state file
    next_look: dict | None = None
    problems: list[str] = field(default_factory=list)
    ended: bool = False  # the sequence is over: no look adds seeds after this report's (see `_ended`)
    last_look: int = 0  # the last look run (recorded by the driver, or read by a test)
    reading: int | None = None  # the look this report reads (config `decide_look`, written by the driver)


def deciding_tests(verdicts: list[ClaimVerdict]) -> list[tuple[str, str, str, TestOutcome]]:
    """(claim, cell key, the claim's outcome there, test) for every deciding test of every linear cell."""
    return [(v.claim, c.key, c.outcome, t) for v in verdicts for c in v.cells for t in c.tests if t.decides]


def evaluate(config: dict, verdicts: list[ClaimVerdict], jobs: pd.DataFrame | None,
             results: str | Path) -> Decisions | None:
    """The section's numbers; None for a fixed design. `jobs`: aggregate.benchmark_jobs(config, results) (None:
    no spending, for the words alone)."""
    design = Design.from_config(config)
    if design is None:
        return None
    plan = design.plan
    tests = [_decision(claim, key, outcome, t, design) for claim, key, outcome, t in deciding_tests(verdicts)]
    spending = decisions_cost.spending(config, jobs, plan.cap) if jobs is not None else \
        decisions_cost.Spending([], plan.cap)
    out = Decisions(plan, paired.Settings.from_config(config).alpha, tests, spending,
                    reading=config.get("decide_look"))
    try:
        state = read_state(".", results)  # the driver's own record and reader
    except DecideError as err:
        out.problems.append(str(err))
        state = None
    if isinstance(state, dict):
        out.looks_run, out.next_look = list(state.get("looks") or []), state.get("next")
    out.ended, out.last_look = _ended(out)
    if out.ended:
        for t in tests:
            if t.reason in (CONTINUES, CLAIM_DONE):
                t.reason, t.next_seeds = ENDED, 0
    return out


def _ended(d: Decisions) -> tuple[bool, int]:
    """Whether the sequence is over, and its last look: the driver recorded no next look, or the cap's look was
    read, or no test waits for a later look (the driver adds seeds only to a continuing test of a continuing
    claim: with none, it stops after this look)."""
    read = max((t.test.looks[-1]["look"] for t in d.tests if t.test.looks), default=0)
    recorded = max((int(r.get("look") or 0) for r in d.looks_run or [] if isinstance(r, dict)), default=0)
    last = max(read, recorded)
    if d.looks_run and d.next_look is None:
        return True, last
    if last >= len(d.plan.looks):
        return True, last
    return bool(d.tests) and not any(t.reason in (CONTINUES, WAITS) for t in d.tests), last


def displayed(config: dict, verdicts: list[ClaimVerdict], results: str | Path) -> list[ClaimVerdict]:
    """The verdicts in the words of the design that produced them (a copy; claims.json keeps the engine's, which
    linvit decide reads). Under a sequential plan: once the sequence is over, a test or claim cell the engine
    leaves "continues" is UNDECIDED_AT_END (no look adds seeds for it); a C4 cell is never "inconclusive" (a
    claim that failed in its own test but not at C4's Bonferroni level across the grid stopped: "undecided within
    the cap"). A fixed design's verdicts are returned as they are."""
    d = evaluate(config, verdicts, None, results)
    if d is None:
        return verdicts
    shown = copy.deepcopy(verdicts)
    for v in shown:
        rename = {sequential.CONTINUES: UNDECIDED_AT_END} if d.ended else {}
        if v.claim == "C4":
            m = len(CLAIMS) * len(v.cells)
            for cell in v.cells:
                if cell.outcome in (INCONCLUSIVE, sequential.FUTILE) and paired.FAILS in cell.parts.values():
                    failed = [k for k, o in cell.parts.items() if o == paired.FAILS]
                    cell.why = cell.why or (f"{', '.join(failed)} {'fails' if len(failed) == 1 else 'fail'} here at "
                                            f"{'its' if len(failed) == 1 else 'their'} own level, not at "
                                            f"Bonferroni's across the grid's {m} (claim, cell, budget) tests")
                cell.parts = {k: rename.get(o, o) for k, o in cell.parts.items()}
            rename = {**rename, INCONCLUSIVE: sequential.FUTILE}
            v.axes = {axis: _reword(text, rename) for axis, text in v.axes.items()}
        if not rename:
            continue
        for cell in v.cells:
            cell.outcome = rename.get(cell.outcome, cell.outcome)
            for t in cell.tests:
                if t.decides:
                    t.outcome = rename.get(t.outcome, t.outcome)
        v.counts = _renamed_counts(v.counts, rename)
        v.verdict = _reword(v.verdict, rename)
        for b in v.by_budget:
            b["verdict"], b["counts"] = _reword(b["verdict"], rename), _renamed_counts(b["counts"], rename)
    return shown


def _renamed_counts(counts: dict[str, int], rename: dict[str, str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for outcome, n in counts.items():
        new = rename.get(outcome, outcome)
        out[new] = out.get(new, 0) + n
    return out


def _reword(text: str, rename: dict[str, str]) -> str:
    """`text` (a verdict: 'continues', 'mixed (1 holds, 2 continues)') with each renamed outcome's word replaced,
    a 'mixed (...)' list merged where two words became one ('mixed (2 x)' reads 'x')."""
    for old, new in rename.items():
        text = re.sub(rf"(?<![\w-]){re.escape(old)}(?![\w-])", new, text)

    def merge(match: re.Match) -> str:
        counts: dict[str, int] = {}
        for part in match.group(1).split(", "):
            n, _, outcome = part.partition(" ")
            counts[outcome] = counts.get(outcome, 0) + int(n)
        if len(counts) == 1:
            return next(iter(counts))
        return "mixed (" + ", ".join(f"{n} {o}" for o, n in counts.items()) + ")"
    return re.sub(r"mixed \((\d+ [^,()]+(?:, \d+ [^,()]+)*)\)", merge, text)


def _decision(claim: str, key: str, claim_outcome: str, t: TestOutcome, design: Design) -> TestDecision:
    looks = t.looks or []
    d = TestDecision(claim, key, t, UNEVALUABLE, claim_outcome,
                     design.seeds[len(looks) - 1] if looks else ())
    if t.outcome == NOT_EVALUABLE:
        return d
    if not looks:
        d.reason = WAITS
    elif t.outcome == paired.HOLDS:
        d.reason = HOLD
    elif t.outcome == paired.FAILS:
        d.reason = FAIL
    elif t.outcome == sequential.FUTILE:
        d.reason = CAP if looks[-1]["look"] == len(design.plan.looks) else FUTILITY
    elif claim_outcome in STILL_OPEN:
        d.reason, d.next_seeds = CONTINUES, design.plan.looks[len(looks)]
    else:  # the driver adds seeds only to tests of a claim still open in the cell
        d.reason = CLAIM_DONE
    return d


# -- words ------------------------------------------------------------------------------------------------------

def section(config: dict, verdicts: list[ClaimVerdict], jobs: pd.DataFrame | None, results: str | Path) -> str:
    """The '## Decisions' section, '' under a fixed design. `jobs`: as for evaluate (None: read here)."""
    if jobs is None and config.get("sequential") is not None:
        jobs = benchmark_jobs(config, results)
    decisions = evaluate(config, verdicts, jobs, results)
    return "" if decisions is None else "## Decisions\n\n" + markdown(decisions)


def markdown(d: Decisions) -> str:
    plan = d.plan
    futility = (f"a test whose conditional power at the cap is below {plan.futility:g} stops as \"undecided within "
                f"the cap\" from look {plan.futility_from} on (non-binding: the boundaries ignore it)"
                if plan.futility is not None else "no futility stop")
    spent_by = spending_label(plan.spending, plan.gamma, "`")
    parts = [f"**Plan:** looks at {', '.join(map(str, plan.looks))} paired seeds (the cap: {plan.cap}); each test's "
             f"error spent across its looks by {spent_by} over the information fraction, "
             f"{100 * d.alpha:g}% to hold wrongly and {100 * d.alpha:g}% / k to fail wrongly (k: its claim's deciding "
             f"tests); futility: {futility}.",
             _looks_run(d),
             "Each deciding test of each linear cell below, look by look: its estimate and repeated interval, the "
             "statistic T (on the hold side's scale: positive toward holding) against the boundaries of that look "
             "(it holds at T ≥ the hold bound, fails at T ≤ -(the fail bound)), the information fraction and the "
             "conditional power at the cap under the current trend. A test that stopped before the cap has a point "
             "estimate biased away from the threshold (it stopped because it was far from it); its interval is the "
             "stopping look's repeated interval, which covers the truth at every look at once (at the level given "
             "with each test), so it stays valid.",
             _tally(d.tests)]
    parts += [_test_block(t, plan, d.last_look) for t in d.tests]
    parts.append("### Jobs and CPU-hours against a fixed design at the cap\n\n" + decisions_cost.cost(d.spending))
    parts += [f"- {p}" for p in d.problems]
    return "\n\n".join(p for p in parts if p)


def _looks_run(d: Decisions) -> str:
    if d.looks_run is None:
        return ("No `results/decide/state.json`: the looks were not run by `linvit decide`; each test is read at "
                "the looks its finished seeds allow.")
    done = "; ".join(f"look {r.get('look')} ({r.get('seeds')} seeds, "
                     + (f"{_added(r)} runs added in all" if r.get("added") else "the grid as configured")
                     + f", finished {r.get('finished', 'n/a')}"
                     + (f"; cells added before it: {', '.join(r['cells_added'])}, given every seed up to it"
                        if r.get("cells_added") else "") + ")" for r in d.looks_run)
    if not d.next_look:
        after = " The sequence is finished."
    else:
        k, waiting = d.next_look.get("look"), len(d.next_look.get("waiting") or [])
        # the report of a look is made before the driver records that look, unless it is made again afterwards
        # (`decide_look` an earlier look's: a driver stopped before its next look ran)
        if d.reading is not None and d.reading < k:
            after = (f" This report reads look {d.reading} again, as recorded; look {k}, for the {waiting} tests "
                     f"undecided after look {k - 1}, has not run: rerun `linvit decide` to run it.")
        else:
            after = (" This report is look 1's, the grid as configured." if k == 1 else
                     f" This report is look {k}'s, run for the {waiting} tests undecided after look {k - 1}.")
        if d.next_look.get("cells_added"):
            after += (f" Cells added before it ({', '.join(d.next_look['cells_added'])}) have every seed up to it, "
                      f"and their tests are read at every look on that look's seeds.")
        if d.ended:
            after += (" It is the cap's: the sequence ends with it." if k == len(d.plan.looks) else
                      " No test is left for a later look to add seeds to: the sequence ends with it.")
    return f"Looks run by `linvit decide` (results/decide/state.json): {done or 'none yet'}.{after}"


def _added(record: dict) -> int:
    return sum(len(a.get("seeds") or []) for a in record.get("added") or [])


def _shown(t: TestDecision) -> str:
    """The test's outcome in the report's words: UNDECIDED_AT_END for one the engine leaves "continues" after the
    sequence ended."""
    return UNDECIDED_AT_END if t.reason == ENDED else t.test.outcome


def _tally(tests: list[TestDecision]) -> str:
    counts: dict[str, int] = {}
    for t in tests:
        counts[_shown(t)] = counts.get(_shown(t), 0) + 1
    if not tests:
        return "No deciding test in the grid's linear cells."
    return f"Deciding tests: {len(tests)} (" + ", ".join(f"{n} {o}" for o, n in counts.items()) + ")."


def _test_block(d: TestDecision, plan: sequential.Plan, last_look: int = 0) -> str:
    t = d.test
    stat = _STATISTICS[t.name]
    threshold = "" if math.isnan(t.threshold) else f" {t.side} {number(t.name, t.threshold)}"
    head = f"**{d.claim} · `{d.cell}` · {t.name}** ({stat.label}): `{stat.formula()}`{threshold}."
    if d.reason in (UNEVALUABLE, WAITS):
        return f"{head} {t.outcome}: {t.note}."
    last = t.looks[-1]
    at = f"look {last['look']} ({last['seeds']} seeds"
    words = {
        HOLD: f"**holds**: crossed the hold boundary at {at}: T = {last['statistic']:.2f} ≥ {last['hold_bound']:.2f})",
        FAIL: f"**fails**: crossed the fail boundary at {at}: T = {last['statistic']:.2f} ≤ "
              f"{_t(-last['fail_bound'])})",
        FUTILITY: f"**{t.outcome}**: stopped for futility at {at}: conditional power at the cap {last['power']:.2f} "
                  f"< {plan.futility:g})",
        CAP: f"**{t.outcome}**: reached the cap at {at}) without crossing a boundary",
        CONTINUES: f"**{t.outcome}**: undecided at {at}); the next look adds seeds (to {d.next_seeds})",
        CLAIM_DONE: f"**not stopped**: undecided at {at}), and no later look adds seeds for it (its claim in this "
                    f"cell: {d.claim_outcome})",
        ENDED: f"**{UNDECIDED_AT_END}**: undecided at {at}), " + (
            f"and no later look added seeds for it (its claim in this cell: {d.claim_outcome})"
            if d.claim_outcome not in STILL_OPEN else
            f"and read no further although the sequence ran to look {last_look}: a run of its later seeds was "
            "not read (missing or invalid: see Missing cells and failed runs)" if last_look > last["look"] else
            "and no later look added seeds for it"),
    }[d.reason]
    early = " (before the cap: its estimate is biased away from the threshold)" \
        if d.reason in (HOLD, FAIL) and last["look"] < len(plan.looks) else ""
    rows = ["| look | seeds | estimate | repeated interval | T | hold if T ≥ | fail if T ≤ | information fraction | "
            "conditional power | outcome |", "|---|---|---|---|---|---|---|---|---|---|"]
    for x in t.looks:
        power = "—" if x["power"] is None or math.isnan(x["power"]) else f"{x['power']:.2f}"
        note = f" ({x['note']})" if x.get("note") else ""
        outcome = UNDECIDED_AT_END if d.reason == ENDED and x is last else x["outcome"]
        rows.append(f"| {x['look']} | {x['seeds']} | {number(t.name, x['estimate'])} | [{number(t.name, x['low'])}, "
                    f"{number(t.name, x['high'])}] | {_t(x['statistic'])} | {_t(x['hold_bound'])} | "
                    f"{_t(-x['fail_bound'])} | {x['fraction']:.3f} | {power} | {outcome}{note} |")
    return (f"{head} {words}{early}. Seeds used: {seed_ranges(d.seeds)}; repeated intervals at {100 * t.level:.2f}%."
            "\n\n" + "\n".join(rows))


def _t(x: float) -> str:
    return ("+inf" if x > 0 else "-inf") if math.isinf(x) else f"{x:.2f}"


def seed_ranges(seeds: tuple[int, ...]) -> str:
    """'0-9' for consecutive seeds, else '0-4, 7, 9'."""
    runs: list[list[int]] = []
    for s in sorted(seeds):
        if runs and s == runs[-1][-1] + 1:
            runs[-1].append(s)
        else:
            runs.append([s])
    return ", ".join(f"{r[0]}-{r[-1]}" if len(r) > 1 else str(r[0]) for r in runs) or "none"


