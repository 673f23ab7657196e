"""The one evaluator that judges the claims table (linvit.claims.table) cell by cell.

A claim cell is (dataset, size, variant, budget): students compared with the roles and the softmax
reference trained with the same budget. Each test pairs its own roles' runs by seed and test image
(linvit.stats.pairing.pair) and is judged by linvit.stats.paired.test: holds, fails, inconclusive, or
too few seeds (below `claims.min_seeds`). A claim holds in a cell when all its deciding tests hold;
it fails when one fails at the Bonferroni level across its k deciding tests (multitest.combine), k counting
every deciding test of the claim, so a failure stands even where another test is not evaluable (a
role the grid lacks, runs that do not pair); otherwise such a cell is not evaluable.

C4 is not a table entry but the aggregation of C1-C3 over the linear cells: every cell holding (an
intersection-union rule, no correction), or a failure that survives Holm's correction across every
(claim, cell, budget) the grid lists (linvit.config.grid_cells: the full product by default), so the error of
"fails somewhere" is controlled over budgets too (the family is every such triple, also the ones not judged:
its size does not depend on the data). An axis (datasets, sizes, variants) the grid does not vary is "not
tested"; around a center each is read along the cells that vary it alone (linvit.claims.axes). Cells of the softmax control variant
(`softmax` listed in `variants`: the attention-transfer setting without a softmax-to-linear boundary)
are evaluated with the same tests but decide no claim; the report shows them beside each variant.

The evaluator returns numbers only (linvit.claims.verdicts); the words are the renderer's. It reads no
file: the runs' per-image predictions are given (the report reads them, linvit.report.aggregate).
"""

from __future__ import annotations

import math

import pandas as pd

from linvit.claims.axes import along
from linvit.claims.roles import ROLES, RoleMatch, resolve_roles
from linvit.claims.table import (C4_STATEMENT, CLAIMS, REFERENCE, Claim, Design, Test, Thresholds, claim_cells,
                                 linear_variants)
from linvit.claims.verdicts import (CONTROL_NARROWED, NOT_EVALUABLE, NOT_TESTED, CellVerdict, ClaimVerdict,
                                    TestOutcome, outcome_counts, outcome_word)
from linvit.config import CHECKPOINT, CHECKPOINTS, NO_DESIGN, ONE_TEACHER, budgets, pretrained, teacher_design
from linvit.grid import CONTROL_VARIANT, REFERENCE_INIT, REFERENCE_VARIANT, inits_of, run_key
from linvit.stats import multitest, paired, pairing, sequential
from linvit.stats.paired import FAILS, HOLDS, INCONCLUSIVE, TOO_FEW

_SHARES = {t.statistic.name: t.statistic.is_share for c in CLAIMS for t in c.tests}


def evaluate_claims(runs: pd.DataFrame, config: dict, predictions: dict) -> list[ClaimVerdict]:
    """C1-C4 per cell, per budget and overall, with every test's numbers.

    predictions: (dataset, size, variant, init, design, budget, seed) -> linvit.predictions.Predictions, the
    per-image predictions of the runs that have them (the report reads them: linvit.report.aggregate's
    load_predictions); a run without is paired by seed alone."""
    thresholds, settings = Thresholds.from_config(config), paired.Settings.from_config(config)
    design = Design.from_config(config)
    ok = runs[runs["status"] == "ok"]
    matches = resolve_roles(config)
    verdicts = []
    for claim in CLAIMS:
        absent = [matches[r].absent() for r in claim.roles if r != REFERENCE and matches[r].strategy is None]
        cells = [_judge(claim, _Cell(cell, matches, ok, predictions, inits_of(config, cell[2]), design),
                        thresholds, settings) for cell in claim_cells(config)]
        verdict = _overall(claim.name, claim.statement, [c for c in cells if not c.control], absent)
        verdict.controls = [c for c in cells if c.control]
        verdict.roles = {r: matches[r].strategy for t in claim.tests for r in t.statistic.roles if r != REFERENCE}
        verdict.designs = {r: matches[r].design for r in verdict.roles if ROLES[r].distill}
        _per_budget(verdict, absent, config)
        verdicts.append(verdict)
    verdicts.append(_c4(verdicts, config, settings, design))
    for verdict in verdicts:
        verdict.intervals = intervals_over(config)
    return verdicts


def intervals_over(config: dict, size: str | None = None) -> str:
    """What the verdicts' intervals are over, from the config (linvit.config.teacher_design): 'over 5 seeds,
    each with its own teacher, and the test images' (PER_SEED), '..., conditional on one teacher (seed 0)'
    (ONE_TEACHER), '..., for this checkpoint (deit_tiny_patch16_224)' (CHECKPOINT), 'over 5 seeds, each with
    its own checkpoint of deit_tiny_patch16_224 (teachers.deit.replicates), ...' (CHECKPOINTS). For the whole grid
    (size None): one phrase when every size has the same, else one per size ('tiny: ...; small: ...'). Under a
    sequential plan 'over the seeds of each look (5 to 30, a sequential plan), ...'."""
    if size is None:
        phrases = {s: intervals_over(config, s) for s in config["sizes"]}
        if len(set(phrases.values())) <= 1:
            return next(iter(phrases.values()), "")
        return "; ".join(f"{s}: {phrase}" for s, phrase in phrases.items())
    n, looks = len(config["seeds"]), (config.get("sequential") or {}).get("looks")
    # Under a sequential plan each look reads its own number of seeds (linvit.stats.sequential).
    seeds = (f"the seeds of each look ({looks[0]} to {looks[-1]}, a sequential plan)" if looks
             else f"{n} seed{'s' if n != 1 else ''}")
    design = teacher_design(config, size)
    if design == CHECKPOINT:
        entry = pretrained(config, size)
        name = str(entry.get("model")) + (f" from {entry['file']}" if entry.get("file") else "")
        return f"over {seeds} and the test images, for this checkpoint ({name})"
    if design == CHECKPOINTS:
        return (f"over {seeds}, each with its own checkpoint of {pretrained(config, size).get('model')} "
                f"(teachers.{size}.replicates), and the test images")
    if design == ONE_TEACHER:
        return f"over {seeds} and the test images, conditional on one teacher (seed {config['teacher']['seed']})"
    return f"over {seeds}, each with its own teacher, and the test images"


class _Cell:
    """The finished runs of one cell, looked up by role (the reference by REFERENCE)."""

    def __init__(self, cell: tuple[str, str, str, int], matches: dict[str, RoleMatch], ok: pd.DataFrame,
                 predictions: dict, inits: list[str], design: Design | None = None):
        self.dataset, self.size, self.variant, self.budget = cell
        self.matches, self.predictions, self.inits = matches, predictions, inits
        self.design = design  # a sequential plan and its looks' seeds (None: the fixed design)
        self.ok = ok[(ok["dataset"] == self.dataset) & (ok["size"] == self.size) & (ok["budget"] == self.budget)]

    def key(self, role: str) -> tuple[str, str] | None:
        return (REFERENCE_INIT, NO_DESIGN) if role == REFERENCE else self.matches[role].key

    def label(self, role: str) -> str:
        return "softmax reference" if role == REFERENCE else self.matches[role].label

    def runs(self, role: str) -> list[pairing.Run]:
        init, design = self.key(role)
        variant = REFERENCE_VARIANT if role == REFERENCE else self.variant
        done = self.ok[(self.ok["variant"] == variant) & (self.ok["init"] == init) & (self.ok["design"] == design)]
        return [pairing.Run(int(r.seed), float(r.test_acc),
                          self.predictions.get((r.dataset, r.size, r.variant, r.init, r.design, r.budget, r.seed)),
                          f"{self.label(role)} seed {r.seed}") for r in done.itertuples()]

    def run_key(self, role: str, seed: int) -> str:
        init, design = self.key(role)
        variant = REFERENCE_VARIANT if role == REFERENCE else self.variant
        return run_key(self.dataset, self.size, variant, init, seed, design, self.budget)

    def missing(self, roles: list[str]) -> str:
        """Why the roles cannot be compared here ('' when each has a finished run)."""
        unfinished = []
        for role in roles:
            if role != REFERENCE and self.matches[role].strategy is None:
                return f"no strategy of the grid fills {role}"
            if role != REFERENCE and self.matches[role].strategy not in self.inits:
                return f"{CONTROL_NARROWED}: it runs no {self.matches[role].strategy}"
            if self.key(role) is None:
                return f"{self.label(role)} has no distillation design (set `distills`)"
            if not self.runs(role):
                unfinished.append(self.label(role))
        return f"no finished run of {', '.join(unfinished)}" if unfinished else ""


def _judge(claim: Claim, cell: _Cell, thresholds: Thresholds, settings: paired.Settings) -> CellVerdict:
    verdict = CellVerdict(claim.name, cell.dataset, cell.size, cell.variant, cell.budget, NOT_EVALUABLE,
                          control=cell.variant == CONTROL_VARIANT)
    k = len(claim.deciding)  # the Bonferroni k: every deciding test, evaluable or not
    verdict.tests = [_run_test(test, cell, thresholds, settings, k if test.decides else 1) for test in claim.tests]
    deciding = [t for t in verdict.tests if t.decides]
    judged = [t for t in deciding if t.outcome != NOT_EVALUABLE]
    # One evaluable test failing at alpha / k fails the claim whatever the others would say; holding needs
    # them all, so short of a failure a test that could not be evaluated leaves the cell not evaluable.
    if cell.design is not None:  # each test decided at its own looks; the claim fails when one failed
        outcomes = [t.outcome for t in judged]
        outcome = (FAILS if FAILS in outcomes else TOO_FEW if TOO_FEW in outcomes
                   else sequential.combine(judged) if judged else NOT_EVALUABLE)
    else:
        outcome = multitest.combine(judged, settings, k)  # reads each test's outcome and p_fails
    blocked = [t for t in deciding if t.outcome == NOT_EVALUABLE]
    if blocked and outcome != FAILS:
        verdict.why = "; ".join(dict.fromkeys(t.note for t in blocked))  # each reason once
        return verdict
    verdict.outcome = outcome
    verdict.p_fails = multitest.combined_p_fails(judged, k)  # never from a too-few-seeds test; NaNs skipped
    return verdict


def _run_test(test: Test, cell: _Cell, thresholds: Thresholds, settings: paired.Settings, k: int = 1) -> TestOutcome:
    """One test in one cell; k: the deciding tests of its claim (for the seeds that would fail it)."""
    s = test.statistic
    out = TestOutcome(s.name, NOT_EVALUABLE, decides=test.decides, side=test.side or "")
    why = cell.missing(s.roles)
    if why:
        out.note = why
        return out
    runs = {role: cell.runs(role) for role in s.roles}
    if cell.design is not None and test.decides and test.threshold is not None:
        out.threshold = thresholds.value(test.threshold)
        return _sequential_test(out, test, runs, cell, settings, k)
    try:
        sample = pairing.pair(runs)
    except pairing.PairingError as err:
        out.note = f"runs cannot be paired: {err}"
        return out
    numerator, denominator = dict(s.numerator), dict(s.denominator) if s.denominator else None
    out.seeds, out.images = len(sample.seeds), sample.images
    if test.threshold is None:
        e = paired.estimate(sample, numerator, denominator, settings)
        out.outcome = ""
    else:
        out.threshold = thresholds.value(test.threshold)
        result = paired.test(sample, numerator, denominator, out.threshold, test.side, settings, k)
        e = result.estimate
        out.outcome, out.p_holds, out.p_fails, out.mde, out.note = (result.outcome, result.p_holds, result.p_fails,
                                                                    result.mde, result.note)
        out.seeds_needed, out.seeds_needed_low, out.seeds_needed_high = (
            result.seeds_needed, result.seeds_needed_low, result.seeds_needed_high)
    out.estimate, out.low, out.high, out.level = e.estimate, e.low, e.high, e.level
    return out


def _overall(name: str, statement: str, cells: list[CellVerdict], absent: list[str]) -> ClaimVerdict:
    """The claim over its cells. A role the grid lacks leaves every cell short of holding, but a failure
    stands where another test is blocked (_judge), so the cells speak first: 'not evaluable' only where
    none of them could be judged."""
    counts = outcome_counts(cells)
    verdict = outcome_word(counts) if cells else f"{NOT_EVALUABLE}: the grid has no cells"
    if absent and verdict == NOT_EVALUABLE:
        verdict = f"{NOT_EVALUABLE}: no strategy of the grid fills " + "; ".join(absent)
    elif absent:
        verdict += "; no strategy of the grid fills " + "; ".join(absent)
    return ClaimVerdict(name, statement, verdict, counts, cells)


def _per_budget(verdict: ClaimVerdict, absent: list[str], config: dict, fixed: str | None = None) -> None:
    """The claim's verdict at each budget; with several budgets the overall verdict names them.
    `fixed`: one verdict for every budget (C4 on a grid that varies nothing)."""
    verdict.by_budget = []
    for budget in budgets(config):
        sub = _overall(verdict.claim, verdict.statement, [c for c in verdict.cells if c.budget == budget], absent)
        verdict.by_budget.append({"budget": budget, "verdict": fixed or sub.verdict, "counts": sub.counts})
    if len(verdict.by_budget) < 2 or fixed or verdict.verdict.startswith(NOT_EVALUABLE):
        return
    words = [b["verdict"] for b in verdict.by_budget]
    steps = ", ".join(str(b["budget"]) for b in verdict.by_budget)
    if verdict.verdict == "supported" and set(words) == {"supported"}:
        verdict.verdict += f" at every budget ({steps} steps)"
    elif verdict.verdict == "not supported" and set(words) == {"not supported"}:
        verdict.verdict += f" at any budget ({steps} steps)"
    else:
        verdict.verdict += "; " + ", ".join(f"at {b['budget']} steps {w}" for b, w in zip(verdict.by_budget, words))


def _c4(verdicts: list[ClaimVerdict], config: dict, settings: paired.Settings,
        design: Design | None = None) -> ClaimVerdict:
    """C1-C3 together per linear cell and budget. Holds in a cell when all three hold there (an
    intersection-union rule: "holds everywhere" needs no correction, each test at alpha); fails when one
    of them fails after Holm's correction across every (claim, cell, budget) the grid lists, one family, so
    that more cells or more budgets never make a spurious failure anywhere more likely than alpha (the
    overall verdict and every budget's read the same corrected family); a triple without a p-value (not
    evaluable, too few seeds, no established benefit) still counts in the family's size, so the
    correction is fixed by the grid, not by the data; too few seeds / not evaluable / inconclusive
    otherwise."""
    rows = [parts for budget in budgets(config)
            for parts in zip(*([c for c in v.cells if c.budget == budget] for v in verdicts))]
    if design is None:
        p_values = [p.p_fails if p.outcome in (FAILS, INCONCLUSIVE, HOLDS) else math.nan
                    for parts in rows for p in parts]
        rejected = iter(multitest.holm(p_values, settings.alpha))
        failures = [[p.claim for p in parts if next(rejected)] for parts in rows]
    else:
        # Under a sequential plan, Bonferroni over the same family: a claim fails in C4 when one of its tests
        # crossed a fail side spending alpha / (k m) on its own looks (Holm needs p-values that a non-binding
        # stop does not give; linvit.stats.sequential).
        # Each failure is read with every gate of its test's own decision (sequential.fails_at): a test that
        # cannot fail in its cell (zero variance, a share's benefit not established) cannot fail C4 there.
        m = sum(len(parts) for parts in rows)  # every (claim, cell, budget) the grid lists
        k = {c.name: len(c.deciding) for c in CLAIMS}
        failures = [[p.claim for p in parts
                     if any(sequential.fails_at(t.looks, settings.alpha / (k[p.claim] * m), design.plan,
                                                (t.threshold, t.side) if _SHARES.get(t.name) else None)
                            for t in p.tests if t.decides and t.looks)] for parts in rows]
    cells = []
    for parts, failed in zip(rows, failures):
        first = parts[0]
        # Undecided by what the cells give: under a plan a claim fails here at its own level but not at the
        # family's (Bonferroni), so the cell is undecided within the cap, never "inconclusive".
        cell = CellVerdict("C4", first.dataset, first.size, first.variant, first.budget,
                           INCONCLUSIVE if design is None else sequential.FUTILE,
                           parts={p.claim: p.outcome for p in parts})
        outcomes = [p.outcome for p in parts]
        if failed:
            cell.outcome = FAILS
        elif all(o == HOLDS for o in outcomes):
            cell.outcome = HOLDS
        elif NOT_EVALUABLE in outcomes:
            cell.outcome, cell.why = NOT_EVALUABLE, ", ".join(p.claim for p in parts if not p.evaluable) \
                + " not evaluable"
        elif TOO_FEW in outcomes:
            cell.outcome = TOO_FEW
        elif sequential.CONTINUES in outcomes:  # a sequential claim that may still decide
            cell.outcome = sequential.CONTINUES
        elif sequential.FUTILE in outcomes:
            cell.outcome = sequential.FUTILE
        cells.append(cell)
    result = _overall("C4", C4_STATEMENT, cells, [])
    axes = {"datasets": config["targets"], "sizes": config["sizes"], "variants": linear_variants(config)}
    for axis, values in axes.items():
        if len(values) < 2:
            result.axes[axis] = f"{NOT_TESTED} (the grid has one: {values[0] if values else 'none'})"
        else:
            per = []
            for value in values:  # around a center: along the cells that vary this axis alone (axes.along)
                word = outcome_word(outcome_counts(along(cells, config, axis, value)))
                per.append(f"{value}: {word}")
            result.axes[axis] = "; ".join(per)
    fixed = None
    if all(len(values) < 2 for values in axes.values()):
        # Nothing to hold "across": C4 is not tested, and so is each of its cells (one reading in every
        # column); a cell's parts still name C1-C3's outcomes there.
        fixed = result.verdict = f"{NOT_TESTED}: the grid varies no dataset, size or linear variant"
        for cell in cells:
            cell.outcome = NOT_TESTED
        result.counts = outcome_counts(cells)
    _per_budget(result, [], config, fixed)
    return result


def _sequential_test(out: TestOutcome, test: Test, runs: dict[str, list[pairing.Run]], cell: _Cell,
                     settings: paired.Settings, k: int) -> TestOutcome:
    """A deciding test read at its design's looks (linvit.stats.sequential), the hold side at alpha, the fail
    side at alpha / k (k: its claim's deciding tests). Each look pairs its own seeds' runs (so a later run
    never changes an earlier look's sample or mode) and is read once they have all paired or, under the
    driver, at its look with the runs it has: a run that could not finish is dropped from that look and
    named, and the look's information fraction is what its paired seeds give."""
    s, design = test.statistic, cell.design
    samples, notes = [], []
    for j, seeds in enumerate(design.seeds):
        dropped = design.dropped.get(j + 1, frozenset())
        part = {role: [r for r in rs if r.seed in seeds and cell.run_key(role, r.seed) not in dropped]
                for role, rs in runs.items()}
        lacking = {role: sorted(set(seeds) - {r.seed for r in rs}) for role, rs in part.items()}
        lacking = {role: missing for role, missing in lacking.items() if missing}
        if not design.reads(j + 1, complete=not lacking):
            break
        try:
            sample = pairing.pair(part)
        except pairing.PairingError:
            sample = None
        if sample is None or len(sample.seeds) < max(2, settings.min_seeds):
            if not samples:  # look 1 cannot be read: too few of its runs finished
                got = 0 if sample is None else len(sample.seeds)
                out.outcome, out.seeds = TOO_FEW, got
                out.note = (f"look 1 has {got} paired seed{'s' if got != 1 else ''} of {len(seeds)}"
                            + (f" ({_lacking(cell, lacking)})" if lacking else ""))
                return out
            break
        samples.append(sample)
        notes.append(f"runs dropped from look {j + 1}: {_lacking(cell, lacking)}" if lacking else "")
    if not samples:
        missing = sorted(set(design.seeds[0]) - set.intersection(*({r.seed for r in rs} for rs in runs.values())))
        out.outcome, out.note = TOO_FEW, f"look 1 waits for seeds {', '.join(map(str, missing))}"
        return out
    result = sequential.sequential_test(samples, dict(s.numerator), dict(s.denominator) if s.denominator else None,
                                        out.threshold, test.side, design.plan, settings.alpha, settings.alpha / k)
    for look, note in zip(result.looks, notes):
        if note:
            look.note = f"{look.note}; {note}" if look.note else note
    last = result.last
    out.outcome, out.stopped, out.looks = result.outcome, result.stopped, [look.as_dict() for look in result.looks]
    out.estimate, out.low, out.high, out.level, out.note = last.estimate, last.low, last.high, result.level, last.note
    out.seeds, out.images = last.seeds, samples[len(result.looks) - 1].images
    return out


def _lacking(cell: _Cell, lacking: dict[str, list[int]]) -> str:
    """'attn_only seeds 3, 4; softmax reference seed 2' (the runs a look is read without)."""
    return "; ".join(f"{cell.label(role)} seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"
                     for role, seeds in lacking.items())
