"""The schema and the registries reject bad configs, naming the key and the known values."""

import copy

import pytest
import yaml

from linvit.attention import available_variants
from linvit.config import ConfigError, load_config, validate
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


@pytest.mark.parametrize("name", ["default", "smoke", "budgets", "mini_paper", "c4"])
def test_shipped_configs_are_valid(name):
    validate(load_config(REPO / "workflow/config" / f"{name}.yaml"))


@pytest.mark.parametrize("path", sorted((REPO / "workflow/config").glob("*.yaml")), ids=lambda p: p.stem)
def test_no_config_header_promises_verdicts_its_seeds_cannot_give(path):
    """A grid with fewer seeds than a test needs (claims.min_seeds) gives "too few seeds" for every claim: its
    header's Expect may not promise verdicts, unless it says so (issue 57)."""
    from linvit.stats.paired import Settings

    config = load_config(path)
    if "seeds" not in config:
        return  # a plan laid over another config (decide.yaml)
    expect = (config.get("description") or "").partition("Expect:")[2].partition("More:")[0]
    assert expect, f"{path.name}: its description has no Expect"
    if len(config["seeds"]) < Settings.from_config(config).min_seeds and "sequential" not in config:
        assert "verdict" not in expect or '"too few seeds"' in expect, f"{path.name}: {expect.strip()}"


def test_the_schema_admits_every_setting_the_code_reads():
    """The schema's train and runtime sections list exactly the settings TrainSpec and Runtime
    read: a setting the code knows but the schema refuses cannot be used from a config at all."""
    from dataclasses import fields

    from linvit.config import SCHEMA
    from linvit.device import RUNTIME_KEYS
    from linvit.train import TrainSpec

    schema = yaml.safe_load(SCHEMA.read_text())
    assert set(schema["definitions"]["train"]["properties"]) == {f.name for f in fields(TrainSpec)}
    runtime = schema["properties"]["runtime"]["properties"]
    assert set(runtime) == set(RUNTIME_KEYS)
    config = changed(runtime={"workers": 2}, student__train__diverge_factor=50)
    validate(config)
    config["student"]["train"]["diverge_factor"] = None  # null: only NaN/inf stops a run
    validate(config)
    with pytest.raises(ConfigError, match="runtime"):
        validate(changed(runtime={"cpu_linear": "onednn"}))  # removed: the CPU's linear kernels are torch's own


@pytest.mark.parametrize("option, value, message", [
    ("train_sample", 192, "datasets.synthetic: unknown option(s) 'train_sample' of source 'synthetic'; known: "),
    ("num_classes", "four", "datasets.synthetic.num_classes: 'four' is not of type 'integer'"),
    ("train_samples", 0, "datasets.synthetic.train_samples: 0 is less than the minimum of 1"),
    ("channels", 2, "datasets.synthetic.channels: 2 is not one of [1, 3]")])
def test_a_datasets_options_are_checked_against_its_source(option, value, message):
    config = changed(SMOKE, **{f"datasets__synthetic__{option}": value})
    with pytest.raises(ConfigError) as err:
        validate(config)
    assert message in str(err.value)


def test_a_source_registered_without_options_keeps_its_entries_unchecked():
    from linvit.data import sources

    sources.register_source("free_form_test")(lambda spec: None)
    try:
        from linvit.config import check_source_options

        check_source_options("x", {"source": "free_form_test", "anything": [1, 2]})
    finally:
        for table in (sources.SOURCES, sources.SOURCE_OPTIONS, sources.SOURCE_LABELS):  # leave no trace
            del table["free_form_test"]


def test_default_grid_covers_every_cell():
    cells = student_cells(DEFAULT)
    # targets x sizes x (elu's 7 strategies + the softmax control's 4) x budgets x seeds
    assert len(cells) == 1 * 1 * (7 + 4) * 1 * 5
    assert {c.init for c in cells if c.is_control} == {"random", "copy_all", "copy_mlp", "attn_only"}
    assert {c.init for c in cells} == {"random", "copy_all", "copy_attn", "copy_mlp", "attn_only", "mlp_only",
                                       "copy_mlp_distill"}
    assert {c.variant for c in cells} == {"elu", "softmax"} and not any(c.is_reference for c in cells)
    assert {c.budget for c in cells} == {200} and {c.seed for c in cells} == {0, 1, 2, 3, 4}
    assert {c.design for c in cells} == {"none", "proj_mse"}


def test_designs_cross_the_distilling_strategies_only():
    config = changed(inits=["random", "copy_mlp_distill", "lolcats"], distills=["proj_mse", "map_js"],
                     control_inits=None)
    cells = student_cells(config)
    assert sorted({(c.init, c.design) for c in cells}) == [
        ("copy_mlp_distill", "map_js"), ("copy_mlp_distill", "proj_mse"), ("lolcats", "lolcats"), ("random", "none")]
    # Without `distills` or distill.loss, the first design defined is the axis.
    config = changed(distills=None)
    assert {c.design for c in student_cells(config) if c.init == "copy_mlp_distill"} == {"proj_mse"}


def test_budgets_default_to_the_students_steps():
    config = changed(budgets=None)
    assert {c.budget for c in student_cells(config)} == {DEFAULT["student"]["train"]["steps"]}


@pytest.mark.parametrize("updates, message", [
    ({"variants": ["nope"]}, r"config key variants: unknown variant 'nope'; known variants: " + ", ".join(available_variants())),
    ({"sizes": ["huge"]}, r"config key sizes: unknown size 'huge'; known sizes: .*micro"),
    ({"targets": ["cifar"]}, r"config key targets: unknown dataset 'cifar'; known datasets: digits, fashion_mnist"),
    ({"inits": ["copy_everything"]}, r"config key inits: unknown init strategy 'copy_everything'"),
    ({"init_strategies__random__copy": ["mlps"]}, r"init_strategies.random.copy: unknown parameter group 'mlps'"),
    ({"distill__loss": "l7"}, r"config key distill.loss: unknown distillation loss 'l7'; known .*mse"),
    ({"datasets__digits__source": "svhn"}, r"datasets.digits.source: unknown source 'svhn'"),
    ({"student__train__steps": "many"}, r"config key student.train.steps: 'many' is not of type 'integer'"),
    ({"seeds": None}, r"'seeds' is a required property"),
    # softmax is a variant (the control students); 'reference' stays the reference's own init name.
    ({"variants": ["elu", "softmax", "nope"]}, r"config key variants: unknown variant 'nope'; known variants: .*softmax"),
    ({"init_strategies__reference": {"copy": [], "distill": False}},
     r"config key init_strategies: 'reference' names the softmax reference runs"),
    ({"student__train__steps": 10**8 + 1}, r"config key student.train.steps: 100000001 is greater than the maximum"),
    ({"teacher__train__steps": 0}, r"config key teacher.train.steps: 0 is less than the minimum of 1"),
    ({"student__train__lr_typo": 0.1}, r"student.train: Additional properties are not allowed \('lr_typo'"),
    ({"distills": ["nope"]}, r"config key distills: unknown distillation design 'nope'; known distillation designs: "),
    ({"init_strategies__lolcats__distill": "nope"}, r"config key init_strategies.lolcats.distill: unknown distillation design 'nope'"),
    ({"distill_designs__map_js__losses": [{"loss": "map_xx"}]},
     r"config key distill_designs.map_js.losses\[0\].loss: unknown distillation loss 'map_xx'; known .*map_js"),
    ({"distill_designs__mohawk__phases": [{"losses": ["map_fro"], "fraction": 1.5}]},
     r"config key distill_designs.mohawk.phases.0.fraction: 1.5 is greater than the maximum of 1"),
    ({"init_strategies__deit_kd__train_losses": [{"loss": "logit_kd", "wieght": 1}]},
     r"config key init_strategies.deit_kd.train_losses.0: "),
    ({"budgets": [0]}, r"config key budgets.0: 0 is less than the minimum of 1"),
    ({"distill_designs__none": {"losses": ["map_ce"]}}, r"config key distill_designs: 'none' names the cells that do not distill"),
    ({"distill_designs__both": {"losses": ["map_ce"], "phases": [{"losses": ["map_ce"]}]}},
     r"config key distill_designs.both: give either `losses` \(one phase\) or `phases`, not both"),
    ({"distill_designs__neither": {"freeze": False}}, r"config key distill_designs.neither: give either .* neither is given"),
    # One axis at a time (issue 57): a center off its axes, an axis value no cell uses, a cell of a misspelt key.
    ({"cells": {"around": {"target": "fmnist_5to9", "size": "micro", "variant": "relu", "budget": 200}}},
     r"config key cells.around.variant: unknown variant 'relu'; known variants: elu, softmax$"),
    ({"budgets": [200, 800], "cells": [{"target": "fmnist_5to9", "size": "micro", "variant": v, "budget": 200}
                                       for v in ("elu", "softmax")]},
     r"config key budgets: 800 is in no cell of `cells`"),
    ({"cells": [{"target": "fmnist_5to9", "size": "micro", "variant": "elu", "steps": 200}]},
     r"config key cells: .* is not valid under any of the given schemas"),
    # A rule that does not exist (the removed evaluate job, a typo) would be silently ignored.
    ({"resources__evaluate": {"threads": 1}}, r"^config key resources: 'evaluate' is not one of \['scale', 'shards'"),
])
def test_bad_config_is_one_clear_error(updates, message):
    with pytest.raises(ConfigError, match=message) as err:
        validate(changed(**updates))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("updates, known", [
    ({"distill__loss": "l7"}, "known distillation losses: "),
    ({"distill_designs__map_js__losses": [{"loss": "map_xx"}]}, "known distillation losses: "),
    ({"init_strategies__random__copy": ["mlps"]}, "known parameter groups: "),
    ({"datasets__digits__source": "svhn"}, "known sources: "),
])
def test_an_unknown_name_lists_the_known_ones_in_plain_english(updates, known):
    """The list after an unknown name is headed by the kind's plural ('losses', not 'losss')."""
    with pytest.raises(ConfigError) as err:
        validate(changed(**updates))
    assert known in str(err.value) and "losss" not in str(err.value), str(err.value)


def test_replicated_checkpoints_map_student_seed_s_to_replicate_s():
    """teachers.<size>.replicates: seed s loads replicate s laid over the entry's keys, and the grid's
    teacher for seed s lives in the trained teachers' layout (<size>/seed<s>); one checkpoint keeps its
    folder and every seed shares it."""
    from linvit import grid
    from linvit.config import CHECKPOINT, CHECKPOINTS, checkpoint, replicated, teacher_design
    from linvit.steps import run_teacher

    entry = {"model": "deit_tiny_patch16_224", "model_args": {"depth": 2},
             "replicates": [{"file": "a.pth"}, {"file": "b.safetensors", "model_args": {"depth": 4}}]}
    config = {"sizes": ["deit"], "seeds": [0, 1], "teachers": {"deit": entry}}
    assert teacher_design(config, "deit") == CHECKPOINTS and replicated(config, "deit")
    assert checkpoint(config, "deit", 1) == {"model": "deit_tiny_patch16_224", "model_args": {"depth": 4},
                                             "file": "b.safetensors"}
    assert [grid.teacher_of(config, "deit", s) for s in (0, 1)] == ["results/teacher/deit/seed0",
                                                                   "results/teacher/deit/seed1"]
    assert grid.teacher_keys(config) == ["deit/seed0", "deit/seed1"]
    one = {**config, "teachers": {"deit": {"model": "deit_tiny_patch16_224"}}}
    assert teacher_design(one, "deit") == CHECKPOINT and not replicated(one, "deit")
    assert grid.teacher_keys(one) == ["deit"] and checkpoint(one, "deit", 1) == {"model": "deit_tiny_patch16_224"}
    # By hand, a replicated size needs the seed that picks its checkpoint: one line, before any loading.
    with pytest.raises(ConfigError, match=r"^config key teachers.deit.replicates: 2 checkpoints, one per student "
                                          r"seed; say which \(--seed\)$"):
        run_teacher(config, "deit", None, None, "unused")


def _replicated(tmp_path, files, seeds=(0, 1), **extra):
    """SMOKE with its micro size loaded from `files` (names under tmp_path), one replicate per seed."""
    config = changed(SMOKE, seeds=list(seeds))
    config["teachers"] = {"micro": {"model": "deit_tiny_patch16_224",
                                    "replicates": [{"file": str(tmp_path / f), **extra} for f in files]}}
    return config


def _check_config(tmp_path, config, capsys):
    """`linvit check-config` on `config`: its exit status and its output."""
    from linvit.cli import main

    (tmp_path / "grid.yaml").write_text(yaml.safe_dump(config))
    code = main(["check-config", str(tmp_path / "grid.yaml")])
    out = capsys.readouterr()
    return code, out.out + out.err


def test_a_missing_replicate_file_is_one_line_naming_its_key(tmp_path, capsys):
    """A replicate naming a file that does not exist is refused by check-config (and so by the workflow,
    which checks the same way when it parses): the teacher folder an earlier config built would
    otherwise stand for it, since Snakemake plans no job whose input is missing."""
    (tmp_path / "t0.pth").write_bytes(b"zero")
    config = _replicated(tmp_path, ["t0.pth", "gone.pth"])
    code, text = _check_config(tmp_path, config, capsys)
    assert code == 1 and "valid" not in text
    assert text.strip() == f"linvit: error: config key teachers.micro.replicates[1].file: {tmp_path / 'gone.pth'} does not exist"
    (tmp_path / "gone.pth").write_bytes(b"one")
    assert _check_config(tmp_path, config, capsys)[0] == 0


@pytest.mark.parametrize("spell, says", [
    (lambda tmp: f"{tmp}/./t0.pth", "the same checkpoint as replicates[0]"),  # another spelling of the path
    (lambda tmp: ((tmp / "link.pth").symlink_to(tmp / "t0.pth"), str(tmp / "link.pth"))[1],
     "the same checkpoint as replicates[0]"),
    (lambda tmp: ((tmp / "copy.pth").write_bytes((tmp / "t0.pth").read_bytes()), str(tmp / "copy.pth"))[1],
     "is a byte-identical copy of replicates[0]'s"),
])
def test_one_checkpoint_listed_twice_is_refused_however_it_is_spelt(tmp_path, spell, says):
    """The duplicate check compares files, not path strings: `dir/./t0`, a symlink and a byte-identical
    copy are the same teacher counted twice. Files of one size whose first and last MiB agree but whose
    middles differ are two teachers."""
    big = bytearray(b"A" * (3 << 20))
    (tmp_path / "t0.pth").write_bytes(big)
    config = _replicated(tmp_path, ["t0.pth", "t0.pth"])
    config["teachers"]["micro"]["replicates"][1]["file"] = spell(tmp_path)
    with pytest.raises(ConfigError) as err:
        validate(config)
    assert str(err.value).startswith("config key teachers.micro.replicates[1]: ") and says in str(err.value)
    assert "\n" not in str(err.value)
    big[len(big) // 2] = ord("B")
    (tmp_path / "other.pth").write_bytes(big)
    validate(_replicated(tmp_path, ["t0.pth", "other.pth"]))


def test_a_replicate_of_another_recipe_is_refused(tmp_path):
    """A replicate with its own model_args (another width) is another teacher, not a replicate of this one."""
    for name in ("t0.pth", "t1.pth"):
        (tmp_path / name).write_bytes(name.encode())
    config = _replicated(tmp_path, ["t0.pth", "t1.pth"])
    config["teachers"]["micro"]["replicates"][1]["model_args"] = {"embed_dim": 96}
    with pytest.raises(ConfigError, match=r"^config key teachers.micro.replicates\[1\].model_args: replicates are "
                                          r"checkpoints of one recipe"):
        validate(config)


def test_replicates_are_picked_by_seed_value_and_the_error_says_so(tmp_path):
    """seeds [3, 4, 5] copy from replicates[3..5], not the first three: three checkpoints are not enough,
    and the one line says why and what to do."""
    for name in ("t0.pth", "t1.pth", "t2.pth"):
        (tmp_path / name).write_bytes(name.encode())
    config = _replicated(tmp_path, ["t0.pth", "t1.pth", "t2.pth"], seeds=(3, 4, 5))
    with pytest.raises(ConfigError) as err:
        validate(config)
    assert str(err.value) == ("config key teachers.micro.replicates: seed 3 has no checkpoint (3 listed, for seeds "
                              "0-2): seed s copies from replicates[s], by seed value, not by position in seeds; list "
                              "one for every seed up to 3, or use seeds 0-2")


def test_the_resources_schema_names_the_rules_that_take_resources():
    """`resources:` takes the names res() is called with in workflow/rules/*.smk, and scale: a rule
    added there is configurable, and none removed stays accepted."""
    import re

    schema = yaml.safe_load((REPO / "workflow/schemas/config.schema.yaml").read_text())
    names = set(schema["properties"]["resources"]["propertyNames"]["enum"])
    rules = {m for f in (REPO / "workflow/rules").glob("*.smk") for m in re.findall(r'\bres\("(\w+)"', f.read_text())}
    assert names == rules | {"scale"}
