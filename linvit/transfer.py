"""Copying weights from a softmax teacher into a student, by parameter group (see linvit.groups)."""

from __future__ import annotations

import torch
from torch import nn

from .groups import GROUPS, check_groups, parameter_group

def group_parameters(model: nn.Module) -> dict[str, list[tuple[str, nn.Parameter]]]:
    groups: dict[str, list] = {g: [] for g in GROUPS}
    for name, p in model.named_parameters():
        groups[parameter_group(name)].append((name, p))
    return groups


def group_sizes(model: nn.Module) -> dict[str, int]:
    return {g: sum(p.numel() for _, p in ps) for g, ps in group_parameters(model).items()}


@torch.no_grad()
def copy_groups(student: nn.Module, teacher: nn.Module, groups, *, copy_head: bool = True) -> dict[str, int]:
    """Copy the teacher's tensors of `groups` into the student, by name; returns counts per group.

    `attn_extra` never copies: those parameters have no softmax counterpart. The head is skipped
    (count 0) when `copy_head` is False, for a target whose label space differs from the teacher's.
    A missing or differently shaped teacher tensor is an error naming it.
    """
    groups = set(check_groups(groups)) - {"attn_extra"}
    if not copy_head:
        groups.discard("head")
    source = dict(teacher.named_parameters())
    copied = {g: 0 for g in GROUPS}
    for name, p in student.named_parameters():
        group = parameter_group(name)
        if group not in groups:
            continue
        if name not in source:
            raise ValueError(f"teacher does not match student: it has no parameter {name!r}")
        if source[name].shape != p.shape:
            raise ValueError(f"teacher does not match student: {name!r} is {tuple(source[name].shape)} "
                             f"in the teacher and {tuple(p.shape)} in the student")
        p.copy_(source[name])
        copied[group] += p.numel()
    return copied
