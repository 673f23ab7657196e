"""Parameter groups cover every parameter once; copying copies exactly the chosen groups."""

import pytest
import torch

from linvit.attention import available_variants
from linvit.models import build_vit
from linvit.transfer import GROUPS, copy_groups, group_parameters, parameter_group

ALL_VARIANTS = ["softmax", *available_variants()]


def vit(variant, seed=0, **kw):
    torch.manual_seed(seed)
    return build_vit("micro", num_classes=10, img_size=28, in_chans=1, variant=variant, **kw)


@pytest.mark.parametrize("variant", ALL_VARIANTS)
def test_every_parameter_in_exactly_one_group(variant):
    model = vit(variant)
    groups = group_parameters(model)
    names = [n for ps in groups.values() for n, _ in ps]
    assert sorted(names) == sorted(n for n, _ in model.named_parameters())
    assert len(names) == len(set(names))
    for g in ("embed", "attn", "mlp", "norm", "head"):
        assert groups[g], f"group {g} is empty for {variant}"
    # Linear operators keep timm's names for what has a softmax counterpart.
    assert {n.split(".", 3)[3] for n, _ in groups["attn"]} == {"qkv.weight", "qkv.bias", "proj.weight", "proj.bias"}


def test_operator_specific_parameters_are_attn_extra():
    names = [n for n, _ in group_parameters(vit("focused"))["attn_extra"]]
    assert any(n.endswith("dwc.weight") for n in names) and any(n.endswith(".scale") for n in names)


def test_unknown_parameter_name_is_an_error():
    with pytest.raises(ValueError, match="belongs to no group"):
        parameter_group("blocks.0.mystery.weight")


@pytest.mark.parametrize("variant", available_variants())
@pytest.mark.parametrize("groups", [["mlp"], ["attn"], ["embed", "mlp", "norm", "head"], ["embed", "attn", "mlp", "norm", "head"]])
def test_copied_tensors_equal_the_teacher_and_the_others_do_not(variant, groups):
    teacher, student = vit("softmax", seed=1), vit(variant, seed=2)
    before = {n: p.detach().clone() for n, p in student.named_parameters()}
    counts = copy_groups(student, teacher, groups)
    source = dict(teacher.named_parameters())
    for name, p in student.named_parameters():
        g = parameter_group(name)
        if g in groups:
            assert torch.equal(p, source[name]), name
        else:
            assert torch.equal(p, before[name]), name
            # Randomly initialized tensors differ between teacher and student (norms start at 1, biases at 0).
            if name in source and source[name].shape == p.shape and p.numel() > 1 and p.std() > 0:
                assert not torch.equal(p, source[name]), f"{name} equals the teacher without being copied"
    sizes = {g: sum(p.numel() for _, p in ps) for g, ps in group_parameters(student).items()}
    assert counts == {g: (sizes[g] if g in groups else 0) for g in GROUPS}


def test_head_skipped_for_a_different_label_space():
    teacher, student = vit("softmax", seed=1), vit("elu", seed=2)
    counts = copy_groups(student, teacher, ["mlp", "head"], copy_head=False)
    assert counts["head"] == 0 and counts["mlp"] > 0
    assert not torch.equal(student.head.weight, teacher.head.weight)


def test_mismatched_teacher_is_an_error_naming_the_tensor():
    teacher = build_vit("mini", num_classes=10, img_size=28, in_chans=1)
    with pytest.raises(ValueError, match=r"teacher does not match student: 'blocks.0.mlp.fc1.weight'"):
        copy_groups(vit("elu"), teacher, ["mlp"])


def test_unknown_group_is_an_error():
    with pytest.raises(ValueError, match="unknown parameter group"):
        copy_groups(vit("elu"), vit("softmax"), ["mlps"])
