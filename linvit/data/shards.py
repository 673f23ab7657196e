"""Write a dataset's raw arrays as webdataset shards plus a manifest (``_info.json``).

Layout of ``out_dir``: ``{split}-{i:04d}.tar`` shards, each sample a ``png`` image and a ``cls``
label, and ``_info.json`` written last, so its presence means every shard it lists is complete.
The same inputs give byte-identical shards (fixed tar mtimes and owners, deterministic PNG
encoding, seeded pre-shuffle), so the manifest's sha256 sums are reproducible.
"""

from __future__ import annotations

import io
import json
import math
import sys
import zlib
from pathlib import Path

import numpy as np
import webdataset as wds
from PIL import Image

from linvit import __version__
from linvit.data.sources import DataError, load_raw
from linvit.io import atomic_path, file_sha256, remove_stale_temps, write_text

__all__ = ["MANIFEST", "file_sha256", "write_shards"]

MANIFEST = "_info.json"


def write_shards(name: str, spec: dict, out_dir: str | Path, *, seed: int = 0,
                 samples_per_shard: int = 10000) -> dict:
    """Load dataset ``name`` (config entry ``spec``), write its shards to ``out_dir``; return the manifest."""
    if samples_per_shard < 1:
        raise DataError(f"samples_per_shard must be at least 1, got {samples_per_shard}")
    raw = load_raw(name, spec)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(out_dir)  # what a killed writer left; the shards are rewritten below
    # An old manifest would vouch for shards we are about to replace; drop it first so that an
    # interrupted rewrite leaves a directory that is visibly incomplete rather than inconsistent.
    (out_dir / MANIFEST).unlink(missing_ok=True)

    train_images = raw.splits["train"][0]
    image_size, channels = _geometry(train_images)
    splits = {}
    for split, (images, labels) in raw.splits.items():
        if _geometry(images) != (image_size, channels):
            raise DataError(f"dataset {name!r}: split {split!r} images are {images.shape[1:]}, "
                            f"train's are {train_images.shape[1:]}")
        splits[split] = _write_split(name, split, images, labels, out_dir, seed, samples_per_shard)

    mean, std = _channel_stats(train_images)
    info = {
        "dataset": name,
        "source": spec["source"],
        "seed": seed,
        "classes": list(raw.classes),
        "num_classes": len(raw.classes),
        "image_size": list(image_size),
        "channels": channels,
        "mean": mean,
        "std": std,
        "splits": splits,
        "linvit_version": __version__,
    }
    write_text(out_dir / MANIFEST, json.dumps(info, indent=2) + "\n")
    return info


def _geometry(images: np.ndarray) -> tuple[tuple[int, int], int]:
    return (int(images.shape[1]), int(images.shape[2])), (1 if images.ndim == 3 else int(images.shape[3]))


def _write_split(name: str, split: str, images: np.ndarray, labels: np.ndarray, out_dir: Path,
                 seed: int, samples_per_shard: int) -> dict:
    # Each split gets its own stream derived from (seed, split name), so adding or removing a
    # split never changes another split's order.
    order = np.random.default_rng([seed, zlib.crc32(split.encode())]).permutation(len(labels))
    shards = []
    for i in range(math.ceil(len(order) / samples_per_shard)):
        chunk = order[i * samples_per_shard:(i + 1) * samples_per_shard]
        shard_name = f"{split}-{i:04d}.tar"
        path = out_dir / shard_name
        with atomic_path(path) as tmp, open(tmp, "wb") as f:
            # mtime fixed (TarWriter's default is "now") so reruns give the same bytes and sha256.
            with wds.TarWriter(f, mtime=0) as writer:
                for index in chunk:
                    writer.write({"__key__": f"{split}-{int(index):07d}",
                                  "png": _png_bytes(images[index]),
                                  "cls": int(labels[index])})
        shards.append({"name": shard_name, "samples": len(chunk), "sha256": file_sha256(path)})
        print(f"[linvit.data] {name}: wrote {path} ({len(chunk)} samples)", file=sys.stderr)
    return {"samples": int(len(order)), "shards": shards}


def _png_bytes(image: np.ndarray) -> bytes:
    if image.ndim == 3 and image.shape[2] == 1:
        image = image[:, :, 0]
    out = io.BytesIO()
    Image.fromarray(image).save(out, format="PNG")
    return out.getvalue()


def _channel_stats(images: np.ndarray) -> tuple[list[float], list[float]]:
    """Per-channel mean and (population) std of the pixels in 0..1.

    Computed from a 256-bin histogram per channel: exact, and no float copy of the whole split.
    """
    per_channel = [images.ravel()] if images.ndim == 3 else [images[..., c].ravel() for c in range(images.shape[3])]
    values = np.arange(256, dtype=np.float64) / 255.0
    means, stds = [], []
    for pixels in per_channel:
        counts = np.bincount(pixels, minlength=256).astype(np.float64)
        total = counts.sum()
        mean = float((counts * values).sum() / total)
        var = float((counts * (values - mean) ** 2).sum() / total)
        means.append(mean)
        stds.append(math.sqrt(var))
    return means, stds
