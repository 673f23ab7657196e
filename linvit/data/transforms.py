"""Image transforms for the loader: timm's own train and eval transforms, described by a picklable `Pipeline`.

A `Pipeline` says what a model wants to see: ``input_size`` (h, w), ``channels`` (1 or 3: the mode
the samples are decoded in), the normalization ``mean``/``std``, the resize ``interpolation`` and
``crop_pct`` (evaluation resizes to size/crop_pct and center-crops, timm's eval transform), and
``train``: extra keyword arguments of ``timm.data.create_transform(is_training=True, ...)``
(``scale``, ``ratio``, ``hflip``, ``vflip``, ``color_jitter``, ``auto_augment`` such as
``"rand-m9-mstd0.5-inc1"`` (RandAugment), ``re_prob``, ``re_mode``, ``re_count`` ...).

It is a plain dataclass, so it pickles into loader worker processes, which build the transforms
there. Randomness: `apply` seeds Python's, numpy's and torch's generators from a per-sample seed
(`sample_seed`: seed, epoch, sample key), so a sample's augmentation is the same in any process,
with any number of workers, and in a resumed run.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import asdict, dataclass, field

import numpy as np
import torch
from PIL import Image

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


@dataclass
class Pipeline:
    """What the loader turns each decoded image into (see the module docstring)."""

    input_size: tuple[int, int]
    channels: int = 3
    mean: tuple[float, ...] = IMAGENET_MEAN
    std: tuple[float, ...] = IMAGENET_STD
    interpolation: str = "bicubic"
    crop_pct: float = 0.875
    train: dict = field(default_factory=dict)

    def __post_init__(self):
        size = self.input_size
        self.input_size = (int(size), int(size)) if isinstance(size, (int, np.integer)) else tuple(int(s) for s in size)
        self.mean, self.std = tuple(float(m) for m in self.mean), tuple(float(s) for s in self.std)
        self.train = dict(self.train or {})
        if len(self.input_size) != 2 or min(self.input_size) < 1:
            raise ValueError(f"Pipeline: input_size must be (h, w), got {size}")
        if self.channels not in (1, 3):
            raise ValueError(f"Pipeline: channels must be 1 or 3, got {self.channels}")
        if len(self.mean) != self.channels or len(self.std) != self.channels:
            raise ValueError(f"Pipeline: mean and std need {self.channels} values, got {self.mean} and {self.std}")
        bad = {"input_size", "is_training", "mean", "std", "interpolation", "crop_pct"} & set(self.train)
        if bad:
            raise ValueError(f"Pipeline: train keys {sorted(bad)} are set by the Pipeline's own fields")

    @property
    def mode(self) -> str:
        """The PIL mode samples are decoded in."""
        return "L" if self.channels == 1 else "RGB"

    def transform(self, train: bool):
        """timm's transform: ``create_transform(input_size=(C,h,w), is_training=train, ...)``; PIL in, tensor out."""
        from timm.data import create_transform

        _patch_timm_posterize()
        return create_transform(input_size=(self.channels, *self.input_size), is_training=train,
                                mean=self.mean, std=self.std, interpolation=self.interpolation,
                                crop_pct=self.crop_pct, **(self.train if train else {}))

    def to_dict(self) -> dict:
        d = asdict(self)
        d.update(input_size=list(self.input_size), mean=list(self.mean), std=list(self.std))
        return d

    @classmethod
    def from_pretrained_cfg(cls, cfg: dict, *, channels: int | None = None, input_size=None,
                            train: dict | None = None, **overrides) -> "Pipeline":
        """The pipeline a timm model's ``pretrained_cfg`` asks for (input_size, mean, std,
        interpolation, crop_pct), with ``train`` augmentation and any field overridden.

        ``channels`` other than the cfg's: 1-channel data for an RGB model averages mean/std.
        """
        c, h, w = cfg.get("input_size", (3, 224, 224))
        mean, std = tuple(cfg.get("mean", IMAGENET_MEAN)), tuple(cfg.get("std", IMAGENET_STD))
        channels = c if channels is None else channels
        if channels != len(mean):
            mean, std = (float(np.mean(mean)),) * channels, (float(np.mean(std)),) * channels
        fields = dict(input_size=input_size or (h, w), channels=channels, mean=mean, std=std,
                      interpolation=cfg.get("interpolation", "bicubic"), crop_pct=cfg.get("crop_pct", 0.875),
                      train=train or {})
        fields.update(overrides)
        return cls(**fields)


def _posterize(img, bits_to_keep, **__):
    """timm's posterize, as it behaved before Pillow 12: RandAugment's "inc1" magnitudes (with
    mstd noise) reach 0 bits, which newer Pillow refuses (ValueError); 0 bits keeps nothing (black)."""
    from PIL import ImageOps

    if bits_to_keep >= 8:
        return img
    if bits_to_keep < 1:
        return img.point(lambda _: 0)
    return ImageOps.posterize(img, bits_to_keep)


def _patch_timm_posterize() -> None:
    from timm.data import auto_augment

    for name, op in list(auto_augment.NAME_TO_OP.items()):
        if op is auto_augment.posterize:
            auto_augment.NAME_TO_OP[name] = _posterize


def sample_seed(seed: int, epoch: int, key: str) -> int:
    """The seed of one sample's augmentation: from (seed, epoch, sample key), the same in every process."""
    return int.from_bytes(hashlib.sha256(f"{seed}:{epoch}:{key}".encode()).digest()[:8], "little")


def apply(transform, image: Image.Image, seed: int | None) -> torch.Tensor:
    """``transform(image)`` with the generators timm and torchvision draw from seeded by ``seed``
    (None: not seeded, for deterministic transforms). The caller keeps other users of these global
    generators away (a worker process, or `preserved_rng` around the batch)."""
    if seed is not None:
        random.seed(seed)
        np.random.seed(seed % (1 << 32))
        torch.default_generator.manual_seed(seed)  # the CPU generator only: CUDA's stays the trainer's
    return transform(image)


class preserved_rng:
    """Restore Python's, numpy's and torch's (CPU) global generators on exit, so seeding samples in
    the training process does not change the training loop's own random draws."""

    def __enter__(self):
        self.state = random.getstate(), np.random.get_state(), torch.random.get_rng_state()
        return self

    def __exit__(self, *exc):
        py, nps, th = self.state
        random.setstate(py)
        np.random.set_state(nps)
        torch.random.set_rng_state(th)
        return False
