"""Rank-augmented linear attention, RALA (Fan, Huang and He 2025, "Breaking the Low-Rank Dilemma of
Linear Attention", CVPR 2025; official code qhfan/RALA, `classfication/RALA.py`, class
GateLinearAttentionNoSilu).

Formula as implemented, per head (N tokens, prefix tokens included in every sum and mean):

    phi(x)  = elu(x) + 1                                     on q and k (B, H, N, D)
    qbar    = 1/N sum_i phi(q_i)
    alpha_j = N * softmax_j(qbar . phi(k_j) / sqrt(D))       (key re-weighting: KV-buffer rank)
    out_i   = phi(q_i) . [1/N sum_j alpha_j phi(k_j) v_j^T] / (phi(q_i) . 1/N sum_j alpha_j phi(k_j) + 1e-6)
              + LePE(v)_i
    y       = proj(out * (x W_g^T + b_g))                     (output gate: output-feature rank)

LePE: a depthwise 5x5 convolution (dim channels, one filter per head channel, with bias) on V laid
out on the patch grid, added before the gate, as in the official code (`res = res + lepe;
proj(res * o)`). The gate o is a plain linear map of the block input (no activation: "NoSilu").

Extra parameters (attn_extra) and their init, so that the operator starts as its pure linear core
(elu+1 attention with softmax key re-weighting):
  * `gate_weight` (dim, dim) = 0 and `gate_bias` (dim) = 1: the gate is exactly 1 at init
    (official: the gate is the 4th quarter of the qkvo 1x1 conv, trunc-normal init).
  * `lepe.conv.weight` (dim, 1, 5, 5), `lepe.conv.bias` (dim): zero (official: trunc-normal).
Copied from a softmax checkpoint: `qkv` and `proj` (the official qkvo conv's q, k, v parts and
its proj). Defaults (RAVLT): LePE kernel 5, re-weighting temperature head_dim ** -0.5, eps 1e-6.

Deliberate differences from the official code:
  * RoPE: RAVLT's RALA also applies a 2D rotary embedding to phi(q), phi(k) in the numerator only
    (the denominator stays un-rotated), per head: theta = 1 / 10000^linspace(0, 1, D/4), channel
    pairs (2p, 2p+1), the first D/2 channels turned by row * theta, the last D/2 by col * theta.
    It is not part of RALA's formula in the paper, and a converted ViT keeps its own absolute
    position embedding, so it is off by default; `rope=True` reproduces the official layout
    (then the implicit matrix is signed and rows need not sum to one).
  * Class/prefix tokens get no LePE (and no rotation); the patch grid alone is convolved.
  * The official model is hierarchical (RAVLT); here the operator replaces a ViT block's attention.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .base import (ImplicitAttention, LinearAttention, elu_plus_one, kernel_attention, kernel_matrix,
                   register_attention)
from .mila import (PatchLePE, axial_rope_angles, rotary_kernel_attention, rotary_kernel_matrix, rotate_patches,
                   rotation)


@register_attention("rala")
class RalaAttention(LinearAttention):
    eps = 1e-6
    positional = True

    def __init__(self, dim, num_heads=8, *, lepe_kernel: int = 5, rope: bool = False,
                 rope_base: float = 10000.0, **kw):
        super().__init__(dim, num_heads, **kw)
        if self.grid_size is None:
            raise ValueError("attention variant 'rala' needs grid_size (patch rows, cols)")
        self.lepe = PatchLePE(dim, num_heads, lepe_kernel)
        self.gate_weight = nn.Parameter(torch.zeros(dim, dim))
        self.gate_bias = nn.Parameter(torch.ones(dim))
        self.rope = rope
        if rope:
            if self.head_dim % 4:
                raise ValueError(f"rala with rope needs head_dim divisible by 4, got {self.head_dim}")
            self.row_normalized = False
            theta = 1.0 / rope_base ** torch.linspace(0, 1, self.head_dim // 4, dtype=torch.float64)
            angles = axial_rope_angles(self.grid_size, theta)  # (P, D/2), the same for every head
            self.register_buffer("rope_rotation", rotation(angles), persistent=False)

    def features(self, q, k):
        fq, fk = elu_plus_one(q), elu_plus_one(k)
        n = fk.shape[-2]
        qbar = fq.mean(dim=-2, keepdim=True)                                   # (B, H, 1, D)
        logits = (qbar * self.head_dim ** -0.5) @ fk.transpose(-2, -1)         # (B, H, 1, N)
        alpha = torch.softmax(logits, dim=-1).transpose(-2, -1) * n            # (B, H, N, 1)
        return fq, fk * alpha

    def _rope(self, x):
        return rotate_patches(x, self.patch_slice(x.shape[-2]), self.rope_rotation)

    def attend(self, q, k, v):
        fq, fk = self.features(q, k)
        if self.rope:
            out = rotary_kernel_attention(fq, fk, self._rope(fq), self._rope(fk), v, self.eps)
        else:
            out = kernel_attention(fq, fk, v, self.eps)
        return out + self.lepe(v, self.patch_slice(v.shape[-2]), self.grid_size)

    def implicit(self, q, k, v):
        fq, fk = self.features(q, k)
        if self.rope:
            attn = rotary_kernel_matrix(fq, fk, self._rope(fq), self._rope(fk), self.eps)
        else:
            attn = kernel_matrix(fq, fk, self.eps)
        n = q.shape[-2]
        mix, bias = self.lepe.matrices(n, self.patch_slice(n), self.grid_size, self.head_dim)
        return ImplicitAttention(attn=attn, v=v, mix=mix, bias=bias)

    def gate(self, x):
        return F.linear(x, self.gate_weight, self.gate_bias)
