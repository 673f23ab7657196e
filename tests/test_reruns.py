"""Reruns do not flip: runs of the same grid that differ only by float rounding never move a test or a
claim between holds and fails (tests/fixtures/reruns/README.md says where each run comes from)."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
import yaml

from linvit.report import evaluate_claims
from linvit.report.stats import FAILS, HOLDS

FIXTURES = Path(__file__).parent / "fixtures" / "reruns"
PAIRS = [("8e058aa", "32f5dc8"), ("32f5dc8", "90a3a45"), ("3af8f66", "89ae269"), ("89ae269", "7bc517a")]


def _config() -> dict:
    """Today's default config shaped as the grid those runs were made with."""
    config = yaml.safe_load((Path(__file__).parents[1] / "workflow/config/default.yaml").read_text())
    config.update(targets=["fashion_mnist", "digits"], variants=["elu"], seeds=[0, 1, 2], budgets=[200],
                  inits=["random", "copy_all", "copy_mlp", "attn_only", "mlp_only", "copy_mlp_distill"])
    return config


def _outcomes(commit: str) -> dict[tuple, str]:
    runs = pd.read_csv(FIXTURES / f"{commit}.csv")
    out = {}
    for verdict in evaluate_claims(runs, _config()):
        for cell in verdict.cells:
            out[(verdict.claim, cell.key)] = cell.outcome
            out.update({(verdict.claim, cell.key, t.name): t.outcome for t in cell.tests})
    return out


@pytest.mark.parametrize("before,after", PAIRS)
def test_no_verdict_moves_between_holds_and_fails(before, after):
    a, b = _outcomes(before), _outcomes(after)
    assert a.keys() == b.keys()
    flipped = {k: (a[k], b[k]) for k in a if {a[k], b[k]} == {HOLDS, FAILS}}
    assert not flipped, f"{before} -> {after}: {flipped}"
    # The fixtures decide something: a test that judged nothing could not flip.
    assert any(o in (HOLDS, FAILS) for o in a.values())
