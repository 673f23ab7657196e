"""Write a dataset as webdataset shards plus a manifest (``_info.json``).

Layout of ``out_dir``: ``{split}-{i:04d}.tar`` shards, ``_progress/{shard}.json`` (one record per
finished shard), ``_index/{shard}.json`` (each shard's sample offsets and the stamp of its hash,
for the loader's random access: `linvit.data.index`) and ``_info.json``, written last, so its
presence means every shard it lists is complete. Two formats:

- ``"format": "png"`` (array sources: idx, fashion_mnist, digits, synthetic, cifar): each sample a
  ``png`` image (losslessly encoded from the arrays) and a ``cls`` label. mean/std are exact, over
  every pixel of the train split. (A manifest without ``format`` is this one.)
- ``"format": "encoded"`` (file sources: imagefolder): each sample the file's original bytes under
  its extension key (``jpg`` for .jpg/.jpeg/.JPEG, ``png``, ``webp``, ...; the webdataset
  convention), ``cls``, and ``json`` = ``{"path": <path relative to the dataset folder>}`` so that
  errors can name the original file. Every image is fully decoded once while writing: a corrupt one
  is a one-line DataError naming the file (``on_corrupt: error``, the default) or is left out,
  reported on stderr and listed under the manifest's ``skipped`` (``on_corrupt: skip``). mean/std
  (per channel, 0..1, in the ``channels`` mode) are estimated from a deterministic sample of at most
  1000 training images (``STATS_IMAGES``), seeded by the shard seed; ``image_size`` is the common
  ``[h, w]`` if every image has it, else null.

A dataset with ``classes`` (a subset of its source's labels; applied by ``sources.load_raw``) has the
subset's classes and count in the manifest, plus ``source_labels`` (the source's label of each), and
the subset is part of every shard's inputs, so shards of another subset are rewritten, never kept.

Shards are independent and written by a process pool (``workers``; default min(4, CPUs)). The order
of the samples and their split into shards is decided, seeded, before anything is written, and tar
mtimes and owners are fixed, so the same inputs give byte-identical shards and manifest whatever
the number of workers. A rerun after a kill keeps each shard whose record in ``_progress/`` matches
both the shard's inputs and the file's sha256 (the sha256 its ``_index/`` stamp vouches for while
the file's size, mtime and inode are unchanged; else hashed, and stamped, again), and writes only
the rest.

A (re)run writes into ``.<out_dir name>.partial`` beside ``out_dir``, starting from hard links to
``out_dir``'s shards and records (so unchanged shards are kept, not rewritten), and swaps the complete
folder in only at the end, by two renames (out_dir to ``.<name>.old``, the new folder to out_dir; a
run killed between them is completed by the next run). A run that fails (a corrupt image, a
full disk) or is killed leaves ``out_dir`` exactly as it was, ``_info.json`` included; the next run
resumes from the partial folder. An ``out_dir`` holding other files than the writer's (or the
working directory, or a link) is updated file by file instead, ``_info.json`` last.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import multiprocessing
import os
import re
import shutil
import sys
import zlib
from concurrent.futures import FIRST_EXCEPTION, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import webdataset as wds
from PIL import Image

from linvit import __version__
from linvit.data.index import INDEX, scan, stamped_sha256, write_index
from linvit.data.sources import DataError, EncodedData, RawData, load_raw
from linvit.io import atomic_path, file_sha256, remove_stale_temps, write_text

__all__ = ["MANIFEST", "PROGRESS", "STATS_IMAGES", "default_workers", "file_sha256", "image_key",
           "write_shards"]

MANIFEST = "_info.json"
PROGRESS = "_progress"  # one record per finished shard: {name, samples, sha256, inputs, ...}
STATS_IMAGES = 1000  # encoded datasets: mean/std from at most this many training images

PARTIAL = ".{}.partial"  # beside out_dir: the shards being written, swapped in when complete
_OLD = ".{}.old"  # beside out_dir: the previous folder, for the moment between two renames
_SHARD_NAME = re.compile(r"^[^.].*-\d{4,}\.tar$")  # {split}-{i:04d}.tar

# Suffix -> sample key, where the webdataset convention differs from the bare suffix.
_KEY_OF_SUFFIX = {".jpeg": "jpg", ".jpe": "jpg", ".jfif": "jpg", ".tif": "tiff"}


def image_key(path: str | Path) -> str:
    """The sample key a file's bytes are stored under: ``jpg`` for .jpg/.jpeg/.JPEG, else the suffix."""
    suffix = Path(path).suffix.lower()
    return _KEY_OF_SUFFIX.get(suffix, suffix[1:])


def default_workers() -> int:
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(4, cpus))


def write_shards(name: str, spec: dict, out_dir: str | Path, *, seed: int = 0,
                 samples_per_shard: int = 10000, workers: int | None = None) -> dict:
    """Load dataset ``name`` (config entry ``spec``), write its shards to ``out_dir``; return the manifest.

    ``workers``: processes writing shards in parallel (None: min(4, CPUs); 1: in this process).
    Encoded datasets read ``spec["on_corrupt"]`` (``error`` or ``skip``).
    """
    if samples_per_shard < 1:
        raise DataError(f"samples_per_shard must be at least 1, got {samples_per_shard}")
    workers = default_workers() if workers is None else int(workers)
    if workers < 1:
        raise DataError(f"workers must be at least 1, got {workers}")
    raw = load_raw(name, spec)
    out_dir = Path(out_dir)
    if os.path.lexists(out_dir) and not out_dir.is_dir():
        raise DataError(f"{out_dir} is not a folder: give a folder for the shards")
    # The new shards go into a folder beside out_dir, swapped in when complete: out_dir (its
    # manifest and the shards it vouches for) is never half-replaced by a run that fails.
    stage = _stage(out_dir)
    write = _write_encoded if isinstance(raw, EncodedData) else _write_arrays
    try:
        info = write(name, spec, raw, stage, seed, samples_per_shard, workers, shown=out_dir)
    except DataError as err:
        if (out_dir / MANIFEST).is_file():
            raise DataError(f"{_one_line(err)}; the shards in {out_dir} are left as they were") from None
        raise
    _commit(stage, out_dir)
    return info


# -- the folder beside out_dir, and the swap ----------------------------------------------------


def _one_line(err: BaseException) -> str:
    text = str(err).strip() or type(err).__name__
    return text.splitlines()[0]


def _beside(out_dir: Path, pattern: str) -> Path:
    base = Path(os.path.abspath(out_dir))
    return base.with_name(pattern.format(base.name))


def _stage(out_dir: Path) -> Path:
    """The folder this run writes in, beside out_dir (inside it where its parent cannot be written):
    a killed run's is resumed; it is given hard links to out_dir's shards and records it lacks (so a
    rerun keeps the shards it can; _finished decides), and cleaned of interrupted writes' temporaries."""
    old = _beside(out_dir, _OLD)
    if old.is_dir():  # a swap interrupted between its two renames
        if os.path.lexists(out_dir):
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(old, out_dir)
    stage = _beside(out_dir, PARTIAL)
    try:
        (stage / PROGRESS).mkdir(parents=True, exist_ok=True)
    except PermissionError:
        stage = Path(out_dir) / PARTIAL.format("shards")
        (stage / PROGRESS).mkdir(parents=True, exist_ok=True)
    (stage / INDEX).mkdir(exist_ok=True)
    for folder in (out_dir, out_dir / PROGRESS, out_dir / INDEX, stage, stage / PROGRESS, stage / INDEX):
        remove_stale_temps(folder)  # what a killed writer left
    if out_dir.is_dir():
        for src in out_dir.iterdir():
            if _SHARD_NAME.match(src.name) and src.is_file():
                _share(src, stage / src.name)
        for sub in (PROGRESS, INDEX):  # a linked shard's index stays valid: same inode, size, mtime
            if (out_dir / sub).is_dir():
                for src in (out_dir / sub).glob("*.json"):
                    _share(src, stage / sub / src.name)
    return stage


def _share(src: Path, dst: Path) -> None:
    """`src` at `dst` too (a hard link; a copy where links are not possible), unless dst exists.
    Safe: every write replaces a file by rename, never changes one in place."""
    if os.path.lexists(dst):
        return
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _commit(stage: Path, out_dir: Path) -> None:
    """The complete new folder in out_dir's place: swapped in by two renames where out_dir holds only
    what this writer makes (`_stage` completes a swap killed between them), else moved in file by file
    (the manifest last)."""
    base = Path(os.path.abspath(out_dir))
    if stage.parent == base or not _only_shards(base):
        _commit_files(stage, base)
    elif not os.path.lexists(base):
        os.rename(stage, base)
    else:
        old = _beside(base, _OLD)
        shutil.rmtree(old, ignore_errors=True)
        os.rename(base, old)
        try:
            os.rename(stage, base)
        except BaseException:
            os.rename(old, base)
            raise
        shutil.rmtree(old, ignore_errors=True)


def _only_shards(base: Path) -> bool:
    """Whether out_dir is a plain folder of the writer's own files (or absent), so the whole folder
    may be swapped: not a link, not the working directory or above it, nothing else in it."""
    if not os.path.lexists(base):
        return True
    if base.is_symlink() or not base.is_dir():
        return False
    cwd = Path.cwd().resolve()
    if cwd == base.resolve() or base.resolve() in cwd.parents:
        return False
    return all(p.name in (MANIFEST, PROGRESS, INDEX) or (_SHARD_NAME.match(p.name) and p.is_file())
               for p in base.iterdir())


def _commit_files(stage: Path, base: Path) -> None:
    """The new shards and records moved into out_dir one by one: its manifest goes first (it vouches
    for the old shards) and the new one comes last, so a reader never meets a manifest that lies."""
    base.mkdir(parents=True, exist_ok=True)
    (base / MANIFEST).unlink(missing_ok=True)
    for sub in (PROGRESS, INDEX):
        (base / sub).mkdir(exist_ok=True)
        for src in sorted((stage / sub).iterdir()) if (stage / sub).is_dir() else ():
            shutil.move(str(src), str(base / sub / src.name))
    for src in sorted(stage.iterdir()):
        if src.is_file() and src.name != MANIFEST:
            shutil.move(str(src), str(base / src.name))
    shutil.move(str(stage / MANIFEST), str(base / MANIFEST))
    shutil.rmtree(stage, ignore_errors=True)


# -- jobs: one per shard, run here or in a worker process ---------------------------------------


@dataclass
class _Job:
    out_dir: str
    name: str  # shard file name
    dataset: str
    inputs: str  # sha256 of everything that determines the shard's bytes
    format: str  # "png" | "encoded"
    keys: list[str] = field(default_factory=list)
    labels: list[int] = field(default_factory=list)
    images: np.ndarray | None = None  # png: the chunk's uint8 arrays
    files: list[tuple[str, str, bool]] = field(default_factory=list)  # encoded: (file, relpath, in stats)
    channels: int = 3
    on_corrupt: str = "error"


def _split_order(split: str, n: int, seed: int) -> np.ndarray:
    # Each split gets its own stream derived from (seed, split name), so adding or removing a
    # split never changes another split's order.
    return np.random.default_rng([seed, zlib.crc32(split.encode())]).permutation(n)


def _chunks(order: np.ndarray, samples_per_shard: int) -> list[np.ndarray]:
    return [order[i * samples_per_shard:(i + 1) * samples_per_shard]
            for i in range(math.ceil(len(order) / samples_per_shard))]


def _record_path(out_dir: Path, shard: str) -> Path:
    return out_dir / PROGRESS / f"{shard}.json"


def _finished(job: _Job) -> dict | None:
    """The record of a shard an earlier run completed from the same inputs, if its file is intact
    (its stamp's sha256, when the file is unchanged since it was stamped; else hashed, and stamped,
    now)."""
    out_dir = Path(job.out_dir)
    try:
        record = json.loads(_record_path(out_dir, job.name).read_text())
        path = out_dir / job.name
        if record.get("inputs") == job.inputs and record.get("name") == job.name and \
                (stamped_sha256(path) or _restamped(path)) == record.get("sha256"):
            return record
    except (OSError, ValueError, AttributeError):
        pass
    return None


def _run_jobs(jobs: list[_Job], workers: int, shown: Path) -> list[dict]:
    """Each job's record, in job order: kept from an earlier run, or written now (in parallel).
    Shards are named in `shown`, the folder they end up in."""
    records: list[dict | None] = [_finished(job) for job in jobs]
    for job, record in zip(jobs, records):
        if record is not None:
            print(f"[linvit.data] {job.dataset}: kept {Path(shown) / job.name} "
                  f"({record['samples']} samples, complete)", file=sys.stderr)
    todo = [i for i, r in enumerate(records) if r is None]
    _compute(jobs, records, todo, workers)
    # Reported here, not in the workers: their stderr is the forkserver's, not necessarily ours.
    for i, (job, record) in enumerate(zip(jobs, records)):
        if i in todo:
            print(f"[linvit.data] {job.dataset}: wrote {Path(shown) / job.name} ({record['samples']} samples)",
                  file=sys.stderr)
        full = {rel: file for file, rel, _ in job.files}
        for s in record.get("skipped", []):
            print(f"[linvit.data] {job.dataset}: skipped corrupt image {full.get(s['path'], s['path'])} "
                  f"({s['error']})", file=sys.stderr)
    return records


def _compute(jobs: list[_Job], records: list, todo: list[int], workers: int) -> None:
    if workers == 1 or len(todo) <= 1:
        for i in todo:
            records[i] = _write_shard(jobs[i])
        return
    # forkserver: safe with torch (and its threads) already imported in this process.
    context = multiprocessing.get_context("forkserver" if "forkserver" in multiprocessing.get_all_start_methods()
                                          else "spawn")
    with ProcessPoolExecutor(min(workers, len(todo)), mp_context=context) as pool:
        futures = {pool.submit(_write_shard, jobs[i]): i for i in todo}
        done, pending = wait(futures, return_when=FIRST_EXCEPTION)
        failed = [f for f in done if f.exception() is not None]
        if failed:
            for f in pending:
                f.cancel()
            # The first failing shard in shard order, so the error does not depend on timing.
            raise min(failed, key=lambda f: futures[f]).exception()
        for f, i in futures.items():
            records[i] = f.result()


def _write_shard(job: _Job) -> dict:
    out_dir = Path(job.out_dir)
    path = out_dir / job.name
    skipped: list[dict] = []
    hist = np.zeros((job.channels, 256), dtype=np.int64)
    sizes: set[tuple[int, int]] = set()
    written = stats_images = 0
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        # mtime fixed (TarWriter's default is "now") so reruns give the same bytes and sha256.
        with wds.TarWriter(f, mtime=0) as writer:
            if job.format == "png":
                for key, image, label in zip(job.keys, job.images, job.labels):
                    writer.write({"__key__": key, "png": _png_bytes(image), "cls": int(label)})
                    written += 1
            else:
                for key, (file, relpath, in_stats), label in zip(job.keys, job.files, job.labels):
                    data, image, why = _check_image(file, job.channels, in_stats)
                    if why is not None:
                        if job.on_corrupt != "skip":
                            raise DataError(f"{file}: corrupt image ({why}); set the dataset's "
                                            "'on_corrupt: skip' to leave such files out")
                        skipped.append({"path": relpath, "error": why})
                        continue
                    sizes.add(image[0])
                    if in_stats:
                        stats_images += 1
                        arr = image[1].reshape(-1, job.channels)
                        for c in range(job.channels):
                            hist[c] += np.bincount(arr[:, c], minlength=256)
                    writer.write({"__key__": key, image_key(file): data, "cls": int(label),
                                  "json": json.dumps({"path": relpath}).encode()})
                    written += 1
    record = {"name": job.name, "samples": written, "sha256": _indexed(path), "inputs": job.inputs}
    if job.format == "encoded":
        record.update(skipped=skipped, hist=hist.tolist(), stats_images=stats_images,
                      size=list(next(iter(sizes))) if len(sizes) == 1 else (None if sizes else "none"))
    write_text(_record_path(out_dir, job.name), json.dumps(record) + "\n")
    return record


def _restamped(path: Path) -> str | None:
    """A kept shard's sha256 from one read that also stamps and indexes it; None if it does not parse."""
    digest, offsets, why, _ = scan(path)
    if why is not None:
        return None
    write_index(path, digest, offsets)
    return digest


def _indexed(path: Path) -> str:
    """The shard's sha256, from one read that also writes its index and stamp (`linvit.data.index`):
    the loader then neither scans nor hashes it again on this machine."""
    digest, offsets, why, _ = scan(path)
    if why is not None:  # the writer's own tar: never expected
        raise DataError(f"{path}: the shard just written does not parse ({why})")
    write_index(path, digest, offsets)
    return digest


def _check_image(file: str, channels: int, in_stats: bool):
    """(bytes, ((h, w), pixels or None), None) for an image that fully decodes, else (None, None, why)."""
    try:
        with open(file, "rb") as f:
            data = f.read()
    except OSError as e:
        return None, None, f"cannot read: {e.strerror or e}"
    try:
        with Image.open(io.BytesIO(data)) as im:
            im.load()  # the full decode: a truncated JPEG fails here, not in training
            size = (im.height, im.width)
            pixels = np.asarray(im.convert("L" if channels == 1 else "RGB")) if in_stats else None
    except Exception as e:  # noqa: BLE001 - PIL raises OSError, SyntaxError, ValueError, zlib.error...
        return None, None, " ".join(f"{type(e).__name__}: {e}".split())
    return data, (size, pixels), None


def _subset(spec: dict) -> list[int] | None:
    """The dataset's `classes` (the source's labels it keeps, in order; None: all): part of every
    shard's inputs, so shards of another subset are never kept on a rerun."""
    classes = spec.get("classes")
    return None if classes is None else [int(c) for c in classes]


def _subset_field(spec: dict) -> dict:
    """The manifest's `source_labels`: the source's label of each class (only for a `classes` subset)."""
    classes = _subset(spec)
    return {} if classes is None else {"source_labels": classes}


def _digest(*parts) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part if isinstance(part, bytes) else json.dumps(part, sort_keys=True).encode())
        h.update(b"\0")
    return h.hexdigest()


# -- array datasets: PNG shards -----------------------------------------------------------------


def _write_arrays(name: str, spec: dict, raw: RawData, out_dir: Path, seed: int, samples_per_shard: int,
                  workers: int, *, shown: Path) -> dict:
    train_images = raw.splits["train"][0]
    image_size, channels = _geometry(train_images)
    jobs, shards_of = [], {}
    for split, (images, labels) in raw.splits.items():
        if _geometry(images) != (image_size, channels):
            raise DataError(f"dataset {name!r}: split {split!r} images are {images.shape[1:]}, "
                            f"train's are {train_images.shape[1:]}")
        order = _split_order(split, len(labels), seed)
        shards_of[split] = []
        for i, chunk in enumerate(_chunks(order, samples_per_shard)):
            keys = [f"{split}-{int(index):07d}" for index in chunk]
            chunk_images, chunk_labels = np.ascontiguousarray(images[chunk]), [int(v) for v in labels[chunk]]
            job = _Job(out_dir=str(out_dir), name=f"{split}-{i:04d}.tar", dataset=name, format="png",
                       keys=keys, labels=chunk_labels, images=chunk_images,
                       inputs=_digest("png", _subset(spec), keys, chunk_labels, str(chunk_images.shape),
                                      chunk_images.tobytes()))
            shards_of[split].append(len(jobs))
            jobs.append(job)
    records = _run_jobs(jobs, workers, shown)
    splits = {split: {"samples": sum(records[j]["samples"] for j in idx),
                      "shards": [{k: records[j][k] for k in ("name", "samples", "sha256")} for j in idx]}
              for split, idx in shards_of.items()}
    mean, std = _channel_stats(train_images)
    info = {
        "dataset": name,
        "source": spec["source"],
        "format": "png",
        "seed": seed,
        "classes": list(raw.classes),
        "num_classes": len(raw.classes),
        **_subset_field(spec),
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
    return _hist_stats([np.bincount(pixels, minlength=256) for pixels in per_channel])


def _hist_stats(hists) -> tuple[list[float], list[float]]:
    values = np.arange(256, dtype=np.float64) / 255.0
    means, stds = [], []
    for counts in hists:
        counts = np.asarray(counts, dtype=np.float64)
        total = counts.sum()
        if total == 0:
            raise DataError("no training pixels to estimate mean/std from")
        mean = float((counts * values).sum() / total)
        var = float((counts * (values - mean) ** 2).sum() / total)
        means.append(mean)
        stds.append(math.sqrt(var))
    return means, stds


# -- file datasets: the original encoded bytes --------------------------------------------------


def _write_encoded(name: str, spec: dict, raw: EncodedData, out_dir: Path, seed: int, samples_per_shard: int,
                   workers: int, *, shown: Path) -> dict:
    on_corrupt = spec.get("on_corrupt", "error")
    if on_corrupt not in ("error", "skip"):
        raise DataError(f"dataset {name!r}: key 'on_corrupt' must be 'error' or 'skip', got {on_corrupt!r}")
    n_train = len(raw.splits["train"])
    stats_rng = np.random.default_rng([seed, zlib.crc32(b"stats")])
    in_stats = set(stats_rng.choice(n_train, size=min(STATS_IMAGES, n_train), replace=False).tolist())
    jobs, shards_of = [], {}
    for split, items in raw.splits.items():
        order = _split_order(split, len(items), seed)
        shards_of[split] = []
        for i, chunk in enumerate(_chunks(order, samples_per_shard)):
            keys = [f"{split}-{int(index):07d}" for index in chunk]
            files, labels, described = [], [], []
            for index in chunk:
                file, relpath, label = items[int(index)]
                stats = split == "train" and int(index) in in_stats
                files.append((str(file), relpath, stats))
                labels.append(int(label))
                try:
                    st = os.stat(file)
                except OSError as e:
                    raise DataError(f"{file}: cannot read ({e.strerror or e})") from None
                described.append([relpath, int(label), stats, st.st_size, st.st_mtime_ns])
            job = _Job(out_dir=str(out_dir), name=f"{split}-{i:04d}.tar", dataset=name, format="encoded",
                       keys=keys, labels=labels, files=files, channels=raw.channels, on_corrupt=on_corrupt,
                       inputs=_digest("encoded", _subset(spec), raw.channels, on_corrupt, keys, described))
            shards_of[split].append(len(jobs))
            jobs.append(job)
    records = _run_jobs(jobs, workers, shown)
    splits = {}
    for split, idx in shards_of.items():
        samples = sum(records[j]["samples"] for j in idx)
        if samples == 0:
            raise DataError(f"dataset {name!r}: every image of split {split!r} was skipped as corrupt")
        splits[split] = {"samples": samples,
                         "shards": [{k: records[j][k] for k in ("name", "samples", "sha256")} for j in idx]}
    sizes = {tuple(r["size"]) if isinstance(r["size"], list) else r["size"] for r in records} - {"none"}
    # Only training images are in the stats sample: the other splits' histograms are zero.
    mean, std = _hist_stats(np.sum([r["hist"] for r in records], axis=0))
    info = {
        "dataset": name,
        "source": spec["source"],
        "format": "encoded",
        "seed": seed,
        "classes": list(raw.classes),
        "num_classes": len(raw.classes),
        **_subset_field(spec),
        "image_size": list(next(iter(sizes))) if len(sizes) == 1 and None not in sizes else None,
        "channels": raw.channels,
        "mean": mean,
        "std": std,
        "stats_images": sum(r["stats_images"] for r in records),
        "splits": splits,
        "skipped": [s for r in records for s in r["skipped"]],
        "linvit_version": __version__,
    }
    write_text(out_dir / MANIFEST, json.dumps(info, indent=2) + "\n")
    return info
