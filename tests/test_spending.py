"""A spending function is one registered entry (linvit.stats.spending; docs/architecture.md, "Adding a spending
function"): a toy one, registered here and removed after, is accepted by the config's validation, spent by a
plan and its boundaries, read by a sequential test, and named by its label wherever the report and the
calibration tables name a plan's spending."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import yaml

from conftest import REPO
from linvit.claims.calibration_sequential import t_conversion_markdown
from linvit.config import ConfigError, validate
from linvit.report.claims_text import rules_markdown
from linvit.report.decisions import evaluate, markdown
from linvit.stats import pairing, sequential
from linvit.stats.boundaries import boundaries
from linvit.stats.spending import SPENDING, register_spending, spending_label

TOY = "linear_toy"


@pytest.fixture
def toy():
    """`linear_toy`: alpha spent in proportion to t, registered for the test and removed after it (with the
    plan caches that read it by name)."""
    @register_spending(TOY, label="{name} (a toy, linear in t)")
    def _linear(alpha: float, t: float, gamma: float) -> float:
        return alpha * min(max(t, 0.0), 1.0)

    yield _linear
    del SPENDING[TOY]
    sequential._t_alpha.cache_clear()


def config(spending: str) -> dict:
    base = yaml.safe_load((REPO / "workflow/config/default.yaml").read_text())
    return {**base, "sequential": {"looks": [5, 10, 20], "spending": spending}}


def test_the_config_accepts_exactly_the_registered_names(toy):
    validate(config(TOY))
    for name in SPENDING:
        validate(config(name))
    with pytest.raises(ConfigError, match="sequential.spending") as err:
        validate(config("cubic_toy"))
    assert "\n" not in str(err.value) and all(name in str(err.value) for name in SPENDING)


def test_an_unregistered_name_is_refused_once_removed():
    with pytest.raises(ConfigError, match=f"config key sequential.spending: '{TOY}'"):
        validate(config(TOY))


def test_a_plan_spends_by_it_and_a_sequential_test_reads_it(toy):
    plan = sequential.Plan.from_config(config(TOY))
    assert plan.spending == TOY and plan.spent(0.025, 0.5) == pytest.approx(0.0125) and plan.spent(0.025, 1.0) == 0.025
    z = boundaries([0.25, 0.5, 1.0], 0.025, plan)
    assert z[0] > z[1] > z[2] > 1.96  # spent a quarter at a time: every look stricter than a fixed test's
    rng = np.random.default_rng(0)
    values = 0.05 + 0.01 * rng.standard_normal((20, 1))  # far above 0: holds at look 1
    full = pairing.Sample({"a": values, "b": np.zeros_like(values)}, list(range(20)), 0, pairing.SEEDS_ONLY)
    samples = [sequential.look_sample(full, list(range(n))) for n in plan.looks]
    result = sequential.sequential_test(samples, {"a": 1.0, "b": -1.0}, None, 0.0, ">=", plan, 0.025, 0.025)
    assert result.outcome == "holds" and result.stopped == 1


def test_its_label_is_what_the_report_and_the_tables_say(toy, tmp_path):
    label = "`linear_toy` (a toy, linear in t)"
    assert spending_label(TOY, 0.0, "`") == label
    cfg = config(TOY)
    assert f"spend the test's error across its looks by {label} over the information fraction" in rules_markdown(cfg)
    decisions = evaluate(cfg, [], None, tmp_path)
    assert f"error spent across its looks by {label} over the information fraction" in markdown(decisions)
    table = t_conversion_markdown(pd.DataFrame([{
        "looks": "5/10/20", "spending": TOY, "gamma": 0.0, "alpha": 0.025, "plain": 0.026, "corrected": 0.024,
        "t_alpha": 0.023}]))
    assert "| 5, 10, 20 | linear_toy (a toy, linear in t) | 2.50% |" in table
    # The shipped ones keep their words: Hwang-Shih-DeCani names its gamma, the others their name alone.
    assert spending_label("hwang_shih_decani", 0.0, "`") == "`hwang_shih_decani` (gamma 0)"
    assert spending_label("pocock", 0.0) == "pocock"
