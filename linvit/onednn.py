"""fp32 linear layers on the CPU through oneDNN instead of MKL.

Why: PyTorch sends a CPU float32 `F.linear` (and its gradients) to MKL's sgemm. On this project's
machine (AMD EPYC with AVX-512) MKL takes a code path without AVX-512: 60-75 GFLOP/s on one thread
for a micro ViT's layers (12,800 x 64 by 64 x 64-256), where oneDNN, the other CPU library PyTorch
ships (Inductor calls it for CPU linears, as `torch.ops.mkldnn._linear_pointwise`), reached
135-200 GFLOP/s on the same products. Measured on that machine, one thread: a micro ViT's eval
batch of 256 took 70 against 114-120 ms, and its training step 268-281 against 322-363 ms.

- `linear(x, weight, bias)`: F.linear's value with forward and input gradient through oneDNN, for
  CPU float32 tensors, and the weight gradient by torch.mm (`weight_grad`) (one autograd
  Function; first-order gradients only).
- `Linear`: an nn.Linear whose forward takes `linear` where it applies (`applies`) and F.linear
  elsewhere (other devices and dtypes, autocast, torch.fx tracing, torch.compile, TorchScript).
- `use_onednn(model)`: every plain nn.Linear of a model becomes a `Linear` in place: the same
  Parameter objects, the same state_dict keys, still an nn.Linear to isinstance; and every plain
  timm Mlp an `Mlp`, which in evaluation computes fc1 and its GELU as one oneDNN call. Runtime.place
  (linvit.device) calls it when `runtime.cpu_linear` is onednn, the default where `available`.
- `disabled()`: a context in which none of this goes through oneDNN (side-by-side checks).

The operators' own products are plain torch.matmul: oneDNN for them, and the operand orders and
depthwise kernels once chosen per CPU vendor, were removed (docs/benchmarks.md, "CPU-specific
paths").

The values agree with MKL's to float rounding (tests/test_onednn.py: about 1e-6 relative), not
bit for bit: a run's numbers move by rounding when it is switched.
"""

from __future__ import annotations

import contextlib
import platform
import threading

import torch
import torch.nn.functional as F
from timm.layers import Mlp as TimmMlp
from torch import nn



def available() -> bool:
    """Whether this torch has oneDNN's linear op and the CPU is x86-64 (where it was measured)."""
    return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
            and platform.machine().lower() in ("x86_64", "amd64"))


def _product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, post: str = "none",
             algorithm: str = "") -> torch.Tensor:
    """x @ weight.T + bias in oneDNN, x of any leading shape, then the elementwise `post` op
    ("gelu" with algorithm "none" is exact GELU). Each operand dense or the transpose of a dense
    matrix: oneDNN runs other strides (an expanded gradient's zeros, say) in a reference kernel,
    about 100 times slower here."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, post, [None], algorithm)


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        x, weight = x.contiguous(), weight.contiguous()
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return _product(x, weight, bias)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        grad = grad.contiguous()  # sum().backward() hands in stride-0 ones
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = _product(grad, weight.t(), None)  # grad @ W, W.T a view: no copy
        if ctx.needs_input_grad[1] or ctx.needs_input_grad[2]:
            g = grad.reshape(-1, grad.shape[-1])
            if ctx.needs_input_grad[1]:
                grad_w = weight_grad(g, x.reshape(-1, x.shape[-1]))
            if ctx.has_bias and ctx.needs_input_grad[2]:
                grad_b = g.sum(0)
        return grad_x, grad_w, grad_b


def weight_grad(g: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """g.T @ x for g (M, out) and x (M, in): a linear layer's weight gradient, a reduction over
    every token, by torch.mm (MKL), which reads both operands transposed in place. oneDNN's linear
    takes its input row-major, so there it needed a transposed copy of x or g first (M x in
    floats); measured on this project's CPU, M = 8,192, median of 4 paired rounds, MKL against
    oneDNN with the copy: 14.1 against 15.9 ms (in 128, out 384), 5.1 against 6.4 (128 -> 128),
    1.2 against 1.9 (64 -> 64) on one thread; 7.4 against 9.4, 2.8 against 4.4, 0.6 against 1.3
    on two; at a student's M = 3,200 (a batch of 64 micro-ViT sequences), one thread, three
    rounds, even: 64 -> 192 1.46-1.97 against 1.44-1.55, 64 -> 64 0.53-0.54 against 0.70-0.73,
    256 -> 64 2.40-3.11 against 2.38-3.63. (oneDNN without the copy would be faster still, 13.2,
    4.7 and 1.0 ms on one thread at M = 8,192: the copy is what it loses on.)"""
    return g.t().mm(x)


_off = threading.local()  # `disabled()` sets .depth in this thread


@contextlib.contextmanager
def disabled():
    """Within it, in this thread, nothing goes through oneDNN here: `Linear` takes F.linear (for
    side-by-side checks and timings)."""
    _off.depth = getattr(_off, "depth", 0) + 1
    try:
        yield
    finally:
        _off.depth -= 1


def applies(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
    """Whether `linear` serves this call: CPU float32 tensors with rows, outside autocast, torch.fx
    tracing, torch.compile and TorchScript (each of which needs F.linear itself), and outside
    `disabled()`."""
    if (getattr(_off, "depth", 0) or torch.fx._symbolic_trace.is_fx_symbolic_tracing()
            or torch.compiler.is_compiling()):
        return False  # first: a traced x is a Proxy, whose attributes are not values
    return (x.device.type == "cpu" and x.dtype == torch.float32 and weight.dtype == torch.float32
            and (bias is None or bias.dtype == torch.float32) and x.numel() > 0
            and not torch.is_autocast_enabled("cpu"))


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight, bias) through oneDNN (callers check `applies`)."""
    if torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                    or (bias is not None and bias.requires_grad)):
        return _Linear.apply(x, weight, bias)
    return _product(x.contiguous(), weight.contiguous(), bias)


class Linear(nn.Linear):
    """nn.Linear computed through oneDNN where `applies` (see the module docstring)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_scripting():
            return F.linear(x, self.weight, self.bias)
        return self._eager(x)

    @torch.jit.unused  # TorchScript compiles forward's first branch only
    def _eager(self, x: torch.Tensor) -> torch.Tensor:
        if applies(x, self.weight, self.bias):
            return linear(x, self.weight, self.bias)
        return F.linear(x, self.weight, self.bias)


class Mlp(TimmMlp):
    """timm's Mlp whose fc1 and GELU are one oneDNN call (GELU as the product's post-op) where no
    gradient is needed (evaluation), the layer `applies` and the Mlp is fc1 -> exact GELU ->
    fc2 with no norm and no active dropout; timm's forward otherwise. On a micro ViT's eval
    batch of 256 (one thread, paired): 0.905 of the forward pass's time, the same logits bit
    for bit."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.jit.is_scripting():
            return super().forward(x)
        return self._eager(x)

    @torch.jit.unused
    def _eager(self, x: torch.Tensor) -> torch.Tensor:
        fc1 = self.fc1
        if (not torch.is_grad_enabled() and type(self.act) is nn.GELU and self.act.approximate == "none"
                and isinstance(self.norm, nn.Identity) and not (self.training and self.drop1.p > 0)
                and isinstance(fc1, nn.Linear) and applies(x, fc1.weight, fc1.bias)):
            hidden = _product(x.contiguous(), fc1.weight.contiguous(), fc1.bias, "gelu", "none")
            return self.drop2(self.fc2(hidden))
        return super().forward(x)


def use_onednn(model: nn.Module) -> nn.Module:
    """Every plain nn.Linear in `model` (subclasses are left alone: they may compute otherwise)
    computes through oneDNN from now on, and every plain timm Mlp fuses fc1 and GELU in
    evaluation (`Mlp`); returns `model`. A no-op where oneDNN is not `available`."""
    if available():
        for module in model.modules():  # in place: parameters, hooks and optimizer references stay
            if type(module) is nn.Linear:
                module.__class__ = Linear
            elif type(module) is TimmMlp and isinstance(module.drop1, nn.Dropout):
                module.__class__ = Mlp
    return model
