"""Every operator's module, outputs and gradients (input and every parameter), against a plain
quadratic reference of its paper's formula that shares none of the operator's fast path (contiguous
head copies, fused feature maps, hand-written backwards, channels-last convolutions).

The references of the other operator tests (written there from the papers, not from the operator
classes) are reused here as differentiable functions of the module's own parameters; elu, relu,
focused and performer are written out below."""

import math

import pytest
import torch
import torch.nn.functional as F

import test_attention_hedgehog_rala_mila as hrm
import test_attention_performer_cosformer_hydra as pch
import test_attention_polarity_agent as pa
from linvit.attention import ATTENTION

DIM, HEADS = 32, 4


def make(variant, grid, prefix, **kw):
    """A float64 module with every parameter away from its init (so every term carries a gradient)."""
    torch.manual_seed(0)
    attn = ATTENTION[variant](DIM, HEADS, qkv_bias=True, grid_size=grid, num_prefix_tokens=prefix, **kw)
    attn = attn.double()
    with torch.no_grad():
        for name, p in attn.named_parameters():
            if name.startswith(("qkv", "proj")):
                p.copy_(0.3 * torch.randn_like(p))
            else:
                p.add_(0.2 * torch.randn_like(p))
    return attn


def heads(t):  # (B, N, C) -> (B, H, N, D)
    b, n, c = t.shape
    return t.reshape(b, n, HEADS, c // HEADS).transpose(1, 2)


def merge(t):  # (B, H, N, D) -> (B, N, C)
    b, h, n, d = t.shape
    return t.transpose(1, 2).reshape(b, n, h * d)


def qkv(attn, x):
    return (x @ attn.qkv.weight.T + attn.qkv.bias).chunk(3, dim=-1)


def kernel_reference(fq, fk, v, eps):
    """sum_j fq_i.fk_j v_j / n / (sum_j fq_i.fk_j / n + eps), the N x N matrix written out."""
    s = fq @ fk.transpose(-2, -1) / fk.shape[-2]
    return (s / (s.sum(-1, keepdim=True) + eps)) @ v


def elu_reference(attn, x, grid, prefix):
    q, k, v = (heads(t) for t in qkv(attn, x))
    return attn.proj(merge(kernel_reference(F.elu(q) + 1, F.elu(k) + 1, v, 1e-6)))


def relu_reference(attn, x, grid, prefix):
    q, k, v = (heads(t) for t in qkv(attn, x))
    return attn.proj(merge(kernel_reference(torch.relu(q), torch.relu(k), v, 1e-15)))


def focused_reference(attn, x, grid, prefix):
    """FLatten: phi(x) = |x'| x'^3 / |x'^3| over all C channels, x' = (relu(x) + 1e-6) / softplus(s),
    a positional term on the patch keys, and a 5x5 depthwise conv of each head's V (shared filters)."""
    q, k, v = qkv(attn, x)
    k = torch.cat([k[:, :prefix], k[:, prefix:] + attn.positional_encoding[0]], dim=1)
    s = F.softplus(attn.scale).reshape(-1)

    def phi(t):
        t = (torch.relu(t) + 1e-6) / s
        return t.norm(dim=-1, keepdim=True) * t ** 3 / (t ** 3).norm(dim=-1, keepdim=True)

    v = heads(v)
    out = kernel_reference(heads(phi(q)), heads(phi(k)), v, 1e-6)
    b, gh, gw = x.shape[0], *grid
    img = v[:, :, prefix:].reshape(b * HEADS, gh, gw, -1).permute(0, 3, 1, 2)
    conv = pa.direct_depthwise(img, attn.dwc.weight, attn.dwc.bias).permute(0, 2, 3, 1)
    out = torch.cat([out[:, :, :prefix], out[:, :, prefix:] + conv.reshape(b, HEADS, gh * gw, -1)], dim=2)
    return attn.proj(merge(out))


def performer_reference(attn, x, grid, prefix):
    """FAVOR+ with the official stabilizers (maxima taken as constants, as the operator documents)."""
    q, k, v = (heads(t) for t in qkv(attn, x))
    d, w = q.shape[-1], attn.projection.double()
    m = w.shape[0]

    def phi(t, dims):
        t = t / d ** 0.25
        z = t @ w.T
        stab = z.detach().amax(dim=dims, keepdim=True)
        return (torch.exp(z - (t * t).sum(-1, keepdim=True) / 2 - stab) + 1e-4) / math.sqrt(m)

    a = phi(q, (-1,)) @ phi(k, (-2, -1)).transpose(-2, -1)
    return attn.proj(merge((a / a.sum(-1, keepdim=True)) @ v))


def cosformer_reference(attn, x, grid, prefix):
    q, k, v = (heads(t) for t in qkv(attn, x))
    out, _ = pch.cosformer_quadratic(q, k, v, grid, prefix)
    return attn.proj(merge(out))


REFERENCES = {
    "elu": elu_reference,
    "relu": relu_reference,
    "focused": focused_reference,
    "performer": performer_reference,
    "cosformer": cosformer_reference,
    "hedgehog": lambda attn, x, grid, prefix: hrm.hedgehog_reference(attn, x),
    "rala": lambda attn, x, grid, prefix: hrm.rala_reference(attn, x, prefix),
    "mila": lambda attn, x, grid, prefix: hrm.mila_reference(attn, x, prefix),
    "polarity": lambda attn, x, grid, prefix: pa.polarity_reference(attn, x),
    "agent": lambda attn, x, grid, prefix: pa.agent_reference(attn, x),
}
# hrm's references read its module constants (heads, grid): they agree with these.
assert (hrm.DIM, hrm.HEADS) == (DIM, HEADS)


def outputs_and_grads(fn, attn, x, upstream):
    attn.zero_grad(set_to_none=True)
    xi = x.clone().requires_grad_()
    out = fn(xi)
    out.backward(upstream)
    return [out.detach(), xi.grad] + [p.grad if p.grad is not None else torch.zeros_like(p)
                                      for p in attn.parameters()]


@pytest.mark.parametrize("prefix", [0, 1])
@pytest.mark.parametrize("variant", sorted(REFERENCES))
def test_module_outputs_and_gradients_equal_the_quadratic_reference(variant, prefix):
    grid = hrm.GRID if variant in ("hedgehog", "rala", "mila") else (4, 3)
    if variant == "hedgehog" and prefix == 0:
        pytest.skip("hedgehog has no patch-grid term: one prefix setting covers it")
    attn = make(variant, grid, prefix)
    torch.manual_seed(1)
    x = torch.randn(2, prefix + grid[0] * grid[1], DIM, dtype=torch.float64)
    upstream = torch.randn_like(x)
    got = outputs_and_grads(attn, attn, x, upstream)
    want = outputs_and_grads(lambda xi: REFERENCES[variant](attn, xi, grid, prefix), attn, x, upstream)
    names = ["output", "input grad"] + [f"grad of {n}" for n, _ in attn.named_parameters()]
    for name, g, w in zip(names, got, want):
        err = ((g - w).abs().max() / w.abs().max().clamp_min(1e-300)).item()
        # float64 throughout, but cosFormer's reference builds its cos weights in fp32: 1e-6 of the
        # scale is far below any error in a formula and above that rounding.
        assert err < 1e-6, f"{variant}: {name} deviates from the reference by {err:.1e} of its scale"


def test_hydra_outputs_and_gradients_equal_the_channel_head_reference():
    """Hydra's reference builds its output in fp32 (one channel-head at a time)."""
    torch.manual_seed(0)
    attn = ATTENTION["hydra"](DIM, HEADS, qkv_bias=True, grid_size=(4, 3), num_prefix_tokens=1)
    x = torch.randn(2, 13, DIM)
    upstream = torch.randn_like(x)
    got = outputs_and_grads(attn, attn, x, upstream)
    want = outputs_and_grads(lambda xi: pch.hydra_quadratic(xi, attn), attn, x, upstream)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-5)
