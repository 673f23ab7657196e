"""ViT construction on timm, swapping softmax attention for a linear operator, and the timm models.

`import linvit.models` registers `linvit_<size>_<variant>` with timm for every size in
`linvit.sizes` and every registered operator (also ones registered later, and unregistered with
`unregister_attention`), the way timm registers its own: a named entry point per model, default
configs from `generate_default_cfgs`, models built by `build_model_with_cfg`. So
`timm.create_model`, `pretrained_cfg`, `resolve_data_config`, `features_only=True`,
`forward_intermediates` and `pretrained=True, pretrained_cfg_overlay=dict(file=...)` work as for
timm's own ViTs. There are no published weights.

Options: a timm VisionTransformer keyword (drop_path_rate, global_pool, class_token, img_size,
dynamic_img_size, ...) goes to the VisionTransformer; a keyword of the operator class's `__init__`
(agent_num for agent, activation for hedgehog, rope for rala, ...) goes to every block's operator;
anything else is a ValueError naming it and the model.

TorchScript is out of scope (deprecated in this torch); torch.fx tracing and torch.compile are not.
"""

from __future__ import annotations

import copy
import inspect
import sys

import torch
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.layers import Attention
from timm.models import _registry as timm_registry
from timm.models.vision_transformer import VisionTransformer, checkpoint_filter_fn
from torch import nn

from .attention import ATTENTION, LinearAttention, attention_class
from .attention.base import ON_REGISTER, ON_UNREGISTER
from .registry import SOFTMAX
from .sizes import INPUTS, SIZES, size_spec

__all__ = ["build_vit", "swap_attention", "capture_attention", "model_variant", "model_name",
           "operator_options", "TIMM_MODULE"]  # register_model appends each entry point's name

# The module name timm lists the models under: timm.list_models(module="linvit").
TIMM_MODULE = "linvit"

# timm's register_model reads the default configs of an entry point's module from here.
default_cfgs: dict = {}

_VIT_OPTIONS = frozenset(inspect.signature(VisionTransformer.__init__).parameters) - {"self"}
# What swap_attention sets on every operator itself.
_BASE_OPTIONS = frozenset(inspect.signature(LinearAttention.__init__).parameters)


def model_name(size: str, variant: str) -> str:
    return f"linvit_{size}_{variant}"


def operator_options(variant: str) -> tuple[str, ...]:
    """The keyword options of `variant`'s operator (its class's and intermediate bases' __init__)."""
    cls = attention_class(variant)
    names: list[str] = []
    for klass in cls.__mro__:
        if klass is LinearAttention or not issubclass(klass, LinearAttention):
            break
        if "__init__" not in vars(klass):
            continue
        for p in inspect.signature(klass.__init__).parameters.values():
            if (p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL) and p.name not in _BASE_OPTIONS
                    and p.name not in names):
                names.append(p.name)
    return tuple(names)


def _build(name: str, variant: str, /, **kwargs) -> VisionTransformer:
    """A VisionTransformer from timm's options, then `variant`'s operators from the operator's options."""
    op_names = operator_options(variant)  # first: an unknown variant is its own error
    vit_kwargs, op_kwargs, unknown = {}, {}, []
    for key, value in kwargs.items():
        if key in _VIT_OPTIONS:  # timm's options win a name clash (none today)
            vit_kwargs[key] = value
        elif key in op_names:
            op_kwargs[key] = value
        else:
            unknown.append(key)
    if unknown:
        takes = f"{variant!r} operator options: {', '.join(op_names)}" if op_names else \
            f"the {variant!r} operator takes no options"
        raise ValueError(f"{name}: unknown option(s) {', '.join(map(repr, unknown))}: neither a timm "
                         f"VisionTransformer option nor an operator option ({takes})")
    model = VisionTransformer(**vit_kwargs)
    if variant != SOFTMAX:
        try:
            swap_attention(model, variant, **op_kwargs)
        except ValueError as err:
            raise ValueError(f"{name}: {err}") from None
    return model


def build_vit(size: str, *, num_classes: int, img_size: int | tuple[int, int], in_chans: int,
              variant: str = SOFTMAX, **variant_kwargs) -> VisionTransformer:
    """A timm VisionTransformer of a registered size; `variant` other than softmax swaps attention.

    `variant_kwargs` are operator options or timm VisionTransformer options (see the module doc).
    """
    return _build(model_name(size, variant), variant, img_size=img_size, in_chans=in_chans,
                  num_classes=num_classes, **{**size_spec(size), **variant_kwargs})


def _unsupported(old: nn.Module, dim: int) -> str | None:
    """What of a block's attention module a linear operator cannot carry over (None: nothing)."""
    if isinstance(old, LinearAttention):  # swapping operators: nothing of timm's to lose
        return None
    if not isinstance(old, Attention):  # DiffAttention, AttentionRope, ...: other parameters and forms
        return f"a {type(old).__name__} (only timm's Attention is swapped)"
    drop = getattr(old, "attn_drop", None)
    if isinstance(drop, nn.Dropout) and drop.p > 0:
        return (f"attention dropout (attn_drop_rate={drop.p}): a linear operator forms no attention "
                f"matrix to drop; use drop_path_rate or proj_drop_rate")
    if not isinstance(getattr(old, "norm", None), (nn.Identity, type(None))):
        return "scale_attn_norm=True: the operators have no norm layer"
    if getattr(old, "gate", None) is not None:
        return "gated=True: the operators have no gate layer"
    if old.qkv.out_features != 3 * dim or old.proj.out_features != dim:
        return "attn_head_dim or dim_out: the operators keep the block width in q, k, v and output"
    return None


def _fresh(module: nn.Module) -> nn.Module:
    """A copy of `module` (its class, shape, eps, ...) with its parameters initialized anew."""
    module = copy.deepcopy(module)
    for m in module.modules():
        if hasattr(m, "reset_parameters"):
            m.reset_parameters()
    return module


def swap_attention(model: VisionTransformer, variant: str, **variant_kwargs) -> VisionTransformer:
    """Replace every block's attention with a fresh operator of `variant` (in place).

    The operator follows the attention it replaces: width, heads, qkv/proj biases, projection
    dropout and q/k norms (fresh modules of the same class and eps, by timm's names). What it
    cannot follow (attention dropout, scale_attn_norm, gated attention, other attention classes
    or blocks without one `attn`) is refused before any block changes.

    The operator is freshly initialized; copying weights is transfer.py's job. A model built with
    `dynamic_img_size` has no fixed patch grid, so operators get none: those that need one
    (focused, polarity, agent, cosformer, rala, mila) refuse, rather than run on a wrong grid.
    """
    cls = attention_class(variant)
    dynamic = getattr(model, "dynamic_img_size", False)
    grid = None if dynamic else tuple(model.patch_embed.grid_size)
    dim = model.embed_dim
    for block in model.blocks:
        old = getattr(block, "attn", None)
        problem = f"a {type(block).__name__} (no single `attn` per block)" if old is None else \
            _unsupported(old, dim)
        if problem:
            raise ValueError(f"attention variant {variant!r} cannot take {problem}")
    for block in model.blocks:
        old = block.attn
        drop = getattr(old, "proj_drop", None)
        try:
            new = cls(dim, old.num_heads, qkv_bias=old.qkv.bias is not None,
                      proj_bias=old.proj.bias is not None, grid_size=grid,
                      num_prefix_tokens=model.num_prefix_tokens,
                      proj_drop=drop.p if isinstance(drop, nn.Dropout) else 0.0, **variant_kwargs)
        except ValueError as err:
            if dynamic and "grid_size" in str(err):
                raise ValueError(f"attention variant {variant!r} works on a fixed patch grid and cannot "
                                 f"run with dynamic_img_size=True; build it for one img_size") from None
            raise
        except TypeError as err:
            if "unexpected keyword argument" not in str(err):
                raise
            raise ValueError(f"attention variant {variant!r} does not take that option: {err}") from None
        # timm's q/k norms as they are configured in the replaced attention (Identity when none).
        new.q_norm, new.k_norm = _fresh(old.q_norm), _fresh(old.k_norm)
        # Same device and dtype as the attention it replaces (a model built with device=/dtype=).
        block.attn = new.to(device=old.qkv.weight.device, dtype=old.qkv.weight.dtype)
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




# -- timm entry points ------------------------------------------------------------------------

def _cfg(size: str, variant: str) -> dict:
    inputs = INPUTS[size]
    img = inputs["img_size"]
    h, w = (img, img) if isinstance(img, int) else img
    return dict(
        url="", num_classes=inputs["num_classes"], input_size=(inputs["in_chans"], h, w), pool_size=None,
        crop_pct=inputs["crop_pct"], interpolation=inputs["interpolation"], fixed_input_size=True,
        mean=tuple(inputs["mean"]), std=tuple(inputs["std"]),
        first_conv="patch_embed.proj", classifier="head",
        notes=(f"ViT-{size} with {variant!r} attention, built by linvit",
               "no published weights: pretrained=True needs pretrained_cfg_overlay=dict(file=...)"),
    )


def _create(name: str, size: str, variant: str, pretrained: bool, /, **kwargs) -> VisionTransformer:
    out_indices = kwargs.pop("out_indices", 3)  # as timm's vision_transformer: the last 3 blocks
    strict = kwargs.pop("pretrained_strict", True)
    return build_model_with_cfg(
        lambda **kw: _build(name, variant, **kw), name, pretrained,
        pretrained_filter_fn=checkpoint_filter_fn,  # timm's ViT filter: resamples pos_embed, patch_embed
        pretrained_strict=strict,
        feature_cfg=dict(out_indices=out_indices, feature_cls="getter"),
        **{**size_spec(size), **kwargs},
    )


def _entrypoint(size: str, variant: str):
    """A named function per model (size and variant bound here, not closed over a loop variable)."""
    name = model_name(size, variant)

    def entrypoint(pretrained: bool = False, **kwargs) -> VisionTransformer:
        return _create(name, size, variant, pretrained, **kwargs)

    entrypoint.__name__ = entrypoint.__qualname__ = name
    entrypoint.__module__ = __name__
    entrypoint.__doc__ = f"ViT-{size} ({', '.join(f'{k}={v}' for k, v in SIZES[size].items())}) " \
                         f"with {variant!r} attention; no published weights."
    return entrypoint


_REGISTERED: dict[str, list[str]] = {}  # variant -> its timm model names


def _register_timm(variant: str) -> None:
    """`timm.create_model("linvit_<size>_<variant>")` for every size, like timm's own entries."""
    names = [model_name(size, variant) for size in SIZES]
    default_cfgs.update(generate_default_cfgs({model_name(s, variant): _cfg(s, variant) for s in SIZES}))
    module = sys.modules[__name__]
    for size, name in zip(SIZES, names):
        fn = _entrypoint(size, variant)
        setattr(module, name, fn)
        register_model(fn)
        # register_model files a model under the last part of its module's name ("models", which
        # says nothing); list ours under "linvit" instead.
        short = __name__.rsplit(".", 1)[-1]
        timm_registry._module_to_models[short].discard(name)
        if not timm_registry._module_to_models[short]:
            del timm_registry._module_to_models[short]
        timm_registry._model_to_module[name] = TIMM_MODULE
        timm_registry._module_to_models[TIMM_MODULE].add(name)
    _REGISTERED[variant] = names


def _forget_timm(name: str) -> None:
    """Remove a model from timm's registry: every entry register_model made for it."""
    r = timm_registry
    r._model_entrypoints.pop(name, None)
    module = r._model_to_module.pop(name, None)
    if module is not None and module in r._module_to_models:
        r._module_to_models[module].discard(name)
        if not r._module_to_models[module]:
            del r._module_to_models[module]
    for tagged in r._model_with_tags.pop(name, []) + [name]:
        r._model_pretrained_cfgs.pop(tagged, None)
        r._model_has_pretrained.discard(tagged)
    r._model_default_cfgs.pop(name, None)
    r._deprecated_models.pop(name, None)


def _unregister_timm(variant: str) -> None:
    module = sys.modules[__name__]
    for name in _REGISTERED.pop(variant, []):
        _forget_timm(name)
        default_cfgs.pop(name, None)
        if name in __all__:
            __all__.remove(name)
        if hasattr(module, name):
            delattr(module, name)


for _variant in list(ATTENTION):
    _register_timm(_variant)
ON_REGISTER.append(_register_timm)
ON_UNREGISTER.append(_unregister_timm)
