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
- `pays()`: whether oneDNN beats torch's own kernels on the operators' tall products on this CPU
  (by its vendor: not on Intel's, where MKL uses AVX-512).
- `matmul(a, b)`: the operators' own tall products (N tokens by a few features) through oneDNN
  where that pays (`pays()`, and the shapes of its docstring), used by the kernel core
  (linvit.attention.base), performer and polarity whatever `runtime.cpu_linear` says, as the
  depthwise convolutions' kernel choice is theirs (linvit.attention.depthwise).
- `matmul_mul_matmul(a, b, e, w)`: ((a @ b) * e) @ w matrix by matrix where a @ b is such a
  product (performer's backward), so the wide intermediate stays in cache.
- `contract_tokens(a, b)`: the operators' products over tokens (a.T @ b), in the operand order
  MKL runs faster (no oneDNN: it gained nothing there).
- `disabled()`: a context in which none of this goes through oneDNN (side-by-side checks).

The values agree with MKL's to float rounding (tests/test_onednn.py: about 1e-6 relative), not
bit for bit: a run's numbers move by rounding when it is switched.
"""

from __future__ import annotations

import contextlib
import functools
import math
import platform
import threading

import torch
import torch.nn.functional as F
from timm.layers import Mlp as TimmMlp
from torch import nn

from .io import cpu_info


def available() -> bool:
    """Whether this torch has oneDNN's linear op and the CPU is x86-64 (where it was measured)."""
    return (torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")
            and platform.machine().lower() in ("x86_64", "amd64"))


@functools.cache
def cpu_vendor() -> str:
    """The CPU's vendor_id from /proc/cpuinfo ("GenuineIntel", "AuthenticAMD", ...); "" where
    there is none (not Linux, or not x86)."""
    return cpu_info("vendor_id")


@functools.cache
def cpu_family() -> str:
    """The x86 CPU's family number from /proc/cpuinfo ("25" for AMD's Zen 3 and Zen 4); "" where
    there is none."""
    return cpu_info("cpu family")


def pays() -> bool:
    """Whether oneDNN beats torch's own CPU kernels on the operators' tall products (`matmul`) here:
    where `available()` and the CPU is not Intel's. Why by vendor: MKL, torch's sgemm, takes its
    AVX-512 code path on Intel's CPUs only. On this project's AMD EPYC with AVX-512 oneDNN ran
    135-200 GFLOP/s where MKL ran 60-75; on an Intel Xeon with AVX-512 (two threads) a tall
    (8, 4096, 32) by (8, 32, 33) product took 0.60 ms in MKL against 1.63-1.70 in oneDNN.

    The linear layers are another matter, and `runtime.cpu_linear: auto` takes oneDNN for them on
    every x86-64 CPU: on that Intel Xeon (one thread) a micro ViT's evaluation batch of 256 took
    158 ms through oneDNN against 200 through MKL (fc1 and its GELU are one call; `addmm` first
    copies the bias into its output), its training step 0.94-1.01 of MKL's time, while the operator
    benchmark's modules at 4,096 tokens (two threads) took 1.01-1.05 of theirs."""
    return available() and cpu_vendor() != "GenuineIntel"


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
    """Within it, in this thread, nothing goes through oneDNN here: `Linear` and `matmul` take
    F.linear and torch.matmul (for side-by-side checks and timings)."""
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


MIN_ROWS = 256  # `matmul`'s per-matrix products go to oneDNN from this many rows...
MAX_MATRICES = 64  # ...and up to this many matrices (one call each); else torch.matmul


def matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b for a (..., M, K) and b either one (K, N) matrix or (..., K, N) with a's batch dims.
    Through oneDNN where `applies` and the product is a tall one, as a linear attention's products
    over features are (M = its tokens): a shared b is one call; per-matrix b's are one call each,
    when there are few (<= MAX_MATRICES) of at least MIN_ROWS rows (at (8, 4096, 64) by
    (8, 64, 34): 1.25 against 2.17 ms for torch.bmm through MKL). Elsewhere torch.matmul, as for
    products that reduce over the tokens (a.T @ b), which gained nothing. With autograd when an
    operand needs a gradient: a's through the same tall product, b's (a reduction) by torch."""
    if not _tall(a, b):
        return torch.matmul(a, b)
    if torch.is_grad_enabled() and (a.requires_grad or b.requires_grad):
        return _MatMul.apply(a, b)
    return _tall_product(a, b)


def _tall(a: torch.Tensor, b: torch.Tensor) -> bool:
    if not applies(a, b, None) or a.dim() < 2 or not pays():  # applies first: it sees compilation
        return False
    if b.dim() == 2:
        return True
    return (b.shape[:-2] == a.shape[:-2] and a.shape[-2] >= MIN_ROWS
            and math.prod(a.shape[:-2]) <= MAX_MATRICES)


def _tall_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    if b.dim() == 2:
        return _product(a.contiguous(), _dense(b).t(), None)
    batch = a.shape[:-2]
    count = math.prod(batch)
    a3, b3 = a.reshape(count, *a.shape[-2:]), b.reshape(count, *b.shape[-2:])
    out = a.new_empty(count, a.shape[-2], b.shape[-1])
    for i in range(count):  # each b_i.T a view; a dense operand or the transpose of one, as _product needs
        out[i] = _product(_dense(a3[i]), _dense(b3[i]).t(), None)
    return out.reshape(*batch, *out.shape[-2:])


def matmul_mul_matmul(a: torch.Tensor, b: torch.Tensor, e: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """((a @ b) * e) @ w for a (..., M, K), b (..., K, F), e (..., M, F) and one (F, P) matrix w,
    without autograd (for backward passes written out). Where a @ b is `matmul`'s per-matrix tall
    product, the chain runs matrix by matrix, so each (M, F) intermediate is scaled and multiplied
    while it is still in cache, and only the narrower (M, P) result is gathered. Same values as the
    three steps one after the other; `performer`'s module step at 4,096 tokens (its backward's two
    chains, F = 111, P = 33) took 0.970 of its time on one thread and 0.947 on two (medians of 11,
    alternating, on an AMD EPYC Zen 4)."""
    if not _tall(a, b) or b.dim() == 2:
        return matmul(matmul(a, b).mul_(e), w)
    batch = a.shape[:-2]
    count = math.prod(batch)
    a3, b3 = a.reshape(count, *a.shape[-2:]), b.reshape(count, *b.shape[-2:])
    e3 = e.expand(*batch, *e.shape[-2:]).reshape(count, *e.shape[-2:])
    w_t = _dense(w).t()
    out = a.new_empty(count, a.shape[-2], w.shape[-1])
    for i in range(count):
        out[i] = _product(_product(_dense(a3[i]), _dense(b3[i]).t(), None).mul_(e3[i]), w_t, None)
    return out.reshape(*batch, *out.shape[-2:])


class _MatMul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return _tall_product(a, b)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        grad = grad.contiguous()
        grad_a = _tall_product(grad, b.transpose(-1, -2)) if ctx.needs_input_grad[0] else None
        grad_b = None
        if ctx.needs_input_grad[1]:
            if b.dim() == 2:  # one matrix shared by every batch: the sum over all rows
                grad_b = a.reshape(-1, a.shape[-1]).t() @ grad.reshape(-1, grad.shape[-1])
            else:
                grad_b = contract_tokens(a, grad)
        return grad_a, grad_b


def contract_tokens(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a.T @ b for a (..., N, K) and b (..., N, M): a contraction over the N tokens (the operators'
    reductions: phi(K)^T V and its gradients' counterparts), by torch.matmul. On the CPU
    the wider operand goes second, (b.T @ a).T when K > M: MKL's batched product over the N
    tokens ran faster with the result's longer side as its rows' length (a GEMM kernel vectorizes
    along the result's rows: 64 floats fill whole AVX-512 or AVX2 vectors, 33 or 34 leave a
    remainder; measured on the Intel machine only, where MKL runs AVX-512). Measured on an Intel
    Xeon, (8, 4096, K) by (8, 4096, M), one thread, median of 41: K, M = 64, 34: 1.20 against
    1.48 ms; 64, 33: 1.20 against 1.37; 32, 16: 0.32 against 0.39; and the other way round
    16, 32 took 0.39 as (b.T @ a).T against 0.32; equal widths the same (two threads alike)."""
    if a.device.type == "cpu" and a.shape[-1] > b.shape[-1]:
        return (b.transpose(-1, -2) @ a).transpose(-1, -2)
    return a.transpose(-1, -2) @ b


def _dense(m: torch.Tensor) -> torch.Tensor:
    """A 2D matrix as _product takes it: itself if dense or a dense one's transpose, else a copy."""
    return m if m.is_contiguous() or m.t().is_contiguous() else m.contiguous()


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
