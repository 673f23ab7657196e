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
c, so `attend` sees (B, C, N, 1) tensors). `implicit` returns the C matrices in
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

Numerics: the core runs in fp32 (the base disables autocast) and |q^|, |k^| <= 1, so nothing
overflows there; as in the paper the output is a sum (not a mean) over tokens, so its scale
grows with N and with |v| -- the base's cast of the result back to an fp16 autocast dtype is the
only place this could matter (sums beyond 65504), not reached at ViT sequence lengths and
ordinary activations.
"""

from __future__ import annotations

import torch.nn.functional as F

from .base import ImplicitAttention, LinearAttention, register_attention


@register_attention("hydra")
class HydraAttention(LinearAttention):
    norm_eps = 1e-12
    row_normalized = False  # signed cosine weights and no normalizer

    def split_heads(self, x):
        b, n, c = x.shape
        # (3, B, C, N, 1): every channel is a head of dimension 1.
        qkv = self.qkv(x).reshape(b, n, 3, c, 1).permute(2, 0, 3, 1, 4)
        return qkv.unbind(0)

    def _normalized(self, q, k):
        # q, k: (B, C, N, 1); normalize over the channel (head) dimension.
        return F.normalize(q, dim=1, eps=self.norm_eps), F.normalize(k, dim=1, eps=self.norm_eps)

    def attend(self, q, k, v):
        qh, kh = self._normalized(q, k)
        kv = (kh * v).sum(dim=-2, keepdim=True)  # (B, C, 1, 1)
        return qh * kv

    def implicit(self, q, k, v):
        qh, kh = self._normalized(q, k)
        attn = qh @ kh.transpose(-2, -1)  # (B, C, N, N): channel-head c's matrix q^_ic k^_jc
        b, c, n, _ = attn.shape
        h = self.num_heads
        # Written in ImplicitAttention's grouped form: the teacher's H heads, each with its C/H
        # value channels as groups of one, so that maps() compare head by head with the teacher.
        return ImplicitAttention(attn=attn.reshape(b, h, c // h, n, n),
                                 v=v.reshape(b, h, c // h, n).transpose(-1, -2))
