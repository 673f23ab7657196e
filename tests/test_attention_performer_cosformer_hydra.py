"""Performer (FAVOR+), cosFormer and Hydra attention against O(N^2) re-implementations of the papers'
formulas, written here from the papers (not from the operators' code), plus operator-specific
properties."""

import math

import pytest
import torch

from linvit.attention import ATTENTION
from linvit.models import build_vit, swap_attention


def make(variant, dim=32, heads=4, grid=(3, 4), prefix=1, **kw):
    torch.manual_seed(0)
    return ATTENTION[variant](dim, heads, qkv_bias=True, grid_size=grid, num_prefix_tokens=prefix, **kw).eval()


def heads_of(attn, x, heads):
    """q, k, v as (B, H, N, D) from the module's own qkv weights, timm's layout."""
    b, n, c = x.shape
    qkv = x @ attn.qkv.weight.T + attn.qkv.bias
    q, k, v = qkv.reshape(b, n, 3, heads, c // heads).permute(2, 0, 3, 1, 4)
    return q, k, v


def project(attn, per_head):
    b, h, n, d = per_head.shape
    return per_head.transpose(1, 2).reshape(b, n, h * d) @ attn.proj.weight.T + attn.proj.bias


# -- Performer ------------------------------------------------------------------------------------

def favor_quadratic(q, k, v, w, kernel_eps=1e-4):
    """FAVOR+ written out: positive random features of the d^-1/4-scaled q, k, with the official
    stabilizer (query max per token, key max over the head), the full N x N matrix, row-normalized."""
    d = q.shape[-1]
    m = w.shape[0]
    out = torch.empty_like(v)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            qs, ks = q[b, h] / d ** 0.25, k[b, h] / d ** 0.25
            wq, wk = qs @ w.T, ks @ w.T  # (N, m)
            fq = (torch.exp(wq - (qs ** 2).sum(-1, keepdim=True) / 2 - wq.max(-1, keepdim=True).values)
                  + kernel_eps) / math.sqrt(m)
            fk = (torch.exp(wk - (ks ** 2).sum(-1, keepdim=True) / 2 - wk.max()) + kernel_eps) / math.sqrt(m)
            a = fq @ fk.T
            out[b, h] = (a / a.sum(-1, keepdim=True)) @ v[b, h]
    return out


def test_performer_matches_quadratic_favor():
    attn = make("performer")
    x = torch.randn(2, 13, 32)
    with torch.no_grad():
        q, k, v = heads_of(attn, x, 4)
        expected = project(attn, favor_quadratic(q, k, v, attn.projection))
        torch.testing.assert_close(attn(x), expected, rtol=1e-4, atol=1e-5)


def test_performer_feature_count_and_orthogonal_blocks():
    for d, m in [(64, 266), (32, 111), (16, 44), (8, 17)]:
        attn = ATTENTION["performer"](d * 2, 2, grid_size=(2, 2))
        w = attn.projection
        assert w.shape == (m, d) and attn.nb_features == round(d * math.log(d))
        # Rows of each d x d block are orthogonal; their norms are chi(d)-distributed (not all equal).
        for start in range(0, m, d):
            block = w[start:start + d]
            unit = block / block.norm(dim=1, keepdim=True)
            torch.testing.assert_close(unit @ unit.T, torch.eye(len(block)), rtol=0, atol=1e-5)
        assert w.norm(dim=1).std() > 0.05


def test_performer_projection_is_a_seeded_persistent_buffer():
    a = ATTENTION["performer"](64, 4, grid_size=(2, 2))
    torch.manual_seed(123)  # the global RNG does not matter
    b = ATTENTION["performer"](64, 4, grid_size=(2, 2))
    c = ATTENTION["performer"](64, 4, grid_size=(2, 2), feature_seed=1)
    assert torch.equal(a.projection, b.projection) and not torch.equal(a.projection, c.projection)
    assert "projection" in a.state_dict() and "projection" not in dict(a.named_parameters())
    c.load_state_dict(a.state_dict())
    assert torch.equal(c.projection, a.projection)


def test_performer_approximates_softmax_attention_with_many_features():
    torch.manual_seed(0)
    q, k, v = torch.randn(3, 1, 2, 64, 8).unbind(0)
    q, k = 0.5 * q, 0.5 * k
    exact = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8), dim=-1) @ v
    attn = ATTENTION["performer"](16, 2, grid_size=(8, 8), num_prefix_tokens=0, nb_features=8192, kernel_eps=0.0)
    approx = attn.attend(q, k, v)
    assert (approx - exact).abs().max() < 0.05
    # With the default d ln d features it is a rough approximation, still correlated with softmax.
    small = ATTENTION["performer"](16, 2, grid_size=(8, 8), num_prefix_tokens=0).attend(q, k, v)
    assert torch.corrcoef(torch.stack([small.flatten(), exact.flatten()]))[0, 1] > 0.5


def test_performer_stabilizer_is_exact_without_kernel_eps():
    """With kernel_eps = 0 the max subtractions cancel: plain exp(w.x - |x|^2/2) random features."""
    attn = make("performer", kernel_eps=0.0)
    torch.manual_seed(1)
    q, k, v = torch.randn(3, 2, 4, 13, 8).unbind(0)
    w = attn.projection
    s = 8 ** -0.25
    fq = torch.exp(s * q @ w.T - (s * q).pow(2).sum(-1, keepdim=True) / 2)
    fk = torch.exp(s * k @ w.T - (s * k).pow(2).sum(-1, keepdim=True) / 2)
    a = fq @ fk.transpose(-2, -1)
    torch.testing.assert_close(attn.attend(q, k, v), (a / a.sum(-1, keepdim=True)) @ v, rtol=1e-4, atol=1e-5)


# -- cosFormer ------------------------------------------------------------------------------------

def cosformer_quadratic(q, k, v, grid, prefix, eps=1e-6):
    """relu(q) relu(k)^T re-weighted by cos(pi/2 dr/gh) cos(pi/2 dc/gw) on the patch grid (prefix
    tokens at the grid centre), normalized by max(row sum, eps)."""
    gh, gw = grid
    pos = [((gh - 1) / 2, (gw - 1) / 2)] * prefix + [(p // gw, p % gw) for p in range(gh * gw)]
    n = len(pos)
    w = torch.tensor([[math.cos(math.pi / 2 * (pos[i][0] - pos[j][0]) / gh)
                       * math.cos(math.pi / 2 * (pos[i][1] - pos[j][1]) / gw) for j in range(n)] for i in range(n)])
    s = torch.relu(q) @ torch.relu(k).transpose(-2, -1) * w
    return (s / s.sum(-1, keepdim=True).clamp_min(eps)) @ v, w


@pytest.mark.parametrize("grid,prefix", [((3, 4), 1), ((4, 4), 0), ((2, 5), 2)])
def test_cosformer_matches_quadratic_reweighting(grid, prefix):
    attn = make("cosformer", grid=grid, prefix=prefix)
    n = prefix + grid[0] * grid[1]
    x = torch.randn(2, n, 32)
    with torch.no_grad():
        q, k, v = heads_of(attn, x, 4)
        out, w = cosformer_quadratic(q, k, v, grid, prefix)
        torch.testing.assert_close(attn(x), project(attn, out), rtol=1e-4, atol=1e-5)
    assert (w > 0).all() and (w <= 1 + 1e-6).all()
    if prefix:
        assert (w[:prefix, prefix:] >= 0.5 - 1e-6).all()  # the centre sees every patch


def test_cosformer_on_one_row_is_the_papers_1d_form():
    """A 1 x N grid without prefix tokens: the official 1D cosFormer, indices 1..N and M = N."""
    n = 10
    attn = make("cosformer", grid=(1, n), prefix=0)
    torch.manual_seed(2)
    q, k, v = torch.randn(3, 2, 4, n, 8).unbind(0)
    idx = math.pi / 2 * torch.arange(1, n + 1).reshape(n, 1) / n
    fq = torch.cat([torch.relu(q) * idx.sin(), torch.relu(q) * idx.cos()], dim=-1)
    fk = torch.cat([torch.relu(k) * idx.sin(), torch.relu(k) * idx.cos()], dim=-1)
    kv = torch.einsum("bhnd,bhnm->bhdm", fk, v)
    z = 1 / torch.einsum("bhnd,bhd->bhn", fq, fk.sum(-2)).clamp_min(1e-6)
    expected = torch.einsum("bhnd,bhdm,bhn->bhnm", fq, kv, z)
    torch.testing.assert_close(attn.attend(q, k, v), expected, rtol=1e-4, atol=1e-5)


def test_cosformer_is_positional_and_needs_a_grid():
    assert ATTENTION["cosformer"].positional
    with pytest.raises(ValueError, match="grid_size"):
        ATTENTION["cosformer"](32, 4, grid_size=None)


# -- Hydra ----------------------------------------------------------------------------------------

def hydra_quadratic(x, attn):
    """One head per channel: A_c[i, j] = q^_ic k^_jc with q, k L2-normalized over the channels."""
    qkv = x @ attn.qkv.weight.T + attn.qkv.bias
    q, k, v = qkv.chunk(3, dim=-1)  # (B, N, C) each
    q = q / q.norm(dim=-1, keepdim=True)
    k = k / k.norm(dim=-1, keepdim=True)
    b, n, c = q.shape
    out = torch.zeros(b, n, c)
    for ch in range(c):
        a = q[:, :, ch, None] * k[:, None, :, ch]  # (B, N, N)
        out[:, :, ch] = (a @ v[:, :, ch, None]).squeeze(-1)
    return out @ attn.proj.weight.T + attn.proj.bias


def test_hydra_matches_quadratic_channel_heads():
    attn = make("hydra")
    x = torch.randn(2, 13, 32)
    with torch.no_grad():
        torch.testing.assert_close(attn(x), hydra_quadratic(x, attn), rtol=1e-4, atol=1e-5)


def test_hydra_is_the_papers_algorithm_and_has_no_extra_parameters():
    attn = make("hydra")
    assert {n for n, _ in attn.named_parameters()} == {"qkv.weight", "qkv.bias", "proj.weight", "proj.bias"}
    x = torch.randn(2, 13, 32)
    with torch.no_grad():
        q, k, v = attn.qkv(x).chunk(3, dim=-1)
        q, k = q / q.norm(dim=-1, keepdim=True), k / k.norm(dim=-1, keepdim=True)
        out = q * (k * v).sum(dim=-2, keepdim=True)
        torch.testing.assert_close(attn(x), attn.proj(out), rtol=1e-4, atol=1e-5)


def test_hydra_implicit_matrices_are_per_channel_and_grouped_by_teacher_head():
    attn = make("hydra")
    x = torch.randn(2, 13, 32)
    imp = attn.implicit_attention(x)
    assert imp.attn.shape == (2, 4, 8, 13, 13) and imp.maps().shape == (2, 4, 13, 13)
    with torch.no_grad():
        q, k, _ = attn.qkv(x).chunk(3, dim=-1)
        q, k = q / q.norm(dim=-1, keepdim=True), k / k.norm(dim=-1, keepdim=True)
    c = 13  # channel 13 = head 1, group 5
    torch.testing.assert_close(imp.attn[:, 1, 5], q[:, :, c, None] * k[:, None, :, c])


# -- all three --------------------------------------------------------------------------------------

@pytest.mark.parametrize("variant", ["performer", "cosformer", "hydra"])
def test_swapped_vit_trains_and_copies_only_qkv_proj(variant):
    model = build_vit("micro", num_classes=10, img_size=28, in_chans=1)
    teacher = {n: p.shape for n, p in model.blocks[0].attn.named_parameters()}
    swap_attention(model, variant)
    student = {n: p.shape for n, p in model.blocks[0].attn.named_parameters()}
    assert student == teacher  # qkv and proj only: nothing operator-specific to initialize
    out = model(torch.randn(2, 1, 28, 28))
    out.sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters() if p.requires_grad)


@pytest.mark.parametrize("variant", ["performer", "cosformer", "hydra"])
def test_core_is_finite_in_fp32_on_very_large_activations(variant):
    attn = make(variant)
    q, k, v = (1000 * torch.randn(3, 2, 4, 13, 8)).unbind(0)
    if variant == "hydra":
        q, k, v = (t.transpose(1, 3).reshape(2, 32, 13, 1) for t in (q, k, v))
    assert torch.isfinite(attn.attend(q, k, v)).all()
