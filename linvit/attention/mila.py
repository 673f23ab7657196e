"""MILA's linear attention core (Han et al. 2024, "Demystify Mamba in Vision: A Linear Attention
Perspective", NeurIPS 2024; official code LeapLabTHU/MLLA, `models/mlla.py`, class LinearAttention).

Formula as implemented, per head (N tokens, prefix tokens included in every sum):

    phi(x) = elu(x) + 1                          on q and k (B, H, N, D)
    R_i    = 2D rotary rotation of token i        (identity for class/prefix tokens)
    out_i  = (R_i phi(q_i)) . [1/N sum_j (R_j phi(k_j)) v_j^T]  /  (phi(q_i) . 1/N sum_j phi(k_j) + 1e-6)
             + LePE(v)_i

The rotary terms sit in the numerator only; the denominator uses the un-rotated features, as in
the official code. The implicit matrix (R_i phi(q_i) . R_j phi(k_j) / N) / (phi(q_i) . mean phi(k) + eps)
can therefore have negative entries and rows that do not sum to one (`row_normalized = False`).

RoPE exactly as the official `RoPE(shape=(H, W, dim))`: it acts on the merged channels (all heads
together, before the split into heads), channel pairs (2p, 2p+1) rotated as complex numbers;
with K = dim // 4 and theta_t = 1 / 10000^(t / K), pair p < K turns by row * theta_p and pair
p >= K by col * theta_(p-K) (row, col: 0-based patch coordinates). So the heads get different
frequency bands, as in MLLA. Needs dim % 4 == 0.

LePE: a depthwise 3x3 convolution (dim channels, one filter per head channel, with bias) on V laid
out on the patch grid, added to the attention output (official: `self.lepe(v)` on the merged
channels). Class/prefix tokens get neither rotation nor LePE.

Extra parameters (attn_extra): `lepe.conv.weight` (dim, 1, 3, 3) and `lepe.conv.bias` (dim), both
zero-initialized (MLLA uses PyTorch's default init), so at init the operator is exactly its pure
linear core (elu+1 linear attention with rotary numerator). The rotary tables are fixed buffers.
Copied from a softmax checkpoint: `qkv` (q, k and v projections) and `proj`.
Defaults (MLLA): LePE kernel 3, RoPE base 10000, eps 1e-6; no hyperparameters beyond these.

What of the MILA/MLLA block is left out (it lies outside a ViT attention module, which keeps timm's
block with its LayerNorms, residuals and MLP):
  * the conditional position encodings cpe1 / cpe2 (residual depthwise 3x3 convs before the
    attention branch and before the MLP);
  * the input projection `in_proj` and the depthwise 3x3 conv `dwc` + SiLU in front of attention;
  * the SiLU gate branch `act_proj` (out = out_proj(attn(x) * silu(act_proj(x))));
  * `out_proj` as a separate layer: its role is played by timm's `proj`;
  * MLLA's attention takes v = its input (no value projection) and only projects q, k (`qk`);
    here q, k, v all come from timm's `qkv`, so v keeps the softmax checkpoint's value projection.
MLLA has no forget gate by design, and neither does this module.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .base import ImplicitAttention, LinearAttention, elu_plus_one, kernel_attention, register_attention


# -- helpers shared with rala.py --------------------------------------------------------------------

def axial_rope_angles(grid: tuple[int, int], theta: torch.Tensor) -> torch.Tensor:
    """(gh*gw, 2K) angles for K frequencies: [row * theta, col * theta], patches row-major."""
    gh, gw = grid
    rows = torch.arange(gh, dtype=torch.float64).repeat_interleave(gw)
    cols = torch.arange(gw, dtype=torch.float64).repeat(gh)
    theta = theta.double()
    return torch.cat([rows[:, None] * theta, cols[:, None] * theta], dim=-1)


def rotation(angles: torch.Tensor) -> torch.Tensor:
    """(cos, sin) of `angles` as a float32 (..., 2) table: the rotation `rotate_pairs` applies, a
    module buffer. Real, not complex: `module.to(dtype)` casts a complex buffer to a real dtype by
    dropping its imaginary part (the sines), while a real one converts as every other buffer."""
    return torch.stack([torch.cos(angles), torch.sin(angles)], dim=-1).float()


def rotate_pairs(x: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
    """Rotate channel pairs (2p, 2p+1) of x (..., N, 2P) by the angles whose (cos, sin) table is
    rot (..., N, P, 2) (`rotation`): (x1 cos - x2 sin, x1 sin + x2 cos), each pair a complex number
    times cos + i sin. Why complex numbers: one vectorized pass each way instead of six strided
    half-width ones and a stack; measured at (2, 4, 4096, 32) on the CPU, 0.16 against 2.4 ms
    forward, 0.56 against 4.7 ms with the backward, and the same values to the bit there. Why its
    own autograd Function (`_RotatePairs`) and a stored rot: autograd's complex product also
    built rot from cos and sin on every call and took a slower backward; on an Intel Xeon, one
    thread, forward and backward 1.06 against 2.06 ms."""
    return _RotatePairs.apply(x, torch.view_as_complex(rot.to(torch.promote_types(x.dtype, torch.float32))))


class _RotatePairs(torch.autograd.Function):
    """x times rot pairwise (see `rotate_pairs`); the backward is the rotation back, times
    conj(rot) (rot is a fixed table: no gradient)."""

    @staticmethod
    def forward(ctx, x, rot):
        ctx.save_for_backward(rot)
        return _times(x, rot)

    @staticmethod
    def backward(ctx, grad):
        (rot,) = ctx.saved_tensors
        return _times(grad, rot.conj()), None


def _times(x: torch.Tensor, rot: torch.Tensor) -> torch.Tensor:
    if x.stride(-1) != 1 or any(st % 2 for st in x.stride()[:-1]):  # view_as_complex: pairs in place
        x = x.contiguous()
    return torch.view_as_real(torch.view_as_complex(x.unflatten(-1, (-1, 2))) * rot).flatten(-2)


def rotate_patches(x: torch.Tensor, patches: slice, rot: torch.Tensor) -> torch.Tensor:
    """x (B, H, N, D) with the channel pairs of its patch tokens rotated (`rotate_pairs`); the
    prefix tokens before them as they are."""
    out = rotate_pairs(x[:, :, patches], rot)
    return torch.cat([x[:, :, :patches.start], out], dim=-2) if patches.start else out


def rotary_kernel_attention(fq, fk, fq_rot, fk_rot, v, eps):
    """Numerator with rotated features, denominator with plain ones; means over tokens, O(N)."""
    return kernel_attention(fq, fk, v, eps, fq_num=fq_rot, fk_num=fk_rot)


def rotary_kernel_matrix(fq, fk, fq_rot, fk_rot, eps):
    """The N x N matrix `rotary_kernel_attention` applies."""
    num = fq_rot @ fk_rot.transpose(-2, -1) / fk.shape[-2]
    den = torch.einsum("bhnf,bhf->bhn", fq, fk.mean(dim=-2))
    return num / (den.unsqueeze(-1) + eps)


class PatchLePE(nn.Module):
    """Depthwise conv on V over the patch grid (one filter per head channel), zero-initialized;
    prefix tokens get no term. Parameters are the conv's, named `weight` and `bias` under it."""

    def __init__(self, dim: int, num_heads: int, kernel_size: int):
        super().__init__()
        self.num_heads, self.kernel_size = num_heads, kernel_size
        self.conv = nn.Conv2d(dim, dim, kernel_size, padding=kernel_size // 2, groups=dim)
        nn.init.zeros_(self.conv.weight)
        nn.init.zeros_(self.conv.bias)

    def forward(self, v: torch.Tensor, patches: slice, grid: tuple[int, int]) -> torch.Tensor:
        b, h, n, d = v.shape
        gh, gw = grid
        # Channels-last (B, gh, gw, C) memory seen as NCHW: the layout oneDNN's depthwise
        # convolution is fastest in (forward and backward 1.7-2.7x faster on CPU than NCHW), and
        # the one the qkv projection's tokens already have (channel c = h*D + d).
        img = v[:, :, patches].transpose(1, 2).reshape(b, gh, gw, h * d).permute(0, 3, 1, 2)
        img = img.contiguous(memory_format=torch.channels_last)
        out = F.conv2d(img, self.conv.weight.to(v.dtype), self.conv.bias.to(v.dtype), padding=self.conv.padding,
                       groups=img.shape[1])
        out = out.permute(0, 2, 3, 1).reshape(b, gh * gw, h, d).transpose(1, 2)
        return F.pad(out, (0, 0, patches.start, 0)) if patches.start else out  # prefix: no term

    def matrices(self, n: int, patches: slice, grid: tuple[int, int], head_dim: int):
        """(H, D, N, N) band and (H, D, N) bias, read off the conv with one-hot patch images."""
        gh, gw = grid
        p, c = gh * gw, self.conv.in_channels
        w = self.conv.weight
        dtype = torch.promote_types(w.dtype, torch.float32)
        w = w.to(dtype)
        basis = torch.eye(p, device=w.device, dtype=dtype).reshape(p, 1, gh, gw).expand(p, c, gh, gw)
        cols = F.conv2d(basis, w, None, padding=self.conv.padding, groups=c)  # (in, C, out)
        band = cols.reshape(p, c, p).permute(1, 2, 0).reshape(self.num_heads, head_dim, p, p)
        mix = torch.zeros(self.num_heads, head_dim, n, n, device=w.device, dtype=dtype)
        mix[:, :, patches, patches] = band
        bias = torch.zeros(self.num_heads, head_dim, n, device=w.device, dtype=dtype)
        bias[:, :, patches] = self.conv.bias.to(dtype).reshape(self.num_heads, head_dim, 1)
        return mix, bias


# -- the operator -----------------------------------------------------------------------------------

@register_attention("mila")
class MilaAttention(LinearAttention):
    eps = 1e-6
    positional = True
    row_normalized = False  # rotary numerator: signed entries, rows need not sum to one

    def __init__(self, dim, num_heads=8, *, lepe_kernel: int = 3, rope_base: float = 10000.0, **kw):
        super().__init__(dim, num_heads, **kw)
        if self.grid_size is None:
            raise ValueError("attention variant 'mila' needs grid_size (patch rows, cols)")
        if dim % 4:
            raise ValueError(f"attention variant 'mila' needs dim divisible by 4 (2D RoPE), got {dim}")
        self.lepe = PatchLePE(dim, num_heads, lepe_kernel)
        k_max = dim // 4
        theta = 1.0 / rope_base ** (torch.arange(k_max, dtype=torch.float64) / k_max)
        angles = axial_rope_angles(self.grid_size, theta)  # (P, dim/2) over the merged channels
        p = angles.shape[0]
        # Channel pair p of the merged channels lies in head p // (D/2): split per head.
        angles = angles.reshape(p, num_heads, self.head_dim // 2).transpose(0, 1)  # (H, P, D/2)
        self.register_buffer("rope_rotation", rotation(angles), persistent=False)

    def _rope(self, x: torch.Tensor) -> torch.Tensor:
        return rotate_patches(x, self.patch_slice(x.shape[-2]), self.rope_rotation)

    def _features(self, q, k):
        fq, fk = elu_plus_one(q), elu_plus_one(k)
        return fq, fk, self._rope(fq), self._rope(fk)

    def attend(self, q, k, v):
        out = rotary_kernel_attention(*self._features(q, k), v, self.eps)
        return out + self.lepe(v, self.patch_slice(v.shape[-2]), self.grid_size)

    def implicit(self, q, k, v):
        attn = rotary_kernel_matrix(*self._features(q, k), self.eps)
        n = q.shape[-2]
        mix, bias = self.lepe.matrices(n, self.patch_slice(n), self.grid_size, self.head_dim)
        return ImplicitAttention(attn=attn, v=v, mix=mix, bias=bias)

