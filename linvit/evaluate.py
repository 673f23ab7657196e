"""Accuracy, attention fidelity, parameter counts and throughput of a trained model.

Each takes the model on its device; `runtime` (a linvit.device.Runtime) moves the batches there
and, for throughput, gives the autocast context the figure is measured under.
"""

from __future__ import annotations

import time

import numpy as np
import torch
from torch import nn

from .attention import attention_maps
from .device import Runtime, cpu_runtime
from .losses import js_rows, kl_rows, map_correlation
from .models import capture_attention
from .transfer import group_sizes


@torch.no_grad()
def accuracy(model: nn.Module, data, split: str = "test", *, batch_size: int = 256,
             limit: int | None = None, runtime: Runtime | None = None, record: dict | None = None) -> dict:
    """Top-1 accuracy on (the first `limit` samples of) a split, in eval mode, on the model's device
    (under the caller's autocast context, if any). Under torchrun each rank counts its share of every
    batch and the counts are summed, so every rank returns the accuracy on the whole split.

    `record`: a dict to fill with "pred" and "label", int64 numpy arrays of every sample in the
    split's fixed order (gathered over the ranks), for the report's per-image statistics; the
    returned dict stays small (it goes into train.jsonl and metrics.json)."""
    runtime = runtime or cpu_runtime()
    world = runtime.world
    was_training = model.training
    model.eval()
    correct = total = 0
    preds, labels = [], []
    for x, y in data.batches(split, batch_size, limit=limit, rank=world.rank, ranks=world.size):
        x, y = runtime.batch(x, y)
        # inference_mode around the forward alone (15% faster than no_grad on the CPU here): the
        # loader's cached batches are made outside it, so no inference tensor ever enters the cache.
        with torch.inference_mode():
            pred = model(x).argmax(dim=-1)
        correct += (pred == y).sum().item()
        total += y.numel()
        if record is not None:
            preds.append(pred.cpu().numpy())
            labels.append(y.cpu().numpy())
    model.train(was_training)
    correct, total = (int(v) for v in world.sum(correct, total))
    if record is not None:
        record["pred"] = _gathered(preds, total, batch_size, world)
        record["label"] = _gathered(labels, total, batch_size, world)
    return {"test_acc": correct / max(total, 1), "samples": total}


def _gathered(parts: list[np.ndarray], total: int, batch_size: int, world) -> np.ndarray:
    """One rank's shares of the global batches -> the whole split in order. Rank r holds samples
    [r*n//ranks, (r+1)*n//ranks) of each global batch of n (linvit.data.loader's batches), so each
    rank places its values and a sum over ranks fills every slot once (values shifted by 1: 0 = empty)."""
    if world.size == 1:
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, dtype=np.int64)
    full = np.zeros(total, dtype=np.float64)
    for i, part in enumerate(parts):
        n = min(batch_size, total - i * batch_size)
        start = i * batch_size + world.rank * n // world.size
        full[start:start + len(part)] = part + 1
    return np.asarray(world.sum(*full.tolist()), dtype=np.int64) - 1


def _eval_maps(model: nn.Module, x: torch.Tensor) -> list[tuple[nn.Module, torch.Tensor]]:
    """(block attention, its input) of every block while `model` runs on x in eval mode and fp32
    (autocast off), the model's training mode restored afterwards."""
    was_training = model.training
    model.eval()
    try:
        with torch.autocast(device_type=x.device.type, enabled=False):
            inputs = [i for i, _ in capture_attention(model, x)]
    finally:
        model.train(was_training)
    return [(block.attn, i) for block, i in zip(model.blocks, inputs)]


def _maps(attn: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """Row-stochastic (B, H, N, N) maps of one block in fp32 (`attention_maps` turns autocast off)."""
    return attention_maps(attn, x).float()


@torch.no_grad()
def attention_fidelity(teacher: nn.Module, student: nn.Module, x: torch.Tensor,
                       eps: float = 1e-8) -> dict[str, list[float]]:
    """Per block, how close the student's attention maps Â are to the teacher's softmax maps A.

    Returns {"kl": [...], "js": [...], "corr": [...]}, one float per block:
      kl    KL(A || Â) of every query row, averaged over images, heads and rows;
      js    the Jensen-Shannon divergence of every row (symmetric, in [0, ln 2]), averaged the same way;
      corr  the Pearson correlation of each head's flattened N x N maps, averaged over images, heads.
    A linear student's maps are its implicit matrices made row-stochastic (ImplicitAttention.maps).
    Each model runs on the same images x with its own activations; everything in fp32, no gradients.
    """
    if len(teacher.blocks) != len(student.blocks):
        raise ValueError(f"attention_fidelity: the teacher has {len(teacher.blocks)} blocks and the "
                         f"student {len(student.blocks)}")
    out: dict[str, list[float]] = {"kl": [], "js": [], "corr": []}
    for (ta, ti), (sa, si) in zip(_eval_maps(teacher, x), _eval_maps(student, x)):
        p, q = _maps(ta, ti), _maps(sa, si)
        if p.shape != q.shape:
            raise ValueError(f"attention_fidelity: teacher maps {tuple(p.shape)} and student maps "
                             f"{tuple(q.shape)} differ in shape")
        out["kl"].append(kl_rows(p, q, eps).mean().item())
        out["js"].append(js_rows(p, q, eps).mean().item())
        out["corr"].append(map_correlation(p, q).mean().item())
        del p, q
    return out


ROW_CLASS_TOKEN, ROW_MEAN = "class token", "mean of rows"


def _patch_grid(model: nn.Module, x: torch.Tensor) -> tuple[int, int]:
    embed = model.patch_embed
    if getattr(model, "dynamic_img_size", False) and hasattr(embed, "dynamic_feat_size"):
        return tuple(int(g) for g in embed.dynamic_feat_size(tuple(x.shape[-2:])))
    return tuple(int(g) for g in embed.grid_size)


@torch.no_grad()
def class_token_rows(model: nn.Module, x: torch.Tensor, block: int = -1) -> dict:
    """For ONE image x ((C, H, W) or (1, C, H, W)): the class token's query row of every head's
    attention map in block `block` (negative counts from the end), with what draws it on the grid.

    Returns {"row": "class token" | "mean of rows", "block": the block's index (>= 0),
             "prefix": number of prefix tokens (class and register tokens, first as in timm),
             "grid": [patch rows, patch cols], "tokens": N,
             "heads": H lists of N floats (the whole row; the patch part is row[prefix:])}.
    A model without a class token (global_pool="avg", class_token=False) has no such row: the mean
    of the patch tokens' query rows (what average pooling reads) is given instead, and "row" says so.
    Teacher (softmax) rows sum to 1, and so do a linear student's (ImplicitAttention.maps). fp32.
    """
    if x.dim() == 3:
        x = x.unsqueeze(0)
    if x.dim() != 4 or x.shape[0] != 1:
        raise ValueError(f"class_token_rows takes one image, (C, H, W) or (1, C, H, W); got {tuple(x.shape)}")
    blocks = _eval_maps(model, x)
    index = range(len(blocks))[block]  # IndexError for a block the model does not have
    attn, inputs = blocks[index]
    maps = _maps(attn, inputs)[0]  # (H, N, N)
    prefix = int(getattr(model, "num_prefix_tokens", 0))
    grid = _patch_grid(model, x)
    n = maps.shape[-1]
    if n - prefix != grid[0] * grid[1]:
        raise ValueError(f"class_token_rows: {n} tokens do not match {prefix} prefix tokens plus a "
                         f"{grid[0]}x{grid[1]} patch grid")
    has_cls = getattr(model, "cls_token", None) is not None
    rows = maps[:, 0] if has_cls else maps[:, prefix:].mean(dim=1)
    return {"row": ROW_CLASS_TOKEN if has_cls else ROW_MEAN, "block": index, "prefix": prefix,
            "grid": [int(grid[0]), int(grid[1])], "tokens": n, "heads": rows.cpu().tolist()}


def attention_report(teacher: nn.Module, student: nn.Module, x: torch.Tensor, *, image: int = 0,
                     block: int = -1) -> dict:
    """The attention part of eval.json: per-block fidelity lists and their means, and the class-token
    rows of teacher and student on image `image` of x (block `block`)."""
    fid = attention_fidelity(teacher, student, x)
    out = {f"fidelity_{k}": v for k, v in fid.items()}
    out.update({f"fidelity_{k}_mean": sum(v) / len(v) for k, v in fid.items()})
    one = x[image:image + 1]
    out["cls_attention"] = {"teacher": class_token_rows(teacher, one, block),
                            "student": class_token_rows(student, one, block)}
    return out


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
