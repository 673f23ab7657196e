"""Adding an operator is one registered entry: a toy operator defined here trains through the normal path."""

import json

import pytest
import timm
import torch
from timm.models import _registry

import linvit.models

from linvit.attention import ATTENTION, LinearAttention, register_attention, unregister_attention
from linvit.config import validate
from linvit.steps import run_shards, run_student, run_teacher

CONFIG = {
    "seeds": [0], "sizes": ["micro"], "variants": ["elu"], "targets": ["synthetic"], "inits": ["copy_mlp"],
    "datasets": {"synthetic": {"source": "synthetic", "num_classes": 4, "train_samples": 64, "test_samples": 32}},
    "shards": {"samples_per_shard": 64},
    "teacher": {"dataset": "synthetic", "train": {"steps": 2, "batch_size": 16, "lr": 1e-3}},
    "student": {"train": {"steps": 1, "batch_size": 16, "lr": 1e-3}},
    "distill": {"loss": "mse", "train": {"steps": 1, "batch_size": 16, "lr": 1e-3}},
    "init_strategies": {"copy_mlp": {"copy": ["embed", "mlp", "norm", "head"], "distill": False}},
}


@pytest.fixture
def toy():
    @register_attention("toy_sigmoid")
    class ToySigmoid(LinearAttention):
        """sigmoid features: the smallest possible new operator."""

        def features(self, q, k):
            return torch.sigmoid(q), torch.sigmoid(k)

    yield "toy_sigmoid"
    unregister_attention("toy_sigmoid")
    # Nothing of it is left behind: not the name, not the timm models registered for it.
    assert "toy_sigmoid" not in ATTENTION
    assert timm.list_models("linvit_*toy*") == []


def test_a_toy_operator_trains_a_student_through_the_normal_path(toy, tmp_path):
    config = {**CONFIG, "variants": [toy]}
    validate(config)  # the grid accepts it by name
    run_shards(config, "synthetic", tmp_path / "shards")
    run_teacher(config, "micro", 0, tmp_path / "shards", tmp_path / "teacher")
    metrics = run_student(config, "synthetic", "micro", toy, "copy_mlp", 0, tmp_path / "teacher",
                          tmp_path / "shards", tmp_path / "student")
    assert metrics["steps"] == 1 and 0 <= metrics["test_acc"] <= 1
    assert json.loads((tmp_path / "student" / "model.json").read_text())["variant"] == toy
    # ... and timm knows it too.
    model = timm.create_model(f"linvit_micro_{toy}")
    assert type(model.blocks[0].attn).__name__ == "ToySigmoid"
    assert model(torch.randn(1, 1, 28, 28)).shape == (1, 10)


def test_unregistering_an_operator_removes_its_timm_models(toy):
    names = timm.list_models(f"linvit_*_{toy}")
    assert len(names) == len(linvit.models.SIZES) and timm.list_models(module="linvit", filter="*toy*") == names
    unregister_attention(toy)
    assert timm.list_models("linvit_*toy*") == [] and not timm.list_models(module="linvit", filter="*toy*")
    for name in names:
        assert not timm.is_model(name) and name not in _registry._model_pretrained_cfgs
        assert name not in linvit.models.default_cfgs and not hasattr(linvit.models, name)
    with pytest.raises(RuntimeError, match="Unknown model"):
        timm.create_model(names[0])
    # Registered again, it has working models again (which the fixture's teardown removes).
    register_attention(toy)(type("ToySigmoid", (LinearAttention,), {
        "features": lambda self, q, k: (torch.sigmoid(q), torch.sigmoid(k))}))
    assert timm.create_model(f"linvit_micro_{toy}")(torch.randn(1, 1, 28, 28)).shape == (1, 10)
