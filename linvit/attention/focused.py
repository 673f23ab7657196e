"""Focused linear attention (FLatten, Han et al. 2023).

phi_p(x) = ||x'|| * x'^p / ||x'^p||  with  x' = (relu(x) + 1e-6) / softplus(s), focusing factor
p = 3, the norms taken over all channels (as in the official code, before the split into heads),
plus a learnable positional term added to K, and a depthwise convolution on V (kernel 5, one
filter per head channel, shared by the heads) whose output is added to the attention output.

ViT adaptation: the positional term and the convolution act on the patch grid only; the class
(prefix) tokens get neither. Operator-specific parameters start so the operator is its pure
linear core: the scale s and the positional term at zero (softplus(0) = ln 2, as in FLatten),
and the convolution zero-initialized (FLatten uses PyTorch's default init there).
"""

import torch
import torch.nn.functional as F
from torch import nn

from .base import LinearAttention, merge_heads, register_attention


class _FocusMap(torch.autograd.Function):
    """phi_p(x) = ||x'|| x'^p / ||x'^p|| with x' = (relu(x) + 1e-6) / s, norms over the last dim,
    for x (..., C) and s (C,), with its backward written out. Per token, with r = ||x'|| / ||x'^p||,
    g the output's gradient and G = g . x'^p:

        d/dx' = r (p x'^(p-1) (g - G x'^p / ||x'^p||^2) + G x' / ||x'||^2)

    then d/dx = d/dx' / s where x > 0 (0 elsewhere), d/ds = -sum over tokens of d/dx' x' / s.
    About ten passes over the features each way, fewer than autograd takes through relu, the
    division, the two norms, the power and the products: forward and backward of (2, 4096, 128)
    on one CPU thread, 4.1-5.8 against 6.7-7.1 ms."""

    @staticmethod
    def forward(ctx, x, s, p):
        a = F.relu(x).add_(1e-6).div_(s)  # x' > 0
        n1 = torch.linalg.vector_norm(a, dim=-1, keepdim=True)
        xp = a.pow(p)
        n2 = torch.linalg.vector_norm(xp, dim=-1, keepdim=True)
        r = n1.div_(n2)  # n1 is not needed again: r in its place
        ctx.save_for_backward(x, s, a, xp, r, n2)
        ctx.p = p
        return xp * r

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, g):
        x, s, a, xp, r, n2 = ctx.saved_tensors
        big_g = (g * xp).sum(dim=-1, keepdim=True)  # G
        n1_sq = (r * n2).square_()
        u = torch.addcmul(g, xp, big_g / n2.square(), value=-1)  # g - G x'^p / |x'^p|^2
        u.mul_(xp).div_(a).mul_(ctx.p)  # p x'^(p-1) (...)
        u.addcmul_(a, big_g / n1_sq).mul_(r)  # d/dx'
        grad_s = None
        if ctx.needs_input_grad[1]:
            grad_s = (u * a).sum(dim=tuple(range(u.dim() - 1))).div_(s).neg_()
        # relu's mask by its own backward kernel: a product with the bool mask x > 0 took 1.6 ms
        # at (2, 4096, 128) on one thread, this 0.45
        grad_x = torch.ops.aten.threshold_backward(u.div_(s), x, 0) if ctx.needs_input_grad[0] else None
        return grad_x, grad_s, None


@register_attention("focused")
class FocusedAttention(LinearAttention):
    eps = 1e-6
    positional = True

    def __init__(self, dim, num_heads=8, *, focusing_factor: float = 3.0, kernel_size: int = 5, **kw):
        super().__init__(dim, num_heads, **kw)
        if self.grid_size is None:
            raise ValueError("attention variant 'focused' needs grid_size (patch rows, cols)")
        self.focusing_factor = focusing_factor
        self.scale = nn.Parameter(torch.zeros(1, 1, 1, dim))
        self.positional_encoding = nn.Parameter(torch.zeros(1, self.grid_size[0] * self.grid_size[1], dim))
        self.dwc = nn.Conv2d(self.head_dim, self.head_dim, kernel_size, padding=kernel_size // 2,
                             groups=self.head_dim)
        nn.init.zeros_(self.dwc.weight)
        nn.init.zeros_(self.dwc.bias)

    def split_heads(self, x):
        # The features act on merged channels (B, N, C), which views of the qkv projection are
        # already: the base's contiguous per-head copies would only be merged back.
        q, k, v = self.qkv_views(x)
        return self.q_norm(q), self.k_norm(k), v

    def _split(self, t):  # (B, N, H*D) -> (B, H, N, D)
        b, n, c = t.shape
        return t.reshape(b, n, self.num_heads, c // self.num_heads).transpose(1, 2)

    def _focus(self, x):
        scale = F.softplus(self.scale.to(x.dtype)).reshape(-1)
        return _FocusMap.apply(x, scale, float(self.focusing_factor))

    def features(self, q, k):
        # Features are computed over all channels and then split, as FLatten does.
        q, k = merge_heads(q), merge_heads(k)
        patches = self.patch_slice(k.shape[1])
        pe = self.positional_encoding.to(k.dtype)
        if patches.start:  # prefix tokens get no positional term
            pe = F.pad(pe, (0, 0, patches.start, 0))
        return self._split(self._focus(q)), self._split(self._focus(k + pe))

    def _grid(self, v):  # patch tokens of (B, H, N, D) -> (B*H, D, gh, gw)
        b, h, n, d = v.shape
        gh, gw = self.grid_size
        return v[:, :, self.patch_slice(n)].reshape(b * h, gh, gw, d).permute(0, 3, 1, 2)

    def mix(self, v):
        b, h, n, d = v.shape
        grid = self._grid(v)
        conv = F.conv2d(grid, self.dwc.weight.to(v.dtype), self.dwc.bias.to(v.dtype), padding=self.dwc.padding,
                        groups=grid.shape[1])
        conv = conv.permute(0, 2, 3, 1).reshape(b, h, -1, d)
        if not self.num_prefix_tokens:
            return conv
        return F.pad(conv, (0, 0, self.num_prefix_tokens, 0))  # prefix tokens get no conv term

    def mix_matrices(self, n):
        gh, gw = self.grid_size
        p, d = gh * gw, self.head_dim
        # Convolve each one-hot patch image to read the band matrix off the layer itself.
        w = self.dwc.weight
        dtype = torch.promote_types(w.dtype, torch.float32)
        basis = torch.eye(p, device=w.device, dtype=dtype).reshape(p, 1, gh, gw).expand(p, d, gh, gw)
        cols = F.conv2d(basis, w.to(dtype), None, padding=self.dwc.padding, groups=d)
        band = cols.reshape(p, d, p).permute(1, 2, 0)  # (D, out patch, in patch)
        mix = torch.zeros(d, n, n, device=band.device, dtype=dtype)
        mix[:, self.num_prefix_tokens:, self.num_prefix_tokens:] = band
        bias = torch.zeros(d, n, device=band.device, dtype=dtype)
        bias[:, self.num_prefix_tokens:] = self.dwc.bias.to(dtype).unsqueeze(1)
        return mix, bias
