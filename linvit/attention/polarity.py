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

from .base import LOG2E, ImplicitAttention, LinearAttention, register_attention

_X_MAX = 1e6
_LOG_X_MAX = math.log(_X_MAX)  # as float32 rounds it: log(min(a, 1e6)) reaches it at the cap
_LOG_MIN_FACTOR = math.log(1e-30)


class _PolarityPowers(torch.autograd.Function):
    """[relu(x')^p, relu(-x')^p] for x' = min(|x| * inv_scale, 1e6), optionally divided by its
    maximum over the last two dims (a constant: no gradient flows through it), in few passes:
    one log of |x'| serves both polarities, x'^p = exp(p log x'), and the backward pass is
    written out (d/dx = p x'^p / x, d/dp = x'^p log x', d/d inv_scale = p x'^p / inv_scale).
    No Python branch reads a tensor's value, so torch.compile traces it whole. Eagerly, the two
    polarities are written straight into the output's halves, the cap's mask is read from the
    saved log, and the sums over batch and tokens run tokens first: in sequence, on one thread at
    (2, 4, 4096, 32), 7.4 against 9.3 ms forward and backward (a bool mask's product alone took
    2.0 ms of them, a sum over dims (0, 2) 0.8 against 0.15 as two sums)."""

    @staticmethod
    def forward(ctx, x, inv_scale, p, normalize):
        # The cap is applied unconditionally (one pass) and its mask recomputed in the backward,
        # rather than branching on a.max() (a data-dependent branch breaks torch.compile graphs).
        a = torch.abs(x).mul_(inv_scale).clamp_max_(_X_MAX)
        log_a = a.log_()
        e = log_a * (p * LOG2E)  # log2 |x'|^p: the power as exp2 (see base.exp_), LOG2E on p's few values
        if ctx.needs_input_grad[2]:
            log_a.clamp_min_(-1e30)  # -inf where x = 0, where the power (and so the gradient) is 0
        log_factor = None
        if normalize:
            # log2 of max_{n, c} x'^p: the divisor, applied inside the exponent
            log_factor = e.amax(dim=(-2, -1), keepdim=True).clamp_min_(_LOG_MIN_FACTOR * LOG2E)
            e.sub_(log_factor)
            log_factor = log_factor / LOG2E  # returned as a natural log
        signed = e.exp2_().copysign_(x)  # sign(x) |x'|^p
        d = x.shape[-1]
        # dynamo refuses out= into a strided view; a compiled graph fuses the cat's passes anyway
        if torch.compiler.is_compiling():
            pos = signed.clamp(min=0)
            out = torch.cat([pos, pos.sub(signed)], dim=-1)
        else:  # written straight into the halves of the output: no cat
            out = x.new_empty(*x.shape[:-1], 2 * d)
            pos = torch.clamp(signed, min=0, out=out[..., :d])  # relu(x')^p
            torch.sub(pos, signed, out=out[..., d:])  # relu(-x')^p (exactly: relu(s) - s = relu(-s))
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
        # No gradient through the cap, read from the saved log: log|x'| is log(1e6) exactly where
        # the cap held (and within float rounding of it only there).
        g.masked_fill_(log_a >= _LOG_X_MAX, 0.0)
        grad_x = grad_s = grad_p = None

        def over_batch_and_tokens(t):  # N first (its D channels contiguous), then B: 5x faster
            return t.sum(2, keepdim=True).sum(0, keepdim=True)

        if ctx.needs_input_grad[2]:
            grad_p = over_batch_and_tokens(g * log_a).sum_to_size(p.shape)
        if ctx.needs_input_grad[1]:
            grad_s = (over_batch_and_tokens(g) * p / inv_scale).sum_to_size(inv_scale.shape)
        if ctx.needs_input_grad[0]:
            # p |x'|^p / x; 0 / 0 where x = 0 (where the power and its derivative are 0)
            grad_x = g.mul_(p).div_(x).nan_to_num_(nan=0.0, posinf=float("inf"), neginf=float("-inf"))
        return grad_x, grad_s, grad_p, None


def _swap(t, dim):
    """[a, b] -> [b, a] along dim: phi_opp(q) . x = phi(q) . swap(x)."""
    a, b = t.chunk(2, dim=dim)
    return torch.cat([b, a], dim=dim)


class _PolarityCore(torch.autograd.Function):
    """The polarity core from the features on: for fq, fk (B, H, N, 2D), v (B, H, N, D), eps
    (B, H, 1, 1, no gradient) and the convolution's output on the patch tokens (B, H, N - start, D),

        kva = fk^T [v, 1] / n                                  (B, H, 2D, D + 1)
        mat = [kv[:, :D/2], swap(kv[:, D/2:]), k_mean, swap(k_mean)]   (B, H, 2D, D + 2)
        [num, den] = fq mat                                    (B, H, N, D + 2)
        out = num / (den + eps) per value half, + conv on the patch tokens

    where swap exchanges the positive and negative halves of the 2D feature rows (phi_opp(q) .
    x = phi(q) . swap(x)): one product of phi(K) gives numerators' and normalizers' matrix, one of
    phi(Q) all of them. One autograd Function with its backward written out: the products as
    autograd would take them, the quotient's gradients as two elementwise passes, the small
    (2D, D + 2) matrices' cats and swaps undone by hand. With the
    features' own passes (`_PolarityPowers`), measured on an Intel Xeon with AVX-512 at 4,096
    tokens, the module's forward and backward (`linvit benchmark`'s step), median of 5 runs
    alternating with autograd over the same ops: 98.7 against 109.5 ms on one thread, 52.6
    against 60.6 on two."""

    @staticmethod
    def forward(ctx, fq, fk, v, eps, conv, start):
        n, d = v.shape[-2:]
        half = d // 2
        va = torch.cat([v, torch.ones_like(v[..., :1])], dim=-1)
        kva = (fk.transpose(-1, -2) @ va).div_(n)  # (B, H, 2D, D + 1): a reduction over tokens
        kv, k_mean = kva[..., :d], kva[..., d:]
        mat = torch.cat([kv[..., :half], _swap(kv[..., half:], dim=-2),
                         k_mean, _swap(k_mean, dim=-2)], dim=-1)
        r = fq @ mat  # (B, H, N, D + 2)
        inv_den = (r[..., d:] + eps).reciprocal_().unsqueeze(-1)  # (B, H, N, 2, 1)
        num = r[..., :d].unflatten(-1, (2, half))
        if start == 0:  # no prefix tokens: the conv term and the quotient in one pass
            out = torch.addcmul(conv.unflatten(-1, (2, half)), num, inv_den).flatten(-2)
        else:
            out = (num * inv_den).flatten(-2)
            out[:, :, start:] += conv  # prefix tokens get no conv term
        ctx.save_for_backward(fq, fk, va, mat, r, inv_den)
        ctx.start = start
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        fq, fk, va, mat, r, inv_den = ctx.saved_tensors
        n, d = va.shape[-2], va.shape[-1] - 1
        half = d // 2
        g = grad.unflatten(-1, (2, half))  # (B, H, N, 2, D/2), any strides (merge_heads' view)
        g_num = g * inv_den
        # d/d den of num / den: -sum_c g_c num_c / den^2, per value half
        g_den = (g_num * r[..., :d].unflatten(-1, (2, half))).sum(dim=-1).mul_(inv_den.squeeze(-1)).neg_()
        g_r = torch.cat([g_num.flatten(-2), g_den], dim=-1)  # (B, H, N, D + 2)
        g_fq = g_r @ mat.transpose(-1, -2)  # (B, H, N, 2D)
        g_mat = fq.transpose(-1, -2) @ g_r  # (B, H, 2D, D + 2): a reduction over tokens
        # undo the cat and the swaps of the small matrix: d/d kva, with kva's 1/n
        g_kv_low, g_kv_high, g_k1, g_k2 = g_mat.split([half, half, 1, 1], dim=-1)
        g_kva = torch.cat([g_kv_low, _swap(g_kv_high, dim=-2),
                           g_k1 + _swap(g_k2, dim=-2)], dim=-1).div_(n)
        g_fk = va @ g_kva.transpose(-1, -2)  # (B, H, N, 2D)
        g_v = fk @ g_kva[..., :d]  # (B, H, N, D)
        g_conv = grad if ctx.start == 0 else grad[:, :, ctx.start:]
        return g_fq, g_fk, g_v, None, g_conv, None


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

    # -- the core --------------------------------------------------------------------------------
    def attend(self, q, k, v):
        fq, fk, log_factor = self.features(q, k)
        sl = self.patch_slice(q.shape[-2])
        return _PolarityCore.apply(fq, fk, v, self._eps(log_factor), self._conv(v), sl.start)

    def implicit(self, q, k, v):
        fq, fk, log_factor = self.features(q, k)
        eps = self._eps(log_factor)
        mats = []
        for f in (fq, _swap(fq, dim=-1)):
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
        conv = F.conv2d(grid, self.dwc.weight.to(v.dtype), self.dwc.bias.to(v.dtype), padding=self.dwc.padding,
                        groups=grid.shape[1])
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
