"""torch.compile(fullgraph=True) traces every operator whole, forward and backward (the hand-written
autograd Functions included): no graph breaks, and the same values and gradients as eager."""

import pytest
import torch

from linvit.attention import available_variants
from test_attention import make

CASES = [(v, {}) for v in available_variants()] + [("rala", {"rope": True})]


def outputs_and_grads(fn, attn, x):
    attn.zero_grad(set_to_none=True)
    xi = x.clone().requires_grad_()
    out = fn(xi)
    (out * torch.linspace(-1, 1, out.shape[-1])).sum().backward()
    return [out, xi.grad] + [p.grad for p in attn.parameters()]


@pytest.mark.parametrize("variant,kw", CASES, ids=[v + "".join(f"-{k}" for k in kw) for v, kw in CASES])
def test_compile_fullgraph_forward_and_backward_equal_eager(variant, kw):
    attn = make(variant, **kw)
    x = torch.randn(2, 13, 32)
    eager = outputs_and_grads(attn, attn, x)
    torch._dynamo.reset()
    # aot_eager: dynamo (fullgraph raises on any graph break) and AOT autograd's traced backward,
    # without inductor's slow code generation.
    compiled = torch.compile(attn, backend="aot_eager", fullgraph=True)
    got = outputs_and_grads(compiled, attn, x)
    for i, (a, b) in enumerate(zip(got, eager)):
        assert a is not None, f"tensor {i} has no gradient"
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=f"tensor {i}")
