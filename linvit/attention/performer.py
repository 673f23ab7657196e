"""Performer / FAVOR+ (Choromanski et al. 2021, "Rethinking Attention with Performers", ICLR 2021).

Positive orthogonal random features approximating the softmax kernel exp(q . k / sqrt(d)), per
head (head dim d, m random features, W the (m, d) projection, rows w_r):

    q' = d^-1/4 q,  k' = d^-1/4 k                                (data normalizer: the softmax
                                                                   scale d^-1/2 split over q and k)
    phi(q')_r = m^-1/2 (exp(w_r . q' - |q'|^2 / 2 - max_r' w_r' . q') + eps_k)          (queries)
    phi(k')_r = m^-1/2 (exp(w_r . k' - |k'|^2 / 2 - max_{r', j} w_r' . k'_j) + eps_k)   (keys)
    out_i = sum_j phi(q'_i) . phi(k'_j) v_j / sum_j phi(q'_i) . phi(k'_j)

computed in O(N) by contracting phi(K)^T V first. The max terms and eps_k = 1e-4 are the
numerical stabilizer of the official implementations (google-research `performer/fast_attention`,
lucidrains `performer-pytorch`): the query max is per token (over features), the key max is over
all tokens and features of a head; both are constants taken without gradient (as in
performer-pytorch). The normalizer is mean_j phi(q'_i) . phi(k'_j) + eps with eps = 1e-20 (the
official codes have none). Every feature is at least m^-1/2 eps_k, so the mean is at least
eps_k^2 = 1e-8 and positive; but with eps_k = 0, or where large activations underflow every
feature, it is 0 and the output 0/0. The eps makes that output 0 (and the map row, read as
uniform) instead of nan; at most 1e-12 of a normalizer the default eps_k allows (below half an
fp32 ulp), it leaves fp32 values unchanged to the bit. Low precision is why the core and the
implicit matrices (`implicit`: the maps the losses and the evaluation read) both run in at least
fp32 with autocast off: in fp16 the products of the smallest features, eps_k^2 / m (4e-11 at
m = 266), underflow to 0, and no eps that fp16 can hold is small enough to leave fp32 values alone.

Projection W: m = round(d ln d) rows (d = 64 -> 266; d = 32 -> 111), drawn as in the official
`gaussian_orthogonal_random_matrix` with scaling 0: stacked blocks of d x d orthogonal matrices
(Q of the QR of a Gaussian matrix, transposed; the last block truncated), each row rescaled by
the norm of an independent d-dimensional Gaussian vector, so rows are marginally N(0, I_d) and
exactly orthogonal within a block. One W is shared by all heads (as in both official codes). It
is a persistent buffer `projection` (not a parameter: it is not trained and belongs to no
parameter group), drawn from a private generator seeded with `feature_seed`, so the same model is
reproducible whatever the global RNG state, and checkpoints carry it.

Extra parameters: none (attn_extra is empty). Copies from softmax: `qkv` and `proj` entirely;
with d^-1/4 on q and k the operator approximates the teacher's softmax(q k^T / sqrt(d)) itself.
Defaults: nb_features = round(d ln d), kernel_eps = 1e-4, feature_seed = 0. The Performer paper
has no ViT/DeiT experiment, so these are the paper's / official code's general defaults.

Deliberate differences from the paper / official code:
- No feature redrawing (the paper's optional periodic resampling of W during training): W is a
  fixed seeded buffer so that a checkpoint determines the model and its outputs.
- W is seeded by `feature_seed` (default 0) instead of the global RNG, so by default every layer
  of a model uses the same W (the official code draws one per layer); pass different
  `feature_seed`s to vary it. The random matrices are drawn (and QR-factorized) in float64 and
  stored in float32.
- Implementation only (same values up to rounding): the contractions use means over tokens
  instead of sums (identical after normalization; keeps the fp32 sums from growing with N), and
  the constant m^-1/2 eps_k of every feature is added analytically to the small contracted
  matrices instead of to the (B, H, N, m) feature tensors (`features`, used by `implicit`, adds
  it explicitly).

Numerics: everything runs in at least fp32 (float64 in a float64 module; the base disables
autocast). Every exponent is <= 0, so nothing overflows; on very large activations
exp(-|x'|^2/2) underflows and the features fall to their eps_k floor, so attention tends to
uniform rows -- the official stabilizer's behaviour.
"""

from __future__ import annotations

import math

import torch

from .base import LOG2E, LinearAttention, exp_, register_attention


def orthogonal_random_features(nb_features: int, dim: int, generator: torch.Generator) -> torch.Tensor:
    """(nb_features, dim) Gaussian orthogonal random matrix (scaling 0 of the official code)."""
    blocks = []
    for _ in range(math.ceil(nb_features / dim)):
        gauss = torch.randn(dim, dim, generator=generator, dtype=torch.float64)
        q, _ = torch.linalg.qr(gauss, mode="reduced")
        blocks.append(q.T)  # rows orthonormal
    ortho = torch.cat(blocks)[:nb_features]
    norms = torch.randn(nb_features, dim, generator=generator, dtype=torch.float64).norm(dim=1)
    return (norms.unsqueeze(1) * ortho).float()


def default_nb_features(head_dim: int) -> int:
    return max(1, round(head_dim * math.log(head_dim))) if head_dim > 1 else 1


class _FavorCore(torch.autograd.Function):
    """`PerformerAttention.attend` in one function with its backward pass written out: the same
    products, with the (B, H, N, m) feature tensors updated in place and reused, and nothing
    recomputed. Inputs: q, k, v (B, H, N, D); w_t (D + 1, m) = [d^-1/4 W, -1]^T; scale2 = d^-1/2;
    the stabilizer offset 1/2 ln m; c = m^-1/2 kernel_eps; eps (the normalizer's)."""

    @staticmethod
    def _features(x, w_t, scale2, offset, is_query):
        # Every term in units of log 2 (times log2 e), so the exponential is exp2 (see base.exp_):
        # the factor rides on the small (D, m) matrix and the per-token terms, not on z.
        half_sq = (0.5 * scale2 * LOG2E) * (x * x).sum(dim=-1, keepdim=True)  # |x'|^2 / 2
        z = x @ (w_t[:-1] * LOG2E)  # w.x', (B, H, N, m)
        stab = z.amax(dim=-1, keepdim=True)  # max of w.x' per query token
        if not is_query:
            stab = stab.amax(dim=-2, keepdim=True)  # ... per head for keys
        # w.x' - |x'|^2/2 - stab in one pass over the (B, H, N, m) tensor, then exp, in place
        return z.sub_(half_sq + (stab + offset * LOG2E)).exp2_()

    @staticmethod
    def forward(ctx, q, k, v, w_t, scale2, offset, c, eps):
        eq = _FavorCore._features(q, w_t, scale2, offset, True)
        ek = _FavorCore._features(k, w_t, scale2, offset, False)
        n = ek.shape[-2]
        va = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1).div_(n)  # (B, H, N, D + 1)
        vk = va.transpose(-1, -2) @ ek  # (B, H, D + 1, m)
        vk += c * va.sum(dim=-2).unsqueeze(-1)
        out = eq @ vk.transpose(-1, -2)  # (B, H, N, D + 1)
        out += c * vk.sum(dim=-1).unsqueeze(-2)
        den = out[..., -1:] + eps
        res = out[..., :-1] / den
        ctx.save_for_backward(q, k, w_t, eq, ek, va, vk, den, res)
        ctx.scale2, ctx.c, ctx.n = scale2, c, n
        return res

    @staticmethod
    def backward(ctx, grad):
        q, k, w_t, eq, ek, va, vk, den, res = ctx.saved_tensors
        c, n = ctx.c, ctx.n
        g_num = grad / den
        g_out = torch.cat([g_num, -(g_num * res).sum(dim=-1, keepdim=True)], dim=-1)  # (B, H, N, D + 1)
        # out = e(Q) vk^T + c 1 (sum_r vk_r)^T
        g_vk = g_out.transpose(-1, -2) @ eq  # (B, H, D + 1, m)
        g_vk += c * g_out.sum(dim=-2).unsqueeze(-1)
        g_va = ek @ g_vk.transpose(-1, -2)  # (B, H, N, D + 1)
        g_va += c * g_vk.sum(dim=-1).unsqueeze(-2)
        d = q.shape[-1]
        w = w_t.transpose(-1, -2)
        # through exp (g e), then the product with [d^-1/4 W, -1]
        g_xa = ((g_out @ vk).mul_(eq)) @ w  # out = e(Q) vk^T + ...
        g_q = torch.addcmul(g_xa[..., :d], g_xa[..., d:], q, value=ctx.scale2)
        g_xa = ((va @ g_vk).mul_(ek)) @ w  # vk = [V, 1]^T e(K) / n + c sum_j [v_j, 1] / n
        g_k = torch.addcmul(g_xa[..., :d], g_xa[..., d:], k, value=ctx.scale2)
        g_v = g_va[..., :-1] / n
        return g_q, g_k, g_v, None, None, None, None, None


@register_attention("performer")
class PerformerAttention(LinearAttention):
    # The normalizer's eps: only against 0/0 where every feature underflows (see the module doc);
    # 1e-20 is below half an fp32 ulp of the smallest normalizer the default kernel_eps allows (1e-8).
    eps = 1e-20

    def __init__(self, dim, num_heads=8, *, nb_features: int | None = None, kernel_eps: float = 1e-4,
                 feature_seed: int = 0, **kw):
        super().__init__(dim, num_heads, **kw)
        self.nb_features = nb_features if nb_features is not None else default_nb_features(self.head_dim)
        self.kernel_eps = kernel_eps
        self.feature_seed = feature_seed
        gen = torch.Generator().manual_seed(feature_seed)
        self.register_buffer("projection", orthogonal_random_features(self.nb_features, self.head_dim, gen),
                             persistent=True)

    def _exp_features(self, x: torch.Tensor, is_query: bool) -> torch.Tensor:
        """The features without their constant m^-1/2 kernel_eps: m^-1/2 exp(w.x' - |x'|^2/2 - stab)."""
        b, h, n, d = x.shape
        scale = d ** -0.25  # the data normalizer, folded into the small matrix [W, -1]
        half_sq = (0.5 * scale * scale) * (x * x).sum(dim=-1, keepdim=True)  # |x'|^2 / 2
        # w.x' - |x'|^2/2 as one (B*H*N, d+1) x (d+1, m) product of [x, |x'|^2/2] and
        # [d^-1/4 W, -1] (a batched product of skinny matrices is slow on CPUs, and this way the
        # backward pass needs no separate reduction for the |x'|^2 term).
        w = self.projection.to(x.dtype) * scale
        w = torch.cat([w, -torch.ones_like(w[:, :1])], dim=1)
        # (matmul folds the batch dims into one product, and its result is not a view: it can be
        # updated in place below)
        z = torch.matmul(torch.cat([x, half_sq], dim=-1), w.T)  # (B, H, N, m)
        with torch.no_grad():  # the stabilizer: max of w.x' per query token, per head for keys
            stab = z.amax(dim=-1, keepdim=True) + half_sq
            if not is_query:
                stab = stab.amax(dim=-2, keepdim=True)
            stab = stab + 0.5 * math.log(self.nb_features)  # m^-1/2 folded into the exponent
        # In place (the product's backward needs neither its output nor z): exp(z - stab).
        return exp_(z.sub_(stab))

    def features(self, q, k):
        c = self.nb_features ** -0.5 * self.kernel_eps
        return self._exp_features(q, True) + c, self._exp_features(k, False) + c

    def implicit(self, q, k, v):
        # Autocast off, as in the core (q, k, v arrive in the compute dtype, >= fp32): under fp16
        # autocast kernel_matrix's products of the smallest features would underflow to 0/0.
        with torch.autocast(device_type=q.device.type, enabled=False):
            return super().implicit(q, k, v)

    def attend(self, q, k, v):
        # The base's kernel_attention (this class's eps) with the constant c = m^-1/2 kernel_eps of every
        # feature added analytically: phi = e + c, so phi(K)^T [V, 1] = e(K)^T [V, 1] + c sum_j [v_j, 1]
        # and phi(Q) M = e(Q) M + c sum_r M_r. Numerator and normalizer come from one product.
        # Written out (forward and backward) in _FavorCore; the same as
        #     eq, ek = self._exp_features(q, True), self._exp_features(k, False)
        #     va = [v, 1] / n;  vk = va^T ek + c sum_n va;  out = eq vk^T + c sum_r vk
        #     return out[..., :-1] / (out[..., -1:] + eps)
        d = q.shape[-1]
        scale = d ** -0.25
        w = self.projection.to(q.dtype) * scale
        w_t = torch.cat([w, -torch.ones_like(w[:, :1])], dim=1).T
        c = self.nb_features ** -0.5 * self.kernel_eps
        return _FavorCore.apply(q, k, v, w_t, scale * scale, 0.5 * math.log(self.nb_features), c, self.eps)
