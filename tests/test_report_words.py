"""The report's words under a sequential plan say the sequential design (issue 55, item 6), on verdicts built here
(no runs, no training): the rules speak of repeated intervals at their levels and Bonferroni for C4, no test or
claim "continues" once the sequence is over, a C4 cell is never "inconclusive", the reported tests' intervals are
said to be fixed-n, Grid covered lists the looks' seeds, and a claim's verdict says which test decided it and how
close it was. The numbers of C1 are the committed decide reference's (report/reference_decide/claims.json)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pandas as pd
import pytest
from test_report_decisions import SEQ, added_seeds

from linvit.claims.table import STATEMENTS
from linvit.claims.verdicts import CellVerdict, ClaimVerdict
from linvit.claims.verdicts import TestOutcome as Outcome
from linvit.report.claims_text import (UNDECIDED_AT_END, claims_markdown, control_markdown, decided_by,
                                       rules_markdown, verdicts_table)
from linvit.report.decisions import displayed, evaluate, markdown
from linvit.report.readme import _grid_section
from linvit.stats.sequential import CONTINUES, FUTILE, Plan

ROOT = Path(__file__).resolve().parents[1]
LOOKS = [5, 10, 15, 20, 30]
CONFIG = {"targets": ["dsA"], "sizes": ["tiny"], "variants": ["linA"], "seeds": [0, 1, 2, 3, 4],
          "student": {"train": {"steps": 100}}, "claims": {"min_seeds": 3}, "sequential": {"looks": LOOKS}}
PLAN = Plan(tuple(LOOKS))
OVER = "over the seeds of each look (5 to 30, a sequential plan), each with its own teacher, and the test images"
COUNTS = {"holds": 0, "fails": 0, "inconclusive": 0, "too few seeds": 0, "not evaluable": 0}


def look(k, est, low, high, t, hold, fail, fraction, power, outcome):
    return {"look": k, "seeds": LOOKS[k - 1], "estimate": est, "low": low, "high": high, "statistic": t,
            "hold_bound": hold, "fail_bound": fail, "fraction": fraction, "power": power, "outcome": outcome,
            "note": ""}


def deciding(name, looks, threshold, side, level=0.9625):
    last = looks[-1]
    return Outcome(name, last["outcome"], last["estimate"], last["low"], last["high"], level, threshold=threshold,
                       side=side, seeds=last["seeds"], images=5000, looks=looks,
                       stopped=last["look"] if last["outcome"] != CONTINUES else 0)


def c1_cell(on_top_outcome=CONTINUES) -> CellVerdict:
    """The reference's C1: attention alone fails at look 2 just past its bound, attention on top undecided."""
    alone = deciding("attn_alone", [look(1, 0.4245, -0.457, 1.006, -1.637, 4.88, 5.935, 0.178, 0.83, CONTINUES),
                                    look(2, 0.496, 0.251, 0.696, -3.6645, 3.19, 3.653, 0.374, math.nan, "fails")],
                     0.25, "<=")
    on_top = deciding("attn_on_top", [look(1, 0.373, -0.389, 0.933, -1.281, 4.88, 5.945, 0.177, 0.62, CONTINUES),
                                      look(2, 0.386, 0.138, 0.628, -2.042, 3.22, 3.691, 0.359, 0.77, on_top_outcome)],
                      0.25, "<=")
    worse = Outcome("attn_worse", "fails", 0.0731, 0.0469, 0.0993, 0.95, mde=0.0364, threshold=0.0, side="<=",
                        decides=False, seeds=10, images=5000)
    return CellVerdict("C1", "dsA", "tiny", "linA", 100, "fails", tests=[alone, on_top, worse])


def c3_cell(outcome=CONTINUES) -> CellVerdict:
    """C3 read at look 1 only (say a run of look 2 was invalid), undecided there."""
    matches = deciding("matches", [look(1, -0.004, -0.03, 0.02, 0.8, 4.66, 4.66, 0.209, 0.4, outcome)], -0.01,
                       ">=", level=0.95)
    return CellVerdict("C3", "dsA", "tiny", "linA", 100, outcome, tests=[matches])


def verdict(claim, cells, word, counts, **kw) -> ClaimVerdict:
    return ClaimVerdict(claim, STATEMENTS[claim], word, {**COUNTS, **counts}, cells, intervals=OVER, **kw)


def reference_like(c3=CONTINUES) -> list[ClaimVerdict]:
    c4 = CellVerdict("C4", "dsA", "tiny", "linA", 100, "not tested", parts={"C1": "fails", "C3": c3})
    return [verdict("C1", [c1_cell()], "not supported", {"fails": 1},
                    by_budget=[{"budget": 100, "verdict": "not supported", "counts": {"fails": 1}}]),
            verdict("C3", [c3_cell(c3)], c3, {c3: 1}, by_budget=[{"budget": 100, "verdict": c3, "counts": {c3: 1}}]),
            verdict("C4", [c4], "not tested: the grid varies no dataset, size or linear variant", {"not tested": 1})]


def state(results: Path, looks: int, nxt: dict | None = None) -> Path:
    records = [{"look": k, "seeds": LOOKS[k - 1], "added": [], "tests": {}, "finished": f"2026-12-0{k} 10:00:00"}
               for k in range(1, looks + 1)]
    (results / "decide").mkdir(parents=True)
    (results / "decide" / "state.json").write_text(json.dumps({"plan": {"looks": LOOKS}, "looks": records,
                                                               "next": nxt}))
    return results


def words(verdicts, results) -> tuple[list[ClaimVerdict], str, str]:
    """The verdicts as the report shows them, the Claims section and the Decisions section (without its cost)."""
    shown = displayed(CONFIG, verdicts, results)
    decisions = markdown(evaluate(CONFIG, verdicts, None, results)).split("### Jobs and CPU-hours")[0]
    return shown, verdicts_table(shown) + "\n\n" + claims_markdown(shown, PLAN), decisions


def tally(decisions: str) -> str:
    return next(line for line in decisions.splitlines() if line.startswith("Deciding tests:"))


def test_the_rules_under_a_plan_are_the_sequential_designs():
    text = rules_markdown(CONFIG)
    assert "repeated interval" in text and "spend the test's error across its looks by `hwang_shih_decani`" in text
    assert "at least 1 - 2.5% - 2.5% / k: 96.25% for C1 and C2's tests, 95% for C3's" in text
    assert ("2.5% / k to fail wrongly (k: its claim's deciding tests: 1.25% for C1 and C2's tests, 2.5% for "
            "C3's)") in text
    assert "Bonferroni across every (claim, cell, budget) of the grid, one family (m = 3 claims x 1 linear cell x " \
           "1 budget = 3)" in text
    # The fixed design's words are gone: its 95% interval, its one-sided tests at 2.5%, Holm for C4, inconclusive.
    for fixed in ("The 95% interval (`claims.level`) is a t interval", "each a one-sided test at 2.5%",
                  "Holm's correction", "**inconclusive**", "*seeds to decide* is the number"):
        assert fixed not in text, fixed
    # The levels come from the config, not the text.
    lower = rules_markdown({**CONFIG, "claims": {"min_seeds": 3, "level": 0.9}})
    assert "at least 1 - 5% - 5% / k: 92.5% for C1 and C2's tests, 90% for C3's" in lower
    fixed_design = rules_markdown({k: v for k, v in CONFIG.items() if k != "sequential"})
    assert "Holm's correction" in fixed_design and "each a one-sided test at 2.5%" in fixed_design
    assert "repeated interval" not in fixed_design


def test_nothing_continues_once_the_sequence_is_over(tmp_path):
    """The reference's case: C1 failed at look 2 on attention alone; attention on top is left "continues" by the
    engine (its claim failed, so no look adds seeds for it) and the driver recorded the sequence as finished."""
    verdicts = reference_like(c3="holds")
    verdicts[1].cells[0].tests[0].outcome = verdicts[1].cells[0].tests[0].looks[-1]["outcome"] = "holds"
    shown, claims, decisions = words(verdicts, state(tmp_path / "results", 2))
    assert "The sequence is finished." in decisions
    assert "continues" not in tally(decisions) and "continues" not in claims
    assert tally(decisions) == "Deciding tests: 3 (1 fails, 1 undecided when the sequence ended, 1 holds)."
    row = next(line for line in claims.splitlines() if line.startswith("| | attention added on top"))
    assert f"| <= +25.0% | {UNDECIDED_AT_END} |" in row
    block = decisions[decisions.index("· attn_on_top**"):]
    assert (f"**{UNDECIDED_AT_END}**: undecided at look 2 (10 seeds), and no later look added seeds for it (its "
            "claim in this cell: fails)") in block
    assert f"| 0.359 | 0.77 | {UNDECIDED_AT_END} |" in block and "| 0.177 | 0.62 | continues |" in block
    # claims.json keeps the engine's words (linvit decide reads them); only the report's change.
    assert verdicts[0].cells[0].tests[1].outcome == CONTINUES
    assert shown[0].cells[0].tests[1].outcome == UNDECIDED_AT_END


def test_the_end_is_read_from_the_tests_where_no_driver_recorded_it(tmp_path):
    """No state file (or the report of the last look, made before the driver records it): no test waits for a later
    look, so the sequence ends here and attention on top does not continue."""
    _, claims, decisions = words(reference_like(c3="holds"), tmp_path / "results")
    assert "continues" not in tally(decisions)
    assert "| attention added on top of everything else (symmetric) |" in claims
    assert f"| <= +25.0% | {UNDECIDED_AT_END} |" in claims
    # The driver's next look is 2, this report look 2's: it says the sequence ends with it.
    _, _, decisions = words(reference_like(c3="holds"), state(tmp_path / "two", 1, {"look": 2, "added": []}))
    assert "This report is look 2's" in decisions and "the sequence ends with it." in decisions


def test_a_recorded_look_made_again_is_named_as_that_look(tmp_path):
    """The report of look 1 made again after the driver recorded it and stopped before look 2 ran (its look.yaml's
    `decide_look` 1, the state's next look 2): it reads look 1, and says that look 2 has not run."""
    results = state(tmp_path / "results", 1, {"look": 2, "added": [], "waiting": ["a", "b"]})
    decisions = markdown(evaluate({**CONFIG, "decide_look": 1}, reference_like(), None, results))
    assert ("This report reads look 1 again, as recorded; look 2, for the 2 tests undecided after look 1, has not "
            "run: rerun `linvit decide` to run it.") in decisions
    assert "This report is look" not in decisions


def test_a_test_whose_later_runs_were_not_read_does_not_wait_for_a_next_look(tmp_path):
    """The sequence ran to look 2, but C3's test was read at look 1 only (a run of look 2 invalid): the engine says
    "continues" and the old words promised that the next look adds seeds, under "The sequence is finished"."""
    shown, claims, decisions = words(reference_like(), state(tmp_path / "results", 2))
    block = decisions[decisions.index("· matches**"):]
    assert "The sequence is finished." in decisions and "the next look adds seeds" not in decisions
    assert (f"**{UNDECIDED_AT_END}**: undecided at look 1 (5 seeds), and read no further although the sequence ran "
            "to look 2: a run of its later seeds was not read") in block
    assert "continues" not in claims and "continues" not in tally(decisions)
    assert shown[1].verdict == UNDECIDED_AT_END and shown[1].counts[UNDECIDED_AT_END] == 1
    assert shown[2].cells[0].parts == {"C1": "fails", "C3": UNDECIDED_AT_END}


def test_a_test_continues_while_the_sequence_does(tmp_path):
    shown, claims, decisions = words(reference_like(), state(tmp_path / "results", 1, {"look": 2, "added": []}))
    assert "the next look adds seeds (to 10)" in decisions and "2 continues" in tally(decisions)
    assert "| **continues** |" in claims and shown[1].verdict == CONTINUES


def test_a_c4_cell_is_never_inconclusive_under_a_plan(tmp_path):
    """C1 fails in linA at its own level but not at C4's Bonferroni level across the grid: the engine's C4 cell
    reads "inconclusive", a fixed design's word; under a plan that cell stopped, undecided within the cap."""
    parts = {"C1": "fails", "C2": "holds", "C3": "holds"}
    cells = [CellVerdict("C4", "dsA", "tiny", v, 100, o, parts=p) for v, o, p in
             (("linA", "inconclusive", parts), ("linB", "holds", dict.fromkeys(parts, "holds")),
              ("linC", FUTILE, {**parts, "C1": FUTILE}))]
    c4 = verdict("C4", cells, "mixed (1 holds, 1 inconclusive, 1 undecided within the cap)",
                 {"holds": 1, "inconclusive": 1, FUTILE: 1}, axes={"variants": "linA: inconclusive; linB: supported"},
                 by_budget=[{"budget": 100, "verdict": "mixed (1 holds, 1 inconclusive, 1 undecided within the cap)",
                             "counts": {"holds": 1, "inconclusive": 1, FUTILE: 1}}])
    shown, claims, _ = words([c4], tmp_path / "results")
    assert "inconclusive" not in claims
    assert shown[0].verdict == "mixed (1 holds, 2 undecided within the cap)"
    assert shown[0].by_budget[0]["verdict"] == shown[0].verdict
    assert {k: n for k, n in shown[0].counts.items() if n} == {"holds": 1, FUTILE: 2}
    assert ("- `dsA/tiny/linA/steps100`: undecided within the cap (C1 fails here at its own level, not at "
            "Bonferroni's across the grid's 9 (claim, cell, budget) tests) — C1 fails, C2 holds, C3 holds") in claims
    assert "- across variants: linA: undecided within the cap; linB: supported" in claims
    # A fixed design keeps its own word.
    fixed = {k: v for k, v in CONFIG.items() if k != "sequential"}
    assert displayed(fixed, [c4], tmp_path / "results")[0].verdict.startswith("mixed (1 holds, 1 inconclusive")


def test_reported_tests_say_their_intervals_are_fixed_n_under_a_plan(tmp_path):
    verdicts = reference_like(c3="holds")
    _, claims, _ = words(verdicts, state(tmp_path / "results", 2))
    c1 = claims[claims.index("### C1"):claims.index("### C3")]
    assert ("The rows marked (reported) are not read at looks: each interval is a fixed-n 95% t interval "
            "(`claims.level`) on the seeds its roles have (10 seeds), a number the stopping rule chose, so its "
            "nominal level does not hold under that rule") in c1
    assert "fixed-n" not in claims_markdown(verdicts)  # a fixed design's intervals are fixed-n by design
    control = control_markdown(verdicts, {**CONFIG, "variants": ["softmax", "linA"]})
    assert "a reported one's a fixed-n t interval on the seeds the stopping rule chose" in control
    assert "fixed-n" not in control_markdown(verdicts, {"variants": ["softmax", "linA"]})


def test_grid_covered_lists_the_seeds_the_looks_used():
    runs = pd.DataFrame({"status": ["ok"]})
    config = {**SEQ, "added_seeds": added_seeds(3)}
    assert ("- Seeds: 0-8 (0-2 the grid as configured, look 1; 3-8 added by later looks to the roles of undecided "
            "tests; the plan's cap: 9 seeds)") in _grid_section(config, runs)
    assert ("- Seeds: 0-2 (0-2 the grid as configured, look 1; no later look added seeds; the plan's cap: 9 seeds)"
            in _grid_section(SEQ, runs))
    assert "- Seeds: 0, 1, 2\n" in _grid_section({k: v for k, v in SEQ.items() if k != "sequential"}, runs)


def test_the_verdict_says_which_test_decided_and_how_close(tmp_path):
    _, claims, _ = words(reference_like(c3="holds"), state(tmp_path / "results", 2))
    assert ("**Verdict: not supported** at look 2 (10 seeds): attention copied alone (strict) crossed its fail "
            "boundary (T = -3.66 against -3.65, information fraction 0.374 where 0.333 was planned); attention added "
            "on top of everything else (symmetric) undecided at [+13.8%, +62.8%]. Intervals over") in claims
    # A fixed design's verdict line is as it was.
    assert "**Verdict: not supported.** Intervals over" in claims_markdown(reference_like())


SHORT = {"attention copied alone (strict)": "attention alone",
         "attention added on top of everything else (symmetric)": "attention on top"}


def test_the_readmes_c1_line_is_the_decide_references_own():
    """README.md's claims table says for the sequential run what decided C1, from the committed reference's
    claims.json and plan (the labels shortened as the table has them)."""
    reference = ROOT / "report" / "reference_decide"
    data = json.loads((reference / "claims.json").read_text())
    plan = json.loads((reference / "state.json").read_text())["plan"]
    c1 = next(v for v in data if v["claim"] == "C1")
    cell = c1["cells"][0]
    tests = [Outcome(**{k: (math.nan if v is None else v) for k, v in t.items()}) for t in cell["tests"]]
    text = decided_by(CellVerdict(**{**cell, "tests": tests}), Plan(tuple(plan["looks"]), plan["spending"],
                                                                   plan["gamma"], plan["futility"],
                                                                   plan["futility_from"]))
    for label, short in SHORT.items():
        text = text.replace(label, short)
    line = next(line for line in (ROOT / "README.md").read_text().splitlines()
                if line.startswith("| C1 attention barely helps |") and "at look" in line)
    assert f"| {c1['verdict']} {text} |" in line
    assert text.startswith("at look 2 (10 seeds): attention alone crossed its fail boundary (T = -3.66 against -3.65")


@pytest.mark.parametrize("outcome", [CONTINUES, UNDECIDED_AT_END, FUTILE])
def test_an_undecided_test_is_said_with_its_interval(outcome):
    text = decided_by(c1_cell(outcome), PLAN)
    word = "undecided within the cap" if outcome == FUTILE else "undecided"
    assert text.endswith(f"attention added on top of everything else (symmetric) {word} at [+13.8%, +62.8%]")


def test_the_readmes_c4_table_is_the_c4_references_own():
    """README.md's table of C4's grid gives, per claim and axis, the words of the committed reference
    (report/reference_c4): C1-C3 as its C4 section's per-axis lines without their intervals, C4 as its
    claims.json's axes and its center's cells at each budget."""
    reference = ROOT / "report" / "reference_c4"
    lines = {}
    for m in re.finditer(r"^- (C[123]) by (\w+): (.*)$", (reference / "README.md").read_text(), re.M):
        lines[m[1], m[2]] = re.sub(r" \((?:[^()]|\([^()]*\))*\)", "", m[3])  # "elu fails (attn_alone ...)" -> "elu fails"
    assert len(lines) == 12
    table = {row.split(" | ")[0][2:]: row.strip("| ").split(" | ")[1:]
             for row in (ROOT / "README.md").read_text().splitlines()
             if re.match(r"\| C[1-4] \| .*(digits|nano)", row)}
    for claim in ("C1", "C2", "C3"):
        assert table[claim] == [lines[claim, axis] for axis in ("dataset", "size", "variant", "budget")], claim
    c4 = next(v for v in json.loads((reference / "claims.json").read_text()) if v["claim"] == "C4")
    center = [c for c in c4["cells"] if (c["dataset"], c["size"], c["variant"]) == ("fmnist_5to9", "micro", "elu")]
    assert table["C4"] == [c4["axes"][a] for a in ("datasets", "sizes", "variants")] + [
        ", ".join(f"{c['budget']} steps {c['outcome']}" for c in sorted(center, key=lambda c: c["budget"]))]
