"""Hedgehog (Zhang, Bhatia, Kumbong and Re 2024, "The Hedgehog & the Porcupine: Expressive Linear
Attentions with Softmax Mimicry", ICLR 2024).

Formula as implemented, per head h, with separate trainable maps for queries and keys:

    z(x)   = x W_h + b_h                       W_h (D, D), b_h (D): one map per head, q and k apart
    phi(x) = [exp(z(x)), exp(-z(x))]           2*D features (the paper's phi_mlp and its Listing 1)
    out_i  = sum_j phi_q(q_i) . phi_k(k_j) v_j / sum_j phi_q(q_i) . phi_k(k_j)

q and k enter unscaled (no 1/sqrt(D)): the paper's HedgehogAttention feeds them to the maps as
they are, and the maps learn any temperature. Hedgehog trains the maps by attention distillation
(cross-entropy to the softmax maps); that is a training procedure (linvit's distill step), not part
of the operator.

Numerics: the exponentials are never formed raw. With m_f = max_j z_k(k_j)_f (a per-feature max
over the keys) and M_i = max_f (z_q(q_i)_f + m_f),

    phi_k(k_j)_f = exp(z_k(k_j)_f - m_f),    phi_q(q_i)_f = exp(z_q(q_i)_f + m_f - M_i),

whose product is exp(z_q(q_i)_f + z_k(k_j)_f) exp(-M_i): the exact kernel up to a per-query factor
that cancels in the normalized form. Every feature is <= 1 and each query's normalizer is at least
1/N of a term equal to one, so nothing overflows or underflows to a zero row, at any scale. The
same shifts serve the softmax variants below, applied to log-features.

`activation` chooses the feature form:
  * "exp" (default): the paper's phi above.
  * "softmax": softmax over the 2*D concatenation [z, -z] per token (the form used by the
    flash-linear-attention/based HedgehogFeatureMap, there with logits [2z, -2z]). For queries
    the per-token normalizer cancels, so this differs from "exp" only by re-weighting each key by
    1 / sum_f exp([z, -z])_f.
  * "softmax_halves": [softmax(z), softmax(-z)], each over D (LoLCATs' `softmax_dim`, the same
    authors' later conversion code).

Extra parameters (attn_extra): `fmap_q_weight`, `fmap_k_weight` (H, D, D) initialized to the
identity, `fmap_q_bias`, `fmap_k_bias` (H, D) initialized to zero (the paper's init), so at init
phi(x) = [exp(x), exp(-x)] of the softmax checkpoint's q and k (per-head weights are stacked in one
parameter, so they are bare parameters rather than nn.Linear). Copied from a softmax checkpoint: `qkv` and `proj`. Defaults: feature dim 2*D, eps 1e-12
(as in LoLCATs; the normalizer is bounded below, see above).

Differences from the paper: its Listing 1 shares one nn.Linear(D, D) across heads; here each head
has its own map (a strict generalization; equal to the paper's map when the heads' maps are equal).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .base import LinearAttention, exp_, register_attention

ACTIVATIONS = ("exp", "softmax", "softmax_halves")


class _SignedExp(torch.autograd.Function):
    """exp([z, -z] + shift) for z (B, H, N, D) and a constant shift (B, H, 1, 2D), and with
    `row_max` each token's features divided by their maximum first (a constant too): the "exp"
    features with the module docstring's shifts. The backward is written out, d/dz = g_+ f_+ -
    g_- f_-, in two passes, where autograd took the exp's product, the negation's and the sum of
    the halves' gradients each as its own pass. The module step at 4,096 tokens on an Intel Xeon
    (medians of 5 runs alternating with the autograd form): 62.3 against 68.6 ms on one thread,
    32.7 against 35.7 on two. The softmax activations keep autograd's form."""

    @staticmethod
    def forward(ctx, z, shift, row_max):
        d = z.shape[-1]
        out = torch.cat([z + shift[..., :d], shift[..., d:] - z], dim=-1)
        if row_max:
            out.sub_(out.amax(dim=-1, keepdim=True))
        exp_(out)
        ctx.save_for_backward(out)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        (out,) = ctx.saved_tensors
        d = out.shape[-1] // 2
        g = grad[..., :d] * out[..., :d]
        return g.addcmul_(grad[..., d:], out[..., d:], value=-1), None, None


@register_attention("hedgehog")
class HedgehogAttention(LinearAttention):
    eps = 1e-12

    def __init__(self, dim, num_heads=8, *, activation: str = "exp", **kw):
        super().__init__(dim, num_heads, **kw)
        if activation not in ACTIVATIONS:
            raise ValueError(f"hedgehog activation must be one of {ACTIVATIONS}, got {activation!r}")
        self.activation = activation
        h, d = num_heads, self.head_dim
        eye = torch.eye(d).expand(h, d, d)
        self.fmap_q_weight = nn.Parameter(eye.clone())
        self.fmap_q_bias = nn.Parameter(torch.zeros(h, d))
        self.fmap_k_weight = nn.Parameter(eye.clone())
        self.fmap_k_bias = nn.Parameter(torch.zeros(h, d))

    @staticmethod
    def _map(x, weight, bias):  # (B, H, N, D) -> z (B, H, N, D)
        # matmul broadcasts the (H, D, D) weights over B as one batched product on x's own layout;
        # einsum put h first and copied x and z for it (1.0-1.3 ms of 5.4-7.3 per call, with backward).
        return torch.matmul(x, weight.to(x.dtype)) + bias.to(x.dtype).unsqueeze(1)

    @classmethod
    def _logits(cls, x, weight, bias):  # (B, H, N, D) -> (B, H, N, 2D): [z, -z]
        z = cls._map(x, weight, bias)
        return torch.cat([z, -z], dim=-1)

    def _halves_log_softmax(self, z):
        d = z.shape[-1] // 2
        return torch.cat([F.log_softmax(z[..., :d], dim=-1), F.log_softmax(z[..., d:], dim=-1)], dim=-1)

    def features(self, q, k):
        if self.activation == "exp":
            zq = self._map(q, self.fmap_q_weight, self.fmap_q_bias)
            zk = self._map(k, self.fmap_k_weight, self.fmap_k_bias)
            with torch.no_grad():  # m = max_j [z_k, -z_k]: the keys' per-feature shift
                m = torch.cat([zk.amax(dim=-2, keepdim=True), zk.amin(dim=-2, keepdim=True).neg_()], dim=-1)
            return _SignedExp.apply(zq, m, True), _SignedExp.apply(zk, -m, False)
        lq = self._logits(q, self.fmap_q_weight, self.fmap_q_bias)
        lk = self._logits(k, self.fmap_k_weight, self.fmap_k_bias)
        if self.activation == "softmax":
            lk = F.log_softmax(lk, dim=-1)  # the query's own normalizer cancels
        elif self.activation == "softmax_halves":
            lq, lk = self._halves_log_softmax(lq), self._halves_log_softmax(lk)
        # Shifts that cancel exactly in the normalized form (see the module docstring).
        m = lk.amax(dim=-2, keepdim=True).detach()
        fk = exp_(lk - m)
        lq = lq + m
        fq = exp_(lq - lq.amax(dim=-1, keepdim=True).detach())
        return fq, fk
