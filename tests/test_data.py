"""linvit.data on small real data: sources, shard writing, and the webdataset loader."""

from __future__ import annotations

import gzip
import io
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from linvit.data import MANIFEST, DataError, MissingDataError, ShardSet, load_raw, write_shards
from linvit.data import sources

from conftest import patient

SYNTH = {"source": "synthetic", "num_classes": 4, "train_samples": 256, "test_samples": 96}


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("synth")
    write_shards("synth", SYNTH, out, seed=3, samples_per_shard=100)
    return out


def _to_uint8(shardset: ShardSet, x: torch.Tensor) -> np.ndarray:
    """Undo the loader's normalization: back to the uint8 pixels stored in the PNGs."""
    mean = torch.tensor(shardset.mean).view(1, -1, 1, 1)
    std = torch.tensor(shardset.std).view(1, -1, 1, 1)
    return ((x * std + mean) * 255).round().clamp(0, 255).to(torch.uint8).numpy()


def _as_multiset(images: np.ndarray, labels: np.ndarray) -> list[tuple[int, bytes]]:
    return sorted((int(label), np.ascontiguousarray(img).tobytes()) for img, label in zip(images, labels))


def _assert_round_trip(shard_dir: Path, raw) -> None:
    s = ShardSet(shard_dir)
    for split, (images, labels) in raw.splits.items():
        xs, ys = zip(*s.batches(split, 64))
        x, y = torch.cat(xs), torch.cat(ys)
        assert x.dtype == torch.float32 and y.dtype == torch.int64
        assert len(y) == s.num_samples(split) == len(labels)
        assert sum(sh["samples"] for sh in s.info["splits"][split]["shards"]) == len(labels)
        got = _to_uint8(s, x)
        stored = images[:, None] if images.ndim == 3 else images.transpose(0, 3, 1, 2)
        assert _as_multiset(got, y.numpy()) == _as_multiset(stored, labels)


# ----------------------------------------------------------------------------- sources


def test_unknown_source_names_it_and_the_known_ones():
    with pytest.raises(ValueError, match=r"'nope'.*digits.*synthetic"):
        load_raw("x", {"source": "nope"})


def test_synthetic_is_deterministic_and_learnable():
    a, b = load_raw("s", SYNTH), load_raw("s", SYNTH)
    assert all(np.array_equal(a.splits[k][0], b.splits[k][0]) for k in a.splits)
    (xtr, ytr), (xte, yte) = a.splits["train"], a.splits["test"]
    assert xtr.shape == (256, 28, 28) and xtr.dtype == np.uint8 and set(ytr) == {0, 1, 2, 3}
    # Nearest class mean, the simplest learner, must be far above chance (25%).
    centroids = np.stack([xtr[ytr == c].reshape(-1, 784).mean(0) for c in range(4)])
    pred = ((xte.reshape(-1, 1, 784) - centroids[None]) ** 2).sum(-1).argmin(1)
    assert (pred == yte).mean() > 0.9


def test_digits_is_28x28_uint8_with_a_stratified_split():
    raw = load_raw("digits", {"source": "digits"})
    (xtr, ytr), (xte, yte) = raw.splits["train"], raw.splits["test"]
    assert xtr.shape[1:] == (28, 28) and xtr.dtype == np.uint8 and xtr.max() > 200
    assert len(xtr) + len(xte) == 1797 and abs(len(xte) / 1797 - 0.2) < 0.01
    assert raw.classes == [str(i) for i in range(10)]
    np.testing.assert_allclose(np.bincount(yte) / len(yte), np.bincount(ytr) / len(ytr), atol=0.01)


def _write_idx(path: Path, array: np.ndarray) -> None:
    code = {np.dtype(np.uint8): 0x08, np.dtype(np.int32): 0x0C}[array.dtype]
    header = bytes([0, 0, code, array.ndim]) + np.array(array.shape, ">u4").tobytes()
    data = header + array.astype(array.dtype.newbyteorder(">")).tobytes()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)


@pytest.fixture
def idx_dir(tmp_path) -> tuple[Path, dict]:
    rng = np.random.default_rng(0)
    arrays = {"train": (rng.integers(0, 256, (30, 28, 28), dtype=np.uint8), rng.integers(0, 10, 30).astype(np.uint8)),
              "test": (rng.integers(0, 256, (12, 28, 28), dtype=np.uint8), rng.integers(0, 10, 12).astype(np.uint8))}
    d = tmp_path / "idx"
    d.mkdir()
    # Mix compressed and plain files: both must be found.
    _write_idx(d / "train-images-idx3-ubyte.gz", arrays["train"][0])
    _write_idx(d / "train-labels-idx1-ubyte", arrays["train"][1])
    _write_idx(d / "t10k-images-idx3-ubyte", arrays["test"][0])
    _write_idx(d / "t10k-labels-idx1-ubyte.gz", arrays["test"][1])
    return d, arrays


def test_idx_source_round_trips_arrays(idx_dir):
    d, arrays = idx_dir
    raw = load_raw("mine", {"source": "idx", "path": str(d)})
    for split, (x, y) in arrays.items():
        np.testing.assert_array_equal(raw.splits[split][0], x)
        np.testing.assert_array_equal(raw.splits[split][1], y)
        assert raw.splits[split][1].dtype == np.int64
    assert raw.classes == [str(i) for i in range(int(max(arrays["train"][1].max(), arrays["test"][1].max())) + 1)]


def test_fashion_mnist_from_path_has_its_class_names(idx_dir):
    d, arrays = idx_dir
    raw = load_raw("fm", {"source": "fashion_mnist", "path": str(d)})
    np.testing.assert_array_equal(raw.splits["test"][0], arrays["test"][0])
    assert raw.classes[0] == "T-shirt/top" and len(raw.classes) == 10


def test_malformed_idx_names_the_file(idx_dir):
    d, _ = idx_dir
    bad = d / "t10k-images-idx3-ubyte"
    bad.write_bytes(b"\x01\x02" + bad.read_bytes()[2:])
    with pytest.raises(DataError, match="t10k-images-idx3-ubyte.*magic"):
        load_raw("mine", {"source": "idx", "path": str(d)})
    bad.write_bytes(bytes([0, 0, 8, 3]) + np.array([12, 28, 28], ">u4").tobytes() + b"\0" * 100)
    with pytest.raises(DataError, match="t10k-images-idx3-ubyte.*bytes"):
        load_raw("mine", {"source": "idx", "path": str(d)})


def test_fashion_mnist_wrong_explicit_path_names_the_key(tmp_path):
    with pytest.raises(MissingDataError, match="'path'.*train-images-idx3-ubyte"):
        load_raw("fm", {"source": "fashion_mnist", "path": str(tmp_path)})


@pytest.fixture
def no_system_fashion_mnist(monkeypatch, tmp_path):
    monkeypatch.setattr(sources, "FASHION_MNIST_SYSTEM_DIR", tmp_path / "not-installed")


def test_fashion_mnist_error_names_all_three_ways(no_system_fashion_mnist, monkeypatch, tmp_path):
    # A real urllib failure: a file:// URL to a directory that does not exist.
    monkeypatch.setattr(sources, "FASHION_MNIST_URL", (tmp_path / "offline").as_uri() + "/")
    with pytest.raises(FileNotFoundError) as err:
        load_raw("fm", {"source": "fashion_mnist", "cache": str(tmp_path / "cache")})
    msg = str(err.value)
    assert "\n" not in msg
    assert "'path'" in msg and "apt-get install dataset-fashion-mnist" in msg
    assert "offline/train-images-idx3-ubyte.gz" in msg and "failed" in msg
    assert not any((tmp_path / "cache").glob("*")), "a failed download must leave no partial file"


def test_fashion_mnist_download_failure_reason_is_reported(no_system_fashion_mnist, monkeypatch, tmp_path):
    def offline(url, dest, timeout=0):
        raise TimeoutError("timed out")

    monkeypatch.setattr(sources, "fetch_url", offline)
    with pytest.raises(MissingDataError, match=r"fashion-mnist\.s3.*timed out"):
        load_raw("fm", {"source": "fashion_mnist", "cache": str(tmp_path / "cache")})


def test_fashion_mnist_downloads_into_the_cache(no_system_fashion_mnist, monkeypatch, tmp_path, idx_dir):
    d, arrays = idx_dir
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    for base in sources.IDX_FILES.values():
        src = d / base if (d / base).exists() else d / f"{base}.gz"
        data = src.read_bytes()
        (mirror / f"{base}.gz").write_bytes(data if src.suffix == ".gz" else gzip.compress(data))
    monkeypatch.setattr(sources, "FASHION_MNIST_URL", mirror.as_uri() + "/")
    cache = tmp_path / "cache"
    raw = load_raw("fm", {"source": "fashion_mnist", "cache": str(cache)})
    np.testing.assert_array_equal(raw.splits["train"][0], arrays["train"][0])
    assert sorted(p.name for p in cache.iterdir()) == sorted(f"{b}.gz" for b in sources.IDX_FILES.values())


@pytest.mark.skipif(not sources.FASHION_MNIST_SYSTEM_DIR.is_dir(), reason="dataset-fashion-mnist not installed")
def test_real_fashion_mnist_from_the_system_directory():
    raw = load_raw("fashion_mnist", {"source": "fashion_mnist"})
    assert raw.splits["train"][0].shape == (60000, 28, 28) and len(raw.splits["test"][1]) == 10000
    assert len(raw.classes) == 10 and set(np.unique(raw.splits["train"][1])) == set(range(10))


def _png(path: Path, size: tuple[int, int], value: int, mode: str = "L") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fill = value if mode == "L" else (value, 255 - value, 7)
    Image.new(mode, size, fill).save(path)


def test_imagefolder_reads_sorted_classes(tmp_path):
    for split, n in (("train", 3), ("test", 2)):
        for c, cls in enumerate(["dog", "cat"]):
            for i in range(n):
                _png(tmp_path / split / cls / f"{i}.png", (6, 5), 10 * c + i, mode="RGB")
    raw = load_raw("f", {"source": "imagefolder", "path": str(tmp_path)})
    assert raw.classes == ["cat", "dog"] and raw.channels == 3
    files = raw.splits["train"]
    assert [rel for _, rel, _ in files][:2] == ["train/cat/0.png", "train/cat/1.png"]
    assert [label for _, _, label in files] == [0, 0, 0, 1, 1, 1]
    assert len(raw.splits["test"]) == 4
    assert load_raw("f", {"source": "imagefolder", "path": str(tmp_path), "channels": 1}).channels == 1


def test_imagefolder_errors_name_the_problem(tmp_path):
    _png(tmp_path / "train" / "a" / "0.png", (4, 4), 1)
    _png(tmp_path / "test" / "b" / "0.png", (4, 4), 1)
    with pytest.raises(DataError, match=r"test.*\['b'\].*\['a'\]"):
        load_raw("f", {"source": "imagefolder", "path": str(tmp_path)})


# ----------------------------------------------------------------------------- shards


def test_synthetic_shards_round_trip(synth_dir):
    info = json.loads((synth_dir / MANIFEST).read_text())
    assert [s["samples"] for s in info["splits"]["train"]["shards"]] == [100, 100, 56]
    assert [s["name"] for s in info["splits"]["test"]["shards"]] == ["test-0000.tar"]
    assert info["num_classes"] == 4 and info["image_size"] == [28, 28] and info["channels"] == 1
    _assert_round_trip(synth_dir, load_raw("synth", SYNTH))


def test_rgb_shards_round_trip_with_per_channel_stats(tmp_path):
    spec = dict(SYNTH, channels=3, train_samples=40, test_samples=20)
    info = write_shards("rgb", spec, tmp_path, samples_per_shard=16)
    assert info["channels"] == 3 and len(info["mean"]) == 3 and len(info["splits"]["train"]["shards"]) == 3
    raw = load_raw("rgb", spec)
    _assert_round_trip(tmp_path, raw)
    pixels = raw.splits["train"][0].reshape(-1, 3) / 255.0
    np.testing.assert_allclose(info["mean"], pixels.mean(0), rtol=1e-9)
    np.testing.assert_allclose(info["std"], pixels.std(0), rtol=1e-9)


def test_digits_shards_round_trip(tmp_path):
    info = write_shards("digits", {"source": "digits"}, tmp_path, samples_per_shard=500)
    assert len(info["splits"]["train"]["shards"]) == 3 and info["splits"]["test"]["samples"] == 360
    _assert_round_trip(tmp_path, load_raw("digits", {"source": "digits"}))


def test_manifest_mean_and_std_are_those_of_the_train_pixels(synth_dir):
    info = json.loads((synth_dir / MANIFEST).read_text())
    train = load_raw("synth", SYNTH).splits["train"][0] / 255.0
    assert info["mean"] == pytest.approx([train.mean()], rel=1e-9)
    assert info["std"] == pytest.approx([train.std()], rel=1e-9)
    # Normalized train batches then have mean ~0 and std ~1.
    x = torch.cat([x for x, _ in ShardSet(synth_dir).batches("train", 128)])
    assert abs(x.mean().item()) < 1e-4 and abs(x.std().item() - 1) < 1e-3


def test_writing_is_deterministic_atomic_and_leaves_other_files(synth_dir, tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    first = write_shards("synth", SYNTH, tmp_path, seed=3, samples_per_shard=100)
    again = write_shards("synth", SYNTH, tmp_path, seed=3, samples_per_shard=100)
    assert first == again == json.loads((synth_dir / MANIFEST).read_text())
    for shard in first["splits"]["train"]["shards"]:
        assert (tmp_path / shard["name"]).read_bytes() == (synth_dir / shard["name"]).read_bytes()
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "temporary files left behind"
    other = write_shards("synth", SYNTH, tmp_path / "seed4", seed=4, samples_per_shard=100)
    assert other["splits"]["train"]["shards"][0]["sha256"] != first["splits"]["train"]["shards"][0]["sha256"]


def test_a_swap_killed_between_its_two_renames_is_completed_by_the_next_run(synth_dir, tmp_path):
    # The swap renames out_dir to .<name>.old, then the new folder to out_dir: killed in between,
    # out_dir is missing, and the next run puts the old folder back before it writes.
    out = tmp_path / "shards"
    first = write_shards("synth", SYNTH, out, seed=3, samples_per_shard=100)
    out.rename(tmp_path / ".shards.old")
    assert write_shards("synth", SYNTH, out, seed=3, samples_per_shard=100) == first
    assert json.loads((out / MANIFEST).read_text()) == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shards"]  # no .old or .partial folder left


# ----------------------------------------------------------------------------- loader


def _all(it) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return list(it)


def _same(a, b) -> bool:
    return len(a) == len(b) and all(torch.equal(xa, xb) and torch.equal(ya, yb) for (xa, ya), (xb, yb) in zip(a, b))


def test_shuffle_is_seeded_by_seed_and_epoch(synth_dir):
    s = ShardSet(synth_dir)
    a = _all(s.batches("train", 32, seed=1, epoch=0, shuffle=True))
    assert _same(a, _all(s.batches("train", 32, seed=1, epoch=0, shuffle=True)))
    b = _all(s.batches("train", 32, seed=1, epoch=1, shuffle=True))
    c = _all(s.batches("train", 32, seed=2, epoch=0, shuffle=True))
    assert not torch.equal(a[0][1], b[0][1]) and not torch.equal(a[0][1], c[0][1])
    # Different order, same samples.
    assert sorted(torch.cat([y for _, y in a]).tolist()) == sorted(torch.cat([y for _, y in b]).tolist())
    # Shuffling mixes across shards: the first batch is not just the first shard's samples.
    plain = torch.cat([x for x, _ in s.batches("train", 256)])
    first_shard = {t.numpy().tobytes() for t in plain[:100]}
    assert sum(t.numpy().tobytes() in first_shard for t in a[0][0]) < 32


def test_skip_batches_resumes_exactly_where_the_epoch_was(synth_dir):
    s = ShardSet(synth_dir)
    for drop_last in (False, True):
        full = _all(s.batches("train", 24, seed=5, epoch=2, shuffle=True, drop_last=drop_last))
        resumed = _all(s.batches("train", 24, seed=5, epoch=2, shuffle=True, drop_last=drop_last, skip_batches=3))
        assert _same(full[3:], resumed)
    assert len(full) == s.steps_per_epoch("train", 24) == 256 // 24
    assert len(_all(s.batches("train", 24))) == 11  # the last partial batch is kept unless drop_last


def test_limit_and_fixed_batch_take_the_first_samples_in_manifest_order(synth_dir):
    s = ShardSet(synth_dir)
    everything = torch.cat([y for _, y in s.batches("test", 50)])
    limited = _all(s.batches("test", 16, limit=40))
    assert [len(y) for _, y in limited] == [16, 16, 8]
    assert torch.equal(torch.cat([y for _, y in limited]), everything[:40])
    x, y = s.fixed_batch("test", 10)
    assert x.shape == (10, 1, 28, 28) and torch.equal(y, everything[:10])
    with pytest.raises(DataError, match="'val'"):
        s.num_samples("val")


def _copy(src: Path, dst: Path) -> Path:
    dst.mkdir()
    for p in src.iterdir():
        if p.is_file():  # not _progress/, the writer's records
            (dst / p.name).write_bytes(p.read_bytes())
    return dst


def test_corrupt_shard_is_named_at_open_and_while_reading(synth_dir, tmp_path):
    d = _copy(synth_dir, tmp_path / "d")
    shard = d / "train-0001.tar"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside some sample's PNG bytes: only the hash can tell
    shard.write_bytes(bytes(data))
    with pytest.raises(DataError, match="train-0001.tar"):
        ShardSet(d)
    with pytest.raises(DataError, match="train-0001.tar"):
        _all(ShardSet(d, verify=False).batches("train", 32))
    shard.write_bytes(bytes(data[:5000]))  # truncated
    with pytest.raises(DataError, match="train-0001.tar"):
        _all(ShardSet(d, verify=False).batches("train", 32))
    shard.unlink()
    with pytest.raises(FileNotFoundError, match="train-0001.tar"):
        ShardSet(d)
    with pytest.raises(MissingDataError, match="train-0001.tar"):
        _all(ShardSet(d, verify=False).batches("train", 32))


def test_missing_or_corrupt_manifest_is_named(synth_dir, tmp_path):
    with pytest.raises(FileNotFoundError, match=r"_info\.json"):
        ShardSet(tmp_path)
    d = _copy(synth_dir, tmp_path / "d")
    (d / MANIFEST).write_text('{"dataset": "synth", ')
    with pytest.raises(DataError, match=r"_info\.json.*corrupt"):
        ShardSet(d)
    (d / MANIFEST).write_text('{"dataset": "synth"}')
    with pytest.raises(DataError, match=r"_info\.json.*'classes'"):
        ShardSet(d)


# ----------------------------------------------------------------------------- faults named


def test_an_empty_imagefolder_class_names_the_folder(tmp_path):
    for split in ("train", "test"):
        for cls in ("a", "b"):
            _png(tmp_path / split / cls / "0.png", (4, 4), 1)
    (tmp_path / "train" / "b" / "0.png").unlink()
    with pytest.raises(DataError, match=r"train/b.*no images"):
        load_raw("f", {"source": "imagefolder", "path": str(tmp_path)})


def test_a_label_outside_the_classes_names_the_shard_and_label(synth_dir, tmp_path):
    d = _copy(synth_dir, tmp_path / "d")
    info = json.loads((d / MANIFEST).read_text())
    info.update(classes=["0", "1"], num_classes=2)  # the shards hold labels 0..3
    (d / MANIFEST).write_text(json.dumps(info))
    with pytest.raises(DataError, match=r"test-0000\.tar.*label [23]\b.*0\.\.1"):
        _all(ShardSet(d).batches("test", 32))


def test_stale_temporary_files_of_a_killed_writer_are_removed(tmp_path):
    stale = [tmp_path / ".train-0000.tar.x8y9z0.tmp", tmp_path / f".{MANIFEST}.abcdef.tmp"]
    for path in stale:
        path.write_bytes(b"half")
    (tmp_path / "keep.tmp").write_text("mine")
    write_shards("synth", dict(SYNTH, train_samples=20, test_samples=10), tmp_path, samples_per_shard=100)
    assert not [p for p in stale if p.exists()]
    assert (tmp_path / "keep.tmp").read_text() == "mine"


def test_ranks_split_each_global_batch_into_equal_shares(synth_dir):
    # torchrun's ranks: each gets its contiguous share of every global batch, the same number of
    # batches, and together exactly the batches one process gets (resumed mid-epoch too).
    s = ShardSet(synth_dir)
    for skip in (0, 2):
        kw = dict(seed=4, epoch=1, shuffle=True, drop_last=True, skip_batches=skip)
        whole = _all(s.batches("train", 32, **kw))
        shares = [_all(s.batches("train", 32, rank=r, ranks=2, **kw)) for r in range(2)]
        assert len(shares[0]) == len(shares[1]) == len(whole) == s.steps_per_epoch("train", 32) - skip
        for (x, y), (x0, y0), (x1, y1) in zip(whole, *shares):
            assert len(y0) == len(y1) == 16
            assert torch.equal(torch.cat([x0, x1]), x) and torch.equal(torch.cat([y0, y1]), y)
    # Evaluation keeps the partial last batch: the shares still add up to the split, none is empty.
    parts = [_all(s.batches("test", 40, rank=r, ranks=3)) for r in range(3)]
    assert sum(len(y) for part in parts for _, y in part) == s.num_samples("test")
    assert all(len(y) > 0 for part in parts for _, y in part)
    with pytest.raises(DataError, match="rank 2 is not one of 2 ranks"):
        next(s.batches("train", 32, rank=2, ranks=2))


def test_prefetch_gives_the_same_batches_stops_early_and_raises_in_order(synth_dir, tmp_path):
    import multiprocessing
    import shutil

    plain = _all(ShardSet(synth_dir).batches("train", 32, seed=1, shuffle=True))
    ahead = ShardSet(synth_dir, workers=2, prefetch=2)
    got = _all(ahead.batches("train", 32, seed=1, shuffle=True))
    assert _same(plain, got)
    x, _ = got[0]
    x.add_(1.0)  # the batches are the consumer's own, writable tensors
    # A consumer that stops after one batch (an epoch's last step) ends the loader process.
    batches = ahead.batches("train", 32, seed=1, shuffle=True)
    next(batches)
    assert [p.name for p in multiprocessing.active_children()] == ["linvit-loader"]
    batches.close()
    assert multiprocessing.active_children() == []
    # An error in the loader process reaches the consumer after the batches before it.
    broken = tmp_path / "broken"
    shutil.copytree(synth_dir, broken)
    shard = broken / "train-0001.tar"
    shard.write_bytes(shard.read_bytes()[:5000])
    got = []
    with pytest.raises(DataError, match=r"train-0001\.tar: corrupt shard"):
        # cache_bytes=0: unshuffled batches through the stream (and its thread), not the decoded cache.
        for batch in ShardSet(broken, verify=False, prefetch=2, cache_bytes=0).batches("train", 10):
            got.append(batch)
    assert _same(got, _all(ShardSet(synth_dir).batches("train", 10))[:len(got)]) and got


def test_a_loader_process_killed_is_an_error_naming_the_shards(synth_dir):
    import multiprocessing
    import os
    import signal

    batches = ShardSet(synth_dir, prefetch=1).batches("train", 8, seed=0, shuffle=True)
    next(batches)
    (child,) = multiprocessing.active_children()
    os.kill(child.pid, signal.SIGKILL)  # as the kernel's OOM killer would
    with pytest.raises(DataError, match=f"{synth_dir}: the loader process ended without a word .exit code -9"):
        for _ in batches:  # the batches already sent, then the error
            pass


def test_a_loader_process_ends_when_its_parent_is_killed(synth_dir, tmp_path):
    import os
    import subprocess
    import sys
    import time

    script = tmp_path / "parent.py"
    script.write_text(
        "import multiprocessing, os, sys\n"
        "from linvit.data import ShardSet\n"
        f"batches = ShardSet({str(synth_dir)!r}, prefetch=1).batches('train', 2, seed=0, shuffle=True)\n"
        "next(batches)\n"
        "print(multiprocessing.active_children()[0].pid, flush=True)\n"
        "os.kill(os.getpid(), 9)\n")
    log = tmp_path / "pid"
    with log.open("w") as f:  # a file, not a pipe: a child left behind would hold a pipe open
        subprocess.run([sys.executable, str(script)], stdout=f, timeout=patient(120))
    pid = int(log.read_text().split()[0])
    wait = patient(30)
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return  # gone (reaped by init)
        if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
            return  # exited, waiting to be reaped
        time.sleep(0.1)
    pytest.fail(f"the loader process {pid} outlived its killed parent by {wait:.0f} s")


def test_unshuffled_batches_are_decoded_once_and_equal_the_stream(synth_dir, tmp_path):
    import shutil

    d = tmp_path / "d"
    shutil.copytree(synth_dir, d)
    cached, streamed = ShardSet(d), ShardSet(d, cache_bytes=0)
    n = cached.num_samples("test")
    requests = [dict(batch_size=7, limit=5), dict(batch_size=10), dict(batch_size=9, limit=20, skip_batches=1),
                dict(batch_size=6, drop_last=True), dict(batch_size=n + 5)]
    for kw in requests:  # in this order: a short request first, then the cache grows
        assert _same(_all(cached.batches("test", **kw)), _all(streamed.batches("test", **kw))), kw
    # Decoded once: with the shards gone, the cached split still gives the same batches.
    want = _all(streamed.batches("test", 8))
    for shard in d.glob("test-*.tar"):
        shard.unlink()
    assert _same(_all(cached.batches("test", 8)), want)
    # A batch changed in place by its consumer does not change the cache.
    x, _ = next(cached.batches("test", 8))
    x.zero_()
    assert _same(_all(cached.batches("test", 8)), want)
    # Shuffled (training) batches never come from the cache.
    with pytest.raises(MissingDataError, match="test-0000.tar"):
        _all(cached.batches("test", 8, shuffle=True))


@pytest.mark.parametrize("fmt", ["USTAR_FORMAT", "GNU_FORMAT", "PAX_FORMAT"])
def test_tar_reader_gives_the_regular_files_tarfile_gives(tmp_path, fmt):
    import io
    import tarfile

    from linvit.data.loader import _TarReader

    files = {"a/x.png": b"\x89PNG" * 100, "b" * 90 + "/" + "c" * 60 + ".cls": b"3", "é.json": b"{}",
             "__meta__": b"skipped, as webdataset skips it", "empty.txt": b""}
    path = tmp_path / "t.tar"
    with tarfile.open(path, "w", format=getattr(tarfile, fmt)) as tar:
        folder = tarfile.TarInfo("a")
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)  # a member that is not a regular file
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    with open(path, "rb") as f:
        reader = _TarReader(f)
        got = list(reader.members())
        digest = reader.hexdigest_of_rest()
    assert got == [(n, d) for n, d in files.items() if n != "__meta__"]
    import hashlib
    assert digest == hashlib.sha256(path.read_bytes()).hexdigest()
    broken = bytearray(path.read_bytes())
    broken[600] ^= 0xFF  # inside the second header
    with pytest.raises(DataError, match="checksum"):
        list(_TarReader(io.BytesIO(bytes(broken))).members())


@pytest.mark.parametrize("mode,bits", [("L", 8), ("RGB", 8), ("L", 1), ("P", 8), ("LA", 8), ("RGBA", 8),
                                       ("I;16", 16)])
@pytest.mark.parametrize("channels", [1, 3])
def test_png_pixels_are_the_ones_pil_decodes(mode, bits, channels):
    """The loader decodes 8-bit gray and RGB PNGs with torchvision (no GIL held) and every other
    PNG with PIL: either way a batch gets exactly the pixels PIL gives in the batch's mode."""
    from linvit.data.loader import _decode_png

    rng = np.random.default_rng(bits)
    if mode == "I;16":
        image = Image.fromarray((rng.random((9, 7)) * 65535).astype(np.uint16))
    else:
        image = Image.fromarray((rng.random((9, 7, 3)) * 255).astype(np.uint8), "RGB")
        image = image.convert("1") if bits == 1 else image.convert(mode)
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    target = "L" if channels == 1 else "RGB"
    with Image.open(io.BytesIO(buf.getvalue())) as im:
        expected = np.asarray(im.convert(target))
    fast = _decode_png(buf.getvalue(), channels)
    # The fast path takes exactly the PNGs stored in the batch's own 8-bit mode.
    assert (fast is not None) == (mode == target and bits == 8)
    if fast is not None:
        assert fast.dtype == np.uint8 and np.array_equal(fast, expected)
    sample = {"png": buf.getvalue(), "cls": b"0", "__key__": "k", "__url__": "u.tar"}
    shardset = ShardSet.__new__(ShardSet)  # _decode reads only these attributes
    shardset.channels, shardset.num_classes, shardset.image_size = channels, 2, (9, 7)
    decoded, label = shardset._decode(sample)
    assert label == 0 and np.array_equal(decoded, expected)


def test_a_broken_png_is_named_whichever_decoder_reads_it():
    from linvit.data.loader import _decode_png

    buf = io.BytesIO()
    Image.fromarray(np.zeros((5, 5), np.uint8)).save(buf, format="PNG")
    broken = buf.getvalue()[:40] + b"\0" * 20  # the header intact, the pixel data cut
    assert _decode_png(buf.getvalue(), 1) is not None
    shardset = ShardSet.__new__(ShardSet)
    shardset.channels, shardset.num_classes, shardset.image_size = 1, 2, (5, 5)
    with pytest.raises(DataError, match=r"u\.tar: sample k.*does not decode"):
        shardset._decode({"png": broken, "cls": b"0", "__key__": "k", "__url__": "u.tar"})
