"""The claims under test, as one table.

Each claim is one `Claim` entry of `CLAIMS`: its name, the paper's sentence and its tests. A test is
a statistic over roles (linvit.claims.roles), a side and a named threshold; a test either decides the
claim or is reported beside it. The roles a claim needs are derived from its statistics, and the
report's rules text is generated from this table (linvit.report.claims_text), so a claim is defined
here and nowhere else.

    share of the benefit   (acc(a) - acc(b)) / (acc(copy_all) - acc(random))
    difference             acc(a) - acc(b), in percentage points

A claim cell is (dataset, size, variant, budget) (`claim_cells`); the thresholds are the config's
(`Thresholds`) and a sequential plan's looks its `Design`. The judge (linvit.claims.judge) reads them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from linvit.claims.roles import ATTN_ONLY, COPY_ALL, COPY_ATTN, COPY_MLP, COPY_MLP_DISTILL, MLP_ONLY, RANDOM
from linvit.config import budgets, grid_cells, seed_sequence
from linvit.grid import CONTROL_VARIANT, REFERENCE_INIT
from linvit.stats import sequential

REFERENCE = REFERENCE_INIT  # the softmax reference, as a role of a statistic


@dataclass(frozen=True)
class Statistic:
    """sum of role weights x accuracies, over the benefit's own contrast when `share` (None: a difference)."""

    name: str
    label: str  # what it measures, in words
    numerator: tuple[tuple[str, float], ...]
    denominator: tuple[tuple[str, float], ...] | None = None

    @property
    def roles(self) -> list[str]:
        return list(dict.fromkeys(r for r, _ in (*self.numerator, *(self.denominator or ()))))

    @property
    def is_share(self) -> bool:
        return self.denominator is not None

    def formula(self) -> str:
        """'(attn_only - random) / (copy_all - random)', 'copy_mlp_distill - reference'."""
        def text(terms):
            return " - ".join(r for r, _ in terms) if len(terms) == 2 else " + ".join(r for r, _ in terms)
        if self.denominator is None:
            return text(self.numerator)
        return f"({text(self.numerator)}) / ({text(self.denominator)})"


def difference(name: str, a: str, b: str, label: str) -> Statistic:
    return Statistic(name, label, ((a, 1.0), (b, -1.0)))


def share(name: str, a: str, b: str, label: str, top: str = COPY_ALL, bottom: str = RANDOM) -> Statistic:
    """A share of the pretrained benefit acc(top) - acc(bottom) (by default copy_all - random)."""
    return Statistic(name, label, ((a, 1.0), (b, -1.0)), ((top, 1.0), (bottom, -1.0)))


@dataclass(frozen=True)
class Test:
    """The claim `statistic <side> threshold`; threshold is a name of `Thresholds` ('negligible', 'most',
    '-margin', 'zero') or None for a statistic reported with its interval alone."""

    statistic: Statistic
    side: str | None = None
    threshold: str | None = None
    decides: bool = True


@dataclass(frozen=True)
class Claim:
    name: str
    statement: str
    tests: tuple[Test, ...]
    note: str = ""

    @property
    def deciding(self) -> list[Test]:
        return [t for t in self.tests if t.decides]

    @property
    def roles(self) -> list[str]:
        """The roles every deciding test needs (the reported ones add theirs when the grid has them)."""
        return list(dict.fromkeys(r for t in self.deciding for r in t.statistic.roles))


CLAIMS = (
    Claim("C1", "Copying softmax attention weights into a linear ViT barely helps, and can be worse than "
                "random initialization.", (
        Test(share("attn_alone", ATTN_ONLY, RANDOM, "attention copied alone (strict)"), "<=", "negligible"),
        Test(share("attn_on_top", COPY_ALL, COPY_MLP, "attention added on top of everything else (symmetric)"),
             "<=", "negligible"),
        Test(difference("attn_worse", ATTN_ONLY, RANDOM, "attention alone worse than random"), "<=", "zero",
             decides=False),
    ), note="The attention's share is measured on its own, never as the complement of the MLPs' share."),
    Claim("C2", "Copying the MLP weights carries most of the benefit of the pretrained model.", (
        Test(share("mlp_alone", MLP_ONLY, RANDOM, "the MLPs copied alone (strict)"), ">=", "most"),
        Test(share("mlp_on_top", COPY_ALL, COPY_ATTN, "the MLPs added on top of everything else (symmetric)"),
             ">=", "most"),
        Test(share("all_but_attn", COPY_MLP, RANDOM, "everything but the attention: embed, MLPs, norms, head "
                                                     "(copy_mlp)"), ">=", "most", decides=False),
    ), note="The verdict rests on the two statistics in which the MLPs are the only thing that differs; "
            "copy_mlp copies everything but the attention and is reported under that name."),
    Claim("C3", "Copied MLPs plus distilled attention close the gap to the softmax model, and can surpass it.", (
        Test(difference("matches", COPY_MLP_DISTILL, REFERENCE, "matches the softmax reference (non-inferiority)"),
             ">=", "-margin"),
        Test(difference("surpasses", COPY_MLP_DISTILL, REFERENCE, "surpasses the softmax reference"), ">=", "zero",
             decides=False),
        Test(difference("distilled_vs_copied", COPY_MLP_DISTILL, COPY_ALL,
                        "distilled attention against copied attention (the paper's contrast)"), decides=False),
        Test(share("gap_closed", COPY_MLP_DISTILL, RANDOM, "gap closed to the softmax reference",
                   top=REFERENCE, bottom=RANDOM), decides=False),
    )),
)
CLAIM_NAMES = [c.name for c in CLAIMS] + ["C4"]
C4_STATEMENT = "C1-C3 hold across linear variants, model sizes and datasets."
STATEMENTS = {**{c.name: c.statement for c in CLAIMS}, "C4": C4_STATEMENT}


@dataclass(frozen=True)
class Thresholds:
    negligible: float = 0.25
    most: float = 0.5
    margin: float = 0.01

    @classmethod
    def from_config(cls, config: dict) -> Thresholds:
        given = config.get("claims") or {}
        if not isinstance(given, dict):
            raise ValueError(f"config: 'claims' must be a mapping, got {given!r}")
        values = {}
        for key, default in asdict(cls()).items():
            value = given.get(key, default)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"config: 'claims.{key}' is {value!r}, expected a number")
            values[key] = float(value)
        return cls(**values)

    def value(self, name: str) -> float:
        return {"negligible": self.negligible, "most": self.most, "-margin": -self.margin, "zero": 0.0}[name]


def claim_cells(config: dict) -> list[tuple[str, str, str, int]]:
    """Every (dataset, size, variant, budget) cell the grid lists (linvit.config.grid_cells: the full product
    by default), budget by budget in the product's order (the control variant's too)."""
    listed = grid_cells(config)
    return [(d, s, v, int(b)) for b in budgets(config) for d in config["targets"] for s in config["sizes"]
            for v in config["variants"] if (d, s, v, int(b)) in listed]


def linear_variants(config: dict) -> list[str]:
    return [v for v in config["variants"] if v != CONTROL_VARIANT]


@dataclass(frozen=True)
class Design:
    """A sequential plan and the seeds of each of its looks (linvit.config.seed_sequence): look k reads the
    first plan.looks[k] seeds of the design, so no look is re-read with seeds that came after it."""

    plan: sequential.Plan
    seeds: tuple[tuple[int, ...], ...]
    # Written by linvit decide into the look's config: the look it runs now (read with the runs it has: one
    # that could not finish is dropped from it and named), and each earlier look's dropped runs (run keys),
    # which stay out of that look when it is read again. None: no driver, each look read once all its seeds
    # have paired.
    current: int | None = None
    dropped: dict[int, frozenset[str]] = field(default_factory=dict)

    @classmethod
    def from_config(cls, config: dict) -> Design | None:
        plan = sequential.Plan.from_config(config)
        if plan is None:
            return None
        dropped = {int(d["look"]): frozenset(d["runs"]) for d in config.get("dropped_runs") or []}
        return cls(plan, tuple(tuple(seed_sequence(config, n)) for n in plan.looks), config.get("decide_look"),
                   dropped)

    def reads(self, look: int, complete: bool) -> bool:
        """Whether look `look` (1-based) is read: once all its seeds have paired, or, under the driver, when it
        is the driver's look or an earlier one (with the runs it had)."""
        return complete or (self.current is not None and look <= self.current)

