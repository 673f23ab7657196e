"""Runs paired into a sample: by seed and by test image, and the sample's moments.

Seeds are the unit of replication. A claim's statistic compares roles trained with the same seeds
on the same test images, so it is paired on both (`pair`): the roles' runs are matched by seed (the
seeds every role finished; the others are named) and image by image (runs on other test sets are a
one-line `PairingError`, never paired silently). Without per-image predictions the cell is paired
by seed on the runs' accuracies alone.

A statistic is a contrast of accuracies, L = sum_r w_r acc_r (a difference: {a: 1, b: -1}), or a ratio
of two contrasts (a share of a benefit). For a contrast, X[s, i] = sum_r w_r c[r, s, i] (c: 1 where
run (r, s) is right on image i). `contrast_moments` gives the contrasts' means over the paired seeds and
images and the covariance of those means in two parts, seeds and test images (the variance model is
linvit.stats.paired's).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from linvit.predictions import Predictions

SEEDS_AND_IMAGES, SEEDS_ONLY = "seeds and test images", "seeds only (no per-image predictions)"

Contrast = Mapping[str, float]  # role -> weight: the statistic sum_r w_r acc_r


class PairingError(ValueError):
    """Runs that cannot be paired image by image (different test sets)."""


@dataclass(frozen=True)
class Run:
    """One finished run of a role: its seed, test accuracy and per-image predictions (None when it has none)."""

    seed: int
    acc: float
    predictions: Predictions | None = None
    name: str = ""  # for messages: the file or run key


@dataclass
class Sample:
    """The paired data of one claim cell: per role, a (seeds x images) correctness matrix (seeds in
    `seeds` order, images in the test split's order), or (seeds x 1) accuracies without predictions.
    Its moments are computed once, on first use by `estimate` or `test`, for as long as `matrices` is
    the same dict."""

    matrices: dict[str, np.ndarray]
    seeds: list[int]
    images: int  # 0: no per-image predictions
    mode: str
    missing: dict[str, list[int]] = field(default_factory=dict)  # role -> seeds it lacks that others have

    def describe(self) -> str:
        """'3 seeds (0, 1, 2) x 10000 test images', '3 seeds (0, 1, 2); seeds only (no per-image
        predictions)', with the seeds a role lacks named."""
        seeds = f"{len(self.seeds)} seed{'s' if len(self.seeds) != 1 else ''} ({', '.join(map(str, self.seeds))})"
        used = f"{seeds} x {self.images} test images" if self.images else seeds
        note = "" if self.mode == SEEDS_AND_IMAGES else f"; {self.mode}"
        gaps = "; ".join(f"seed{'s' if len(s) > 1 else ''} {', '.join(map(str, s))} missing for {role}"
                         for role, s in self.missing.items())
        return used + note + (f"; {gaps}" if gaps else "")


def pair(runs: Mapping[str, list[Run]]) -> Sample:
    """Pair the roles' runs by seed (the seeds all roles have) and by test image; PairingError when
    two runs' test sets differ (or a role has no run). Without predictions for every paired run, the
    matrices hold the runs' accuracies (seeds only)."""
    by_seed = {role: {r.seed: r for r in rs} for role, rs in runs.items()}
    empty = [role for role, rs in by_seed.items() if not rs]
    if empty:
        raise PairingError(f"no finished run of {', '.join(empty)}")
    common = sorted(set.intersection(*(set(s) for s in by_seed.values())))
    every = set().union(*(set(s) for s in by_seed.values()))
    missing = {role: sorted(every - set(s)) for role, s in by_seed.items() if every - set(s)}
    if not common:
        raise PairingError("the roles share no seed (" + "; ".join(
            f"{role}: seeds {', '.join(map(str, sorted(s)))}" for role, s in by_seed.items()) + ")")
    chosen = {role: [s[seed] for seed in common] for role, s in by_seed.items()}
    if all(r.predictions is not None for rs in chosen.values() for r in rs):
        first = chosen[next(iter(chosen))][0]
        for rs in chosen.values():
            for r in rs:
                _same_test_set(first, r)
        matrices = {role: np.stack([r.predictions.correct for r in rs]).astype(np.float32)
                    for role, rs in chosen.items()}
        mode = SEEDS_AND_IMAGES
        return Sample(matrices, common, first.predictions.samples, mode, missing)
    matrices = {role: np.array([[r.acc] for r in rs], dtype=np.float64) for role, rs in chosen.items()}
    return Sample(matrices, common, 0, SEEDS_ONLY, missing)


def _same_test_set(a: Run, b: Run) -> None:
    pa, pb = a.predictions, b.predictions
    what = f"cannot pair {a.name or f'seed {a.seed}'} with {b.name or f'seed {b.seed}'}"
    if pa.samples != pb.samples:
        raise PairingError(f"{what}: {pa.samples} vs {pb.samples} test images")
    if pa.digest != pb.digest:
        raise PairingError(f"{what}: different test sets (split digest {pa.digest[:12]} vs {pb.digest[:12]})")
    if not np.array_equal(pa.label, pb.label):
        raise PairingError(f"{what}: same test images but different labels")


class _Moments:
    """Every role's mean accuracy over the paired seeds and images, and the (co)variance of those means
    in two parts: seeds (covariance of the per-seed accuracies / n) and test images (covariance of the
    per-image seed-means / N, less the seed-by-image interaction, which the seed part already carries).
    Computed once per sample (`Sample` caches it): every statistic of a cell is a projection of these
    (role x role) matrices, so a cell's ten tests cost one pass over its data."""

    def __init__(self, sample: Sample):
        self.roles = list(sample.matrices)
        c = np.stack([sample.matrices[r] for r in self.roles]).astype(np.float64)  # (roles, seeds, images)
        k, n, N = c.shape
        self.n, self.N = n, sample.images
        rows, cols = c.mean(axis=2), c.mean(axis=1)  # per-seed accuracies, per-image seed-means
        self.means = rows.mean(axis=1)
        self.seed = np.cov(rows, ddof=1).reshape(k, k) / n if n > 1 else np.full((k, k), np.nan)
        self.image = np.zeros((k, k))
        if self.N > 1:
            self.image = np.cov(cols, ddof=1).reshape(k, k) / N
            if n > 1:
                # The interaction's cross-products from the raw ones (no residual matrices):
                # sum_si c c' - N sum_s rows rows' - n sum_i cols cols' + nN mean mean'.
                flat = c.reshape(k, n * N)
                interaction = (flat @ flat.T - N * rows @ rows.T - n * cols @ cols.T
                               + n * N * np.outer(self.means, self.means)) / ((n - 1) * (N - 1))
                self.image -= interaction / (n * N)

    def project(self, parts: Sequence[Contrast]) -> tuple[np.ndarray, np.ndarray]:
        """The contrasts' means and the covariance of those means: seed part plus image part, the image
        part's negative directions set to 0 (its unbiased estimate can dip below 0 when it is tiny)."""
        means, seed, image = self.project_parts(parts)
        return means, seed + image

    def project_parts(self, parts: Sequence[Contrast]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The contrasts' means, and their covariance's seed part (which shrinks as 1 / seeds) and image
        part (which does not: every seed shares the test images), apart."""
        unknown = {r for p in parts for r in p} - set(self.roles)
        if unknown:
            raise KeyError(f"no runs of {', '.join(sorted(unknown))} in the sample")
        w = np.array([[float(p.get(r, 0.0)) for r in self.roles] for p in parts])
        image = w @ self.image @ w.T
        if len(parts) == 1:
            image = np.clip(image, 0.0, None)
        else:
            vals, vecs = np.linalg.eigh(image)
            image = (vecs * np.clip(vals, 0.0, None)) @ vecs.T
        return w @ self.means, w @ self.seed @ w.T, image


def _moments(sample: Sample) -> _Moments:
    cached = sample.__dict__.get("_moments")
    if cached is None or cached[0] is not sample.matrices:
        cached = sample.__dict__["_moments"] = (sample.matrices, _Moments(sample))
    return cached[1]


def contrast_moments(sample: Sample, numerator: Contrast, denominator: Contrast | None):
    """(n, N, means, the covariance's seed part, its image part) of the numerator (and denominator) contrast."""
    m = _moments(sample)
    return m.n, m.N, *m.project_parts([numerator] if denominator is None else [numerator, denominator])
