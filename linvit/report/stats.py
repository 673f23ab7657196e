"""The statistics behind the claim verdicts: a paired bootstrap over seeds and test images.

A claim cell compares roles (random, copy_all, ..., the softmax reference) trained with the same
seeds on the same test images, so the comparison is paired on both:

* seeds: the roles' runs are matched by seed; only the seeds every role of the claim finished are
  used (the others are named as missing);
* test images: each run's per-image predictions (predictions.npz, linvit.predictions) are matched
  image by image; runs on different test sets (another number of images, another split digest or
  other labels) are refused with a one-line `PairingError`, never paired silently.

Each bootstrap replicate draws the seeds with replacement and the test images with replacement (as
multinomial counts), the same draw for every role, recomputes every role's accuracy (correctness
matrix @ image counts, then the drawn seeds' mean) and the claim's statistic from them: a
difference of accuracies, or a share of the pretrained benefit (a ratio of differences). The
interval is the percentile interval of the replicates at `claims.level` (default 0.95), from
`claims.bootstrap` replicates (default 2000), drawn from a generator seeded with `claims.seed`
(default 0), so the same results give the same report. The point estimate is the statistic of the
plain means over the paired seeds and all images.

* one seed: the test-image bootstrap alone (the interval then says nothing about seed-to-seed
  variation, and the verdict says so);
* runs without per-image predictions (results from before they were recorded): the seed bootstrap
  alone, which needs at least two seeds; with one seed there is no interval and the verdict is
  "inconclusive: no interval (no per-image predictions)".

A share's replicate whose denominator (the benefit) is not positive has no finite value: it counts
as +inf (-inf when its numerator is negative), so an interval that reaches it is unbounded on that
side and cannot clear a threshold there.

Verdict of a statistic against its threshold: "holds" when the whole interval lies on the claim's
side of the threshold, "fails" when it lies wholly on the other side, "inconclusive" when it
straddles the threshold. A claim with two parts (C1: both shares <= negligible) holds when both
parts hold and fails when either fails; otherwise it is inconclusive.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import numpy as np

from linvit.predictions import Predictions

HOLDS, FAILS, INCONCLUSIVE = "holds", "fails", "inconclusive"
OUTCOMES = (HOLDS, FAILS, INCONCLUSIVE)
DEFAULTS = {"level": 0.95, "bootstrap": 2000, "seed": 0}
SEEDS_AND_IMAGES, IMAGES_ONLY, SEEDS_ONLY, NO_INTERVAL = ("seeds and test images", "test images only (one seed)",
                                                        "seeds only (no per-image predictions)",
                                                        "no interval (no per-image predictions)")
_CHUNK = 250  # replicates per block: the (replicates x images) count matrix stays ~10 MB for 10k images


class PairingError(ValueError):
    """Runs that cannot be paired image by image (different test sets)."""


@dataclass(frozen=True)
class Settings:
    level: float = DEFAULTS["level"]
    replicates: int = DEFAULTS["bootstrap"]
    seed: int = DEFAULTS["seed"]

    @classmethod
    def from_config(cls, config: dict) -> Settings:
        given = config.get("claims") or {}
        if not isinstance(given, dict):
            raise ValueError(f"config: 'claims' must be a mapping, got {given!r}")
        level, replicates, seed = (given.get(k, DEFAULTS[k]) for k in ("level", "bootstrap", "seed"))
        if isinstance(level, bool) or not isinstance(level, (int, float)) or not 0 < level < 1:
            raise ValueError(f"config: 'claims.level' is {level!r}, expected a number between 0 and 1 (e.g. 0.95)")
        for key, value in (("bootstrap", replicates), ("seed", seed)):
            if isinstance(value, bool) or not isinstance(value, int) or value < (100 if key == "bootstrap" else 0):
                raise ValueError(f"config: 'claims.{key}' is {value!r}, expected a whole number"
                                 + (" of at least 100" if key == "bootstrap" else " >= 0"))
        return cls(float(level), replicates, seed)


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
    `seeds` order, images in the test split's order), or (seeds x 1) accuracies without predictions."""

    matrices: dict[str, np.ndarray]
    seeds: list[int]
    images: int  # 0: no per-image predictions
    mode: str
    missing: dict[str, list[int]] = field(default_factory=dict)  # role -> seeds it lacks that others have

    def describe(self) -> str:
        """'3 seeds x 10000 test images', '1 seed x 10000 test images (test images only)', ..."""
        seeds = f"{len(self.seeds)} seed{'s' if len(self.seeds) != 1 else ''} ({', '.join(map(str, self.seeds))})"
        used = f"{seeds} x {self.images} test images" if self.images else seeds
        note = "" if self.mode == SEEDS_AND_IMAGES else f"; {self.mode}"
        gaps = "; ".join(f"seed{'s' if len(s) > 1 else ''} {', '.join(map(str, s))} missing for {role}"
                         for role, s in self.missing.items())
        return used + note + (f"; {gaps}" if gaps else "")


@dataclass(frozen=True)
class Interval:
    estimate: float
    low: float
    high: float
    level: float

    @property
    def bounded(self) -> bool:
        return not (math.isnan(self.low) or math.isnan(self.high))


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
        mode = SEEDS_AND_IMAGES if len(common) > 1 else IMAGES_ONLY
        return Sample(matrices, common, first.predictions.samples, mode, missing)
    matrices = {role: np.array([[r.acc] for r in rs], dtype=np.float64) for role, rs in chosen.items()}
    return Sample(matrices, common, 0, SEEDS_ONLY if len(common) > 1 else NO_INTERVAL, missing)


def _same_test_set(a: Run, b: Run) -> None:
    pa, pb = a.predictions, b.predictions
    what = f"cannot pair {a.name or f'seed {a.seed}'} with {b.name or f'seed {b.seed}'}"
    if pa.samples != pb.samples:
        raise PairingError(f"{what}: {pa.samples} vs {pb.samples} test images")
    if pa.digest != pb.digest:
        raise PairingError(f"{what}: different test sets (split digest {pa.digest[:12]} vs {pb.digest[:12]})")
    if not np.array_equal(pa.label, pb.label):
        raise PairingError(f"{what}: same test images but different labels")


Statistic = Callable[[Mapping[str, np.ndarray]], np.ndarray]


def bootstrap(sample: Sample, statistics: Mapping[str, Statistic], settings: Settings) -> dict[str, Interval]:
    """Each statistic (role -> accuracies array -> values array) as a point estimate and percentile
    interval; every statistic sees the same replicates. Without an interval (NO_INTERVAL) the bounds are NaN."""
    roles = list(sample.matrices)
    stacked = np.concatenate([sample.matrices[r] for r in roles])  # (roles*seeds, images)
    n_seeds, n_images = len(sample.seeds), stacked.shape[1]
    point = stacked.mean(axis=1, dtype=np.float64).reshape(len(roles), n_seeds).mean(axis=1)
    estimates = {name: float(f({r: point[i:i + 1] for i, r in enumerate(roles)})[0]) for name, f in statistics.items()}
    if sample.mode == NO_INTERVAL:
        return {name: Interval(v, math.nan, math.nan, settings.level) for name, v in estimates.items()}
    rng = np.random.default_rng(settings.seed)
    resample_images = sample.images > 0
    values = {name: [] for name in statistics}
    for start in range(0, settings.replicates, _CHUNK):
        k = min(_CHUNK, settings.replicates - start)
        if resample_images:
            counts = _multinomial_counts(rng, n_images, k)  # (k, images)
            # (k, images) @ (images, roles*seeds): this operand order is ~20x faster in OpenBLAS than the transpose.
            per_seed = (counts @ stacked.T).T / n_images      # (roles*seeds, k)
        else:
            per_seed = np.repeat(stacked, k, axis=1)
        seed_counts = _multinomial_counts(rng, n_seeds, k) if n_seeds > 1 else np.ones((k, 1))
        per_seed = per_seed.reshape(len(roles), n_seeds, k)
        accs = np.einsum("rsk,ks->rk", per_seed, seed_counts) / n_seeds  # (roles, k)
        for name, f in statistics.items():
            values[name].append(np.asarray(f({r: accs[i] for i, r in enumerate(roles)}), dtype=np.float64))
    tail = 100 * (1 - settings.level) / 2
    out = {}
    for name, chunks in values.items():
        draws = np.concatenate(chunks)
        low, high = np.percentile(draws, [tail, 100 - tail], method="inverted_cdf")  # an observed value, even next to inf
        out[name] = Interval(estimates[name], float(low), float(high), settings.level)
    return out


def _multinomial_counts(rng: np.random.Generator, n: int, k: int) -> np.ndarray:
    """k rows of how often each of n items is drawn in n draws with replacement (float32)."""
    idx = rng.integers(0, n, size=(k, n), dtype=np.int32)  # half the memory traffic of int64
    idx += (np.arange(k, dtype=np.int32) * n)[:, None]       # row r counts into bins r*n .. r*n+n-1
    return np.bincount(idx.ravel(), minlength=k * n).reshape(k, n).astype(np.float32)


def difference(a: str, b: str) -> Statistic:
    """acc(a) - acc(b)."""
    return lambda acc: acc[a] - acc[b]


def share(a: str, b: str, top: str, bottom: str) -> Statistic:
    """(acc(a) - acc(b)) / (acc(top) - acc(bottom)); a non-positive denominator gives +-inf (see module doc)."""
    def f(acc):
        num, den = acc[a] - acc[b], acc[top] - acc[bottom]
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = num / den
        return np.where(den > 0, ratio, np.where(num < 0, -np.inf, np.inf))
    return f


def decide(interval: Interval, threshold: float, side: str) -> str:
    """side '>=': the claim is statistic >= threshold; '<=': statistic <= threshold."""
    if not interval.bounded:
        return INCONCLUSIVE
    if side == ">=":
        return HOLDS if interval.low >= threshold else FAILS if interval.high < threshold else INCONCLUSIVE
    if side == "<=":
        return HOLDS if interval.high <= threshold else FAILS if interval.low > threshold else INCONCLUSIVE
    raise ValueError(f"side must be '>=' or '<=', got {side!r}")


def combine(outcomes: list[str]) -> str:
    """A claim with several parts: holds when all hold, fails when any fails, else inconclusive."""
    if any(o == FAILS for o in outcomes):
        return FAILS
    return HOLDS if outcomes and all(o == HOLDS for o in outcomes) else INCONCLUSIVE


def interval_text(i: Interval, scale: float = 100.0, unit: str = " pp") -> str:
    """'+1.20 pp [95% CI -0.30, +2.60]' (values times `scale`); '[no interval]' without one."""
    if not i.bounded:
        return f"{scale * i.estimate:+.2f}{unit} [no interval]"
    return f"{scale * i.estimate:+.2f}{unit} [{100 * i.level:g}% CI {scale * i.low:+.2f}, {scale * i.high:+.2f}]"


def rules_markdown(config: dict) -> str:
    """The statistical rules behind the verdicts, in words, for the report to include verbatim."""
    from linvit.report.claims import Thresholds  # claims imports this module

    s, t = Settings.from_config(config), Thresholds.from_config(config)
    level = f"{100 * s.level:g}%"
    return "\n".join([
        f"Each claim is judged per cell (dataset, size, variant, budget) by a paired bootstrap: the roles' runs "
        f"are paired by seed (only the seeds every role of the claim finished; missing seeds are named) and by "
        f"test image (runs on different test sets are never paired). Each of {s.replicates} replicates "
        f"(config `claims.bootstrap`; generator seeded with `claims.seed` = {s.seed}, so the report is "
        f"reproducible) draws the seeds and the test images with replacement, the same draw for every role, "
        f"and recomputes each role's accuracy and the claim's statistic. The interval is the {level} percentile "
        f"interval of the replicates (config `claims.level`); the point estimate uses the plain means.",
        "",
        "- With one seed only the test images are resampled (the interval ignores seed-to-seed variation; the "
        "cell says so). Runs without per-image predictions (older results) are resampled over seeds alone, "
        "which needs two seeds or more; otherwise the cell is inconclusive with no interval.",
        "- A share of the pretrained benefit is a ratio of differences; a replicate whose benefit is not "
        "positive gives an unbounded share, so such an interval cannot clear a threshold on that side.",
        f"- **holds**: the whole interval lies on the claim's side of its threshold; **fails**: it lies wholly on "
        f"the other side; **inconclusive**: it straddles the threshold. A two-part claim holds when both parts "
        f"hold and fails when either fails.",
        f"- C1: strict share (attn_only - random) / (copy_all - random) and symmetric share (copy_all - copy_mlp) "
        f"/ (copy_all - random), each <= {100 * t.negligible:g}% (`claims.negligible`).",
        f"- C2: symmetric share (copy_mlp - random) / (copy_all - random) >= {100 * t.most:g}% (`claims.most`); "
        f"the strict share (mlp_only - random) / (copy_all - random) is reported with its interval.",
        f"- C3: difference copy_mlp_distill - softmax reference >= -{100 * t.match_tolerance:g} pp "
        f"(`claims.match_tolerance`); gap closed is reported with its interval.",
        "- A claim is **supported** when it holds in every cell where it can be evaluated, **not supported** "
        "when it fails in every such cell, and otherwise **mixed**, with the counts (holds, fails, inconclusive). "
        "C4 holds in a cell when C1-C3 all hold there, fails when any fails, and is otherwise inconclusive.",
    ])
