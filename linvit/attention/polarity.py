"""Polarity-aware linear attention (PolaFormer: Meng, Luo, Li, Jiang and Zhang, ICLR 2025,
"PolaFormer: Polarity-aware Linear Attention for Vision Transformers").

Formula as implemented, per head (D channels, head_dim even), following the official code
(ZacharyMeng/PolaFormer, PolaLinearAttention):

    s = softplus(scale)                                       (per channel of C = H*D)
    q' = q / s,   k' = (k + pe) / s                           (pe on patch keys only)
    p = 1 + alpha * sigmoid(power)                            (per head and channel, alpha = 4)
    phi(x) = [relu(x')^p, relu(-x')^p]                        (positive and negative parts, 2D)
    phi_sim(q) = [relu(q')^p, relu(-q')^p],  phi_opp(q) = [relu(-q')^p, relu(q')^p]
    O_sim = sum_j phi_sim(q_i).phi(k_j) v1_j / n / (sum_j phi_sim(q_i).phi(k_j) / n + eps)
    O_opp = sum_j phi_opp(q_i).phi(k_j) v2_j / n / (sum_j phi_opp(q_i).phi(k_j) / n + eps)
    out   = ([O_sim, O_opp] + DWC_5x5(v)) * g,   g = x W_g^T + b_g

where v = [v1, v2] splits each head's value channels into halves: the same-signed interactions
(q+k+ and q-k-) mix the first half, the opposite-signed ones (q+k- and q-k+) the second, each with
its own normalizer (ImplicitAttention's (B, H, 2, N, N) grouped form). eps = 1e-6 as in the
official code. DWC is a depthwise 5x5 convolution on the patch grid, one filter per head channel
shared by the heads (as in the official code), whose output is added before the gate.

Extra parameters (attn_extra group; shapes as in the official code) and their init:
  power (1, H, 1, D)      zeros: p = 1 + 4 * sigmoid(0) = 3 on every channel (official init)
  scale (1, 1, C)         zeros: softplus(0) = ln 2 (official init; with equal exponents it is a
                          common factor of all features, so it cancels in the normalizer)
  positional_encoding (1, gh*gw, C)   zeros (official init), added to the patch keys
  dwc (Conv2d D->D, 5x5, groups=D)    zero weight and bias (official: PyTorch default init)
  gate_proj (Linear C->C)             zero weight, bias ones: g = 1, the gate starts as the identity
So the operator starts as its pure polarity core with p = 3. Copies from a softmax checkpoint:
`qkv` and `proj`. Defaults: alpha = 4, kernel_size = 5 (the paper's ViT/DeiT settings).

Deliberate differences from the official code:
- The gate g has its own Linear (`gate_proj`) instead of sharing one with q (official `qg`),
  because q comes from the softmax checkpoint's `qkv`; and it starts as the identity (zero weight,
  bias one, so it has a bias even without qkv_bias) where the official gate is trained from
  scratch from a std-0.02 init (g ~ 0), which would silence a transferred checkpoint.
- Class/prefix tokens: they take part in the attention as queries and keys like every token, but
  get neither the positional term (added to patch keys only) nor the convolution (the official
  PolaFormer backbones have no class token).
- Numerical safety (same values up to rounding): phi(k) is divided by its maximum over tokens and
  channels (per batch and head); the factor cancels between numerator and normalizer, and eps is
  divided by it too (in log space, exponent clamped to [-60, 60]) so that the normalizer's eps
  keeps its official meaning. Without this, sums of phi(q).phi(k) for activations 100x their
  usual scale (x^5 * y^5) overflow fp32. |x'| is capped at 1e6 before the power (x^5 < 3e38),
  far beyond any activation.
- `scale` and the key positional term come from the official code (inherited from FLatten) rather
  than the paper's equations; `positional_encoding=False` drops the latter.
"""

import math

import torch
import torch.nn.functional as F
from torch import nn

from ..onednn import matmul, matmul_t
from .base import ImplicitAttention, LinearAttention, register_attention
from .depthwise import depthwise_conv2d

_X_MAX = 1e6
_LOG_MIN_FACTOR = math.log(1e-30)


class _PolarityPowers(torch.autograd.Function):
    """[relu(x')^p, relu(-x')^p] for x' = min(|x| * inv_scale, 1e6), optionally divided by its
    maximum over the last two dims (a constant: no gradient flows through it), in few passes:
    one log of |x'| serves both polarities, x'^p = exp(p log x'), and the backward pass is
    written out (d/dx = p x'^p / x, d/dp = x'^p log x', d/d inv_scale = p x'^p / inv_scale).
    No Python branch reads a tensor's value, so torch.compile traces it whole."""

    @staticmethod
    def forward(ctx, x, inv_scale, p, normalize):
        # The cap is applied unconditionally (one pass) and its mask recomputed in the backward,
        # rather than branching on a.max() (a data-dependent branch breaks torch.compile graphs).
        a = torch.abs(x).mul_(inv_scale).clamp_max_(_X_MAX)
        log_a = a.log_()
        e = log_a * p
        if ctx.needs_input_grad[2]:
            log_a.clamp_min_(-1e30)  # -inf where x = 0, where the power (and so the gradient) is 0
        log_factor = None
        if normalize:
            # log of max_{n, c} x'^p: the divisor, applied inside the exponent
            log_factor = e.amax(dim=(-2, -1), keepdim=True).clamp_min_(_LOG_MIN_FACTOR)
            e.sub_(log_factor)
        signed = e.exp_().copysign_(x)  # sign(x) |x'|^p
        pos = signed.clamp(min=0)  # relu(x')^p
        neg = pos.sub(signed)  # relu(-x')^p (exactly: relu(s) - s = relu(-s))
        out = torch.cat([pos, neg], dim=-1)
        ctx.save_for_backward(x, inv_scale, p, out, log_a)
        if log_factor is not None:
            ctx.mark_non_differentiable(log_factor)
        return out, log_factor

    @staticmethod
    def backward(ctx, grad, _):
        x, inv_scale, p, out, log_a = ctx.saved_tensors
        d = x.shape[-1]
        # grad . d out / d(|x'|^p) times |x'|^p: one of the two halves of out is zero everywhere
        g = grad[..., :d] * out[..., :d]
        g.addcmul_(grad[..., d:], out[..., d:])
        g.mul_(torch.abs(x).mul_(inv_scale) <= _X_MAX)  # no gradient through the cap
        grad_x = grad_s = grad_p = None
        dims = (0, 2)
        if ctx.needs_input_grad[2]:
            grad_p = (g * log_a).sum(dims, keepdim=True).sum_to_size(p.shape)
        g.mul_(p)
        if ctx.needs_input_grad[1]:
            grad_s = (g.sum(dims, keepdim=True) / inv_scale).sum_to_size(inv_scale.shape)
        if ctx.needs_input_grad[0]:
            # p |x'|^p / x; 0 / 0 where x = 0 (where the power and its derivative are 0)
            grad_x = g.div_(x).nan_to_num_(nan=0.0, posinf=float("inf"), neginf=float("-inf"))
        return grad_x, grad_s, grad_p, None


@register_attention("polarity")
class PolarityAttention(LinearAttention):
    eps = 1e-6
    positional = True

    def __init__(self, dim, num_heads=8, *, alpha: float = 4.0, kernel_size: int = 5,
                 positional_encoding: bool = True, **kw):
        super().__init__(dim, num_heads, **kw)
        if self.grid_size is None:
            raise ValueError("attention variant 'polarity' needs grid_size (patch rows, cols)")
        if self.head_dim % 2:
            raise ValueError(f"attention variant 'polarity' splits each head's values into halves: "
                             f"head_dim {self.head_dim} must be even")
        self.alpha = alpha
        self.power = nn.Parameter(torch.zeros(1, num_heads, 1, self.head_dim))
        self.scale = nn.Parameter(torch.zeros(1, 1, dim))
        gh, gw = self.grid_size
        self.positional_encoding = (nn.Parameter(torch.zeros(1, gh * gw, dim))
                                    if positional_encoding else None)
        self.dwc = nn.Conv2d(self.head_dim, self.head_dim, kernel_size, padding=kernel_size // 2,
                             groups=self.head_dim)
        nn.init.zeros_(self.dwc.weight)
        nn.init.zeros_(self.dwc.bias)
        self.gate_proj = nn.Linear(dim, dim)
        nn.init.zeros_(self.gate_proj.weight)
        nn.init.ones_(self.gate_proj.bias)

    # -- features --------------------------------------------------------------------------------
    def _powers(self, x, inv_scale, p, normalize=False):
        """[relu(x')^p, relu(-x')^p] (B, H, N, 2D) for x' = x / softplus(scale). |x'| is capped at
        1e6 so that x'^p (p <= 5) stays finite in fp32; activations never come near it. With
        `normalize`, the features divided by their maximum over tokens and channels (per batch and
        head), and the log of that divisor (B, H, 1, 1); else None for it."""
        return _PolarityPowers.apply(x, inv_scale, p, normalize)

    def features(self, q, k):
        """phi(q) = [relu(q')^p, relu(-q')^p]; phi(k) likewise, divided by its maximum over tokens
        and channels (per batch and head, so that phi(q).phi(k) sums stay finite in fp32); and the
        log of that divisor (B, H, 1, 1): it cancels between numerator and normalizer, and
        rescales eps (see `_eps`)."""
        b, h, n, d = q.shape
        inv_scale = 1.0 / F.softplus(self.scale.to(q.dtype)).reshape(1, h, 1, d)
        p = 1.0 + self.alpha * torch.sigmoid(self.power.to(q.dtype))
        if self.positional_encoding is not None:
            start = self.patch_slice(n).start
            pe = self.positional_encoding.to(q.dtype).reshape(1, -1, h, d).transpose(1, 2)
            if start:
                pe = F.pad(pe, (0, 0, start, 0))
            k = k + pe  # patch keys only
        fq, _ = self._powers(q, inv_scale, p)
        fk, log_factor = self._powers(k, inv_scale, p, normalize=True)
        return fq, fk, log_factor

    def _eps(self, log_factor):
        """eps of the official normalizer, for key features divided by exp(log_factor)."""
        return self.eps * torch.exp(-log_factor.clamp(-60.0, 60.0))

    @staticmethod
    def _swap(t, dim):
        """[a, b] -> [b, a] along dim: phi_opp(q) . x = phi(q) . swap(x)."""
        a, b = t.chunk(2, dim=dim)
        return torch.cat([b, a], dim=dim)

    # -- the core --------------------------------------------------------------------------------
    def attend(self, q, k, v):
        fq, fk, log_factor = self.features(q, k)
        b, h, n, d = v.shape
        half = d // 2
        # phi(K)^T [V, 1]: the values and the key sum (normalizer) in one contraction, with the
        # mean's 1/n applied to the small matrix.
        va = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)
        kva = matmul_t(fk, va) / n  # (B, H, 2D, D + 1): fk.T @ va, its gradients through oneDNN
        kv, k_mean = kva[..., :d], kva[..., d]
        # Same-signed pairs mix the first half of v, opposite-signed pairs (phi_opp(q) = swapped
        # phi(q), i.e. swapped rows of kv) the second; the normalizers are two more columns: one
        # contraction of phi(Q) gives numerators and normalizers.
        mat = torch.cat([kv[..., :half], self._swap(kv[..., half:], dim=-2),
                         k_mean.unsqueeze(-1), self._swap(k_mean, dim=-1).unsqueeze(-1)], dim=-1)
        num, den = matmul(fq, mat).split([d, 2], dim=-1)  # (B, H, N, D), (B, H, N, 2); tall: oneDNN
        inv_den = 1.0 / (den + self._eps(log_factor))
        num = num.unflatten(-1, (2, half))
        inv_den = inv_den.unsqueeze(-1)
        sl = self.patch_slice(n)
        if sl.start == 0:  # no prefix tokens: the conv term and the quotient in one pass
            return torch.addcmul(self._conv(v).unflatten(-1, (2, half)), num, inv_den).flatten(-2)
        out = (num * inv_den).flatten(-2)
        out[:, :, sl] += self._conv(v)  # prefix tokens get no conv term
        return out

    def implicit(self, q, k, v):
        fq, fk, log_factor = self.features(q, k)
        eps = self._eps(log_factor)
        mats = []
        for f in (fq, self._swap(fq, dim=-1)):
            scores = f @ fk.transpose(-2, -1) / fk.shape[-2]
            mats.append(scores / (scores.sum(dim=-1, keepdim=True) + eps))
        mix, bias = self.mix_matrices(q.shape[-2])
        return ImplicitAttention(attn=torch.stack(mats, dim=2), v=v, mix=mix.to(v.dtype),
                                 bias=bias.to(v.dtype))

    # -- depthwise convolution on V over the patch grid ------------------------------------------
    def _conv(self, v):
        """The convolution's output on the patch tokens, (B, H, gh*gw, D)."""
        b, h, n, d = v.shape
        gh, gw = self.grid_size
        # (B*H, gh, gw, D) permuted to NCHW is channels-last: the fast layout for depthwise convs
        grid = v[:, :, self.patch_slice(n)].reshape(b * h, gh, gw, d).permute(0, 3, 1, 2)
        conv = depthwise_conv2d(grid, self.dwc.weight.to(v.dtype), self.dwc.bias.to(v.dtype), self.dwc.padding)
        return conv.permute(0, 2, 3, 1).reshape(b, h, gh * gw, d)

    def mix(self, v):
        return F.pad(self._conv(v), (0, 0, self.num_prefix_tokens, 0))

    def mix_matrices(self, n):
        gh, gw = self.grid_size
        p, d = gh * gw, self.head_dim
        start = self.patch_slice(n).start
        w = self.dwc.weight
        dtype = torch.promote_types(w.dtype, torch.float32)
        basis = torch.eye(p, device=w.device, dtype=dtype).reshape(p, 1, gh, gw).expand(p, d, gh, gw)
        cols = F.conv2d(basis, w.to(dtype), None, padding=self.dwc.padding, groups=d)
        mix = torch.zeros(d, n, n, device=w.device, dtype=dtype)
        mix[:, start:, start:] = cols.reshape(p, d, p).permute(1, 2, 0)  # (D, out patch, in patch)
        bias = torch.zeros(d, n, device=w.device, dtype=dtype)
        bias[:, start:] = self.dwc.bias.to(dtype).unsqueeze(1)
        return mix, bias

    # -- output gate -----------------------------------------------------------------------------
    def gate(self, x):
        return self.gate_proj(x)
