"""Two (or N) ranks of the real training loop in one call: the data-parallel check.

`check(device_type)` starts `ranks` processes (torch.multiprocessing, spawn), each one rank of a
process group as torchrun would describe it (RANK, WORLD_SIZE, LOCAL_RANK, a free local port),
and one more process alone (WORLD_SIZE=1) as the reference. Each runs `linvit.train.fit`, the loop
every training step uses, on a small MLP with dropout over seeded in-memory data, with gradient
buckets small enough that backward launches several all-reduces (`LINVIT_BUCKET_MB`), and records
the dropout masks of every step and the final parameters. What it shows:

- the parameters are equal to the bit across ranks after training (the gradients were averaged);
- the ranks' dropout masks differ (each rank draws from its own stream, `linvit.distributed`);
- rank 0's masks are those of one process training on batches of the same (per-rank) size, the
  stream one process always had.

`python -m linvit.gpucheck` runs it on NCCL where two GPUs exist; tests/test_distributed.py runs it
on the CPU with gloo.
"""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path

import torch
from torch import nn

IN, HIDDEN, CLASSES = 16, 64, 4
BUCKET_MB = "0.004"   # ~4 KB buckets: the MLP's 6 tensors go in 4 all-reduces


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


def _rank(index: int, ranks: int, port: int, device: str, out: str, steps: int, batch: int, seed: int,
          dropout: float) -> None:
    """One process of the check: rank `index` of `ranks` (ranks=1: the one-process reference)."""
    os.environ.update(RANK=str(index), LOCAL_RANK=str(index), WORLD_SIZE=str(ranks), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port), LINVIT_BUCKET_MB=BUCKET_MB)
    torch.set_num_threads(1)
    from .device import runtime
    from .distributed import shutdown
    from .train import TrainSpec, fit

    try:
        rt = runtime({"runtime": {"precision": "fp32"}}, device=device)
        torch.manual_seed(seed)  # the model as a step builds it: seeded, then rank 0's broadcast
        task = _Task(rt.device, dropout)
        spec = TrainSpec(steps=steps, batch_size=batch, lr=1e-2, log_every=steps, clip_grad=1.0)
        # Two epochs: the checkpoint at the first epoch's end gathers every rank's generator state.
        summary = fit(task, spec, _Data(batch * max(1, steps // 2), seed), Path(out) / f"run{ranks}", seed=seed,
                      desc=f"dpcheck rank {index}/{ranks}", runtime=rt)
        torch.save({"masks": [m.cpu() for m in task.masks], "loss": summary["final_loss"],
                    "backend": rt.world.backend, "params": {k: v.detach().cpu() for k, v in task.model.state_dict().items()}},
                   Path(out) / f"rank{index}of{ranks}.pt")
    finally:
        shutdown()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(ranks: int, *args) -> None:
    import torch.multiprocessing as mp

    mp.start_processes(_rank, args=(ranks, _free_port(), *args), nprocs=ranks, join=True, start_method="spawn")


def check(device: str = "cuda", *, ranks: int = 2, steps: int = 4, batch: int = 16, seed: int = 0,
          dropout: float = 0.5) -> dict:
    """Train on `ranks` processes of `device` ("cuda": cuda:LOCAL_RANK with NCCL; "cpu": gloo) and in one
    process with the per-rank batch; return the comparison (module notes). Raises what a rank raised."""
    if batch % ranks:
        raise ValueError(f"batch {batch} is not divisible by {ranks} ranks")
    with tempfile.TemporaryDirectory(prefix="linvit-dpcheck-") as out:
        _start(ranks, device, out, steps, batch, seed, dropout)
        _start(1, device, out, steps, batch // ranks, seed, dropout)
        runs = [torch.load(Path(out) / f"rank{r}of{ranks}.pt") for r in range(ranks)]
        alone = torch.load(Path(out) / "rank0of1.pt")
    first = runs[0]
    param_diff = max((run["params"][k] - first["params"][k]).abs().max().item() for run in runs[1:] for k in first["params"])
    masks = [torch.stack(run["masks"]) for run in runs]
    differ = [(m != masks[0]).float().mean().item() for m in masks[1:]]
    same_as_alone = len(first["masks"]) == len(alone["masks"]) and all(
        torch.equal(a, b) for a, b in zip(first["masks"], alone["masks"]))
    result = {"ranks": ranks, "backend": first["backend"], "steps": steps, "batch": batch,
              "param_max_diff": param_diff, "params_equal": param_diff == 0.0,
              "mask_fraction_differing": min(differ), "masks_differ": min(differ) > 0,
              "rank0_masks_are_one_process": same_as_alone, "loss": first["loss"]}
    result["ok"] = result["params_equal"] and result["masks_differ"] and same_as_alone
    return result
