"""The loss registry: `Loss` (a function and how a term may use it), `LOSSES` by name, the
`@register_loss` decorator, name lookup (old names through registry.LOSS_ALIASES) and `Views`, the
tensors a loss reads. The losses themselves live in the modules of their kind (maps, hidden, model).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from ..registry import LOSS_ALIASES

SCOPES = ("block", "model")
FORCING = ("optional", "always", "never")
# What a loss may read: (teacher_X, student_X) pairs of a Views.
BLOCK_TENSORS = ("maps", "pre", "out", "block")
MODEL_TENSORS = ("features", "logits")
TERM_OPTIONS = ("tau",)  # term keys passed to a loss that lists them in its `options`


@dataclass(frozen=True)
class Loss:
    """A registered loss: its function `(views, **options) -> scalar` and how a term may use it.

    scope:   "block" (one block's value; the objective averages over the term's blocks) or "model".
    forcing: "optional" (a term chooses, teacher-forced by default), "always" or "never".
    reads:   the tensors it reads (teacher_X and student_X of a Views for each X).
    tokens:  whether a term may restrict it to the patch tokens.
    options: term options passed to the function as keywords (logit_kd's tau).
    """

    name: str
    fn: Callable
    scope: str = "block"
    forcing: str = "optional"
    reads: tuple[str, ...] = BLOCK_TENSORS
    tokens: bool = True
    options: tuple[str, ...] = ()

    def __call__(self, views: "Views", **options) -> torch.Tensor:
        return self.fn(views, **options)

    @property
    def formula(self) -> str:
        return (self.fn.__doc__ or "").strip()


LOSSES: dict[str, Loss] = {}


def register_loss(name: str, *, scope: str = "block", forced: str = "optional",
                  reads: tuple[str, ...] | None = None, tokens: bool = True, options: tuple[str, ...] = ()):
    """Function decorator: make a distillation loss `(Views, **options) -> scalar` selectable by name.

    `scope`, `forced` ("optional", "always", "never"), `reads`, `tokens` and `options` as in `Loss`;
    `reads` defaults to every tensor of the scope.
    """
    if scope not in SCOPES:
        raise ValueError(f"loss {name!r}: scope {scope!r} is not one of {', '.join(SCOPES)}")
    if forced not in FORCING:
        raise ValueError(f"loss {name!r}: forced {forced!r} is not one of {', '.join(FORCING)}")
    if scope == "model" and forced != "never":
        raise ValueError(f"loss {name!r}: a model-scope loss is never teacher-forced (forced='never')")
    allowed = BLOCK_TENSORS if scope == "block" else MODEL_TENSORS
    reads = tuple(reads) if reads is not None else allowed
    if not reads or set(reads) - set(allowed):
        raise ValueError(f"loss {name!r}: a {scope}-scope loss reads some of {', '.join(allowed)}, not {reads}")
    unknown = set(options) - set(TERM_OPTIONS)
    if unknown:
        raise ValueError(f"loss {name!r}: unknown term option(s) {sorted(unknown)}; known: {', '.join(TERM_OPTIONS)}")

    if name in LOSS_ALIASES:
        raise ValueError(f"distillation loss {name!r}: an old name of {LOSS_ALIASES[name]!r} "
                         f"(registry.LOSS_ALIASES); choose another")

    def wrap(fn):
        if name in LOSSES:
            raise ValueError(f"distillation loss {name!r} is registered twice")
        LOSSES[name] = Loss(name, fn, scope, forced, reads, tokens, tuple(options))
        return fn

    return wrap


def loss_name(name: str) -> str:
    """The registered name `name` means: itself, or what an old alias (registry.LOSS_ALIASES) stands for."""
    return LOSS_ALIASES.get(name, name)


def distill_loss(name: str) -> Loss:
    try:
        return LOSSES[loss_name(name)]
    except (KeyError, TypeError):
        raise ValueError(f"unknown distillation loss {name!r}; known losses: {', '.join(sorted(LOSSES))}") from None


class Views:
    """The tensors a loss reads, by name: each a tensor, or a function of no arguments computing it
    on first use (so the objective computes only what a loss reads). Tests build one by hand.

    Block scope (one block): teacher_maps, student_maps (B, H, N, N) row-stochastic A and Â;
    teacher_pre, student_pre (B, N, C) y and ŷ, the input of attn.proj; teacher_out, student_out
    (B, N, C) the attention outputs after proj; teacher_block, student_block (B, N, C) the block
    outputs. Model scope: teacher_features, student_features (B, N, C) `forward_features`;
    teacher_logits, student_logits (B, K).
    """

    def __init__(self, **tensors):
        self._tensors = tensors

    def __getattr__(self, name: str):
        tensors = self.__dict__.get("_tensors", {})
        if name.startswith("_") or name not in tensors:
            raise AttributeError(f"the loss reads {name!r}, which these views do not hold "
                                 f"(they hold: {', '.join(sorted(tensors)) or 'nothing'})")
        value = tensors[name]
        if callable(value) and not isinstance(value, torch.Tensor):
            value = tensors[name] = value()
        return value


def _f(t: torch.Tensor) -> torch.Tensor:
    """t in at least fp32 (a loss sums over many entries; float64 stays float64)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))
