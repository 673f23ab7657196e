"""Map losses under autocast: every map loss reads float32 maps computed with autocast off, equal to the
autocast-free maps of the same inputs to float32 rounding, for every registered operator as the
student; and performer's normalizer has no 0/0."""

import dataclasses

import pytest
import torch

from linvit.attention import ATTENTION, attention_maps, available_variants
from linvit.losses import LOSSES, Objective
from linvit.models import build_vit, capture_attention, swap_attention

MAP_LOSSES = sorted(name for name, spec in LOSSES.items() if "maps" in spec.reads)
IMG = 16  # micro: 4 px patches, a 4x4 grid plus the class token: 17 tokens


def micro(seed: int = 0):
    torch.manual_seed(seed)
    return build_vit("micro", num_classes=4, img_size=IMG, in_chans=1, depth=2)


def map_terms():
    """Every map loss, teacher-forced and end to end where it may be either."""
    out = []
    for name in MAP_LOSSES:
        forcing = LOSSES[name].forcing
        for forced in ((True, False) if forcing == "optional" else (forcing == "always",)):
            out.append({"loss": name, "forced": forced} if forcing == "optional" else {"loss": name})
    return out


def test_the_map_losses_are_found():
    assert {"map_ce", "map_js", "map_rkl", "map_fro"} <= set(MAP_LOSSES)


@pytest.mark.parametrize("variant", available_variants())
def test_map_losses_read_float32_maps_under_bf16_autocast(variant, monkeypatch, quiet_machine):
    teacher = micro(0).eval()
    # the registered operator itself (softmax too: its SoftmaxAttention, the teacher keeps timm's)
    student = swap_attention(micro(1), variant).eval()
    terms = map_terms()

    seen = []  # (loss name, teacher maps, student maps) in the objective's order: terms, then blocks

    def recording(spec):
        def fn(v, **options):
            seen.append((spec.name, v.teacher_maps, v.student_maps))
            return spec.fn(v, **options)
        return dataclasses.replace(spec, fn=fn)

    for name in MAP_LOSSES:
        monkeypatch.setitem(LOSSES, name, recording(LOSSES[name]))

    x = torch.randn(2, 1, IMG, IMG, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        free = Objective(teacher, student, terms)(x)  # no autocast: the reference values
    seen.clear()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        amp = Objective(teacher, student, terms)(x)
        # the attention inputs the objective's forwards recorded (same autocast, same values)
        t_in = [i for i, _ in capture_attention(teacher, x)]
        s_in = [i for i, _ in capture_attention(student, x)]
    amp.total.backward()

    objective = Objective(teacher, student, terms)
    where = [(term, l) for term, blocks in zip(objective.terms, objective.blocks) for l in blocks]
    assert len(seen) == len(where) == len(terms) * len(student.blocks)
    for (name, a, ah), (term, l) in zip(seen, where):
        what = f"{term.label} block {l} ({variant} student)"
        assert a.dtype == torch.float32 and ah.dtype == torch.float32, \
            f"{what}: the loss read {a.dtype} teacher and {ah.dtype} student maps under bf16 autocast"
        assert torch.isfinite(a).all() and torch.isfinite(ah).all(), what
        # the same maps as without autocast on the same inputs (cast up to fp32), to fp32 rounding
        inputs = t_in if term.forced else s_in
        with torch.no_grad():
            want_a = attention_maps(teacher.blocks[l].attn, t_in[l].float())
            want_ah = attention_maps(student.blocks[l].attn, inputs[l].float())
        torch.testing.assert_close(a, want_a, msg=f"{what}: teacher maps")
        torch.testing.assert_close(ah.detach(), want_ah, msg=f"{what}: student maps")
        torch.testing.assert_close(a.sum(-1), torch.ones_like(a[..., 0]))
    for label, value in amp.terms.items():
        assert value.dtype == torch.float32 and torch.isfinite(value), label
        # the activations upstream of the maps differ by bf16 rounding: close, not equal
        torch.testing.assert_close(value.detach(), free.terms[label], rtol=5e-2, atol=5e-3, msg=label)
    grads = [p.grad for p in student.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


@pytest.mark.parametrize("variant", available_variants())
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_attention_maps_are_float32_whatever_the_autocast_and_input(variant, dtype, quiet_machine):
    """One operator at 17 tokens: attention_maps (what every map reader calls) under autocast, on an fp32 or low-precision input, equals
    the autocast-free maps of the fp32 input to float32 rounding, and its gradient is finite."""
    torch.manual_seed(0)
    attn = ATTENTION[variant](32, 4, grid_size=(4, 4), num_prefix_tokens=1)
    x = torch.randn(2, 17, 32)
    want = attention_maps(attn, x)
    for given in (x, x.to(dtype)):
        with torch.autocast("cpu", dtype=dtype):
            got = attention_maps(attn, given, grad=True)
        assert got.dtype == torch.float32 and torch.isfinite(got).all()
        ref = want if given.dtype == torch.float32 else attention_maps(attn, given.float())
        torch.testing.assert_close(got.detach(), ref)
    attn.zero_grad()
    got.square().sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in attn.parameters() if p.grad is not None)


def test_performer_normalizer_has_no_0_over_0(quiet_machine):
    """kernel_eps 0 and large activations underflow every feature: the normalizer is 0, and the eps
    makes the output 0 (the map rows uniform) instead of nan, gradients included."""
    torch.manual_seed(0)
    attn = ATTENTION["performer"](32, 4, grid_size=(4, 4), num_prefix_tokens=1, kernel_eps=0.0)
    x = (1e3 * torch.randn(2, 17, 32)).requires_grad_()
    q, k, _ = attn.split_heads(x.detach())
    assert attn._exp_features(q, True).max() == 0  # every feature underflows
    out = attn(x)
    assert torch.isfinite(out).all()
    out.sum().backward()
    assert torch.isfinite(x.grad).all()
    maps = attention_maps(attn, x.detach())
    torch.testing.assert_close(maps, torch.full_like(maps, 1 / 17))
    # Under fp16 autocast the implicit matrices' feature products (kernel_eps^2 / m and the like)
    # would underflow to 0/0 (40% of the entries here, at the default kernel_eps): they ignore autocast.
    plain = ATTENTION["performer"](32, 4, grid_size=(4, 4), num_prefix_tokens=1)
    x = 3 * torch.randn(2, 17, 32)
    with torch.autocast("cpu", dtype=torch.float16):
        a = plain.implicit_attention(x).attn
    assert a.dtype == torch.float32 and torch.isfinite(a).all()


def test_performer_eps_leaves_fp32_values_unchanged(quiet_machine):
    """The normalizer's eps is below half an fp32 ulp of any normalizer the default kernel_eps allows."""
    torch.manual_seed(0)
    attn = ATTENTION["performer"](32, 4, grid_size=(4, 4), num_prefix_tokens=1)
    for scale in (1.0, 1e3):  # ordinary activations, and every feature at its kernel_eps floor
        x = scale * torch.randn(2, 17, 32)
        with torch.no_grad():
            with_eps, maps = attn(x), attention_maps(attn, x)
            attn.eps = 0.0
            without, maps0 = attn(x), attention_maps(attn, x)
            del attn.eps
        assert torch.equal(with_eps, without) and torch.equal(maps, maps0)
