"""Linear attention operators, each registered by name (see base.register_attention)."""

from . import elu, focused, relu  # noqa: F401  (importing registers the operators)
from .base import (ATTENTION, ImplicitAttention, LinearAttention, attention_class, attention_maps,
                   available_variants, register_attention, softmax_attention_maps)

__all__ = ["ATTENTION", "ImplicitAttention", "LinearAttention", "attention_class", "attention_maps",
           "available_variants", "register_attention", "softmax_attention_maps"]
