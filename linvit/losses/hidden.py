"""Hidden-state losses of a block (block scope; each docstring is its formula): the attention's
output before and after `proj`, and the block's output, teacher-forced or end to end.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import Views, _f, register_loss


@register_loss("out_mse", reads=("pre",))
def out_mse(v: Views) -> torch.Tensor:
    """mean over blocks l of MSE(ŷ_l, y_l): y = the per-head attention output before the output
    projection (the input of attn.proj), mean over images, tokens and channels (LoLCATs' attention
    transfer)."""
    return F.mse_loss(_f(v.student_pre), _f(v.teacher_pre))


@register_loss("proj_mse", reads=("out",))
def proj_mse(v: Views) -> torch.Tensor:
    """mean over blocks l of MSE(attn_s(u_l), attn_t(u_l)): the attention module outputs (after
    proj), mean over images, tokens and channels."""
    return F.mse_loss(_f(v.student_out), _f(v.teacher_out))


@register_loss("block_l2", forced="always", reads=("block",))
def block_l2(v: Views) -> torch.Tensor:
    """mean over blocks l, images and tokens of ||block_s(u_l) - block_t(u_l)||_2, the Euclidean norm
    over channels, u_l = the teacher's input to block l (always teacher-forced; MOHAWK stage 2)."""
    return torch.linalg.vector_norm(_f(v.student_block) - _f(v.teacher_block), dim=-1).mean()


@register_loss("hidden_mse", forced="never", reads=("block",))
def hidden_mse(v: Views) -> torch.Tensor:
    """mean over blocks l of MSE(ĥ_l, h_l): h_l = block l's output hidden states while each model runs
    its own forward on the images (never teacher-forced), mean over images, tokens and channels."""
    return F.mse_loss(_f(v.student_block), _f(v.teacher_block))
