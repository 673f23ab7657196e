"""Per-image predictions (the student step writes them; collect refuses one that disagrees with its
metrics; ranks gather them in order) and the recipe's cost."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from test_report import CONFIG, STEPS, write_cell

from linvit.data.loader import read_manifest
from linvit.data.shards import MANIFEST
from linvit.grid import Cell
from linvit.predictions import PREDICTIONS, read_predictions, split_digest, write_predictions
from linvit.report import collect
from linvit.report.tables import recipe_cost


def test_a_predictions_file_that_disagrees_with_the_metrics_makes_the_run_invalid(tmp_path):
    config = {**CONFIG, "targets": ["dsA"], "variants": ["linA"], "inits": ["random"], "seeds": [0]}
    cell = Cell("dsA", "tiny", "linA", "random", 0, "none", STEPS)
    write_cell(tmp_path, cell, 0.5, predictions=True)
    path = cell.run_dir(tmp_path) / PREDICTIONS
    label = np.arange(1000) % 4
    write_predictions(path, label, label, "test-split")  # every image right: accuracy 1.0, not 0.5
    row = collect(config, tmp_path)[0].set_index("init").loc["random"]
    assert row["status"] == "invalid"
    assert row["reason"] == f"{path}: predictions give accuracy 1.000000 but metrics.json's 'test_acc' is 0.500000"
    path.write_bytes(b"not a zip")
    row = collect(config, tmp_path)[0].set_index("init").loc["random"]
    assert row["status"] == "invalid" and row["reason"].startswith(f"{path}: cannot be read")


# ----------------------------------------------------------------------------- the student step


def test_the_student_step_writes_every_test_images_prediction(shards, tmp_path, quiet_machine):
    from linvit.steps import run_student, run_teacher

    config = {"datasets": {"synthetic": {"source": "synthetic", "num_classes": 4}},
              "teacher": {"dataset": "synthetic", "train": {"steps": 2, "batch_size": 16, "lr": 1e-3}},
              "student": {"train": {"steps": 2, "batch_size": 16, "lr": 1e-3}},
              "init_strategies": {"copy_mlp": {"copy": ["embed", "mlp", "norm", "head"], "distill": False}}}
    run_teacher(config, "micro", 0, shards, tmp_path / "teacher")
    metrics = run_student(config, "synthetic", "micro", "elu", "copy_mlp", 0, tmp_path / "teacher", shards,
                          tmp_path / "student")
    p = read_predictions(tmp_path / "student" / PREDICTIONS)
    assert p.samples == metrics["test_samples"] == 32
    assert p.correct.mean() == pytest.approx(metrics["test_acc"])
    assert p.digest == split_digest(read_manifest(shards / MANIFEST))
    assert set(p.label) <= set(range(4))


def test_predictions_gathered_over_ranks_are_the_split_in_order(shards):
    # Under torchrun each rank evaluates its share of every batch (linvit.data.loader); the gathered
    # labels must be the one-process labels, image for image, with batches that do not split evenly.
    from linvit.data.loader import ShardSet
    from linvit.evaluate import _gathered

    class Rank:  # a world of 2 whose sum adds what both ranks contribute
        size = 2

        def __init__(self, rank, shares):
            self.rank, self.shares = rank, shares

        def sum(self, *values):
            self.shares.append(np.asarray(values))
            return tuple(np.sum(self.shares, axis=0)) if len(self.shares) == 2 else values

    data = ShardSet(shards)
    whole = np.concatenate([y.numpy() for _, y in data.batches("test", 7)])
    shares = []
    parts = [[y.numpy() for _, y in data.batches("test", 7, rank=r, ranks=2)] for r in (0, 1)]
    _gathered(parts[0], len(whole), 7, Rank(0, shares))
    gathered = _gathered(parts[1], len(whole), 7, Rank(1, shares))
    assert len(whole) == 32 and np.array_equal(gathered, whole)


# ----------------------------------------------------------------------------- the recipe's cost


def cost_inputs(recipe_curve, random_curve, reference=0.80, distill_steps=50):
    """runs and curves of one cell and seed: the recipe, random and the reference."""
    ids = {"dataset": "dsA", "size": "tiny", "variant": "linA", "budget": STEPS, "seed": 0, "status": "ok"}
    runs = pd.DataFrame([
        {**ids, "init": "copy_mlp_distill", "design": "proj_mse", "test_acc": recipe_curve[-1][1],
         "distill_steps": distill_steps},
        {**ids, "init": "random", "design": "none", "test_acc": random_curve[-1][1], "distill_steps": 0},
        {**ids, "variant": "softmax", "init": "reference", "design": "none", "test_acc": reference, "distill_steps": 0},
    ])
    curves = pd.DataFrame(
        [{**ids, "init": "copy_mlp_distill", "design": "proj_mse", "step": s, "test_acc": a} for s, a in recipe_curve]
        + [{**ids, "init": "random", "design": "none", "step": s, "test_acc": a} for s, a in random_curve])
    return runs, curves.drop(columns="status")


def test_recipe_cost_counts_distillation_and_compares_with_random():
    config = {**CONFIG, "targets": ["dsA"], "variants": ["linA"], "seeds": [0]}
    runs, curves = cost_inputs([(0, 0.3), (20, 0.795), (40, 0.81), (100, 0.82)],
                               [(0, 0.1), (50, 0.4), (80, 0.55), (100, 0.55)])
    row = recipe_cost(runs, curves, config).iloc[0]
    # Within 1 point of 0.80 first at step 20, plus 50 distillation steps; random reaches its 0.55 at 80.
    assert (row["recipe_steps_mean"], row["recipe_student_steps_mean"], row["random_steps_mean"]) == (70, 20, 80)
    assert row["speedup_mean"] == pytest.approx(80 / 70) and row["seeds_reaching"] == 1 and row["reason"] == ""
    strict = recipe_cost(runs, curves, {**config, "claims": {"recipe_tolerance": 0.0}}).iloc[0]
    assert strict["recipe_student_steps_mean"] == 40
    per_seed = recipe_cost(runs, curves, config, per_seed=True)
    assert list(per_seed["seed"]) == [0] and per_seed["recipe_steps"].iloc[0] == 70


def test_recipe_cost_says_when_the_recipe_never_gets_close():
    config = {**CONFIG, "targets": ["dsA"], "variants": ["linA"], "seeds": [0]}
    runs, curves = cost_inputs([(0, 0.3), (100, 0.70)], [(0, 0.1), (100, 0.5)])
    row = recipe_cost(runs, curves, config).iloc[0]
    assert math.isnan(row["recipe_steps_mean"]) and row["seeds_reaching"] == 0
    assert row["reason"] == "seed 0: the recipe never comes within 1.00 pp of the reference (best 70.00%, target 79.00%)"
