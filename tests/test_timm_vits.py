"""Any timm ViT linearizes: the student follows the teacher's architecture, every parameter has a
parameter group, and copy_groups moves every parameter with a softmax counterpart.

timm's own model names (DeiT, DeiT-III, CLIP, SigLIP, AIMv2, DINOv2, ...) at a tiny size, so
that each configuration's distinctive parts (tokens, norms, layer scale, pooling heads, MLPs)
are the real ones timm builds.
"""

import copy
import re

import pytest
import timm
import torch
from timm.models.vision_transformer import ParallelScalingBlock, VisionTransformer

from linvit.attention import LinearAttention
from linvit.groups import parameter_group
from linvit.models import model_variant, swap_attention
from linvit.transfer import copy_groups, group_sizes

# Small enough to build and run in milliseconds; a 4x4 patch grid for the operators that need one.
SMALL = dict(embed_dim=32, depth=2, num_heads=2, img_size=32, patch_size=8)

# id: (timm model name, extra options, parameter names the configuration must have, must lack)
CONFIGS = {
    "deit": ("deit_tiny_patch16_224", {}, ["cls_token", "pos_embed", "head.weight"], []),
    "deit_distilled": ("deit_tiny_distilled_patch16_224", {}, ["dist_token", "head_dist.weight"], []),
    "deit3_layer_scale": ("deit3_small_patch16_224", {}, ["blocks.0.ls1.gamma", "blocks.0.ls2.gamma"], []),
    "avg_fc_norm": ("vit_small_patch16_224", dict(global_pool="avg"), ["fc_norm.weight"], ["norm.weight"]),
    "no_class_token": ("vit_small_patch16_224", dict(class_token=False, no_embed_class=True, global_pool="avg"),
                       ["pos_embed"], ["cls_token"]),
    "reg4_gap": ("vit_base_patch16_reg4_gap_256", {}, ["reg_token"], ["cls_token"]),
    "cls_and_reg_tokens": ("vit_small_patch16_224", dict(reg_tokens=4), ["cls_token", "reg_token"], []),
    "qk_norm": ("vit_small_patch16_224", dict(qk_norm=True),
                ["blocks.0.attn.q_norm.weight", "blocks.0.attn.k_norm.bias"], []),
    "qk_rmsnorm": ("vit_small_patch16_224", dict(qk_norm=True, norm_layer="rmsnorm"),
                   ["blocks.0.attn.q_norm.weight", "blocks.0.attn.k_norm.weight"], ["blocks.0.attn.q_norm.bias"]),
    "clip_pre_norm": ("vit_base_patch16_clip_224", {}, ["norm_pre.weight"], ["patch_embed.proj.bias"]),
    "siglip_map_head": ("vit_base_patch16_siglip_224", {}, ["attn_pool.latent", "attn_pool.kv.weight"], []),
    "prr_head": ("vit_small_patch16_224", dict(global_pool="prr"), [], []),
    "aimv2_swiglu_rmsnorm": ("aimv2_large_patch14_224", {},
                             ["blocks.0.mlp.fc1_g.weight", "patch_embed.norm.weight"],
                             ["blocks.0.attn.qkv.bias", "blocks.0.attn.proj.bias"]),
    "dinov2_swiglu_packed": ("vit_giant_patch14_reg4_dinov2", {}, ["reg_token", "blocks.0.ls1.gamma"], []),
    "no_final_norm": ("vit_base_patch16_radio_v3", {}, ["reg_token"], ["norm.weight", "fc_norm.weight"]),
    "res_post_norm": ("vit_base_patch16_rpn_224", {}, ["blocks.0.norm1.weight"], ["blocks.0.attn.qkv.bias"]),
    "medium_gap_layer_scale": ("vit_medium_patch16_gap_256", {}, ["blocks.0.ls1.gamma"], ["cls_token"]),
}

# The group a telltale name must land in (the first pattern that matches; the head first, since
# an attention-pool head has its own q/kv, norm and mlp).
TELLTALES = [
    (r"^(head|head_dist|attn_pool)\.", "head"),
    (r"^dist_token$|^reg_token$|^cls_token$|^pos_embed$|^patch_embed\.", "embed"),
    (r"\.attn\.(q_norm|k_norm|qkv|proj)\.", "attn"),
    (r"\.ls1\.", "attn"),
    (r"\.ls2\.|\.mlp\.", "mlp"),
    (r"^(fc_norm|norm_pre|norm)\.|\.norm\d\.", "norm"),
]

# Operators to swap in, with options for the 4x4 grid: kernelized ones without and with a grid
# (focused, agent and polarity convolve the patch grid, so they must skip register/class tokens).
VARIANTS = {"elu": {}, "relu": {}, "hydra": {}, "focused": {}, "agent": dict(agent_num=4), "polarity": {}}
PARTS = ["embed", "attn", "mlp", "norm", "head"]


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models gain nothing from threads; on a shared machine a second one only waits."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def teacher(config: str) -> VisionTransformer:
    name, options, _, _ = CONFIGS[config]
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, **{**SMALL, **options}).eval()
    # Perturb every parameter so that a copy is told from a fresh initialization (norm weights
    # start at one, layer scales at a constant).
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def images(model: VisionTransformer) -> torch.Tensor:
    torch.manual_seed(1)
    return torch.randn(2, 3, *model.patch_embed.img_size)


@pytest.mark.parametrize("config", CONFIGS)
def test_every_parameter_has_its_group(config):
    model = teacher(config)
    names = dict(model.named_parameters())
    _, _, has, lacks = CONFIGS[config]
    assert set(has) <= set(names) and not set(lacks) & set(names), "the configuration is not what it says"
    for name in names:
        group = parameter_group(name)  # raises for a name in no group
        for pattern, expected in TELLTALES:
            if re.search(pattern, name):
                assert group == expected, f"{name}: {group}, not {expected}"
                break
        else:
            assert not name.startswith("blocks.") or ".attn." in name, f"{name} is no block part we know"


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("config", CONFIGS)
def test_student_follows_the_teacher_and_copies_every_counterpart(config, variant):
    t = teacher(config)
    student = swap_attention(copy.deepcopy(t), variant, **VARIANTS[variant])
    assert model_variant(student) == variant
    x = images(t)
    with torch.no_grad():
        out = student(x)
    assert out.shape == t(x).shape and torch.isfinite(out).all()

    # The architecture follows the teacher: every teacher parameter, of the same shape, and
    # beyond them only the operator's own (attn_extra).
    t_params, s_params = dict(t.named_parameters()), dict(student.named_parameters())
    shared = {n for n in s_params if parameter_group(n) != "attn_extra"}
    assert shared == set(t_params)
    assert all(s_params[n].shape == t_params[n].shape for n in shared)

    copied = copy_groups(student, t, PARTS)
    sizes = group_sizes(student)
    assert copied == {**sizes, "attn_extra": 0}
    assert sum(copied.values()) == sum(p.numel() for p in t.parameters())
    for n in shared:  # every tensor with a counterpart equals the teacher's, attention included
        assert torch.equal(s_params[n], t_params[n]), n


@pytest.mark.parametrize("config", CONFIGS)
def test_a_softmax_student_with_every_group_copied_is_the_teacher(config):
    """The registered softmax operator through the same path (split_heads with q/k norms, prefix
    tokens, heads): copying every group reproduces the teacher's output, so nothing of a timm ViT
    is lost or misplaced on the way."""
    t = teacher(config)
    student = swap_attention(copy.deepcopy(t), "softmax")
    copy_groups(student, t, PARTS)
    x = images(t)
    with torch.no_grad():
        torch.testing.assert_close(student(x), t(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("config", ["qk_norm", "qk_rmsnorm"])
def test_qk_norms_come_from_the_teacher(config):
    t = teacher(config)
    student = swap_attention(copy.deepcopy(t), "focused")
    for s_block, t_block in zip(student.blocks, t.blocks):
        for attr in ("q_norm", "k_norm"):
            s_norm, t_norm = getattr(s_block.attn, attr), getattr(t_block.attn, attr)
            # The same norm (class, shape, eps), freshly initialized by the swap.
            assert type(s_norm) is type(t_norm) and s_norm.eps == t_norm.eps
            assert s_norm.normalized_shape == t_norm.normalized_shape
            assert not torch.equal(s_norm.weight, t_norm.weight)
    copied = copy_groups(student, t, ["attn"])
    assert copied["attn"] == group_sizes(t)["attn"]
    for name, p in t.named_parameters():
        if re.search(r"\.attn\.(q_norm|k_norm)\.", name):
            assert torch.equal(student.get_parameter(name), p), name


def test_swap_refuses_what_it_cannot_carry_over_before_changing_a_block():
    for options, message in [(dict(scale_attn_norm=True), "scale_attn_norm=True"),
                             (dict(attn_layer="diff"), "a DiffAttention"),
                             (dict(block_fn=ParallelScalingBlock), "a ParallelScalingBlock")]:
        model = timm.create_model("vit_small_patch16_224", pretrained=False, **SMALL, **options)
        with pytest.raises(ValueError, match=f"'elu' cannot take {message}"):
            swap_attention(model, "elu")
        assert not any(isinstance(m, LinearAttention) for m in model.modules())
