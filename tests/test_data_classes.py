"""A dataset's `classes`: a subset of its source's labels, kept in every split and relabelled 0..k-1
in the given order (label-disjoint transfer: a teacher on some classes, students on the others)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from linvit.config import ConfigError, check_source_options
from linvit.data import MANIFEST, DataError, ShardSet, load_raw, write_shards
from linvit.data import sources
from linvit.data.sources import FASHION_MNIST_CLASSES, FASHION_MNIST_SYSTEM_DIR
from linvit.predictions import PREDICTIONS, read_predictions
from linvit.steps import load_model, run_shards, run_student, run_teacher


def test_digits_subset_keeps_those_classes_in_every_split_relabelled_in_order():
    full = load_raw("digits", {"source": "digits"})
    sub = load_raw("digits_7_2", {"source": "digits", "classes": [7, 2]})
    assert sub.classes == ["7", "2"]
    for split, (x, y) in sub.splits.items():
        fx, fy = full.splits[split]
        assert y.dtype == np.int64 and set(np.unique(y)) == {0, 1}
        # The same images, in the same order: label 7 -> 0, label 2 -> 1.
        keep = np.isin(fy, [7, 2])
        np.testing.assert_array_equal(x, fx[keep])
        np.testing.assert_array_equal(y, np.where(fy[keep] == 7, 0, 1))


@pytest.mark.skipif(not (FASHION_MNIST_SYSTEM_DIR / "t10k-labels-idx1-ubyte.gz").exists(),
                    reason="Debian's dataset-fashion-mnist is not installed")
def test_fashion_mnist_5_to_9_is_a_new_label_space_of_5000_test_images():
    raw = load_raw("fmnist_5to9", {"source": "fashion_mnist", "classes": [5, 6, 7, 8, 9]})
    assert raw.classes == FASHION_MNIST_CLASSES[5:] == ["Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]
    x, y = raw.splits["test"]
    assert len(y) == 5000 and x.shape == (5000, 28, 28)
    assert np.bincount(y).tolist() == [1000] * 5
    assert np.bincount(raw.splits["train"][1]).tolist() == [6000] * 5


@pytest.fixture(scope="module")
def digits_shards(tmp_path_factory):
    out = tmp_path_factory.mktemp("digits_subset")
    info = write_shards("digits_5to9", {"source": "digits", "classes": [5, 6, 7, 8, 9]}, out,
                        samples_per_shard=200, workers=1)
    return out, info


def test_the_manifest_and_the_shards_hold_the_subset(digits_shards):
    out, info = digits_shards
    assert info["classes"] == ["5", "6", "7", "8", "9"] and info["num_classes"] == 5
    assert info["source_labels"] == [5, 6, 7, 8, 9]
    full = load_raw("digits", {"source": "digits"})
    for split in ("train", "test"):
        assert info["splits"][split]["samples"] == int(np.isin(full.splits[split][1], [5, 6, 7, 8, 9]).sum())
    data = ShardSet(out)
    assert data.num_classes == 5 and data.classes == ["5", "6", "7", "8", "9"]
    labels = np.concatenate([y.numpy() for _, y in data.batches("test", 64)])
    assert sorted(set(labels.tolist())) == [0, 1, 2, 3, 4]


def test_other_classes_rewrite_every_shard_and_the_manifest(tmp_path, capsys):
    out = tmp_path / "shards"
    first = write_shards("d", {"source": "digits", "classes": [0, 1]}, out, samples_per_shard=1000, workers=1)
    inputs = {p.name: json.loads(p.read_text())["inputs"] for p in (out / "_progress").iterdir()}
    capsys.readouterr()
    # The same samples in another order: only the labels (and the subset) differ.
    second = write_shards("d", {"source": "digits", "classes": [1, 0]}, out, samples_per_shard=1000, workers=1)
    err = capsys.readouterr().err
    assert "kept" not in err and err.count("wrote") == 2
    again = {p.name: json.loads(p.read_text())["inputs"] for p in (out / "_progress").iterdir()}
    assert set(again) == set(inputs) and all(again[k] != inputs[k] for k in inputs)
    assert (first["classes"], second["classes"]) == (["0", "1"], ["1", "0"])
    assert second["source_labels"] == [1, 0]
    # The same subset again: every shard is kept.
    write_shards("d", {"source": "digits", "classes": [1, 0]}, out, samples_per_shard=1000, workers=1)
    assert capsys.readouterr().err.count("kept") == 2


def test_without_classes_the_manifest_is_as_before(tmp_path):
    info = write_shards("s", {"source": "synthetic", "train_samples": 16, "test_samples": 8}, tmp_path, workers=1)
    assert "source_labels" not in info and info["num_classes"] == 4


def _png(path: Path, value: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("L", (6, 6), value).save(path)


def test_an_imagefolder_subset_keeps_its_files_and_class_names(tmp_path):
    for split in ("train", "test"):
        for c, cls in enumerate(["ant", "bee", "cat"]):
            for i in range(2):
                _png(tmp_path / "data" / split / cls / f"{i}.png", 40 * c + i)
    spec = {"source": "imagefolder", "path": str(tmp_path / "data"), "channels": 1, "classes": [2, 0]}
    raw = load_raw("folder", spec)
    assert raw.classes == ["cat", "ant"]
    assert [(rel, label) for _, rel, label in raw.splits["train"]] == [
        ("train/ant/0.png", 1), ("train/ant/1.png", 1), ("train/cat/0.png", 0), ("train/cat/1.png", 0)]
    info = write_shards("folder", spec, tmp_path / "shards", workers=1)
    assert info["format"] == "encoded" and info["classes"] == ["cat", "ant"] and info["source_labels"] == [2, 0]
    assert info["splits"]["test"]["samples"] == 4
    # A label the folder does not have is found when loading (the config cannot know it).
    with pytest.raises(DataError, match=r"^config key datasets.folder.classes: label 3 is outside the source's "
                                        r"labels 0..2$"):
        load_raw("folder", dict(spec, classes=[3]))


@pytest.mark.parametrize("spec, message", [
    ({"source": "fashion_mnist", "classes": [5, 5, 6]}, "label 5 is listed twice"),
    ({"source": "fashion_mnist", "classes": [9, 10, 11]}, "labels 10, 11 are outside the source's labels 0..9"),
    ({"source": "digits", "classes": []}, "the list is empty"),
    ({"source": "digits", "classes": [1, "2"]}, "'2' is not a label (a whole number from 0)"),
    ({"source": "digits", "classes": [-1]}, "-1 is not a label"),
    ({"source": "digits", "classes": [True]}, "True is not a label"),
    ({"source": "digits", "classes": 3}, "3 is not a list"),
    # num_classes' declared default: 4
    ({"source": "synthetic", "classes": [3, 4]}, "label 4 is outside the source's labels 0..3"),
    ({"source": "synthetic", "num_classes": 3, "classes": [3]}, "label 3 is outside the source's labels 0..2"),
    ({"source": "idx", "path": "/x", "classes": ["T-shirt"]}, "the idx source's class names are its `class_names`"),
    ({"source": "digits", "labels": "teacher", "classes": [0, 1]}, "cannot share the teacher's label space"),
])
def test_a_wrong_classes_entry_is_one_line_naming_the_key(spec, message):
    with pytest.raises(ConfigError) as err:
        check_source_options("fmnist_5to9", spec)
    text = str(err.value)
    assert text.startswith("config key datasets.fmnist_5to9.classes: ") and message in text
    assert "\n" not in text


def test_valid_classes_pass_the_check_for_every_source():
    for spec in ({"source": "fashion_mnist", "classes": [5, 6, 7, 8, 9]}, {"source": "digits", "classes": [0]},
                 {"source": "synthetic", "num_classes": 6, "classes": [5, 0]},
                 {"source": "idx", "path": "/x", "classes": [12], "class_names": ["a"]},
                 {"source": "cifar", "path": "/x", "classes": [99]},
                 {"source": "imagefolder", "path": "/x", "classes": [0, 1]}):
        check_source_options("d", spec)


def test_the_label_counts_read_without_importing_agree_with_the_registered_ones():
    from linvit.registry import _declared_source_keyword

    assert _declared_source_keyword("num_labels") == sources.SOURCE_LABELS


def test_the_shards_step_refuses_bad_classes_before_writing(tmp_path):
    config = {"datasets": {"d": {"source": "digits", "classes": [3, 3]}}}
    with pytest.raises(ConfigError, match="config key datasets.d.classes: label 3 is listed twice"):
        run_shards(config, "d", tmp_path / "shards")
    assert not (tmp_path / "shards").exists()


CONFIG = {
    "seeds": [0], "sizes": ["micro"], "variants": ["elu"], "targets": ["digits_5to9"], "inits": ["copy_all"],
    "datasets": {"digits_0to4": {"source": "digits", "classes": [0, 1, 2, 3, 4]},
                 "digits_5to9": {"source": "digits", "classes": [5, 6, 7, 8, 9]}},
    "shards": {"samples_per_shard": 1000},
    "teacher": {"dataset": "digits_0to4", "train": {"steps": 2, "batch_size": 16, "lr": 1e-3}},
    "student": {"train": {"steps": 2, "batch_size": 16, "lr": 1e-3, "eval_samples": 32}},
    "distill": {"train": {"steps": 1, "batch_size": 16, "lr": 1e-3}},
    "init_strategies": {"copy_all": {"copy": ["embed", "attn", "mlp", "norm", "head"], "distill": False}},
}


def test_a_teacher_on_classes_0_to_4_transfers_to_classes_5_to_9(tmp_path, quiet_machine):
    for name in CONFIG["datasets"]:
        run_shards(CONFIG, name, tmp_path / name, workers=1)
    teacher = run_teacher(CONFIG, "micro", 0, tmp_path / "digits_0to4", tmp_path / "teacher")
    assert teacher["dataset"] == "digits_0to4"
    _, arch = load_model(tmp_path / "teacher")
    assert arch["num_classes"] == 5 and arch["classes"] == ["0", "1", "2", "3", "4"]
    m = run_student(CONFIG, "digits_5to9", "micro", "elu", "copy_all", 0, tmp_path / "teacher",
                    tmp_path / "digits_5to9", tmp_path / "student", budget=2)
    # Another label space of the same size: a fresh head, everything else copied.
    assert m["copied"]["head"] == 0 and m["copied"]["mlp"] > 0 and not m["head_copied"]
    _, student = load_model(tmp_path / "student")
    assert student["classes"] == ["5", "6", "7", "8", "9"] and student["dataset"] == "digits_5to9"
    info = json.loads((tmp_path / "digits_5to9" / MANIFEST).read_text())
    predictions = read_predictions(tmp_path / "student" / PREDICTIONS)
    assert m["test_samples"] == predictions.samples == info["splits"]["test"]["samples"]
    assert set(predictions.label.tolist()) == {0, 1, 2, 3, 4} and predictions.pred.max() <= 4
