"""Distillation: train a linear student to reproduce its softmax teacher, by the terms of an objective.

The losses, the terms and the objective live in linvit.losses; this is the training task on top.
With `freeze=True` (the default) only the student's attention parameters (groups attn and
attn_extra) train, as in attention transfer; with `freeze=False` every student parameter does; with
a list of parameter groups, every parameter but those groups' (the copied groups, say) does.
The teacher (and a separate logit teacher) never train.
"""

from __future__ import annotations

import torch
from torch import nn

from .losses import (LOSSES, Loss, Objective, Result, Term, Views, distill_loss, parse_terms,  # noqa: F401
                     register_loss)
from .models import capture_attention  # noqa: F401  (imported from here by callers and tests)
from .transfer import parameter_group

__all__ = ["DistillTask", "attention_parameters", "capture_attention", "LOSSES", "Loss", "Objective",
           "Result", "Term", "Views", "distill_loss", "parse_terms", "register_loss"]


def attention_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return [(n, p) for n, p in model.named_parameters() if parameter_group(n) in ("attn", "attn_extra")]


class DistillTask:
    """Train the student on the objective of `terms` (Terms, config entries or loss names; a single
    loss name stands for one term of that loss), reporting progress on a fixed `probe` batch.

    `freeze=True`: only the student's attention parameters train; `freeze=False`: all of them; a
    list of parameter groups: all but theirs.
    `logit_teacher`: the model whose logits the logit losses read (default: the teacher).
    `compiled_modules` (set by the caller to the student's attention modules) is what a compiled
    run compiles; build the task before compiling (see Objective).
    """

    def __init__(self, teacher: nn.Module, student: nn.Module, terms, probe: torch.Tensor,
                 freeze: bool | list[str] = True, logit_teacher: nn.Module | None = None, key: str = "distill.losses"):
        self.teacher, self.model = teacher.eval(), student
        self.objective = Objective(teacher, student, terms, logit_teacher=logit_teacher, key=key)
        self.terms = self.objective.terms
        self.freeze = freeze
        self.probe = probe  # a fixed batch of images on which progress is reported
        trainable = {n for n, _ in self.trainable()}
        for n, p in student.named_parameters():
            p.requires_grad_(n in trainable)

    def trainable(self) -> list[tuple[str, nn.Parameter]]:
        if self.freeze is True:
            return attention_parameters(self.model)
        frozen = set(self.freeze or ())
        return [(n, p) for n, p in self.model.named_parameters() if parameter_group(n) not in frozen]

    def loss(self, x, y):
        return self.objective(x).total

    def evaluate(self, final: bool) -> dict:
        """On the probe batch: distill_loss (the objective), distill_terms {label: value} and, when
        every term is block-scope, distill_loss_per_block: block l's sum_i weight_i * loss_i(l) over
        the terms reading block l (None for a block no term reads; their mean is distill_loss when
        every term reads every block)."""
        with torch.no_grad():
            r = self.objective(self.probe)
        out = {"distill_loss": r.total.item(), "distill_terms": {k: v.item() for k, v in r.terms.items()}}
        if all(t.spec.scope == "block" for t in self.terms):
            per_block = [None] * len(self.model.blocks)
            for term, label in zip(self.terms, self.objective.labels):
                for l, value in r.per_block[label].items():
                    per_block[l] = (per_block[l] or 0.0) + term.weight * value.item()
            out["distill_loss_per_block"] = per_block
        return out
