"""A run's per-image test predictions (predictions.npz in its folder), for paired statistics.

`run_student` writes, from the final evaluation that gives the run's test accuracy, the predicted
and true label of every test image in the split's fixed (manifest) order, with what identifies that
test set: the number of images and a digest of the split's shards (sample counts and sha256, in
order). Two runs are paired image by image only when both match (linvit.stats.pairing checks).

    pred     int16 (n,)  predicted class of each test image
    label    int16 (n,)  its label
    samples  int64 ()    n
    digest   str ()      sha256 of the test split's shard list (linvit.predictions.split_digest)

About 13 kB compressed for 10k images at 90% accuracy (measured; int16 up to 32,767 classes, int32 beyond).
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .io import atomic_path

PREDICTIONS = "predictions.npz"


class PredictionsError(ValueError):
    """A predictions file cannot be read or breaks the contract; the message names the file and key."""


@dataclass(frozen=True)
class Predictions:
    pred: np.ndarray
    label: np.ndarray
    digest: str

    @property
    def samples(self) -> int:
        return len(self.label)

    @property
    def correct(self) -> np.ndarray:
        return self.pred == self.label


def split_digest(info: dict, split: str = "test") -> str:
    """sha256 of a split's shards (sample count and content hash, in manifest order): the same test
    images in the same order give the same digest, whatever the folder is called."""
    shards = [[int(s["samples"]), s["sha256"]] for s in info["splits"][split]["shards"]]
    return hashlib.sha256(json.dumps(shards).encode()).hexdigest()


def write_predictions(path: str | Path, pred: np.ndarray, label: np.ndarray, digest: str) -> Path:
    pred, label = np.asarray(pred), np.asarray(label)
    if pred.shape != label.shape or pred.ndim != 1:
        raise ValueError(f"{path}: pred {pred.shape} and label {label.shape} must be equal 1-d arrays")
    dtype = np.int16 if max(int(pred.max(initial=0)), int(label.max(initial=0))) < 2**15 else np.int32
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:  # a file object: numpy would add .npz to a bare name
            np.savez_compressed(fh, pred=pred.astype(dtype), label=label.astype(dtype),
                                samples=np.int64(len(label)), digest=np.str_(digest))
    return Path(path)


def read_predictions(path: str | Path) -> Predictions:
    path = Path(path)
    if path.is_file() and not zipfile.is_zipfile(path):  # else numpy guesses a pickle and says so
        raise PredictionsError(f"{path}: cannot be read (not an .npz archive)")
    try:
        with np.load(path, allow_pickle=False) as npz:
            missing = [k for k in ("pred", "label", "samples", "digest") if k not in npz.files]
            if missing:
                raise PredictionsError(f"{path}: missing key '{missing[0]}'")
            pred, label = npz["pred"].astype(np.int64), npz["label"].astype(np.int64)
            samples, digest = int(npz["samples"]), str(npz["digest"])
    except PredictionsError:
        raise
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as err:
        why = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise PredictionsError(f"{path}: cannot be read ({why})") from None
    if pred.ndim != 1 or pred.shape != label.shape:
        raise PredictionsError(f"{path}: 'pred' {pred.shape} and 'label' {label.shape} must be equal 1-d arrays")
    if samples != len(label):
        raise PredictionsError(f"{path}: 'samples' is {samples} but the file holds {len(label)} labels")
    return Predictions(pred, label, digest)
