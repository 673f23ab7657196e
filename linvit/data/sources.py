"""Find or fetch raw image-classification data, one registered source per kind of origin.

A source is a function ``(spec) -> RawData | EncodedData`` where ``spec`` is the dataset's config
entry (``{"source": "digits", ...}``). Array sources (idx, fashion_mnist, digits, synthetic, cifar)
return plain uint8 arrays; file sources (imagefolder) return the list of image files, whose
original bytes go into the shards. Writing shards is ``shards.py``'s job, reading them ``loader.py``'s.
"""

from __future__ import annotations

import gzip
import io
import os
import pickle
import shutil
import tarfile
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
from PIL import Image

from linvit.config import classes_problem
from linvit.io import atomic_path, remove_stale_temps


class DataError(ValueError):
    """Raw data or shards that are malformed, inconsistent or misconfigured; the message names the file or key."""


class MissingDataError(DataError, FileNotFoundError):
    """Data that is not where it should be (also a FileNotFoundError, so either catch works)."""


@dataclass
class RawData:
    """A dataset in memory: per split, uint8 images (N,H,W) or (N,H,W,C) and int64 labels (N,)."""

    splits: dict[str, tuple[np.ndarray, np.ndarray]]
    classes: list[str]


SOURCES: dict[str, Callable[[dict], "RawData | EncodedData"]] = {}
SOURCE_OPTIONS: dict[str, dict | None] = {}  # name -> its options' JSON-schema fragments (None: unchecked)
SOURCE_LABELS: dict[str, int | str | None] = {}  # name -> its number of labels, if known before loading


def register_source(name: str, options: dict | None = None, num_labels: int | str | None = None):
    """Register a source function under ``name`` (the value of a dataset's ``source`` key).

    `options`: the source's own keys of a dataset entry, each a JSON-schema fragment
    ({"type": "integer", "minimum": 1}). Written as a literal dict in the decorator call, it is read
    from this file without importing it (linvit.registry), and the config check refuses any other
    key of such a dataset (besides `source`, `labels`, `transform` and `classes`) and any value
    outside its fragment, naming the key, before planning. None: the entry's other keys are not checked.

    `num_labels`: how many labels the source gives, when that is known from the config alone (a
    literal too): a number, or the name of the option that sets it (its fragment's `default` when
    absent). The config check then refuses a `classes` entry outside them before planning; for
    the other sources (None) that is found when the data is loaded."""

    def decorate(fn: Callable[[dict], RawData]) -> Callable[[dict], RawData]:
        if name in SOURCES:
            raise ValueError(f"data source {name!r} is registered twice")
        SOURCES[name] = fn
        SOURCE_OPTIONS[name] = options
        SOURCE_LABELS[name] = num_labels
        return fn

    return decorate


def load_raw(name: str, spec: dict) -> RawData | EncodedData:
    """Load dataset ``name`` as its config entry ``spec`` says, checking the result's shape.

    Array sources give `RawData` (written as PNG shards); file sources (``imagefolder``) give
    `EncodedData` (shards that keep each file's original bytes). With a ``classes`` key (a list of
    the source's labels), only those classes' samples are kept, in every split, relabelled 0..k-1
    in the order given, their class names following them (`select_classes`): everything that reads
    the data (shards, their manifest's class count and names, the models' heads, predictions) sees
    the subset."""
    source = spec.get("source")
    if source not in SOURCES:
        raise DataError(f"dataset {name!r}: unknown source {source!r} (known: {', '.join(sorted(SOURCES))})")
    raw = SOURCES[source](spec)
    if isinstance(raw, EncodedData):
        if "train" not in raw.splits or not all(raw.splits.values()):
            raise DataError(f"dataset {name!r}: source gave no 'train' split or an empty split")
    else:
        _check_raw(name, raw)
    if spec.get("classes") is not None:
        raw = select_classes(name, raw, spec["classes"])
    return raw


def select_classes(name: str, raw: RawData | EncodedData, classes: list[int]) -> RawData | EncodedData:
    """`raw` with only the samples whose label is in `classes` (every split), relabelled to the
    label's position in `classes`; class names in that order. A problem is a DataError naming the
    config key datasets.<name>.classes."""
    key = f"config key datasets.{name}.classes"
    problem = classes_problem(classes, len(raw.classes))
    if problem:
        raise DataError(f"{key}: {problem}")
    new_label = np.full(len(raw.classes), -1, dtype=np.int64)
    new_label[np.asarray(classes, dtype=np.int64)] = np.arange(len(classes))
    names = [raw.classes[c] for c in classes]
    if isinstance(raw, EncodedData):
        splits = {split: [(file, rel, int(new_label[label])) for file, rel, label in items if new_label[label] >= 0]
                  for split, items in raw.splits.items()}
        empty = [split for split, items in splits.items() if not items]
    else:
        splits = {}
        for split, (x, y) in raw.splits.items():
            keep = new_label[y] >= 0
            splits[split] = (x[keep], new_label[y[keep]])
        empty = [split for split, (_, y) in splits.items() if len(y) == 0]
    if empty:
        raise DataError(f"{key}: split {empty[0]!r} has no sample of labels {', '.join(map(str, classes))}")
    if isinstance(raw, EncodedData):
        return EncodedData(splits=splits, classes=names, channels=raw.channels, root=raw.root)
    return RawData(splits=splits, classes=names)


def _check_raw(name: str, raw: RawData) -> None:
    # Catch a buggy source here, once, rather than as odd shards or a crash in training.
    if "train" not in raw.splits:
        raise DataError(f"dataset {name!r}: source gave no 'train' split (got {sorted(raw.splits)})")
    k = len(raw.classes)
    for split, (x, y) in raw.splits.items():
        if x.dtype != np.uint8 or x.ndim not in (3, 4) or len(x) != len(y) or len(x) == 0:
            raise DataError(f"dataset {name!r} split {split!r}: want uint8 (N,H,W[,C]) images matching "
                            f"labels, got {x.dtype} {x.shape} and {len(y)} labels")
        if y.min() < 0 or y.max() >= k:
            raise DataError(f"dataset {name!r} split {split!r}: labels outside 0..{k - 1}")


# --------------------------------------------------------------------------------------------
# IDX files (MNIST's format): magic 0x0000 + type byte + ndim byte, ndim big-endian uint32 dims,
# then the values big-endian.

_IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
IDX_FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}


def read_idx(path: str | Path) -> np.ndarray:
    """Parse one IDX file (gzip-compressed if its name ends in .gz)."""
    path = Path(path)
    try:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rb") as f:
            data = f.read()
    except (OSError, EOFError) as e:  # gzip.BadGzipFile is an OSError
        raise DataError(f"{path}: cannot read IDX file ({e})") from e
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_TYPES:
        raise DataError(f"{path}: not an IDX file (bad magic number {data[:4].hex()})")
    ndim = data[3]
    header = 4 + 4 * ndim
    if len(data) < header:
        raise DataError(f"{path}: IDX header truncated")
    dims = tuple(int(d) for d in np.frombuffer(data, ">u4", count=ndim, offset=4))
    dtype = np.dtype(_IDX_TYPES[data[2]])
    expected = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    if len(data) - header != expected:
        raise DataError(f"{path}: IDX dims {dims} need {expected} bytes of data, file has {len(data) - header}")
    return np.frombuffer(data, dtype, offset=header).reshape(dims).astype(dtype.newbyteorder("="))


def _find_idx(directory: Path, base: str) -> Path | None:
    for candidate in (directory / base, directory / f"{base}.gz"):
        if candidate.is_file():
            return candidate
    return None


def _missing_idx(directory: Path, names: dict[str, str]) -> list[str]:
    return [base for base in names.values() if _find_idx(directory, base) is None]


def _load_idx_dir(directory: Path, names: dict[str, str], classes: list[str] | None) -> RawData:
    """The four IDX files of `directory`; `classes`: the class names (label order), else "0", "1", ..."""
    splits = {}
    for split, prefix in (("train", "train"), ("test", "test")):
        img_path = _find_idx(directory, names[f"{prefix}_images"])
        lbl_path = _find_idx(directory, names[f"{prefix}_labels"])
        if img_path is None or lbl_path is None:
            raise MissingDataError(f"{directory}: missing {names[f'{prefix}_images']} or "
                                   f"{names[f'{prefix}_labels']} (.gz or not)")
        images, labels = read_idx(img_path), read_idx(lbl_path)
        if images.dtype != np.uint8 or images.ndim not in (3, 4):
            raise DataError(f"{img_path}: want uint8 images (N,H,W[,C]), got {images.dtype} {images.shape}")
        if labels.ndim != 1 or len(labels) != len(images):
            raise DataError(f"{lbl_path}: {labels.shape} labels do not match {len(images)} images in {img_path.name}")
        splits[split] = (images, labels.astype(np.int64))
    k = int(max(y.max() for _, y in splits.values())) + 1
    if classes is None:
        classes = [str(i) for i in range(k)]
    elif len(classes) < k:
        raise DataError(f"{directory}: labels go up to {k - 1} but the 'class_names' key names only {len(classes)}")
    return RawData(splits=splits, classes=list(classes))


def _idx_names(spec: dict) -> dict[str, str]:
    # Some mirrors rename the files (e.g. "t10k-images.idx3-ubyte"); let the config say so.
    return {key: spec.get(key, default) for key, default in IDX_FILES.items()}


@register_source("idx", options={
    "path": {"type": "string"}, "class_names": {"type": "array", "items": {"type": "string"}},
    "train_images": {"type": "string"}, "train_labels": {"type": "string"},
    "test_images": {"type": "string"}, "test_labels": {"type": "string"}})
def idx_source(spec: dict) -> RawData:
    """Any MNIST-format dataset in directory ``spec["path"]``; ``class_names``: its classes' names in
    label order (default "0", "1", ...). (``classes``, every source's key, keeps a subset of labels.)"""
    if "path" not in spec:
        raise DataError("source 'idx' needs a 'path' key: the directory holding the four IDX files")
    directory = Path(spec["path"]).expanduser()
    missing = _missing_idx(directory, _idx_names(spec))
    if missing:
        raise MissingDataError(f"{directory} (key 'path'): missing {', '.join(missing)} (.gz or not)")
    return _load_idx_dir(directory, _idx_names(spec), spec.get("class_names"))


# --------------------------------------------------------------------------------------------
# Fashion-MNIST: the user's directory, then the Debian package, then the official download.

FASHION_MNIST_CLASSES = ["T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
                         "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot"]
FASHION_MNIST_SYSTEM_DIR = Path("/usr/share/datasets/fashion-mnist")  # Debian: dataset-fashion-mnist
FASHION_MNIST_URL = "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/"
DOWNLOAD_TIMEOUT_S = 10.0


def fetch_url(url: str, dest: Path, timeout: float = DOWNLOAD_TIMEOUT_S) -> None:
    """Download ``url`` to ``dest`` atomically (a half-downloaded file never has the final name)."""
    with atomic_path(dest) as tmp, open(tmp, "wb") as out, urllib.request.urlopen(url, timeout=timeout) as response:
        shutil.copyfileobj(response, out)


def _download_fashion_mnist(cache: Path) -> str | None:
    """Fill ``cache`` with the four .gz files; return None on success, else why it failed."""
    remove_stale_temps(cache)  # partial downloads of a killed run
    for base in IDX_FILES.values():
        dest = cache / f"{base}.gz"
        if dest.is_file():
            continue
        url = FASHION_MNIST_URL.rstrip("/") + f"/{base}.gz"
        print(f"[linvit.data] downloading {url}", file=sys.stderr)
        try:
            fetch_url(url, dest)
        except (OSError, urllib.error.URLError, ValueError) as e:  # offline, timeout, HTTP error
            return f"{url}: {getattr(e, 'reason', None) or e}"
    return None


@register_source("fashion_mnist", options={"path": {"type": "string"}, "cache": {"type": "string"}},
                 num_labels=10)
def fashion_mnist_source(spec: dict) -> RawData:
    """Fashion-MNIST from ``spec["path"]``, else the Debian package's directory, else the download cache."""
    names = dict(IDX_FILES)
    if "path" in spec:
        # An explicit path that is wrong is a config mistake: say so rather than silently use another copy.
        directory = Path(spec["path"]).expanduser()
        missing = _missing_idx(directory, names)
        if missing:
            raise MissingDataError(f"fashion_mnist: key 'path' = {directory} lacks {', '.join(missing)} (.gz or not)")
        return _load_idx_dir(directory, names, FASHION_MNIST_CLASSES)
    if not _missing_idx(FASHION_MNIST_SYSTEM_DIR, names):
        return _load_idx_dir(FASHION_MNIST_SYSTEM_DIR, names, FASHION_MNIST_CLASSES)
    cache = Path(spec.get("cache", "~/.cache/linvit/fashion_mnist")).expanduser()
    why = _download_fashion_mnist(cache)
    if why is None:
        return _load_idx_dir(cache, names, FASHION_MNIST_CLASSES)
    raise MissingDataError(
        "fashion_mnist not found: set the dataset's 'path' key to a directory with the four IDX files, "
        f"or `apt-get install dataset-fashion-mnist` (fills {FASHION_MNIST_SYSTEM_DIR}), "
        f"or allow the download from {FASHION_MNIST_URL} into {cache} (failed: {why})")


# --------------------------------------------------------------------------------------------
# Small built-in and generic sources.


@register_source("digits", options={
    "test_fraction": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
    "split_seed": {"type": "integer", "minimum": 0}, "image_size": {"type": "integer", "minimum": 8}},
    num_labels=10)
def digits_source(spec: dict) -> RawData:
    """scikit-learn's bundled 8x8 digits, resized to 28x28 uint8, with a fixed stratified split."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    size = int(spec.get("image_size", 28))
    digits = load_digits()
    # 0..16 -> 0..255 as float, resized bilinearly in PIL's float mode so no precision is lost before rounding.
    images = np.stack([
        np.asarray(Image.fromarray((img * (255.0 / 16.0)).astype(np.float32), mode="F")
                   .resize((size, size), Image.BILINEAR))
        for img in digits.images])
    images = np.clip(np.rint(images), 0, 255).astype(np.uint8)
    labels = digits.target.astype(np.int64)
    train_idx, test_idx = train_test_split(
        np.arange(len(labels)), test_size=float(spec.get("test_fraction", 0.2)),
        random_state=int(spec.get("split_seed", 0)), stratify=labels)
    return RawData(splits={"train": (images[train_idx], labels[train_idx]),
                           "test": (images[test_idx], labels[test_idx])},
                   classes=[str(i) for i in range(10)])


def image_suffixes() -> set[str]:
    """File suffixes (lower case, with the dot) of the formats PIL can open: .jpg .jpeg .png .bmp .webp ..."""
    Image.init()
    # Not pictures, or formats PIL only opens with plugins or external programs.
    odd = {".h5", ".hdf", ".bufr", ".grib", ".mpeg", ".mpg", ".ps", ".eps", ".wmf", ".emf", ".fit", ".fits"}
    return {ext.lower() for ext, fmt in Image.registered_extensions().items() if fmt in Image.OPEN} - odd


IMAGE_SUFFIXES = image_suffixes()


@dataclass
class EncodedData:
    """A dataset of image files kept as they are encoded: per split, ``(file, relative path, label)``
    sorted by relative path (relative to ``root``); ``channels`` is the mode samples decode in."""

    splits: dict[str, list[tuple[Path, str, int]]]
    classes: list[str]
    channels: int
    root: Path


def _image_files(folder: Path) -> list[Path]:
    # Recursive (like torchvision's ImageFolder), sorted, hidden files (e.g. macOS "._x.jpg") left out.
    found = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
        for f in sorted(filenames):
            if not f.startswith(".") and os.path.splitext(f)[1].lower() in IMAGE_SUFFIXES:
                found.append(Path(dirpath) / f)
    return sorted(found, key=lambda p: p.relative_to(folder).as_posix())


@register_source("imagefolder", options={
    "path": {"type": "string"}, "channels": {"enum": [1, 3]}, "test_split": {"type": "string"},
    "on_corrupt": {"enum": ["error", "skip"]}})
def imagefolder_source(spec: dict) -> EncodedData:
    """``path/train/<class>/*`` and an evaluation folder ``path/test/<class>/*`` or ``path/val/<class>/*``
    (ImageNet's layout), kept as encoded files: the shards hold each file's original bytes.

    Keys: ``path``; ``channels`` (3, or 1: the mode samples decode in; a grayscale file in an RGB
    dataset is converted when decoded); ``test_split`` (the folder that becomes the ``test`` split;
    default ``test`` if it exists, else ``val``). Class names are the sorted train folder names, and
    the evaluation folder must have the same class folders. Any suffix PIL opens counts as an image
    (.jpg .jpeg .JPEG .png .bmp .webp ...); whether each file decodes is checked when shards are written.
    """
    if "path" not in spec:
        raise DataError("source 'imagefolder' needs a 'path' key: the directory holding train/ and test/ (or val/)")
    root = Path(spec["path"]).expanduser()
    channels = int(spec.get("channels", 3))
    if channels not in (1, 3):
        raise DataError(f"imagefolder: key 'channels' must be 1 or 3, got {channels}")
    test_split = spec.get("test_split")
    if test_split is None:
        test_split = "test" if (root / "test").is_dir() or not (root / "val").is_dir() else "val"
    folders = {"train": root / "train", "test": root / str(test_split)}
    for split, folder in folders.items():
        if not folder.is_dir():
            raise MissingDataError(f"{folder}: missing (imagefolder wants {root}/train and {root}/test or "
                                   f"{root}/val; key 'test_split' names the evaluation folder)")
    classes = sorted(d.name for d in folders["train"].iterdir() if d.is_dir() and not d.name.startswith("."))
    if not classes:
        raise DataError(f"{folders['train']}: no class folders")
    splits = {}
    for split, folder in folders.items():
        found = sorted(d.name for d in folder.iterdir() if d.is_dir() and not d.name.startswith("."))
        if found != classes:
            missing, extra = sorted(set(classes) - set(found)), sorted(set(found) - set(classes))
            raise DataError(f"{folder}: class folders {found} differ from train's {classes} "
                            f"(missing {missing}, extra {extra})")
        items = []
        for label, cls in enumerate(classes):
            files = _image_files(folder / cls)
            if not files:  # a class the model would have to predict but could never learn or be tested on
                raise DataError(f"{folder / cls}: class folder has no images (looked for files PIL opens: "
                                f"{', '.join(sorted(IMAGE_SUFFIXES)[:8])} ...)")
            items += [(f, f.relative_to(root).as_posix(), label) for f in files]
        splits[split] = items
    return EncodedData(splits=splits, classes=classes, channels=channels, root=root)


# --------------------------------------------------------------------------------------------
# CIFAR-10 / CIFAR-100, the "python version" archives: pickled dicts of numpy arrays.

_CIFAR_ALLOWED = {("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
                  ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "scalar"),
                  ("numpy._core.multiarray", "scalar"), ("_codecs", "encode")}


class _CifarUnpickler(pickle.Unpickler):
    """Unpickling is how the CIFAR format works; still, only numpy arrays are built, nothing else."""

    def find_class(self, module, name):
        if (module, name) not in _CIFAR_ALLOWED:
            raise pickle.UnpicklingError(f"unexpected object {module}.{name} in a CIFAR file")
        if module.startswith("numpy.core."):
            module = "numpy._core." + module[len("numpy.core."):] if hasattr(np, "_core") else module
        return super().find_class(module, name)


def _cifar_members(path: Path) -> tuple[dict[str, bytes], str]:
    """The CIFAR files by base name, read from the .tar.gz or the (extracted) folder; and where from."""
    wanted = {"data_batch_1", "data_batch_2", "data_batch_3", "data_batch_4", "data_batch_5", "test_batch",
              "batches.meta", "train", "test", "meta"}
    files: dict[str, bytes] = {}
    if path.is_file():
        try:
            with tarfile.open(path, "r:*") as tar:
                for member in tar:
                    base = member.name.rsplit("/", 1)[-1]
                    if member.isfile() and base in wanted:
                        files[base] = tar.extractfile(member).read()
        except (tarfile.TarError, OSError, EOFError) as e:
            raise DataError(f"{path}: cannot read CIFAR archive ({e})") from e
        return files, str(path)
    if not path.is_dir():
        raise MissingDataError(f"cifar: key 'path' = {path} is neither a .tar.gz nor a folder")
    for folder in (path, path / "cifar-10-batches-py", path / "cifar-100-python"):
        if folder.is_dir() and any((folder / w).is_file() for w in ("data_batch_1", "train")):
            for w in wanted:
                if (folder / w).is_file():
                    files[w] = (folder / w).read_bytes()
            return files, str(folder)
    raise MissingDataError(f"cifar: {path} holds neither cifar-10-batches-py/data_batch_1 nor cifar-100-python/train")


def _cifar_dict(files: dict[str, bytes], name: str, where: str) -> dict[bytes, object]:
    if name not in files:
        raise MissingDataError(f"{where}: CIFAR file {name!r} missing")
    try:
        d = _CifarUnpickler(io.BytesIO(files[name]), encoding="bytes").load()
    except Exception as e:  # noqa: BLE001 - any unpickling failure is a malformed file
        raise DataError(f"{where}: CIFAR file {name!r} does not unpickle ({type(e).__name__}: {e})") from e
    if not isinstance(d, dict):
        raise DataError(f"{where}: CIFAR file {name!r} is not a dict")
    return d


def _cifar_split(d: dict, key: bytes, name: str, where: str) -> tuple[np.ndarray, np.ndarray]:
    if b"data" not in d or key not in d:
        raise DataError(f"{where}: CIFAR file {name!r} lacks b'data' or {key!r}")
    data = np.asarray(d[b"data"], dtype=np.uint8)
    labels = np.asarray(d[key], dtype=np.int64)
    if data.ndim != 2 or data.shape[1] != 3072 or len(labels) != len(data):
        raise DataError(f"{where}: CIFAR file {name!r}: want (N, 3072) uint8 data and N labels, "
                        f"got {data.shape} and {labels.shape}")
    return data.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1).copy(), labels


def _names(d: dict, key: bytes, name: str, where: str) -> list[str]:
    if key not in d:
        raise DataError(f"{where}: CIFAR file {name!r} lacks {key!r}")
    return [n.decode() if isinstance(n, bytes) else str(n) for n in d[key]]


@register_source("cifar", options={"path": {"type": "string"}, "label_set": {"enum": ["fine", "coarse"]}})
def cifar_source(spec: dict) -> RawData:
    """CIFAR-10 or CIFAR-100 from the python archive (``path`` = ``cifar-10-python.tar.gz`` /
    ``cifar-100-python.tar.gz`` or the extracted folder). CIFAR-100: ``label_set: fine`` (100 classes,
    default) or ``coarse`` (20). 32x32 RGB arrays; the shards store them as PNG (lossless)."""
    if "path" not in spec:
        raise DataError("source 'cifar' needs a 'path' key: cifar-10-python.tar.gz, cifar-100-python.tar.gz "
                        "or the folder extracted from one")
    files, where = _cifar_members(Path(spec["path"]).expanduser())
    if "data_batch_1" in files:
        splits = [_cifar_split(_cifar_dict(files, f"data_batch_{i}", where), b"labels", f"data_batch_{i}", where)
                  for i in range(1, 6)]
        train = (np.concatenate([x for x, _ in splits]), np.concatenate([y for _, y in splits]))
        test = _cifar_split(_cifar_dict(files, "test_batch", where), b"labels", "test_batch", where)
        classes = _names(_cifar_dict(files, "batches.meta", where), b"label_names", "batches.meta", where)
    elif "train" in files:
        kind = spec.get("label_set", "fine")  # not `labels`: every dataset's own/teacher label space
        if kind not in ("fine", "coarse"):
            raise DataError(f"cifar: key 'label_set' must be 'fine' or 'coarse', got {kind!r}")
        key = f"{kind}_labels".encode()
        train = _cifar_split(_cifar_dict(files, "train", where), key, "train", where)
        test = _cifar_split(_cifar_dict(files, "test", where), key, "test", where)
        classes = _names(_cifar_dict(files, "meta", where), f"{kind}_label_names".encode(), "meta", where)
    else:
        raise MissingDataError(f"{where}: neither CIFAR-10 (data_batch_1) nor CIFAR-100 (train) files found")
    return RawData(splits={"train": train, "test": test}, classes=classes)


@register_source("synthetic", options={
    "num_classes": {"type": "integer", "minimum": 2, "default": 4}, "train_samples": {"type": "integer", "minimum": 1},
    "test_samples": {"type": "integer", "minimum": 1}, "image_size": {"type": "integer", "minimum": 8},
    "channels": {"enum": [1, 3]}, "seed": {"type": "integer", "minimum": 0}}, num_labels="num_classes")
def synthetic_source(spec: dict) -> RawData:
    """Tiny, deterministic and learnable: each class is a bright blob at its own spot, plus noise and jitter."""
    k = int(spec.get("num_classes", 4))
    size = int(spec.get("image_size", 28))
    channels = int(spec.get("channels", 1))
    if channels not in (1, 3):
        raise DataError(f"synthetic: key 'channels' must be 1 or 3, got {channels}")
    rng = np.random.default_rng(int(spec.get("seed", 0)))
    # Class centres spread evenly on a circle, so any two classes differ in where the blob is.
    angles = 2 * np.pi * np.arange(k) / k
    radius = size * 0.3
    centres = np.stack([size / 2 + radius * np.sin(angles), size / 2 + radius * np.cos(angles)], axis=1)
    tints = np.array([[1.0, 0.6, 0.3], [0.3, 1.0, 0.6], [0.6, 0.3, 1.0]])  # RGB: colour varies too
    yy, xx = np.mgrid[0:size, 0:size]

    def make(n: int) -> tuple[np.ndarray, np.ndarray]:
        labels = rng.integers(0, k, size=n)
        centre = centres[labels] + rng.uniform(-1.0, 1.0, size=(n, 2))
        dist2 = (yy[None] - centre[:, 0, None, None]) ** 2 + (xx[None] - centre[:, 1, None, None]) ** 2
        blob = 200.0 * np.exp(-dist2 / (2 * (size / 12) ** 2))
        images = blob + rng.uniform(0, 50, size=(n, size, size))
        if channels == 3:
            images = images[..., None] * tints[labels % 3][:, None, None, :]
        return np.clip(np.rint(images), 0, 255).astype(np.uint8), labels.astype(np.int64)

    train = make(int(spec.get("train_samples", 256)))
    test = make(int(spec.get("test_samples", 128)))
    return RawData(splits={"train": train, "test": test}, classes=[str(i) for i in range(k)])
