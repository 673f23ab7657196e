"""Attention distillation: losses registered by name, and the teacher-forced distillation task.

Teacher forcing: each student attention receives exactly the input the teacher's attention of the
same block receives, so every block learns the teacher's token routing independently of what the
rest of the student does. Only the student's attention parameters (attn and attn_extra) train.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import torch
import torch.nn.functional as F
from torch import nn

from .attention import attention_maps
from .models import capture_attention
from .transfer import parameter_group

LOSSES: dict[str, callable] = {}


def register_loss(name: str):
    """Function decorator: make a distillation loss `(AttentionPair) -> scalar` selectable by name."""

    def wrap(fn):
        if name in LOSSES:
            raise ValueError(f"distillation loss {name!r} is registered twice")
        LOSSES[name] = fn
        return fn

    return wrap


def distill_loss(name: str):
    try:
        return LOSSES[name]
    except KeyError:
        raise ValueError(f"unknown distillation loss {name!r}; known losses: {', '.join(sorted(LOSSES))}") from None


@dataclass
class AttentionPair:
    """One block's teacher and student attention on the teacher's input; tensors computed on demand."""

    teacher: nn.Module
    student: nn.Module
    x: torch.Tensor
    teacher_out: torch.Tensor

    @cached_property
    def student_out(self) -> torch.Tensor:
        return self.student(self.x)

    @cached_property
    def teacher_maps(self) -> torch.Tensor:
        with torch.no_grad():
            return attention_maps(self.teacher, self.x)

    @cached_property
    def student_maps(self) -> torch.Tensor:
        return attention_maps(self.student, self.x, grad=True)


@register_loss("mse")
def attention_output_mse(pair: AttentionPair) -> torch.Tensor:
    """MSE between the attention outputs (after the output projection)."""
    return F.mse_loss(pair.student_out, pair.teacher_out)


@register_loss("attn_ce")
def attention_map_cross_entropy(pair: AttentionPair, eps: float = 1e-8) -> torch.Tensor:
    """Cross-entropy from the teacher's softmax rows to the student's row-normalized implicit matrix."""
    return -(pair.teacher_maps * pair.student_maps.clamp_min(eps).log()).sum(-1).mean()


def attention_parameters(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return [(n, p) for n, p in model.named_parameters() if parameter_group(n) in ("attn", "attn_extra")]


class DistillTask:
    """Train the student's attention to reproduce the teacher's, block by block (teacher-forced)."""

    def __init__(self, teacher: nn.Module, student: nn.Module, loss: str, probe: torch.Tensor):
        self.teacher, self.model = teacher.eval(), student
        self.loss_fn, self.loss_name = distill_loss(loss), loss
        self.probe = probe  # a fixed batch of images on which progress is reported
        for p in teacher.parameters():
            p.requires_grad_(False)
        trainable = {n for n, _ in attention_parameters(student)}
        for n, p in student.named_parameters():
            p.requires_grad_(n in trainable)

    def trainable(self):
        return attention_parameters(self.model)

    def pair_losses(self, x: torch.Tensor) -> list[torch.Tensor]:
        pairs = capture_attention(self.teacher, x)
        return [self.loss_fn(AttentionPair(tb.attn, sb.attn, t_in, t_out))
                for tb, sb, (t_in, t_out) in zip(self.teacher.blocks, self.model.blocks, pairs)]

    def loss(self, x, y):
        return torch.stack(self.pair_losses(x)).mean()

    def evaluate(self, final: bool) -> dict:
        per_block = [l.item() for l in self.pair_losses(self.probe)]
        return {"distill_loss": sum(per_block) / len(per_block), "distill_loss_per_block": per_block}
