"""Distillation task: teacher-forced by default, only attention parameters train, old loss names still work."""

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


@pytest.mark.parametrize("loss", ["mse", "attn_ce", [{"loss": "map_js", "blocks": {"last": 2}}, "feat_cos"]])
def test_only_attention_trains_and_the_loss_falls(loss):
    teacher, student = models()
    x = torch.randn(8, 1, 28, 28)
    task = DistillTask(teacher, student, loss, probe=x)
    before = {n: p.detach().clone() for n, p in student.named_parameters()}
    teacher_before = {n: p.detach().clone() for n, p in teacher.named_parameters()}
    opt = torch.optim.AdamW([p for _, p in task.trainable()], lr=3e-3)
    first = task.loss(x, None).item()
    for _ in range(10):
        opt.zero_grad()
        task.loss(x, None).backward()
        opt.step()
    assert task.loss(x, None).item() < first
    moved = {name for name, p in student.named_parameters() if not torch.equal(p, before[name])}
    assert moved and all(parameter_group(name) in ("attn", "attn_extra") for name in moved), moved
    assert all(torch.equal(p, teacher_before[n]) for n, p in teacher.named_parameters())


def test_student_blocks_receive_the_teachers_inputs():
    teacher, student = models("elu")
    x = torch.randn(2, 1, 28, 28)
    pairs = capture_attention(teacher, x)
    assert len(pairs) == len(teacher.blocks)
    task = DistillTask(teacher, student, "mse", probe=x)
    seen = []
    hooks = [b.attn.register_forward_hook(lambda m, a, o: seen.append(a[0])) for b in student.blocks]
    task.loss(x, None)
    for h in hooks:
        h.remove()
    assert len(seen) == len(pairs)
    for (t_in, _), s_in in zip(pairs, seen):
        assert torch.equal(t_in, s_in)


def test_a_registered_loss_is_selectable_by_name():
    @register_loss("test_l1_output", reads=("out",))
    def l1(views):
        return (views.student_out - views.teacher_out).abs().mean()

    try:
        teacher, student = models("relu")
        x = torch.randn(2, 1, 28, 28)
        assert DistillTask(teacher, student, "test_l1_output", probe=x).loss(x, None).item() > 0
    finally:
        del LOSSES["test_l1_output"]


def test_unknown_loss_names_the_known_ones():
    teacher, student = models("elu")
    with pytest.raises(ValueError, match=r"unknown distillation loss 'nope'; known losses: .*proj_mse"):
        DistillTask(teacher, student, "nope", probe=torch.randn(1, 1, 28, 28))


def test_evaluate_reports_the_objective_its_terms_and_the_blocks():
    teacher, student = models("elu")
    x = torch.randn(2, 1, 28, 28)
    m = DistillTask(teacher, student, "mse", probe=x).evaluate(final=True)
    assert set(m) == {"distill_loss", "distill_terms", "distill_loss_per_block"}
    assert m["distill_terms"] == {"proj_mse": pytest.approx(m["distill_loss"])}
    assert len(m["distill_loss_per_block"]) == len(student.blocks)
    assert sum(m["distill_loss_per_block"]) / len(student.blocks) == pytest.approx(m["distill_loss"])
    # Weighted terms on some blocks: each block sums the weighted terms reading it, None where none does.
    m = DistillTask(teacher, student, [{"loss": "map_ce", "blocks": {"first": 1}, "weight": 2},
                                       {"loss": "proj_mse", "blocks": {"first": 2}}], probe=x).evaluate(final=False)
    per_block = m["distill_loss_per_block"]
    assert per_block[2:] == [None, None] and per_block[0] > per_block[1] > 0
    assert m["distill_loss"] == pytest.approx(2 * m["distill_terms"]["map_ce[first 1]"]
                                              + m["distill_terms"]["proj_mse[first 2]"])
    # A model-scope term: no per-block values.
    m = DistillTask(teacher, student, ["mse", "logit_kd"], probe=x).evaluate(final=False)
    assert "distill_loss_per_block" not in m and set(m["distill_terms"]) == {"proj_mse", "logit_kd"}
