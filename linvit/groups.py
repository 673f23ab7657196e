"""Parameter groups: every parameter of a ViT belongs to exactly one, decided from its name.

| group      | what                                                                          |
| embed      | patch embedding, class/register/distillation tokens, position embedding       |
| attn       | q, k, v (`qkv`), q/k norms and output (`proj`) projections with a softmax counterpart, and the attention branch's layer scale |
| attn_extra | operator-specific parameters with no softmax counterpart: never copied          |
| mlp        | the blocks' MLPs (and the MLP branch's layer scale)                           |
| norm       | the blocks' and the final norms                                                |
| head       | the classifier                                                                 |

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
    ("norm", r"^(blocks\.\d+\.norm\d|norm|fc_norm)\.(weight|bias)$"),
    ("head", r"^head\."),
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
