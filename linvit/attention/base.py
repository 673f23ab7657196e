"""The linear attention base class, the registry of operators, and softmax attention maps.

Every operator keeps timm's parameter names (`qkv`, `q_norm`, `k_norm`, `proj`) so that weights
with a softmax counterpart line up by name, and computes the non-causal kernelized form

    out_i = sum_j phi(q_i) . phi(k_j) v_j / sum_j phi(q_i) . phi(k_j)

in O(N) by contracting phi(K)^T V first. The contractions run in at least fp32 whatever the
autocast dtype, because the normalizer is a sum over all tokens and overflows fp16 on large
activations; a float64 module computes in float64.

The core (`attention_core`) is a leaf for torch.fx (`torch.fx.wrap`): a traced model (plain
`torch.fx.symbolic_trace`, timm's fx feature extraction) calls it as one node and runs it eagerly,
so the traced graph keeps the fp32 core under autocast, the mask check and hand-written backwards.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from timm.layers import LayerNorm
from torch import nn


ATTENTION: dict[str, type["LinearAttention"]] = {}
# Called with each newly registered name (models.py registers the timm entry points this way).
ON_REGISTER: list = []
# Called with each name just before it is unregistered (models.py removes the timm entry points).
ON_UNREGISTER: list = []


def register_attention(name: str):
    """Class decorator: make an operator selectable by `name` in configs and on the command line."""

    def wrap(cls):
        if name in ATTENTION:
            raise ValueError(f"attention variant {name!r} is registered twice")
        cls.variant = name
        ATTENTION[name] = cls
        for hook in ON_REGISTER:
            hook(name)
        return cls

    return wrap


def unregister_attention(name: str) -> None:
    """Undo `register_attention(name)`: the name and everything hooked to it (timm entry points)."""
    if name not in ATTENTION:
        raise ValueError(f"attention variant {name!r} is not registered")
    for hook in ON_UNREGISTER:
        hook(name)
    del ATTENTION[name]


def available_variants() -> list[str]:
    return sorted(ATTENTION)


def attention_class(name: str) -> type["LinearAttention"]:
    try:
        return ATTENTION[name]
    except KeyError:
        raise ValueError(f"unknown attention variant {name!r}; known variants: "
                         f"{', '.join(available_variants())}") from None


@dataclass
class ImplicitAttention:
    """What an operator applies to V, written out as matrices (quadratic: for analysis and tests).

    attn:  (B, H, N, N) per-head token mixing, or (B, H, G, N, N) when the value channels of a
           head are split into G equal groups, each mixed by its own matrix (PolaFormer's halves).
    v:     (B, H, N, D) the values it is applied to.
    mix:   optional per-channel token mixing added to the output (a depthwise convolution on the
           patch grid, say): (D, N, N) shared by all heads, or (H, D, N, N) per head channel.
    bias:  optional constant added with `mix`: (D, N) or (H, D, N).
    gate:  optional (B, N, H*D) elementwise factor on the merged output (an output gate).
    """

    attn: torch.Tensor
    v: torch.Tensor
    mix: torch.Tensor | None = None
    bias: torch.Tensor | None = None
    gate: torch.Tensor | None = None

    def per_head(self) -> torch.Tensor:
        """(B, H, N, D): the heads' outputs before merging and gating."""
        if self.attn.dim() == 5:
            groups = self.v.chunk(self.attn.shape[2], dim=-1)
            out = torch.cat([self.attn[:, :, g] @ vg for g, vg in enumerate(groups)], dim=-1)
        else:
            out = self.attn @ self.v
        if self.mix is not None:
            eq = "dnm,bhmd->bhnd" if self.mix.dim() == 3 else "hdnm,bhmd->bhnd"
            out = out + torch.einsum(eq, self.mix, self.v)
        if self.bias is not None:
            out = out + self.bias.transpose(-1, -2)
        return out

    def output(self) -> torch.Tensor:
        """The operator's output before the output projection, as (B, N, H*D)."""
        out = merge_heads(self.per_head())
        return out * self.gate if self.gate is not None else out

    def maps(self) -> torch.Tensor:
        """A row-stochastic (B, H, N, N) view for comparing with softmax maps: value groups
        averaged, negative weights (rotary terms) clipped, rows renormalized."""
        a = self.attn.mean(dim=2) if self.attn.dim() == 5 else self.attn
        a = a.clamp_min(0)
        rows = a.sum(dim=-1, keepdim=True)
        # A row with no weight at all (every feature zero) says nothing: read it as uniform.
        return torch.where(rows > 1e-12, a / rows.clamp_min(1e-12), torch.full_like(a, 1 / a.shape[-1]))


def merge_heads(t: torch.Tensor) -> torch.Tensor:
    b, h, n, d = t.shape
    return t.transpose(1, 2).reshape(b, n, h * d)


def compute_dtype(t: torch.Tensor) -> torch.dtype:
    """The dtype an operator's core computes in: t's, promoted to at least fp32."""
    return torch.promote_types(t.dtype, torch.float32)


@torch.fx.wrap
def attention_core(attn: "LinearAttention", q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   attn_mask: torch.Tensor | None = None, is_causal: bool = False) -> torch.Tensor:
    """`attn.attend` on q, k, v (B, H, N, D) in at least fp32, heads merged: (B, N, H*D) in v's dtype.

    Wrapped for torch.fx: tracing records one call of this function (the module as a get_attr
    argument) instead of reading tensors or masks as Proxies, and the traced graph runs it eagerly.
    """
    # Checked here, on the real arguments, so that a traced graph keeps the check.
    if attn_mask is not None or is_causal:
        raise ValueError(f"attention variant {attn.variant!r} is non-causal and takes no mask")
    dtype = compute_dtype(v)
    # Autocast off: its normalizer sums over all tokens (fp16 overflows); fp32 at least, float64 kept.
    with torch.autocast(device_type=v.device.type, enabled=False):
        out = merge_heads(attn.attend(q.to(dtype), k.to(dtype), v.to(dtype)))
    return out.to(v.dtype)


LOG2E = 1.0 / math.log(2.0)  # exp(x) = 2^(x log2 e)


def exp_(x: torch.Tensor) -> torch.Tensor:
    """exp(x) in place, as 2^(x log2 e): x.mul_(LOG2E).exp2_(), returning x. Why: this torch's CPU
    `exp` runs at 0.8-1.4 ns per element on one thread and `exp2` at 0.3, so the product and exp2
    together take about half of exp's time (measured on an AMD EPYC Zen 4 with AVX-512, (2, 4,
    4,096, 32): exp(min(x, 0)) 1.50 against 0.66 ms). The values agree with exp's to float rounding:
    the relative error against the exact exponential of the float input is at most 2.9e-7 on
    [-5, 0], against exp's 6e-8. Where a scale comes before the exponential anyway (performer's
    projection, polarity's power), fold LOG2E into it and call exp2_ directly: no extra pass."""
    return x.mul_(LOG2E).exp2_()


class _EluPlusOne(torch.autograd.Function):
    """elu(x) + 1 as exp(min(x, 0)) + relu(x), whose derivative is exp(min(x, 0)) itself: the forward
    keeps that one tensor for the backward, which is a single product. relu(x) is the result's own
    buffer, e added into it in place: one allocation fewer than e + relu(x), the same bits (float
    addition commutes), 0.86 against 0.98 ms at (256, 4, 50, 16) on one thread (a micro ViT's
    evaluation pass 0.987 of its time, paired; `elu`'s module step at 4,096 tokens 0.981)."""

    @staticmethod
    def forward(ctx, x):
        e = exp_(x.clamp_max(0))
        ctx.save_for_backward(e)
        return x.clamp_min(0).add_(e)  # x > 0: x + 1 (exp(0) is exactly 1); x <= 0: exp(x)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        (e,) = ctx.saved_tensors
        return grad * e


def elu_plus_one(x: torch.Tensor) -> torch.Tensor:
    """elu(x) + 1, the feature map of Katharopoulos et al. (and of MILA's and RALA's cores): equal to
    F.elu(x) + 1 up to float rounding (exp(x) there, expm1(x) + 1 in F.elu), with the same gradient.
    Why not F.elu: PyTorch's CPU kernels compute expm1 (and so elu) in a scalar loop, measured here
    12 ns per element against exp's 0.8, which made elu 44% of a micro ViT's forward pass; exp
    (as `exp_` computes it), clamp and relu are vectorized. One fused step forward and backward (not a chain of autograd ops,
    whose clamp backward is another slow masked pass)."""
    return _EluPlusOne.apply(x)


def kernel_attention(fq: torch.Tensor, fk: torch.Tensor, v: torch.Tensor, eps: float, *,
                     fq_num: torch.Tensor | None = None, fk_num: torch.Tensor | None = None,
                     clamp: bool = False) -> torch.Tensor:
    """sum_j fq_i . fk_j v_j / (sum_j fq_i . fk_j + eps) in O(N), with means over tokens so that
    neither contraction grows with N (no overflow at long sequences). With `fq_num` and `fk_num`
    (rotated features, say), the numerator is sum_j fq_num_i . fk_num_j v_j instead, the
    normalizer still from fq and fk. `clamp`: the normalizer is max(mean_j fq_i . fk_j, eps)
    instead of the mean plus eps (cosFormer's). One autograd Function (`_KernelCore`) with its
    backward written out."""
    return _KernelCore.apply(fq, fk, v, eps, fq_num, fk_num, clamp)


class _KernelCore(torch.autograd.Function):
    """`kernel_attention`: the same products as autograd would take, with the division's and the
    normalizer's backward as two elementwise passes (autograd took an outer product through a
    batched matmul for the latter, 7 ms of hedgehog's 94 at 4,096 tokens), results divided in
    place, and nothing recomputed. Measured at (2, 4, 4096, F) with D = 32 on the CPU, forward and
    backward: 16.9 -> 9.3 ms for F = 32, 33.3 -> 16.7 ms for F = 64 (against the einsum form)."""

    @staticmethod
    def forward(ctx, fq, fk, v, eps, fq_num, fk_num, clamp):
        rotary = fq_num is not None
        # Each head's (N, F) block in one piece, once: operators that keep the projection's
        # token-major layout (views) would otherwise be copied by every product below and in the
        # backward pass (`focused`: 9 such copies of (B, H, N, D) in a module step).
        fq, fk, v = fq.contiguous(), fk.contiguous(), v.contiguous()
        if rotary:
            fq_num, fk_num = fq_num.contiguous(), fk_num.contiguous()
        a, b = (fq_num, fk_num) if rotary else (fq, fk)
        n = fk.shape[-2]
        kmean = fk.mean(dim=-2, keepdim=True)  # (B, H, 1, F)
        kv = (b.transpose(-1, -2) @ v).div_(n)  # (B, H, F, D)
        den = fq @ kmean.transpose(-1, -2)  # (B, H, N, 1)
        den = den.clamp_min_(eps) if clamp else den.add_(eps)
        out = (a @ kv).div_(den)
        ctx.save_for_backward(fq, v, kv, kmean, den, out, a, b)
        ctx.rotary, ctx.n, ctx.fk_shape = rotary, n, fk.shape
        ctx.floor = eps if clamp else None
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        fq, v, kv, kmean, den, out, a, b = ctx.saved_tensors
        n = ctx.n
        # contiguous, whatever the layout of the gradient handed in (a view's, after merge_heads)
        g_num = torch.div(grad, den, out=torch.empty_like(out))  # (B, H, N, D)
        g_den = (g_num * out).sum(dim=-1, keepdim=True).neg_()  # (B, H, N, 1)
        if ctx.floor is not None:  # no gradient where the clamp held the normalizer at its floor
            g_den.mul_(den > ctx.floor)
        g_kv = (a.transpose(-1, -2) @ g_num).div_(n)  # (B, H, F, D)
        g_kmean = (g_den.transpose(-1, -2) @ fq).div_(n)  # (B, H, 1, F): d/d fk_j, every token j
        g_a = g_num @ kv.transpose(-1, -2)  # (B, H, N, F)
        g_b = v @ g_kv.transpose(-1, -2)
        g_v = b @ g_kv
        if not ctx.rotary:  # fq and fk feed both: their two gradients summed in place
            return g_a.addcmul_(g_den, kmean), g_b.add_(g_kmean), g_v, None, None, None, None
        return g_den * kmean, g_kmean.expand(ctx.fk_shape), g_v, None, g_a, g_b, None


def kernel_matrix(fq: torch.Tensor, fk: torch.Tensor, eps: float) -> torch.Tensor:
    """The N x N matrix `kernel_attention` applies: the same normalizer, written out."""
    scores = fq @ fk.transpose(-2, -1) / fk.shape[-2]
    return scores / (scores.sum(dim=-1, keepdim=True) + eps)


class LinearAttention(nn.Module):
    """Base of every operator: qkv, q/k norms and proj named as in timm, a core in at least fp32,
    the implicit matrices.

    A kernelized operator defines `features` (and optionally `mix`/`mix_matrices` for an extra
    token mixing such as a depthwise convolution). Operators of another form override `attend`
    and `implicit` together; `gate` adds an output gate computed from the block input.
    `grid_size` (patch rows, cols) and `num_prefix_tokens` (class/register tokens, which come
    first as in timm) let spatial terms act on the patch grid only.
    """

    variant = "base"
    eps = 1e-6
    positional = False  # True when token positions matter (no permutation equivariance)
    # False when the implicit matrix is not non-negative with rows summing to at most one
    # (rotary terms in the numerator, or no normalizer at all).
    row_normalized = True

    # No attn_drop: a linear operator forms no attention matrix to drop entries of.
    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = False, proj_bias: bool = True,
                 proj_drop: float = 0.0,
                 grid_size: tuple[int, int] | None = None, num_prefix_tokens: int = 1,
                 qk_norm: bool = False, norm_layer: type[nn.Module] | None = None):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim {dim} is not divisible by num_heads {num_heads}")
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.grid_size = tuple(grid_size) if grid_size is not None else None
        self.num_prefix_tokens = num_prefix_tokens
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        # timm's q/k norms (qk_norm=True), by timm's names and on the per-head q and k before any
        # kernel, so that a teacher's norms copy over and act as they did under softmax.
        # `norm_layer` defaults to the ViT's own (timm's LayerNorm, eps 1e-6); swap_attention
        # puts fresh copies of the teacher's modules here instead, whatever their class and eps.
        norm_layer = norm_layer or LayerNorm
        self.q_norm = norm_layer(self.head_dim) if qk_norm else nn.Identity()
        self.k_norm = norm_layer(self.head_dim) if qk_norm else nn.Identity()
        self.proj = nn.Linear(dim, dim, bias=proj_bias)
        self.proj_drop = nn.Dropout(proj_drop)

    # -- what kernelized subclasses define ----------------------------------------------------
    def features(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Map q, k (B, H, N, D) to non-negative features (B, H, N, F)."""
        raise NotImplementedError

    def mix(self, v: torch.Tensor) -> torch.Tensor | None:
        """Extra token mixing added to the attention output, (B, H, N, D); None for none."""
        return None

    def mix_matrices(self, n: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """`mix` written as matrices plus bias, in ImplicitAttention's shapes."""
        return None, None

    def gate(self, x: torch.Tensor) -> torch.Tensor | None:
        """An elementwise (B, N, C) factor on the output before `proj`; None for none."""
        return None

    # -- the core: override both together for a non-kernelized operator ------------------------
    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """(B, H, N, D) output from q, k, v in the compute dtype (fp32 or float64), in time linear in N."""
        fq, fk = self.features(q, k)
        out = kernel_attention(fq, fk, v, self.eps)
        extra = self.mix(v)
        return out if extra is None else out + extra

    def implicit(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> ImplicitAttention:
        """What `attend` applies, as matrices."""
        fq, fk = self.features(q, k)
        mix, bias = self.mix_matrices(q.shape[-2])
        return ImplicitAttention(attn=kernel_matrix(fq, fk, self.eps), v=v,
                                 mix=None if mix is None else mix.to(v.dtype),
                                 bias=None if bias is None else bias.to(v.dtype))

    # -- shared ------------------------------------------------------------------------------
    def split_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v (B, H, N, D) of input x, q and k normalized as in timm's Attention. forward and
        the implicit matrices both start here, so the q/k norms act in every operator.

        Returned contiguous, each head's (N, D) block in one piece: one copy here instead of one
        in every later product (batched matmuls fold (B, H) into one batch dim only when they are
        adjacent in memory; as views of the projection they are not)."""
        q, k, v = self.qkv_views(x)
        return self.q_norm(q).contiguous(), self.k_norm(k).contiguous(), v.contiguous()

    def qkv_views(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q, k, v (B, H, N, D) as strided views of the qkv projection's (B, N, 3*C) output, before
        the q/k norms (for cores that work in the projection's token-major layout)."""
        b, n, c = x.shape
        return self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)

    def patch_slice(self, n: int) -> slice:
        """The patch tokens of a sequence of length n (prefix tokens come first, as in timm)."""
        if self.grid_size is None:
            raise ValueError(f"attention variant {self.variant!r} needs grid_size (patch rows, cols)")
        gh, gw = self.grid_size
        if n - self.num_prefix_tokens != gh * gw:
            raise ValueError(f"{n} tokens do not match {self.num_prefix_tokens} prefix tokens plus a "
                             f"{gh}x{gw} patch grid")
        return slice(self.num_prefix_tokens, n)

    def forward(self, x: torch.Tensor, attn_mask: torch.Tensor | None = None,
                is_causal: bool = False) -> torch.Tensor:
        q, k, v = self.split_heads(x)
        out = attention_core(self, q, k, v, attn_mask, is_causal)
        g = self.gate(x)
        if g is not None:
            out = out * g.to(out.dtype)
        return self.proj_drop(self.proj(out))

    @torch.no_grad()
    def implicit_attention(self, x: torch.Tensor) -> ImplicitAttention:
        """The matrices this operator applies to V for input x (quadratic: for analysis only)."""
        return self._implicit(x)

    def _implicit(self, x: torch.Tensor) -> ImplicitAttention:
        q, k, v = self.split_heads(x)
        dtype = compute_dtype(v)
        imp = self.implicit(q.to(dtype), k.to(dtype), v.to(dtype))
        g = self.gate(x)
        imp.gate = g.to(dtype) if g is not None else None
        return imp

    def attention_maps(self, x: torch.Tensor, grad: bool = False) -> torch.Tensor:
        """Row-stochastic per-head maps (B, H, N, N) (see ImplicitAttention.maps)."""
        if grad:
            return self._implicit(x).maps()
        return self.implicit_attention(x).maps()


def softmax_attention_maps(attn: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T * scale) of a timm `Attention` module on its input x, (B, H, N, N)."""
    b, n, _ = x.shape
    qkv = attn.qkv(x).reshape(b, n, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    q, k, _ = qkv.unbind(0)
    q, k = attn.q_norm(q), attn.k_norm(k)
    dtype = compute_dtype(q)
    return F.softmax((q.to(dtype) * attn.scale) @ k.to(dtype).transpose(-2, -1), dim=-1)


@contextlib.contextmanager
def ieee_fp32():
    """CUDA's float32 matmuls and convolutions in IEEE fp32 while inside, not TF32 (which
    linvit.device turns on for the whole process on CUDA, and cuDNN's convolutions default to); the
    settings before are restored on the way out, exception or not. The CPU's kernels are untouched."""
    matmul, conv = torch.backends.cuda.matmul, torch.backends.cudnn.conv
    before = matmul.fp32_precision, conv.fp32_precision
    matmul.fp32_precision = conv.fp32_precision = "ieee"
    try:
        yield
    finally:
        matmul.fp32_precision, conv.fp32_precision = before


def attention_maps(attn: nn.Module, x: torch.Tensor, grad: bool = False) -> torch.Tensor:
    """Per-head N x N attention of any block attention (softmax or linear) on its input x, computed
    with autocast off from x in at least fp32, the maps in at least fp32 (float64 stays float64),
    and on CUDA with IEEE fp32 products, not TF32 (`ieee_fp32`).

    Why here, for every caller (the map losses, evaluation, figures): under a bf16/fp16 autocast the
    N x N products (softmax's logits, a linear operator's feature products and row sums) would round
    to 8 significant bits, and in fp16 overflow or underflow (performer's smallest feature products
    fall below fp16's range: 0/0); TF32 would round their inputs to 11 bits. With `grad`, gradients
    flow to the module through the casts."""
    f = lambda t: t.to(torch.promote_types(t.dtype, torch.float32))  # noqa: E731
    with torch.autocast(device_type=x.device.type, enabled=False), ieee_fp32():
        if isinstance(attn, LinearAttention):
            return f(attn.attention_maps(f(x), grad=grad))
        with torch.set_grad_enabled(grad and torch.is_grad_enabled()):
            return f(softmax_attention_maps(attn, f(x)))
