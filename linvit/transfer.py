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


def attention_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The attention parameters (attn and attn_extra groups) of a model, by name."""
    return {n: p.detach().clone() for n, p in model.named_parameters()
            if parameter_group(n) in ("attn", "attn_extra")}


@torch.no_grad()
def load_attention_state(model: nn.Module, state: dict[str, torch.Tensor]) -> int:
    """Load attention parameters saved by `attention_state`; returns how many values were loaded."""
    params = dict(model.named_parameters())
    expected = {n for n in params if parameter_group(n) in ("attn", "attn_extra")}
    if set(state) != expected:
        missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
        raise ValueError(f"distilled attention does not match the student: missing {missing[:3]}, "
                         f"unexpected {extra[:3]}")
    for name, tensor in state.items():
        if params[name].shape != tensor.shape:
            raise ValueError(f"distilled attention does not match the student: {name!r} shape "
                             f"{tuple(tensor.shape)} != {tuple(params[name].shape)}")
        params[name].copy_(tensor)
    return sum(t.numel() for t in state.values())
