"""Accuracy, attention fidelity, parameter counts and throughput of a trained model.

Each takes the model on its device; `runtime` (a linvit.device.Runtime) moves the batches there
and, for throughput, gives the autocast context the figure is measured under.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from .attention import attention_maps
from .device import Runtime, cpu_runtime
from .models import capture_attention
from .transfer import group_sizes


@torch.no_grad()
def accuracy(model: nn.Module, data, split: str = "test", *, batch_size: int = 256,
             limit: int | None = None, runtime: Runtime | None = None) -> dict:
    """Top-1 accuracy on (the first `limit` samples of) a split, in eval mode, on the model's device
    (under the caller's autocast context, if any). Under torchrun each rank counts its share of every
    batch and the counts are summed, so every rank returns the accuracy on the whole split."""
    runtime = runtime or cpu_runtime()
    world = runtime.world
    was_training = model.training
    model.eval()
    correct = total = 0
    for x, y in data.batches(split, batch_size, limit=limit, rank=world.rank, ranks=world.size):
        x, y = runtime.batch(x, y)
        correct += (model(x).argmax(dim=-1) == y).sum().item()
        total += y.numel()
    model.train(was_training)
    correct, total = (int(v) for v in world.sum(correct, total))
    return {"test_acc": correct / max(total, 1), "samples": total}


@torch.no_grad()
def attention_fidelity(teacher: nn.Module, student: nn.Module, x: torch.Tensor, eps: float = 1e-8) -> list[float]:
    """Per layer, KL(teacher softmax maps || student implicit matrix), averaged over images, heads, rows.

    Each model runs on the same images with its own activations.
    """
    teacher.eval(), student.eval()
    t_in = [i for i, _ in capture_attention(teacher, x)]
    s_in = [i for i, _ in capture_attention(student, x)]
    kls = []
    for tb, sb, ti, si in zip(teacher.blocks, student.blocks, t_in, s_in):
        p = attention_maps(tb.attn, ti)
        q = attention_maps(sb.attn, si).clamp_min(eps)
        kls.append((p * (p.clamp_min(eps).log() - q.log())).sum(-1).mean().item())
    return kls


def parameter_counts(model: nn.Module) -> dict:
    sizes = group_sizes(model)
    return {"params": sum(sizes.values()), "params_attn_extra": sizes["attn_extra"],
            "params_by_group": sizes}


@torch.no_grad()
def throughput(model: nn.Module, example: torch.Tensor, *, batch_size: int = 64, seconds: float = 1.0,
               runtime: Runtime | None = None) -> float:
    """Forward images per second at `batch_size` on the runtime's device and precision, after a
    warm-up pass. On CUDA the clock reads after a synchronize: kernels run asynchronously."""
    runtime = runtime or cpu_runtime()
    model.eval()
    x = runtime.batch(example[:1].expand(batch_size, *example.shape[1:]).contiguous())[0]
    sync = torch.cuda.synchronize if runtime.cuda else (lambda: None)
    with runtime.autocast():
        model(x)
        sync()
        runs, start = 0, time.perf_counter()
        while runs < 3 or time.perf_counter() - start < seconds:
            model(x)
            runs += 1
        sync()
    return runs * batch_size / (time.perf_counter() - start)
