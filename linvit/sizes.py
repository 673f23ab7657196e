"""Model sizes: ViT shapes by name, and the input each is built for when nothing says otherwise.

Plain data, so the workflow can check a config's sizes without importing torch. Adding a size is
one entry here; `linvit.models` builds it on timm's VisionTransformer and registers
`linvit_<size>_<variant>` with timm.
"""

from __future__ import annotations

# Shapes only: for a grid run, image size and channels come from the dataset's manifest.
SIZES: dict[str, dict] = {
    # nano: the size axis a 2-core CPU can afford beside micro (workflow/config/c4.yaml): half micro's width
    # and depth, so a teacher per seed and every role stay cheap
    "nano": dict(patch_size=4, embed_dim=32, depth=2, num_heads=2),            # 28x28 input
    "micro": dict(patch_size=4, embed_dim=64, depth=4, num_heads=4),          # 28x28 input
    "mini": dict(patch_size=4, embed_dim=128, depth=6, num_heads=4),          # 28x28 input
    "deit_tiny": dict(patch_size=16, embed_dim=192, depth=12, num_heads=3),   # 224x224 input
    "deit_small": dict(patch_size=16, embed_dim=384, depth=12, num_heads=6),
    "deit_base": dict(patch_size=16, embed_dim=768, depth=12, num_heads=12),
}

# The input a size's timm entry point is built for (image size, channels, classes, normalization,
# and the eval transform timm's resolve_data_config reads: crop_pct, interpolation).
# micro and mini: Fashion-MNIST (the default grid's teacher dataset) and its training-set statistics,
# used whole (no center crop). The DeiT sizes: ImageNet with DeiT's eval transform.
_GRAY28 = dict(img_size=28, in_chans=1, num_classes=10, mean=(0.2860,), std=(0.3530,),
               crop_pct=1.0, interpolation="bilinear")
_IMAGENET = dict(img_size=224, in_chans=3, num_classes=1000,
                 mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225),
                 crop_pct=0.875, interpolation="bicubic")
INPUTS: dict[str, dict] = {"nano": _GRAY28, "micro": _GRAY28, "mini": _GRAY28, "deit_tiny": _IMAGENET,
                           "deit_small": _IMAGENET, "deit_base": _IMAGENET}


def size_spec(size: str) -> dict:
    try:
        return SIZES[size]
    except KeyError:
        raise ValueError(f"unknown model size {size!r}; known sizes: {', '.join(SIZES)}") from None


# Resources by size: a job on a model of a larger size gets its rule's `resources:` (set for micro) times
# these factors (workflow/rules/common.smk's resource_value); `linvit status` scales a job's time from
# another size's by `runtime`. A config overrides them per size with `resources.scale`.
SIZE_SCALE: dict[str, dict[str, float]] = {
    "nano": {"threads": 1, "mem_mb": 1, "runtime": 1},
    "micro": {"threads": 1, "mem_mb": 1, "runtime": 1},
    "mini": {"threads": 2, "mem_mb": 1.5, "runtime": 4},
    "deit_tiny": {"threads": 4, "mem_mb": 4, "runtime": 16},
    "deit_small": {"threads": 8, "mem_mb": 6, "runtime": 48},
    "deit_base": {"threads": 8, "mem_mb": 12, "runtime": 160},
}


def size_factor(config: dict, size: str, key: str) -> float:
    """How much more of `key` a job on a model of `size` needs than one on micro (config `resources.scale`
    over SIZE_SCALE)."""
    scale = {**SIZE_SCALE.get(size, {}), **(config.get("resources") or {}).get("scale", {}).get(size, {})}
    return scale.get(key, 1)
