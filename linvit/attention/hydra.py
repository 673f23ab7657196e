"""Hydra Attention (Bolya et al. 2022, "Hydra Attention: Efficient Attention with Many Heads",
ECCV 2022 Workshops).

As many heads as channels (H = C, head dim 1) with the cosine-similarity kernel, where q and k
are L2-normalized over the full channel dimension C (over all the heads together: a per-head
norm of a 1-dimensional head would only keep its sign), and no normalizer:

    q^_i = q_i / |q_i|,  k^_j = k_j / |k_j|       (norms over the C channels)
    out_i = q^_i * sum_j (k^_j * v_j)             (elementwise in the channels)

O(N C): the global feature sum_j k^_j * v_j is computed once. Written as attention, channel-head
c mixes the tokens of value channel c with the matrix A_c[i, j] = q^_ic k^_jc (signed, and its
rows do not sum to one). `split_heads` is overridden accordingly (channel c of q/k/v is head
c, so `attend` sees (B, C, N, 1) tensors; timm's q/k norms, if any, act before, on the teacher's
heads). `implicit` returns the C matrices in
ImplicitAttention's grouped form: attn (B, H, C/H, N, N) and v (B, H, N, C/H), H being the
teacher's `num_heads` (kept on the module), matrix [h, g] acting on value channel h*C/H + g --
the same C matrices, grouped so that `maps()` (group mean, negatives clipped, rows renormalized)
are (B, H, N, N) and compare head by head with the softmax teacher in distillation and fidelity.

Extra parameters: none (attn_extra is empty). Copies from softmax: `qkv` and `proj` (the same
Linear shapes as the teacher's; the teacher's head structure is not used, and the operator
differs from softmax attention in form, so copied q/k weights carry no matching kernel).
Defaults: none to choose (the paper's operator has no hyperparameter). `num_heads` is only
checked for divisibility (the teacher's value is kept in `num_heads`); the operator runs with C
heads.

Deliberate differences from the paper / official code:
- The norms are clamped below at 1e-12 (F.normalize) so that an all-zero q or k gives zero
  features instead of NaN; the paper's code divides by the norm directly. Identical otherwise.
- In the paper's DeiT experiments Hydra replaces softmax attention in only some of the layers
  (that is where it does best); which blocks are swapped is the harness's choice (it swaps
  every block).

Numerics: the core runs in at least fp32 (the base disables autocast) and |q^|, |k^| <= 1, so
nothing overflows there; as in the paper the output is a sum (not a mean) over tokens, so its scale
grows with N and with |v| -- the base's cast of the result back to an fp16 autocast dtype is the
only place this could matter (sums beyond 65504), not reached at ViT sequence lengths and
ordinary activations.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import ImplicitAttention, LinearAttention, register_attention


def _inv_norm(x, eps):
    """1 / max(|x|, eps) over the last dim (F.normalize's divisor), and where the norm is not
    clamped (where it carries a gradient)."""
    norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
    return 1.0 / norm.clamp_min(eps), norm >= eps


def _channels_first(x):
    """x (B, N, C) copied to (B, C, N) memory order, returned as a (B, N, C) view: the layout of
    a (B, C, N, 1) head tensor's gradient. One blocked 2-D transpose per batch (faster than an
    elementwise pass writing a transposed layout)."""
    b, n, c = x.shape
    out = x.new_empty(b, c, n)
    for i in range(b):
        out[i].copy_(x[i].t())
    return out.transpose(-1, -2)


class _HydraCore(torch.autograd.Function):
    """out = q^ * sum_n k^_n * v_n on (B, N, C) views (rows of C channels contiguous, the layout
    of the qkv projection), with the backward pass written out: every (B, N, C) pass is an
    elementwise product, and every token or channel sum a matrix-vector product."""

    @staticmethod
    def forward(ctx, q, k, v, eps):
        rq, mq = _inv_norm(q, eps)
        rk, mk = _inv_norm(k, eps)
        kh = k * rk  # k^ (B, N, C)
        kv_tok = kh * v
        kv = kv_tok.sum(dim=-2, keepdim=True)  # (B, 1, C): sum_n k^_n v_n
        out = (q * kv).mul_(rq)
        ctx.save_for_backward(q, kh, v, rq, mq, rk, mk, kv_tok, kv)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, kh, v, rq, mq, rk, mk, kv_tok, kv = ctx.saved_tensors
        # (one (B, N, C) work buffer, reused: fresh memory costs page faults)
        buf = grad * q
        # d kv = sum_n grad_n q^_n;  q^ = q / |q|: d q = (d q^ - q^ (d q^ . q^)) / |q|, d q^ = grad kv
        dkv = rq.transpose(-1, -2) @ buf  # (B, 1, C)
        s = buf @ kv.transpose(-1, -2)  # (B, N, 1): sum_c grad q kv
        torch.mul(grad, kv, out=buf).mul_(rq).addcmul_(q, s * rq.pow(3) * mq, value=-1.0)
        dq = _channels_first(buf)
        # k^ = k / |k|: d k = (d k^ - k^ (d k^ . k^)) / |k|, d k^ = dkv v
        t = kv_tok @ dkv.transpose(-1, -2)  # (B, N, 1): sum_c k^ v dkv
        torch.mul(v, dkv, out=buf).addcmul_(kh, t * mk, value=-1.0).mul_(rk)
        dk = _channels_first(buf)
        # kh dkv written in (B, C, N) order: `out=` a contiguous tensor (torch.compile accepts no
        # strided `out=`), returned as the (B, N, C) view
        b, n, c = kh.shape
        dv = kh.new_empty(b, c, n)
        torch.mul(kh.transpose(-1, -2), dkv.transpose(-1, -2), out=dv)
        return dq, dk, dv.transpose(-1, -2), None


@register_attention("hydra")
class HydraAttention(LinearAttention):
    norm_eps = 1e-12
    row_normalized = False  # signed cosine weights and no normalizer

    def split_heads(self, x):
        # The teacher's heads first, so that its q/k norms (qk_norm) act over the head dimension
        # they were trained on; then (B, C, N, 1): every channel is a head of dimension 1. Without
        # norms the reshape is a view of the qkv projection (no copy).
        b, n, c = x.shape
        q, k, v = self.qkv_views(x)
        q, k = self.q_norm(q), self.k_norm(k)
        return tuple(t.transpose(-1, -2).reshape(b, c, n, 1) for t in (q, k, v))

    def _normalized(self, q, k):
        # q, k: (B, C, N, 1); normalize over the channel (head) dimension.
        return F.normalize(q, dim=1, eps=self.norm_eps), F.normalize(k, dim=1, eps=self.norm_eps)

    def attend(self, q, k, v):
        # The same as q^ * sum_n (k^ * v), computed on (B, N, C) views: the layout the qkv
        # projection gives, where the norms over channels read contiguous rows.
        def rows(t):
            return t.squeeze(-1).transpose(-1, -2)

        out = _HydraCore.apply(rows(q), rows(k), rows(v), self.norm_eps)
        return out.transpose(-1, -2).unsqueeze(-1)

    def implicit(self, q, k, v):
        qh, kh = self._normalized(q, k)
        attn = qh @ kh.transpose(-2, -1)  # (B, C, N, N): channel-head c's matrix q^_ic k^_jc
        b, c, n, _ = attn.shape
        h = self.num_heads
        # Written in ImplicitAttention's grouped form: the teacher's H heads, each with its C/H
        # value channels as groups of one, so that maps() compare head by head with the teacher.
        return ImplicitAttention(attn=attn.reshape(b, h, c // h, n, n),
                                 v=v.reshape(b, h, c // h, n).transpose(-1, -2))
