"""Attention operators, each registered by name (see base.register_attention).

Every module in this package is imported here, so adding an operator is adding one file.
"""

import importlib
import pkgutil

from .base import (ATTENTION, ImplicitAttention, LinearAttention, attention_class, attention_maps,
                   available_variants, kernel_attention, kernel_matrix, merge_heads, register_attention,
                   softmax_attention_maps, unregister_attention)

for _module in pkgutil.iter_modules(__path__):
    if _module.name != "base":
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["ATTENTION", "ImplicitAttention", "LinearAttention", "attention_class", "attention_maps",
           "available_variants", "kernel_attention", "kernel_matrix", "merge_heads", "register_attention",
           "softmax_attention_maps", "unregister_attention"]
