"""The linear attention base class, the registry of operators, and softmax attention maps.

Every operator keeps timm's parameter names (`qkv`, `proj`) so that weights with a softmax
counterpart line up by name, and computes the non-causal kernelized form

    out_i = sum_j phi(q_i) . phi(k_j) v_j / sum_j phi(q_i) . phi(k_j)

in O(N) by contracting phi(K)^T V first. The contractions run in fp32 whatever the autocast
dtype, because the normalizer is a sum over all tokens and overflows fp16 on large activations.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

ATTENTION: dict[str, type["LinearAttention"]] = {}


def register_attention(name: str):
    """Class decorator: make an operator selectable by `name` in configs and on the command line."""

    def wrap(cls):
        if name in ATTENTION:
            raise ValueError(f"attention variant {name!r} is registered twice")
        cls.variant = name
        ATTENTION[name] = cls
        return cls

    return wrap


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
    """What an operator applies to V, written out as matrices.

    attn:  (B, H, N, N) per-head token-mixing matrix (rows of a normalized operator sum to 1).
    v:     (B, H, N, D) the values it is applied to.
    mix:   optional (D, N, N) per-channel token mixing added to the output (a depthwise
           convolution on the patch grid, for example), shared by all heads.
    bias:  optional (D, N) constant added with `mix` (the convolution's bias, on patch tokens).
    """

    attn: torch.Tensor
    v: torch.Tensor
    mix: torch.Tensor | None = None
    bias: torch.Tensor | None = None

    def output(self) -> torch.Tensor:
        """The operator's output before the output projection, as (B, N, H*D)."""
        out = self.attn @ self.v
        if self.mix is not None:
            out = out + torch.einsum("dnm,bhmd->bhnd", self.mix, self.v)
        if self.bias is not None:
            out = out + self.bias.t()
        b, h, n, d = out.shape
        return out.transpose(1, 2).reshape(b, n, h * d)


class LinearAttention(nn.Module):
    """Base of every linear operator: subclasses define `features` and optionally `mix`.

    `grid_size` (patch rows, cols) and `num_prefix_tokens` (class and register tokens) let
    operators with spatial terms act on the patch grid only.
    """

    variant = "base"
    eps = 1e-6

    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = False, proj_bias: bool = True,
                 attn_drop: float = 0.0, proj_drop: float = 0.0,
                 grid_size: tuple[int, int] | None = None, num_prefix_tokens: int = 1):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim {dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.grid_size = tuple(grid_size) if grid_size is not None else None
        self.num_prefix_tokens = num_prefix_tokens
        self.qkv = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim, bias=proj_bias)
        self.proj_drop = nn.Dropout(proj_drop)

    # -- what subclasses define ---------------------------------------------------------------
    def features(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Map q, k (B, H, N, D) to non-negative features (B, H, N, F)."""
        raise NotImplementedError

    def mix(self, v: torch.Tensor) -> torch.Tensor | None:
        """Extra token mixing added to the attention output, (B, H, N, D); None for none."""
        return None

    def mix_matrices(self, n: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """`mix` written as (D, N, N) matrices plus a (D, N) bias, for `implicit_attention`."""
        return None, None

    # -- the shared computation ---------------------------------------------------------------
    def split_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        b, n, c = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        return qkv.unbind(0)

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
        if attn_mask is not None or is_causal:
            raise ValueError(f"attention variant {self.variant!r} is non-causal and takes no mask")
        b, n, c = x.shape
        q, k, v = self.split_heads(x)
        fq, fk = self.features(q, k)
        with torch.autocast(device_type=x.device.type, enabled=False):
            fq, fk, vf = fq.float(), fk.float(), v.float()
            # Means instead of sums keep both contractions O(1) in N, so no overflow at long N.
            kv = torch.einsum("bhnf,bhnd->bhfd", fk, vf) / n
            den = torch.einsum("bhnf,bhf->bhn", fq, fk.mean(dim=2))
            out = torch.einsum("bhnf,bhfd->bhnd", fq, kv) / (den.unsqueeze(-1) + self.eps)
            extra = self.mix(vf)
            if extra is not None:
                out = out + extra
        out = out.to(v.dtype).transpose(1, 2).reshape(b, n, c)
        return self.proj_drop(self.proj(out))

    @torch.no_grad()
    def implicit_attention(self, x: torch.Tensor) -> ImplicitAttention:
        """The N x N matrices this operator applies to V for input x (quadratic: for analysis only)."""
        return self._implicit(x)

    def _implicit(self, x: torch.Tensor) -> ImplicitAttention:
        n = x.shape[1]
        q, k, v = self.split_heads(x)
        fq, fk = (t.float() for t in self.features(q, k))
        scores = fq @ fk.transpose(-2, -1) / n
        attn = scores / (scores.sum(dim=-1, keepdim=True) + self.eps)
        mix, bias = self.mix_matrices(n)
        return ImplicitAttention(attn=attn, v=v.float(), mix=mix, bias=bias)

    def attention_maps(self, x: torch.Tensor, grad: bool = False) -> torch.Tensor:
        """The per-head token-mixing matrix (B, H, N, N); with grad=True, differentiable."""
        if grad:
            return self._implicit(x).attn
        return self.implicit_attention(x).attn


def softmax_attention_maps(attn: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """softmax(q k^T * scale) of a timm `Attention` module on its input x, (B, H, N, N)."""
    b, n, _ = x.shape
    qkv = attn.qkv(x).reshape(b, n, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    q, k, _ = qkv.unbind(0)
    q, k = attn.q_norm(q), attn.k_norm(k)
    return F.softmax((q.float() * attn.scale) @ k.float().transpose(-2, -1), dim=-1)


def attention_maps(attn: nn.Module, x: torch.Tensor, grad: bool = False) -> torch.Tensor:
    """Per-head N x N attention of any block attention (softmax or linear) on its input x."""
    if isinstance(attn, LinearAttention):
        return attn.attention_maps(x, grad=grad)
    with torch.set_grad_enabled(grad and torch.is_grad_enabled()):
        return softmax_attention_maps(attn, x)
