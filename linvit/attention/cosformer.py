"""cosFormer (Qin et al. 2022, "cosFormer: Rethinking Softmax in Attention", ICLR 2022).

ReLU features with a cos-based re-weighting of the scores, per head:

    s_ij = relu(q_i) . relu(k_j) * w_ij,   out_i = sum_j s_ij v_j / max(sum_j s_ij, eps)

In 1D the paper uses w_ij = cos(pi/2 * (i - j) / M) (M = sequence length in the official code),
decomposed by cos(a - b) = cos a cos b + sin a sin b into features [relu(x) sin, relu(x) cos]
of twice the width, so the sums over j are contracted first in O(N).

ViT adaptation (the patch tokens lie on a gh x gw grid): a separable re-weighting over rows and
columns, each axis exactly the paper's 1D cosine with M = that axis' length,

    w_ij = cos(pi/2 * (r_i - r_j) / gh) * cos(pi/2 * (c_i - c_j) / gw),

decomposed as (cos a_i cos a_j + sin a_i sin a_j)(cos b_i cos b_j + sin b_i sin b_j) with
a = pi/2 r / gh, b = pi/2 c / gw: the features are relu(x) times each of the four products
[sin a sin b, sin a cos b, cos a sin b, cos a cos b] (4 d features per head). Why this choice:
along any row or column it is exactly the paper's 1D re-weighting; it is decomposable (the
Euclidean 2D distance is not); since |r_i - r_j| < gh and |c_i - c_j| < gw every weight lies in
(0, 1], equals 1 only at equal grid positions and decays with distance along both axes -- the
locality bias the paper argues for -- without the artificial wrap-around of a raster order (in
which the last patch of a row and the first of the next would be neighbours while vertically
adjacent patches would be gw apart).

Prefix (class/register) tokens get the fixed position of the grid centre, r = (gh - 1) / 2,
c = (gw - 1) / 2: a class token aggregates the whole image, and at the centre its weight with
every patch lies in [cos(pi/4)^2, 1] = [0.5, 1] (nearly uniform, symmetric over the image), and
prefix tokens weigh 1 with one another.

Extra parameters: none (attn_extra is empty). Copies from softmax: `qkv` and `proj`.
Defaults: eps = 1e-6 (the official code's clamp of the normalizer); the paper has no ViT/DeiT
experiment and the operator has no other hyperparameter.

Deliberate differences from the paper / official code: the 2D re-weighting and the prefix
position above (the paper is 1D); the contractions use means over tokens, with the clamp
rescaled to eps / N, which is identical to the official max(sum_j s_ij, eps) normalizer and keeps
the fp32 sums from growing with N.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .base import ImplicitAttention, LinearAttention, kernel_attention, register_attention


class _Reweighted(torch.autograd.Function):
    """phi(x) = relu(x) times each of the four re-weighting factors w (N, 4), no gradient:
    (B, H, N, D) -> (B, H, N, 4 D), laid out contiguously for the products. The backward is
    written out as the four factors' sum of products and relu's mask: autograd's broadcast product
    took a product over all 4 D features, then a sum over the factors' axis (2.56 against 2.09 ms
    at (2, 4, 4096, 4, 32), one thread). The module step at 4,096 tokens, on an Intel Xeon: 0.975
    / 0.977 of its time on one / two threads (medians of 20 steps alternating with autograd's)."""

    @staticmethod
    def forward(ctx, x, w):
        r = F.relu(x.contiguous())
        ctx.save_for_backward(r, w)
        return (r.unsqueeze(-2) * w.unsqueeze(-1)).flatten(-2)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        r, w = ctx.saved_tensors
        g = grad.unflatten(-1, (w.shape[-1], r.shape[-1]))  # (B, H, N, 4, D)
        w = w.unsqueeze(-1)  # (N, 4, 1)
        out = g[..., 0, :] * w[:, 0]
        for m in range(1, w.shape[1]):
            out.addcmul_(g[..., m, :], w[:, m])
        return torch.ops.aten.threshold_backward(out, r, 0), None


@register_attention("cosformer")
class CosFormerAttention(LinearAttention):
    eps = 1e-6
    positional = True

    def __init__(self, dim, num_heads=8, **kw):
        super().__init__(dim, num_heads, **kw)
        if self.grid_size is None:
            raise ValueError("attention variant 'cosformer' needs grid_size (patch rows, cols)")

    def positions(self, n: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        """(row, col) of each of the n tokens on the patch grid; prefix tokens at the centre."""
        patches = self.patch_slice(n)
        gh, gw = self.grid_size
        # float64: exact grid coordinates, cast to the compute dtype once the weights are formed
        rows = torch.full((n,), (gh - 1) / 2, dtype=torch.float64, device=device)
        cols = torch.full((n,), (gw - 1) / 2, dtype=torch.float64, device=device)
        idx = torch.arange(gh * gw, device=device)
        rows[patches] = torch.div(idx, gw, rounding_mode="floor").double()
        cols[patches] = (idx % gw).double()
        return rows, cols

    def reweighting(self, n: int, device=None) -> torch.Tensor:
        """(n, 4) per-token factors whose inner products are the cos re-weighting w_ij."""
        rows, cols = self.positions(n, device)
        gh, gw = self.grid_size
        a = rows * (math.pi / 2 / gh)
        b = cols * (math.pi / 2 / gw)
        return torch.stack([a.sin() * b.sin(), a.sin() * b.cos(), a.cos() * b.sin(), a.cos() * b.cos()], dim=-1)

    def features(self, q, k):
        n = q.shape[-2]
        w = self.reweighting(n, q.device).to(q.dtype)  # (N, 4)

        return _Reweighted.apply(q, w), _Reweighted.apply(k, w)

    def attend(self, q, k, v):
        fq, fk = self.features(q, k)
        # cosFormer's normalizer, max(mean_j, eps / N); the base's kernel core (its backward written
        # out: 33-35 against 38-41 ms with autograd over [V, 1] products at 4,096 tokens, F = 128)
        return kernel_attention(fq, fk, v, self.eps / fk.shape[-2], clamp=True)

    def implicit(self, q, k, v):
        fq, fk = self.features(q, k)
        scores = fq @ fk.transpose(-2, -1)
        attn = scores / scores.sum(dim=-1, keepdim=True).clamp_min(self.eps)
        return ImplicitAttention(attn=attn, v=v)
