"""Depthwise 2-D convolution (one filter per channel) with a faster weight gradient on the CPU.

The operators' position terms (FLatten's and PolaFormer's DWC, RALA's LePE) are depthwise 5x5
convolutions over the patch grid. oneDNN, which runs PyTorch's CPU convolutions, is quick for
their forward pass and input gradient, but slow for a 5x5 kernel's weight gradient: measured on
this project's CPU (one thread, NCHW input), 10.1 ms for (2, 128, 64, 64) against 0.4 ms for the forward
pass, and 7.7 ms for (8, 32, 64, 64). That gradient,

    dW[c, i, j] = sum_{b, y, x} x_pad[b, c, y + i, x + j] * g[b, c, y, x],

is itself a depthwise convolution: each (image, channel) plane of the padded input convolved
with its own output gradient as a (H, W) kernel, the (image, channel) pairs as the groups, then
summed over images. That took 2.8 ms and 3.2 ms for the shapes above when the input is NCHW
(contiguous). oneDNN's own weight gradient depends on the layout: from channels-last memory (the
layout every operator here hands in, as it is the qkv projection's token-major one) it is the
faster of the two. Measured on that CPU (median of 5 paired rounds of 15 calls, 5x5 kernels),
folded over oneDNN's own: NCHW (2, 128, 64, 64) 0.14 on one thread and two (4.5 against 31 ms);
channels-last (8, 32, 64, 64) 1.18 on one thread and 1.43 on two, (2, 128, 64, 64) 1.08 and
1.08-1.2, (256, 16, 7, 7) 1.11 and 0.88, (64, 64, 24..64 side) 1.2-1.6 (the folded path must
first copy channels-last planes to NCHW). On an Intel Xeon with AVX-512 it is the other way round,
copies included (median of 9 calls, oneDNN's weight gradient alone against the folded one):
(8, 32, 64, 64) 7.41 against 4.45 ms on one thread and 3.50 against 2.23 on two, (2, 128, 64, 64)
13.66 against 8.74 and 5.94 against 3.43, (256, 16, 7, 7) 1.25 against 1.01 and 0.69 against
0.57. On an AMD EPYC of family 25 with AVX-512 (Zen 4), it is the same as on the Intel Xeon: (2, 128,
64, 64) channels-last, median of 15 calls, oneDNN's weight gradient alone 10.5-10.8 against 6.7-7.4
ms folded on one thread, 5.7-6.5 against 4.2-5.7 on two; and module steps at 4,096 tokens, medians of 11
alternating (4 December 2026), folded over oneDNN's: `rala` 0.884 on one thread and 0.910 on two,
`focused` 0.908 and 0.930, `polarity` 0.955 and 0.924. So the folded gradient serves NCHW inputs
everywhere and channels-last ones on Intel's CPUs and AMD's Zen 4 (`folds_channels_last`, by the
CPU's vendor and family as `linvit.onednn.pays` decides the tall products). For
3x3 kernels oneDNN's own weight gradient was faster everywhere (0.35 against 1.2 ms at
(2, 128, 64, 64)), so they, and every other device, keep PyTorch's convolution as it is. Same
values up to float rounding (a different summation order).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from .. import onednn

# Kernels at least this wide, on NCHW-contiguous inputs, take the folded weight gradient (see the
# module docstring).
FOLDED_FROM = 5


def depthwise_conv2d(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                     padding: int | tuple[int, int]) -> torch.Tensor:
    """F.conv2d(x, weight, bias, padding=padding, groups=channels) for x (B, C, H, W) and weight
    (C, 1, kh, kw), stride 1; on the CPU, for an NCHW-contiguous x (or a channels-last one where
    `folds_channels_last`), with an odd kernel of 5 or more a side padded to keep the input's size
    and a weight that needs its gradient, the weight gradient is computed folded (elsewhere
    channels-last inputs keep oneDNN's own, faster for them there)."""
    pad = (padding, padding) if isinstance(padding, int) else tuple(padding)
    kh, kw = weight.shape[-2:]
    same_size = (kh, kw) == (2 * pad[0] + 1, 2 * pad[1] + 1)
    # A compiled graph keeps the NCHW-only rule: the vendor comes from /proc/cpuinfo, which dynamo
    # does not trace.
    layout = x.is_contiguous() or (x.is_contiguous(memory_format=torch.channels_last)
                                   and not torch.compiler.is_compiling() and folds_channels_last())
    if x.device.type != "cpu" or not layout or min(kh, kw) < FOLDED_FROM or not same_size or not (
            torch.is_grad_enabled() and weight.requires_grad):
        return F.conv2d(x, weight, bias, padding=padding, groups=x.shape[1])
    return _DepthwiseConv.apply(x, weight, bias, pad)


def folds_channels_last() -> bool:
    """Whether channels-last inputs take the folded weight gradient too: on Intel's CPUs and on
    AMD's family 25 with AVX-512 (Zen 4, whose AVX-512 runs on 256-bit units), where it beat
    oneDNN's own from that layout (the module docstring's numbers); not on the other AMD CPU
    measured, an AVX-512 EPYC of unrecorded family whose products ran at 135-200 GFLOP/s on one
    thread, where oneDNN's was the faster; nor on CPUs where neither was measured."""
    vendor = onednn.cpu_vendor()
    return vendor == "GenuineIntel" or (vendor == "AuthenticAMD" and onednn.cpu_family() == "25"
                                        and _cpu_capability().startswith("AVX512"))


def _cpu_capability() -> str:
    return torch.backends.cpu.get_cpu_capability()


class _DepthwiseConv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, pad):
        ctx.save_for_backward(x, weight)
        ctx.pad, ctx.has_bias = pad, bias is not None
        return F.conv2d(x, weight, bias, padding=pad, groups=x.shape[1])

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        c = x.shape[1]
        grad_x = None
        if ctx.needs_input_grad[0]:  # oneDNN's input gradient, its weight gradient skipped
            grad_x = torch.ops.aten.convolution_backward(
                grad, x, weight, None, [1, 1], list(ctx.pad), [1, 1], False, [0, 0], c,
                [True, False, False])[0]
        grad_b = grad.sum(dim=(0, 2, 3)) if ctx.has_bias else None
        return grad_x, _weight_grad(x, grad, weight.shape, ctx.pad), grad_b, None


def _weight_grad(x: torch.Tensor, grad: torch.Tensor, shape: torch.Size, pad: tuple[int, int]) -> torch.Tensor:
    """dW of a stride-1 depthwise convolution as one grouped convolution over (image, channel) planes."""
    b, c, h, w = grad.shape
    ph, pw = pad
    planes = F.pad(x.contiguous(), (pw, pw, ph, ph)).reshape(1, b * c, h + 2 * ph, w + 2 * pw)
    per_image = F.conv2d(planes, grad.contiguous().reshape(b * c, 1, h, w), groups=b * c)
    return per_image.reshape(b, c, *shape[-2:]).sum(dim=0).reshape(shape)
