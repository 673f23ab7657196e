"""`linvit bench loader --ranks N`: what each of N ranks reads, against one process, on JPEGs the
size of ImageNet's (issue 49).

N processes read as N torchrun ranks would (each its share of the same global batches, through the
timm train transform at 224 px: decode, random resized crop, flip, normalize), started together;
one process reads the same epoch alone first. Per rank: the shard bytes it read (the loader's own
count, `ShardSet.bytes_read`; the process's read syscalls, /proc/self/io rchar, beside it) and its
images/s. Targets: the bytes of every rank within 1.2x of 1/N of one process's; the images/s of
every rank not below one process's (which needs a core per rank: on a machine with fewer cores
than ranks they share them: `ranks_N_rate_ceiling`, min(1, cores/N), is the most the wall rate's
ratio can reach on the machine that ran it). Beside the wall rate, each rank's images per second of
its own CPU time (time.process_time): the work per image, whatever the cores, so a ratio near 1 says
the rate per rank would match one process's given a core each. The control, `ranks_N_control_*`:
N processes started together, each reading the whole epoch as one process would (no shares), so
what N busy processes cost each other (caches, memory bandwidth, clock) shows apart from what
reading a share costs.

The images (`imagenet_like_folder`): ImageNet's average size, about 400x350 px (each 350-450 x
300-400) and about 110 kB at JPEG quality 90, with texture down to the pixel: random-phase fields
whose amplitude falls as 1/f^beta (beta 0.5-0.85; photographs are about 1), colour-mixed per image.
Not upscaled 28 px images, whose JPEGs are a few kB of smooth gradients and decode far faster.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from .bench_rows import row, say

BYTES_RATIO, RATE_RATIO = 1.2, 1.0
FIELD = 1024  # side of the texture fields images are cut from


def _fields(rng: np.random.Generator, count: int = 4) -> list[np.ndarray]:
    """`count` 3-channel FIELD x FIELD fields of unit variance, amplitude ~ 1/f^beta, random phases."""
    fy, fx = np.fft.fftfreq(FIELD)[:, None], np.fft.rfftfreq(FIELD)[None, :]
    f = np.hypot(fy, fx)
    f[0, 0] = 1.0
    out = []
    for beta in np.linspace(0.5, 0.85, count):
        phases = np.exp(2j * np.pi * rng.random((3, FIELD, FIELD // 2 + 1)))
        x = np.fft.irfft2(f ** -beta * phases, s=(FIELD, FIELD)).transpose(1, 2, 0)
        out.append(((x - x.mean()) / x.std()).astype(np.float32))
    return out


def imagenet_like_folder(out_dir: str | Path, *, classes: int = 10, per_class_train: int = 52,
                         per_class_test: int = 4, seed: int = 0) -> Path:
    """An ImageFolder (``train/`` and ``test/``, ``classes`` folders each) of textured JPEGs the size
    of ImageNet's (see the module docstring); deterministic from `seed`. Returns `out_dir`."""
    from PIL import Image

    out_dir = Path(out_dir)
    rng = np.random.default_rng(seed)
    fields = _fields(rng)
    for split, per_class in (("train", per_class_train), ("test", per_class_test)):
        for c in range(classes):
            folder = out_dir / split / f"{c:02d}_class{c}"
            folder.mkdir(parents=True, exist_ok=True)
            tint = rng.normal(0, 20, 3)  # each class a colour cast
            for i in range(per_class):
                h, w = int(rng.integers(300, 401)), int(rng.integers(350, 451))
                y, x = int(rng.integers(0, FIELD - h)), int(rng.integers(0, FIELD - w))
                mix = np.eye(3) + rng.normal(0, 0.3, (3, 3))
                crop = fields[int(rng.integers(len(fields)))][y:y + h, x:x + w] @ mix.astype(np.float32)
                pixels = np.clip(128 + 50 * crop / crop.std() + tint, 0, 255).astype(np.uint8)
                Image.fromarray(pixels).save(folder / f"{i:05d}.jpg", format="JPEG", quality=90)
    return out_dir


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def _rchar() -> int:
    """Bytes this process has read through read syscalls (Linux), else 0."""
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("rchar:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _rank(shards: str, pipeline, batch: int, rank: int, ranks: int, start, results, share: bool = True) -> None:
    """One rank's epoch: its share of every global batch (the whole batch unless `share`), timed from
    the common start."""
    import torch

    from .data.loader import ShardSet

    torch.set_num_threads(1)  # as torchrun sets every rank (OMP_NUM_THREADS=1)
    data = ShardSet(shards, pipeline=pipeline, verify=False)
    place = dict(rank=rank, ranks=ranks) if share else dict(rank=0, ranks=1)
    start.wait()
    t, cpu, rchar, images = time.perf_counter(), time.process_time(), _rchar(), 0
    for x, _ in data.batches("train", batch, seed=0, epoch=0, shuffle=True, drop_last=True, **place):
        images += len(x)
    results.put((rank, images, time.perf_counter() - t, time.process_time() - cpu, data.bytes_read, _rchar() - rchar))


def read_as_ranks(shards: str | Path, ranks: int, *, pipeline, batch: int, share: bool = True) -> list[dict]:
    """Each of `ranks` processes' epoch (forked, started together): images, seconds, bytes, rchar.
    With `share` False each reads the whole epoch as rank 0 of 1 (the control)."""
    pipeline.transform(train=True)  # timm imported here, once, before the ranks fork: not in their time
    context = multiprocessing.get_context("fork")
    start, results = context.Barrier(ranks), context.Queue()
    procs = [context.Process(target=_rank, args=(str(shards), pipeline, batch, r, ranks, start, results, share))
             for r in range(ranks)]
    for p in procs:
        p.start()
    got = [results.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
        if p.exitcode != 0:
            raise RuntimeError(f"bench loader --ranks: rank process ended with exit code {p.exitcode}")
    return [dict(zip(("rank", "images", "seconds", "cpu_seconds", "bytes", "rchar"), r)) for r in sorted(got)]


def bench_loader_ranks(ranks: list[int], *, shards: str | Path | None = None, images: int = 1040,
                       batch: int = 64, size: int = 224) -> list[dict]:
    """Rows of `linvit bench loader --ranks`: one process, then each N in `ranks` (see the module
    docstring). Without `shards`, `images` ImageNet-like JPEGs (10 classes) are made and sharded."""
    from .data.shards import write_shards
    from .data.transforms import Pipeline

    pipeline = Pipeline(input_size=size)
    rows = []
    with tempfile.TemporaryDirectory(prefix="linvit-bench-ranks-") as tmp:
        if shards is None:
            per_class = max(1, images // 10)
            say(f"loader --ranks: {per_class * 10} ImageNet-size JPEGs (about 400x350 px, 110 kB)")
            folder = imagenet_like_folder(Path(tmp) / "jpeg", per_class_train=per_class)
            jpegs = sorted((folder / "train").rglob("*.jpg"))
            kb = statistics.mean(p.stat().st_size for p in jpegs) / 1e3
            rows.append(row("loader_ranks", "jpeg_kb_mean", kb, "kB"))
            shards = Path(tmp) / "shards"
            write_shards("imagenet_like", {"source": "imagefolder", "path": str(folder)}, shards,
                         samples_per_shard=max(1, per_class * 10 // 8), workers=1)
        one = read_as_ranks(shards, 1, pipeline=pipeline, batch=batch)[0]
        one_rate, one_cpu_rate = one["images"] / one["seconds"], one["images"] / one["cpu_seconds"]
        say(f"loader --ranks: one process: {one['images']} images, {one['bytes'] / 1e6:.1f} MB, {one_rate:.1f} images/s")
        rows += [row("loader_ranks", "one_process_bytes", float(one["bytes"]), "bytes"),
                 row("loader_ranks", "one_process_images_per_s", one_rate, "images/s"),
                 row("loader_ranks", "one_process_images_per_cpu_s", one_cpu_rate, "images/s"),
                 row("loader_ranks", "cores", float(_cores()), "cores")]
        for n in ranks:
            got = read_as_ranks(shards, n, pipeline=pipeline, batch=batch)
            worst_bytes = max(r["bytes"] for r in got)
            ratio = worst_bytes / (one["bytes"] / n)
            rate = min(r["images"] / r["seconds"] for r in got)
            cpu_rate = min(r["images"] / r["cpu_seconds"] for r in got)
            control = read_as_ranks(shards, n, pipeline=pipeline, batch=batch, share=False)
            if any(r["images"] != one["images"] for r in control):  # the control must read what one process reads
                raise RuntimeError(f"bench loader --ranks: the control read {[r['images'] for r in control]} "
                                   f"images per process, one process {one['images']}")
            control_rate = min(r["images"] / r["seconds"] for r in control)
            control_cpu_rate = min(r["images"] / r["cpu_seconds"] for r in control)
            say(f"loader --ranks {n}: bytes per rank {[r['bytes'] for r in got]}, "
                f"images/s per rank {[round(r['images'] / r['seconds'], 1) for r in got]}")
            rows += [row("loader_ranks", f"ranks_{n}_bytes_per_rank", float(worst_bytes), "bytes"),
                     row("loader_ranks", f"ranks_{n}_rchar_per_rank", float(max(r["rchar"] for r in got)), "bytes"),
                     row("loader_ranks", f"ranks_{n}_bytes_over_share", ratio, "ratio", f"<= {BYTES_RATIO:g}",
                         ratio <= BYTES_RATIO),
                     row("loader_ranks", f"ranks_{n}_images_per_s_per_rank", rate, "images/s"),
                     row("loader_ranks", f"ranks_{n}_rate_over_one_process", rate / one_rate, "ratio",
                         f">= {RATE_RATIO:g}", rate / one_rate >= RATE_RATIO),
                     row("loader_ranks", f"ranks_{n}_rate_ceiling", min(1.0, _cores() / n), "ratio"),
                     row("loader_ranks", f"ranks_{n}_cpu_rate_over_one_process", cpu_rate / one_cpu_rate, "ratio"),
                     row("loader_ranks", f"ranks_{n}_control_rate_over_one_process", control_rate / one_rate, "ratio"),
                     row("loader_ranks", f"ranks_{n}_control_cpu_rate_over_one_process",
                         control_cpu_rate / one_cpu_rate, "ratio")]
    return rows
