"""linvit.onednn: linear layers through oneDNN agree with F.linear, forward and backward, and step
aside wherever F.linear itself is needed; Runtime.place applies them as runtime.cpu_linear says."""

import contextlib
import copy

import pytest
import torch
import torch.fx
from torch import nn

from linvit import onednn
from linvit.device import Runtime, resolve_cpu_linear, runtime
from linvit.models import build_vit

pytestmark = pytest.mark.skipif(not onednn.available(), reason="oneDNN's linear op needs an x86-64 CPU build")
CPU = torch.device("cpu")


def _grads(fn, x, w, b, gy):
    x, w = x.detach().requires_grad_(), w.detach().requires_grad_()
    b = None if b is None else b.detach().requires_grad_()
    y = fn(x, w, b)
    y.backward(gy)
    return [y.detach(), x.grad, w.grad] + ([] if b is None else [b.grad])


@pytest.mark.parametrize("shape", [(37, 24), (3, 13, 24), (2, 3, 5, 24)])
@pytest.mark.parametrize("out_features", [8, 64])  # both sides of the weight gradient's operand choice
@pytest.mark.parametrize("bias", [True, False])
def test_linear_matches_f_linear_forward_and_backward(shape, out_features, bias):
    torch.manual_seed(0)
    x, w = torch.randn(*shape), torch.randn(out_features, shape[-1])
    b = torch.randn(out_features) if bias else None
    gy = torch.randn(*shape[:-1], out_features)
    exact = _grads(lambda *a: torch.nn.functional.linear(*a), x.double(), w.double(),
                   None if b is None else b.double(), gy.double())
    ours = _grads(onednn.linear, x, w, b, gy)
    for name, got, want in zip(["y", "grad x", "grad w", "grad b"], ours, exact):
        assert got.dtype == torch.float32 and got.shape == want.shape, name
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5, msg=name)


def test_linear_takes_strided_inputs():
    torch.manual_seed(0)
    x = torch.randn(24, 37).t()  # (37, 24), not contiguous
    w = torch.randn(48, 24)
    torch.testing.assert_close(onednn.linear(x, w), torch.nn.functional.linear(x, w), rtol=1e-5, atol=1e-5)


def test_expanded_inputs_and_gradients():
    """A stride-0 input (expand) and the stride-0 gradient of y.sum() give F.linear's gradients."""
    torch.manual_seed(0)
    x0, w, b = torch.randn(1, 3, 24), torch.randn(40, 24), torch.randn(40)
    grads = []
    for fn in (torch.nn.functional.linear, onednn.linear):
        leaf, weight = x0.clone().requires_grad_(), w.clone().requires_grad_()
        fn(leaf.expand(5, 3, 24), weight, b).sum().backward()
        grads.append((leaf.grad, weight.grad))
    for got, want in zip(grads[1], grads[0]):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


def test_linear_needs_only_the_gradients_asked_for():
    x, w = torch.randn(5, 4), torch.randn(3, 4, requires_grad=True)
    onednn.linear(x, w).sum().backward()
    assert w.grad is not None and x.grad is None


def test_applies_only_where_f_linear_is_not_needed():
    x, w = torch.randn(4, 3), torch.randn(2, 3)
    assert onednn.applies(x, w, None)
    assert not onednn.applies(x.double(), w.double(), None)
    assert not onednn.applies(torch.randn(0, 3), w, None)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert not onednn.applies(x, w, None)


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))


def test_use_onednn_keeps_parameters_state_and_isinstance():
    model = _mlp()
    params, state = list(model.parameters()), copy.deepcopy(model.state_dict())
    assert onednn.use_onednn(model) is model
    assert all(type(m) is onednn.Linear for m in (model[0], model[2]))
    assert all(isinstance(m, nn.Linear) for m in (model[0], model[2]))
    assert all(a is b for a, b in zip(model.parameters(), params))
    assert all(torch.equal(state[k], v) for k, v in model.state_dict().items()) and state.keys() == model.state_dict().keys()


def test_use_onednn_leaves_linear_subclasses_alone():
    class Other(nn.Linear):
        pass

    model = nn.Sequential(Other(3, 3))
    onednn.use_onednn(model)
    assert type(model[0]) is Other


def test_swapped_model_trains_as_before():
    """One AdamW step through oneDNN gives the parameters the native step gives, to rounding."""
    torch.manual_seed(1)
    x, y = torch.randn(32, 8), torch.randint(0, 4, (32,))
    native = _mlp()
    fast = onednn.use_onednn(copy.deepcopy(native))
    for model in (native, fast):
        opt = torch.optim.AdamW(model.parameters(), lr=0.1)
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    for (name, a), b in zip(native.named_parameters(), fast.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("how", ["fx", "script", "autocast", "float64"])
def test_swapped_layers_fall_back_to_f_linear(how):
    model = onednn.use_onednn(_mlp())
    x = torch.randn(3, 8)
    want = _mlp()(x)
    if how == "fx":
        traced = torch.fx.symbolic_trace(model)
        assert [n.target for n in traced.graph.nodes].count(torch.nn.functional.linear) == 2
        torch.testing.assert_close(traced(x), want)
    elif how == "script":
        torch.testing.assert_close(torch.jit.script(model)(x), want)
    elif how == "autocast":
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert model(x).dtype == torch.bfloat16
    else:
        assert model.double()(x.double()).dtype == torch.float64


def test_vit_outputs_agree_and_predictions_match():
    torch.manual_seed(0)
    native = build_vit("micro", num_classes=10, img_size=28, in_chans=1, variant="elu").eval()
    fast = onednn.use_onednn(copy.deepcopy(native))
    x = torch.randn(64, 1, 28, 28)
    with torch.inference_mode():
        a, b = native(x), fast(x)
    torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5)
    assert torch.equal(a.argmax(-1), b.argmax(-1))


def test_cpu_linear_auto_takes_onednn_on_every_x86_cpu():
    """No vendor or family test: `auto` is oneDNN wherever its linear op exists on x86-64."""
    assert resolve_cpu_linear(None) == runtime({}).cpu_linear == Runtime(CPU, "fp32").cpu_linear == "onednn"


def test_runtime_place_follows_cpu_linear():
    assert resolve_cpu_linear(None) == "onednn"
    assert runtime({}).cpu_linear == "onednn"
    assert runtime({"runtime": {"cpu_linear": "native"}}).cpu_linear == "native"
    assert type(Runtime(CPU, "fp32", cpu_linear="onednn").place(_mlp())[0]) is onednn.Linear
    assert type(Runtime(CPU, "fp32", cpu_linear="native").place(_mlp())[0]) is nn.Linear
    assert Runtime(CPU, "fp32", cpu_linear="onednn").describe()["cpu_linear"] == "onednn"


def test_bad_cpu_linear_is_one_line_naming_the_key():
    with pytest.raises(ValueError, match=r"^config key runtime.cpu_linear: unknown value 'mkl'; known: auto, onednn, native$"):
        runtime({"runtime": {"cpu_linear": "mkl"}})


@pytest.mark.parametrize("variant", ["elu", "performer", "polarity", "cosformer", "mila"])
def test_operators_through_onednn_match_them_without(variant):
    """An operator module at 256 tokens (its qkv and output projections through oneDNN) gives the
    output and the gradients it gives with oneDNN disabled, to float rounding."""
    from linvit.attention import ATTENTION

    torch.manual_seed(0)
    op = onednn.use_onednn(ATTENTION[variant](64, 4, qkv_bias=True, grid_size=(16, 16), num_prefix_tokens=0))
    for p in op.parameters():  # away from the identity-like inits, so every path carries signal
        p.data.add_(0.05 * torch.randn_like(p))
    x = torch.randn(2, 256, 64)
    results = []
    for context in (onednn.disabled, contextlib.nullcontext):
        with context():
            leaf = x.clone().requires_grad_()
            op.zero_grad()
            out = op(leaf)
            out.square().sum().backward()
            results.append([out.detach(), leaf.grad] + [p.grad.clone() for p in op.parameters()])
    for i, (got, want) in enumerate(zip(results[1], results[0])):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item() + 1e-6,
                                   msg=f"tensor {i}")


def test_mlp_fuses_gelu_in_evaluation_only_and_matches_timm():
    from timm.layers import Mlp as TimmMlp

    torch.manual_seed(0)
    plain = TimmMlp(16, 64)
    fused = onednn.use_onednn(copy.deepcopy(plain))
    assert type(fused) is onednn.Mlp and isinstance(fused, TimmMlp)
    x = torch.randn(3, 50, 16)
    with torch.inference_mode():
        torch.testing.assert_close(fused(x), plain(x), rtol=1e-5, atol=1e-6)
    calls = []
    real = torch.ops.mkldnn._linear_pointwise

    class Spy:
        def __getattr__(self, name):
            return getattr(real, name)

        def __call__(self, *args):
            calls.append(args[3])
            return real(*args)

    old = torch.ops.mkldnn._linear_pointwise
    try:
        torch.ops.mkldnn._linear_pointwise = Spy()
        with torch.no_grad():
            fused(x)
        assert calls == ["gelu", "none"]  # fc1 with its GELU, then fc2
        calls.clear()
        leaf = x.clone().requires_grad_()
        fused(leaf).sum().backward()  # training: fc1, timm's GELU, fc2, each with its gradient
        assert "gelu" not in calls and leaf.grad is not None
    finally:
        torch.ops.mkldnn._linear_pointwise = old


def test_mlp_with_another_activation_is_not_fused():
    from timm.layers import Mlp as TimmMlp

    m = onednn.use_onednn(TimmMlp(8, 16, act_layer=lambda: nn.GELU(approximate="tanh")))
    x = torch.randn(4, 8)
    with torch.no_grad():
        torch.testing.assert_close(m(x), TimmMlp.forward(m, x))
