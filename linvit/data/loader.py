"""Read the shards ``shards.py`` wrote: a manifest check, then a seeded webdataset pipeline of batches.

One reader per process on purpose: the same (seed, epoch) gives exactly the same batches, and a
run resumed mid-epoch (``skip_batches``) sees exactly the batches the uninterrupted run would have.
(webdataset's multi-process loading splits the shards between workers and interleaves their
output, which would change the order.) The work is split instead where it costs:

- by rank: under torchrun, every rank reads the same stream and groups it into the same global
  batches; rank r keeps its contiguous share (``rank``/``ranks``) and decodes only that. So every
  rank has the same number of batches, and N ranks train on exactly the batches one process would.
  The cost is that each rank reads (not decodes) the whole stream; on one node the page cache
  serves the repeated reads.
- by worker: ``workers`` > 0 decodes each batch's images in that many threads, in order (the same
  samples in the same order, so the same batches); ``prefetch`` > 0 runs the pipeline in a
  background thread that many batches ahead, and ``pin_memory`` puts them in page-locked memory, so
  a GPU's non-blocking copy does not wait for decoding.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import queue
import random
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
import webdataset as wds
from PIL import Image
from webdataset.tariterators import group_by_keys, tar_file_expander

from linvit.data.shards import MANIFEST
from linvit.data.sources import DataError, MissingDataError
from linvit.io import file_sha256

_REQUIRED_KEYS = ("classes", "num_classes", "image_size", "channels", "mean", "std", "splits")


class ShardSet:
    """One dataset's shard directory: its manifest, and batches read from its shards."""

    def __init__(self, shard_dir: str | Path, *, verify: bool = True, shuffle_buffer: int = 10000,
                 workers: int = 0, prefetch: int = 0, pin_memory: bool = False):
        self.dir = Path(shard_dir)
        self.workers = workers  # decoding threads per batch; 0: decode in the pipeline, one by one
        self.prefetch = prefetch  # batches decoded ahead in a background thread; 0: none
        self.pin_memory = pin_memory
        self.info = _read_manifest(self.dir / MANIFEST)
        self.classes: list[str] = list(self.info["classes"])
        self.num_classes: int = int(self.info["num_classes"])
        self.image_size: tuple[int, int] = tuple(self.info["image_size"])
        self.channels: int = int(self.info["channels"])
        self.mean: list[float] = list(self.info["mean"])
        self.std: list[float] = list(self.info["std"])
        self.shuffle_buffer = shuffle_buffer
        self._mean = torch.tensor(self.mean, dtype=torch.float32).view(1, -1, 1, 1)
        self._std = torch.tensor(self.std, dtype=torch.float32).view(1, -1, 1, 1)
        if verify:
            self.verify()

    def verify(self) -> None:
        """Check every shard the manifest lists exists and has its recorded sha256."""
        for split in self.info["splits"]:
            for shard in self.info["splits"][split]["shards"]:
                path = self.dir / shard["name"]
                if not path.is_file():
                    raise MissingDataError(f"{path}: shard listed in {self.dir / MANIFEST} is missing")
                if file_sha256(path) != shard["sha256"]:
                    raise DataError(f"{path}: sha256 differs from {MANIFEST} (corrupt or rewritten shard)")

    def num_samples(self, split: str) -> int:
        return int(self._split(split)["samples"])

    def steps_per_epoch(self, split: str, batch_size: int) -> int:
        """Full batches per epoch (training drops the last partial batch)."""
        return self.num_samples(split) // batch_size

    def batches(self, split: str, batch_size: int, *, seed: int = 0, epoch: int = 0, shuffle: bool = False,
                drop_last: bool = False, limit: int | None = None, skip_batches: int = 0,
                rank: int = 0, ranks: int = 1) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Batches ``(x, y)``: x float32 (B,C,H,W) normalized with the manifest's mean/std, y int64 (B,).

        shuffle: shard order and a sample buffer, both seeded from (seed, epoch).
        limit: only the first ``limit`` samples of the stream. skip_batches: start at batch k.
        rank, ranks: yield rank's contiguous share of each global batch of ``batch_size``
        (batch_size/ranks samples when it divides; an empty share is not yielded).
        """
        if batch_size < 1:
            raise DataError(f"batch_size must be at least 1, got {batch_size}")
        if not 0 <= rank < ranks:
            raise DataError(f"rank {rank} is not one of {ranks} ranks")
        shards = self._split(split)["shards"]
        urls = [str(self.dir / s["name"]) for s in shards]
        expected = {str(self.dir / s["name"]): (int(s["samples"]), s["sha256"]) for s in shards}
        # String seeds: random.Random hashes them with sha512, the same in every process.
        stages = [wds.SimpleShardList(urls, seed=f"{seed}:{epoch}:shards" if shuffle else None),
                  functools.partial(_read_shards, expected=expected)]
        if shuffle:
            stages.append(wds.shuffle(self.shuffle_buffer, initial=self.shuffle_buffer,
                                      rng=random.Random(f"{seed}:{epoch}:samples")))
        # Skip and limit on the undecoded stream: cheap, and the same samples as slicing the batches.
        stages.append(wds.slice(skip_batches * batch_size, limit))
        # Global batches of undecoded samples; this rank keeps its share and decodes only that.
        own = lambda raw: raw[rank * len(raw) // ranks:(rank + 1) * len(raw) // ranks]
        stages += [wds.batched(batch_size, collation_fn=own, partial=not drop_last), wds.select(len)]
        if self.workers > 0:
            # map keeps the order: the same samples in the same order as decoding one by one.
            pool = ThreadPoolExecutor(self.workers, thread_name_prefix="linvit-decode")
            stages.append(wds.map(lambda raw: self._collate(list(pool.map(self._decode, raw)))))
        else:
            stages.append(wds.map(lambda raw: self._collate([self._decode(s) for s in raw])))
        batches = iter(wds.DataPipeline(*stages))
        return _prefetched(batches, self.prefetch) if self.prefetch > 0 else batches

    def fixed_batch(self, split: str, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first ``n`` samples in manifest shard order, unshuffled (e.g. for attention maps)."""
        if not 1 <= n <= self.num_samples(split):
            raise DataError(f"fixed_batch: n={n} but split {split!r} has {self.num_samples(split)} samples")
        return next(self.batches(split, n, limit=n))

    def _split(self, split: str) -> dict:
        if split not in self.info["splits"]:
            raise DataError(f"{self.dir / MANIFEST}: no split {split!r} (has {', '.join(self.info['splits'])})")
        return self.info["splits"][split]

    def _decode(self, sample: dict) -> tuple[np.ndarray, int]:
        url, key = sample.get("__url__"), sample.get("__key__")
        try:
            with Image.open(io.BytesIO(sample["png"])) as im:
                image = np.asarray(im.convert("L" if self.channels == 1 else "RGB"))
            label = int(sample["cls"])
        except Exception as e:  # PIL raises OSError, SyntaxError or zlib.error on broken PNGs
            raise DataError(f"{url}: sample {key} does not decode ({type(e).__name__}: {e})") from e
        if not 0 <= label < self.num_classes:  # else an IndexError deep in the loss, naming nothing
            raise DataError(f"{url}: sample {key} has label {label}, outside 0..{self.num_classes - 1} "
                            f"({self.num_classes} classes in {self.dir / MANIFEST})")
        if image.shape[:2] != self.image_size:
            raise DataError(f"{url}: sample {key} is {image.shape[:2]}, manifest says {self.image_size}")
        return image, label

    def _collate(self, samples: list[tuple[np.ndarray, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.from_numpy(np.stack([image for image, _ in samples]))
        x = x.unsqueeze(1) if self.channels == 1 else x.permute(0, 3, 1, 2)
        x = (x.float().div_(255.0) - self._mean).div_(self._std).contiguous()
        y = torch.tensor([label for _, label in samples], dtype=torch.int64)
        if self.pin_memory:  # page-locked, so the copy to the GPU can be non-blocking
            x, y = x.pin_memory(), y.pin_memory()
        return x, y


class _Raised:
    def __init__(self, err: BaseException):
        self.err = err


_END = object()


def _prefetched(batches: Iterator, depth: int) -> Iterator:
    """`batches`, computed up to `depth` ahead in a daemon thread; an error there is raised here, in
    order. When the consumer stops early (the end of an epoch's steps), the thread stops too."""
    ready: queue.Queue = queue.Queue(depth)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce():
        try:
            for item in batches:
                if not put(item):
                    return
            put(_END)
        except BaseException as err:  # noqa: BLE001 - re-raised in the consumer
            put(_Raised(err))

    threading.Thread(target=produce, daemon=True, name="linvit-prefetch").start()
    try:
        while True:
            item = ready.get()
            if item is _END:
                return
            if isinstance(item, _Raised):
                raise item.err
            yield item
    finally:
        stop.set()


def _read_manifest(path: Path) -> dict:
    try:
        info = json.loads(path.read_text())
    except FileNotFoundError:
        raise MissingDataError(f"{path}: no shard manifest (shards not written, or writing was interrupted)") from None
    except (OSError, ValueError) as e:  # ValueError covers bad JSON and bad UTF-8
        raise DataError(f"{path}: corrupt shard manifest ({e})") from e
    if not isinstance(info, dict):
        raise DataError(f"{path}: corrupt shard manifest (not a JSON object)")
    for key in _REQUIRED_KEYS:
        if key not in info:
            raise DataError(f"{path}: shard manifest lacks key {key!r}")
    for split, entry in info["splits"].items():
        try:
            consistent = sum(s["samples"] for s in entry["shards"]) == entry["samples"] and all(
                isinstance(s["name"], str) and isinstance(s["sha256"], str) for s in entry["shards"])
        except (KeyError, TypeError) as e:
            raise DataError(f"{path}: split {split!r} entry is malformed ({type(e).__name__}: {e})") from None
        if not consistent:
            raise DataError(f"{path}: split {split!r} shard entries do not add up to {entry['samples']} samples")
    return info


class _HashingReader:
    """A read-only file wrapper that hashes what passes through, so reading also checks the shard."""

    def __init__(self, f):
        self.f = f
        self.digest = hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        data = self.f.read(n)
        self.digest.update(data)
        return data

    def hexdigest_of_rest(self) -> str:
        # tarfile stops at the end-of-archive marker; the padding after it is part of the file too.
        while self.read(1 << 20):
            pass
        return self.digest.hexdigest()


def _read_shards(src: Iterator[dict], expected: dict[str, tuple[int, str]]) -> Iterator[dict]:
    """Pipeline stage: shard URLs in, samples out; a missing, truncated or altered shard raises naming it."""
    for item in src:
        url = item["url"]
        samples, sha256 = expected[url]
        count = 0
        try:
            with open(url, "rb") as f:
                reader = _HashingReader(f)
                for sample in group_by_keys(tar_file_expander([dict(url=url, stream=reader)])):
                    count += 1
                    yield sample
                digest = reader.hexdigest_of_rest()
        except FileNotFoundError:
            raise MissingDataError(f"{url}: shard missing") from None
        except Exception as e:  # tarfile.ReadError, OSError, duplicate names... webdataset appends context to args
            reason = str(e.args[0]).split(" @ ")[0] if e.args else type(e).__name__
            raise DataError(f"{url}: corrupt shard ({reason})") from e
        # tarfile silently stops at a damaged header mid-archive, so count and hash as well.
        if count != samples:
            raise DataError(f"{url}: corrupt shard ({count} samples, manifest says {samples})")
        if digest != sha256:
            raise DataError(f"{url}: corrupt shard (sha256 differs from the manifest)")
