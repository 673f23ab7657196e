"""Every registered linear operator: its forward equals its implicit matrices applied to V."""

import pytest
import torch
import torch.fx

from linvit.attention import ATTENTION, LinearAttention, attention_maps, available_variants
from linvit.attention.base import attention_core
from linvit.models import build_vit, model_variant, swap_attention

VARIANTS = available_variants()


def make(variant, dim=32, heads=4, grid=(3, 4), prefix=1, **kw):
    torch.manual_seed(0)
    attn = ATTENTION[variant](dim, heads, qkv_bias=True, grid_size=grid, num_prefix_tokens=prefix, **kw)
    # Perturb every operator-specific parameter away from its identity-like init, so the
    # test also covers the terms that start at zero (convolutions, positional terms, scales).
    with torch.no_grad():
        for name, p in attn.named_parameters():
            if not name.startswith(("qkv", "proj")):
                p.add_(0.1 * torch.randn_like(p))
    return attn


@pytest.mark.parametrize("qk_norm", [False, True], ids=["", "qk_norm"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_forward_equals_implicit_matrix_applied_to_v(variant, qk_norm):
    # With qk_norm the (perturbed) q/k norms must act in the implicit path as in the forward.
    attn = make(variant, qk_norm=qk_norm)
    x = torch.randn(2, 1 + 12, 32)
    imp = attn.implicit_attention(x)
    with torch.no_grad():
        expected = attn(x)
        got = attn.proj(imp.output())
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    # (B, H, N, N), or (B, H, G, N, N) for operators mixing G groups of value channels separately.
    assert imp.attn.shape[:2] == (2, attn.num_heads) and imp.attn.shape[-2:] == (13, 13)


@pytest.mark.parametrize("variant", VARIANTS)
def test_implicit_matrix_is_non_negative_and_row_normalized(variant):
    attn = make(variant)
    imp = attn.implicit_attention(torch.randn(3, 13, 32))
    assert imp.maps().shape == (3, attn.num_heads, 13, 13)  # value groups averaged per head
    a = imp.attn
    rows = a.sum(-1)
    if not attn.row_normalized:
        # The flag is no free pass: the matrix really is signed or has rows off one.
        assert (a < 0).any() or ((rows - 1).abs() > 1e-3).any()
        return
    assert (a >= 0).all()
    # The normalizer's eps only ever shrinks a row (to zero where every feature vanishes).
    assert (rows <= 1 + 1e-5).all()
    assert (rows > 0.9).float().mean() > 0.5


def test_elu_rows_sum_to_one():
    a = make("elu").implicit_attention(torch.randn(3, 13, 32)).attn
    torch.testing.assert_close(a.sum(-1), torch.ones(3, 4, 13), rtol=0, atol=1e-4)


@pytest.mark.parametrize("variant", VARIANTS)
def test_linear_operator_takes_no_mask(variant):
    with pytest.raises(ValueError, match="non-causal"):
        make(variant)(torch.randn(1, 13, 32), attn_mask=torch.ones(13, 13, dtype=torch.bool))


@pytest.mark.parametrize("variant", VARIANTS)
def test_operator_refuses_attn_drop(variant):
    # A linear operator forms no attention matrix to drop entries of: the argument is refused
    # rather than silently ignored.
    with pytest.raises(TypeError, match="attn_drop"):
        ATTENTION[variant](32, 4, attn_drop=0.1, grid_size=(3, 4))


def test_unknown_variant_names_the_known_ones():
    with pytest.raises(ValueError, match=r"unknown attention variant 'nope'.*elu"):
        build_vit("micro", num_classes=10, img_size=28, in_chans=1, variant="nope")


@pytest.mark.parametrize("variant", VARIANTS)
def test_swap_replaces_every_block_and_keeps_outputs_finite(variant):
    model = build_vit("micro", num_classes=10, img_size=28, in_chans=1)
    assert model_variant(model) == "softmax"
    swap_attention(model, variant)
    assert all(isinstance(b.attn, LinearAttention) for b in model.blocks)
    assert model_variant(model) == variant
    out = model(torch.randn(2, 1, 28, 28))
    assert out.shape == (2, 10) and torch.isfinite(out).all()


def test_softmax_maps_match_timm_attention_output():
    model = build_vit("micro", num_classes=10, img_size=28, in_chans=1).eval()
    attn = model.blocks[0].attn
    x = torch.randn(2, 50, 64)
    with torch.no_grad():
        maps = attention_maps(attn, x)
        q, k, v = attn.qkv(x).reshape(2, 50, 3, 4, 16).permute(2, 0, 3, 1, 4).unbind(0)
        out = attn.proj((maps @ v).transpose(1, 2).reshape(2, 50, 64))
        torch.testing.assert_close(out, attn(x), rtol=1e-4, atol=1e-5)


# -- half precision -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_half_precision_autocast_is_finite_on_large_activations(variant, dtype):
    attn = make(variant)
    x = 100 * torch.randn(2, 13, 32)
    with torch.autocast("cpu", dtype=dtype):
        out = attn(x)
    assert torch.isfinite(out).all(), f"{variant} under {dtype} autocast gave inf/NaN"


@pytest.mark.parametrize("variant", VARIANTS)
def test_bf16_autocast_matches_fp32(variant):
    attn = make(variant)
    x = torch.randn(2, 13, 32)
    with torch.no_grad():
        reference = attn(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            half = attn(x).float()
    # bf16 keeps 8 bits of mantissa: compare relative to the output's scale.
    err = (half - reference).abs().max() / reference.abs().max()
    assert err < 0.05, f"{variant}: bf16 deviates by {err:.3f} of the output scale"


# -- properties over random shapes ----------------------------------------------------------------

from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=12, deadline=None)
@given(variant=st.sampled_from(VARIANTS), batch=st.integers(1, 3), heads=st.sampled_from([1, 2, 4]),
       head_dim=st.sampled_from([4, 8, 16]), gh=st.integers(2, 6), gw=st.integers(2, 6),
       prefix=st.integers(0, 2), seed=st.integers(0, 2**16))
def test_property_finite_shape_kept_and_permutation_equivariant(variant, batch, heads, head_dim, gh, gw, prefix,
                                                                 seed):
    dim = heads * head_dim
    torch.manual_seed(seed)
    attn = ATTENTION[variant](dim, heads, qkv_bias=True, grid_size=(gh, gw), num_prefix_tokens=prefix).eval()
    n = prefix + gh * gw
    x = torch.randn(batch, n, dim)
    with torch.no_grad():
        out = attn(x)
        assert out.shape == x.shape and torch.isfinite(out).all()
        if not attn.positional:
            # Permuting the patch tokens permutes the output the same way.
            perm = torch.cat([torch.arange(prefix), prefix + torch.randperm(gh * gw)])
            torch.testing.assert_close(attn(x[:, perm]), out[:, perm], rtol=1e-4, atol=1e-5)


# -- gradients (some operators hand-write the backward of their linear-time core) -----------------

@pytest.mark.parametrize("qk_norm", [False, True], ids=["", "qk_norm"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_linear_core_and_implicit_matrices_give_the_same_gradients(variant, qk_norm):
    """The forward's gradients (through `attend`, hand-written for some operators) equal those of
    the quadratic implicit path, which plain autograd differentiates."""
    attn = make(variant, qk_norm=qk_norm)
    x = torch.randn(2, 13, 32)

    def grads(output):
        attn.zero_grad(set_to_none=True)
        xi = x.clone().requires_grad_()
        (output(xi) * torch.linspace(-1, 1, 32)).sum().backward()
        return [xi.grad] + [p.grad if p.grad is not None else torch.zeros_like(p) for p in attn.parameters()]

    linear = grads(attn)
    quadratic = grads(lambda xi: attn.proj(attn._implicit(xi).output()))
    for name, a, b in zip(["x"] + [n for n, _ in attn.named_parameters()], linear, quadratic):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-5 * max(1.0, b.abs().max().item()), msg=name)


def test_polarity_feature_backward_passes_gradcheck():
    from linvit.attention.polarity import _PolarityPowers

    torch.manual_seed(0)
    x = torch.randn(1, 2, 5, 4, dtype=torch.float64)
    x = (x + 0.1 * x.sign()).requires_grad_()  # away from the kink at 0
    inv_scale = (torch.rand(1, 2, 1, 4, dtype=torch.float64) + 0.5).requires_grad_()
    p = (1 + 4 * torch.rand(1, 2, 1, 4, dtype=torch.float64)).requires_grad_()
    f = lambda x, s, p: _PolarityPowers.apply(x, s, p, False)[0]
    assert torch.autograd.gradcheck(f, (x, inv_scale, p), eps=1e-6, atol=1e-6, rtol=1e-4)


def test_polarity_feature_gradient_stops_at_the_cap():
    """|x'| is capped at 1e6 (so that x'^5 stays finite in fp32): beyond it the features are
    constant, so their gradient is zero there and autograd's of the plain formula elsewhere."""
    from linvit.attention.polarity import _PolarityPowers

    x = torch.tensor([[[[3e6, -0.5, 2.0, -4e6], [0.0, 1.5, -2e5, 7.0]]]], requires_grad=True)
    inv_scale, p = torch.ones(1, 1, 1, 4), torch.full((1, 1, 1, 4), 3.0)
    out, _ = _PolarityPowers.apply(x, inv_scale, p, False)
    grad = torch.randn(out.shape)
    (g,) = torch.autograd.grad(out, x, grad)
    a = x.detach().clone().requires_grad_()
    capped = a.abs().clamp_max(1e6) ** 3
    ref_out = torch.cat([torch.where(a > 0, capped, 0.0), torch.where(a < 0, capped, 0.0)], dim=-1)
    (ref,) = torch.autograd.grad(ref_out, a, grad)
    torch.testing.assert_close(out, ref_out.detach(), rtol=1e-5, atol=0)
    assert (g[x.abs() > 1e6] == 0).all()
    torch.testing.assert_close(g, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("start", [0, 2])
def test_polarity_core_backward_passes_gradcheck(start):
    """The written-out backward of polarity's core (products, quotient, the small matrix's swaps)
    against finite differences, with and without prefix tokens (no conv term on those)."""
    from linvit.attention.polarity import _PolarityCore

    torch.manual_seed(0)
    b, h, n, d = 1, 2, 7, 4
    fq = torch.rand(b, h, n, 2 * d, dtype=torch.float64, requires_grad=True)
    fk = torch.rand(b, h, n, 2 * d, dtype=torch.float64, requires_grad=True)
    v = torch.randn(b, h, n, d, dtype=torch.float64, requires_grad=True)
    conv = torch.randn(b, h, n - start, d, dtype=torch.float64, requires_grad=True)
    eps = torch.full((b, h, 1, 1), 1e-3, dtype=torch.float64)
    f = lambda fq, fk, v, conv: _PolarityCore.apply(fq, fk, v, eps, conv, start)
    assert torch.autograd.gradcheck(f, (fq, fk, v, conv), eps=1e-6, atol=1e-6, rtol=1e-4)


# -- float64 -------------------------------------------------------------------------------------

CASES = [(v, {}) for v in VARIANTS] + [("rala", {"rope": True})]
CASE_IDS = [v + "".join(f"-{k}" for k in kw) for v, kw in CASES]


@pytest.mark.parametrize("variant,kw", CASES, ids=CASE_IDS)
def test_float64_module_computes_in_float64(variant, kw):
    """A float64 module runs its core in float64 (the core promotes to at least fp32): its
    forward matches its float64 implicit matrices far below fp32 rounding."""
    attn = make(variant, **kw).double()
    x = torch.randn(2, 13, 32, dtype=torch.float64)
    with torch.no_grad():
        out = attn(x)
        expected = attn.proj(attn.implicit_attention(x).output())
    assert out.dtype == torch.float64 and expected.dtype == torch.float64
    err = ((out - expected).abs().max() / expected.abs().max()).item()
    assert err < 1e-10, f"{variant}: float64 forward deviates from its implicit matrices by {err:.1e}"


# -- torch.fx ------------------------------------------------------------------------------------

def perturbed_vit(variant, **kw):
    torch.manual_seed(0)
    # swapped explicitly, so that "softmax" is the registered operator, not timm's Attention
    model = swap_attention(build_vit("micro", num_classes=10, img_size=28, in_chans=1), variant, **kw)
    with torch.no_grad():  # operator-specific terms away from their identity-like init
        for name, p in model.named_parameters():
            if ".attn." in name and not name.split(".attn.")[1].startswith(("qkv", "proj")):
                p.add_(0.1 * torch.randn_like(p))
    return model


def outputs_and_grads(fn, model, x):
    model.zero_grad(set_to_none=True)
    xi = x.clone().requires_grad_()
    out = fn(xi)
    (out * torch.linspace(-1, 1, out.shape[-1])).sum().backward()
    return [out, xi.grad] + [p.grad for p in model.parameters()]


@pytest.mark.parametrize("variant,kw", CASES, ids=CASE_IDS)
def test_fx_traced_vit_forward_and_backward_equal_eager(variant, kw):
    """torch.fx.symbolic_trace and timm's fx feature extraction trace a ViT with the operator
    (its core is one wrapped call in the graph) and give eager's outputs and gradients."""
    from timm.models import create_feature_extractor, get_graph_node_names

    model = perturbed_vit(variant, **kw)
    x = torch.randn(2, 1, 28, 28)
    eager = outputs_and_grads(model, model, x)
    traced = torch.fx.symbolic_trace(model)
    assert sum(n.target is attention_core for n in traced.graph.nodes) == len(model.blocks)
    node = get_graph_node_names(model)[1][-1]
    extractor = create_feature_extractor(model, return_nodes=[node])
    for name, fn in [("symbolic_trace", traced), ("timm", lambda xi: extractor(xi)[node])]:
        got = outputs_and_grads(fn, model, x)
        assert all(g is not None for g in got), name
        for i, (a, b) in enumerate(zip(got, eager)):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7, msg=f"{name}: tensor {i}")


def test_fx_traced_block_keeps_the_mask_check():
    from timm.models.vision_transformer import Block

    block = Block(32, 4)
    block.attn = make("elu")
    traced = torch.fx.symbolic_trace(block)  # the mask is a graph input, checked in the core
    x = torch.randn(1, 13, 32)
    torch.testing.assert_close(traced(x), block(x), rtol=0, atol=0)
    with pytest.raises(ValueError, match="non-causal"):
        traced(x, attn_mask=torch.ones(13, 13, dtype=torch.bool))


@pytest.mark.parametrize("rotary", [False, True])
def test_kernel_attention_backward_passes_gradcheck(rotary):
    # _KernelCore writes its backward out; gradcheck compares it with finite differences, and
    # the forward with the formula written plainly.
    from linvit.attention.base import kernel_attention

    g = torch.Generator().manual_seed(1)
    fq, fk, a, b = (torch.rand(2, 3, 7, 5, dtype=torch.float64, generator=g).requires_grad_() for _ in range(4))
    v = torch.randn(2, 3, 7, 4, dtype=torch.float64, generator=g, requires_grad=True)
    extra = dict(fq_num=a, fk_num=b) if rotary else {}
    inputs = (fq, fk, v, a, b) if rotary else (fq, fk, v)

    def f(*t):
        return kernel_attention(*t[:3], 1e-3, **(dict(fq_num=t[3], fk_num=t[4]) if rotary else {}))

    assert torch.autograd.gradcheck(f, inputs)
    na, nb = (a, b) if rotary else (fq, fk)
    plain = (na @ (nb.transpose(-1, -2) @ v) / 7) / (fq @ fk.mean(dim=-2).unsqueeze(-1) + 1e-3)
    torch.testing.assert_close(kernel_attention(fq, fk, v, 1e-3, **extra), plain)


def test_kernel_attention_takes_token_major_views_and_gradients():
    # Operators that keep the projection's (B, N, H, F) layout hand the core strided views, and the
    # gradient coming back through merge_heads is one too: values and gradients as for dense inputs.
    from linvit.attention.base import kernel_attention, merge_heads

    g = torch.Generator().manual_seed(3)
    fq, fk = (torch.rand(2, 7, 3, 5, dtype=torch.float64, generator=g).requires_grad_() for _ in range(2))
    v = torch.randn(2, 7, 3, 4, dtype=torch.float64, generator=g, requires_grad=True)

    def f(fq, fk, v):  # views, and a merged (strided) output as attention_core makes it
        return merge_heads(kernel_attention(fq.transpose(1, 2), fk.transpose(1, 2), v.transpose(1, 2), 1e-3))

    assert not fq.transpose(1, 2).is_contiguous()
    assert torch.autograd.gradcheck(f, (fq, fk, v))
    dense = [t.detach().transpose(1, 2).contiguous().requires_grad_() for t in (fq, fk, v)]
    out = merge_heads(kernel_attention(*dense, 1e-3))
    torch.testing.assert_close(f(fq, fk, v), out)
    w = torch.randn_like(out)
    grads = torch.autograd.grad((f(fq, fk, v) * w).sum(), (fq, fk, v))
    for got, want in zip(grads, torch.autograd.grad((out * w).sum(), dense)):
        torch.testing.assert_close(got, want.transpose(1, 2))


def test_kernel_attention_clamped_normalizer_gradcheck():
    # cosFormer's max(mean, eps): tokens whose features are all zero sit at the floor, with no
    # gradient through the normalizer there.
    from linvit.attention.base import kernel_attention

    g = torch.Generator().manual_seed(2)
    fq, fk = (torch.rand(2, 3, 7, 5, dtype=torch.float64, generator=g) for _ in range(2))
    fq[:, :, :2] = 0
    fq.requires_grad_()
    fk.requires_grad_()
    v = torch.randn(2, 3, 7, 4, dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(lambda *t: kernel_attention(*t, 1e-3, clamp=True), (fq, fk, v))
    plain = (fq @ (fk.transpose(-1, -2) @ v) / 7) / (fq @ fk.mean(dim=-2).unsqueeze(-1)).clamp_min(1e-3)
    torch.testing.assert_close(kernel_attention(fq, fk, v, 1e-3, clamp=True), plain)


def test_focused_focus_map_backward_passes_gradcheck():
    # _FocusMap writes its backward out (x and the softplus'd scale); against autograd through the
    # formula as written, and finite differences.
    import torch.nn.functional as F

    from linvit.attention.focused import _FocusMap

    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 5, 6, dtype=torch.float64, generator=g, requires_grad=True)
    s = (torch.rand(6, dtype=torch.float64, generator=g) + 0.5).requires_grad_()
    assert torch.autograd.gradcheck(lambda x, s: _FocusMap.apply(x, s, 3.0), (x, s))
    a = (F.relu(x) + 1e-6) / s
    written = a ** 3 * (a.norm(dim=-1, keepdim=True) / (a ** 3).norm(dim=-1, keepdim=True))
    torch.testing.assert_close(_FocusMap.apply(x, s, 3.0), written)


def test_rotate_pairs_backward_passes_gradcheck():
    """The rotary rotation's written-out backward (the rotation back, by conj(rot)) against finite
    differences, on a view with prefix tokens sliced off as the operators hand it in."""
    from linvit.attention.mila import rotate_pairs, rotation

    torch.manual_seed(0)
    x = torch.randn(1, 2, 6, 4, dtype=torch.float64, requires_grad=True)
    rot = rotation(torch.rand(2, 5, 2, dtype=torch.float64) * 6)
    assert torch.autograd.gradcheck(lambda x: rotate_pairs(x[:, :, 1:], rot), (x,), eps=1e-6, atol=1e-6)


def test_hedgehog_signed_exp_backward_passes_gradcheck():
    """Hedgehog's exp([z, -z] + shift) with its backward written out, the shift a constant, against
    finite differences; with each token's maximum taken out first (the queries' form), that
    maximum is a constant too: values and gradients as with it folded into the shift."""
    from linvit.attention.hedgehog import _SignedExp

    torch.manual_seed(0)
    z = torch.randn(1, 2, 5, 3, dtype=torch.float64, requires_grad=True)
    shift = torch.randn(1, 2, 1, 6, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda z: _SignedExp.apply(z, shift, False), (z,), eps=1e-6, atol=1e-6,
                                    rtol=1e-4)
    with torch.no_grad():
        top = torch.cat([z + shift[..., :3], shift[..., 3:] - z], dim=-1).amax(dim=-1, keepdim=True)
    got, want = _SignedExp.apply(z, shift, True), _SignedExp.apply(z, shift - top, False)
    grad = torch.randn(got.shape, dtype=torch.float64)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(torch.autograd.grad(got, z, grad), torch.autograd.grad(want, z, grad))


@pytest.mark.parametrize("variant,kw", [("mila", {}), ("rala", {"rope": True})], ids=["mila", "rala-rope"])
def test_rotary_tables_survive_module_to_dtype(variant, kw):
    """`module.to(torch.float64)` converts the rotary table as `.double()` does (a complex buffer
    would lose its sines to the real cast): the same outputs, no cast warning."""
    import copy
    import warnings

    attn = make(variant, **kw)
    x = torch.randn(2, 13, 32, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        moved = copy.deepcopy(attn).to(torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(moved(x), copy.deepcopy(attn).double()(x))
