"""linvit.claims.compare_adastop: both procedures read the same draws, AdaStop runs as its defaults run it
and errs as the comparison says (twice its alpha), and at truth 0 linvit finds a difference at most 5% of
the time (docs/statistics.md, "Beside AdaStop")."""

import itertools
import os
import sys

import numpy as np
import pytest
from scipy import stats as scipy_stats

from linvit.claims import compare_adastop as cmp
from linvit.stats import sequential


def _need_adastop():
    """AdaStop's side: the test extra installs adastop; under CI its absence fails rather than skips."""
    try:
        import adastop  # noqa: F401
    except ImportError:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI must run AdaStop's side, but adastop is not installed ({cmp.ADASTOP}, the test extra)")
        pytest.skip(f"adastop is not installed (pip install -e '.[test]' or {cmp.ADASTOP})")


def test_every_procedure_reads_the_same_draws(monkeypatch):
    """On one path, every procedure under paired and unpaired noise reads prefixes of the same two arrays:
    linvit's looks their paired samples' accuracies, AdaStop its interims' evaluations."""
    _need_adastop()
    from adastop import MultipleAgentsComparator

    read = []  # (procedure, role a's values, role b's values), every look or interim
    real_test = sequential.sequential_test

    def spy_test(samples, *args, **kw):
        result = real_test(samples, *args, **kw)
        for sample in samples[:len(result.looks)]:
            read.append(("linvit", sample.matrices["a"][:, 0].copy(), sample.matrices["b"][:, 0].copy()))
        return result

    real_compare = MultipleAgentsComparator.partial_compare

    def spy_compare(self, eval_values, verbose=True):
        read.append(("adastop", np.array(eval_values["a"]), np.array(eval_values["b"])))
        return real_compare(self, eval_values, verbose)

    monkeypatch.setattr(sequential, "sequential_test", spy_test)
    monkeypatch.setattr(MultipleAgentsComparator, "partial_compare", spy_compare)
    normals = cmp.draw(cmp.SEED, 3)
    for noise, truth in (("paired", 0.02), ("unpaired", 0.0)):
        shared = cmp.NOISE[noise]
        read.clear()
        rows = cmp.run_path(cmp.SEED, 3, truths=[truth], noises={noise: shared})
        assert {r["procedure"] for r in rows} == set(cmp.PROCEDURES)
        a, b = cmp.accuracies(normals, truth, shared)
        assert {who for who, _, _ in read} == {"linvit", "adastop"}
        for who, ra, rb in read:
            assert len(ra) == len(rb) >= cmp.N
            np.testing.assert_array_equal(ra, a[:len(ra)], err_msg=who)
            np.testing.assert_array_equal(rb, b[:len(rb)], err_msg=who)
    # The draws are the truth plus shared normals: b never moves with the truth, a moves by it exactly.
    a0, b0 = cmp.accuracies(normals, 0.0, 0.5)
    a1, b1 = cmp.accuracies(normals, 0.01, 0.5)
    np.testing.assert_array_equal(b0, b1)
    np.testing.assert_allclose(a1 - a0, 0.01)
    # Paired noise: a seed's roles share half their variance; unpaired: none. The difference's SD shows it.
    many = np.concatenate([cmp.draw(cmp.SEED, p) for p in range(300)], axis=1)
    for shared, sd in ((0.5, cmp.SD), (0.0, cmp.SD * np.sqrt(2))):
        a, b = cmp.accuracies(many, 0.0, shared)
        assert abs(np.std(a - b) / sd - 1) < 0.05
        assert abs(np.std(a) / cmp.SD - 1) < 0.05


def test_the_quick_comparator_decides_as_adastop_s_own():
    """`_Comparisons` only speeds AdaStop's string keys: decisions, boundaries and seeds equal its default
    comparisons=None on the same evaluations and permutation seed."""
    _need_adastop()
    normals = cmp.draw(cmp.SEED, 0)
    for truth in (0.0, 0.02):
        a, b = cmp.accuracies(normals, truth, 0.0)
        runs = []
        for fast in (True, False):
            comparator = cmp.adastop_comparator(7, fast=fast)
            for k in range(cmp.K):
                comparator.partial_compare({"a": a[:cmp.N * (k + 1)], "b": b[:cmp.N * (k + 1)]}, verbose=False)
                if comparator.is_finished:
                    break
            runs.append((dict(comparator.decisions), dict(comparator.n_iters), comparator.boundary))
        assert runs[0] == runs[1]


def _at_most(errors: int, paths: int, alpha: float = cmp.ALPHA) -> bool:
    """Consistent with a rate <= alpha: a one-sided binomial test at 1%."""
    return scipy_stats.binom.sf(errors - 1, paths, alpha) > 0.01


def test_at_truth_zero_linvit_finds_a_difference_at_most_its_alpha():
    """linvit's side alone (quick): 400 paths under each noise at truth 0, every procedure's rate of any
    decision consistent with 5% (a one-sided binomial test at 1%); a side spending 5% each (10% in all)
    fails it with this seed."""
    rows = cmp.summary(cmp.simulate(400, seed=1, truths=(0.0,), adastop=False))
    assert set(rows["procedure"]) == set(cmp.PROCEDURES) - {cmp.adastop_name(a) for a in cmp.ADASTOP_ALPHAS}
    for r in rows.itertuples():
        assert r.paths == 400 and _at_most(round(r.decided * 400), 400), r
        assert r.mean_seeds < cmp.LOOKS[-1]  # futility or a boundary stopped some paths early


def test_adastop_errs_twice_its_alpha_with_two_agents():
    """Exactly, with one interim of 5 seeds each (its permutations all enumerated): over the 252 ways to split
    one pooled sample of 10 between the agents (equally likely under no difference), AdaStop 0.1.3 decides on
    24 (9.5%) at alpha 0.05 and on 12 (4.8%) at 0.025: its boundary cuts one tail of the signed permutation
    values, its statistic is the absolute difference. So the comparison runs it at 0.025 beside 0.05."""
    _need_adastop()
    pooled = np.random.default_rng(3).standard_normal(10)
    for alpha, decided in ((0.05, 24), (0.025, 12)):
        count = 0
        for first in itertools.combinations(range(10), 5):
            mask = np.zeros(10, dtype=bool)
            mask[list(first)] = True
            comparator = cmp.adastop_comparator(0, alpha, k=1)
            comparator.partial_compare({"a": pooled[mask], "b": pooled[~mask]}, verbose=False)
            count += comparator.decisions["[0 1]"] != "equal"
        assert count == decided, (alpha, count)


def test_at_a_large_difference_every_procedure_finds_it_early_and_the_right_way():
    """At 5 pp (1.8 of the unpaired difference's SDs per seed) every procedure decides a > b on most of 40
    paths, never a < b, on fewer seeds than the cap: the decisions' directions are read the right way."""
    _need_adastop()
    rows = cmp.summary(cmp.simulate(40, seed=2, truths=(0.05,), noises={"unpaired": 0.0}))
    assert set(rows["procedure"]) == set(cmp.PROCEDURES)
    for r in rows.itertuples():
        assert r.larger >= 0.9 and r.smaller == 0 and r.mean_seeds < 20, r


def test_without_adastop_the_script_stops_in_one_line(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "adastop", None)  # import adastop raises ImportError
    with pytest.raises(SystemExit) as stop:
        cmp.main(["--paths", "1"])
    message = str(stop.value)
    assert message.startswith("compare_adastop: needs the adastop package") and "\n" not in message
    assert cmp.ADASTOP in message
    assert capsys.readouterr().out == ""
