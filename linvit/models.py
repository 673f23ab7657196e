"""Model sizes, ViT construction on timm, and swapping softmax attention for a linear operator."""

from __future__ import annotations

import torch
from timm.models import register_model
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from .attention import ATTENTION, attention_class
from .attention.base import ON_REGISTER
from .registry import SOFTMAX
from .sizes import INPUTS, SIZES, size_spec

def build_vit(size: str, *, num_classes: int, img_size: int | tuple[int, int], in_chans: int,
              variant: str = SOFTMAX, **variant_kwargs) -> VisionTransformer:
    """A timm VisionTransformer of a registered size; `variant` other than softmax swaps attention."""
    model = VisionTransformer(img_size=img_size, in_chans=in_chans, num_classes=num_classes,
                              **size_spec(size))
    if variant != SOFTMAX:
        swap_attention(model, variant, **variant_kwargs)
    return model


def swap_attention(model: VisionTransformer, variant: str, **variant_kwargs) -> VisionTransformer:
    """Replace every block's attention with a fresh operator of `variant` (in place).

    The operator is freshly initialized; copying weights is transfer.py's job.
    """
    cls = attention_class(variant)
    grid = tuple(model.patch_embed.grid_size)
    for block in model.blocks:
        old = block.attn
        dim = old.qkv.in_features
        block.attn = cls(dim, old.num_heads, qkv_bias=old.qkv.bias is not None,
                         proj_bias=old.proj.bias is not None, grid_size=grid,
                         num_prefix_tokens=model.num_prefix_tokens, **variant_kwargs)
    # qkv and proj start the way timm initializes a ViT's linear layers; operator-specific
    # parameters keep the operator's own initialization (identity maps, zero convs, open gates).
    for block in model.blocks:
        for m in (block.attn.qkv, block.attn.proj):
            nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
    return model


def capture_attention(model: nn.Module, x: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(input, output) of every block's attention while the model runs on images x (no gradients)."""
    seen, hooks = [], []
    for block in model.blocks:
        hooks.append(block.attn.register_forward_hook(
            lambda m, args, out: seen.append((args[0].detach(), out.detach()))))
    try:
        with torch.no_grad():
            model(x)
    finally:
        for h in hooks:
            h.remove()
    return seen


def model_variant(model: nn.Module) -> str:
    """The attention variant a ViT currently runs ('softmax' for timm's own attention)."""
    return getattr(model.blocks[0].attn, "variant", SOFTMAX)




def _register_timm(variant: str) -> None:
    """`timm.create_model("linvit_<size>_<variant>")` for every size, like timm's own entries."""
    for size in SIZES:
        name = f"linvit_{size}_{variant}"

        def create(pretrained: bool = False, *, _size=size, _variant=variant, **kwargs) -> VisionTransformer:
            if pretrained:
                raise ValueError(f"{name}: no pretrained weights; load a checkpoint with load_state_dict")
            for key in ("pretrained_cfg", "pretrained_cfg_overlay", "cache_dir"):  # timm's own
                kwargs.pop(key, None)
            args = {**{k: INPUTS[_size][k] for k in ('img_size', 'in_chans', 'num_classes')}, **kwargs}
            return build_vit(_size, variant=_variant, **args)

        create.__name__ = name
        create.__qualname__ = name
        create.__module__ = __name__
        register_model(create)


for _variant in list(ATTENTION):
    _register_timm(_variant)
ON_REGISTER.append(_register_timm)
