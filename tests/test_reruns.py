"""Reruns do not flip: runs of the same grid that differ only by float rounding never move a test or a
claim between holds and fails (tests/fixtures/reruns/README.md says where each run comes from)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from linvit.predictions import Predictions
from linvit.report import evaluate_claims
from linvit.report.stats import FAILS, HOLDS

FIXTURES = Path(__file__).parent / "fixtures" / "reruns"
# Runs of the default grid with per-image predictions, packed by fixtures/reruns/pack.py.
DEFAULT_RUNS = ("default_threads1", "default_threads2")
PAIRS = [("8e058aa", "32f5dc8"), ("32f5dc8", "90a3a45"), ("3af8f66", "89ae269"), ("89ae269", "7bc517a"),
         DEFAULT_RUNS]


def _config() -> dict:
    """Today's default config shaped as the grid those runs were made with."""
    config = yaml.safe_load((Path(__file__).parents[1] / "workflow/config/default.yaml").read_text())
    config.update(targets=["fashion_mnist", "digits"], variants=["elu"], seeds=[0, 1, 2], budgets=[200],
                  inits=["random", "copy_all", "copy_mlp", "attn_only", "mlp_only", "copy_mlp_distill"])
    return config


def _default_config() -> dict:
    """Today's default config, its grid pinned to the one the packed runs were made with."""
    config = yaml.safe_load((Path(__file__).parents[1] / "workflow/config/default.yaml").read_text())
    config.update(targets=["fmnist_5to9"], variants=["elu", "softmax"], seeds=[0, 1, 2, 3, 4], budgets=[200],
                  inits=["random", "copy_all", "copy_attn", "copy_mlp", "attn_only", "mlp_only", "copy_mlp_distill"],
                  control_inits=["random", "copy_all", "copy_mlp", "attn_only"], distills=["proj_mse"])
    return config


def _packed(name: str) -> tuple[pd.DataFrame, dict]:
    """A run packed by fixtures/reruns/pack.py: its runs table and every run's per-image predictions."""
    runs = pd.read_csv(FIXTURES / f"{name}.csv")
    with np.load(FIXTURES / f"{name}.npz", allow_pickle=False) as npz:
        label, digest = npz["label"].astype(np.int64), str(npz["digest"])
        predictions = {}
        for key in npz.files:
            if key in ("label", "digest"):
                continue
            dataset, size, variant, init, design, budget, seed = key.split("|")
            predictions[(dataset, size, variant, init, design, int(budget), int(seed))] = Predictions(
                npz[key].astype(np.int64), label, digest)
    return runs, predictions


def _outcomes(commit: str) -> dict[tuple, str]:
    if commit in DEFAULT_RUNS:
        runs, predictions = _packed(commit)
        verdicts = evaluate_claims(runs, _default_config(), predictions)
    else:
        verdicts = evaluate_claims(pd.read_csv(FIXTURES / f"{commit}.csv"), _config())
    out = {}
    for verdict in verdicts:
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


def test_the_default_grid_pair_is_read_image_by_image_and_differs_by_rounding_only():
    """The packed pair: every ok run has its predictions, the tests pair test images (not seeds
    alone), the accuracies moved by rounding only, and something did move."""
    (a, pa), (b, pb) = _packed(DEFAULT_RUNS[0]), _packed(DEFAULT_RUNS[1])
    assert len(pa) == (a["status"] == "ok").sum() and len(pb) == (b["status"] == "ok").sum()
    # Every elu run and softmax reference is in both (the second run's control was cut short: the
    # control decides nothing).
    deciding = {k for k in pa if k[2] == "elu" or k[3] == "reference"}
    assert len(deciding) == 40 and deciding <= pb.keys()
    verdicts = evaluate_claims(a, _default_config(), pa)
    tested = [t for v in verdicts for c in v.cells for t in c.tests if t.outcome in (HOLDS, FAILS)]
    assert tested and all(t.images == 5000 for t in tested)
    both = a.merge(b, on=["variant", "init", "design", "seed"], suffixes=("_a", "_b"))
    both = both[(both["status_a"] == "ok") & (both["status_b"] == "ok")]
    moved = (both["test_acc_a"] - both["test_acc_b"]).abs()
    assert 0 < moved.max() < 0.05  # 8 of 42 accuracies moved, by at most 0.4 pp
