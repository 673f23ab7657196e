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
- The step runs through torch's DistributedDataParallel (`DataParallelStep`, below): one module
  whose forward is the task's loss (the student, the teachers the objective reads, the loss
  terms), so DDP averages the gradients over the ranks in buckets that overlap backward, and the
  step's loss is averaged beside it; every rank takes the same optimizer step and the parameters
  stay equal. One process is never wrapped: its step is the task's loss, as it always was.
- Evaluation counts are summed over the ranks; only rank 0 writes logs, checkpoints and outputs.
- The world size is not part of a run's fingerprint: the batches do not depend on it, so a job
  killed on 2 GPUs resumes on 1 and the other way round.

What stays exact under data parallelism, and what does not:

- Exact: the data order and the global batches (the seeded sample stream, above), the model's
  initialization (built from the seed on every rank, then rank 0's broadcast when DDP is built),
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
  read at the start of `fit` only, before DDP's broadcast that every rank must reach first, and a
  resumed job reads what the killed one left.
- One node only: a job torchrun spreads over several nodes (GROUP_WORLD_SIZE above 1, or
  LOCAL_WORLD_SIZE below WORLD_SIZE) is one line before joining (`check_one_node`): every rank reads
  the whole sample stream, which one node's page cache serves, and nothing here was tested across
  nodes.

The step (`DataParallelStep`): `StepModule` makes the task one module, its forward `task.loss(x,
y)`, with the task's model and the frozen models its objective reads (teachers) as submodules, and
DDP wraps it once per `fit` call (a design's next phase is another call, with its own trainable
parameters, hence its own DDP). DDP broadcasts rank 0's parameters and buffers when it is built
(after a resume has loaded the checkpoint), registers its reduction on the parameters that require
gradients, and cuts them into buckets (LINVIT_BUCKET_MB megabytes, or DDP's default: 25 MiB after a
first one of 1 MiB) that are all-reduced while backward goes on. The options, and why:

- `static_graph=True`. Within one `fit` the trained parameters and the loss's graph are the same
  at every step and on every rank: linvit's models, Mixup and objectives have no control flow that
  depends on the data or the step. Some trained parameters get no gradient at all (a design with
  `freeze: false` whose terms are teacher-forced leaves the student's head and embedding unused, a
  term reading some blocks leaves the others), which DDP finds in the first step; from then on it
  neither traverses the graph after each forward nor all-reduces a map of the used parameters in
  each backward, as `find_unused_parameters=True` would. A parameter no rank uses keeps `grad None`, so AdamW skips it exactly as in one process; one that
  some ranks use and others never do gets the mean over all ranks (zeros from the others).
  A graph that does change is refused before the optimizer step: DDP raises itself for a parameter
  used after a step without it, and `DataParallelStep.backward` raises `DataParallelError` in one
  line when a parameter that had a gradient at the first step has none (where DDP would otherwise
  leave that rank's gradients unaveraged); the other ranks are then freed by the failed rank's
  exit (torchrun stops the job), so nothing hangs and no diverged step is taken.
- `gradient_as_bucket_view=True`: the gradients are views into DDP's buckets, not a second copy.
- `forward_sync_buffers=False`: the buffers (rotary tables, performer's fixed features) never change
  after DDP's initial broadcast, so nothing is broadcast before each forward.
- No `device_ids`: the module and the batches are on this rank's device already.
- torch.compile: the modules `fit` compiles in place run inside DDP's forward, where dynamo's
  DDPOptimizer splits their graphs at DDP's bucket boundaries, so the all-reduces still overlap
  backward.
- No gradient accumulation exists in linvit; a future one would run its inner backwards under
  DDP's `no_sync()`.

The mean loss stays on the device (an asynchronous all-reduce launched before backward, waited for
after it); `linvit.train.fit` reads it on the host only every few steps (see its divergence check).
"""

from __future__ import annotations

import datetime
import hashlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

TIMEOUT_MIN = 30   # minutes a rank waits at a collective before the job is aborted (LINVIT_DIST_TIMEOUT_MIN)


class DataParallelError(RuntimeError):
    """A step that data parallelism cannot average correctly (its graph changed); one line."""


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
        check_one_node(size)
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

    def train_step(self, task) -> "TrainStep":
        """How `fit` computes a step's loss and gradients: the task's own loss with one process,
        through DistributedDataParallel over the ranks otherwise (`DataParallelStep`). Build it once
        the model holds what it resumes from: DDP broadcasts rank 0's parameters when it is built."""
        return DataParallelStep(self, task) if self.parallel else TrainStep(task)

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


def check_one_node(size: int) -> None:
    """A ValueError in one line when torchrun spreads this job over several nodes (module notes)."""
    nodes, local = _env_int("GROUP_WORLD_SIZE", 1), _env_int("LOCAL_WORLD_SIZE", size)
    if nodes > 1 or local != size:
        raise ValueError(f"torchrun started this job's {size} processes on several nodes (GROUP_WORLD_SIZE="
                         f"{os.environ.get('GROUP_WORLD_SIZE', 'unset')}, LOCAL_WORLD_SIZE="
                         f"{os.environ.get('LOCAL_WORLD_SIZE', 'unset')}): linvit trains data-parallel on one "
                         f"node only; use torchrun --standalone --nproc-per-node N")


def bucket_mb() -> float | None:
    """DDP's bucket size in megabytes (`bucket_cap_mb`): LINVIT_BUCKET_MB, or None when it is unset,
    DDP's default (25 MiB buckets after a first one of 1 MiB, which an explicit size would replace)."""
    if not os.environ.get("LINVIT_BUCKET_MB"):
        return None
    return _env_positive("LINVIT_BUCKET_MB", 0.0, "number")


class TrainStep:
    """One process's step: the task's loss, its backward, the loss left on the device. No
    communication; the order of operations is the loop's as it always was."""

    def __init__(self, task):
        self.task = task

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The step's loss on this process's batch (call it under the runtime's autocast)."""
        return self.task.loss(x, y)

    def backward(self, loss: torch.Tensor, scaler=None) -> torch.Tensor:
        """Backward of `loss` (scaled by an fp16 GradScaler when given); returns the loss to log, a 0-d
        float32 tensor on its device: here `loss` itself, detached."""
        (loss if scaler is None else scaler.scale(loss)).backward()
        return loss.detach().float()


class StepModule(nn.Module):
    """A training step as one module, for DistributedDataParallel: forward(x, y) is `task.loss(x, y)`.

    Its submodules are the task's model and the models its objective reads (the teacher, a separate
    logit teacher: frozen, so DDP broadcasts them once and reduces nothing of theirs); the trained
    parameters are those of the task's model that require gradients."""

    def __init__(self, task):
        super().__init__()
        self.model = task.model
        objective = getattr(task, "objective", None)
        frozen = [] if objective is None else [objective.teacher, objective.logit_teacher]
        self.frozen = nn.ModuleList({id(m): m for m in frozen if m is not self.model}.values())
        self._loss = task.loss

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self._loss(x, y)


class DataParallelStep(TrainStep):
    """The step over the ranks: `StepModule(task)` in DistributedDataParallel (options and why: module
    notes), the loss averaged over the ranks beside the gradients, and a check that the graph did
    not change (a parameter with a gradient at the first step has one at every step)."""

    def __init__(self, world: World, task):
        super().__init__(task)
        from torch.nn.parallel import DistributedDataParallel

        self.world = world
        named = task.trainable()
        self.names, self.params = [n for n, _ in named], [p for _, p in named]
        self.ddp = DistributedDataParallel(StepModule(task), static_graph=True, gradient_as_bucket_view=True,
                                           forward_sync_buffers=False, bucket_cap_mb=bucket_mb())
        self.pattern: list[bool] | None = None  # which parameters had a gradient at the first step

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.ddp(x, y)

    def backward(self, loss: torch.Tensor, scaler=None) -> torch.Tensor:
        """Backward through DDP (the gradients averaged over the ranks as it runs); returns the mean of
        the ranks' losses, on the device (all-reduced asynchronously, beside backward)."""
        mean = loss.detach().float().reshape(1).clone()
        work = dist.all_reduce(mean, op=dist.ReduceOp.SUM, async_op=True)
        (loss if scaler is None else scaler.scale(loss)).backward()
        self._check_graph()
        work.wait()
        return (mean / self.world.size)[0]

    def _check_graph(self) -> None:
        """A DataParallelError (one line) when a trained parameter that had a gradient at the first step
        has none now: the graph changed under static_graph, and DDP left this rank's gradients
        unaveraged; raised before the optimizer step (module notes)."""
        pattern = [p.grad is not None for p in self.params]
        if self.pattern is None:
            self.pattern = pattern
            return
        if pattern != self.pattern:
            lost = [n for n, now, first in zip(self.names, pattern, self.pattern) if first and not now]
            raise DataParallelError(
                f"data parallel step on rank {self.world.rank}: parameter(s) {', '.join(lost[:3])}"
                f"{' and more' if len(lost) > 3 else ''} got no gradient this step but did at the first: "
                f"the loss's graph changed between steps, which DDP's static_graph does not average "
                f"(linvit.distributed)")


def shutdown() -> None:
    """Leave the process group at the end of a command (torchrun's processes exit cleanly)."""
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
