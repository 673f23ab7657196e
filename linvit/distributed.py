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
- The gradients (and the step's loss) are averaged over the ranks before the optimizer step, in
  bucketed all-reduces that overlap backward (`GradientSync`, below), so every rank takes the same
  optimizer step and the parameters stay equal (gradient hooks rather than the
  DistributedDataParallel wrapper, because the distillation loss calls the blocks of two models,
  not one module's forward, which DDP needs to see every step).
- Evaluation counts are summed over the ranks; only rank 0 writes logs, checkpoints and outputs.
- The world size is not part of a run's fingerprint: the batches do not depend on it, so a job
  killed on 2 GPUs resumes on 1 and the other way round.

What stays exact under data parallelism, and what does not:

- Exact: the data order and the global batches (the seeded sample stream, above), the model's
  initialization (built from the seed on every rank, then rank 0's broadcast: `broadcast_module`),
  and the averaging of the gradients and the loss (every rank takes the same step, so the parameters
  stay equal to the bit across ranks). Up to float summation order, N x B/N is 1 x B.
- Not the same as one process: the stochastic layers' and the augmentation mixes' draws. Each rank
  draws its dropout, drop-path and timm Mixup randomness (Mixup draws from numpy, seeded per step
  from torch's generator: `linvit.steps.ClassifyTask`) from its own stream, seeded from (seed,
  rank) by `rank_seed`; otherwise every rank would drop the same units and mix with the same lambda
  on its share of the batch, N copies of one draw instead of N draws. Rank 0 keeps the stream of
  the seed itself, so a one-process run is bit-identical to what it was before streams were split;
  a run with dropout, drop-path or mixup on N processes matches one process in distribution only.
  A checkpoint keeps every rank's generator state (rank 0's as before, the others' beside it), so a
  killed job resumed on as many processes continues every stream; a rank the checkpoint has no
  state for (resumed on more processes) starts a stream seeded from (seed, rank, step).

The process group (`World.from_env`):

- The device is checked before joining: a rank whose LOCAL_RANK has no GPU (torchrun started more
  processes than this node shows, or CUDA is missing) is one line naming LOCAL_RANK, the visible
  device count and CUDA_VISIBLE_DEVICES, instead of a CUDA error in one rank and a hang in the others.
- `init_process_group` gets a timeout of LINVIT_DIST_TIMEOUT_MIN minutes (default 30, `TIMEOUT`)
  and, on CUDA, `device_id=cuda:LOCAL_RANK` (the communicator is bound to this process's GPU
  eagerly, not guessed at the first collective). Ranks legitimately wait on each other for a
  while: rank 0 writing a checkpoint or the outputs, one rank compiling longer, a cold page cache
  at the start of an epoch; NCCL's default of 10 minutes could abort a healthy job there, while a
  rank that died still frees the others' GPUs within half an hour rather than holding them.
- A barrier follows rank 0's final writes (`linvit.steps._finish`): no rank returns from a step
  before its outputs exist. No rank reads during a run what rank 0 wrote in it: checkpoints are
  read at the start of `fit` only, before the broadcast that every rank must reach first, and a
  resumed job reads what the killed one left.

Overlap (`GradientSync`): backward produces the gradients from the last layer to the first; every
trainable parameter has a post-accumulate-grad hook, and the parameters are cut into buckets of
about LINVIT_BUCKET_MB megabytes (default 25, `BUCKET_MB`) in reverse registration order. A bucket
whose gradients are all there is flattened and all-reduced asynchronously while backward goes on
(buckets are launched strictly in order, so every rank issues the same collectives in the same
order); `average` launches what is left (parameters that got no gradient this step), waits for all
of them and the loss's, and divides by N, before the optimizer step. The same code runs on gloo:
with two ranks each element's sum is one addition whichever way it is cut, so the bucketed path
gives the bit-identical gradients of one flat all-reduce there (tested). The mean loss stays on the
device; `linvit.train.fit` reads it on the host only every few steps (see its divergence check).
"""

from __future__ import annotations

import datetime
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

TIMEOUT_MIN = 30   # minutes a rank waits at a collective before the job is aborted (LINVIT_DIST_TIMEOUT_MIN)
BUCKET_MB = 25.0   # megabytes of gradients per asynchronous all-reduce (LINVIT_BUCKET_MB), as DDP's default


def _env_int(name: str, default: int) -> int:
    value = os.environ.get(name)
    if value in (None, ""):
        return default
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name}={value!r} is not an integer (set by torchrun)") from None


def torchrun_env() -> tuple[int, int, int]:
    """(WORLD_SIZE, RANK, LOCAL_RANK) as torchrun sets them, read without joining; (1, 0, 0) without it."""
    return _env_int("WORLD_SIZE", 1), _env_int("RANK", 0), _env_int("LOCAL_RANK", 0)


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
        size, rank, local_rank = torchrun_env()
        if size <= 1:
            return cls()
        if not dist.is_initialized():
            options = {"backend": "nccl" if device_type == "cuda" else "gloo", "timeout": timeout()}
            if device_type == "cuda":
                check_local_gpu(local_rank, size)  # before joining: the other ranks must not wait on it
                torch.cuda.set_device(local_rank)
                options["device_id"] = torch.device("cuda", local_rank)
            dist.init_process_group(**options)
        return cls(rank=rank, size=size, local_rank=local_rank)

    def rank_seed(self, seed: int, step: int = 0) -> int:
        """The seed of this rank's random stream (see the module's notes); rank 0's is `seed`."""
        return rank_seed(seed, self.rank, step)

    def gradient_sync(self, params, bucket_mb: float | None = None) -> "GradientSync":
        """Averaging of `params`' gradients over the ranks, overlapped with backward (a no-op for one
        process); close it when training ends (it removes its hooks)."""
        return GradientSync(self, params, bucket_mb)

    def rng_states(self, cuda_device: torch.device | None) -> list[dict]:
        """Every rank's generator states (CPU, and `cuda_device`'s), in rank order, on every rank: a
        collective, so every rank calls it at the same point."""
        own = {"rng": torch.get_rng_state()}
        if cuda_device is not None:
            own["cuda_rng"] = torch.cuda.get_rng_state(cuda_device)
        if not self.parallel:
            return [own]
        states: list = [None] * self.size
        dist.all_gather_object(states, own)
        return states

    def local_batch(self, batch_size: int, what: str) -> int:
        """The per-rank batch of a global `batch_size`; it must divide evenly, or the ranks would
        weight their samples differently and the global batch would not be the config's."""
        if batch_size % self.size:
            raise ValueError(f"{what}: batch_size {batch_size} is not divisible by the {self.size} "
                             f"processes of this job (torchrun --nproc-per-node)")
        return batch_size // self.size

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


def rank_seed(seed: int, rank: int, step: int = 0) -> int:
    """`seed` for rank 0 at step 0 (one process draws exactly what it always drew); for another rank
    or a stream restarted at `step`, 63 bits of sha256("seed:rank:step"): distinct streams, and no
    collision with another run's seed the way seed + rank would collide with seed + 1."""
    if rank == 0 and step == 0:
        return seed
    return int.from_bytes(hashlib.sha256(f"{seed}:{rank}:{step}".encode()).digest()[:8], "little") >> 1


def _env_positive(name: str, default: float, what: str) -> float:
    """A positive number from environment variable `name` (unset or empty: `default`), else one line."""
    value = os.environ.get(name, "")
    try:
        number = float(value) if value else default
    except ValueError:
        number = -1
    if not number > 0:
        raise ValueError(f"environment variable {name}={value!r} is not a positive {what}")
    return number


def timeout() -> datetime.timedelta:
    """How long a rank waits at a collective: LINVIT_DIST_TIMEOUT_MIN minutes (default `TIMEOUT_MIN`)."""
    return datetime.timedelta(minutes=_env_positive("LINVIT_DIST_TIMEOUT_MIN", TIMEOUT_MIN, "number of minutes"))


def check_local_gpu(local_rank: int, size: int) -> None:
    """A ValueError in one line when this rank's GPU, cuda:LOCAL_RANK, is not there."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    shown = "unset" if visible is None else repr(visible)
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if local_rank < count:
        return
    raise ValueError(f"torchrun rank with LOCAL_RANK={local_rank} (one of {size} processes) has no GPU "
                     f"cuda:{local_rank}: this process sees {count} CUDA device(s) (CUDA_VISIBLE_DEVICES "
                     f"{shown}); start at most {count} processes per node (--nproc-per-node) or run on the CPU"
                     if count else
                     f"torchrun rank with LOCAL_RANK={local_rank} (one of {size} processes) was asked for "
                     f"CUDA, but this process sees 0 CUDA devices (torch.cuda.is_available() is False; "
                     f"CUDA_VISIBLE_DEVICES {shown})")


class GradientSync:
    """Average the gradients of `params` over the ranks as backward produces them (module notes).

    One per training run: `average(loss)` after each backward, `close()` at the end. With one
    process it only hands the loss back.
    """

    def __init__(self, world: World, params, bucket_mb: float | None = None):
        self.world, self.buckets, self.hooks = world, [], []
        if not world.parallel:
            return
        if bucket_mb is None:
            bucket_mb = _env_positive("LINVIT_BUCKET_MB", BUCKET_MB, "number")
        unique = list({id(p): p for p in params if p.requires_grad}.values())
        limit, size = bucket_mb * 2**20, 0
        for p in reversed(unique):  # backward reaches the last registered parameters first
            if not self.buckets or size + p.numel() * 4 > limit:
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(p)
            size += p.numel() * 4  # reduced in float32
        self.bucket_of = {id(p): i for i, bucket in enumerate(self.buckets) for p in bucket}
        self.hooks = [p.register_post_accumulate_grad_hook(self._ready) for p in unique]
        self._reset()

    def _reset(self) -> None:
        self.waiting = [len(b) for b in self.buckets]  # gradients each bucket still waits for
        self.launched: list = []                        # (grads, flat buffer, work) in bucket order

    def _ready(self, p: torch.Tensor) -> None:
        self.waiting[self.bucket_of[id(p)]] -= 1
        while len(self.launched) < len(self.buckets) and self.waiting[len(self.launched)] == 0:
            self._launch()

    def _launch(self) -> None:
        grads = [p.grad for p in self.buckets[len(self.launched)] if p.grad is not None]
        if not grads:
            self.launched.append((grads, None, None))
            return
        flat = torch.cat([g.reshape(-1).float() for g in grads])
        self.launched.append((grads, flat, dist.all_reduce(flat, op=dist.ReduceOp.SUM, async_op=True)))

    def average(self, loss: torch.Tensor) -> torch.Tensor:
        """After backward: every gradient replaced by its mean over the ranks, and the mean of the
        ranks' `loss`, a 0-d float32 tensor on its device (nothing waits for the host here)."""
        if not self.world.parallel:
            return loss.detach().float()
        mean = loss.detach().float().reshape(1).clone()
        loss_work = dist.all_reduce(mean, op=dist.ReduceOp.SUM, async_op=True)
        while len(self.launched) < len(self.buckets):  # buckets with a parameter that got no gradient
            self._launch()
        for grads, flat, work in self.launched:
            if work is None:
                continue
            work.wait()
            flat /= self.world.size
            offset = 0
            for g in grads:
                g.copy_(flat[offset:offset + g.numel()].view_as(g))
                offset += g.numel()
        loss_work.wait()
        self._reset()
        return (mean / self.world.size)[0]

    def close(self) -> None:
        for hook in self.hooks:
            hook.remove()
        self.hooks = []


def shutdown() -> None:
    """Leave the process group at the end of a command (torchrun's processes exit cleanly)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
