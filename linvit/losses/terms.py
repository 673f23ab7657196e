"""A config's distillation terms: `Term` (a loss, its weight, blocks, tokens, forcing and
temperature, validated on construction) and `parse_terms`, whose errors are one line naming the key.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from numbers import Real

from .base import LOSSES, Loss, distill_loss

TERM_KEYS = ("loss", "weight", "blocks", "tokens", "forced", "tau")
BLOCK_SELECTIONS = ("first", "last", "skip_last")
TOKENS = ("all", "patch")


class TermError(ValueError):
    """A term's value is wrong: `key` the term key at fault, `message` why."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key, self.message = key, message


def _number(value) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class Term:
    """One loss of an objective: loss (a registered name or an alias), weight >= 0, blocks ("all" or
    (first|last|skip_last, k)), tokens ("all" or "patch"), forced (teacher-forced or end to end;
    None: the loss's default) and tau (logit_kd's temperature). Validated and normalized on
    construction: `loss` is the registered name, `forced` a bool."""

    loss: str
    weight: float = 1.0
    blocks: str | tuple[str, int] = "all"
    tokens: str = "all"
    forced: bool | None = None
    tau: float = 1.0

    def __post_init__(self):
        set_ = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 (frozen)
        try:
            spec = distill_loss(self.loss)
        except ValueError as err:
            raise TermError("loss", str(err)) from None
        set_("loss", spec.name)
        if not _number(self.weight) or self.weight < 0:
            raise TermError("weight", f"{self.weight!r} is not a finite number >= 0")
        set_("weight", float(self.weight))
        set_("blocks", _blocks(self.blocks))
        if spec.scope == "model" and self.blocks != "all":
            raise TermError("blocks", f"{spec.name} compares whole models; it takes no blocks")
        if self.tokens not in TOKENS:
            raise TermError("tokens", f"{self.tokens!r} is not one of {', '.join(TOKENS)}")
        if self.tokens != "all" and not spec.tokens:
            raise TermError("tokens", f"{spec.name} has no tokens to select")
        if self.forced is not None and not isinstance(self.forced, bool):
            raise TermError("forced", f"{self.forced!r} is not true or false")
        fixed = {"always": True, "never": False}.get(spec.forcing)
        if fixed is not None and self.forced not in (None, fixed):
            raise TermError("forced", f"{spec.name} is {'always' if fixed else 'never'} teacher-forced")
        set_("forced", fixed if fixed is not None else (True if self.forced is None else self.forced))
        if not _number(self.tau) or self.tau <= 0:
            raise TermError("tau", f"{self.tau!r} is not a finite number > 0")
        if self.tau != 1.0 and "tau" not in spec.options:
            raise TermError("tau", f"{spec.name} takes no temperature")
        set_("tau", float(self.tau))

    @property
    def spec(self) -> Loss:
        return distill_loss(self.loss)

    @property
    def options(self) -> dict:
        """The keywords the loss function takes from this term."""
        return {k: getattr(self, k) for k in self.spec.options}

    @property
    def label(self) -> str:
        """The loss name plus what differs from its defaults: 'map_ce[last 2, patch, end to end]'."""
        spec, parts = self.spec, []
        if self.blocks != "all":
            parts.append(f"{self.blocks[0]} {self.blocks[1]}")
        if self.tokens != "all":
            parts.append(self.tokens)
        if spec.forcing == "optional" and not self.forced:
            parts.append("end to end")
        if "tau" in spec.options and self.tau != 1.0:
            parts.append(f"tau={self.tau:g}")
        return f"{self.loss}[{', '.join(parts)}]" if parts else self.loss

    def entry(self) -> dict:
        """The config entry this term reads back from (defaults left out)."""
        spec, out = self.spec, {"loss": self.loss}
        if self.weight != 1.0:
            out["weight"] = self.weight
        if self.blocks != "all":
            out["blocks"] = {self.blocks[0]: self.blocks[1]}
        if self.tokens != "all":
            out["tokens"] = self.tokens
        if spec.forcing == "optional" and not self.forced:
            out["forced"] = False
        if "tau" in spec.options and self.tau != 1.0:
            out["tau"] = self.tau
        return out

    def block_indices(self, depth: int) -> list[int]:
        """The blocks this term reads in a model of `depth` blocks."""
        if self.blocks == "all":
            return list(range(depth))
        kind, k = self.blocks
        if k > depth or (kind == "skip_last" and k == depth):
            raise ValueError(f"distillation term {self.label}: blocks {{{kind}: {k}}} leaves no blocks "
                             f"or needs more than the model's {depth}")
        return {"first": list(range(k)), "last": list(range(depth - k, depth)),
                "skip_last": list(range(depth - k))}[kind]


def _blocks(value):
    if value == "all":
        return "all"
    if isinstance(value, dict):
        if len(value) != 1:
            raise TermError("blocks", f"{value!r}: give one of {', '.join(BLOCK_SELECTIONS)} (or all)")
        (kind, k), = value.items()
    elif isinstance(value, (tuple, list)) and len(value) == 2:
        kind, k = value
    else:
        raise TermError("blocks", f"{value!r} is not all or {{first|last|skip_last: k}}")
    if kind not in BLOCK_SELECTIONS:
        raise TermError("blocks", f"unknown selection {kind!r}; known: all, {', '.join(BLOCK_SELECTIONS)}")
    if not isinstance(k, int) or isinstance(k, bool) or k < 1:
        raise TermError("blocks", f"{kind}: {k!r} is not a whole number >= 1")
    return (kind, k)


def parse_terms(entries, key: str) -> list[Term]:
    """The terms of config key `key`: a list of entries, each a loss name or a mapping
    {loss, weight, blocks, tokens, forced, tau}; a single name or Term stands for a list of one.

    Errors are one line naming the key: "config key <key>[i].blocks: ...".
    """
    if isinstance(entries, (str, Term, dict)):
        entries = [entries]
    if not isinstance(entries, (list, tuple)) or not entries:
        raise ValueError(f"config key {key}: a non-empty list of distillation terms, not {entries!r}")
    terms = []
    for i, entry in enumerate(entries):
        where = f"{key}[{i}]"
        if isinstance(entry, Term):
            terms.append(entry)
            continue
        if isinstance(entry, str):
            entry = {"loss": entry}
        if not isinstance(entry, dict):
            raise ValueError(f"config key {where}: a term is a loss name or a mapping with 'loss', not {entry!r}")
        unknown = [k for k in entry if k not in TERM_KEYS]
        if unknown:
            raise ValueError(f"config key {where}: unknown option(s) {', '.join(map(repr, unknown))}; "
                             f"a term takes: {', '.join(TERM_KEYS)}")
        if "loss" not in entry:
            raise ValueError(f"config key {where}: a term needs 'loss' (one of: {', '.join(sorted(LOSSES))})")
        try:
            spec = distill_loss(entry["loss"])
        except ValueError as err:
            raise ValueError(f"config key {where}.loss: {err}") from None
        given = [k for k in ("blocks", "tokens", "forced", "tau") if k in entry]
        for k in given:
            why = {"blocks": f"{spec.name} compares whole models; it takes no blocks"
                   if spec.scope == "model" else None,
                   "tokens": None if spec.tokens else f"{spec.name} has no tokens to select",
                   "forced": None if spec.forcing == "optional" else
                   f"{spec.name} is {'always' if spec.forcing == 'always' else 'never'} teacher-forced; "
                   f"leave forced out",
                   "tau": None if "tau" in spec.options else f"{spec.name} takes no temperature"}[k]
            if why:
                raise ValueError(f"config key {where}.{k}: {why}")
        try:
            terms.append(Term(**entry))
        except TermError as err:
            raise ValueError(f"config key {where}.{err.key}: {err.message}") from None
    return terms
