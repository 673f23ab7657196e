"""Distillation losses: each registered loss against a value computed by hand, terms, the objective."""

import copy
import math
import pickle

import pytest
import torch

from linvit.attention import softmax_attention_maps
from linvit.distill import DistillTask, attention_parameters
from linvit.losses import (LOSSES, Objective, Term, Views, distill_loss, js_rows, kl_rows, map_correlation,
                           parse_terms, register_loss, remove_recording)
from linvit.models import build_vit, capture_attention
from linvit.registry import LOSS_ALIASES
from linvit.transfer import parameter_group

P = torch.tensor([[0.5, 0.5], [1.0, 0.0]], dtype=torch.float64)
Q = torch.tensor([[0.25, 0.75], [0.5, 0.5]], dtype=torch.float64)
EPS = 1e-8


# ----------------------------------------------------------------------------- per-row functions


def test_kl_rows_by_hand():
    expected = [0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75),
                1.0 * math.log(1.0 / 0.5)]  # 0 log 0 = 0
    assert kl_rows(P, Q).tolist() == pytest.approx(expected)


def test_js_rows_by_hand():
    # row 0: m = (0.375, 0.625); row 1: m = (0.75, 0.25)
    row0 = 0.5 * (0.5 * math.log(0.5 / 0.375) + 0.5 * math.log(0.5 / 0.625)) \
        + 0.5 * (0.25 * math.log(0.25 / 0.375) + 0.75 * math.log(0.75 / 0.625))
    row1 = 0.5 * (1.0 * math.log(1.0 / 0.75)) + 0.5 * (0.5 * math.log(0.5 / 0.75) + 0.5 * math.log(0.5 / 0.25))
    assert js_rows(P, Q).tolist() == pytest.approx([row0, row1])
    assert js_rows(Q, P).tolist() == pytest.approx([row0, row1])  # symmetric


def test_map_correlation_by_hand():
    p = torch.tensor([[0.5, 0.5], [1.0, 0.0]])
    q = torch.tensor([[0.2, 0.8], [0.9, 0.1]])
    a = [0.5, 0.5, 1.0, 0.0]
    b = [0.2, 0.8, 0.9, 0.1]
    ma, mb = sum(a) / 4, sum(b) / 4
    cov = sum((u - ma) * (v - mb) for u, v in zip(a, b))
    expected = cov / math.sqrt(sum((u - ma) ** 2 for u in a) * sum((v - mb) ** 2 for v in b))
    assert map_correlation(p, q).item() == pytest.approx(expected, rel=1e-6)
    batch = torch.stack([torch.stack([p, q]), torch.stack([q, p])])  # (2 images, 2 heads, 2, 2)
    r = map_correlation(batch, batch.flip(1))
    assert r.shape == (2, 2) and r[0, 0].item() == pytest.approx(expected, rel=1e-6)
    assert map_correlation(p, p).item() == pytest.approx(1.0)
    assert map_correlation(p, torch.full((2, 2), 0.5)).item() == 0.0  # a constant map: 0, not nan


# ----------------------------------------------------------------------------- every loss by hand


def maps(rows):
    """(1 image, 1 head, N, N) from nested lists."""
    return torch.tensor(rows, dtype=torch.float64)[None, None]


def tokens(rows):
    """(1 image, N tokens, C channels) from nested lists."""
    return torch.tensor(rows, dtype=torch.float64)[None]


A, AH = maps(P.tolist()), maps(Q.tolist())  # teacher A, student Â


def by_hand():
    """loss -> (views, options, the value written out)."""
    out_mse = ((1 - 1) ** 2 + (2 - 0) ** 2 + (3 - 3) ** 2 + (4 - 5) ** 2) / 4
    proj_mse = ((0.5 - 0) ** 2 + (-1 - 1) ** 2 + (2 - 2) ** 2 + (0 - 3) ** 2) / 4
    ce = (-(0.5 * math.log(0.25) + 0.5 * math.log(0.75)) + -(1.0 * math.log(0.5) + 0.0 * math.log(0.5))) / 2
    rkl = ((0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / 0.5))
           + (0.5 * math.log(0.5 / 1.0) + 0.5 * math.log(0.5 / EPS))) / 2  # A_11 = 0 clamps to eps
    m0, m1 = (0.375, 0.625), (0.75, 0.25)
    js = ((0.5 * (0.5 * math.log(0.5 / m0[0]) + 0.5 * math.log(0.5 / m0[1]))
           + 0.5 * (0.25 * math.log(0.25 / m0[0]) + 0.75 * math.log(0.75 / m0[1])))
          + (0.5 * (1.0 * math.log(1.0 / m1[0]))
             + 0.5 * (0.5 * math.log(0.5 / m1[0]) + 0.5 * math.log(0.5 / m1[1])))) / 2
    fro = math.sqrt((0.25 - 0.5) ** 2 + (0.75 - 0.5) ** 2 + (0.5 - 1.0) ** 2 + (0.5 - 0.0) ** 2)
    l2 = (math.sqrt(3 ** 2 + 4 ** 2) + math.sqrt(0 ** 2 + 0 ** 2)) / 2
    hidden = ((1 - 0) ** 2 + (1 - 0) ** 2 + (0 - 2) ** 2 + (1 - 1) ** 2) / 4
    cos = ((1 - 0 / (1 * 1)) + (1 - (2 + 2) / (math.sqrt(2) * math.sqrt(8)))) / 2
    # logit_kd, tau 1: image 0 teacher (1/4, 3/4) student (1/2, 1/2); image 1 the other way round
    kd1 = ((0.25 * math.log(0.25 / 0.5) + 0.75 * math.log(0.75 / 0.5))
           + (0.5 * math.log(0.5 / 0.25) + 0.5 * math.log(0.5 / 0.75))) / 2
    # tau 2: teacher logits (0, ln 3) / 2 give (1, sqrt 3) / (1 + sqrt 3); the student's stay uniform
    p0, p1 = 1 / (1 + math.sqrt(3)), math.sqrt(3) / (1 + math.sqrt(3))
    # hard: the teacher's top classes are 1 and 0; the student gives them 1/2 and 1/4
    hard = (-math.log(0.5) - math.log(0.25)) / 2
    z_t = torch.tensor([[0.0, math.log(3)], [0.0, 0.0]], dtype=torch.float64)
    z_s = torch.tensor([[0.0, 0.0], [0.0, math.log(3)]], dtype=torch.float64)
    return {
        "out_mse": (Views(teacher_pre=tokens([[1, 2], [3, 4]]), student_pre=tokens([[1, 0], [3, 5]])), {}, out_mse),
        "proj_mse": (Views(teacher_out=tokens([[0.5, -1], [2, 0]]), student_out=tokens([[0, 1], [2, 3]])),
                     {}, proj_mse),
        "map_ce": (Views(teacher_maps=A, student_maps=AH), {}, ce),
        "map_rkl": (Views(teacher_maps=A, student_maps=AH), {}, rkl),
        "map_js": (Views(teacher_maps=A, student_maps=AH), {}, js),
        "map_fro": (Views(teacher_maps=A, student_maps=AH), {}, fro),
        "block_l2": (Views(teacher_block=tokens([[0, 0], [1, 1]]), student_block=tokens([[3, 4], [1, 1]])),
                     {}, l2),
        "hidden_mse": (Views(teacher_block=tokens([[0, 0], [2, 1]]), student_block=tokens([[1, 1], [0, 1]])),
                       {}, hidden),
        "feat_cos": (Views(teacher_features=tokens([[0, 1], [2, 2]]), student_features=tokens([[1, 0], [1, 1]])),
                     {}, cos),
        "logit_kd": (Views(teacher_logits=z_t, student_logits=z_s), {}, kd1),
        "logit_kd[tau=2]": (Views(teacher_logits=torch.tensor([[0.0, math.log(3)]], dtype=torch.float64),
                                  student_logits=torch.zeros(1, 2, dtype=torch.float64)), {"tau": 2.0},
                            4 * (p0 * math.log(p0 / 0.5) + p1 * math.log(p1 / 0.5))),
        "logit_kd_hard": (Views(teacher_logits=torch.tensor([[1.0, 3.0], [2.0, 0.0]]), student_logits=z_s),
                          {}, hard),
    }


CASES = by_hand()


def test_every_registered_loss_has_a_case_by_hand():
    assert {c.split("[")[0] for c in CASES} == set(LOSSES)


@pytest.mark.parametrize("case", sorted(CASES))
def test_loss_by_hand(case):
    views, options, expected = CASES[case]
    got = LOSSES[case.split("[")[0]](views, **options)
    assert got.dim() == 0
    assert got.item() == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_map_ce_clamps_a_zero_student_weight_to_eps():
    # The teacher puts all weight where the student puts none: -1 * log(1e-8).
    v = Views(teacher_maps=maps([[1.0, 0.0], [0.0, 1.0]]), student_maps=maps([[0.0, 1.0], [0.0, 1.0]]))
    assert LOSSES["map_ce"](v).item() == pytest.approx((-math.log(EPS) + -math.log(1.0)) / 2)


def test_the_means_run_over_images_and_heads():
    # map_fro: one norm per (image, head), averaged; two heads, one of them equal to the teacher.
    v = Views(teacher_maps=torch.cat([A, A], dim=1), student_maps=torch.cat([AH, A], dim=1))
    assert LOSSES["map_fro"](v).item() == pytest.approx(
        math.sqrt(0.25 ** 2 + 0.25 ** 2 + 0.5 ** 2 + 0.5 ** 2) / 2)


def test_views_compute_on_first_use_and_name_what_is_missing():
    calls = []
    v = Views(teacher_out=lambda: calls.append(1) or torch.ones(1, 2, 2), student_out=torch.zeros(1, 2, 2))
    assert calls == []
    assert LOSSES["proj_mse"](v).item() == 1.0 and LOSSES["proj_mse"](v).item() == 1.0
    assert calls == [1]
    with pytest.raises(AttributeError, match=r"reads 'teacher_maps'.*hold: student_out, teacher_out"):
        LOSSES["map_ce"](v)


def test_every_loss_documents_its_formula():
    assert all(len(loss.formula) > 30 for loss in LOSSES.values())


# ----------------------------------------------------------------------------- terms


def test_a_term_defaults_and_normalizes():
    t = parse_terms(["map_ce", {"loss": "block_l2"}, {"loss": "hidden_mse"}, {"loss": "logit_kd", "tau": 2},
                     {"loss": "out_mse", "blocks": {"skip_last": 1}, "tokens": "patch", "forced": False,
                      "weight": 3}], "k")
    assert t[0] == Term("map_ce", 1.0, "all", "all", True, 1.0)
    assert t[1].forced is True and t[2].forced is False  # always / never forced
    assert t[3].tau == 2.0 and t[3].label == "logit_kd[tau=2]"
    assert t[4].blocks == ("skip_last", 1) and t[4].weight == 3.0
    assert t[4].label == "out_mse[skip_last 1, patch, end to end]"
    assert parse_terms([x.entry() for x in t], "k") == t
    assert parse_terms("map_ce", "k") == [t[0]]  # a single name


@pytest.mark.parametrize("old, new", sorted(LOSS_ALIASES.items()))
def test_old_loss_names_resolve(old, new):
    assert distill_loss(old).name == new
    assert parse_terms([old, {"loss": old, "weight": 2}], "k")[1] == Term(new, weight=2)
    assert Term(old).loss == new


@pytest.mark.parametrize("entry, message", [
    ({"loss": "nope"}, r"\[1\]\.loss: unknown distillation loss 'nope'; known losses: block_l2, feat_cos"),
    ({"weight": 1}, r"\[1\]: a term needs 'loss' \(one of: block_l2"),
    ({"loss": "map_ce", "wieght": 2}, r"\[1\]: unknown option\(s\) 'wieght'; a term takes: loss, weight"),
    (3, r"\[1\]: a term is a loss name or a mapping with 'loss', not 3"),
    ({"loss": "map_ce", "weight": -1}, r"\[1\]\.weight: -1 is not a finite number >= 0"),
    ({"loss": "map_ce", "weight": True}, r"\[1\]\.weight: True is not"),
    ({"loss": "map_ce", "blocks": {"middle": 2}}, r"\[1\]\.blocks: unknown selection 'middle'; known: all, first"),
    ({"loss": "map_ce", "blocks": {"last": 0}}, r"\[1\]\.blocks: last: 0 is not a whole number >= 1"),
    ({"loss": "map_ce", "blocks": {"first": 1, "last": 1}}, r"\[1\]\.blocks: .*give one of"),
    ({"loss": "map_ce", "blocks": "some"}, r"\[1\]\.blocks: 'some' is not all or"),
    ({"loss": "feat_cos", "blocks": "all"}, r"\[1\]\.blocks: feat_cos compares whole models; it takes no blocks"),
    ({"loss": "logit_kd", "blocks": {"last": 1}}, r"\[1\]\.blocks: logit_kd compares whole models"),
    ({"loss": "map_ce", "tokens": "cls"}, r"\[1\]\.tokens: 'cls' is not one of all, patch"),
    ({"loss": "logit_kd_hard", "tokens": "patch"}, r"\[1\]\.tokens: logit_kd_hard has no tokens to select"),
    ({"loss": "map_ce", "forced": "yes"}, r"\[1\]\.forced: 'yes' is not true or false"),
    ({"loss": "hidden_mse", "forced": False}, r"\[1\]\.forced: hidden_mse is never teacher-forced"),
    ({"loss": "block_l2", "forced": True}, r"\[1\]\.forced: block_l2 is always teacher-forced"),
    ({"loss": "map_ce", "tau": 2}, r"\[1\]\.tau: map_ce takes no temperature"),
    ({"loss": "logit_kd", "tau": 0}, r"\[1\]\.tau: 0 is not a finite number > 0"),
])
def test_a_bad_term_is_a_one_line_error_naming_the_key(entry, message):
    with pytest.raises(ValueError, match=r"^config key distill_designs\.x\.losses" + message) as err:
        parse_terms(["map_ce", entry], "distill_designs.x.losses")
    assert "\n" not in str(err.value)


def test_an_empty_list_of_terms_is_an_error():
    with pytest.raises(ValueError, match=r"^config key d\.losses: a non-empty list of distillation terms"):
        parse_terms([], "d.losses")


def test_block_selections_pick_their_blocks():
    assert Term("map_ce").block_indices(4) == [0, 1, 2, 3]
    assert Term("map_ce", blocks={"first": 2}).block_indices(4) == [0, 1]
    assert Term("map_ce", blocks={"last": 1}).block_indices(4) == [3]
    assert Term("map_ce", blocks={"skip_last": 1}).block_indices(4) == [0, 1, 2]
    for blocks in ({"last": 5}, {"skip_last": 4}):
        with pytest.raises(ValueError, match="leaves no blocks or needs more than the model's 4"):
            Term("map_ce", blocks=blocks).block_indices(4)


def test_a_loss_cannot_take_an_old_name_or_register_twice():
    with pytest.raises(ValueError, match="an old name of 'proj_mse'"):
        register_loss("mse")
    with pytest.raises(ValueError, match="registered twice"):
        register_loss("map_ce")(lambda v: 0)


# ----------------------------------------------------------------------------- the objective on a micro ViT


def micro(variant="elu", seed=0):
    torch.manual_seed(seed)
    return build_vit("micro", num_classes=4, img_size=28, in_chans=1, variant=variant)


@pytest.fixture(scope="module")
def pair():
    return micro("softmax"), micro("elu", seed=1)


@pytest.fixture(scope="module")
def x():
    torch.manual_seed(2)
    return torch.randn(2, 1, 28, 28)


@pytest.fixture
def probe_loss():
    """A registered block loss recording the (computed) views it was given."""
    seen = []

    @register_loss("test_probe")
    def probe(v):
        seen.append({k: getattr(v, k) for k in ("teacher_maps", "student_maps", "teacher_pre", "student_pre",
                                                "teacher_out", "student_out", "teacher_block", "student_block")})
        return (v.student_out - v.teacher_out).square().mean()

    yield seen
    del LOSSES["test_probe"]


def test_teacher_forced_views_are_the_teachers_tensors_and_the_student_on_its_inputs(pair, x, probe_loss):
    teacher, student = pair
    Objective(teacher, student, ["test_probe"])(x)
    attn_io = capture_attention(teacher, x)
    block_io, hooks = [], [b.register_forward_hook(lambda m, a, o: block_io.append((a[0], o)))
                           for b in teacher.blocks]
    with torch.no_grad():
        teacher(x)
    for h in hooks:
        h.remove()
    assert len(probe_loss) == len(teacher.blocks)
    for l, v in enumerate(probe_loss):
        (u, out), (b_in, b_out) = attn_io[l], block_io[l]
        t_attn, s_attn = teacher.blocks[l].attn, student.blocks[l].attn
        assert torch.allclose(v["teacher_out"], out) and torch.allclose(v["teacher_block"], b_out)
        # y is the input of proj (the per-head outputs, merged): proj of it is the attention output.
        assert torch.allclose(t_attn.proj(v["teacher_pre"]), out, atol=1e-6)
        assert torch.allclose(s_attn.proj(v["student_pre"]), v["student_out"], atol=1e-6)
        assert torch.allclose(v["student_out"], s_attn(u), atol=1e-6)
        assert torch.allclose(v["student_block"], student.blocks[l](b_in), atol=1e-5)
        assert torch.allclose(v["teacher_maps"], softmax_attention_maps(t_attn, u))
        assert torch.allclose(v["student_maps"], s_attn.attention_maps(u), atol=1e-6)
        assert v["student_maps"].requires_grad


def test_forced_runs_the_students_attention_on_the_teachers_input_end_to_end_on_its_own(pair, x):
    teacher, student = pair
    teacher_in = [u for u, _ in capture_attention(teacher, x)]
    student_in = [u for u, _ in capture_attention(student, x)]
    for forced, expected in ((True, teacher_in), (False, student_in)):
        objective = Objective(teacher, student, [{"loss": "proj_mse", "forced": forced}])
        seen = []
        hooks = [b.attn.register_forward_pre_hook(lambda m, a: seen.append(a[0])) for b in student.blocks]
        objective(x)
        for h in hooks:
            h.remove()
        assert len(seen) == len(expected)
        assert all(torch.allclose(s, e, atol=1e-6) for s, e in zip(seen, expected))
    assert not torch.allclose(teacher_in[1], student_in[1])  # the two inputs differ indeed


def test_block_selections_read_and_run_only_their_blocks(pair, x):
    teacher, student = pair
    every = Objective(teacher, student, ["map_js"])(x).per_block["map_js"]
    for blocks, expected in ((({"first": 2}), [0, 1]), ({"last": 1}, [3]), ({"skip_last": 1}, [0, 1, 2])):
        objective = Objective(teacher, student, [{"loss": "proj_mse", "blocks": blocks},
                                                 {"loss": "map_js", "blocks": blocks}])
        ran = []
        hooks = [b.attn.register_forward_hook(lambda m, a, o, l=l: ran.append(l))
                 for l, b in enumerate(student.blocks)]
        r = objective(x)
        for h in hooks:
            h.remove()
        assert ran == expected
        label = objective.labels[1]
        assert list(r.per_block[label]) == expected
        assert all(torch.allclose(r.per_block[label][l], every[l]) for l in expected)
        assert torch.allclose(r.terms[label], torch.stack([every[l] for l in expected]).mean())


def test_patch_tokens_drop_the_prefix_token(pair, x, probe_loss):
    teacher, student = pair
    prefix = teacher.num_prefix_tokens
    assert prefix == 1
    Objective(teacher, student, ["test_probe", {"loss": "test_probe", "tokens": "patch"}])(x)
    depth = len(teacher.blocks)
    full, patch = probe_loss[:depth], probe_loss[depth:]
    for f, p in zip(full, patch):
        for name in ("teacher_out", "student_pre", "teacher_block", "student_block"):
            assert torch.equal(p[name], f[name][:, 1:])
        for name in ("teacher_maps", "student_maps"):
            kept = f[name][..., 1:, 1:]
            assert torch.allclose(p[name], kept / kept.sum(-1, keepdim=True))
            assert torch.allclose(p[name].sum(-1), torch.ones(()))
    # Features keep the patch positions too.
    a = Objective(teacher, student, [{"loss": "feat_cos", "tokens": "patch"}])(x).total
    ft, fs = teacher.forward_features(x)[:, 1:], student.forward_features(x)[:, 1:]
    assert a.item() == pytest.approx((1 - torch.cosine_similarity(fs, ft, dim=-1)).mean().item(), rel=1e-5)


def test_weights_combine_and_labels_stay_apart(pair, x):
    teacher, student = pair
    student.eval()
    r = Objective(teacher, student, [{"loss": "proj_mse", "weight": 2}, {"loss": "map_ce", "weight": 0.5},
                                     {"loss": "hidden_mse", "weight": 0}, {"loss": "map_ce", "blocks": {"last": 1}},
                                     {"loss": "map_ce", "weight": 0.25}])(x)
    assert list(r.terms) == ["proj_mse", "map_ce", "hidden_mse", "map_ce[last 1]", "map_ce#2"]
    alone = {name: Objective(teacher, student, [name])(x).total for name in ("proj_mse", "map_ce")}
    assert torch.allclose(r.terms["proj_mse"], alone["proj_mse"])
    assert torch.allclose(r.total, 2 * alone["proj_mse"] + 0.5 * alone["map_ce"] + r.terms["map_ce[last 1]"]
                          + 0.25 * alone["map_ce"])
    assert r.terms["hidden_mse"] > 0


def test_student_logits_come_from_the_end_to_end_forward_or_when_asked(pair, x):
    teacher, student = pair
    student.eval()
    forwards = []
    hook = student.blocks[0].register_forward_hook(lambda m, a, o: forwards.append(1))
    try:
        forced = Objective(teacher, student, ["map_ce"])
        assert forced(x).student_logits is None and forwards == []
        assert torch.allclose(forced(x, student_logits=True).student_logits, student(x), atol=1e-6)
        forwards.clear()
        e2e = Objective(teacher, student, ["hidden_mse", "logit_kd"])
        r = e2e(x, student_logits=True)
        assert forwards == [1]  # one student forward serves both terms and the logits
        assert torch.allclose(r.student_logits, student(x), atol=1e-6)
    finally:
        hook.remove()


def test_the_teacher_runs_once_per_batch(pair, x):
    teacher, student = pair
    runs = []
    hook = teacher.blocks[-1].register_forward_hook(lambda m, a, o: runs.append(1))
    try:
        Objective(teacher, student, ["map_ce", "out_mse", "block_l2", "hidden_mse", "feat_cos", "logit_kd"])(x)
    finally:
        hook.remove()
    assert runs == [1]


def test_logit_kd_reads_the_logit_teachers_logits(pair, x):
    teacher, student = pair
    other = micro("softmax", seed=5)
    student.eval()
    r = Objective(teacher, student, [{"loss": "logit_kd", "tau": 2}], logit_teacher=other)(x)
    with torch.no_grad():
        expected = LOSSES["logit_kd"](Views(teacher_logits=other(x), student_logits=student(x)), tau=2.0)
    assert r.total.item() == pytest.approx(expected.item(), rel=1e-5)
    assert all(not p.requires_grad for p in other.parameters())


def test_teacher_depth_and_tokens_must_match():
    with pytest.raises(ValueError, match="the teacher has 4 blocks and the student 2"):
        Objective(micro("softmax"), build_vit("micro", num_classes=4, img_size=28, in_chans=1, variant="elu",
                                              depth=2), ["map_ce"])
    # A model-scope term compares whole models whatever their depth.
    Objective(micro("softmax"), build_vit("micro", num_classes=4, img_size=28, in_chans=1, variant="elu",
                                          depth=2), ["feat_cos"])


@pytest.mark.parametrize("loss", sorted(LOSSES))
def test_every_loss_falls_under_adamw_and_the_teacher_never_changes(loss, x):
    teacher, student = micro("softmax"), micro("elu", seed=1)
    teacher_before = {n: p.detach().clone() for n, p in teacher.named_parameters()}
    task = DistillTask(teacher, student, loss, probe=x)
    opt = torch.optim.AdamW([p for _, p in task.trainable()], lr=3e-3)
    first = task.loss(x, None).item()
    for _ in range(4):
        opt.zero_grad()
        task.loss(x, None).backward()
        opt.step()
    assert task.loss(x, None).item() < first
    assert all(p.grad is None and torch.equal(p, teacher_before[n]) for n, p in teacher.named_parameters())


@pytest.mark.parametrize("freeze", [True, False])
def test_freeze_trains_only_attention_and_no_freeze_trains_the_rest_too(freeze, x):
    teacher, student = micro("softmax"), micro("elu", seed=1)
    task = DistillTask(teacher, student, ["proj_mse", "feat_cos"], probe=x, freeze=freeze)
    attention = {n for n, _ in attention_parameters(student)}
    assert {n for n, _ in task.trainable()} == (attention if freeze else {n for n, _ in student.named_parameters()})
    before = {n: p.detach().clone() for n, p in student.named_parameters()}
    opt = torch.optim.AdamW([p for _, p in task.trainable()], lr=1e-3)
    for _ in range(2):
        opt.zero_grad()
        task.loss(x, None).backward()
        opt.step()
    moved = {n for n, p in student.named_parameters() if not torch.equal(p, before[n])}
    if freeze:
        assert moved and moved <= attention
    else:
        assert {parameter_group(n) for n in moved} >= {"attn", "mlp", "norm", "embed"}


TERMS = ["out_mse", {"loss": "map_ce", "forced": False}, "hidden_mse", "block_l2", "feat_cos"]


def test_compiled_attention_gives_the_eager_values_without_recompiling_per_block(pair, x):
    from torch._dynamo.utils import counters

    teacher, student = pair
    eager = Objective(teacher, student, TERMS)(x)
    compiled = micro("elu", seed=1)
    Objective(teacher, compiled, ["proj_mse"])  # the first objective hooks the student, then it compiles
    torch._dynamo.reset()
    counters.clear()
    try:
        for b in compiled.blocks:
            b.attn.compile(backend="aot_eager")
        Objective(teacher, compiled, ["proj_mse"])(x)
        # A later objective (a design's next phase) on the compiled student reads what it needs.
        got = Objective(teacher, compiled, TERMS)(x)
        # One graph per way of calling (teacher-forced; in the student's forward, recording; inside a
        # teacher-forced block, not recording), the same for all 4 blocks: no per-block recompilation.
        assert counters["stats"]["unique_graphs"] <= 3 < len(compiled.blocks)
        for label in eager.terms:
            assert got.terms[label].item() == pytest.approx(eager.terms[label].item(), rel=1e-5), label
    finally:
        torch._dynamo.reset()


def test_a_compiled_whole_student_runs_compiled_and_gives_its_logits(pair, x):
    from torch._dynamo.utils import counters

    teacher, student = pair
    student.eval()
    eager = Objective(teacher, student, ["logit_kd", "feat_cos"])(x, student_logits=True)
    compiled = micro("elu", seed=1).eval()
    objective = Objective(teacher, compiled, ["logit_kd", "feat_cos"])
    torch._dynamo.reset()
    counters.clear()
    try:
        compiled.compile(backend="aot_eager")  # as fit compiles a ClassifyTask's model
        got = objective(x, student_logits=True)
        assert counters["stats"]["unique_graphs"] >= 1  # the student's forward went through torch.compile
        assert torch.allclose(got.student_logits, eager.student_logits, atol=1e-5)
        assert torch.allclose(got.total, eager.total, atol=1e-5)
    finally:
        torch._dynamo.reset()


def test_a_hooked_student_copies_pickles_and_unhooks(pair, x):
    teacher, student = pair
    Objective(teacher, student, ["hidden_mse"])
    clone = copy.deepcopy(student)
    pickle.loads(pickle.dumps(student))
    remove_recording(clone)  # the copy's hooks only: the original still records
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in clone.modules())
    assert Objective(teacher, student, ["hidden_mse"])(x).total > 0
    assert Objective(teacher, clone, ["hidden_mse"])(x).total > 0  # a new objective hooks it again
