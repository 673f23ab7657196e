"""Softmax attention (Vaswani et al. 2017; the ViT/DeiT operator) as a registered variant.

The reference every linear operator is compared with, run through the same code path (the same
`qkv`/`proj` names as timm's Attention, so weights load either way). The forward uses PyTorch's
fused scaled_dot_product_attention; it is quadratic in tokens.
"""

import torch
import torch.nn.functional as F

from .base import ImplicitAttention, LinearAttention, register_attention


@register_attention("softmax")
class SoftmaxAttention(LinearAttention):
    def attend(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v)

    def implicit(self, q, k, v):
        attn = torch.softmax((q * self.head_dim ** -0.5) @ k.transpose(-2, -1), dim=-1)
        return ImplicitAttention(attn=attn, v=v)
