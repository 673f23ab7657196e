"""N ranks of the real training loop against one process: the data-parallel check.

`check(device)` starts `ranks` processes (torch.multiprocessing, spawn), each one rank of a process
group as torchrun would describe it (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, a free local
port), and one more process alone (WORLD_SIZE=1) as the reference. Each runs `linvit.train.fit`, the
loop every training step uses (so DistributedDataParallel on the ranks, `linvit.distributed`), on
small MLPs over seeded in-memory data, with DDP buckets small enough that backward launches several
all-reduces (`LINVIT_BUCKET_MB`). Two things are checked:

- Parity, in every precision of `precisions` (fp32; bf16; fp16 with a GradScaler): an MLP without
  dropout trained on N ranks x B/N against one process on the full batch B. Every optimizer step's
  gradients (as the optimizer sees them: averaged over the ranks, unscaled; recorded by an optimizer
  step pre-hook, no clipping) and every step's logged loss must match one process's to the
  precision's tolerance (`TOLERANCE`, relative: ||g_N - g_1|| / ||g_1||); the ranks' parameters must
  be equal to the bit. A sum over the ranks instead of a mean is off by 1 (relative): caught in
  every precision (`fault="sum"` makes the ranks sum, to show it).
- Random streams, in fp32: an MLP with dropout on N ranks, and one process with the per-rank batch:
  the parameters equal to the bit across ranks, the ranks' dropout masks different (each rank draws
  from its own stream), rank 0's masks those of one process (the stream one process always had).

`python -m linvit.gpucheck` runs it on NCCL where two GPUs exist (fp32 there uses TF32 matmuls, as
every CUDA run: `linvit.device`); tests/test_distributed.py runs it on the CPU with gloo.
"""

from __future__ import annotations

import json
import os
import socket
import tempfile
from pathlib import Path

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

IN, HIDDEN, CLASSES = 16, 64, 4
BUCKET_MB = "0.004"   # ~4 KB buckets: the MLP's 6 tensors go in several all-reduces
COMPILED_BUCKET_MB = "1"  # compiled: dynamo's DDPOptimizer takes no bucket below DDP's first (1 MiB)
PRECISIONS = ("fp32", "bf16", "fp16")
# Relative gradient and loss differences allowed between N ranks and one process. fp32 differs by the
# order of float sums (measured on the CPU: ~1e-7); TF32 (fp32 on CUDA), fp16 and bf16 round each
# rank's products and gradients to 10 or 7 bits, and a rank's half-batch sum rounds differently from
# the full batch's. A sum over the ranks instead of a mean is off by 1.
TOLERANCE = {"fp32": 1e-4, "tf32": 1e-2, "fp16": 1e-2, "bf16": 5e-2}


class _Data:
    """`ShardSet`'s interface to `fit` over seeded in-memory tensors: every rank forms the same global
    batches from a permutation seeded by (seed, epoch) and keeps its contiguous share."""

    def __init__(self, samples: int, seed: int):
        gen = torch.Generator().manual_seed(seed + 1)
        self.x = torch.randn(samples, IN, generator=gen)
        self.y = torch.randint(0, CLASSES, (samples,), generator=gen)

    def num_samples(self, split: str) -> int:
        return len(self.x)

    def steps_per_epoch(self, split: str, batch_size: int) -> int:
        return len(self.x) // batch_size

    def batches(self, split, batch_size, *, seed=0, epoch=0, shuffle=False, drop_last=False, skip_batches=0,
                rank=0, ranks=1, **_):
        order = torch.randperm(len(self.x), generator=torch.Generator().manual_seed(seed * 1000 + epoch))
        for b in range(skip_batches, self.steps_per_epoch(split, batch_size)):
            own = order[b * batch_size:(b + 1) * batch_size][rank * batch_size // ranks:(rank + 1) * batch_size // ranks]
            yield self.x[own], self.y[own]


class _Task:
    def __init__(self, device: torch.device, dropout: float):
        self.model = nn.Sequential(nn.Linear(IN, HIDDEN), nn.GELU(), nn.Dropout(dropout),
                                   nn.Linear(HIDDEN, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, CLASSES)).to(device)
        self.masks: list[torch.Tensor] = []
        self.model[2].register_forward_hook(lambda m, i, o: self.masks.append(o.detach() != 0) if m.training else None)

    def trainable(self):
        return list(self.model.named_parameters())

    def loss(self, x, y):
        return nn.functional.cross_entropy(self.model(x), y)

    def evaluate(self, final: bool) -> dict:
        return {}


def _sum_instead_of_mean(world, task, compiled: bool = False):
    """`World.train_step` with DDP summing the ranks' gradients (a comm hook that does not divide): the
    fault `check(fault="sum")` plants to show that the parity check catches it."""
    import torch.distributed as dist

    from .distributed import DataParallelStep

    def hook(state, bucket):
        return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda f: f.value()[0])

    step = DataParallelStep(world, task, compiled)
    step.ddp.register_comm_hook(None, hook)
    return step


def _fit(task, rt, out: Path, *, steps: int, batch: int, seed: int, clip: float | None) -> dict:
    """`fit` on `task` for `steps` steps of global batch `batch` (two epochs: the checkpoint at the
    first epoch's end gathers every rank's generator state); the gradients of every optimizer step,
    flat, as the optimizer sees them, the logged losses and the final parameters."""
    from .train import TrainSpec, fit

    grads: list[torch.Tensor | None] = []
    params = [p for _, p in task.trainable()]

    def record(optimizer, args, kwargs):
        # A fused AdamW under a GradScaler unscales in its kernel: the scale and the overflow flag are
        # the optimizer's attributes for this step (None: a step the scaler skips).
        scale, found_inf = getattr(optimizer, "grad_scale", None), getattr(optimizer, "found_inf", None)
        if found_inf is not None and found_inf.item() > 0:
            grads.append(None)
            return
        flat = torch.cat([p.grad.detach().float().reshape(-1).cpu() for p in params])
        grads.append(flat if scale is None else flat / scale.float().cpu())

    handle = register_optimizer_step_pre_hook(record)
    try:
        spec = TrainSpec(steps=steps, batch_size=batch, lr=1e-2, log_every=1, clip_grad=clip)
        fit(task, spec, _Data(batch * max(1, steps // 2), seed), out, seed=seed, desc=f"dpcheck {out.name}", runtime=rt)
    finally:
        handle.remove()
    log = out / "checkpoint" / "train.jsonl"  # rank 0's, the ranks' mean (fit leaves it there)
    losses = [r["loss"] for r in map(json.loads, log.read_text().splitlines()) if r["kind"] == "train"] \
        if rt.world.main else []
    return {"grads": grads, "losses": losses, "params": {k: v.detach().cpu() for k, v in task.model.state_dict().items()},
            "masks": [m.cpu() for m in task.masks]}


def _rank(index: int, ranks: int, port: int, parallel: int, device: str, out: str, steps: int, batch: int,
          seed: int, dropout: float, precisions: tuple[str, ...], fault: str | None, compile: str | None) -> None:
    """One process of the check: rank `index` of `ranks` (ranks=1: the one-process reference of a check
    of `parallel` ranks). `batch`: the global batch of the parity runs; the dropout run's is `batch`
    on the ranks and batch / parallel alone (rank 0's share)."""
    os.environ.update(RANK=str(index), LOCAL_RANK=str(index), WORLD_SIZE=str(ranks), LOCAL_WORLD_SIZE=str(ranks),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      LINVIT_BUCKET_MB=COMPILED_BUCKET_MB if compile else BUCKET_MB)
    torch.set_num_threads(1)
    from .device import runtime
    from .distributed import World, shutdown

    if fault == "sum" and ranks > 1:
        World.train_step = _sum_instead_of_mean
    try:
        record = {}
        for precision in precisions:
            rt = runtime({"runtime": {"precision": precision, "compile": compile or False}}, device=device)
            torch.manual_seed(seed)  # the model as a step builds it: seeded, then rank 0's broadcast
            run = _fit(_Task(rt.device, 0.0), rt, Path(out) / f"{precision}-{ranks}", steps=steps, batch=batch,
                       seed=seed, clip=None)
            record[precision] = {k: run[k] for k in ("grads", "losses", "params")}
        rt = runtime({"runtime": {"precision": "fp32"}}, device=device)
        torch.manual_seed(seed)
        run = _fit(_Task(rt.device, dropout), rt, Path(out) / f"dropout-{ranks}", steps=steps,
                   batch=batch * ranks // parallel, seed=seed, clip=1.0)
        record["dropout"] = {"masks": run["masks"], "params": run["params"]}
        record["backend"] = rt.world.backend
        record["tf32"] = rt.cuda and torch.backends.cuda.matmul.fp32_precision == "tf32"
        torch.save(record, Path(out) / f"rank{index}of{ranks}.pt")
    finally:
        shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(ranks: int, *args) -> None:
    import torch.multiprocessing as mp

    mp.start_processes(_rank, args=(ranks, _free_port(), *args), nprocs=ranks, join=True, start_method="spawn")


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b|| (0 when both are 0)."""
    norm = b.norm().item()
    return (a - b).norm().item() / norm if norm else float((a - b).norm().item() > 0)


def parity(runs: list[dict], alone: dict, precision: str, tf32: bool = False) -> dict:
    """The comparison of one precision's runs (rank records) with one process's on the full batch."""
    first = runs[0][precision]
    ref = alone[precision]
    tolerance = TOLERANCE["tf32" if tf32 and precision == "fp32" else precision]
    same_steps = len(first["grads"]) == len(ref["grads"]) > 0 and len(first["losses"]) == len(ref["losses"]) > 0
    # A step the GradScaler skipped (None) must be skipped by both.
    grad = max((0.0 if a is None and b is None else float("inf") if a is None or b is None else _relative(a, b)
                for a, b in zip(first["grads"], ref["grads"])), default=float("inf"))
    loss = max((abs(a - b) / max(abs(b), 1e-12) for a, b in zip(first["losses"], ref["losses"])), default=float("inf"))
    across = max((run[precision]["params"][k] - first["params"][k]).abs().max().item()
                 for run in runs[1:] for k in first["params"])
    ok = same_steps and grad <= tolerance and loss <= tolerance and across == 0.0
    return {"precision": precision, "steps_compared": sum(g is not None for g in first["grads"]), "grad_rel_diff": grad,
            "loss_rel_diff": loss, "tolerance": tolerance, "param_max_diff_across_ranks": across, "ok": ok}


def check(device: str = "cuda", *, ranks: int = 2, steps: int = 4, batch: int = 16, seed: int = 0,
          dropout: float = 0.5, precisions=PRECISIONS, fault: str | None = None, compile: str | None = None) -> dict:
    """Train on `ranks` processes of `device` ("cuda": cuda:LOCAL_RANK with NCCL; "cpu": gloo) and in one
    process; return the comparison (module notes). `fault="sum"`: the ranks sum their gradients instead
    of averaging them (the check must then fail). `compile`: a torch.compile backend the parity runs'
    models are compiled with (the dropout run stays eager). Raises what a rank raised."""
    if batch % ranks:
        raise ValueError(f"batch {batch} is not divisible by {ranks} ranks")
    if fault not in (None, "sum"):
        raise ValueError(f"fault {fault!r}: known: sum")
    precisions = tuple(precisions)
    with tempfile.TemporaryDirectory(prefix="linvit-dpcheck-") as out:
        args = (ranks, device, out, steps, batch, seed, dropout, precisions, fault, compile)
        _start(ranks, *args)
        _start(1, *args)
        runs = [torch.load(Path(out) / f"rank{r}of{ranks}.pt") for r in range(ranks)]
        alone = torch.load(Path(out) / "rank0of1.pt")
    first = runs[0]["dropout"]
    param_diff = max((run["dropout"]["params"][k] - first["params"][k]).abs().max().item()
                     for run in runs[1:] for k in first["params"])
    masks = [torch.stack(run["dropout"]["masks"]) for run in runs]
    differ = [(m != masks[0]).float().mean().item() for m in masks[1:]]
    same_as_alone = len(first["masks"]) == len(alone["dropout"]["masks"]) and all(
        torch.equal(a, b) for a, b in zip(first["masks"], alone["dropout"]["masks"]))
    result = {"ranks": ranks, "backend": runs[0]["backend"], "steps": steps, "batch": batch,
              "parity": [parity(runs, alone, p, runs[0]["tf32"]) for p in precisions],
              "param_max_diff": param_diff, "params_equal": param_diff == 0.0,
              "mask_fraction_differing": min(differ), "masks_differ": min(differ) > 0,
              "rank0_masks_are_one_process": same_as_alone}
    result["ok"] = (all(p["ok"] for p in result["parity"]) and result["params_equal"] and result["masks_differ"]
                    and same_as_alone)
    return result
