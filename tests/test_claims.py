"""The claims table and its evaluator on results trees whose right verdicts are known: each statistic
isolates what its claim names, too few seeds never decide, C4 names what the grid does not vary, the
softmax control decides nothing, and the rules text is generated from the table."""

from __future__ import annotations

import json
import math

import pytest
from test_report import CONFIG, write_cell

from linvit.claims.judge import evaluate_claims
from linvit.claims.table import CLAIMS, Thresholds
from linvit.claims.verdicts import NOT_EVALUABLE, CellVerdict
from linvit.grid import all_cells
from linvit.report import collect, load_predictions
from linvit.report.claims_text import claims_markdown, control_markdown, mde_markdown, rules_markdown
from linvit.stats.paired import FAILS, HOLDS, INCONCLUSIVE, TOO_FEW

# Per variant, each role's accuracy (the reference is 0.80). linA: every claim holds; linB: every one fails.
ACC = {
    "linA": dict(random=0.50, copy_all=0.70, copy_attn=0.55, copy_mlp=0.68, attn_only=0.48, mlp_only=0.65,
                 copy_mlp_distill=0.81, distill_only=0.60),
    "linB": dict(random=0.50, copy_all=0.70, copy_attn=0.66, copy_mlp=0.62, attn_only=0.60, mlp_only=0.55,
                 copy_mlp_distill=0.75, distill_only=0.60),
    # The control: attention transfers between softmax models.
    "softmax": dict(random=0.50, copy_all=0.78, copy_attn=0.75, copy_mlp=0.60, attn_only=0.74, mlp_only=0.52,
                    copy_mlp_distill=0.77, distill_only=0.60),
}
OFFSET = {0: -0.01, 1: 0.0, 2: 0.01, 3: 0.005, 4: -0.005}  # every role moves alike with the seed
BASE = {**CONFIG, "targets": ["dsA"], "seeds": [0, 1, 2], "claims": {"margin": 0.005}}


def accuracy(cell) -> float:
    base = 0.80 if cell.is_reference else ACC[cell.variant][cell.init]
    return round(base + OFFSET[cell.seed], 3)


def verdicts_of(tmp_path, config: dict, acc=accuracy) -> dict:
    for cell in all_cells(config):
        write_cell(tmp_path, cell, acc(cell), predictions=True)
    runs, _ = collect(config, tmp_path)
    return {v.claim: v for v in evaluate_claims(runs, config, load_predictions(runs))}


def test_each_claim_is_one_entry_whose_roles_come_from_its_statistics():
    names = [c.name for c in CLAIMS]
    assert names == ["C1", "C2", "C3"]
    c1, c2, c3 = CLAIMS
    assert c1.roles == ["attn_only", "random", "copy_all", "copy_mlp"]
    assert c2.roles == ["mlp_only", "random", "copy_all", "copy_attn"]  # copy_mlp only reported
    assert c3.roles == ["copy_mlp_distill", "reference"]
    # No statistic of C1 is the complement of one of C2's deciding statistics.
    c1_stats = {t.statistic.numerator for t in c1.deciding}
    assert not c1_stats & {t.statistic.numerator for t in c2.deciding}


def test_the_rules_text_is_generated_from_the_table_and_the_config():
    rules = rules_markdown({"claims": {"negligible": 0.2, "most": 0.6, "margin": 0.02, "min_seeds": 4}})
    for claim in CLAIMS:
        for test in claim.tests:
            assert f"`{test.statistic.formula()}`" in rules
    assert "`(attn_only - random) / (copy_all - random)` <= 20% (`claims.negligible`)" in rules
    assert "`(copy_all - copy_attn) / (copy_all - random)` >= 60% (`claims.most`)" in rules
    assert "`copy_mlp_distill - reference` >= -2 pp (`claims.margin`)" in rules
    assert "fewer than 4 seeds" in rules and "Holm" in rules


def test_attention_and_mlps_are_each_measured_on_their_own(tmp_path):
    v = verdicts_of(tmp_path, {**BASE, "variants": ["linA", "linB"]})
    c1 = {c.variant: c for c in v["C1"].cells}
    c2 = {c.variant: c for c in v["C2"].cells}
    # linA: attention alone (0.48 - 0.50) / 0.20 = -10%, on top (0.70 - 0.68) / 0.20 = +10%: both <= 25%.
    assert c1["linA"].test("attn_alone").estimate == pytest.approx(-0.10)
    assert c1["linA"].test("attn_on_top").estimate == pytest.approx(0.10)
    assert c1["linA"].outcome == HOLDS and c1["linA"].test("attn_worse").outcome == HOLDS
    # linB: on top (0.70 - 0.62) / 0.20 = 40% and alone 50%: fails.
    assert c1["linB"].outcome == FAILS and c1["linB"].test("attn_worse").outcome == FAILS
    # C2 linA: MLPs alone 75%, on top (0.70 - 0.55) / 0.20 = 75%; everything but the attention 90% is
    # reported, not deciding. linB: alone 25%, on top 20%: fails.
    assert c2["linA"].test("mlp_alone").estimate == pytest.approx(0.75)
    assert c2["linA"].test("mlp_on_top").estimate == pytest.approx(0.75)
    assert c2["linA"].test("all_but_attn").estimate == pytest.approx(0.90)
    assert not c2["linA"].test("all_but_attn").decides
    assert c2["linA"].outcome == HOLDS and c2["linB"].outcome == FAILS
    # The two claims are not one number: C1's on-top share and C2's deciding shares do not add to 1.
    assert c1["linB"].test("attn_on_top").estimate + c2["linB"].test("mlp_on_top").estimate != pytest.approx(1)
    assert v["C1"].verdict == v["C2"].verdict == "mixed (1 holds, 1 fails)"


def test_c3_is_non_inferiority_with_surpassing_and_the_papers_contrast(tmp_path):
    v = verdicts_of(tmp_path, {**BASE, "variants": ["linA", "linB"]})
    c3 = {c.variant: c for c in v["C3"].cells}
    a, b = c3["linA"], c3["linB"]
    assert a.outcome == HOLDS and a.test("matches").estimate == pytest.approx(0.01)
    assert a.test("surpasses").outcome == HOLDS  # 10 images on 1000, every seed: above 0
    assert a.test("distilled_vs_copied").estimate == pytest.approx(0.11)
    assert a.test("gap_closed").estimate == pytest.approx(0.31 / 0.30)
    assert b.outcome == FAILS and b.test("matches").high < -0.005
    assert math.isfinite(a.test("matches").mde) and a.test("matches").mde >= 0


def test_too_few_seeds_never_hold_or_fail(tmp_path):
    for seeds, config in (([0], {}), ([0, 1], {"min_seeds": 3})):
        v = verdicts_of(tmp_path / str(len(seeds)), {**BASE, "variants": ["linA"], "seeds": seeds,
                                                     "claims": {"margin": 0.005, **config}})
        for claim in ("C1", "C2", "C3"):
            assert [c.outcome for c in v[claim].cells] == [TOO_FEW], (seeds, claim)
            assert v[claim].verdict == TOO_FEW
        assert all(t.outcome in (TOO_FEW, "") for t in v["C1"].cells[0].tests)
    # With min_seeds 2 the same two seeds are judged (one degree of freedom: wide, but an interval).
    v = verdicts_of(tmp_path / "two", {**BASE, "variants": ["linA"], "seeds": [0, 1],
                                       "claims": {"margin": 0.005, "min_seeds": 2}})
    assert v["C1"].cells[0].outcome != TOO_FEW and v["C1"].cells[0].test("attn_on_top").low > -math.inf


def test_a_missing_role_makes_only_the_tests_that_need_it_not_evaluable(tmp_path):
    inits = [i for i in CONFIG["inits"] if i != "copy_attn"]
    v = verdicts_of(tmp_path, {**BASE, "variants": ["linA"], "inits": inits})
    c2 = v["C2"]
    assert c2.verdict.startswith("not evaluable: no strategy of the grid fills copy_attn")
    cell = c2.cells[0]
    assert cell.outcome == NOT_EVALUABLE and cell.test("mlp_alone").outcome == HOLDS
    assert cell.test("mlp_on_top").outcome == NOT_EVALUABLE
    assert v["C1"].cells[0].outcome == HOLDS  # C1 does not need copy_attn


def test_c4_names_untested_axes_and_corrects_for_multiplicity(tmp_path):
    # Five seeds: a failure must survive Holm across 3 claims x 2 cells (p <= 0.025 / 6 at best).
    v = verdicts_of(tmp_path, {**BASE, "variants": ["linA", "linB"], "seeds": [0, 1, 2, 3, 4]})
    c4 = v["C4"]
    assert c4.axes["datasets"].startswith("not tested") and c4.axes["sizes"].startswith("not tested")
    assert c4.axes["variants"] == "linA: supported; linB: not supported"
    assert [c.outcome for c in c4.cells] == [HOLDS, FAILS]
    assert c4.cells[1].parts == {"C1": FAILS, "C2": FAILS, "C3": FAILS}
    single = verdicts_of(tmp_path / "single", {**BASE, "variants": ["linA"]})["C4"]
    assert single.verdict.startswith("not tested")


def test_c4_not_tested_reads_the_same_in_every_column(tmp_path):
    """A grid that varies nothing: C4 is "not tested", and so is its one cell (the verdicts table does not
    say "not tested" beside "1 fails"); the cell still names C1-C3's outcomes there."""
    from linvit.report.claims_text import verdicts_table

    verdicts = verdicts_of(tmp_path, {**BASE, "variants": ["linB"]})
    c4 = verdicts["C4"]
    assert verdicts["C1"].verdict == "not supported" and c4.verdict.startswith("not tested")
    assert [c.outcome for c in c4.cells] == ["not tested"] and c4.cells[0].parts == {"C1": FAILS, "C2": FAILS,
                                                                                     "C3": FAILS}
    row = next(line for line in verdicts_table(list(verdicts.values())).splitlines() if line.startswith("| C4 |"))
    assert row == "| C4 | not tested: the grid varies no dataset, size or linear variant | 1 not tested |"
    text = claims_markdown(list(verdicts.values()))
    assert "Cells: 1 not tested." in text
    assert "- `dsA/tiny/linB/steps100`: not tested — C1 fails, C2 fails, C3 fails" in text


def test_the_softmax_control_is_shown_beside_each_variant_and_decides_nothing(tmp_path):
    config = {**BASE, "variants": ["linA", "softmax"]}
    v = verdicts_of(tmp_path, config)
    c1 = v["C1"]
    assert [c.variant for c in c1.cells] == ["linA"] and [c.variant for c in c1.controls] == ["softmax"]
    control = c1.controls[0]
    # Between softmax models the attention carries (0.74 - 0.50) / 0.28 = 86% of the benefit.
    assert control.test("attn_alone").estimate == pytest.approx(0.24 / 0.28) and control.outcome == FAILS
    assert c1.verdict == "supported"  # from linA alone
    text = control_markdown(list(v.values()), config)
    assert "| dataset | size | budget | statistic | softmax (control) | linA |" in text
    assert "C1 attention copied alone (strict)" in text
    assert "softmax" not in v["C4"].axes["variants"]


def test_a_narrowed_control_shows_only_the_statistics_it_runs(tmp_path):
    """control_inits: the control trains only the attention-transfer strategies; its C1 tests are
    evaluated, its C2 and C3 tests say why not, and the control table leaves their rows out."""
    config = {**BASE, "variants": ["linA", "softmax"],
              "control_inits": ["random", "copy_all", "copy_mlp", "attn_only"]}
    v = verdicts_of(tmp_path, config)
    assert v["C1"].controls[0].test("attn_alone").estimate == pytest.approx(0.24 / 0.28)
    mlp = v["C2"].controls[0].test("mlp_on_top")
    assert mlp.outcome == NOT_EVALUABLE and mlp.note == "not in the control (control_inits): it runs no copy_attn"
    assert v["C2"].verdict == "supported" and v["C3"].verdict == "supported"  # from linA, as before
    text = control_markdown(list(v.values()), config)
    assert "C1 attention copied alone (strict)" in text
    assert "C2 everything but the attention" in text  # random, copy_all and copy_mlp: in the control
    assert "C2 the MLPs" not in text and "C3 " not in text
    # The tables list no control row for a strategy the control does not run.
    from linvit.report.tables import cost_table, designs_table, recipe_cost, summarize

    runs, curves = collect(config, tmp_path)
    assert (runs["status"] == "ok").all()
    designs = designs_table(summarize(runs, config), config)
    assert not ((designs["variant"] == "softmax") & (designs["init"] == "copy_mlp_distill")).any()
    cost = cost_table(runs, curves, config)
    assert not ((cost["variant"] == "softmax") & cost["init"].str.contains("copy_mlp_distill")).any()
    assert "softmax" not in set(recipe_cost(runs, curves, config)["variant"])


def test_markdown_json_and_minimum_detectable_effects(tmp_path):
    v = verdicts_of(tmp_path, {**BASE, "variants": ["linA"]})
    verdicts = list(v.values())
    text = claims_markdown(verdicts)
    assert "### C1: Copying softmax attention weights" in text and "**Verdict: supported.**" in text
    assert "| | attention copied alone (strict) | `(attn_only - random) / (copy_all - random)` | -10.0% [" in text
    assert "| | the MLPs added on top of everything else (symmetric) |" in text
    mde = mde_markdown(verdicts)
    assert "| C1 | attention copied alone (strict) | `dsA/tiny/linA/steps100` | 3 x 1000 | <= +25.0% |" in mde
    payload = json.loads(json.dumps([x.as_dict() for x in verdicts], default=float))
    assert payload[0]["cells"][0]["tests"][0]["name"] == "attn_alone"


def test_thresholds_are_checked_in_one_line():
    assert Thresholds.from_config({}) == Thresholds(0.25, 0.5, 0.01)
    with pytest.raises(ValueError, match=r"^config: 'claims.margin' is 'x', expected a number$"):
        Thresholds.from_config({"claims": {"margin": "x"}})


def test_c4_fails_a_cell_only_when_the_failure_survives_holm():
    from linvit.claims.judge import _c4
    from linvit.claims.verdicts import ClaimVerdict
    from linvit.stats.paired import Settings

    config = {**BASE, "variants": ["linA", "linB"]}

    def claim(name, outcomes_p):
        cells = [CellVerdict(name, "dsA", "tiny", v, 100, o, p_fails=p) for v, (o, p) in zip(["linA", "linB"],
                                                                                              outcomes_p)]
        return ClaimVerdict(name, "", "", {}, cells)

    # C1 fails in linB at p 0.02 (a failure for that cell alone): across 6 (claim, cell) pairs Holm needs
    # 0.025 / 6, so C4 calls the cell inconclusive; at p 0.001 the failure stands.
    for p, expected in ((0.02, INCONCLUSIVE), (0.001, FAILS)):
        verdicts = [claim("C1", [(HOLDS, 0.9), (FAILS, p)]), claim("C2", [(HOLDS, 0.9), (HOLDS, 0.9)]),
                    claim("C3", [(HOLDS, 0.9), (HOLDS, 0.8)])]
        c4 = _c4(verdicts, config, Settings())
        assert [c.outcome for c in c4.cells] == [HOLDS, expected]


def _judged(monkeypatch, outcomes: dict, order: list[str]):
    """claims._judge on a claim whose deciding tests (in `order`) come out as `outcomes` (name -> (outcome,
    p_fails[, note])): the cell's combined verdict and its Bonferroni p-value."""
    from types import SimpleNamespace

    from linvit.claims import judge as claims_module
    from linvit.claims.judge import _judge
    from linvit.claims.table import Claim
    from linvit.claims.verdicts import TestOutcome
    from linvit.stats.paired import Settings

    tests = {t.statistic.name: t for c in CLAIMS for t in c.tests}
    def run_test(test, cell, thresholds, settings, k=1):
        outcome, p_fails, note = (*outcomes[test.statistic.name], "")[:3]
        return TestOutcome(test.statistic.name, outcome, p_fails=p_fails, note=note)
    monkeypatch.setattr(claims_module, "_run_test", run_test)
    claim = Claim("C1", "", tuple(tests[name] for name in order))
    cell = SimpleNamespace(dataset="dsA", size="tiny", variant="linA", budget=100, design=None)
    return _judge(claim, cell, Thresholds(), Settings())


@pytest.mark.parametrize("order", [["attn_alone", "attn_on_top"], ["attn_on_top", "attn_alone"]])
def test_a_cells_p_value_does_not_depend_on_the_order_of_its_tests(monkeypatch, order):
    # A share whose denominator is not established has no p-value (NaN); the other test fails clearly.
    # The claim fails (0.001 <= 0.025 / 2) whatever the order, and its p-value is 2 x 0.001 in both.
    cell = _judged(monkeypatch, {"attn_alone": (INCONCLUSIVE, math.nan), "attn_on_top": (FAILS, 0.001)}, order)
    assert cell.outcome == FAILS and cell.p_fails == pytest.approx(0.002)


def test_a_cells_p_value_takes_nothing_from_tests_with_too_few_seeds(monkeypatch):
    order = ["attn_alone", "attn_on_top"]
    # attn_alone has two paired seeds (too few: never decides) with a tiny p-value; attn_on_top fails with
    # enough seeds. The claim fails on attn_on_top's evidence alone: p = 2 x 0.01.
    cell = _judged(monkeypatch, {"attn_alone": (TOO_FEW, 1e-6), "attn_on_top": (FAILS, 0.01)}, order)
    assert cell.outcome == FAILS and cell.p_fails == pytest.approx(0.02)
    # No test with enough seeds and a p-value: no p-value for the cell.
    cell = _judged(monkeypatch, {"attn_alone": (TOO_FEW, 1e-6), "attn_on_top": (INCONCLUSIVE, math.nan)}, order)
    assert cell.outcome == TOO_FEW and math.isnan(cell.p_fails)


def test_c4_fails_where_a_claim_fails_beside_a_share_without_p_value(monkeypatch):
    """The defect the order made: C1 fails in the cell on attn_on_top while attn_alone has no p-value;
    C4 must read the cell as failing, not inconclusive (one cell, so Holm over its 3 claims)."""
    from linvit.claims.judge import _c4
    from linvit.claims.verdicts import ClaimVerdict
    from linvit.stats.paired import Settings

    c1 = _judged(monkeypatch, {"attn_alone": (INCONCLUSIVE, math.nan), "attn_on_top": (FAILS, 1e-4)},
                 ["attn_alone", "attn_on_top"])
    others = [CellVerdict(name, "dsA", "tiny", "linA", 100, HOLDS, p_fails=0.9) for name in ("C2", "C3")]
    verdicts = [ClaimVerdict(c.claim, "", "", {}, [c]) for c in (c1, *others)]
    verdicts += [ClaimVerdict(name, "", "", {}, [CellVerdict(name, "dsA", "tiny", "linB", 100, HOLDS, p_fails=0.9)])
                 for name in ("C1", "C2", "C3")]
    verdicts = [ClaimVerdict(name, "", "", {}, [c for v in verdicts if v.claim == name for c in v.cells])
                for name in ("C1", "C2", "C3")]
    c4 = _c4(verdicts, {**BASE, "variants": ["linA", "linB"]}, Settings())  # Holm over 6: 2e-4 <= 0.025 / 6
    assert [c.outcome for c in c4.cells] == [FAILS, HOLDS]


def test_c4_corrects_failures_across_every_budget():
    """C4's "fails somewhere" is one family across every (claim, cell, budget): with 2 variants x 2 budgets
    x 3 claims Holm's first step is 0.025 / 12. A failure at p 0.003 survives a budget's own correction
    (0.025 / 6) but not the grid's, so C4 calls that cell inconclusive; at p 0.001 it fails at that
    budget only. "Holds everywhere" needs no correction: every cell holding at 2.5% is enough."""
    from linvit.claims.judge import _c4
    from linvit.claims.verdicts import ClaimVerdict
    from linvit.stats.paired import Settings

    config = {**BASE, "variants": ["linA", "linB"], "budgets": [100, 400]}

    def claim(name, p_linB_100):
        cells = [CellVerdict(name, "dsA", "tiny", v, b, HOLDS, p_fails=0.9)
                 for b in (100, 400) for v in ("linA", "linB")]
        if p_linB_100 is not None:
            cells[1] = CellVerdict(name, "dsA", "tiny", "linB", 100, FAILS, p_fails=p_linB_100)
        return ClaimVerdict(name, "", "", {}, cells)

    for p, expected, verdict in ((0.003, INCONCLUSIVE, "mixed (3 holds, 1 inconclusive); at 100 steps mixed "
                                  "(1 holds, 1 inconclusive), at 400 steps supported"),
                                 (0.001, FAILS, "mixed (3 holds, 1 fails); at 100 steps mixed (1 holds, 1 fails), "
                                  "at 400 steps supported")):
        c4 = _c4([claim("C1", p), claim("C2", None), claim("C3", None)], config, Settings())
        assert [(c.budget, c.variant, c.outcome) for c in c4.cells] == [
            (100, "linA", HOLDS), (100, "linB", expected), (400, "linA", HOLDS), (400, "linB", HOLDS)]
        assert c4.verdict == verdict
    every = _c4([claim("C1", None), claim("C2", None), claim("C3", None)], config, Settings())
    assert every.verdict == "supported at every budget (100, 400 steps)"


def test_an_undecided_test_says_how_many_seeds_would_decide_it(tmp_path):
    """C3's non-inferiority straddles its margin: the claims' table and the MDE table give the paired
    seeds (each with its own teacher, by default) that would decide it with 80% power at its estimate."""
    noise = {0: -0.012, 1: 0.008, 2: -0.002}

    def acc(cell):
        if cell.init == "copy_mlp_distill":
            return round(0.80 + noise[cell.seed], 3)  # mean 0.798: 0.2 pp below the reference, margin 0.5 pp
        return accuracy(cell)

    config = {**BASE, "variants": ["linA"]}
    verdicts = list(verdicts_of(tmp_path, config, acc).values())
    matches = verdicts[2].cells[0].test("matches")
    assert matches.outcome == INCONCLUSIVE and 3 < matches.seeds_needed < math.inf
    # Rough (observed power): the range for truths in the estimate's 50% interval is printed beside it.
    assert matches.seeds_needed_low <= matches.seeds_needed <= matches.seeds_needed_high
    high = "∞" if math.isinf(matches.seeds_needed_high) else f"{int(matches.seeds_needed_high):,}"
    needed = (f"{int(matches.seeds_needed):,} (to hold; {int(matches.seeds_needed_low):,}-{high} "
              "in the 50% interval)")
    row = next(line for line in claims_markdown(verdicts).splitlines() if "non-inferiority" in line)
    assert f"| {needed} | 3 x 1000 |" in row
    mde = mde_markdown(verdicts, config)
    assert "| minimum detectable effect | seeds to decide |" in mde and f"| {needed} |" in mde
    assert "rough (observed power)" in mde and "rough (observed power" in rules_markdown(config)
    assert "paired seeds (each with its own teacher: as many teachers)" in mde
    # Decided tests (C1 holds) and reported ones give none.
    assert all(math.isnan(t.seeds_needed) for t in verdicts[0].cells[0].tests if t.outcome == HOLDS)
    assert "each with its own teacher" not in mde_markdown(verdicts, {**config, "teacher": {"seed": 0}})
    replicates = {**config, "teachers": {"tiny": {"model": "deit_tiny_patch16_224", "replicates": [
        {"file": f"run{i}.safetensors"} for i in range(3)]}}}
    assert "paired seeds (each with its own checkpoint: as many checkpoints)" in mde_markdown(verdicts, replicates)


def test_every_verdict_says_what_its_intervals_are_over(tmp_path):
    from linvit.claims.judge import intervals_over
    from linvit.report.claims_text import verdicts_table

    config = {**BASE, "variants": ["linA"]}
    assert intervals_over(config) == "over 3 seeds, each with its own teacher, and the test images"
    one = {**config, "teacher": {"dataset": "pretrainset", "seed": 2}}
    assert intervals_over(one) == "over 3 seeds and the test images, conditional on one teacher (seed 2)"
    checkpoint = {**config, "teachers": {"tiny": {"model": "deit_tiny_patch16_224"}}}
    assert intervals_over(checkpoint) == "over 3 seeds and the test images, for this checkpoint (deit_tiny_patch16_224)"
    replicates = {**config, "teachers": {"tiny": {"model": "deit_tiny_patch16_224", "replicates": [
        {"file": f"run{i}.safetensors"} for i in range(3)]}}}
    assert intervals_over(replicates) == ("over 3 seeds, each with its own checkpoint of deit_tiny_patch16_224 "
                                          "(teachers.tiny.replicates), and the test images")
    mixed = {**config, "sizes": ["tiny", "fashion_vit"],
             "teachers": {"fashion_vit": {"model": "vit_tiny_patch16_224", "file": "data/vit.safetensors"}}}
    assert intervals_over(mixed) == ("tiny: over 3 seeds, each with its own teacher, and the test images; "
                                     "fashion_vit: over 3 seeds and the test images, for this checkpoint "
                                     "(vit_tiny_patch16_224 from data/vit.safetensors)")
    verdicts = list(verdicts_of(tmp_path, one).values())
    over = "over 3 seeds and the test images, conditional on one teacher (seed 2)"
    assert all(v.intervals == over for v in verdicts)
    assert f"**Verdict: supported.** Intervals {over}. Cells: 1 holds." in claims_markdown(verdicts)
    assert verdicts_table(verdicts).endswith(f"\n\nEvery verdict's intervals are {over}.")
    assert f"Every interval is {over}." in rules_markdown(one)
    assert json.loads(json.dumps([v.as_dict() for v in verdicts], default=float))[0]["intervals"] == over


def test_the_reports_calibration_shows_the_grids_teacher_design():
    from linvit.report.claims_text import coverage_section

    per_seed = coverage_section({**BASE, "variants": ["linA"]})
    assert "**A teacher per seed" in per_seed and "**One teacher" not in per_seed
    assert "This grid uses a teacher (or checkpoint) per seed, so the intervals cover the teacher-to-teacher" in per_seed
    # Several checkpoints, one per seed, replicate as trained teachers do: the same rows.
    replicates = {**BASE, "teachers": {"tiny": {"model": "deit_tiny_patch16_224", "replicates": [
        {"file": f"run{i}.safetensors"} for i in range(3)]}}}
    assert coverage_section(replicates) == per_seed
    for one in ({**BASE, "teacher": {"seed": 0}}, {**BASE, "teachers": {"tiny": {"model": "deit_tiny_patch16_224"}}}):
        text = coverage_section(one)
        assert "**One teacher for every seed" in text and "**A teacher per seed" not in text
        assert "| given the teacher 3 seeds |" in text and "This grid uses one teacher (or checkpoint)" in text
    both = coverage_section({**BASE, "sizes": ["tiny", "vit"], "teachers": {"vit": {"model": "vit_tiny"}}})
    assert "**A teacher per seed" in both and "**One teacher" in both and "Some sizes of this grid" in both


def test_a_failure_stands_beside_a_test_that_is_not_evaluable(monkeypatch):
    """C2 where mlp_on_top cannot be evaluated (its runs do not pair): mlp_alone failing at alpha / 2 (k counts
    both deciding tests) fails the claim; holding, or failing only at alpha, leaves it not evaluable."""
    order = ["mlp_alone", "mlp_on_top"]
    blocked = (NOT_EVALUABLE, math.nan, "runs cannot be paired: different test sets")
    cell = _judged(monkeypatch, {"mlp_alone": (FAILS, 0.0015), "mlp_on_top": blocked}, order)
    assert cell.outcome == FAILS and cell.p_fails == pytest.approx(0.003) and not cell.why
    for mlp_alone in ((HOLDS, 0.99), (FAILS, 0.02), (INCONCLUSIVE, 0.3), (TOO_FEW, 1e-6)):
        cell = _judged(monkeypatch, {"mlp_alone": mlp_alone, "mlp_on_top": blocked}, order)
        assert cell.outcome == NOT_EVALUABLE and cell.why == blocked[2] and math.isnan(cell.p_fails), mlp_alone


def test_a_failure_stands_in_a_grid_that_lacks_a_role(tmp_path):
    """No copy_attn in the grid: C2's mlp_on_top is not evaluable anywhere; linB's MLPs alone carry 25% of the
    benefit (at most 50% claimed), so C2 fails there, while linA's cell (mlp_alone holds) is not evaluable."""
    inits = [i for i in CONFIG["inits"] if i != "copy_attn"]
    c2 = verdicts_of(tmp_path, {**BASE, "variants": ["linA", "linB"], "inits": inits})["C2"]
    cells = {c.variant: c for c in c2.cells}
    assert cells["linB"].outcome == FAILS and cells["linB"].test("mlp_on_top").outcome == NOT_EVALUABLE
    assert cells["linA"].outcome == NOT_EVALUABLE and "copy_attn" in cells["linA"].why


def test_c4s_holm_family_is_every_claim_cell_and_budget_tested_or_not():
    """C2's benefit is established in neither cell (no p-value): the family is still 3 claims x 2 cells, so C1's
    failure at p 0.005 needs 0.025 / 6 = 0.0042 and does not stand; counting only the 4 p-values (0.025 / 4
    = 0.00625) would let it."""
    from linvit.claims.judge import _c4
    from linvit.claims.verdicts import ClaimVerdict
    from linvit.stats.paired import Settings

    def claim(name, outcomes_p):
        cells = [CellVerdict(name, "dsA", "tiny", v, 100, o, p_fails=p) for v, (o, p) in zip(["linA", "linB"],
                                                                                              outcomes_p)]
        return ClaimVerdict(name, "", "", {}, cells)

    config = {**BASE, "variants": ["linA", "linB"]}
    for p, expected in ((0.005, INCONCLUSIVE), (0.004, FAILS)):
        verdicts = [claim("C1", [(HOLDS, 0.9), (FAILS, p)]), claim("C2", [(INCONCLUSIVE, math.nan)] * 2),
                    claim("C3", [(HOLDS, 0.9), (HOLDS, 0.8)])]
        assert [c.outcome for c in _c4(verdicts, config, Settings()).cells] == [INCONCLUSIVE, expected]


def test_each_deciding_test_sizes_its_seeds_to_fail_at_its_claims_bonferroni_level(tmp_path, monkeypatch):
    """paired.test is told k, the claim's deciding tests (C1, C2: 2; C3: 1), so that seeds_needed counts a
    failure at alpha / k as the claim reads it; a reported test decides nothing (k 1)."""
    from linvit.claims import judge as claims_module

    seen, test = {}, claims_module.paired.test

    def spy(sample, numerator, denominator, threshold, side, settings, k=1):
        seen[(tuple(numerator.items()), side, threshold)] = k
        return test(sample, numerator, denominator, threshold, side, settings, k)
    monkeypatch.setattr(claims_module.paired, "test", spy)
    verdicts_of(tmp_path, {**BASE, "variants": ["linA"]})
    thresholds = Thresholds(margin=0.005)
    for claim in CLAIMS:
        for t in (t for t in claim.tests if t.threshold is not None):
            key = (t.statistic.numerator, t.side, thresholds.value(t.threshold))
            assert seen[key] == (len(claim.deciding) if t.decides else 1), (claim.name, t.statistic.name)


def test_a_claim_reads_its_cells_first_when_a_role_is_absent_or_cells_are_blocked():
    """Issue 55, item 5: a failure stands where another test is blocked, so a claim that fails in every
    cell is 'not supported' even with a role the grid lacks (it read 'not evaluable'); and one holding cell
    beside three not-evaluable ones is 'supported in the cells judged (1 of 4)', not 'supported'."""
    from linvit.claims.judge import _overall

    def cells(*outcomes):
        return [CellVerdict("C1", "d", "s", f"v{i}", 10, o) for i, o in enumerate(outcomes)]

    assert _overall("C1", "", cells(FAILS, FAILS), ["attn_only"]).verdict == \
        "not supported; no strategy of the grid fills attn_only"
    assert _overall("C1", "", cells(NOT_EVALUABLE, NOT_EVALUABLE), ["attn_only"]).verdict == \
        "not evaluable: no strategy of the grid fills attn_only"
    assert _overall("C1", "", cells(HOLDS, NOT_EVALUABLE, NOT_EVALUABLE, NOT_EVALUABLE), []).verdict == \
        "supported in the cells judged (1 of 4)"
    assert _overall("C1", "", cells(FAILS, NOT_EVALUABLE), []).verdict == "not supported in the cells judged (1 of 2)"
    assert _overall("C1", "", cells(HOLDS, HOLDS), []).verdict == "supported"


def test_a_look_is_read_with_the_runs_it_has_and_keeps_them_out_when_read_again(tmp_path):
    """Issue 55, item 4: under the driver (`decide_look`), a look whose run could not finish is read with the
    seeds that paired, the run named, its degrees of freedom those seeds'; without the driver it waits for
    the run. Recorded as dropped (`dropped_runs`), the run stays out of that look when it comes later, so a
    past look reads the same; and each look pairs its own seeds: a later seed's run without predictions does
    not turn an earlier look seeds-only."""
    config = {**BASE, "variants": ["linA"], "seeds": [0, 1, 2], "sequential": {"looks": [3, 5]},
              "claims": {"margin": 0.005, "min_seeds": 2}}
    cells = list(all_cells(config))
    lost = next(c for c in cells if c.init == "attn_only" and c.seed == 2)
    for cell in cells:
        if cell is not lost:
            write_cell(tmp_path, cell, accuracy(cell), predictions=True)

    def attn_alone(extra: dict):
        cfg = {**config, **extra}
        runs, _ = collect(cfg, tmp_path)
        verdicts = evaluate_claims(runs, cfg, load_predictions(runs))
        return next(v for v in verdicts if v.claim == "C1").cells[0].test("attn_alone")

    waits = attn_alone({})
    assert waits.outcome == TOO_FEW and waits.note.startswith("look 1 waits for seeds 2")
    read = attn_alone({"decide_look": 1})
    assert read.outcome != TOO_FEW and [look["seeds"] for look in read.looks] == [2]
    assert "runs dropped from look 1: " in read.looks[0]["note"] and "seed 2" in read.looks[0]["note"]
    write_cell(tmp_path, lost, accuracy(lost), predictions=True)  # the run comes at look 2
    again = attn_alone({"decide_look": 2, "dropped_runs": [{"look": 1, "runs": [lost.key]}]})
    assert again.looks[0]["statistic"] == read.looks[0]["statistic"] and again.looks[0]["seeds"] == 2
    # Look 2's seeds 3 and 4, one run without predictions: look 1 stays paired image by image.
    added = [{"dataset": c.dataset, "size": c.size, "variant": c.variant, "init": c.init, "design": c.design,
              "budget": c.budget, "seeds": [3, 4]} for c in cells if c.seed == 0]
    for cell in all_cells({**config, "added_seeds": added}):
        if cell.seed >= 3:
            write_cell(tmp_path, cell, accuracy(cell), predictions=cell.seed == 3 or cell.init != "random")
    both = attn_alone({"added_seeds": added, "decide_look": 2, "dropped_runs": [{"look": 1, "runs": [lost.key]}]})
    assert both.looks[0]["statistic"] == read.looks[0]["statistic"]
    assert len(both.looks) == 1 or both.looks[1]["seeds"] == 5
