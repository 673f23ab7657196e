"""linvit.attention.depthwise: the depthwise convolution gives PyTorch's convolution's output and
gradients in both memory layouts (NCHW takes the folded weight gradient; channels-last takes it on
Intel's CPUs and AMD's Zen 4 and oneDNN's elsewhere, the CPU's vendor and family set here so both
run on any machine)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from linvit import onednn
from linvit.attention.depthwise import _DepthwiseConv, depthwise_conv2d, folds_channels_last


@pytest.fixture(params=["GenuineIntel", "AuthenticAMD"])
def vendor(request, monkeypatch):
    monkeypatch.setattr(onednn, "cpu_vendor", lambda: request.param)
    monkeypatch.setattr(onednn, "cpu_family", lambda: "26")
    return request.param


@pytest.mark.parametrize("kernel", [5, 7])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_gradients_match_pytorchs_convolution(kernel, channels_last, bias, vendor):
    g = torch.Generator().manual_seed(kernel)
    x = torch.randn(3, 6, 9, 11, dtype=torch.float64, generator=g)
    if channels_last:
        x = x.contiguous(memory_format=torch.channels_last)
    w = torch.randn(6, 1, kernel, kernel, dtype=torch.float64, generator=g)
    b = torch.randn(6, dtype=torch.float64, generator=g) if bias else None
    grad = torch.randn(3, 6, 9, 11, dtype=torch.float64, generator=g)
    outs = []
    for conv in (depthwise_conv2d, lambda *a: F.conv2d(*a[:3], padding=a[3], groups=6)):
        leaves = [t.detach().clone().requires_grad_() for t in (x, w) + ((b,) if bias else ())]
        out = conv(leaves[0], leaves[1], leaves[2] if bias else None, kernel // 2)
        out.backward(grad)
        outs.append([out] + [t.grad for t in leaves])
    for ours, theirs in zip(*outs):
        torch.testing.assert_close(ours, theirs, rtol=1e-12, atol=1e-12)


def test_gradcheck():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 6, 5, dtype=torch.float64, generator=g, requires_grad=True)
    w = torch.randn(3, 1, 5, 5, dtype=torch.float64, generator=g, requires_grad=True)
    b = torch.randn(3, dtype=torch.float64, generator=g, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x, w, b: _DepthwiseConv.apply(x, w, b, (2, 2)), (x, w, b))


@pytest.mark.parametrize("kernel, padding", [(3, 1), (5, 1)])
def test_other_kernels_and_paddings_are_pytorchs_own_convolution(kernel, padding):
    # 3x3 (oneDNN's weight gradient is the faster one) and an output smaller than the input.
    x = torch.randn(1, 4, 8, 8)
    w = torch.randn(4, 1, kernel, kernel, requires_grad=True)
    out = depthwise_conv2d(x, w, None, padding)
    assert out.grad_fn is not None and "DepthwiseConv" not in type(out.grad_fn).__name__
    torch.testing.assert_close(out, F.conv2d(x, w, None, padding=padding, groups=4))


def test_the_folded_gradient_is_used_for_a_5x5_kernel_on_an_nchw_input_on_the_cpu():
    out = depthwise_conv2d(torch.randn(1, 4, 8, 8), torch.randn(4, 1, 5, 5, requires_grad=True), None, 2)
    assert "DepthwiseConv" in type(out.grad_fn).__name__


def test_channels_last_inputs_take_the_folded_gradient_on_intel_only(vendor):
    # From channels-last memory (the operators' layout) oneDNN's weight gradient was the faster one
    # on AMD's CPUs and the slower one on an Intel Xeon.
    x = torch.randn(1, 4, 8, 8).contiguous(memory_format=torch.channels_last)
    out = depthwise_conv2d(x, torch.randn(4, 1, 5, 5, requires_grad=True), None, 2)
    folded = "DepthwiseConv" in type(out.grad_fn).__name__
    assert folded == folds_channels_last() == (vendor == "GenuineIntel")  # family 26: not Zen 4
    # NCHW inputs take it on every CPU.
    out = depthwise_conv2d(torch.randn(1, 4, 8, 8), torch.randn(4, 1, 5, 5, requires_grad=True), None, 2)
    assert "DepthwiseConv" in type(out.grad_fn).__name__


@pytest.mark.parametrize("vendor, family, kernels, folds", [
    ("AuthenticAMD", "25", "AVX512", True),    # Zen 4: the folded gradient was the faster
    ("AuthenticAMD", "25", "AVX2", False),     # Zen 3: not measured
    ("AuthenticAMD", "26", "AVX512", False),   # oneDNN's was the faster on the other AVX-512 EPYC
    ("GenuineIntel", "6", "AVX512", True),
    ("", "", "DEFAULT", False),                # not x86
])
def test_channels_last_folding_follows_the_cpu_generation(monkeypatch, vendor, family, kernels, folds):
    from linvit.attention import depthwise

    monkeypatch.setattr(onednn, "cpu_vendor", lambda: vendor)
    monkeypatch.setattr(onednn, "cpu_family", lambda: family)
    monkeypatch.setattr(depthwise, "_cpu_capability", lambda: kernels)
    assert folds_channels_last() is folds
    x = torch.randn(1, 4, 8, 8).contiguous(memory_format=torch.channels_last)
    out = depthwise_conv2d(x, torch.randn(4, 1, 5, 5, requires_grad=True), None, 2)
    assert ("DepthwiseConv" in type(out.grad_fn).__name__) is folds
