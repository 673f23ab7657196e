"""linvit.data on real image files: encoded shards, CIFAR archives, timm transforms in worker processes,
and the JPEG ImageFolder made from Fashion-MNIST."""

from __future__ import annotations

import io
import json
import multiprocessing
import pickle
import tarfile
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from linvit.data import MANIFEST, DataError, ShardSet, load_raw, write_shards
from linvit.data.images import MARKER, make_imagefolder
from linvit.data.shards import PROGRESS
from linvit.data.transforms import Pipeline

CLASSES = ["cat", "dog", "emu"]


def _image(path: Path, size=(10, 8), mode="RGB", seed=0, fmt=None) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    shape = (size[1], size[0]) + ((3,) if mode == "RGB" else ())
    Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode).save(path, format=fmt)
    return path


@pytest.fixture
def folder(tmp_path) -> Path:
    """3 classes; JPEG (three suffixes), PNG, a grayscale JPEG among RGB ones; eval split in val/."""
    root = tmp_path / "imgs"
    i = 0
    for split, n in (("train", 6), ("val", 2)):
        for cls in CLASSES:
            for k in range(n):
                suffix = [".jpg", ".jpeg", ".JPEG", ".png"][k % 4]
                mode = "L" if (cls == "dog" and k == 1) else "RGB"
                _image(root / split / cls / f"{k}{suffix}", mode=mode, seed=i,
                       fmt="PNG" if suffix == ".png" else "JPEG")
                i += 1
    return root


def _tar_members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}


def _all_members(shard_dir: Path, split: str) -> dict[str, bytes]:
    out = {}
    for p in sorted(shard_dir.glob(f"{split}-*.tar")):
        out.update(_tar_members(p))
    return out


# ----------------------------------------------------------------------------- encoded shards


def test_encoded_shards_keep_the_original_bytes_and_a_checked_manifest(folder, tmp_path):
    out = tmp_path / "shards"
    info = write_shards("f", {"source": "imagefolder", "path": str(folder)}, out, samples_per_shard=5, workers=1)
    assert info["format"] == "encoded" and info["classes"] == CLASSES and info["num_classes"] == 3
    assert info["channels"] == 3 and info["image_size"] == [8, 10] and info["skipped"] == []
    assert info["splits"]["train"]["samples"] == 18 and info["splits"]["test"]["samples"] == 6  # val/ is test
    assert len(info["mean"]) == len(info["std"]) == 3 and all(0 < m < 1 for m in info["mean"])
    assert info["stats_images"] == 18
    assert json.loads((out / MANIFEST).read_text()) == info
    from linvit.io import file_sha256
    for split in ("train", "test"):
        for shard in info["splits"][split]["shards"]:
            assert file_sha256(out / shard["name"]) == shard["sha256"]
    members = _all_members(out, "train")
    paths = {k: json.loads(v)["path"] for k, v in members.items() if k.endswith(".json")}
    assert len(paths) == 18
    for key, rel in paths.items():
        base = key[:-len(".json")]
        ext = "png" if rel.endswith(".png") else "jpg"  # .jpg .jpeg .JPEG are all "jpg"
        assert members[f"{base}.{ext}"] == (folder / rel).read_bytes()  # JPEG stays JPEG, byte for byte
        assert int(members[f"{base}.cls"]) == CLASSES.index(rel.split("/")[1])


def test_encoded_shards_read_back_in_rgb_and_grayscale(folder, tmp_path):
    write_shards("f", {"source": "imagefolder", "path": str(folder)}, tmp_path / "rgb", workers=1)
    s = ShardSet(tmp_path / "rgb")
    x, y = torch.cat([b[0] for b in s.batches("train", 7)]), torch.cat([b[1] for b in s.batches("train", 7)])
    assert x.shape == (18, 3, 8, 10) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert s.input_size == (8, 10) and s.channels == 3 and sorted(y.tolist()) == [0] * 6 + [1] * 6 + [2] * 6
    # Normalized with the manifest's mean/std (estimated from all 18 training images here).
    assert abs(x.mean().item()) < 0.05 and abs(x.std().item() - 1) < 0.05
    info = write_shards("g", {"source": "imagefolder", "path": str(folder), "channels": 1}, tmp_path / "l", workers=1)
    assert info["channels"] == 1 and len(info["mean"]) == 1
    x, _ = next(ShardSet(tmp_path / "l").batches("test", 6))
    assert x.shape == (6, 1, 8, 10)


def test_varying_sizes_need_a_pipeline(folder, tmp_path):
    _image(folder / "train" / "cat" / "big.jpg", size=(20, 16), fmt="JPEG")
    info = write_shards("f", {"source": "imagefolder", "path": str(folder)}, tmp_path / "s", workers=1)
    assert info["image_size"] is None
    with pytest.raises(DataError, match="different sizes.*Pipeline"):
        next(ShardSet(tmp_path / "s").batches("train", 4))
    p = Pipeline(input_size=(12, 12), mean=info["mean"], std=info["std"])
    x, _ = next(ShardSet(tmp_path / "s", pipeline=p).batches("train", 19))
    assert x.shape == (19, 3, 12, 12)


def test_test_split_key_and_class_folder_mismatch(folder, tmp_path):
    (folder / "val").rename(folder / "holdout")
    with pytest.raises(FileNotFoundError, match="val"):
        load_raw("f", {"source": "imagefolder", "path": str(folder)})
    raw = load_raw("f", {"source": "imagefolder", "path": str(folder), "test_split": "holdout"})
    assert len(raw.splits["test"]) == 6 and raw.splits["test"][0][1].startswith("holdout/cat/")
    (folder / "holdout" / "emu").rename(folder / "holdout" / "owl")
    with pytest.raises(DataError) as err:
        load_raw("f", {"source": "imagefolder", "path": str(folder), "test_split": "holdout"})
    msg = str(err.value)
    assert "\n" not in msg and "holdout" in msg and "'emu'" in msg and "'owl'" in msg


def test_corrupt_images_error_or_are_skipped_and_listed(folder, tmp_path, capfd):
    good = (folder / "train" / "cat" / "0.jpg").read_bytes()
    (folder / "train" / "cat" / "truncated.jpg").write_bytes(good[: len(good) // 2])
    (folder / "train" / "dog" / "notes.jpg").write_text("not an image at all")
    spec = {"source": "imagefolder", "path": str(folder)}
    with pytest.raises(DataError) as err:
        write_shards("f", spec, tmp_path / "e", workers=1)
    assert "\n" not in str(err.value) and "train/cat/truncated.jpg" in str(err.value)
    assert not (tmp_path / "e" / MANIFEST).exists()
    info = write_shards("f", dict(spec, on_corrupt="skip"), tmp_path / "s", workers=2, samples_per_shard=4)
    skipped = {s["path"]: s["error"] for s in info["skipped"]}
    assert set(skipped) == {"train/cat/truncated.jpg", "train/dog/notes.jpg"}
    assert all(skipped.values())
    assert info["splits"]["train"]["samples"] == 18
    err_text = capfd.readouterr().err
    assert "truncated.jpg" in err_text and "notes.jpg" in err_text and "skipped" in err_text
    assert sum(len(y) for _, y in ShardSet(tmp_path / "s").batches("train", 5)) == 18


def test_parallel_write_equals_serial_write_byte_for_byte(folder, tmp_path):
    spec = {"source": "imagefolder", "path": str(folder)}
    serial = write_shards("f", spec, tmp_path / "one", samples_per_shard=4, workers=1)
    parallel = write_shards("f", spec, tmp_path / "two", samples_per_shard=4, workers=2)
    assert serial == parallel
    assert (tmp_path / "one" / MANIFEST).read_bytes() == (tmp_path / "two" / MANIFEST).read_bytes()
    names = sorted(p.name for p in (tmp_path / "one").glob("*.tar"))
    assert len(names) == 7  # 18 train in 5 shards, 6 test in 2
    for name in names:
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()


def test_a_rerun_after_a_kill_writes_only_the_missing_shards(folder, tmp_path, capfd):
    spec = {"source": "imagefolder", "path": str(folder)}
    out = tmp_path / "s"
    first = write_shards("f", spec, out, samples_per_shard=4, workers=2)
    # The kill: one shard and the manifest gone, a half-written temporary file left.
    (out / "train-0002.tar").unlink()
    (out / MANIFEST).unlink()
    (out / ".train-0003.tar.abc123xy.tmp").write_bytes(b"half")
    mtimes = {p.name: p.stat().st_mtime_ns for p in out.glob("*.tar")}
    capfd.readouterr()
    again = write_shards("f", spec, out, samples_per_shard=4, workers=2)
    assert again == first
    assert (out / "train-0002.tar").is_file()
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("*.tar") if p.name != "train-0002.tar"} == mtimes
    err = capfd.readouterr().err
    assert err.count(": wrote ") == 1 and "train-0002.tar" in err and err.count(": kept ") == 6
    assert not list(out.glob(".*.tmp"))
    # A shard altered after its record was written is not trusted: rewritten.
    (out / "test-0000.tar").write_bytes(b"garbage")
    write_shards("f", spec, out, samples_per_shard=4, workers=1)
    assert capfd.readouterr().err.count(": wrote ") == 1
    ShardSet(out)  # verifies every sha256
    assert (out / PROGRESS / "test-0000.tar.json").is_file()


def test_a_rerun_that_meets_a_corrupt_image_leaves_the_earlier_shards_as_they_were(folder, tmp_path):
    """The new shards are written beside the old folder and swapped in only when complete: a rerun
    that fails on a corrupt image says so in one line and leaves every old file, _info.json first."""
    spec = {"source": "imagefolder", "path": str(folder)}
    out = tmp_path / "s"
    first = write_shards("f", spec, out, samples_per_shard=4, workers=1)

    def files():
        return {str(p.relative_to(out)): p.read_bytes() for p in out.rglob("*") if p.is_file()}

    before = files()
    bad = folder / "train" / "cat" / "1.jpeg"
    bad.write_bytes(bad.read_bytes()[:200])  # truncated: its shard's inputs changed, so it is rewritten
    with pytest.raises(DataError) as err:
        write_shards("f", spec, out, samples_per_shard=4, workers=2)
    assert sorted(files()) == sorted(before) and files() == before  # _info.json, every shard and record
    text = str(err.value)
    assert "\n" not in text and str(bad) in text and "corrupt image" in text and str(out) in text, text
    assert ShardSet(out).num_samples("train") == first["splits"]["train"]["samples"]  # still loads, sha256 checked
    # Left out (on_corrupt: skip), the rerun succeeds and the folder is the new one, nothing beside it.
    again = write_shards("f", dict(spec, on_corrupt="skip"), out, samples_per_shard=4, workers=1)
    assert again["splits"]["train"]["samples"] == first["splits"]["train"]["samples"] - 1
    assert ShardSet(out).num_samples("train") == again["splits"]["train"]["samples"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["imgs", "s"]


# ----------------------------------------------------------------------------- CIFAR


def _pickled(d: dict) -> bytes:
    return pickle.dumps(d, protocol=2)


def _cifar_archive(path: Path, hundred: bool, n: int = 6) -> Path:
    rng = np.random.default_rng(1)

    def batch(labels_key, k, extra=None):
        d = {b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
             labels_key: [int(v) for v in rng.integers(0, k, n)], b"batch_label": b"x"}
        d.update(extra or {})
        return d

    with tarfile.open(path, "w:gz") as tar:
        def add(name, data):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if hundred:
            for split in ("train", "test"):
                d = batch(b"fine_labels", 100, None)
                d[b"coarse_labels"] = [int(v) for v in rng.integers(0, 20, n)]
                add(f"cifar-100-python/{split}", _pickled(d))
            add("cifar-100-python/meta", _pickled({b"fine_label_names": [f"f{i}".encode() for i in range(100)],
                                                   b"coarse_label_names": [f"c{i}".encode() for i in range(20)]}))
        else:
            for i in range(1, 6):
                add(f"cifar-10-batches-py/data_batch_{i}", _pickled(batch(b"labels", 10)))
            add("cifar-10-batches-py/test_batch", _pickled(batch(b"labels", 10)))
            names = [b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog", b"frog", b"horse", b"ship", b"truck"]
            add("cifar-10-batches-py/batches.meta", _pickled({b"label_names": names, b"num_vis": 3072}))
    return path


def test_cifar10_from_the_archive_and_the_folder(tmp_path):
    archive = _cifar_archive(tmp_path / "cifar-10-python.tar.gz", hundred=False)
    raw = load_raw("c", {"source": "cifar", "path": str(archive)})
    assert raw.classes[:3] == ["airplane", "automobile", "bird"] and len(raw.classes) == 10
    assert raw.splits["train"][0].shape == (30, 32, 32, 3) and raw.splits["test"][0].shape == (6, 32, 32, 3)
    # The layout: 1024 red values, then green, then blue, row by row.
    with tarfile.open(archive) as tar:
        d = pickle.loads(tar.extractfile("cifar-10-batches-py/data_batch_1").read(), encoding="bytes")
    assert raw.splits["train"][0][0, 0, 1, 2] == d[b"data"][0][2048 + 1]
    with tarfile.open(archive) as tar:
        tar.extractall(tmp_path / "x", filter="data")
    again = load_raw("c", {"source": "cifar", "path": str(tmp_path / "x")})
    assert np.array_equal(again.splits["train"][0], raw.splits["train"][0])
    info = write_shards("c", {"source": "cifar", "path": str(archive)}, tmp_path / "s", workers=1)
    assert info["format"] == "png" and info["classes"] == raw.classes and info["splits"]["train"]["samples"] == 30
    x, _ = next(ShardSet(tmp_path / "s").batches("test", 6))
    assert x.shape == (6, 3, 32, 32)


def test_cifar100_fine_and_coarse(tmp_path):
    archive = _cifar_archive(tmp_path / "cifar-100-python.tar.gz", hundred=True)
    fine = load_raw("c", {"source": "cifar", "path": str(archive)})
    coarse = load_raw("c", {"source": "cifar", "path": str(archive), "label_set": "coarse"})
    assert len(fine.classes) == 100 and fine.classes[5] == "f5" and len(coarse.classes) == 20
    assert len(fine.splits["train"][1]) == len(coarse.splits["test"][1]) == 6
    assert not np.array_equal(fine.splits["train"][1], coarse.splits["train"][1])
    with pytest.raises(DataError, match="'label_set'"):
        load_raw("c", {"source": "cifar", "path": str(archive), "label_set": "medium"})
    # In a config, CIFAR-100's class set sits beside the dataset's `labels` (own or teacher), as
    # `label_set`: both pass the config check.
    from linvit.config import check_source_options

    check_source_options("c100", {"source": "cifar", "path": "x", "labels": "own", "label_set": "coarse"})


def test_cifar_refuses_pickles_that_build_other_objects(tmp_path):
    root = tmp_path / "cifar-10-batches-py"
    root.mkdir()
    (root / "data_batch_1").write_bytes(pickle.dumps({b"data": Path("/")}))
    with pytest.raises(DataError, match="data_batch_1.*unpickle"):
        load_raw("c", {"source": "cifar", "path": str(tmp_path)})


# ----------------------------------------------------------------------------- pipelines


@pytest.fixture
def jpeg_shards(folder, tmp_path) -> Path:
    out = tmp_path / "jpeg_shards"
    write_shards("f", {"source": "imagefolder", "path": str(folder)}, out, samples_per_shard=5, workers=1)
    return out


AUG = {"auto_augment": "rand-m9-mstd0.5-inc1", "re_prob": 0.25, "hflip": 0.5}


def _same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(xa, xb) and torch.equal(ya, yb) for (xa, ya), (xb, yb) in zip(a, b))


def test_pipeline_train_and_eval_shapes_and_normalization(jpeg_shards):
    p = Pipeline(input_size=(16, 16), mean=(0.5, 0.5, 0.5), std=(0.25, 0.25, 0.25), train=AUG)
    s = ShardSet(jpeg_shards, pipeline=p)
    assert s.input_size == (16, 16) and s.channels == 3
    x, y = next(s.batches("train", 8, shuffle=True))
    assert x.shape == (8, 3, 16, 16) and x.dtype == torch.float32 and y.dtype == torch.int64
    xe, _ = s.fixed_batch("test", 4)  # eval transform: resize + center crop, normalized by the pipeline
    assert xe.shape == (4, 3, 16, 16) and xe.min() >= -2.0 - 1e-6 and xe.max() <= 2.0 + 1e-6
    assert torch.equal(xe, s.fixed_batch("test", 4)[0])
    # Not augmented: the eval transform is deterministic whatever the seed.
    assert _same(list(s.batches("train", 6, seed=1, augment=False)), list(s.batches("train", 6, seed=2, augment=False)))
    # 1-channel data: L mode, one mean/std, timm's RandAugment on grayscale PIL images.
    g = Pipeline(input_size=(12, 12), channels=1, mean=(0.5,), std=(0.5,), train=AUG)
    xg, _ = next(ShardSet(jpeg_shards, pipeline=g).batches("train", 18, shuffle=True))
    assert xg.shape == (18, 1, 12, 12) and xg.min() >= -1 - 1e-6 and xg.max() <= 1 + 1e-6
    with pytest.raises(ValueError, match="mean and std"):
        Pipeline(input_size=(4, 4), channels=1)


def test_augmentation_is_seeded_per_sample_the_same_with_workers_and_when_resumed(jpeg_shards):
    p = Pipeline(input_size=(16, 16), train=AUG)
    kw = dict(seed=3, epoch=1, shuffle=True)
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    here = list(ShardSet(jpeg_shards, pipeline=p).batches("train", 4, **kw))
    assert torch.equal(torch.rand(3), before), "the loader must not move the training loop's generator"
    procs = list(ShardSet(jpeg_shards, pipeline=p, workers=2).batches("train", 4, **kw))
    assert _same(here, procs) and len(here) == 5
    assert _same(here[2:], list(ShardSet(jpeg_shards, pipeline=p, workers=2).batches("train", 4, skip_batches=2, **kw)))
    assert _same(here, list(ShardSet(jpeg_shards, pipeline=p, prefetch=2).batches("train", 4, **kw)))
    other = list(ShardSet(jpeg_shards, pipeline=p).batches("train", 4, seed=3, epoch=2, shuffle=True))
    assert not torch.equal(here[0][0], other[0][0])
    assert not multiprocessing.active_children()


def test_worker_processes_stop_with_the_iterator(jpeg_shards):
    p = Pipeline(input_size=(8, 8))
    it = ShardSet(jpeg_shards, pipeline=p, workers=2).batches("train", 2, shuffle=True)
    next(it)
    assert multiprocessing.active_children()
    it.close()
    assert not multiprocessing.active_children()
    it = ShardSet(jpeg_shards, pipeline=p, workers=2).batches("train", 2, shuffle=True)
    next(it)
    del it
    assert not multiprocessing.active_children()


def test_a_corrupt_sample_in_a_worker_names_the_shard_sample_and_file(folder, tmp_path):
    good = (folder / "train" / "cat" / "0.jpg").read_bytes()
    (folder / "train" / "cat" / "0.jpg").write_bytes(good[: len(good) // 2])
    out = tmp_path / "s"
    spec = {"source": "imagefolder", "path": str(folder)}
    with pytest.raises(DataError):  # checked when written ...
        write_shards("f", spec, out, samples_per_shard=5, workers=1)
    # ... so to see the loader's message, write a good file's shards and corrupt a sample in the tar.
    (folder / "train" / "cat" / "0.jpg").write_bytes(good)
    write_shards("f", spec, out, samples_per_shard=5, workers=1)
    shard = next(p for p in sorted(out.glob("train-*.tar")) if good in p.read_bytes())
    data = shard.read_bytes()
    start = data.index(good)
    broken = data[:start] + good[:200] + b"\0" * (len(good) - 200) + data[start + len(good):]
    shard.write_bytes(broken)
    # As if written so (by another tool): the manifest vouches for the shard, the sample is broken.
    from linvit.io import file_sha256
    info = json.loads((out / MANIFEST).read_text())
    for entry in info["splits"]["train"]["shards"]:
        if entry["name"] == shard.name:
            entry["sha256"] = file_sha256(shard)
    (out / MANIFEST).write_text(json.dumps(info))
    s = ShardSet(out, pipeline=Pipeline(input_size=(8, 8)), workers=2)
    with pytest.raises(DataError) as err:
        for _ in s.batches("train", 6):
            pass
    msg = str(err.value)
    assert "\n" not in msg and shard.name in msg and "sample train-" in msg and "train/cat/0.jpg" in msg
    assert not multiprocessing.active_children()


def test_pipeline_from_a_pretrained_cfg():
    cfg = {"input_size": (3, 224, 224), "mean": (0.485, 0.456, 0.406), "std": (0.229, 0.224, 0.225),
           "interpolation": "bicubic", "crop_pct": 0.9}
    p = Pipeline.from_pretrained_cfg(cfg, train={"auto_augment": "rand-m9-mstd0.5-inc1"})
    assert p.input_size == (224, 224) and p.crop_pct == 0.9 and p.channels == 3
    g = Pipeline.from_pretrained_cfg(cfg, channels=1, input_size=(32, 32))
    assert g.mean == (pytest.approx(np.mean(cfg["mean"])),) and g.input_size == (32, 32)
    assert pickle.loads(pickle.dumps(p)) == p


# ----------------------------------------------------------------------------- make_imagefolder


def test_make_imagefolder_from_digits(tmp_path):
    out = tmp_path / "mini"
    spec = {"source": "digits"}
    make_imagefolder(spec, out, size=32, per_class_train=3, per_class_test=2, seed=1)
    classes = sorted(p.name for p in (out / "train").iterdir())
    assert classes == [f"{i:02d}_{i}" for i in range(10)]
    files = sorted((out / "train").rglob("*.jpg"))
    assert len(files) == 30 and len(list((out / "test").rglob("*.jpg"))) == 20
    with Image.open(files[0]) as im:
        assert im.format == "JPEG" and im.mode == "RGB" and im.size == (32, 32)
    snapshot = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    mtimes = {p: p.stat().st_mtime_ns for p in snapshot}
    make_imagefolder(spec, out, size=32, per_class_train=3, per_class_test=2, seed=1)  # done: untouched
    assert {p: p.stat().st_mtime_ns for p in snapshot} == mtimes
    other = tmp_path / "again"
    make_imagefolder(spec, other, size=32, per_class_train=3, per_class_test=2, seed=1)
    assert {p.relative_to(other): p.read_bytes() for p in other.rglob("*") if p.is_file()} == \
        {p.relative_to(out): b for p, b in snapshot.items()}
    assert json.loads((out / MARKER).read_text())["size"] == 32
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    raw = load_raw("m", {"source": "imagefolder", "path": str(out)})
    assert raw.classes == classes
    (tmp_path / "theirs").mkdir()
    (tmp_path / "theirs" / "x").write_text("x")
    with pytest.raises(DataError, match="not made by make_imagefolder"):
        make_imagefolder(spec, tmp_path / "theirs", size=32, per_class_train=3, per_class_test=2)


@pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist").is_dir(), reason="dataset-fashion-mnist not installed")
def test_make_imagefolder_from_fashion_mnist_names_the_classes(tmp_path):
    out = make_imagefolder({"source": "fashion_mnist"}, tmp_path / "fm", size=40, per_class_train=2, per_class_test=1)
    names = sorted(p.name for p in (out / "train").iterdir())
    assert names[0] == "00_T-shirt_top" and names[9] == "09_Ankle_boot"
    info = write_shards("fm", {"source": "imagefolder", "path": str(out)}, tmp_path / "s", workers=1)
    assert info["image_size"] == [40, 40] and info["channels"] == 3 and info["num_classes"] == 10
