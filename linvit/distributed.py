"""Data parallelism across the processes `torchrun` starts: one training loop, N ranks.

A step launched as `torchrun --standalone --nproc-per-node N --no-python linvit student ...` runs N
copies of the same command; torchrun sets RANK, WORLD_SIZE and LOCAL_RANK, and `World.from_env`
joins them into one process group (NCCL on CUDA, gloo on the CPU). Without torchrun (WORLD_SIZE
unset or 1) the world is one process and nothing here communicates.

How the loop uses it (see `linvit.train.fit` and `linvit.data.loader.ShardSet.batches`):

- Every rank reads the same seeded sample stream and forms the same global batch of
  `train.batch_size`; rank r decodes and trains on its contiguous share of it (batch_size / N
  samples). So every rank has the same number of batches, and N processes see exactly the batches
  one process would: the loss curve of 2 x B/2 is that of 1 x B up to float summation order.
- After backward, the gradients (and the step's loss) are averaged over the ranks in one
  flattened all-reduce, so every rank takes the same optimizer step and the parameters stay equal
  (this, rather than the DistributedDataParallel wrapper, because the distillation loss calls the
  blocks of two models, which DDP's forward hooks would not see).
- Evaluation counts are summed over the ranks; only rank 0 writes logs, checkpoints and outputs.
- The world size is not part of a run's fingerprint: the batches do not depend on it, so a job
  killed on 2 GPUs resumes on 1 and the other way round.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value in (None, ""):
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer (set by torchrun)") from None


@dataclass(frozen=True)
class World:
    """This process's place among the ranks of a job (rank 0 of 1 without torchrun)."""

    rank: int = 0
    size: int = 1
    local_rank: int = 0

    @property
    def main(self) -> bool:
        """Rank 0: the one process that writes logs, checkpoints and outputs."""
        return self.rank == 0

    @property
    def parallel(self) -> bool:
        return self.size > 1

    @property
    def backend(self) -> str | None:
        """nccl or gloo; None for one process."""
        return dist.get_backend() if self.parallel else None

    @classmethod
    def from_env(cls, device_type: str) -> "World":
        """Join the process group torchrun describes in the environment (once per process)."""
        size = _env_int("WORLD_SIZE", 1)
        if size <= 1:
            return cls()
        rank, local_rank = _env_int("RANK", 0), _env_int("LOCAL_RANK", 0)
        if not dist.is_initialized():
            backend = "nccl" if device_type == "cuda" else "gloo"
            if device_type == "cuda":
                torch.cuda.set_device(local_rank)
            dist.init_process_group(backend=backend)
        return cls(rank=rank, size=size, local_rank=local_rank)

    def local_batch(self, batch_size: int, what: str) -> int:
        """The per-rank batch of a global `batch_size`; it must divide evenly, or the ranks would
        weight their samples differently and the global batch would not be the config's."""
        if batch_size % self.size:
            raise ValueError(f"{what}: batch_size {batch_size} is not divisible by the {self.size} "
                             f"processes of this job (torchrun --nproc-per-node)")
        return batch_size // self.size

    def average_gradients(self, params, loss: torch.Tensor) -> float:
        """Average the gradients of `params` and the step's `loss` over the ranks, in place; return
        the mean loss (the same number on every rank, so they agree on divergence)."""
        if not self.parallel:
            return loss.item()
        grads = [p.grad for p in params if p.grad is not None]
        flat = torch.cat([g.reshape(-1).float() for g in grads] + [loss.detach().reshape(1).float()])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        flat /= self.size
        offset = 0
        for g in grads:
            n = g.numel()
            g.copy_(flat[offset:offset + n].view_as(g))
            offset += n
        return flat[-1].item()

    def sum(self, *values: float) -> tuple[float, ...]:
        """Sums of numbers over the ranks (evaluation counts)."""
        if not self.parallel:
            return values
        device = "cuda" if self.backend == "nccl" else "cpu"
        t = torch.tensor(values, dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return tuple(t.tolist())

    def barrier(self) -> None:
        if self.parallel:
            dist.barrier()

    def broadcast_module(self, module: torch.nn.Module) -> None:
        """Rank 0's parameters and buffers to every rank (they start equal, whatever each built)."""
        if not self.parallel:
            return
        with torch.no_grad():
            for t in list(module.parameters()) + list(module.buffers()):
                dist.broadcast(t.data, src=0)


def shutdown() -> None:
    """Leave the process group at the end of a command (torchrun's processes exit cleanly)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
