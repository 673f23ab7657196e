"""How fast the loader feeds a 224 px model, beside how fast a training loop consumes: one run, one machine.

    python -m linvit.data.throughput --out throughput.csv [--images 640] [--steps 4] [--batch 32]

Makes a JPEG ImageFolder from Fashion-MNIST at 256 px (synthetic RGB JPEGs if it is not installed),
writes encoded shards in a temporary folder, then measures images/s of ``ShardSet.batches`` with
timm's train transform (RandomResizedCrop 224, flip, RandAugment rand-m9-mstd0.5-inc1) at workers
0, 1, 2 and with the eval transform (resize + center crop 224), after one warm-up batch (which also
starts the worker processes); and images/s of training steps of timm ``deit_tiny_patch16_224``
(fp32, CPU, AdamW) after warm-up steps. Prints a table and writes a CSV with the machine's name and
CPU count.
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from linvit.data.images import make_imagefolder
from linvit.data.loader import ShardSet
from linvit.data.shards import write_shards
from linvit.data.sources import FASHION_MNIST_SYSTEM_DIR
from linvit.data.transforms import Pipeline

TRAIN_AUG = {"auto_augment": "rand-m9-mstd0.5-inc1", "hflip": 0.5}
FIELDS = ["what", "workers", "batch_size", "images", "seconds", "images_per_s", "images_per_s_per_worker",
          "machine", "cpus", "torch_threads"]


def _synthetic_folder(root: Path, n: int, size: int) -> Path:
    rng = np.random.default_rng(0)
    for split, count in (("train", n), ("test", max(10, n // 10))):
        for i in range(count):
            folder = root / split / f"{i % 10:02d}"
            folder.mkdir(parents=True, exist_ok=True)
            base = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
            Image.fromarray(base).resize((size, size), Image.BICUBIC).save(folder / f"{i:05d}.jpg", quality=90)
    return root


def _loader_rate(shards: Path, pipeline: Pipeline, workers: int, batch: int, augment: bool) -> tuple[int, float]:
    s = ShardSet(shards, pipeline=pipeline, workers=workers)
    it = s.batches("train", batch, shuffle=True, augment=augment, seed=0)
    next(it)  # warm-up: worker start, transform built
    count, start = 0, time.perf_counter()
    for x, _ in it:
        count += len(x)
    seconds = time.perf_counter() - start
    return count, seconds


def _train_rate(batch: int, steps: int, warmup: int) -> tuple[int, float]:
    import timm

    torch.manual_seed(0)
    model = timm.create_model("deit_tiny_patch16_224", pretrained=False, num_classes=10)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    x, y = torch.randn(batch, 3, 224, 224), torch.randint(0, 10, (batch,))

    def step():
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    model.train()
    for _ in range(warmup):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return batch * steps, time.perf_counter() - start


def measure(out: Path, *, images: int = 640, steps: int = 4, warmup: int = 1, batch: int = 32,
            workers: tuple[int, ...] = (0, 1, 2), size: int = 224, source_px: int = 256) -> list[dict]:
    machine, cpus = platform.node(), os.cpu_count()
    rows = []

    def row(what, w, b, n, seconds):
        rate = n / seconds if seconds > 0 else float("nan")
        rows.append({"what": what, "workers": w, "batch_size": b, "images": n, "seconds": round(seconds, 3),
                     "images_per_s": round(rate, 1), "images_per_s_per_worker": round(rate / max(1, w), 1),
                     "machine": machine, "cpus": cpus, "torch_threads": torch.get_num_threads()})
        print(f"  {what:<34} workers={w}  {n:5d} images  {seconds:7.2f} s  {rate:8.1f} img/s", file=sys.stderr)

    with tempfile.TemporaryDirectory(prefix="linvit-throughput-") as tmp:
        tmp = Path(tmp)
        if FASHION_MNIST_SYSTEM_DIR.is_dir():
            per_class = max(1, images // 10)
            folder = make_imagefolder({"source": "fashion_mnist"}, tmp / "folder", size=source_px,
                                      per_class_train=per_class, per_class_test=1)
        else:
            folder = _synthetic_folder(tmp / "folder", images, source_px)
        info = write_shards("throughput", {"source": "imagefolder", "path": str(folder)}, tmp / "shards",
                            samples_per_shard=max(1, images // 4))
        n = info["splits"]["train"]["samples"]
        print(f"[throughput] {n} JPEG images of {source_px} px in {tmp / 'shards'}", file=sys.stderr)
        pipeline = Pipeline(input_size=(size, size), mean=info["mean"], std=info["std"], train=TRAIN_AUG)
        for w in workers:
            count, seconds = _loader_rate(tmp / "shards", pipeline, w, batch, augment=True)
            row("loader train (RRC+flip+RandAugment)", w, batch, count, seconds)
        for w in sorted({0, max(workers)}):
            count, seconds = _loader_rate(tmp / "shards", pipeline, w, batch, augment=False)
            row("loader eval (resize+center crop)", w, batch, count, seconds)
    if steps > 0:
        count, seconds = _train_rate(batch, steps, warmup)
        row("train deit_tiny_patch16_224 fp32", 0, batch, count, seconds)
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(rows)
    return rows


def _table(rows: list[dict]) -> str:
    head = f"| {'what':<36} | workers | batch | images | seconds | images/s | images/s per worker |"
    lines = [head, "|" + "|".join("-" * (len(c)) for c in head.split("|")[1:-1]) + "|"]
    for r in rows:
        lines.append(f"| {r['what']:<36} | {r['workers']:>7} | {r['batch_size']:>5} | {r['images']:>6} | "
                     f"{r['seconds']:>7} | {r['images_per_s']:>8} | {r['images_per_s_per_worker']:>19} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path, help="CSV file to write")
    parser.add_argument("--images", type=int, default=640, help="training images in the shards")
    parser.add_argument("--steps", type=int, default=4, help="timed training steps (0: none)")
    parser.add_argument("--warmup", type=int, default=1, help="training steps before timing")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--size", type=int, default=224, help="model input size")
    parser.add_argument("--source-px", type=int, default=256, help="size of the JPEG images")
    parser.add_argument("--workers", type=str, default="0,1,2", help="loader worker counts to time")
    args = parser.parse_args(argv)
    rows = measure(args.out, images=args.images, steps=args.steps, warmup=args.warmup, batch=args.batch,
                   workers=tuple(int(w) for w in args.workers.split(",")), size=args.size,
                   source_px=args.source_px)
    print(f"machine {platform.node()}, {os.cpu_count()} CPUs, torch threads {torch.get_num_threads()}")
    print(_table(rows))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
