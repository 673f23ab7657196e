"""The verdicts are calibrated: on simulated grids whose truth is known (linvit.claims.calibration), with
a teacher effect on every role that comes from the teacher and the truth taken over teachers, at 3, 5
and 10 seeds with 2,000 experiments each, a teacher per seed (the default) gives 95% intervals that
cover the truth at least 93% of the time and verdicts wrong at most 2.5% of the time; one teacher for
every seed undercovers that truth, the more so the more seeds, while covering its own teacher's; and
the packaged table the report prints is the one the code makes. One regeneration of both designs
(about 40 s on 2 cores) serves every check."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats as sps

from linvit.claims.calibration import (COVERAGE_CSV, EXPERIMENTS, SCENARIOS, SEEDS, TEACHER_DESIGNS, TEACHER_ROLES,
                                       TEACHER_SD, coverage_markdown, coverage_table, simulate_sample)
from linvit.claims.table import CLAIMS, REFERENCE
from linvit.stats import paired

ALPHA = paired.Settings().alpha


@pytest.fixture(scope="module")
def full() -> pd.DataFrame:
    return coverage_table()


@pytest.fixture(scope="module")
def table(full) -> pd.DataFrame:
    """The default design's rows: a teacher per seed, what the verdicts are calibrated for."""
    return full[full["teachers"] == "per_seed"].reset_index(drop=True)


def test_the_intervals_hold_their_level(full, table):
    assert set(table["seeds"]) == set(SEEDS) == {3, 5, 10} and list(dict.fromkeys(full["teachers"])) == [
        "per_seed", "one"] == list(TEACHER_DESIGNS)
    assert EXPERIMENTS == 2000 and (full["experiments"] == EXPERIMENTS).all()
    assert (full["teacher_sd"] == TEACHER_SD).all() and TEACHER_SD == pytest.approx(0.0225)
    covered = table.dropna(subset=["coverage"])
    assert len(covered) == len(SCENARIOS) * len(SEEDS) * sum(len(c.tests) for c in CLAIMS)
    low = covered[covered["coverage"] < 0.93]
    assert low.empty, low.to_string()


def test_one_teacher_for_every_seed_undercovers_the_truth_over_teachers(full):
    """One teacher: its effect does not average out over seeds, so the intervals (which shrink with seeds)
    miss the mean over teachers more often the more seeds there are; most where the seed noise is small
    beside the teacher effect (fmnist's C3 contrast, where the effect was measured). Of that teacher's
    own truth the same intervals hold their level: the verdicts are right about the teacher they used."""
    one = full[full["teachers"] == "one"].dropna(subset=["coverage"])
    lowest = one.groupby("seeds")["coverage"].min()
    assert lowest[10] < 0.80 and lowest[3] > lowest[5] > lowest[10], lowest
    assert (one.groupby("seeds")["coverage"].mean().diff().dropna() < 0).all()
    matches = one[(one["scenario"] == "fmnist") & (one["statistic"] == "matches")].set_index("seeds")["coverage"]
    assert matches[3] > matches[5] > matches[10] and matches[10] < 0.75, matches
    given = one[one["coverage_given_teacher"] < 0.93]
    assert given.empty, given.to_string()
    # Under a teacher per seed the same statistic keeps its level at every seed count.
    per_seed = full[(full["teachers"] == "per_seed") & (full["scenario"] == "fmnist")
                    & (full["statistic"] == "matches")]
    assert (per_seed["coverage"] >= 0.93).all() and per_seed["coverage_given_teacher"].isna().all()


def test_the_boundary_scenarios_sit_at_and_just_beside_the_thresholds(table):
    deciding = {t.statistic.name for c in CLAIMS for t in c.deciding}
    rows = table[table["statistic"].isin(deciding)]
    at, beside = rows[rows["scenario"] == "at"], rows[rows["scenario"] == "beside"]
    assert np.allclose(at["truth"], at["threshold"], atol=1e-12)
    # Just on the side where the claim is false: a wrong verdict there is a "holds".
    gap = np.where(beside["side"] == "<=", 1, -1) * (beside["truth"] - beside["threshold"])
    assert ((gap > 0) & (gap < beside["median_mde"] / 2)).all()


def near_threshold(table: pd.DataFrame) -> pd.Series:
    """Rows where a test at alpha is wrong up to alpha of the time by construction: the truth closer to
    its threshold than half the minimum detectable effect (exactly at it: scenario `at`); a claim's
    combined row when one of its deciding tests is."""
    near = (table["truth"] - table["threshold"]).abs() < table["median_mde"] / 2
    parts = {c.name: [t.statistic.name for t in c.deciding] for c in CLAIMS}
    for i, row in table[table["statistic"].isin(list(parts))].iterrows():
        same = table[(table["scenario"] == row["scenario"]) & (table["seeds"] == row["seeds"])]
        near[i] = bool(near[same.index[same["statistic"].isin(parts[row["statistic"]])]].any())
    return near


def test_verdicts_are_wrong_at_most_as_often_as_they_claim(table):
    judged = table.dropna(subset=["wrong"])
    near = near_threshold(judged)
    # Away from the threshold: at most 2.5%, row by row.
    away = judged[~near]
    assert len(away) > 40 and (away["wrong"] <= ALPHA).all(), away[away["wrong"] > ALPHA].to_string()
    # Near it the wrong-verdict rate of an exact test tends to 2.5% (the level itself, exactly at the
    # threshold), and 2,000 experiments measure a rate of 2.5% to +-0.35%: a calibrated engine shows a
    # rate above 2.5% in about half of those rows. So each must be consistent with a true rate <= 2.5%
    # (one-sided binomial test at 1%), and all of them pooled (tens of thousands of experiments, +-0.1%)
    # too, which an engine wrong even 2.8% of the time at the threshold would fail.
    close = judged[near]
    assert len(close) >= 3 * 12, close.to_string()
    counts = (close["wrong"] * EXPERIMENTS).round().astype(int)
    for (_, row), k in zip(close.iterrows(), counts):
        assert sps.binomtest(k, EXPERIMENTS, ALPHA, alternative="greater").pvalue > 0.01, row.to_dict()
    exact = (close["truth"] - close["threshold"]).abs().lt(1e-9) | close["truth"].isna()  # or C1, C2
    at = (close["scenario"] == "at") & exact
    assert at.sum() == 3 * (5 + 2)
    pooled = sps.binomtest(int(counts[at].sum()), EXPERIMENTS * int(at.sum()), ALPHA, alternative="greater")
    assert pooled.pvalue > 0.01, counts[at].sum() / (EXPERIMENTS * at.sum())


def test_the_packaged_table_is_the_one_the_code_makes(full):
    table = full
    packaged = pd.read_csv(COVERAGE_CSV)
    assert list(packaged.columns) == list(table.columns)
    assert len(packaged) == len(table)
    for column in table.columns:
        if table[column].dtype.kind in "fi":
            # Rates are counts of 2,000: 6 experiments of slack for a BLAS that rounds an edge case the
            # other way on another CPU; the MDEs to 1%.
            tol = 0.0031 if column in ("coverage", "wrong", "decided", "coverage_given_teacher") else 0.0
            assert all(math.isclose(a, b, rel_tol=1e-2, abs_tol=tol) or (math.isnan(a) and math.isnan(b))
                       for a, b in zip(packaged[column], table[column])), column
        else:
            assert list(packaged[column].fillna("")) == list(table[column].fillna("")), column
    text = coverage_markdown()
    assert text.startswith("2,000 simulated experiments") and "| attn_alone | fmnist (5000) | +0.331 |" in text
    assert "SD 2.25 pp (`TEACHER_SD`, measured in issue 41" in text
    assert "**A teacher per seed (`teacher.seed: per_seed`, the default).** 3 seeds: lowest coverage" in text
    assert "**One teacher for every seed" in text and "| given the teacher 3 seeds |" in text
    # The rows are the code's (the summaries may differ within the tolerance above).
    rows = lambda t: [line for line in t.splitlines() if line.startswith("|")]
    assert rows(coverage_markdown(table)) == rows(text)
    # One design alone: what a report of that design shows.
    assert "One teacher" not in coverage_markdown(designs=("per_seed",))
    # docs/statistics.md shows the packaged table (paste `python -m linvit.claims.calibration`'s output).
    assert text in (Path(__file__).parents[1] / "docs" / "statistics.md").read_text()


def test_the_simulation_has_the_truth_it_says():
    rng = np.random.default_rng(0)
    roles = SCENARIOS["digits"].roles
    sample = simulate_sample(rng, "digits", 200, images=4000)
    assert sample.images == 4000 and sample.seeds == list(range(200)) and set(sample.matrices) == set(roles)
    for role, (mu, sd) in roles.items():
        per_seed = sample.matrices[role].mean(axis=1)
        # A teacher per seed: a teacher-derived role's seeds vary by the teacher's effect too.
        teacher = TEACHER_SD / math.sqrt(2) if role in TEACHER_ROLES else 0.0
        assert per_seed.mean() == pytest.approx(mu, abs=3 * math.hypot(sd, teacher) / math.sqrt(200) + 0.015)
        assert per_seed.std() == pytest.approx(math.hypot(sd, teacher, math.sqrt(mu * (1 - mu) * 0.4 / 4000)),
                                               rel=0.25)
    # Every role but random comes from the teacher (the reference is the teacher fine-tuned).
    assert TEACHER_ROLES == set(roles) - {"random"} and REFERENCE in TEACHER_ROLES
    # The roles agree on most images (a shared difficulty), as trained models do.
    a, b = sample.matrices["copy_all"][0], sample.matrices["copy_mlp"][0]
    assert np.corrcoef(a, b)[0, 1] > 0.3


def test_the_teacher_effect_is_per_teacher_and_role():
    """With no seed noise and a large teacher effect: under a teacher per seed a teacher-derived role's
    seeds differ by SD teacher_sd / sqrt 2 (a difference of two such roles: teacher_sd) and random's do not;
    under one teacher every seed has the same, so the role's mean sits off the truth by that one draw."""
    from linvit.claims.calibration import Scenario

    still = Scenario(20000, {"random": (0.5, 0.0), "copy_all": (0.7, 0.0), REFERENCE: (0.8, 0.0)})
    sd = 0.04
    per_seed = simulate_sample(np.random.default_rng(1), still, 60, teacher_sd=sd)
    spread = {r: m.mean(axis=1).std(ddof=1) for r, m in per_seed.matrices.items()}
    assert spread["random"] < 0.005 and spread["copy_all"] == pytest.approx(sd / math.sqrt(2), rel=0.3)
    gap = (per_seed.matrices["copy_all"] - per_seed.matrices[REFERENCE]).mean(axis=1)
    assert gap.std(ddof=1) == pytest.approx(sd, rel=0.3)  # independent draws: the difference has teacher_sd
    one = simulate_sample(np.random.default_rng(1), still, 60, teachers="one", teacher_sd=sd)
    means = {r: m.mean(axis=1) for r, m in one.matrices.items()}
    assert all(m.std(ddof=1) < 0.005 for m in means.values())
    # The same draws: the one teacher is seed 0's of the per-seed experiment.
    assert all(np.array_equal(one.matrices[r][0], per_seed.matrices[r][0]) for r in still.roles)
    with pytest.raises(ValueError, match="teachers must be one of per_seed, one"):
        simulate_sample(np.random.default_rng(1), still, 3, teachers="checkpoint")
