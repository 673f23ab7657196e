"""The sequential design's pieces (linvit.stats.sequential): boundaries against published values, the plan's
checks, a test read at its looks, the information fraction with the test images' part, and the grid's
added runs (linvit.grid.added_cells). The calibration under the stopping rule is
tests/test_calibration_sequential.py; the driver end to end is tests/test_decide.py."""

import math

import numpy as np
import pytest

from linvit import grid
from linvit.config import ConfigError, load_config, seed_sequence, validate
from linvit.stats import boundaries, paired, pairing
from linvit.stats import sequential as seq

from conftest import REPO, run

EVEN = [0.2, 0.4, 0.6, 0.8, 1.0]


@pytest.mark.parametrize("spending, gamma, published", [
    # Lan-DeMets spending at five equally spaced looks, one-sided 0.025 (Jennison and Turnbull 2000, table 7.6
    # and gsDesign's sfLDOF / sfLDPocock): the recursive integration reproduces them to 3 decimals.
    ("obrien_fleming", 0.0, [4.877, 3.357, 2.680, 2.290, 2.031]),
    ("pocock", 0.0, [2.438, 2.427, 2.410, 2.397, 2.386]),
])
def test_boundaries_match_published_values(spending, gamma, published):
    plan = seq.Plan((5, 10, 15, 20, 25), spending, gamma)
    assert boundaries.boundaries(EVEN, 0.025, plan) == pytest.approx(published, abs=1.5e-3)


def test_boundaries_spend_exactly_the_error_by_simulation():
    """Under the null, the chance of crossing any look's boundary is the alpha spent (Monte Carlo)."""
    plan = seq.Plan((5, 10, 15, 20, 30), "hwang_shih_decani", 0.0)
    fractions = [0.15, 0.35, 0.5, 0.7, 1.0]
    c = np.array(boundaries.boundaries(fractions, 0.025, plan))
    rng = np.random.default_rng(0)
    steps = rng.standard_normal((400_000, 5)) * np.sqrt(np.diff([0.0, *fractions]))
    z = np.cumsum(steps, axis=1) / np.sqrt(fractions)
    crossed = (z >= c).any(axis=1).mean()
    assert crossed == pytest.approx(0.025, abs=0.0015)
    first = (z[:, 0] >= c[0]).mean()
    assert first == pytest.approx(plan.spent(0.025, 0.15), abs=0.001)


def test_t_critical_keeps_the_nominal_significance():
    for z, df in ((2.0, 4), (3.1, 9), (5.0, 29)):
        t = boundaries.t_critical(z, df)
        assert t > z  # fewer degrees of freedom: a wider boundary
        assert paired._cdf(-t, df) == pytest.approx(paired._cdf(-z, math.inf), rel=1e-9)


def test_conditional_power_reads_the_trend():
    assert boundaries.conditional_power(3.0, 0.5, 2.0, 2.0) > 0.9  # far on the hold side: crosses at the cap
    assert boundaries.conditional_power(0.0, 0.5, 2.0, 2.0) < 0.05  # at the threshold: crosses neither
    assert boundaries.conditional_power(-3.0, 0.5, 2.0, 2.0) > 0.9  # far on the fail side
    assert boundaries.conditional_power(1.0, 1.0, 2.0, 2.0) == 0.0  # at the cap: nothing left


def base_config():
    return load_config(REPO / "workflow/config/default.yaml")


@pytest.mark.parametrize("plan, message", [
    ({"looks": [5]}, "sequential.looks"),
    ({"looks": [5, 5, 10]}, "sequential.looks"),
    ({"looks": [3, 10]}, "first entry must be the number of seeds (5)"),
    ({"looks": [5, 10], "spending": "linear"}, "sequential.spending"),
    ({"looks": [5, 10], "futility": 1.5}, "sequential.futility"),
    ({"looks": [5, 10], "futility_from": 3}, "sequential.futility_from"),
])
def test_a_bad_plan_is_one_line_naming_its_key(plan, message):
    config = {**base_config(), "sequential": plan}
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")) as err:
        validate(config)
    assert "\n" not in str(err.value)


def test_no_plan_is_the_fixed_design():
    assert seq.Plan.from_config(base_config()) is None


def test_plan_fingerprint_changes_with_the_plan():
    a = seq.Plan.from_config({**base_config(), "sequential": {"looks": [5, 10, 30]}})
    b = seq.Plan.from_config({**base_config(), "sequential": {"looks": [5, 10, 30], "futility": 0.2}})
    assert a.fingerprint() != b.fingerprint()
    assert a.fingerprint() == seq.Plan.from_config({**base_config(), "sequential": {"looks": [5, 10, 30]}}).fingerprint()


def sample(values: np.ndarray, images: int = 0) -> pairing.Sample:
    """A paired sample of two roles from per-seed accuracies (seeds only), or with `images` 0/1 columns."""
    n = values.shape[1]
    return pairing.Sample({"a": values[0][:, None], "b": values[1][:, None]}, list(range(n)), 0, pairing.SEEDS_ONLY)


def looks_of(s: pairing.Sample, plan: seq.Plan):
    return [seq.look_sample(s, list(range(n))) for n in plan.looks if n <= len(s.seeds)]


def test_a_clear_difference_stops_early_and_its_repeated_interval_covers_it():
    rng = np.random.default_rng(1)
    plan = seq.Plan((5, 10, 15, 20, 30))
    a = 0.80 + 0.005 * rng.standard_normal(30)
    b = 0.70 + 0.005 * rng.standard_normal(30)
    result = seq.sequential_test(looks_of(sample(np.stack([a, b])), plan), {"a": 1, "b": -1}, None, 0.0, ">=",
                                 plan, 0.025, 0.025)
    assert (result.outcome, result.stopped) == (paired.HOLDS, 1)
    look = result.looks[0]
    assert look.low <= 0.10 <= look.high and look.statistic >= look.hold_bound
    assert len(result.looks) == 1  # nothing read after it stopped


def share_sample(benefit_z: float, seeds: int = 5, seed: int = 0) -> pairing.Sample:
    """attn_only, random and copy_all over `seeds` seeds: a benefit (copy_all - random) of 0.1 whose t is
    `benefit_z`, and attn_only - random = 0.25 x benefit - 0.02 to within 1e-4 (the share about 0.05, far
    below a 0.25 threshold on the contrast's own scale)."""
    rng = np.random.default_rng(seed)
    noise = rng.standard_normal(seeds)
    noise = (noise - noise.mean()) / noise.std(ddof=1)
    benefit = 0.1 + noise * 0.1 * math.sqrt(seeds) / benefit_z
    random = 0.5 + 0.01 * rng.standard_normal(seeds)
    attn = random + 0.25 * benefit - 0.02 + 1e-4 * rng.standard_normal(seeds)
    columns = {"attn_only": attn, "random": random, "copy_all": random + benefit}
    return pairing.Sample({r: v[:, None] for r, v in columns.items()}, list(range(seeds)), 0, pairing.SEEDS_ONLY)


SHARE = ({"attn_only": 1, "random": -1}, {"copy_all": 1, "random": -1})


def test_a_share_decides_only_where_its_repeated_interval_is_bounded():
    """Issue 55, item 1: a benefit clear at t(0.975, 4) = 2.78 but not at the look's hold boundary (about 5):
    the share's contrast is far on the hold side, yet its Fieller interval at that boundary is unbounded,
    so it must not hold there; with the benefit clear at the boundary it holds, its interval bounded."""
    plan = seq.Plan((5, 10, 15))
    vague = seq.sequential_test([share_sample(3.5)], *SHARE, 0.25, "<=", plan, 0.025, 0.0125)
    look = vague.looks[0]
    assert look.statistic > 10 * look.hold_bound  # the contrast alone would hold
    assert paired._quantile(0.975, 4) < 3.5 < look.hold_bound
    assert vague.outcome == seq.CONTINUES and "not established positive" in look.note
    assert look.high == math.inf
    clear = seq.sequential_test([share_sample(12.0)], *SHARE, 0.25, "<=", plan, 0.025, 0.0125)
    assert clear.outcome == paired.HOLDS and math.isfinite(clear.looks[0].high) and clear.looks[0].high <= 0.25


def test_zero_variance_decides_nothing_at_any_look():
    """Issue 55, item 2: two roles with equal accuracies on every seed have no variance to test against:
    no decision, no interval, at every look; at the cap the test ends undecided, never on an infinite T."""
    plan = seq.Plan((3, 5))
    same = np.full((2, 5), 0.8)
    result = seq.sequential_test(looks_of(sample(same), plan), {"a": 1, "b": -1}, None, -0.01, ">=", plan,
                                 0.025, 0.025)
    assert [look.outcome for look in result.looks] == [seq.CONTINUES, seq.FUTILE]
    assert all(look.note == paired.NO_TEST and math.isnan(look.statistic) and math.isnan(look.low)
               for look in result.looks)


def test_a_failing_share_fails_at_its_own_alpha():
    """The fail side spends fail_alpha: a result between the two sides' boundaries fails only at the looser."""
    rng = np.random.default_rng(2)
    plan = seq.Plan((5, 10, 15, 20, 30))
    a = 0.70 + 0.01 * rng.standard_normal(30)
    b = 0.50 + 0.01 * rng.standard_normal(30)
    s = looks_of(sample(np.stack([a, b])), plan)
    strict = seq.sequential_test(s, {"a": 1, "b": -1}, None, 0.203, "<=", plan, 0.025, 0.025 / 1000)
    loose = seq.sequential_test(s, {"a": 1, "b": -1}, None, 0.203, "<=", plan, 0.025, 0.025)
    assert loose.looks[0].fail_bound < strict.looks[0].fail_bound
    assert loose.stopped <= strict.stopped


def test_at_the_threshold_it_stops_for_futility_or_reaches_the_cap_undecided():
    rng = np.random.default_rng(3)
    plan = seq.Plan((5, 10, 15, 20, 30))
    values = np.stack([0.75 + 0.02 * rng.standard_normal(30), 0.75 + 0.02 * rng.standard_normal(30)])
    result = seq.sequential_test(looks_of(sample(values), plan), {"a": 1, "b": -1}, None, 0.0, ">=", plan,
                                 0.025, 0.025)
    assert result.outcome == seq.FUTILE
    assert result.stopped < len(plan.looks)  # well before the cap: nothing near the threshold decides
    assert "conditional power" in result.looks[-1].note and result.looks[-1].power < plan.futility
    no_futility = seq.Plan((5, 10, 15, 20, 30), futility=None)
    full = seq.sequential_test(looks_of(sample(values), no_futility), {"a": 1, "b": -1}, None, 0.0, ">=",
                               no_futility, 0.025, 0.025)
    assert full.outcome in (seq.FUTILE, paired.HOLDS, paired.FAILS) and full.stopped >= result.stopped


def test_a_test_with_looks_to_come_continues():
    rng = np.random.default_rng(4)
    plan = seq.Plan((5, 10, 15))
    values = np.stack([0.75 + 0.02 * rng.standard_normal(5), 0.745 + 0.02 * rng.standard_normal(5)])
    result = seq.sequential_test(looks_of(sample(values), plan), {"a": 1, "b": -1}, None, 0.0, ">=", plan,
                                 0.025, 0.025)
    assert (result.outcome, result.stopped, len(result.looks)) == (seq.CONTINUES, 0, 1)


def test_the_images_part_saturates_the_information():
    """With the test images' variance dominating, more seeds add little information: look 1's fraction is
    near 1 (and its boundary near the cap's), where seeds alone would give 5/30."""
    rng = np.random.default_rng(5)
    plan = seq.Plan((5, 30), futility=None)
    n, images = 5, 400
    item = rng.standard_normal(images)  # a strong per-image effect every seed shares
    a = (item[None, :] + 0.01 * rng.standard_normal((n, images)) > 0).astype(np.float32)
    b = (item[None, :] + 0.01 * rng.standard_normal((n, images)) > 0.3).astype(np.float32)
    s = pairing.Sample({"a": a, "b": b}, list(range(n)), images, pairing.SEEDS_AND_IMAGES)
    result = seq.sequential_test([s], {"a": 1, "b": -1}, None, 0.0, ">=", plan, 0.025, 0.025)
    assert result.looks[0].fraction > 0.9
    seeds_only = pairing.Sample({"a": a.mean(1, keepdims=True), "b": b.mean(1, keepdims=True)}, list(range(n)), 0,
                              pairing.SEEDS_ONLY)
    alone = seq.sequential_test([seeds_only], {"a": 1, "b": -1}, None, 0.0, ">=", plan, 0.025, 0.025)
    assert alone.looks[0].fraction == pytest.approx(5 / 30, abs=2e-3)


def test_recorded_fractions_are_kept():
    """A look's fraction is the one recorded when it was read: later data never moves its boundary."""
    rng = np.random.default_rng(6)
    plan = seq.Plan((5, 10, 15))
    values = np.stack([0.75 + 0.02 * rng.standard_normal(15), 0.70 + 0.02 * rng.standard_normal(15)])
    s = looks_of(sample(values), plan)
    first = seq.sequential_test(s[:1], {"a": 1, "b": -1}, None, 0.2, ">=", plan, 0.025, 0.025)
    again = seq.sequential_test(s, {"a": 1, "b": -1}, None, 0.2, ">=", plan, 0.025, 0.025)
    assert again.looks[0].as_dict() == first.looks[0].as_dict()


def test_combine_reads_a_claim_sequentially():
    r = lambda o: seq.SequentialResult(o, 1, 0.95)  # noqa: E731
    assert seq.combine([r(paired.HOLDS), r(paired.HOLDS)]) == paired.HOLDS
    assert seq.combine([r(paired.HOLDS), r(paired.FAILS)]) == paired.FAILS
    assert seq.combine([r(seq.FUTILE), r(seq.CONTINUES)]) == seq.CONTINUES
    assert seq.combine([r(seq.FUTILE), r(paired.HOLDS)]) == seq.FUTILE


def test_look_sample_takes_exactly_the_looks_seeds():
    values = np.arange(12, dtype=float).reshape(2, 6)
    s = sample(values)
    part = seq.look_sample(s, [0, 1, 2])
    assert part.seeds == [0, 1, 2] and part.matrices["a"][:, 0].tolist() == [0, 1, 2]
    assert seq.look_sample(s, [0, 1, 7]) is None


def test_seed_sequence_continues_after_the_configured_seeds():
    assert seed_sequence({"seeds": [0, 1, 2, 3, 4]}, 8) == [0, 1, 2, 3, 4, 5, 6, 7]
    assert seed_sequence({"seeds": [3, 7]}, 4) == [3, 7, 8, 9]


def test_added_seeds_add_runs_and_their_teachers_only():
    config = base_config()
    added = {"dataset": "fmnist_5to9", "size": "micro", "variant": "elu", "init": "random", "design": "none",
             "budget": 200, "seeds": [5, 6]}
    more = validate({**config, "added_seeds": [added, {**added, "init": "reference", "variant": "softmax"}]})
    before, after = grid.jobs(config), grid.jobs(more)
    new = {j.name for j in after} - {j.name for j in before}
    assert new == {"teacher micro/seed5", "teacher micro/seed6",
                   *(f"{rule} fmnist_5to9/micro/{v}/{i}/none/steps200/seed{s}"
                     for rule, v, i in (("student", "elu", "random"), ("reference", "softmax", "reference"))
                     for s in (5, 6))}


def test_added_seeds_of_the_softmax_reference_need_no_softmax_control():
    """The reference trains as softmax whether or not `variants` lists the softmax control, so a look may add
    its seeds in a grid of linear variants alone (the driver does, for C3's test; it was refused as an unknown
    variant and stopped the sequence at look 2); a reference under a linear variant's name is refused."""
    config = {**base_config(), "variants": ["elu"]}
    added = {"dataset": "fmnist_5to9", "size": "micro", "variant": "softmax", "init": "reference", "design": "none",
             "budget": 200, "seeds": [5]}
    more = validate({**config, "added_seeds": [added]})
    assert "reference fmnist_5to9/micro/softmax/reference/none/steps200/seed5" in {j.name for j in grid.jobs(more)}
    with pytest.raises(ConfigError, match=r"added_seeds\[0\]\.variant"):
        validate({**config, "added_seeds": [{**added, "variant": "elu"}]})


@pytest.mark.parametrize("change, message", [
    ({"init": "copy_attn_x"}, "added_seeds[0].init"),
    ({"seeds": [4, 5]}, "seeds 4 are configured seeds already"),
    ({"budget": 300}, "added_seeds[0].budget"),
    ({"variant": "hedgehog"}, "added_seeds[0].variant"),
])
def test_bad_added_seeds_are_refused_in_one_line(change, message):
    added = {"dataset": "fmnist_5to9", "size": "micro", "variant": "elu", "init": "random", "design": "none",
             "budget": 200, "seeds": [5], **change}
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        validate({**base_config(), "added_seeds": [added]})


def test_fails_at_reads_a_failure_at_a_smaller_alpha_on_the_same_looks():
    rng = np.random.default_rng(7)
    plan = seq.Plan((5, 10, 15, 20, 30), futility=None)
    values = np.stack([0.70 + 0.01 * rng.standard_normal(30), 0.50 + 0.01 * rng.standard_normal(30)])
    result = seq.sequential_test(looks_of(sample(values), plan), {"a": 1, "b": -1}, None, 0.185, "<=", plan,
                                 0.025, 0.025)
    assert result.outcome == paired.FAILS
    looks = [look.as_dict() for look in result.looks]
    assert seq.fails_at(looks, 0.025, plan)  # its own alpha: the failure it recorded
    last = result.looks[-1]
    # An alpha so small that the last look's statistic no longer crosses: no failure in the family.
    assert not seq.fails_at(looks, 1e-12, plan) and last.statistic > -boundaries.t_critical(
        boundaries.boundaries([x.fraction for x in result.looks], 1e-12, plan)[-1], last.seeds - 1)


def test_c4_reads_each_failure_at_its_share_of_the_family():
    """Under a plan, C4 fails a cell when one of its claims' tests crossed the fail side spent at
    alpha / (k m) (m: every (claim, cell, budget)); a failure only at the claim's own alpha / k does not."""
    from linvit.claims.judge import _c4
    from linvit.claims.table import Design
    from linvit.claims.verdicts import CellVerdict, ClaimVerdict, TestOutcome

    config = {**base_config(), "variants": ["elu", "hedgehog"], "sequential": {"looks": [5, 10, 15, 20, 30]}}
    design = Design.from_config(config)

    def failing(distance, seed):
        """A C1 test below its 0.25 threshold by `distance`, read at its looks (fail side at 0.025 / 2)."""
        rng = np.random.default_rng(seed)
        values = np.stack([0.70 + 0.01 * rng.standard_normal(30), 0.45 + 0.01 * rng.standard_normal(30)])
        r = seq.sequential_test(looks_of(sample(values), design.plan), {"a": 1, "b": -1}, None, 0.25 - distance,
                                "<=", design.plan, 0.025, 0.0125)
        return TestOutcome("attn_alone", r.outcome, looks=[x.as_dict() for x in r.looks], stopped=r.stopped)

    held = TestOutcome("attn_alone", paired.HOLDS, looks=[], stopped=1)

    def c4_of(test):
        def cells(name, outcome, tests):
            return [CellVerdict(name, "fmnist_5to9", "micro", "elu", 200, outcome, tests=tests),
                    CellVerdict(name, "fmnist_5to9", "micro", "hedgehog", 200, paired.HOLDS, tests=[held])]
        verdicts = [ClaimVerdict("C1", "", "", {}, cells("C1", test.outcome, [test])),
                    ClaimVerdict("C2", "", "", {}, cells("C2", paired.HOLDS, [held])),
                    ClaimVerdict("C3", "", "", {}, cells("C3", paired.HOLDS, [held]))]
        return [c.outcome for c in _c4(verdicts, config, paired.Settings(), design).cells]

    near, far = failing(0.012, 1), failing(0.25, 1)  # both fail C1 in their cell
    assert near.outcome == far.outcome == paired.FAILS
    assert not seq.fails_at(near.looks, 0.025 / (2 * 6), design.plan) and seq.fails_at(far.looks, 0.025 / 12,
                                                                                       design.plan)
    assert c4_of(far) == [paired.FAILS, paired.HOLDS]
    # C1 failed here, but not at its share of the family: undecided within the cap, never "inconclusive" (item 6)
    assert c4_of(near) == [seq.FUTILE, paired.HOLDS]


def c2_share(benefit_z: float, gap: float, seed: int = 0) -> pairing.Sample:
    """mlp_only, random and copy_all over 5 seeds: a benefit (copy_all - random) whose t is `benefit_z` (1 pp
    where `benefit_z` is None: then its t is whatever 1 pp on 1 pp of noise gives) and mlp_only `gap` from random."""
    rng = np.random.default_rng(seed)
    random = 0.5 + 0.01 * rng.standard_normal(5)
    if benefit_z is None:
        benefit = 0.01 + 0.01 * rng.standard_normal(5)
    else:
        noise = rng.standard_normal(5)
        benefit = 0.1 + (noise - noise.mean()) / noise.std(ddof=1) * 0.1 * math.sqrt(5) / benefit_z
    mlp = random + gap + (0.005 if benefit_z is None else 0.002) * rng.standard_normal(5)
    columns = {"mlp_only": mlp, "random": random, "copy_all": random + benefit}
    return pairing.Sample({r: v[:, None] for r, v in columns.items()}, list(range(5)), 0, pairing.SEEDS_ONLY)


C2_SHARE = ({"mlp_only": 1, "random": -1}, {"copy_all": 1, "random": -1})


def test_c4_cannot_fail_a_cell_where_the_claims_own_test_cannot():
    """Issue 57 (an independent review's demonstration): mlp_alone with a benefit of +1 pp not clearly positive
    and mlp_only 30 pp below random. Its T is far past every fail boundary, but its benefit is not established,
    so its own test continues; C4 read it as failing for a family of m = 3, 6 and 30 (fails_at skipped the gate)."""
    from linvit.claims.judge import _c4
    from linvit.claims.table import Design
    from linvit.claims.verdicts import CellVerdict, ClaimVerdict, TestOutcome

    config = {**base_config(), "variants": ["elu", "hedgehog"], "sequential": {"looks": [5, 10, 15, 20, 30]}}
    design = Design.from_config(config)
    r = seq.sequential_test([c2_share(None, -0.30)], *C2_SHARE, 0.5, ">=", design.plan, 0.025, 0.0125)
    look = r.looks[0]
    assert r.outcome == seq.CONTINUES and look.statistic < -10 * look.fail_bound
    assert "not established" in look.note and look.low == -math.inf
    looks = [x.as_dict() for x in r.looks]
    for m in (3, 6, 30):
        assert not seq.fails_at(looks, 0.025 / (2 * m), design.plan)
        assert not seq.fails_at(looks, 0.025 / (2 * m), design.plan, (0.5, ">="))
    # Zero variance is no test: nothing to cross, whatever the alpha.
    same = seq.sequential_test([sample(np.full((2, 5), 0.8))], {"a": 1, "b": -1}, None, 0.1, ">=", design.plan,
                               0.025, 0.025)
    assert not seq.fails_at([x.as_dict() for x in same.looks], 0.025 / 6, design.plan)

    continuing = TestOutcome("mlp_alone", r.outcome, threshold=0.5, side=">=", looks=looks)
    held = TestOutcome("attn_alone", paired.HOLDS, looks=[], stopped=1)

    def cells(name, outcome, tests):
        return [CellVerdict(name, "fmnist_5to9", "micro", v, 200, outcome, tests=tests) for v in ("elu", "hedgehog")]
    verdicts = [ClaimVerdict("C1", "", "", {}, cells("C1", paired.HOLDS, [held])),
                ClaimVerdict("C2", "", "", {}, cells("C2", seq.CONTINUES, [continuing])),
                ClaimVerdict("C3", "", "", {}, cells("C3", paired.HOLDS, [held]))]
    assert [c.outcome for c in _c4(verdicts, config, paired.Settings(), design).cells] == [seq.CONTINUES] * 2


def test_a_share_fails_c4_only_where_its_benefit_is_established_at_c4s_boundary():
    """A share that failed at its own fail side (its benefit established there, t = 8 > 6.04) and whose T (-15.2)
    is past C4's boundary for m = 3 (8.14) still does not fail C4 there: at 8.14 its benefit is not established
    (that side of its repeated interval is unbounded). With its benefit at t = 20 it does. The benefit's t is read
    back from the recorded look (its repeated interval and T) to the precision of the numbers."""
    from linvit.stats.pairing import contrast_moments

    plan = seq.Plan((5, 10, 15, 20, 30))
    for z, fails in ((8.0, [True, False, False]), (20.0, [True, True, True])):
        s = c2_share(z, -0.05)
        r = seq.sequential_test([s], *C2_SHARE, 0.5, ">=", plan, 0.025, 0.0125)
        assert r.outcome == paired.FAILS
        look = r.looks[0].as_dict()
        _, _, means, seed, image = contrast_moments(s, *C2_SHARE)
        assert seq.benefit_t(look, 0.5, ">=") == pytest.approx(means[1] / math.sqrt(seed[1, 1] + image[1, 1]), rel=1e-9)
        c3 = boundaries.t_critical(boundaries.boundaries([look["fraction"]], seq.t_alpha(0.025 / 6, plan), plan)[-1], 4)
        assert look["statistic"] < -c3  # past C4's boundary at m = 3 either way: the benefit decides
        assert [seq.fails_at([look], 0.025 / (2 * m), plan, (0.5, ">=")) for m in (1, 3, 30)] == fails


def test_a_grid_without_a_plan_is_refused():
    out = run(["linvit", "decide", "--configfile", str(REPO / "workflow/config/default.yaml")], cwd=REPO,
              check=False)
    assert out.returncode != 0 and "no `sequential:` plan" in out.stderr


def test_a_test_whose_images_dominate_reads_every_look():
    """Seeds nearly identical, the test images' part nearly all the variance: look 1's fraction is near 1. Each
    look keeps room below 1 for the looks after it, so fractions stay increasing and every look is read (two
    looks clamped at the same 0.999 divided by zero in the boundary recursion)."""
    rng = np.random.default_rng(55)
    plan = seq.Plan((5, 10, 15, 20, 30), futility=None)
    images = 400
    item = rng.standard_normal(images)
    item -= item.mean()  # at the threshold: the test continues
    a = 1e-4 * rng.standard_normal((30, 1)) + item[None, :]
    s = pairing.Sample({"a": a, "b": np.zeros((30, images))}, list(range(30)), images, pairing.SEEDS_AND_IMAGES)
    result = seq.sequential_test([seq.look_sample(s, list(range(n))) for n in plan.looks], {"a": 1, "b": -1}, None,
                                 0.0, ">=", plan, 0.025, 0.025)
    fractions = [look.fraction for look in result.looks]
    assert len(fractions) == 5 and fractions[0] > 0.99 and fractions[-1] == 1.0
    assert all(b > a for a, b in zip(fractions, fractions[1:])), fractions
