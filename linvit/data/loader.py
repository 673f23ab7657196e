"""Read the shards ``shards.py`` wrote: a manifest check, then a seeded webdataset pipeline of batches.

One reader per process on purpose: the same (seed, epoch) gives exactly the same batches, and a
run resumed mid-epoch (``skip_batches``) sees exactly the batches the uninterrupted run would have.
(webdataset's multi-process loading splits the shards between workers and interleaves their
output, which would change the order.) The work is split instead where it costs:

- by rank: under torchrun, every rank orders the same placeholders, (shard, sample number), into
  the same global batches; rank r keeps its contiguous share (``rank``/``ranks``) and reads (by
  offset, `linvit.data.index`) and decodes only that: about 1/N of the bytes. So every rank has the
  same number of batches, and N ranks train on exactly the batches one process would.
- by worker: ``workers`` > 0 decodes each batch's images in that many threads, in order (the same
  samples in the same order, so the same batches); ``prefetch`` > 0 reads and decodes that many
  batches ahead in a child process forked for the iterator, so the training step never waits on
  the loader's Python for the GIL (with a pipeline: a background thread feeding its worker
  processes), and ``pin_memory`` puts them in page-locked memory, so a GPU's non-blocking copy
  does not wait for decoding.

Two ways to turn a stored image into a tensor:

- no ``pipeline`` (the default): the image is decoded as stored (it must have the manifest's
  ``image_size``) and normalized with the manifest's mean/std; no resizing, no augmentation.
- a `linvit.data.transforms.Pipeline`: each image is decoded in the pipeline's mode (L or RGB)
  and put through timm's train transform (``augment``) or eval transform, which resize, crop,
  augment and normalize. Random augmentation draws from generators seeded per sample from (seed,
  epoch, sample key), so the batches are the same with any number of workers and when resumed.
  With ``workers`` > 0 this runs in that many worker processes (forkserver: safe with torch
  imported; a script that uses them needs the usual ``if __name__ == "__main__":`` guard), each
  taking a contiguous part of every batch, up to two batches ahead; they stop when the iterator
  is finished or dropped. With ``prefetch`` but no ``workers``, one worker process does it (the
  background thread must not reseed the training thread's generators).

Shards of either format (``png``: arrays written losslessly; ``encoded``: original files) are read
the same way; the image is whichever image key a sample has (``png``, ``jpg``, ``webp``, ...).
"""

from __future__ import annotations

import functools
import io
import json
import multiprocessing
import pickle
import queue
import random
import signal
import threading
from collections import deque
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path
from typing import Iterator

import numpy as np
import torch
import webdataset as wds
from PIL import Image

from linvit.data.index import Checked, _read_batches, _placeholders, read_manifest
from linvit.data.index import _TarReader  # noqa: F401 - tests read shards with it
from linvit.data.shards import MANIFEST
from linvit.data.sources import IMAGE_SUFFIXES, DataError, MissingDataError
from linvit.data.transforms import Pipeline, apply, preserved_rng, sample_seed

# The sample keys an image may be stored under (webdataset convention: the file's extension).
IMAGE_KEYS = frozenset({s[1:] for s in IMAGE_SUFFIXES} | {"jpg", "jpeg", "png", "tiff"})
# The PIL format of a sample key, so that decoding tries that plugin only (None: PIL guesses).
_PIL_FORMATS = {"png": ["PNG"], "jpg": ["JPEG"], "jpeg": ["JPEG"], "webp": ["WEBP"], "tiff": ["TIFF"],
                "tif": ["TIFF"], "bmp": ["BMP"], "gif": ["GIF"]}
CACHE_BYTES = 1 << 30  # the default size limit of a split's decoded tensors kept in memory (ShardSet._cached)
CACHE_CHUNK = 256  # samples decoded at a time into that cache
LOOKAHEAD = 2  # batches handed to worker processes ahead of the one being consumed
# A shuffled iterator's first batch waits for this many samples read: a full 10,000-sample buffer
# took 120 ms in Python (1.4% of a 200-step CPU job's training) before every epoch, and a 1-step job
# read 10,000 samples to use 64.
SHUFFLE_INITIAL = 1000


class ShardSet:
    """One dataset's shard directory: its manifest, and batches read from its shards."""

    def __init__(self, shard_dir: str | Path, *, verify: bool = True, shuffle_buffer: int = 10000,
                 shuffle_initial: int = SHUFFLE_INITIAL,
                 workers: int = 0, prefetch: int = 0, pin_memory: bool = False, pipeline: Pipeline | None = None,
                 cache_bytes: int = CACHE_BYTES):
        self.dir = Path(shard_dir)
        self.workers = workers  # per batch: decoding threads, or with a pipeline processes; 0: none
        self.prefetch = prefetch  # batches decoded ahead in a child process (with a pipeline: a thread); 0: none
        self.pin_memory = pin_memory
        self.pipeline = pipeline
        self.info = read_manifest(self.dir / MANIFEST)
        self.format: str = self.info.get("format", "png")
        self.classes: list[str] = list(self.info["classes"])
        self.num_classes: int = int(self.info["num_classes"])
        # The stored images' common size (None: sizes vary, so only a pipeline can batch them).
        self.image_size: tuple[int, int] | None = (tuple(self.info["image_size"])
                                                   if self.info["image_size"] is not None else None)
        # What batches have: the pipeline's channels and size, else the manifest's.
        self.channels: int = int(pipeline.channels if pipeline is not None else self.info["channels"])
        self.mean: list[float] = list(self.info["mean"])
        self.std: list[float] = list(self.info["std"])
        self.shuffle_buffer = shuffle_buffer
        # Samples read before the first is handed out; the buffer then grows to shuffle_buffer (two
        # read for each one handed out). The shards' samples were written in a seeded random order.
        self.shuffle_initial = min(shuffle_initial, shuffle_buffer)
        # Decoded unshuffled splits kept in this process (see `_cached`), up to this many bytes per split.
        self.cache_bytes = cache_bytes
        self._decoded: dict[str, dict] = {}
        self._mean = torch.tensor(self.mean, dtype=torch.float32).view(1, -1, 1, 1)
        self._std = torch.tensor(self.std, dtype=torch.float32).view(1, -1, 1, 1)
        self._checked = Checked()  # the shards' indexes, checked against their stamps (linvit.data.index)
        if verify:
            self.verify()

    @property
    def bytes_read(self) -> int:
        """Shard bytes this process has read for this ShardSet (samples, and scans of unstamped shards)."""
        return self._checked.bytes_read

    def verify(self) -> None:
        """Check every shard the manifest lists exists and has its recorded sha256: from its stamp
        (`linvit.data.index`), hashing only a shard not stamped on this machine or changed since;
        the shards' indexes are then loaded (and a forked loader process inherits them)."""
        for split in self.info["splits"]:
            for shard in self.info["splits"][split]["shards"]:
                path = self.dir / shard["name"]
                if not path.is_file():
                    raise MissingDataError(f"{path}: shard listed in {self.dir / MANIFEST} is missing")
                self._checked.offsets(path, int(shard["samples"]), shard["sha256"], verifying=True)

    @property
    def input_size(self) -> tuple[int, int] | None:
        """(h, w) of the batches: the pipeline's input size, else the stored images' size."""
        return tuple(self.pipeline.input_size) if self.pipeline is not None else self.image_size

    def num_samples(self, split: str) -> int:
        return int(self._split(split)["samples"])

    def steps_per_epoch(self, split: str, batch_size: int) -> int:
        """Full batches per epoch (training drops the last partial batch)."""
        return self.num_samples(split) // batch_size

    def batches(self, split: str, batch_size: int, *, seed: int = 0, epoch: int = 0, shuffle: bool = False,
                drop_last: bool = False, limit: int | None = None, skip_batches: int = 0,
                rank: int = 0, ranks: int = 1, augment: bool | None = None,
                ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Batches ``(x, y)``: x float32 (B,C,H,W) normalized with the manifest's mean/std (with a
        pipeline: by its transform, at its input size), y int64 (B,).

        shuffle: shard order and a sample buffer, both seeded from (seed, epoch).
        limit: only the first ``limit`` samples of the stream. skip_batches: start at batch k.
        rank, ranks: yield rank's contiguous share of each global batch of ``batch_size``
        (batch_size/ranks samples when it divides; an empty share is not yielded).
        augment (with a pipeline): the train transform, else the eval one; None: when shuffling.
        Augmentation is seeded per sample from (seed, epoch, sample key).
        """
        if batch_size < 1:
            raise DataError(f"batch_size must be at least 1, got {batch_size}")
        if not 0 <= rank < ranks:
            raise DataError(f"rank {rank} is not one of {ranks} ranks")
        if self.pipeline is None and self.image_size is None:
            raise DataError(f"{self.dir / MANIFEST}: the images have different sizes; "
                            "read them with a Pipeline (transform) that resizes them")
        augment = shuffle if augment is None else augment
        if not shuffle and not augment and ranks == 1 and self._cacheable(split):
            return self._cached(split, batch_size, drop_last=drop_last, limit=limit, skip_batches=skip_batches)
        request = dict(split=split, batch_size=batch_size, seed=seed, epoch=epoch, shuffle=shuffle,
                       drop_last=drop_last, limit=limit, skip_batches=skip_batches, rank=rank, ranks=ranks,
                       augment=augment)
        if self.prefetch > 0 and self.pipeline is None and _FORK is not None:
            return _forked(self, request, self.prefetch)
        batches = self._stream(**request)
        return _prefetched(batches, self.prefetch) if self.prefetch > 0 else batches

    def _stream(self, split: str, batch_size: int, *, seed: int, epoch: int, shuffle: bool, drop_last: bool,
                limit: int | None, skip_batches: int, rank: int, ranks: int, augment: bool, stored: bool = False,
                ) -> Iterator:
        """`batches` read and decoded from the shards (the arguments checked, augment resolved).
        `stored` (no pipeline): each batch as the stored images and labels (numpy; see `_normalized`).

        The order is decided on placeholders, (shard, sample number) from the manifest's counts:
        webdataset's shard shuffle and sample buffer move items by position only, never by their
        contents, so the placeholders come out in exactly the order the samples themselves would.
        The global batches are formed of placeholders, this rank keeps its share, and only those
        samples are read, by their offsets (`linvit.data.index`): each rank reads about 1/ranks of
        the bytes, and N ranks still see exactly the batches one process would."""
        shards = self._split(split)["shards"]
        urls = [str(self.dir / s["name"]) for s in shards]
        expected = {str(self.dir / s["name"]): (int(s["samples"]), s["sha256"]) for s in shards}
        # String seeds: random.Random hashes them with sha512, the same in every process.
        stages = [wds.SimpleShardList(urls, seed=f"{seed}:{epoch}:shards" if shuffle else None),
                  functools.partial(_placeholders, expected=expected)]
        if shuffle:
            stages.append(wds.shuffle(self.shuffle_buffer, initial=self.shuffle_initial,
                                      rng=random.Random(f"{seed}:{epoch}:samples")))
        # Skip and limit on the placeholders: nothing read, the same samples as slicing the batches.
        stages.append(wds.slice(skip_batches * batch_size, limit))
        # Global batches of placeholders; this rank keeps its share and reads and decodes only that.
        own = lambda raw: raw[rank * len(raw) // ranks:(rank + 1) * len(raw) // ranks]
        stages += [wds.batched(batch_size, collation_fn=own, partial=not drop_last), wds.select(len),
                   functools.partial(_read_batches, expected=expected, checked=self._checked)]
        if self.pipeline is not None:
            transformer = _Transformer(self.pipeline, self.num_classes, str(self.dir / MANIFEST))
            seeds = (lambda raw: [sample_seed(seed, epoch, s.get("__key__")) for s in raw]) if augment else \
                (lambda raw: [None] * len(raw))
            processes = self.workers if self.workers > 0 else (1 if self.prefetch > 0 else 0)
            if processes > 0:
                stages.append(functools.partial(_in_processes, transformer=transformer, augment=augment,
                                                seeds=seeds, processes=processes, collate=self._to_tensors))
            else:
                def here(raw):
                    with preserved_rng():  # the training loop's own random draws stay as they were
                        return self._to_tensors(transformer.batch(_strip(raw), seeds(raw), augment))
                stages.append(wds.map(here))
        else:
            collate = _stacked if stored else self._collate
            if self.workers > 0:
                # map keeps the order: the same samples in the same order as decoding one by one.
                pool = ThreadPoolExecutor(self.workers, thread_name_prefix="linvit-decode")
                stages.append(wds.map(lambda raw: collate(list(pool.map(self._decode, raw)))))
            else:
                stages.append(wds.map(lambda raw: collate([self._decode(s) for s in raw])))
        return iter(wds.DataPipeline(*stages))

    def _cacheable(self, split: str) -> bool:
        """Whether `split`'s decoded tensors fit the in-process cache (see `_cached`)."""
        h, w = self.input_size
        return self.num_samples(split) * self.channels * h * w * 4 <= self.cache_bytes

    def _cached(self, split: str, batch_size: int, *, drop_last: bool, limit: int | None,
                skip_batches: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Unshuffled, unaugmented batches (evaluation, probe batches) from `split`'s decoded tensors,
        kept in this process: the test split is decoded once, not at every evaluation. Decoding goes
        only as far as a request reaches (a probe batch decodes its images, not the split); the
        batches are the same tensors, batch for batch, as decoding them would give."""
        n = self.num_samples(split)
        start, stop = min(skip_batches * batch_size, n), n if limit is None else min(limit, n)
        cache = self._decoded.get(split)
        if cache is None:
            h, w = self.input_size
            cache = self._decoded[split] = {"x": torch.empty(n, self.channels, h, w),
                                            "y": torch.empty(n, dtype=torch.int64), "count": 0}
        stream = None
        try:
            for a in range(start, stop, batch_size):
                b = min(a + batch_size, stop)
                if b - a < batch_size and drop_last:
                    return
                while cache["count"] < b:  # decode on from where the cache ends, CACHE_CHUNK samples at a time
                    if stream is None:
                        stream = self._stream(split, CACHE_CHUNK, seed=0, epoch=0, shuffle=False, drop_last=False,
                                              limit=None, skip_batches=cache["count"] // CACHE_CHUNK, rank=0,
                                              ranks=1, augment=False)
                    x, y = next(stream)
                    c = cache["count"]
                    cache["x"][c:c + len(y)], cache["y"][c:c + len(y)] = x, y
                    cache["count"] = c + len(y)
                x, y = cache["x"][a:b], cache["y"][a:b]
                # Copies: a caller that changes its batch in place must not change the cache.
                yield (x.pin_memory(), y.pin_memory()) if self.pin_memory else (x.clone(), y.clone())
        finally:  # the shard file (and any worker processes) closed between requests
            if stream is not None:
                stream.close()

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
            key_, data = _image_item(sample)
            image = _decode_png(data, self.channels) if key_ == "png" else None
            if image is None:
                mode = "L" if self.channels == 1 else "RGB"
                # formats: PIL tries only the format the key names, not every plugin in turn (a third
                # of the decoding time of a 28x28 PNG); no convert (a copy) when the mode is already right.
                with Image.open(io.BytesIO(data), formats=_PIL_FORMATS.get(key_)) as im:
                    image = np.asarray(im if im.mode == mode else im.convert(mode))
            label = int(sample["cls"])
        except Exception as e:  # PIL raises OSError, SyntaxError or zlib.error on broken PNGs
            raise DataError(f"{url}: sample {key}{_origin(sample)} does not decode ({_one_line(e)})") from e
        if not 0 <= label < self.num_classes:  # else an IndexError deep in the loss, naming nothing
            raise DataError(f"{url}: sample {key} has label {label}, outside 0..{self.num_classes - 1} "
                            f"({self.num_classes} classes in {self.dir / MANIFEST})")
        if image.shape[:2] != self.image_size:
            raise DataError(f"{url}: sample {key} is {image.shape[:2]}, manifest says {self.image_size}")
        return image, label

    def _to_tensors(self, arrays: tuple[np.ndarray, np.ndarray]) -> tuple[torch.Tensor, torch.Tensor]:
        x, y = torch.from_numpy(arrays[0]), torch.from_numpy(arrays[1])
        if self.pin_memory:
            x, y = x.pin_memory(), y.pin_memory()
        return x, y

    def _collate(self, samples: list[tuple[np.ndarray, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        return self._normalized(*_stacked(samples))

    def _normalized(self, images: np.ndarray, labels: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch of stored images ((B,H,W) or (B,H,W,3) uint8) and labels as the batch tensors."""
        x = torch.from_numpy(images)
        x = x.unsqueeze(1) if self.channels == 1 else x.permute(0, 3, 1, 2)
        x = (x.float().div_(255.0) - self._mean).div_(self._std).contiguous()
        y = torch.from_numpy(labels)
        if self.pin_memory:  # page-locked, so the copy to the GPU can be non-blocking
            x, y = x.pin_memory(), y.pin_memory()
        return x, y


def _stacked(samples: list[tuple[np.ndarray, int]]) -> tuple[np.ndarray, np.ndarray]:
    """Decoded samples as one array of images (as stored) and one of int64 labels."""
    return np.stack([image for image, _ in samples]), np.array([label for _, label in samples], dtype=np.int64)


# PNG colour types (IHDR byte 25) whose 8-bit pixels are the batch's channels as stored.
_PNG_AS_STORED = {1: 0, 3: 2}  # channels -> colour type: gray, RGB
_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _decode_png(data: bytes, channels: int) -> np.ndarray | None:
    """The pixels of an 8-bit gray (channels 1) or RGB (channels 3) PNG, (H, W) or (H, W, 3) uint8,
    decoded by torchvision's libpng op; None for any other PNG (PIL decodes and converts those).

    Why not PIL for these: PIL parses a PNG's chunks in Python while holding the GIL, so a loader
    thread decoding with it slowed a matrix-product loop in the main thread by 58% (side by side);
    torchvision's op releases the GIL, and is 1.8x faster on a Fashion-MNIST image (20 against 36 us).
    PNG is lossless, so both give the same pixels (tests/test_data.py checks them against PIL).
    """
    decode = _torchvision_png()
    # IHDR is the first chunk: signature (8), length (4), type (4), width, height (4 each), depth, colour type.
    if (decode is None or len(data) < 26 or not data.startswith(_PNG_SIGNATURE) or data[12:16] != b"IHDR"
            or data[24] != 8 or data[25] != _PNG_AS_STORED.get(channels)):
        return None
    # A bytearray: torch.frombuffer warns on read-only buffers (the copy is a few hundred bytes).
    pixels = decode(torch.frombuffer(bytearray(data), dtype=torch.uint8))
    return pixels[0].numpy() if channels == 1 else pixels.permute(1, 2, 0).numpy()


@functools.cache
def _torchvision_png():
    """torchvision's PNG decoder (as stored: no conversion), or None where torchvision has none.

    The op torchvision registers (`torch.ops.image.decode_png`), called directly: its Python
    wrapper, `torchvision.io.decode_png`, logs its API use and raises a deprecation warning (0.29,
    the pinned version, deprecates its image codecs in favour of TorchCodec) at every call, which
    is 0.1 of the 0.6-0.7 s a Fashion-MNIST test split (10,000 images) took to read here (median of
    5 reads each way, alternating, in one process). When a later torchvision drops the op, the
    loader falls back to PIL for every image (the same pixels, slower)."""
    try:
        from torchvision.io import ImageReadMode  # imported by timm anyway; registers the op
    except ImportError:
        return None
    op = getattr(getattr(torch.ops, "image", None), "decode_png", None)
    if op is None:
        return None
    unchanged = ImageReadMode.UNCHANGED.value
    return lambda data: op(data, unchanged, False)  # (bytes, mode, apply_exif_orientation)


def _image_item(sample: dict) -> tuple[str, bytes]:
    for key, value in sample.items():
        if key in IMAGE_KEYS:
            return key, value
    raise KeyError(f"no image key (has {', '.join(k for k in sample if not k.startswith('__'))})")


def _image_bytes(sample: dict) -> bytes:
    return _image_item(sample)[1]


def _origin(sample: dict) -> str:
    """" (from train/cat/x.jpg)" when the sample records its original file, else ""."""
    try:
        return f" (from {json.loads(sample['json'])['path']})" if "json" in sample else ""
    except (ValueError, KeyError, TypeError):
        return ""


def _one_line(e: BaseException) -> str:
    return " ".join(f"{type(e).__name__}: {e}".split())


def _strip(raw: list[dict]) -> list[dict]:
    """Only what decoding needs (less to send to a worker process)."""
    return [{k: v for k, v in s.items() if k in ("__key__", "__url__", "cls", "json") or k in IMAGE_KEYS}
            for s in raw]


class _Transformer:
    """Decode + a pipeline's transform for a list of samples; pickled into worker processes, where
    it builds timm's transforms once."""

    def __init__(self, pipeline: Pipeline, num_classes: int, manifest: str):
        self.pipeline, self.num_classes, self.manifest = pipeline, num_classes, manifest
        self._built: dict[bool, object] = {}

    def __getstate__(self):
        return {"pipeline": self.pipeline, "num_classes": self.num_classes, "manifest": self.manifest}

    def __setstate__(self, state):
        self.__dict__.update(state, _built={})

    def transform(self, augment: bool):
        if augment not in self._built:
            self._built[augment] = self.pipeline.transform(train=augment)
        return self._built[augment]

    def batch(self, samples: list[dict], seeds: list[int | None], augment: bool) -> tuple[np.ndarray, np.ndarray]:
        transform = self.transform(augment)
        xs, ys = [], []
        for sample, seed in zip(samples, seeds):
            url, key = sample.get("__url__"), sample.get("__key__")
            try:
                with Image.open(io.BytesIO(_image_bytes(sample))) as im:
                    image = im.convert(self.pipeline.mode)
                x = apply(transform, image, seed)
                label = int(sample["cls"])
            except Exception as e:  # noqa: BLE001 - a broken sample, whatever PIL or timm raise
                raise DataError(f"{url}: sample {key}{_origin(sample)} does not decode ({_one_line(e)})") from None
            if not 0 <= label < self.num_classes:
                raise DataError(f"{url}: sample {key} has label {label}, outside 0..{self.num_classes - 1} "
                                f"({self.num_classes} classes in {self.manifest})")
            xs.append(np.asarray(x, dtype=np.float32))
            ys.append(label)
        return np.stack(xs), np.asarray(ys, dtype=np.int64)


_WORKER: _Transformer | None = None


def _worker_start(transformer: _Transformer) -> None:
    global _WORKER
    torch.set_num_threads(1)  # the parallelism is the processes
    _WORKER = transformer


def _worker_batch(samples: list[dict], seeds: list[int | None], augment: bool) -> tuple[np.ndarray, np.ndarray]:
    return _WORKER.batch(samples, seeds, augment)


def _process_context():
    """forkserver where there is one (a fresh process forks the workers: safe with torch's threads
    and locks in this one), preloading the modules the workers need so that each starts fast."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["linvit.data.loader", "timm.data"])
    return context


def _in_processes(src: Iterator[list[dict]], *, transformer: _Transformer, augment: bool, seeds, processes: int,
                  collate) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Pipeline stage: each batch split into contiguous parts, one per worker process, and put back
    together in order; up to LOOKAHEAD batches in flight. The pool ends with the iterator."""
    pool = ProcessPoolExecutor(processes, mp_context=_process_context(), initializer=_worker_start,
                               initargs=(transformer,))
    pending: deque = deque()

    def result(futures) -> tuple[torch.Tensor, torch.Tensor]:
        parts = [f.result() for f in futures]  # a worker's DataError is raised here, in order
        return collate((np.concatenate([x for x, _ in parts]), np.concatenate([y for _, y in parts])))

    try:
        for raw in src:
            samples, batch_seeds = _strip(raw), seeds(raw)
            n = len(samples)
            bounds = [i * n // processes for i in range(processes + 1)]
            pending.append([pool.submit(_worker_batch, samples[a:b], batch_seeds[a:b], augment)
                            for a, b in zip(bounds, bounds[1:]) if b > a])
            if len(pending) > LOOKAHEAD:
                yield result(pending.popleft())
        while pending:
            yield result(pending.popleft())
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


# fork where the platform has it: a child that starts in milliseconds with the modules imported.
_FORK = multiprocessing.get_context("fork") if "fork" in multiprocessing.get_all_start_methods() else None


def _forked(shards: ShardSet, request: dict, depth: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """`shards._stream(**request)` run in a child process forked for this iterator, up to `depth`
    batches ahead; an error there is raised here, in order, and the child ends with the iterator.

    Why a process: a thread's tar reading and decoding hold this process's GIL, and the training
    step gives it up at every op, so the step waited on the loader's Python for about 5% of a CPU
    step's time. Why fork: the child starts in milliseconds with everything imported (forkserver or
    spawn would import torch again, seconds per job). It uses none of the parent's threads, locks
    or devices: torch at one thread, no CUDA, no pinning (pinned memory belongs to a process: the
    batches are normalized and pinned here)."""
    _torchvision_png()  # imported here, once, not in every child (torchvision.io imports in seconds)
    here, there = _FORK.Pipe(duplex=False)
    child = _FORK.Process(target=_produce, args=(shards, request, depth, here, there), daemon=True,
                          name="linvit-loader")
    child.start()
    there.close()  # the child's end: once the child is gone, reading here ends (EOFError), not hangs
    try:
        while True:
            try:
                kind, item = here.recv()
            except EOFError:
                child.join()
                raise DataError(f"{shards.dir}: the loader process ended without a word "
                                f"(exit code {child.exitcode}; killed for memory?)") from None
            if kind == "end":
                return
            if kind == "error":
                raise item
            yield shards._normalized(*item)
    finally:
        if child.is_alive():
            child.terminate()
        child.join()
        here.close()


def _produce(shards: ShardSet, request: dict, depth: int, theirs, conn) -> None:
    """The forked child's work (see `_forked`): batches of stored images and labels (numpy: plain
    pickles, a quarter of the float batch's bytes; the parent normalizes), then "end" or the error.
    `_prefetched` decodes `depth` ahead while this thread sends; when the parent is gone (the pipe
    broken) the child ends."""
    theirs.close()  # the parent's end: with it closed here, a parent gone breaks the pipe
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it ends this child
    torch.set_num_threads(1)  # never an OpenMP team inherited across the fork
    batches = _prefetched(shards._stream(**request, stored=True), depth)
    while True:
        try:
            message = ("batch", next(batches))
        except StopIteration:
            message = ("end", None)
        except BaseException as err:  # noqa: BLE001 - raised again in the parent
            try:
                pickle.dumps(err)
            except Exception:  # an error that does not pickle arrives as its one line
                err = DataError(_one_line(err))
            message = ("error", err)
        try:
            conn.send(message)
        except OSError:  # the parent has gone: nobody to decode for
            return
        if message[0] != "batch":
            return


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
