"""What a model sees of a dataset: the input pipeline a (teacher, dataset) pair trains and evaluates on.

Decided here, once, from three sources in this order: the dataset's `transform:` config entry, the
teacher's `pretrained_cfg` (input size, mean and std, interpolation, crop_pct: what a pretrained
timm model was trained to expect), and the shards' manifest (image size, channels, statistics).

- A fixed-size array dataset (PNG shards) without a `transform:` entry and with a teacher the
  harness trained keeps the original path: the whole image, normalized by the manifest's mean and
  std, no resizing and no augmentation (what the embedded default grid runs). `pipeline` is None.
- Otherwise the images go through timm's transforms (`linvit.data.transforms.Pipeline`): training
  batches through `create_transform(is_training=True, ...)` (random resized crop, flip, and what
  `transform.train` adds: RandAugment, random erasing...), evaluation through a resize and a
  center crop by crop_pct.

The input size is the `transform.input_size` if given, else the dataset's own image size when all
its images share one, else the teacher's pretrained input size. Nothing is resized silently to fit a
teacher: a size that is not a multiple of the teacher's patch is an error (`linvit.teachers.check_fit`).
"""

from __future__ import annotations

from .data.transforms import Pipeline


def _pair(size) -> tuple[int, int]:
    return (int(size), int(size)) if isinstance(size, int) else (int(size[0]), int(size[1]))


def _loaded(arch: dict | None) -> bool:
    return arch is not None and arch.get("source") in ("hub", "file")


def geometry(spec: dict, arch: dict | None, info: dict) -> tuple[tuple[int, int], int]:
    """(input size (h, w), channels) of the batches a model of `arch` gets from the dataset with
    config entry `spec` and manifest `info`: what must fit the teacher."""
    transform = spec.get("transform") or {}
    cfg = (arch or {}).get("pretrained_cfg") or {}
    if "input_size" in transform:
        size = _pair(transform["input_size"])
    elif info.get("image_size"):
        size = _pair(info["image_size"])
    elif cfg.get("input_size"):
        size = _pair(cfg["input_size"][1:])
    else:
        name = info.get("dataset", "<name>")
        raise ValueError(f"dataset {name!r}: its images differ in size; set datasets.{name}.transform.input_size")
    return size, int(info["channels"])


def pipeline(spec: dict, arch: dict | None, info: dict) -> Pipeline | None:
    """The pipeline of the dataset with config entry `spec` and manifest `info`, for a teacher of
    `arch` (its model.json; None before a trained teacher exists). None: the original array path."""
    transform = spec.get("transform")
    if transform is None and info.get("format", "png") == "png" and not _loaded(arch):
        return None
    transform = transform or {}
    size, channels = geometry(spec, arch, info)
    # A loaded teacher expects its own statistics and crop; a trained one learnt the manifest's,
    # on whole images. The dataset's transform entry overrides either.
    cfg = arch["pretrained_cfg"] if _loaded(arch) else {
        "mean": info["mean"], "std": info["std"], "interpolation": "bilinear", "crop_pct": 1.0}
    overrides = {k: transform[k] for k in ("mean", "std", "interpolation", "crop_pct") if k in transform}
    return Pipeline.from_pretrained_cfg(cfg, channels=channels, input_size=size,
                                        train=transform.get("train", {}), **overrides)
