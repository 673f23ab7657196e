"""Make a JPEG ImageFolder (``train/<class>/*.jpg``, ``test/<class>/*.jpg``) from an array dataset.

For trying the encoded-shard path and timm's transforms on real data available offline: e.g.
Fashion-MNIST resized to 32..256 px, converted to RGB and JPEG-encoded, feeds a "mini paper"
config with ``{source: imagefolder, path: <out_dir>}``.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np
from PIL import Image

from linvit.data.sources import DataError, EncodedData, load_raw

MARKER = "_imagefolder.json"  # the parameters a complete folder was made with


def class_folder(index: int, name: str) -> str:
    """A class's folder name: two-digit index (so sorted folders are in label order) + sanitized name."""
    return f"{index:02d}_" + (re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("_") or "class")


def make_imagefolder(source_spec: dict, out_dir: str | Path, *, size: int, per_class_train: int,
                     per_class_test: int, seed: int = 0, rgb: bool = True, quality: int = 90) -> Path:
    """Write a class-balanced, deterministic subset of an array dataset as JPEG files; return ``out_dir``.

    Per split and class, ``per_class_*`` images chosen by a generator seeded from (seed, split,
    class), resized to ``size`` x ``size`` (bicubic), converted to RGB if ``rgb``, saved as
    ``out_dir/{train,test}/<NN_class>/<index in the source split>.jpg`` at JPEG ``quality``. The folder
    is built beside ``out_dir`` and renamed into place when complete; a folder already made with the
    same parameters (its ``_imagefolder.json``) is left as it is. A different one made by this
    function is replaced; any other existing ``out_dir`` is an error.
    """
    out_dir = Path(out_dir)
    params = {"source": source_spec, "size": int(size), "per_class_train": int(per_class_train),
              "per_class_test": int(per_class_test), "seed": int(seed), "rgb": bool(rgb), "quality": int(quality)}
    marker = out_dir / MARKER
    if marker.is_file():
        try:
            if json.loads(marker.read_text()) == params:
                return out_dir
        except ValueError:
            pass
    elif out_dir.exists() and any(out_dir.iterdir()):
        raise DataError(f"{out_dir}: exists and was not made by make_imagefolder (no {MARKER}); not overwriting")
    if size < 1 or per_class_train < 1 or per_class_test < 1:
        raise DataError("make_imagefolder: size and per_class_* must be at least 1")
    raw = load_raw(str(source_spec.get("source")), source_spec)
    if isinstance(raw, EncodedData):
        raise DataError("make_imagefolder: wants an array source (fashion_mnist, digits, cifar, ...)")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.", suffix=".tmp", dir=out_dir.parent))
    try:
        for split, want in (("train", per_class_train), ("test", per_class_test)):
            if split not in raw.splits:
                raise DataError(f"make_imagefolder: source has no {split!r} split")
            images, labels = raw.splits[split]
            for label, name in enumerate(raw.classes):
                members = np.flatnonzero(labels == label)
                if len(members) < want:
                    raise DataError(f"make_imagefolder: class {name!r} has {len(members)} {split} images, "
                                    f"fewer than {want}")
                rng = np.random.default_rng([seed, label, 0 if split == "train" else 1])
                chosen = np.sort(rng.choice(members, size=want, replace=False))
                folder = tmp / split / class_folder(label, name)
                folder.mkdir(parents=True)
                for index in chosen:
                    image = images[index]
                    im = Image.fromarray(image[:, :, 0] if image.ndim == 3 and image.shape[2] == 1 else image)
                    im = im.resize((size, size), Image.BICUBIC)
                    im = im.convert("RGB") if rgb else im.convert("L") if im.mode not in ("L", "RGB") else im
                    im.save(folder / f"{int(index):05d}.jpg", format="JPEG", quality=quality)
        (tmp / MARKER).write_text(json.dumps(params, indent=2, sort_keys=True) + "\n")
        if out_dir.exists():  # made earlier with other parameters: swap it out
            old = out_dir.with_name(f".{out_dir.name}.old.tmp")
            shutil.rmtree(old, ignore_errors=True)
            out_dir.rename(old)
            tmp.rename(out_dir)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir
