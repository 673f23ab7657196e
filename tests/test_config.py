"""The schema and the registries reject bad configs, naming the key and the known values."""

import copy

import pytest
import yaml

from linvit.attention import available_variants
from linvit.config import ConfigError, validate
from linvit.grid import student_cells

from conftest import REPO

DEFAULT = yaml.safe_load((REPO / "workflow/config/default.yaml").read_text())
SMOKE = yaml.safe_load((REPO / "workflow/config/smoke.yaml").read_text())


def changed(base=DEFAULT, **updates):
    config = copy.deepcopy(base)
    for dotted, value in updates.items():
        node = config
        *parents, last = dotted.split("__")
        for p in parents:
            node = node[p]
        if value is None:
            del node[last]
        else:
            node[last] = value
    return config


@pytest.mark.parametrize("config", [DEFAULT, SMOKE], ids=["default", "smoke"])
def test_shipped_configs_are_valid(config):
    validate(config)


def test_default_grid_covers_every_cell():
    cells = student_cells(DEFAULT)
    assert len(cells) == 2 * 1 * 3 * 8 * 1
    assert {c.init for c in cells} >= {"random", "copy_all", "copy_attn", "copy_mlp", "attn_only", "mlp_only",
                                       "copy_mlp_distill", "distill_only"}


@pytest.mark.parametrize("updates, message", [
    ({"variants": ["nope"]}, r"config key variants: unknown variant 'nope'; known variants: " + ", ".join(v for v in available_variants() if v != "softmax")),
    ({"sizes": ["huge"]}, r"config key sizes: unknown size 'huge'; known sizes: .*micro"),
    ({"targets": ["cifar"]}, r"config key targets: unknown dataset 'cifar'; known datasets: digits, fashion_mnist"),
    ({"inits": ["copy_everything"]}, r"config key inits: unknown init strategy 'copy_everything'"),
    ({"init_strategies__random__copy": ["mlps"]}, r"init_strategies.random.copy: unknown parameter group 'mlps'"),
    ({"distill__loss": "l7"}, r"config key distill.loss: unknown distillation loss 'l7'; known .*mse"),
    ({"datasets__digits__source": "svhn"}, r"datasets.digits.source: unknown source 'svhn'"),
    ({"student__train__steps": "many"}, r"config key student.train.steps: 'many' is not of type 'integer'"),
    ({"seeds": None}, r"'seeds' is a required property"),
    ({"variants": ["elu", "softmax"]}, r"config key variants: 'softmax' is the teacher and the reference, not a linear variant"),
    ({"init_strategies__reference": {"copy": [], "distill": False}},
     r"config key init_strategies: 'reference' names the softmax reference runs"),
    ({"student__train__steps": 10**8 + 1}, r"config key student.train.steps: 100000001 is greater than the maximum"),
    ({"teacher__train__steps": 0}, r"config key teacher.train.steps: 0 is less than the minimum of 1"),
    ({"student__train__lr_typo": 0.1}, r"student.train: Additional properties are not allowed \('lr_typo'"),
])
def test_bad_config_is_one_clear_error(updates, message):
    with pytest.raises(ConfigError, match=message) as err:
        validate(changed(**updates))
    assert "\n" not in str(err.value)
