"""The roles the claims compare, and which strategy of a grid fills each.

A role is defined by what a strategy copies from the teacher, not by its name (an init strategy is
added or renamed in the config with no code changes):

    random            copies nothing, no distillation
    copy_all          copies embed, attn, mlp, norm, head, no distillation
    copy_mlp          copies embed, mlp, norm, head (everything but the attention), no distillation
    copy_attn         copies embed, attn, norm, head (everything but the MLPs), no distillation
    attn_only         copies attn, no distillation
    mlp_only          copies mlp, no distillation
    copy_mlp_distill  copies embed, mlp, norm, head, attention distilled

and every role trains on the task loss alone: a strategy with `train_losses` (logit KD, attention
transfer) or a `task_weight` other than 1 is a baseline of its own, never a role (a random student
with logit KD is not "random"). A distilling role is compared at its strategy's primary design: the
design it names (`distill: <design>`), else the first of `distills`.

`resolve_roles` finds, among the grid's `inits`, the strategy whose `init_strategies` entry has each
content (`attn_extra` in a copy list is ignored: it is never copied). Several strategies with the same
content: the first in `inits` fills the role, and the report names the others.
"""

from __future__ import annotations

from dataclasses import dataclass

from linvit.config import NO_DESIGN, design_names
from linvit.groups import GROUPS

@dataclass(frozen=True)
class Role:
    """What the claims compare: a set of copied parameter groups and whether attention is distilled;
    every role trains on the task loss alone (no `train_losses`, task_weight 1)."""

    name: str
    copy: frozenset
    distill: bool

    @property
    def content(self) -> str:
        groups = ", ".join(g for g in GROUPS if g in self.copy) or "nothing"
        return f"copies {groups}; {'attention distilled' if self.distill else 'no distillation'}; task loss only"


_COPYABLE = frozenset({"embed", "attn", "mlp", "norm", "head"})
ROLES = {role.name: role for role in (
    Role("random", frozenset(), False),
    Role("copy_all", _COPYABLE, False),
    Role("copy_mlp", _COPYABLE - {"attn"}, False),
    Role("copy_attn", _COPYABLE - {"mlp"}, False),
    Role("attn_only", frozenset({"attn"}), False),
    Role("mlp_only", frozenset({"mlp"}), False),
    Role("copy_mlp_distill", _COPYABLE - {"attn"}, True),
)}
RANDOM, COPY_ALL, COPY_MLP, COPY_ATTN, ATTN_ONLY, MLP_ONLY, COPY_MLP_DISTILL = ROLES
# The roles each claim compares (C4 combines C1-C3).


@dataclass(frozen=True)
class RoleMatch:
    """Which strategy of the grid fills a role (None when none does), and at which design."""

    role: Role
    strategy: str | None
    duplicates: tuple[str, ...] = ()    # further strategies in inits with the same content, not used
    outside_grid: tuple[str, ...] = ()  # strategies with the content that are defined but not in inits
    # The design the claims use: 'none' for a role that does not distill; for a distilling one the
    # strategy's primary design (None when the config gives it none).
    design: str | None = NO_DESIGN
    trains_more: tuple[str, ...] = ()   # strategies in inits that copy and distill alike but add training losses

    @property
    def label(self) -> str:
        """The user's strategy name, with the role when the two differ: 'baseline (as random)'; a
        distilling role adds its design: 'copy_mlp_distill (design map_ce)'."""
        notes = [] if self.strategy is None or self.strategy == self.role.name else [f"as {self.role.name}"]
        if self.strategy is not None and self.design not in (None, NO_DESIGN):
            notes.append(f"design {self.design}")
        name = self.role.name if self.strategy is None else self.strategy
        return f"{name} ({', '.join(notes)})" if notes else name

    @property
    def key(self) -> tuple[str, str] | None:
        """(init, design) of the runs that stand for the role, None when the grid has none."""
        return None if self.strategy is None or self.design is None else (self.strategy, self.design)

    def absent(self) -> str:
        """'attn_only (copies attn; no distillation; task loss only; `attn_only` is defined but not in inits)'."""
        hint = "".join(f"; `{n}` is defined but not in inits" for n in self.outside_grid)
        return f"{self.role.name} ({self.role.content}{hint})"


def strategy_content(spec: dict) -> tuple[frozenset, bool, bool]:
    """(copied groups, distills, trains on the task loss alone) of an init_strategies entry; attn_extra
    is never copied, so it is dropped. `distill` may be a design's name (a fixed design): it distills."""
    copy = frozenset(g for g in (spec.get("copy") or []) if g != "attn_extra")
    plain = not spec.get("train_losses") and spec.get("task_weight", 1) in (None, 1)
    return copy, bool(spec.get("distill", False)), plain


def primary_design(config: dict, spec: dict) -> str | None:
    """The design the claims use for a strategy: 'none' when it does not distill, the design it names,
    else the first of `distills` (linvit.config.design_names); None when the config gives none."""
    distill = spec.get("distill", False)
    if isinstance(distill, str):
        return distill
    if not distill:
        return NO_DESIGN
    names = design_names(config)
    return names[0] if names else None


def strategy_designs(config: dict, spec: dict) -> list[str]:
    """Every design a strategy runs with (linvit.config.designs, from its entry)."""
    distill = spec.get("distill", False)
    if isinstance(distill, str):
        return [distill]
    return design_names(config) if distill else [NO_DESIGN]


def is_baseline(spec: dict) -> bool:
    """A literature baseline: a strategy that adds training losses (or reweighs the task's), which
    never fills a role, or that names one fixed distillation design."""
    return not strategy_content(spec)[2] or isinstance(spec.get("distill"), str)


def resolve_roles(config: dict) -> dict[str, RoleMatch]:
    """Each role -> the strategy among the config's `inits` with that content (the first in `inits` order)."""
    strategies = {name: spec for name, spec in (config.get("init_strategies") or {}).items() if isinstance(spec, dict)}
    inits = list(dict.fromkeys(config["inits"]))
    matches = {}
    for role in ROLES.values():
        same = [name for name, spec in strategies.items() if strategy_content(spec) == (role.copy, role.distill, True)]
        in_grid = [init for init in inits if init in same]
        more = tuple(init for init in inits if init in strategies
                     and strategy_content(strategies[init]) == (role.copy, role.distill, False))
        chosen = in_grid[0] if in_grid else None
        design = primary_design(config, strategies[chosen]) if chosen else NO_DESIGN
        matches[role.name] = RoleMatch(role, chosen, tuple(in_grid[1:]), tuple(n for n in same if n not in in_grid),
                                       design, more)
    return matches

