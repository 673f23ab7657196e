"""Distillation: teacher-forced, only attention parameters train, every registered loss lowers itself."""

import pytest
import torch

from linvit.distill import LOSSES, DistillTask, capture_attention, register_loss
from linvit.models import build_vit
from linvit.transfer import parameter_group


def models(variant="focused"):
    torch.manual_seed(0)
    teacher = build_vit("micro", num_classes=4, img_size=28, in_chans=1)
    student = build_vit("micro", num_classes=4, img_size=28, in_chans=1, variant=variant)
    return teacher, student


@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_only_attention_trains_and_the_loss_falls(loss):
    teacher, student = models()
    x = torch.randn(8, 1, 28, 28)
    task = DistillTask(teacher, student, loss, probe=x)
    before = {n: p.detach().clone() for n, p in student.named_parameters()}
    teacher_before = {n: p.detach().clone() for n, p in teacher.named_parameters()}
    opt = torch.optim.AdamW([p for _, p in task.trainable()], lr=3e-3)
    first = task.loss(x, None).item()
    for _ in range(30):
        opt.zero_grad()
        task.loss(x, None).backward()
        opt.step()
    assert task.loss(x, None).item() < first
    for name, p in student.named_parameters():
        moved = not torch.equal(p, before[name])
        assert moved == (parameter_group(name) in ("attn", "attn_extra") and moved), name
        if parameter_group(name) not in ("attn", "attn_extra"):
            assert not moved, f"{name} changed during distillation"
    assert all(torch.equal(p, teacher_before[n]) for n, p in teacher.named_parameters())


def test_student_blocks_receive_the_teachers_inputs():
    teacher, student = models("elu")
    x = torch.randn(2, 1, 28, 28)
    pairs = capture_attention(teacher, x)
    assert len(pairs) == len(teacher.blocks)
    seen = []
    hooks = [b.attn.register_forward_hook(lambda m, a, o: seen.append(a[0])) for b in student.blocks]
    DistillTask(teacher, student, "mse", probe=x).loss(x, None)
    for h in hooks:
        h.remove()
    for (t_in, _), s_in in zip(pairs, seen):
        assert torch.equal(t_in, s_in)


def test_a_registered_loss_is_selectable_by_name():
    @register_loss("test_l1_output")
    def l1(pair):
        return (pair.student_out - pair.teacher_out).abs().mean()

    try:
        teacher, student = models("relu")
        x = torch.randn(2, 1, 28, 28)
        assert DistillTask(teacher, student, "test_l1_output", probe=x).loss(x, None).item() > 0
    finally:
        del LOSSES["test_l1_output"]


def test_unknown_loss_names_the_known_ones():
    teacher, student = models("elu")
    with pytest.raises(ValueError, match=r"unknown distillation loss 'nope'; known losses: .*mse"):
        DistillTask(teacher, student, "nope", probe=torch.randn(1, 1, 28, 28))
