"""Every registered operator runs the whole student path: distillation (both losses), training, evaluation."""

import pytest

from linvit.attention import available_variants
from linvit.steps import run_distill, run_evaluate, run_shards, run_student, run_teacher

CONFIG = {
    "seeds": [0], "sizes": ["micro"], "variants": available_variants(), "targets": ["synthetic"],
    "inits": ["copy_mlp_distill"],
    "datasets": {"synthetic": {"source": "synthetic", "num_classes": 4, "train_samples": 32, "test_samples": 16}},
    "shards": {"samples_per_shard": 32},
    "teacher": {"dataset": "synthetic", "train": {"steps": 1, "batch_size": 16, "lr": 1e-3}},
    "student": {"train": {"steps": 1, "batch_size": 16, "lr": 1e-3}},
    "distill": {"loss": "mse", "train": {"steps": 1, "batch_size": 16, "lr": 1e-3}},
    "init_strategies": {"copy_mlp_distill": {"copy": ["embed", "mlp", "norm", "head"], "distill": True}},
    "evaluation": {"fidelity_samples": 4, "throughput_batch": 4},
}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("world")
    run_shards(CONFIG, "synthetic", root / "shards")
    run_teacher(CONFIG, "micro", 0, root / "shards", root / "teacher")
    return root


@pytest.mark.parametrize("loss", ["proj_mse", "map_ce"])
@pytest.mark.parametrize("variant", [v for v in available_variants() if v != "softmax"])
def test_every_operator_distills_trains_and_evaluates(world, tmp_path, variant, loss):
    config = {**CONFIG, "distill": {**CONFIG["distill"], "loss": loss}}
    d = run_distill(config, "synthetic", "micro", variant, "copy_mlp_distill", loss, 0, world / "teacher",
                    world / "shards", tmp_path / "d")
    assert d["distill_loss"] >= 0
    m = run_student(config, "synthetic", "micro", variant, "copy_mlp_distill", 0, world / "teacher",
                    world / "shards", tmp_path / "s", distilled_dir=tmp_path / "d", design=loss, budget=2)
    assert m["distill"]["loss"] == loss and m["steps"] == 2 and 0 <= m["test_acc"] <= 1
    e = run_evaluate(config, tmp_path / "s", world / "teacher", world / "shards", tmp_path / "s" / "eval.json")
    for metric in ("kl", "js", "corr"):
        assert len(e[f"fidelity_{metric}"]) == 4
    assert all(k >= -1e-6 for k in e["fidelity_kl"])
