"""The verdicts' statistics (linvit.report.stats): synthetic per-image results whose right verdict is
known, the pairing rules, the fallbacks without predictions, determinism; the predictions file the
student step writes; and the recipe's cost."""

from __future__ import annotations

import json
import math
import time

import numpy as np
import pandas as pd
import pytest
from test_report import CONFIG, STEPS, accuracy, write_cell

from linvit.data.loader import read_manifest
from linvit.data.shards import MANIFEST
from linvit.grid import Cell, all_cells
from linvit.predictions import PREDICTIONS, Predictions, read_predictions, split_digest, write_predictions
from linvit.report import collect, evaluate_claims
from linvit.report import stats
from linvit.report.claims import claims_markdown, recipe_cost
from linvit.report.stats import FAILS, HOLDS, INCONCLUSIVE, PairingError, Settings

TOLERANCE = -0.005  # C3's threshold: difference >= -match_tolerance


def runs_of(accs: dict[str, float], seeds=(0, 1, 2), images=2000, digest="split", rng_seed=0) -> dict:
    """Per role, one run per seed whose images are each right with probability acc (a fixed label set)."""
    rng = np.random.default_rng(rng_seed)
    label = np.arange(images) % 10
    out = {}
    for role, acc in accs.items():
        out[role] = []
        for seed in seeds:
            right = rng.random(images) < acc
            out[role].append(stats.Run(seed, float(right.mean()),
                                       Predictions(np.where(right, label, (label + 1) % 10), label, digest)))
    return out


def c3(runs: dict, settings: Settings = Settings()) -> tuple[str, stats.Interval, stats.Sample]:
    sample = stats.pair(runs)
    interval = stats.bootstrap(sample, {"d": stats.difference("recipe", "reference")}, settings)["d"]
    return stats.decide(interval, TOLERANCE, ">="), interval, sample


def test_a_large_difference_holds_a_clear_opposite_fails_a_tiny_one_is_inconclusive():
    outcome, interval, sample = c3(runs_of({"recipe": 0.90, "reference": 0.80}))
    assert outcome == HOLDS and 0.08 < interval.estimate < 0.12 and interval.low > TOLERANCE
    assert sample.mode == stats.SEEDS_AND_IMAGES and sample.images == 2000 and sample.seeds == [0, 1, 2]
    outcome, interval, _ = c3(runs_of({"recipe": 0.70, "reference": 0.80}))
    assert outcome == FAILS and interval.high < TOLERANCE
    # 0.3 points apart on 200 images: one image is 0.5 points, the interval spans the threshold.
    outcome, interval, _ = c3(runs_of({"recipe": 0.797, "reference": 0.80}, images=200))
    assert outcome == INCONCLUSIVE and interval.low < TOLERANCE < interval.high


def test_intervals_shrink_with_more_images_and_are_reproducible():
    widths = []
    for images in (500, 2000, 8000):
        _, interval, _ = c3(runs_of({"recipe": 0.82, "reference": 0.80}, images=images))
        widths.append(interval.high - interval.low)
    assert widths[0] > widths[1] > widths[2]
    runs = runs_of({"recipe": 0.82, "reference": 0.80})
    assert c3(runs)[1] == c3(runs)[1]  # same config seed, same interval
    assert c3(runs, Settings(seed=1))[1] != c3(runs)[1]
    wider = c3(runs, Settings(level=0.99))[1]
    assert wider.low < c3(runs)[1].low and wider.high > c3(runs)[1].high


def test_every_role_gets_the_same_draw():
    # Identical runs for two roles: each replicate's difference is exactly 0, so the interval is [0, 0];
    # independent draws per role would spread it.
    runs = runs_of({"a": 0.8})
    runs["b"] = [stats.Run(r.seed, r.acc, r.predictions) for r in runs["a"]]
    sample = stats.pair(runs)
    interval = stats.bootstrap(sample, {"d": stats.difference("a", "b")}, Settings())["d"]
    assert (interval.low, interval.high) == (0.0, 0.0)


def test_one_seed_is_the_image_bootstrap_alone():
    outcome, interval, sample = c3(runs_of({"recipe": 0.90, "reference": 0.80}, seeds=(0,)))
    assert sample.mode == stats.IMAGES_ONLY and outcome == HOLDS and interval.bounded
    assert sample.describe() == "1 seed (0) x 2000 test images; test images only (one seed)"


def test_without_predictions_seeds_alone_else_no_interval():
    with_images = runs_of({"recipe": 0.85, "reference": 0.80})
    bare = {role: [stats.Run(r.seed, r.acc) for r in rs] for role, rs in with_images.items()}
    outcome, interval, sample = c3(bare)
    assert sample.mode == stats.SEEDS_ONLY and sample.images == 0 and interval.bounded
    accs = [r.acc for r in bare["recipe"]]
    ref = [r.acc for r in bare["reference"]]
    diffs = np.subtract(accs, ref)
    assert diffs.min() - 1e-12 <= interval.low <= interval.high <= diffs.max() + 1e-12
    # One run without predictions makes the whole cell seeds-only (no silent half pairing).
    mixed = {**with_images, "reference": [stats.Run(r.seed, r.acc) for r in with_images["reference"]]}
    assert stats.pair(mixed).mode == stats.SEEDS_ONLY
    one = {role: rs[:1] for role, rs in bare.items()}
    outcome, interval, sample = c3(one)
    assert sample.mode == stats.NO_INTERVAL and outcome == INCONCLUSIVE and not interval.bounded
    assert interval.estimate == pytest.approx(one["recipe"][0].acc - one["reference"][0].acc)


def test_seeds_are_intersected_and_the_missing_ones_named():
    runs = runs_of({"recipe": 0.9, "reference": 0.8})
    runs["recipe"] = runs["recipe"][:2]
    sample = stats.pair(runs)
    assert sample.seeds == [0, 1] and sample.missing == {"recipe": [2]}
    assert sample.describe().endswith("; seed 2 missing for recipe")
    with pytest.raises(PairingError, match="no finished run of reference"):
        stats.pair({"recipe": runs["recipe"], "reference": []})


def test_pairing_refuses_different_test_sets_in_one_line():
    runs = runs_of({"recipe": 0.9, "reference": 0.8}, seeds=(0,))
    other = runs_of({"reference": 0.8}, seeds=(0,), digest="another split")["reference"]
    with pytest.raises(PairingError, match=r"^cannot pair seed 0 with seed 0: different test sets \(split digest") as err:
        stats.pair({"recipe": runs["recipe"], "reference": other})
    assert "\n" not in str(err.value)
    fewer = runs_of({"reference": 0.8}, seeds=(0,), images=1000)["reference"]
    with pytest.raises(PairingError, match="2000 vs 1000 test images"):
        stats.pair({"recipe": runs["recipe"], "reference": fewer})
    p = runs["reference"][0].predictions
    relabelled = [stats.Run(0, 0.8, Predictions(p.pred, (p.label + 1) % 10, p.digest))]
    with pytest.raises(PairingError, match="same test images but different labels"):
        stats.pair({"recipe": runs["recipe"], "reference": relabelled})


def test_shares_and_two_part_claims():
    runs = runs_of({"random": 0.50, "all": 0.80, "attn": 0.52, "mlp": 0.78})
    sample = stats.pair(runs)
    iv = stats.bootstrap(sample, {"strict": stats.share("attn", "random", "all", "random"),
                                  "symmetric": stats.share("all", "mlp", "all", "random")}, Settings())
    assert iv["strict"].estimate == pytest.approx(0.02 / 0.30, abs=0.03)
    parts = [stats.decide(iv[n], 0.25, "<=") for n in ("strict", "symmetric")]
    assert parts == [HOLDS, HOLDS] and stats.combine(parts) == HOLDS
    assert stats.combine([HOLDS, FAILS]) == FAILS and stats.combine([HOLDS, INCONCLUSIVE]) == INCONCLUSIVE
    # No pretrained benefit in the data: shares are unbounded, never a verdict.
    flat = stats.pair(runs_of({"random": 0.5, "all": 0.5, "attn": 0.52}))
    unbounded = stats.bootstrap(flat, {"s": stats.share("attn", "random", "all", "random")}, Settings())["s"]
    assert unbounded.high == math.inf and stats.decide(unbounded, 0.25, "<=") != HOLDS


def test_thousands_of_replicates_over_ten_thousand_images_are_quick():
    runs = runs_of({"random": 0.5, "all": 0.8, "mlp": 0.78, "attn": 0.52}, images=10_000)
    sample = stats.pair(runs)
    start = time.perf_counter()
    stats.bootstrap(sample, {"d": stats.difference("all", "random"),
                             "s": stats.share("attn", "random", "all", "random")}, Settings(replicates=2000))
    # Under a second on an idle core; generous here, the test machine is shared.
    assert time.perf_counter() - start < 10


def test_settings_and_rules_come_from_the_config():
    assert Settings.from_config({}) == Settings(0.95, 2000, 0)
    assert Settings.from_config({"claims": {"level": 0.9, "bootstrap": 500, "seed": 3}}) == Settings(0.9, 500, 3)
    with pytest.raises(ValueError, match=r"^config: 'claims.level' is 95, expected a number between 0 and 1"):
        Settings.from_config({"claims": {"level": 95}})
    with pytest.raises(ValueError, match=r"^config: 'claims.bootstrap' is 10, expected a whole number of at least 100"):
        Settings.from_config({"claims": {"bootstrap": 10}})
    rules = stats.rules_markdown({"claims": {"level": 0.9, "bootstrap": 500, "negligible": 0.2}})
    assert "500 replicates" in rules and "90% percentile interval" in rules and "each <= 20%" in rules
    assert "**inconclusive**" in rules and "**mixed**" in rules


# ----------------------------------------------------------------------------- claims on a results tree


def tree_with_predictions(tmp_path, config: dict, acc) -> None:
    for cell in all_cells(config):
        write_cell(tmp_path, cell, acc(cell), predictions=True)


def test_claims_carry_intervals_from_the_predictions(tmp_path):
    config = {**CONFIG, "targets": ["dsA"], "variants": ["linA", "linB"]}
    tree_with_predictions(tmp_path, config, accuracy)
    runs, _ = collect(config, tmp_path)
    assert runs.loc[runs["status"] == "ok", "predictions"].str.endswith(PREDICTIONS).all()
    verdicts = {v.claim: v for v in evaluate_claims(runs, config)}
    c3 = {c.variant: c for c in verdicts["C3"].cells}
    # linA: the recipe 1 point above the reference on 1000 images (nested right answers) -> holds. linB: 1
    # point below, i.e. 10 images, against a 0.5-point tolerance: the interval straddles it, inconclusive
    # (a mean comparison would have said "does not hold").
    assert c3["linA"].outcome == HOLDS and c3["linA"].low > -0.005 and c3["linA"].estimate == pytest.approx(0.01)
    assert c3["linB"].outcome == INCONCLUSIVE and c3["linB"].low < -0.005 < c3["linB"].high
    assert (c3["linA"].seeds, c3["linA"].images, c3["linA"].method) == (2, 1000, stats.SEEDS_AND_IMAGES)
    assert "difference +1.00 pp [95% CI +" in c3["linA"].text and "2 seeds (0, 1) x 1000 test images" in c3["linA"].text
    assert verdicts["C3"].verdict == "mixed (1 hold, 0 fail, 1 inconclusive)"
    c1 = {c.variant: c for c in verdicts["C1"].cells}
    assert c1["linA"].numbers["strict_fraction_high"] <= 0.25 and c1["linB"].outcome == FAILS
    markdown = claims_markdown(list(verdicts.values()))
    assert "| cell | verdict | statistic | estimate | 95% interval | seeds | test images |" in markdown
    assert f"| `dsA/tiny/linA/steps{STEPS}` | holds | difference | +1.00 pp | [+" in markdown
    payload = json.loads(json.dumps([v.as_dict() for v in verdicts.values()], default=float))
    assert payload[2]["cells"][0]["low"] == pytest.approx(c3["linA"].low)


def test_tiny_differences_on_few_images_are_inconclusive(tmp_path):
    config = {**CONFIG, "targets": ["dsA"], "variants": ["linA"], "seeds": [0],
              "inits": ["random", "copy_mlp_distill"]}
    # 0.2 points below the reference with one seed on 1000 images: within noise of the 0.5-point tolerance.
    tree_with_predictions(tmp_path, config, lambda c: 0.60 if c.init == "random" else
                          0.795 if c.init == "copy_mlp_distill" else 0.80)
    runs, _ = collect(config, tmp_path)
    c3 = evaluate_claims(runs, config)[2]
    assert c3.cells[0].outcome == INCONCLUSIVE and c3.verdict == "inconclusive (1 of 1 cells)"
    assert "test images only (one seed)" in c3.cells[0].text


def test_a_role_only_reported_beside_the_verdict_does_not_take_its_seeds(tmp_path):
    # random (for gap closed) lacks seed 1: C3's difference still pairs both seeds, gap closed uses seed 0.
    config = {**CONFIG, "targets": ["dsA"], "variants": ["linA"], "inits": ["random", "copy_mlp_distill"]}
    for cell in all_cells(config):
        if not (cell.init == "random" and cell.seed == 1):
            write_cell(tmp_path, cell, accuracy(cell), predictions=True)
    runs, _ = collect(config, tmp_path)
    cell = evaluate_claims(runs, config)[2].cells[0]
    assert (cell.seeds, cell.method) == (2, stats.SEEDS_AND_IMAGES) and "2 seeds (0, 1)" in cell.text
    assert cell.numbers["gap_closed"] == pytest.approx((0.80 - 0.49) / (0.79 - 0.49))  # seed 0's runs


def test_runs_on_different_test_sets_are_not_paired(tmp_path):
    config = {**CONFIG, "targets": ["dsA"], "variants": ["linA"], "seeds": [0],
              "inits": ["random", "copy_mlp_distill"]}
    tree_with_predictions(tmp_path, config, accuracy)
    reference = Cell("dsA", "tiny", "softmax", "reference", 0, "none", STEPS).run_dir(tmp_path) / PREDICTIONS
    p = read_predictions(reference)
    write_predictions(reference, p.pred, p.label, "another split")
    runs, _ = collect(config, tmp_path)
    cell = evaluate_claims(runs, config)[2].cells[0]
    assert cell.outcome == "not evaluable" and "runs cannot be paired: cannot pair" in cell.text
    assert "different test sets" in cell.text


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
