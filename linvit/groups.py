"""Parameter groups: every parameter of a ViT belongs to exactly one, decided from its name.

The names are timm's (timm.models.vision_transformer.VisionTransformer with its `Block`s, DeiT
included), so any such ViT -- class, register or distillation tokens, q/k norms, layer scale, pre-
norm, fc_norm, MAP pooling, SwiGLU MLPs -- is covered, teacher and student alike.

| group      | what (timm names)                                                                   |
| embed      | patch embedding (`patch_embed.*`, its norm included), `cls_token`, `reg_token`, `dist_token`, `pos_embed` |
| attn       | per block: `attn.qkv`, `attn.q_norm`, `attn.k_norm`, `attn.proj` (a softmax counterpart), and the attention branch's layer scale `ls1` |
| attn_extra | per block: every other `attn.*` parameter, operator-specific with no softmax counterpart: never copied |
| mlp        | per block: `mlp.*` (Mlp, SwiGLU, GluMlp, their norm) and the MLP branch's layer scale `ls2` |
| norm       | the blocks' `norm1`/`norm2`, and `norm_pre` (pre_norm), `norm` and `fc_norm` (final norms) |
| head       | the classifier: `head`, DeiT's `head_dist`, and the attention-pool head `attn_pool.*` (global_pool "map"/"prr") |

Blocks of another shape (ParallelScalingBlock, ParallelThingsBlock) are not covered: their fused
projections do not split into these groups, and swap_attention refuses them.

Plain names and regular expressions only, so the workflow can check a config's groups without torch.
"""

from __future__ import annotations

import re

GROUPS = ("embed", "attn", "attn_extra", "mlp", "norm", "head")

# Order matters: the first pattern that matches a parameter name decides its group.
_RULES = [
    ("embed", r"^(patch_embed\.|cls_token$|reg_token$|dist_token$|pos_embed$)"),
    # Attention parameters with a softmax counterpart, by timm's names.
    ("attn", r"^blocks\.\d+\.attn\.(qkv|proj|q_norm|k_norm)\.(weight|bias)$"),
    ("attn_extra", r"^blocks\.\d+\.attn\."),
    ("attn", r"^blocks\.\d+\.ls1\."),   # layer scale of the attention branch
    ("mlp", r"^blocks\.\d+\.(mlp|ls2)\."),
    ("norm", r"^(blocks\.\d+\.norm\d|norm_pre|norm|fc_norm)\.(weight|bias)$"),
    # attn_pool is top level (never under blocks.N.attn): a pooling head, trained with the classifier.
    ("head", r"^(head|head_dist|attn_pool)\."),
]


def parameter_group(name: str) -> str:
    for group, pattern in _RULES:
        if re.search(pattern, name):
            return group
    raise ValueError(f"parameter {name!r} belongs to no group of {GROUPS}")


def check_groups(groups) -> list[str]:
    unknown = [g for g in groups if g not in GROUPS]
    if unknown:
        raise ValueError(f"unknown parameter group(s) {unknown}; known groups: {', '.join(GROUPS)}")
    return list(groups)
