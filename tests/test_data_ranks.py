"""Each rank reads only its share: the order decided on placeholders equals the full stream's, each
rank reads about 1/N of the bytes, and a shard is hashed when written and when first read on a
machine (its stamp), not by every reader (linvit.data.index)."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest
import torch
import webdataset as wds

from linvit.data import DataError, ShardSet, write_shards
from linvit.data import index as shard_index

from conftest import patient

SYNTH = {"source": "synthetic", "num_classes": 4, "train_samples": 256, "test_samples": 96}


@pytest.fixture(scope="module")
def synth_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("synth")
    write_shards("synth", SYNTH, out, seed=3, samples_per_shard=100, workers=1)
    return out


def _copy(src: Path, dst: Path) -> Path:
    """The shards and manifest as new files: no index, no stamp (as if copied from another machine)."""
    dst.mkdir()
    for p in src.iterdir():
        if p.is_file():
            (dst / p.name).write_bytes(p.read_bytes())
    return dst


def _full_stream(s: ShardSet, split, batch_size, *, seed, epoch, shuffle, drop_last, limit, skip_batches,
                 rank, ranks):
    """The batches as the loader made them before issue 49: every sample of every shard read through
    webdataset's own tar reader, shuffled, batched, and rank's share of each batch decoded."""
    urls = [str(s.dir / sh["name"]) for sh in s.info["splits"][split]["shards"]]
    stages = [wds.SimpleShardList(urls, seed=f"{seed}:{epoch}:shards" if shuffle else None), wds.tarfile_to_samples()]
    if shuffle:
        stages.append(wds.shuffle(s.shuffle_buffer, initial=s.shuffle_initial,
                                  rng=random.Random(f"{seed}:{epoch}:samples")))
    own = lambda raw: raw[rank * len(raw) // ranks:(rank + 1) * len(raw) // ranks]  # noqa: E731
    stages += [wds.slice(skip_batches * batch_size, limit),
               wds.batched(batch_size, collation_fn=own, partial=not drop_last), wds.select(len)]
    return [s._collate([s._decode(sample) for sample in raw]) for raw in wds.DataPipeline(*stages)]


@pytest.mark.parametrize("buffer", [40, 10000])
def test_the_placeholder_order_is_the_full_streams_order(synth_dir, buffer):
    # The order is decided on (shard, sample number) placeholders and only the rank's samples are
    # read: the batches must be those of reading every sample, for any seed, epoch, resume point,
    # limit and rank (a buffer smaller than the split exercises the shuffle's refills).
    s = ShardSet(synth_dir, shuffle_buffer=buffer, shuffle_initial=10, cache_bytes=0)
    cases = [dict(seed=0, epoch=0, shuffle=True, drop_last=True, limit=None, skip_batches=0),
             dict(seed=7, epoch=3, shuffle=True, drop_last=False, limit=None, skip_batches=2),
             dict(seed=1, epoch=1, shuffle=True, drop_last=False, limit=70, skip_batches=1),
             dict(seed=0, epoch=0, shuffle=False, drop_last=False, limit=None, skip_batches=1)]
    for case in cases:
        for rank, ranks in ((0, 1), (0, 3), (2, 3)):
            want = _full_stream(s, "train", 24, **case, rank=rank, ranks=ranks)
            got = list(s.batches("train", 24, **case, rank=rank, ranks=ranks))
            assert len(got) == len(want) > 0, (case, rank, ranks)
            for (x, y), (xw, yw) in zip(got, want):
                assert torch.equal(x, xw) and torch.equal(y, yw), (case, rank, ranks)


def test_each_rank_reads_its_share_of_the_bytes(synth_dir):
    # Shards written here are stamped by the writer: opening them hashes nothing.
    one = ShardSet(synth_dir)
    assert one.bytes_read == 0
    kw = dict(seed=2, epoch=1, shuffle=True, drop_last=True)
    batches = list(one.batches("train", 32, **kw))
    whole = one.bytes_read
    shard_bytes = sum((synth_dir / sh["name"]).stat().st_size for sh in one.info["splits"]["train"]["shards"])
    assert 0.8 * shard_bytes < whole <= shard_bytes  # every sample once (not the tar's end padding)
    for ranks in (2, 4):
        shares = []
        for rank in range(ranks):
            s = ShardSet(synth_dir)
            got = list(s.batches("train", 32, **kw, rank=rank, ranks=ranks))
            assert len(got) == len(batches)
            shares.append(s.bytes_read)
        assert sum(shares) == whole
        assert all(abs(b - whole / ranks) < 0.1 * whole / ranks for b in shares), (ranks, shares, whole)


def test_an_unstamped_shard_is_indexed_on_first_read_and_hashed_once(synth_dir, tmp_path):
    d = _copy(synth_dir, tmp_path / "d")
    names = [sh["name"] for sh in json.loads((d / "_info.json").read_text())["splits"]["train"]["shards"]]
    size = {n: (d / n).stat().st_size for n in names}
    first = ShardSet(d, verify=False, cache_bytes=0)
    next(first.batches("train", 8))  # touches train-0000 only
    assert first.bytes_read > size[names[0]]  # the scan (hash and index), then the batch's samples
    assert sorted(p.name for p in (d / "_index").iterdir()) == [f"{names[0]}.json"]
    # A new reader (another rank, the next job) finds the stamps: it hashes only what is new.
    second = ShardSet(d)
    assert second.bytes_read == sum(size.values()) - size[names[0]] + sum(
        (d / sh["name"]).stat().st_size for sh in second.info["splits"]["test"]["shards"])
    assert ShardSet(d).bytes_read == 0
    # A shard touched (its mtime changed) is hashed again, passes, and is stamped again.
    os.utime(d / names[1], ns=(0, (d / names[1]).stat().st_mtime_ns + 10**9))
    assert ShardSet(d).bytes_read == size[names[1]]
    assert ShardSet(d).bytes_read == 0


def test_a_shard_changed_after_its_stamp_is_hashed_again_and_refused(synth_dir, tmp_path):
    d = _copy(synth_dir, tmp_path / "d")
    ShardSet(d)  # stamps every shard
    shard = d / "train-0001.tar"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # the same size: only the hash (or a header's checksum) can tell
    mtime = shard.stat().st_mtime_ns
    shard.write_bytes(bytes(data))
    os.utime(shard, ns=(0, mtime + 10**9))  # (a clock tick apart: a rewrite within one tick keeps the mtime)
    with pytest.raises(DataError, match=r"train-0001\.tar: sha256 differs from _info\.json"):
        ShardSet(d)
    with pytest.raises(DataError, match=r"train-0001\.tar: corrupt shard"):
        list(ShardSet(d, verify=False).batches("train", 32, seed=0, shuffle=True))


def test_an_index_folder_that_cannot_be_written_uses_the_cache(synth_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(shard_index, "CACHE", tmp_path / "cache")
    d = _copy(synth_dir, tmp_path / "d")
    (d / "_index").write_text("not a folder")  # as read-only storage would refuse it
    assert ShardSet(d).bytes_read > 0
    assert len(list((tmp_path / "cache").glob("*-train-0000.tar.json"))) == 1
    assert ShardSet(d).bytes_read == 0


def test_loader_workers_per_rank_are_the_jobs_cpus_over_its_ranks(monkeypatch):
    from linvit.device import loader_workers

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    for name in ("SLURM_CPUS_PER_TASK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # as torchrun sets it: not what decides
    assert loader_workers() == 63  # one process: every CPU it may use, less its own loop
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")
    assert loader_workers() == 7  # 8 ranks on the node share them
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "32")  # Slurm's allocation, where it binds no CPUs
    assert loader_workers() == 3
    monkeypatch.setenv("SLURM_CPUS_PER_TASK", "4")
    assert loader_workers() == 1  # never none


def test_bench_loader_ranks_reads_imagenet_size_jpegs_a_share_per_rank(tmp_path, monkeypatch):
    from linvit import bench_ranks
    from linvit.bench_ranks import bench_loader_ranks, imagenet_like_folder

    folder = imagenet_like_folder(tmp_path / "jpeg", classes=2, per_class_train=3, per_class_test=1)
    from PIL import Image

    sizes = [Image.open(p).size for p in folder.rglob("*.jpg")]
    kb = [p.stat().st_size / 1e3 for p in folder.rglob("*.jpg")]
    assert len(sizes) == 8 and all(350 <= w <= 450 and 300 <= h <= 400 for w, h in sizes)
    assert 70 < sum(kb) / len(kb) < 150  # ImageNet's are about 110 kB
    monkeypatch.setattr(bench_ranks, "_cores", lambda: 3)  # 1.5 cores a rank: the ceiling is 1, not 1.5
    rows = {r["metric"]: r for r in bench_loader_ranks([2], images=30, batch=8)}
    assert rows["ranks_2_bytes_over_share"]["meets"] is True and rows["ranks_2_bytes_over_share"]["value"] > 0.8
    assert rows["one_process_bytes"]["value"] > 20 * 70e3  # 24 images read of 30 (3 batches of 8)
    assert rows["ranks_2_images_per_s_per_rank"]["value"] > 0
    assert rows["cores"]["value"] == 3 and rows["ranks_2_rate_ceiling"]["value"] == 1.0
    assert rows["ranks_2_control_rate_over_one_process"]["value"] > 0  # 2 processes each reading the whole epoch


def test_bench_shards_writes_imagenet_size_jpegs_by_default(monkeypatch):
    from linvit import bench

    monkeypatch.setattr(bench.os, "cpu_count", lambda: 1)  # one write: the in-process, per-core rate
    got = {r["metric"]: r["value"] for r in bench.bench_shards(per_class=2)}
    assert 70 < got["jpeg_kb_mean"] < 150 and got["images_per_s_per_core"] > 0


def _open_and_report(shards, start, results):
    start.wait()
    results.put(ShardSet(shards).bytes_read)


def test_ranks_meeting_an_unstamped_shard_together_hash_it_once(synth_dir, tmp_path):
    import multiprocessing

    d = _copy(synth_dir, tmp_path / "d")
    context = multiprocessing.get_context("fork")
    start, results = context.Barrier(4), context.Queue()
    ranks = [context.Process(target=_open_and_report, args=(d, start, results)) for _ in range(4)]
    for p in ranks:
        p.start()
    read = [results.get(timeout=patient(60)) for _ in ranks]
    for p in ranks:
        p.join()
    assert sum(read) == sum(p.stat().st_size for p in d.glob("*.tar"))  # each shard scanned by one of them


def test_a_rerun_of_the_writer_keeps_stamped_shards_without_hashing_them(tmp_path, monkeypatch):
    from linvit.data import shards

    spec = dict(SYNTH, train_samples=40, test_samples=20)
    write_shards("synth", spec, tmp_path / "s", samples_per_shard=20, workers=1)
    hashed = []
    real = shards.scan  # the writer's one read of a shard: hash and index
    monkeypatch.setattr(shards, "scan", lambda path: hashed.append(Path(path).name) or real(path))
    write_shards("synth", spec, tmp_path / "s", samples_per_shard=20, workers=1)
    assert hashed == []  # every shard kept on its stamp
    shard = tmp_path / "s" / "train-0001.tar"
    os.utime(shard, ns=(0, shard.stat().st_mtime_ns + 10**9))  # touched: its stamp no longer vouches
    write_shards("synth", spec, tmp_path / "s", samples_per_shard=20, workers=1)
    assert hashed == ["train-0001.tar"]
    assert ShardSet(tmp_path / "s").bytes_read == 0  # the kept shards' stamps still stand


def test_a_file_system_without_locks_still_reads(synth_dir, tmp_path, monkeypatch):
    import fcntl

    def refuse(fd, op):
        raise OSError(38, "Function not implemented")  # flock on Lustre mounted noflock

    monkeypatch.setattr(fcntl, "flock", refuse)
    d = _copy(synth_dir, tmp_path / "d")
    assert len(list(ShardSet(d).batches("train", 64, seed=0, shuffle=True))) == 4
