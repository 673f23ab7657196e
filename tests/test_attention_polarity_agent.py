"""PolaFormer ('polarity') and Agent attention ('agent') against quadratic re-implementations of
the papers' formulas written here (explicit N x N / N x n_a matrices, a direct depthwise
convolution, a direct adaptive average pooling), with the operators' own parameters."""

import math

import pytest
import torch
import torch.nn.functional as F

from linvit.attention import ATTENTION
from linvit.models import build_vit

# -- shared helpers ---------------------------------------------------------------------------------


def make(variant, dim=32, heads=4, grid=(3, 4), prefix=1, perturb=True, seed=0, **kw):
    torch.manual_seed(seed)
    attn = ATTENTION[variant](dim, heads, qkv_bias=True, grid_size=grid, num_prefix_tokens=prefix, **kw)
    attn = attn.double()
    with torch.no_grad():
        for name, p in attn.named_parameters():
            if name.startswith(("qkv", "proj")):
                p.copy_(0.3 * torch.randn_like(p))
            elif perturb:
                p.add_(0.3 * torch.randn_like(p))
    return attn


def qkv_heads(attn, x):
    """q, k, v as (B, N, C) from the operator's own qkv weights."""
    return attn.qkv(x).chunk(3, dim=-1)


def heads(t, h):  # (B, N, C) -> (B, H, N, D)
    b, n, c = t.shape
    return t.reshape(b, n, h, c // h).transpose(1, 2)


def merge(t):  # (B, H, N, D) -> (B, N, C)
    b, h, n, d = t.shape
    return t.transpose(1, 2).reshape(b, n, h * d)


def direct_depthwise(grid, weight, bias):
    """Cross-correlation of each channel of grid (B, C, gh, gw) with its own k x k filter, zero
    padding k // 2: out[r, c] = sum_ij w[i, j] x[r + i - k//2, c + j - k//2] + b."""
    b, c, gh, gw = grid.shape
    k = weight.shape[-1]
    r = k // 2
    padded = torch.zeros(b, c, gh + 2 * r, gw + 2 * r, dtype=grid.dtype)
    padded[:, :, r:r + gh, r:r + gw] = grid
    out = torch.zeros_like(grid)
    for i in range(k):
        for j in range(k):
            out += weight[:, 0, i, j].reshape(1, c, 1, 1) * padded[:, :, i:i + gh, j:j + gw]
    return out + bias.reshape(1, c, 1, 1)


def relative_error(a, b):
    return ((a - b).abs().max() / b.abs().max()).item()


def assert_matches(got, reference):
    # A float64 module runs its core in float64 (the base promotes q, k, v to at least fp32), so
    # the float64 reference is matched far below fp32 rounding, relative to the output's scale.
    assert got.shape == reference.shape
    err = relative_error(got, reference)
    assert err < 1e-10, f"deviates from the reference by {err:.2e} of the output scale"


# -- PolaFormer ----------------------------------------------------------------------------------------


def polarity_reference(attn, x):
    """PolaFormer (Meng et al. 2025), written out with N x N matrices:
    q' = q / softplus(s), k' = (k + pe) / softplus(s), p = 1 + 4 sigmoid(w),
    S_sim = q'+^p k'+^p^T + q'-^p k'-^p^T, S_opp = q'+^p k'-^p^T + q'-^p k'+^p^T,
    O = [S_sim v1 / rowsum(S_sim), S_opp v2 / rowsum(S_opp)] (means over keys, eps 1e-6),
    out = proj((O + dwc5x5(v)) * (x W_g^T + b_g))."""
    b, n, c = x.shape
    h, p0 = attn.num_heads, attn.num_prefix_tokens
    gh, gw = attn.grid_size
    q, k, v = qkv_heads(attn, x)
    k = k.clone()
    k[:, p0:] = k[:, p0:] + attn.positional_encoding[0]
    s = F.softplus(attn.scale)
    q, k, v = heads(q / s, h), heads(k / s, h), heads(v, h)
    p = 1 + 4 * torch.sigmoid(attn.power)  # (1, H, 1, D)
    qp, qn, kp, kn = q.clamp(min=0) ** p, (-q).clamp(min=0) ** p, k.clamp(min=0) ** p, (-k).clamp(min=0) ** p
    s_sim = qp @ kp.transpose(-1, -2) + qn @ kn.transpose(-1, -2)
    s_opp = qp @ kn.transpose(-1, -2) + qn @ kp.transpose(-1, -2)
    d = v.shape[-1]
    v1, v2 = v[..., :d // 2], v[..., d // 2:]
    outs = []
    for s_, vg in ((s_sim, v1), (s_opp, v2)):
        s_ = s_ / n
        outs.append((s_ @ vg) / (s_.sum(-1, keepdim=True) + 1e-6))
    o = torch.cat(outs, dim=-1)
    # depthwise 5x5 on V's patch grid: one filter per head channel, shared by the heads
    grid = v[:, :, p0:].reshape(b * h, gh, gw, d).permute(0, 3, 1, 2)
    conv = direct_depthwise(grid, attn.dwc.weight, attn.dwc.bias)
    conv = conv.permute(0, 2, 3, 1).reshape(b, h, gh * gw, d)
    o = o.clone()
    o[:, :, p0:] = o[:, :, p0:] + conv
    g = x @ attn.gate_proj.weight.T + attn.gate_proj.bias
    return attn.proj(merge(o) * g)


@pytest.mark.parametrize("grid,prefix", [((3, 4), 1), ((4, 4), 0), ((5, 3), 2)])
def test_polarity_matches_quadratic_reference(grid, prefix):
    attn = make("polarity", grid=grid, prefix=prefix)
    x = torch.randn(2, prefix + grid[0] * grid[1], 32, dtype=torch.float64)
    with torch.no_grad():
        assert_matches(attn(x), polarity_reference(attn, x))


def test_polarity_defaults_and_init_are_the_pure_core():
    attn = ATTENTION["polarity"](32, 4, qkv_bias=True, grid_size=(3, 4), num_prefix_tokens=1)
    assert attn.alpha == 4 and attn.dwc.kernel_size == (5, 5) and attn.dwc.groups == 8
    p = 1 + attn.alpha * torch.sigmoid(attn.power)
    torch.testing.assert_close(p, torch.full_like(p, 3.0))  # the official init: exponent 3
    assert not attn.dwc.weight.any() and not attn.dwc.bias.any() and not attn.positional_encoding.any()
    x = torch.randn(2, 13, 32)
    torch.testing.assert_close(attn.gate(x), torch.ones(2, 13, 32))
    # The pure polarity core: exponent 3, no scale (a common factor), no conv, no gate.
    with torch.no_grad():
        q, k, v = (heads(t, 4) for t in qkv_heads(attn, x))
        f = lambda t: torch.cat([t.clamp(min=0) ** 3, (-t).clamp(min=0) ** 3], -1)  # noqa: E731
        fq, fk = f(q), f(k)
        fq_opp = torch.cat([fq[..., 8:], fq[..., :8]], -1)
        o = []
        for a, vg in ((fq @ fk.transpose(-1, -2), v[..., :4]), (fq_opp @ fk.transpose(-1, -2), v[..., 4:])):
            o.append(a @ vg / a.sum(-1, keepdim=True))
        torch.testing.assert_close(attn(x), attn.proj(merge(torch.cat(o, -1))), rtol=1e-4, atol=1e-5)


def test_polarity_identity_gate_survives_swap_attention():
    model = build_vit("micro", num_classes=10, img_size=28, in_chans=1, variant="polarity")
    for block in model.blocks:
        assert not block.attn.gate_proj.weight.any() and (block.attn.gate_proj.bias == 1).all()


def test_polarity_implicit_is_grouped_by_value_halves():
    attn = make("polarity").float()
    imp = attn.implicit_attention(torch.randn(2, 13, 32))
    assert imp.attn.shape == (2, 4, 2, 13, 13) and (imp.attn >= 0).all()
    assert (imp.attn.sum(-1) <= 1 + 1e-5).all()
    assert imp.mix.shape == (8, 13, 13) and not imp.mix[:, :1].any() and not imp.mix[:, :, :1].any()


def test_polarity_needs_even_head_dim():
    with pytest.raises(ValueError, match="even"):
        ATTENTION["polarity"](12, 4, grid_size=(2, 2), num_prefix_tokens=0)


def test_polarity_large_activations_match_float64():
    # relu(x)^p with p up to 5 on activations 100x their scale: the stabilized fp32 core must
    # agree with the plain float64 formula.
    attn = make("polarity")
    x = 100 * torch.randn(2, 13, 32, dtype=torch.float64)
    with torch.no_grad():
        ref = polarity_reference(attn, x)
        got = attn.float()(x.float()).double()
    assert torch.isfinite(got).all()
    assert relative_error(got, ref) < 1e-3


# -- Agent attention -----------------------------------------------------------------------------------


def adaptive_avg_pool(grid, out):
    """AdaptiveAvgPool2d by its definition: bin i covers [floor(i I / O), ceil((i + 1) I / O))."""
    *lead, gh, gw = grid.shape
    rows = [(math.floor(i * gh / out), math.ceil((i + 1) * gh / out)) for i in range(out)]
    cols = [(math.floor(j * gw / out), math.ceil((j + 1) * gw / out)) for j in range(out)]
    res = torch.zeros(*lead, out, out, dtype=grid.dtype)
    for i, (r0, r1) in enumerate(rows):
        for j, (c0, c1) in enumerate(cols):
            res[..., i, j] = grid[..., r0:r1, c0:c1].mean(dim=(-2, -1))
    return res


def agent_reference(attn, x):
    """Agent attention (Han et al. 2024), DeiT version, written out:
    A = pool_7x7(Q_patches), out = softmax(Q A^T / sqrt(d) + B2) softmax(A K^T / sqrt(d) + B1) V
    + dwc3x3(V), prefix tokens taking the class-token biases (ac_bias, ca_bias) and no conv."""
    b, n, c = x.shape
    h, p0, na = attn.num_heads, attn.num_prefix_tokens, attn.agent_num
    gh, gw = attn.grid_size
    d = c // h
    q, k, v = qkv_heads(attn, x)
    side = math.isqrt(na)
    pooled = adaptive_avg_pool(q[:, p0:].transpose(1, 2).reshape(b, c, gh, gw), side)  # (B, C, side, side)
    agents = heads(pooled.reshape(b, c, na).transpose(1, 2), h)  # (B, H, n_a, D)
    q, k, v = heads(q, h), heads(k, h), heads(v, h)
    b1 = torch.zeros(h, na, n, dtype=x.dtype)
    b2 = torch.zeros(h, n, na, dtype=x.dtype)
    an = F.interpolate(attn.an_bias, size=(gh, gw), mode="bilinear")  # (H, 49, gh, gw)
    na_ = F.interpolate(attn.na_bias, size=(gh, gw), mode="bilinear")
    for t in range(n):
        if t < p0:
            b1[:, :, t] = attn.ac_bias[0, :, :, 0]
            b2[:, t, :] = attn.ca_bias[0, :, 0, :]
        else:
            r, col = divmod(t - p0, gw)
            b1[:, :, t] = an[:, :, r, col] + attn.ah_bias[0, :, :, r, 0] + attn.aw_bias[0, :, :, 0, col]
            b2[:, t, :] = na_[:, :, r, col] + attn.ha_bias[0, :, r, 0, :] + attn.wa_bias[0, :, 0, col, :]
    s_agent = torch.softmax(agents @ k.transpose(-1, -2) / math.sqrt(d) + b1, dim=-1)
    s_query = torch.softmax(q @ agents.transpose(-1, -2) / math.sqrt(d) + b2, dim=-1)
    o = s_query @ s_agent @ v
    grid = merge(v)[:, p0:].transpose(1, 2).reshape(b, c, gh, gw)  # channel = head * D + d
    conv = direct_depthwise(grid, attn.dwc.weight, attn.dwc.bias).reshape(b, c, gh * gw).transpose(1, 2)
    o = merge(o).clone()
    o[:, p0:] = o[:, p0:] + conv
    return attn.proj(o)


@pytest.mark.parametrize("grid,prefix,agents", [((3, 4), 1, 49), ((8, 8), 0, 49), ((10, 9), 2, 49),
                                                 ((14, 14), 1, 49), ((12, 11), 1, 81)])
def test_agent_matches_quadratic_reference(grid, prefix, agents):
    attn = make("agent", grid=grid, prefix=prefix, agent_num=agents)  # 81: DeiT-B's 9x9 agents
    x = torch.randn(2, prefix + grid[0] * grid[1], 32, dtype=torch.float64)
    with torch.no_grad():
        assert_matches(attn(x), agent_reference(attn, x))


def test_agent_defaults_official_shapes_and_init_are_the_pure_core():
    attn = ATTENTION["agent"](192, 3, qkv_bias=True, grid_size=(14, 14), num_prefix_tokens=1)
    assert attn.agent_num == 49 and attn.dwc.kernel_size == (3, 3) and attn.dwc.groups == 192
    # agent_deit.py's shapes for DeiT-T at 224 (window 14)
    shapes = {"an_bias": (3, 49, 7, 7), "na_bias": (3, 49, 7, 7), "ah_bias": (1, 3, 49, 14, 1),
              "aw_bias": (1, 3, 49, 1, 14), "ha_bias": (1, 3, 14, 1, 49), "wa_bias": (1, 3, 1, 14, 49),
              "ac_bias": (1, 3, 49, 1), "ca_bias": (1, 3, 1, 49)}
    for name, shape in shapes.items():
        param = getattr(attn, name)
        assert tuple(param.shape) == shape and not param.any()
    assert not attn.dwc.weight.any() and not attn.dwc.bias.any()
    # At init: two plain softmaxes through the pooled agents, nothing else.
    attn = ATTENTION["agent"](32, 4, qkv_bias=True, grid_size=(7, 7), num_prefix_tokens=1)
    x = torch.randn(2, 50, 32)
    with torch.no_grad():
        q, k, v = (heads(t, 4) for t in qkv_heads(attn, x))
        # a 7x7 grid pooled to 7x7 agents: the agents are the patch queries themselves
        a = q[:, :, 1:]
        out = torch.softmax(q @ a.transpose(-1, -2) / math.sqrt(8), -1) @ \
            torch.softmax(a @ k.transpose(-1, -2) / math.sqrt(8), -1) @ v
        torch.testing.assert_close(attn(x), attn.proj(merge(out)), rtol=1e-4, atol=1e-5)


def test_agent_implicit_rows_sum_to_one_and_conv_is_per_channel():
    attn = make("agent").float()
    imp = attn.implicit_attention(torch.randn(2, 13, 32))
    assert imp.attn.shape == (2, 4, 13, 13)
    torch.testing.assert_close(imp.attn.sum(-1), torch.ones(2, 4, 13), rtol=0, atol=1e-5)
    assert imp.mix.shape == (4, 8, 13, 13) and imp.bias.shape == (4, 8, 13)
    assert not imp.mix[:, :, :1].any() and not imp.bias[:, :, :1].any()


def test_agent_rejects_a_non_square_agent_count():
    with pytest.raises(ValueError, match="square"):
        ATTENTION["agent"](32, 4, grid_size=(3, 4), num_prefix_tokens=1, agent_num=10)


# -- both ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", ["polarity", "agent"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_large_activations_under_autocast_forward_and_backward_are_finite(variant, dtype):
    # Default (timm-like) projections, operator-specific parameters perturbed from their init.
    torch.manual_seed(0)
    attn = ATTENTION[variant](32, 4, qkv_bias=True, grid_size=(3, 4), num_prefix_tokens=1)
    with torch.no_grad():
        for name, p in attn.named_parameters():
            if not name.startswith(("qkv", "proj")):
                p.add_(0.1 * torch.randn_like(p))
    x = (100 * torch.randn(2, 13, 32)).requires_grad_()
    with torch.autocast("cpu", dtype=dtype):
        out = attn(x)
    out.float().sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(x.grad).all()
    if dtype == torch.bfloat16:
        # (fp16 weight gradients, sums over tokens of 100x inputs, may overflow fp16's range for
        # PolaFormer, whose gate makes the output quadratic in x: GradScaler's job, not the core's.)
        assert all(torch.isfinite(p.grad).all() for p in attn.parameters() if p.grad is not None)


@pytest.mark.parametrize("variant", ["polarity", "agent"])
@pytest.mark.parametrize("grid,prefix,qk_norm", [((2, 3), 0, False), ((4, 2), 2, True), ((6, 6), 1, False)])
def test_forward_equals_implicit_on_other_shapes(variant, grid, prefix, qk_norm):
    attn = make(variant, dim=16, heads=2, grid=grid, prefix=prefix, qk_norm=qk_norm).float()
    x = torch.randn(2, prefix + grid[0] * grid[1], 16)
    imp = attn.implicit_attention(x)
    with torch.no_grad():
        torch.testing.assert_close(attn.proj(imp.output()), attn(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("variant", ["polarity", "agent"])
def test_core_is_linear_in_tokens(variant):
    # No N x N tensor in the core: at 64x64 patches an N x N fp32 matrix per head would be
    # 4 x 4096^2 x 4 bytes = 268 MB; the core must not even come close.
    attn = ATTENTION[variant](32, 4, grid_size=(64, 64), num_prefix_tokens=0)
    q, k, v = (torch.randn(1, 4, 4096, 8) for _ in range(3))
    largest = []

    def pack(t):
        largest.append(t.numel())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        q.requires_grad_()
        attn.attend(q, k, v).sum().backward()
    assert max(largest) < 4096 * 4096 / 8
