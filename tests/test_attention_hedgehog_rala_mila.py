"""Hedgehog, RALA and MILA against straightforward O(N^2) float64 re-implementations of the papers'
formulas (written from the papers and official code, not from the operator classes)."""

import math

import pytest
import torch
import torch.nn.functional as F

from linvit.attention import ATTENTION
from linvit.models import build_vit, swap_attention

DIM, HEADS, GRID = 32, 4, (3, 4)


def make(variant, prefix=1, perturb=True, seed=0, **kw):
    torch.manual_seed(seed)
    attn = ATTENTION[variant](DIM, HEADS, qkv_bias=True, grid_size=GRID, num_prefix_tokens=prefix, **kw)
    if perturb:
        with torch.no_grad():
            for name, p in attn.named_parameters():
                if not name.startswith(("qkv", "proj")):
                    p.add_(0.1 * torch.randn_like(p))
    return attn.eval()


def qkv64(attn, x):
    """q, k, v (B, H, N, D) in float64 from the operator's own qkv weights."""
    b, n, c = x.shape
    w, bias = attn.qkv.weight.double(), attn.qkv.bias.double()
    qkv = (x.double() @ w.T + bias).reshape(b, n, 3, HEADS, c // HEADS).permute(2, 0, 3, 1, 4)
    return qkv[0], qkv[1], qkv[2]


def finish(attn, out, x, gate=None):
    """(B, H, N, D) heads -> proj(merge(out) * gate)."""
    b, h, n, d = out.shape
    out = out.transpose(1, 2).reshape(b, n, h * d)
    if gate is not None:
        out = out * gate
    return out @ attn.proj.weight.double().T + attn.proj.bias.double()


def lepe64(conv, v, prefix, grid):
    """Depthwise conv (zero padding) on the patch grid written as explicit shifted sums."""
    b, h, n, d = v.shape
    gh, gw = grid
    w = conv.weight.double()[:, 0]  # (C, k, k)
    ks = w.shape[-1]
    pad = ks // 2
    img = v[:, :, prefix:].reshape(b, h, gh, gw, d).permute(0, 1, 4, 2, 3).reshape(b, h * d, gh, gw)
    padded = F.pad(img, (pad, pad, pad, pad))
    out = conv.bias.double()[None, :, None, None].expand(b, h * d, gh, gw).clone()
    for u in range(ks):
        for s in range(ks):
            out = out + w[None, :, u, s, None, None] * padded[:, :, u:u + gh, s:s + gw]
    out = out.reshape(b, h, d, gh * gw).transpose(-1, -2)
    full = torch.zeros_like(v)
    full[:, :, prefix:] = out
    return full


def grid_positions(grid):
    gh, gw = grid
    rows = torch.tensor([i for i in range(gh) for _ in range(gw)], dtype=torch.float64)
    cols = torch.tensor([j for _ in range(gh) for j in range(gw)], dtype=torch.float64)
    return rows, cols


# -- Hedgehog --------------------------------------------------------------------------------------

def hedgehog_reference(attn, x, activation="exp"):
    q, k, v = qkv64(attn, x)

    def phi(t, w, b):
        z = torch.einsum("bhnd,hde->bhne", t, w.double()) + b.double()[None, :, None, :]
        if activation == "exp":
            return torch.cat([torch.exp(z), torch.exp(-z)], dim=-1)
        if activation == "softmax":
            return torch.softmax(torch.cat([z, -z], dim=-1), dim=-1)
        return torch.cat([torch.softmax(z, dim=-1), torch.softmax(-z, dim=-1)], dim=-1)

    fq = phi(q, attn.fmap_q_weight, attn.fmap_q_bias)
    fk = phi(k, attn.fmap_k_weight, attn.fmap_k_bias)
    a = fq @ fk.transpose(-2, -1)
    a = a / a.sum(dim=-1, keepdim=True)
    return finish(attn, a @ v, x)


@pytest.mark.parametrize("activation", ["exp", "softmax", "softmax_halves"])
@pytest.mark.parametrize("perturb", [False, True], ids=["init", "perturbed"])
def test_hedgehog_matches_reference(activation, perturb):
    attn = make("hedgehog", perturb=perturb, activation=activation)
    x = torch.randn(2, 13, DIM)
    with torch.no_grad():
        torch.testing.assert_close(attn(x).double(), hedgehog_reference(attn, x, activation),
                                   rtol=1e-4, atol=1e-5)


def test_hedgehog_exact_on_large_activations():
    # 30x the usual scale: exp(+-z) overflows fp32 if formed raw; float64 reference does not.
    attn = make("hedgehog")
    x = 30 * torch.randn(2, 13, DIM)
    with torch.no_grad():
        got = attn(x).double()
        ref = hedgehog_reference(attn, x)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, ref, rtol=1e-3, atol=1e-3 * ref.abs().max().item())


def test_hedgehog_feature_maps_start_as_identity_and_survive_swap():
    model = build_vit("micro", num_classes=10, img_size=28, in_chans=1, variant="hedgehog")
    attn = model.blocks[0].attn
    eye = torch.eye(attn.head_dim).expand_as(attn.fmap_q_weight)
    for w in (attn.fmap_q_weight, attn.fmap_k_weight):
        torch.testing.assert_close(w.detach(), eye)
    assert attn.fmap_q_bias.abs().max() == 0 and attn.fmap_k_bias.abs().max() == 0


# -- RALA ------------------------------------------------------------------------------------------

def rala_rope64(x, grid, prefix):
    """Official RAVLT RoPE (theta_shift) on (B, H, N, D) patch tokens; prefix tokens untouched."""
    d = x.shape[-1]
    angle = 1.0 / (10000 ** torch.linspace(0, 1, d // 4, dtype=torch.float64))
    angle = angle.unsqueeze(-1).repeat(1, 2).flatten()  # (D/2)
    rows, cols = grid_positions(grid)
    sin = torch.cat([torch.sin(rows[:, None] * angle), torch.sin(cols[:, None] * angle)], -1)
    cos = torch.cat([torch.cos(rows[:, None] * angle), torch.cos(cols[:, None] * angle)], -1)
    p = x[:, :, prefix:]
    rot = torch.stack([-p[..., 1::2], p[..., 0::2]], dim=-1).flatten(-2)
    out = x.clone()
    out[:, :, prefix:] = p * cos + rot * sin
    return out


def rala_reference(attn, x, prefix, core_only=False, rope=False):
    q, k, v = qkv64(attn, x)
    n, d = q.shape[-2], q.shape[-1]
    fq, fk = F.elu(q) + 1, F.elu(k) + 1
    qbar = fq.mean(dim=-2, keepdim=True)
    alpha = torch.softmax(qbar @ fk.transpose(-2, -1) / math.sqrt(d), dim=-1).transpose(-2, -1) * n
    fk = fk * alpha
    if rope:
        num = rala_rope64(fq, GRID, prefix) @ rala_rope64(fk, GRID, prefix).transpose(-2, -1)
        den = (fq @ fk.transpose(-2, -1)).sum(dim=-1, keepdim=True)
        out = (num / den) @ v
    else:
        a = fq @ fk.transpose(-2, -1)
        out = (a / a.sum(dim=-1, keepdim=True)) @ v
    if core_only:
        return finish(attn, out, x)
    out = out + lepe64(attn.lepe.conv, v, prefix, GRID)
    gate = x.double() @ attn.gate_weight.double().T + attn.gate_bias.double()
    return finish(attn, out, x, gate)


@pytest.mark.parametrize("rope", [False, True], ids=["plain", "rope"])
@pytest.mark.parametrize("prefix", [0, 1, 2])
def test_rala_matches_reference(prefix, rope):
    attn = make("rala", prefix=prefix, rope=rope)
    x = torch.randn(2, prefix + 12, DIM)
    with torch.no_grad():
        torch.testing.assert_close(attn(x).double(), rala_reference(attn, x, prefix, rope=rope),
                                   rtol=1e-4, atol=1e-5)


def test_rala_starts_as_its_pure_core():
    attn = make("rala", perturb=False)
    x = torch.randn(2, 13, DIM)
    with torch.no_grad():
        assert (attn.gate(x) == 1).all()
        torch.testing.assert_close(attn(x).double(), rala_reference(attn, x, 1, core_only=True),
                                   rtol=1e-4, atol=1e-5)


def test_rala_init_survives_swap():
    model = build_vit("micro", num_classes=10, img_size=28, in_chans=1, variant="rala")
    attn = model.blocks[0].attn
    assert attn.gate_weight.abs().max() == 0 and (attn.gate_bias == 1).all()
    assert attn.lepe.conv.weight.abs().max() == 0 and attn.lepe.conv.bias.abs().max() == 0


# -- MILA ------------------------------------------------------------------------------------------

def mila_rope64(x, grid, prefix, heads):
    """Official MLLA RoPE: over the merged channels C (all heads), as complex pairs."""
    b, h, n, d = x.shape
    c = h * d
    k_max = c // 4
    theta = 1.0 / (10000 ** (torch.arange(k_max, dtype=torch.float64) / k_max))
    rows, cols = grid_positions(grid)
    angles = torch.cat([rows[:, None] * theta, cols[:, None] * theta], dim=-1)  # (P, C/2)
    rotations = torch.polar(torch.ones_like(angles), angles)
    merged = x.transpose(1, 2).reshape(b, n, c)
    patches = torch.view_as_complex(merged[:, prefix:].reshape(b, n - prefix, c // 2, 2).contiguous())
    out = merged.clone()
    out[:, prefix:] = torch.view_as_real(patches * rotations).reshape(b, n - prefix, c)
    return out.reshape(b, n, h, d).transpose(1, 2)


def mila_reference(attn, x, prefix, core_only=False):
    q, k, v = qkv64(attn, x)
    n = q.shape[-2]
    fq, fk = F.elu(q) + 1, F.elu(k) + 1
    num = mila_rope64(fq, GRID, prefix, HEADS) @ mila_rope64(fk, GRID, prefix, HEADS).transpose(-2, -1) / n
    den = fq @ fk.mean(dim=-2).unsqueeze(-1) + 1e-6
    out = (num / den) @ v
    if not core_only:
        out = out + lepe64(attn.lepe.conv, v, prefix, GRID)
    return finish(attn, out, x)


@pytest.mark.parametrize("prefix", [0, 1, 2])
def test_mila_matches_reference(prefix):
    attn = make("mila", prefix=prefix)
    x = torch.randn(2, prefix + 12, DIM)
    with torch.no_grad():
        torch.testing.assert_close(attn(x).double(), mila_reference(attn, x, prefix), rtol=1e-4, atol=1e-5)


def test_mila_starts_as_its_pure_core():
    attn = make("mila", perturb=False)
    assert attn.lepe.conv.weight.abs().max() == 0 and attn.lepe.conv.bias.abs().max() == 0
    x = torch.randn(2, 13, DIM)
    with torch.no_grad():
        torch.testing.assert_close(attn(x).double(), mila_reference(attn, x, 1, core_only=True),
                                   rtol=1e-4, atol=1e-5)


def test_mila_rotary_scores_depend_on_relative_position_only():
    # The numerator's score between a query and a key at patch positions shifted together is
    # unchanged: R_i^T R_j depends on (row_j - row_i, col_j - col_i).
    attn = make("mila", prefix=0)
    torch.manual_seed(1)
    fq, fk = torch.rand(1, HEADS, 1, DIM // HEADS), torch.rand(1, HEADS, 1, DIM // HEADS)
    p = GRID[0] * GRID[1]

    def score(i, j):
        q = torch.zeros(1, HEADS, p, DIM // HEADS)
        k = torch.zeros(1, HEADS, p, DIM // HEADS)
        q[:, :, i], k[:, :, j] = fq[:, :, 0], fk[:, :, 0]
        return (attn._rope(q)[:, :, i] * attn._rope(k)[:, :, j]).sum(-1)

    gw = GRID[1]
    torch.testing.assert_close(score(0 * gw + 0, 1 * gw + 2), score(1 * gw + 1, 2 * gw + 3), rtol=1e-5, atol=1e-6)


def test_mila_implicit_matrix_is_signed():
    attn = make("mila")
    assert not attn.row_normalized
    # elu+1 features are positive, but rotated products change sign: the matrix is signed.
    torch.manual_seed(0)
    a = attn.implicit_attention(3 * torch.randn(4, 13, DIM)).attn
    assert torch.isfinite(a).all() and (a < 0).any()
    maps = attn.attention_maps(torch.randn(2, 13, DIM))
    assert (maps >= 0).all()


def test_swapped_models_run():
    for variant in ("hedgehog", "rala", "mila"):
        model = build_vit("micro", num_classes=10, img_size=28, in_chans=1)
        swap_attention(model, variant)
        out = model(torch.randn(2, 1, 28, 28))
        assert out.shape == (2, 10) and torch.isfinite(out).all()
