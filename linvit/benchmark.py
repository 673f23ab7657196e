"""Operator benchmarks: forward+backward time against the number of tokens, beside softmax (SDPA).

Every operator runs on the same shapes in one process, in alternating rounds (softmax, then each
operator, again), so the ratios are measured side by side. Timings are medians over the rounds
after a warm-up, on one device (the CPU unless told; on CUDA each timing ends with a synchronize,
as kernels run asynchronously), in fp32; eager by default (the operators as written), or with
`compile="inductor"` every module, softmax's included, compiled as a training job with
`runtime.compile` compiles it (the warm-up pays the compilation, which is not timed).
"""

from __future__ import annotations

import math
import statistics
import sys
import time
from typing import TYPE_CHECKING

import torch

from .attention import ATTENTION, available_variants
from .device import Runtime
from .registry import SOFTMAX

if TYPE_CHECKING:
    import pandas as pd

REFERENCE = SOFTMAX


SCOPES = ("module", "core")


def _stepper(variant: str, tokens: int, *, batch: int = 2, heads: int = 4, head_dim: int = 32,
             scope: str = "core", device: torch.device | str = "cpu", compile: str | None = None):
    """One forward+backward pass of `variant` on (batch, tokens, heads*head_dim) patch tokens, as a
    function (the module and its inputs built once, compiled by the `compile` backend if given),
    warmed up; the device's synchronize; and the pass's floating-point operations (`count_flops`,
    counted on the eager pass, which is also the warm-up)."""
    if scope not in SCOPES:
        raise ValueError(f"unknown benchmark scope {scope!r}; known: {', '.join(SCOPES)}")
    side = _grid_side(tokens)
    torch.manual_seed(0)
    dim = heads * head_dim
    device = torch.device(device)
    op = ATTENTION[variant](dim, heads, qkv_bias=True, grid_size=(side, side), num_prefix_tokens=0)
    op = Runtime(device, "fp32").place(op)
    x = torch.randn(batch, tokens, dim).to(device).requires_grad_()  # same numbers on every device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    with torch.no_grad():
        # q, k, v as the module's own forward passes them to `attend`.
        qkv = [t.detach().requires_grad_() for t in op.split_heads(x)]
    def stepper(run):
        def step():
            op.zero_grad(set_to_none=True)
            x.grad = None
            for t in qkv:
                t.grad = None
            out = run(x) if scope == "module" else run(*qkv)
            out.sum().backward()
        return step

    target = op if scope == "module" else op.attend
    step = stepper(target)
    flops = count_flops(step)  # eager, and the warm-up (allocations, kernel selection)
    if compile:
        step = stepper(torch.compile(target, backend=compile, fullgraph=True))
        step()  # the compilation
    sync()
    return step, sync, flops


def _grid_side(tokens: int) -> int:
    """The side of the square patch grid of `tokens` tokens; a ValueError for any other count."""
    side = math.isqrt(tokens) if tokens > 0 else 0
    if side < 1 or side * side != tokens:
        raise ValueError(f"benchmark token counts must be square patch grids; {tokens} is not")
    return side


def count_flops(step) -> int:
    """Floating-point operations of one call of `step`, as torch's FlopCounterMode counts them:
    matrix products, convolutions and attention kernels, forward and backward (elementwise work is
    not counted), with two formulas of its torch 2.14 mended (`_flop_formulas`)."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False, custom_mapping=_flop_formulas()) as counter:
        step()
    return counter.get_total_flops()


def _flop_formulas() -> dict:
    """What torch's counter gets wrong or leaves out here:

    - softmax's CPU attention kernel is not counted at all (only the CUDA ones are): counted with
      torch's own flash-attention formulas (whose backward recomputes the scores);
    - a convolution's backward ignores `groups`, so a depthwise convolution's weight gradient
      counts C times its products (6.8 GFLOP for rala's 5x5 LePE at 4,096 tokens, against 0.05
      for its forward): each of the gradients asked for takes exactly the forward's products.
    """
    from torch.utils import flop_counter as fc

    aten = torch.ops.aten

    def attention(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
        return fc.sdpa_flop_count(query_shape, key_shape, value_shape)

    def attention_backward(grad_out_shape, query_shape, key_shape, value_shape, *args, out_shape=None,
                           **kwargs) -> int:
        return fc.sdpa_backward_flop_count(grad_out_shape, query_shape, key_shape, value_shape)

    def conv_backward(grad_out_shape, x_shape, w_shape, _bias, _stride, _padding, _dilation, transposed,
                      _output_padding, _groups, output_mask, out_shape=None, **kwargs) -> int:
        forward = fc.conv_flop_count(x_shape, w_shape, grad_out_shape, transposed=transposed)
        return forward * (bool(output_mask[0]) + bool(output_mask[1]))

    return {aten._scaled_dot_product_flash_attention_for_cpu: attention,
            aten._scaled_dot_product_flash_attention_for_cpu_backward: attention_backward,
            aten.convolution_backward: conv_backward}


def _time(step, sync, min_seconds: float) -> float:
    """Seconds per pass: passes repeated for at least min_seconds (at least one), averaged."""
    runs, start = 0, time.perf_counter()
    while runs < 1 or time.perf_counter() - start < min_seconds:
        step()
        runs += 1
    sync()
    return (time.perf_counter() - start) / runs


def time_operator(variant: str, tokens: int, *, batch: int = 2, heads: int = 4, head_dim: int = 32,
                  scope: str = "core", repeats: int = 3, min_seconds: float = 0.2,
                  device: torch.device | str = "cpu", compile: str | None = None) -> float:
    """Median seconds of one forward+backward pass on (batch, tokens, heads*head_dim) patch tokens.

    scope 'module': the whole attention module (qkv and output projections, gates included);
    scope 'core': only the token mixing, from q, k, v to the heads' outputs (`attend`), which is
    where softmax and linear operators differ.
    """
    step, sync, _ = _stepper(variant, tokens, batch=batch, heads=heads, head_dim=head_dim, scope=scope,
                             device=device, compile=compile)
    return statistics.median(_time(step, sync, min_seconds) for _ in range(repeats))


def run_benchmark(variants=None, tokens=(256, 1024, 4096, 16384), *, max_softmax_tokens: int = 16384,
                  repeats: int = 5, min_seconds: float = 0.2, **shape) -> pd.DataFrame:
    """One row per (operator, tokens): seconds, and the ratio to softmax at the same tokens; the
    pass's counted GFLOP (`count_flops`) and rate, and `speedup_ceiling`, softmax's GFLOP over the
    operator's: the speedup it would have at softmax's own rate of arithmetic (a ratio above it
    means the operator's arithmetic runs faster than softmax's, below it slower).

    At each token count the operators are timed in `repeats` rounds, each round timing every
    operator once in turn, and each operator's time is its median over the rounds: a machine that
    other work slows down for a while slows every operator in that round, not only the ones
    measured then. `seconds_low` and `seconds_high` are its fastest and slowest round, and
    `speedup_low` and `speedup_high` the lowest and highest of its per-round speedups (softmax's
    time in a round over the operator's in the same round): how far one run's rounds spread.
    """
    import pandas as pd

    if repeats < 1:
        raise ValueError(f"--rounds must be 1 or more, got {repeats}")
    variants = list(variants or available_variants())
    unknown = [v for v in variants if v not in ATTENTION]
    if unknown:
        raise ValueError(f"--variants: unknown operator(s) {', '.join(unknown)}; known: {', '.join(available_variants())}")
    for n in tokens:  # all checked before the first is timed
        _grid_side(n)
    for flag, key in (("--batch", "batch"), ("--heads", "heads"), ("--head-dim", "head_dim")):
        if key in shape and shape[key] < 1:
            raise ValueError(f"{flag} must be 1 or more, got {shape[key]}")
    if REFERENCE not in variants:
        variants.insert(0, REFERENCE)
    device = torch.device(shape.get("device", "cpu"))
    # linvit.device turns TF32 matmuls on for CUDA: the fp32 figures are then TF32's, and say so.
    tf32 = device.type == "cuda" and torch.backends.cuda.matmul.fp32_precision == "tf32"
    rows = []
    with _compile_limits(len(variants) * len(tokens)):
        for n in tokens:
            rows += _time_round_robin([v for v in variants if v != REFERENCE or n <= max_softmax_tokens], n,
                                      repeats=repeats, min_seconds=min_seconds, tf32=tf32, **shape)
    df = pd.DataFrame(rows)
    ref = df[df.variant == REFERENCE].set_index("tokens")
    df["speedup_vs_softmax"] = [ref.seconds.get(n, float("nan")) / s for n, s in zip(df.tokens, df.seconds)]
    # paired per round: softmax's time in round r over the operator's in round r
    per_round = [[a / b for a, b in zip(ref.round_seconds[n], r)] if n in ref.index else [float("nan")]
                 for n, r in zip(df.tokens, df.round_seconds)]
    df["speedup_low"], df["speedup_high"] = [min(x) for x in per_round], [max(x) for x in per_round]
    df = df.drop(columns="round_seconds")
    df["speedup_ceiling"] = [ref.gflop.get(n, float("nan")) / g if g else float("nan")
                             for n, g in zip(df.tokens, df.gflop)]
    return df


def _compile_limits(modules: int):
    """Dynamo's recompile limits raised for one run: every module class compiles the same
    `forward` code object once per token count, past the default limit of 8 per code object."""
    import torch._dynamo

    limit = max(torch._dynamo.config.recompile_limit, modules + 1)
    return torch._dynamo.config.patch(recompile_limit=limit,
                                      accumulated_recompile_limit=max(
                                          torch._dynamo.config.accumulated_recompile_limit, limit))


def _time_round_robin(names: list[str], n: int, *, repeats: int, min_seconds: float, tf32: bool,
                      **shape) -> list[dict]:
    """Rows of `names` at n tokens, timed in alternating rounds (see run_benchmark)."""
    rows = []
    steps, flops = {}, {}
    for v in names:
        if shape.get("compile"):  # compiling takes seconds per operator: say what is happening
            print(f"benchmark: compiling {v} N={n} ({shape['compile']})", file=sys.stderr, flush=True)
        step, sync, flops[v] = _stepper(v, n, **shape)
        steps[v] = step, sync
    times = {v: [] for v in names}
    for _ in range(repeats):
        for v in names:
            times[v].append(_time(*steps[v], min_seconds))
    del steps  # the next token count's modules and inputs replace these
    for v in names:
        seconds = statistics.median(times[v])
        rows.append({"variant": v, "tokens": n, "scope": shape.get("scope", "core"),
                     "device": str(shape.get("device", "cpu")), "dtype": "float32+tf32" if tf32 else "float32",
                     "compile": shape.get("compile") or "none",
                     "seconds": seconds, "rounds": len(times[v]), "seconds_low": min(times[v]),
                     "seconds_high": max(times[v]), "round_seconds": times[v],
                     "gflop": flops[v] / 1e9, "gflop_per_s": flops[v] / 1e9 / seconds})
        print(f"benchmark: {v:>10} N={n:>6}: {seconds * 1e3:9.2f} ms", file=sys.stderr, flush=True)
    return rows


def summarize(df: pd.DataFrame, low: int = 256, high: int = 4096) -> pd.DataFrame:
    """Per operator: growth of time from `low` to `high` tokens, speedup over softmax at `high` (and
    its FLOP ceiling there), and the smallest measured token count from which it is faster than softmax."""
    import pandas as pd

    rows = []
    for v, g in df.groupby("variant", sort=False):
        at = g.set_index("tokens")
        t = at["seconds"]
        faster = g[g.speedup_vs_softmax > 1].tokens
        rows.append({"variant": v,
                     f"growth_{low}_to_{high}": t.get(high, float("nan")) / t.get(low, float("nan")),
                     f"speedup_vs_softmax_at_{high}": at["speedup_vs_softmax"].get(high),
                     **({f"rounds_range_at_{high}": f"{at.speedup_low.get(high):.2f}-{at.speedup_high.get(high):.2f}"}
                        if "speedup_low" in g else {}),
                     **({f"speedup_ceiling_at_{high}": at["speedup_ceiling"].get(high)}
                        if "speedup_ceiling" in g else {}),
                     "faster_than_softmax_from": int(faster.min()) if len(faster) else None})
    out = pd.DataFrame(rows)
    out["faster_than_softmax_from"] = out["faster_than_softmax_from"].astype("Int64")
    return out
