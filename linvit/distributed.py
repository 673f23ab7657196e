"""Data parallelism across the processes `torchrun` starts: one training loop, N ranks.

`torchrun --standalone --nproc-per-node N --no-python linvit student ...` runs N copies of a step;
`World.from_env` joins them into one process group (NCCL on CUDA, gloo on the CPU) after checking the
launch (one node, torchrun rather than several `srun` tasks) and this rank's GPU. Without torchrun the
world is one process and nothing here communicates. Every rank forms the same global batches and
trains on its share (`linvit.data.loader`), so N ranks see exactly the batches one process would.

The step (`DataParallelStep`) is the task's loss as one module (`StepModule`) in DistributedDataParallel
(static graph, gradients as bucket views, no per-forward buffer sync), the loss averaged beside the
gradients, one backward per forward, and a one-line refusal when the graph changes between steps.
Only rank 0 writes; `rank_seed` gives every other rank its own random stream.

Why each choice, what stays exact and what does not, and the measured parity: docs/data_parallel.md.
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
        raise ValueError(f"environment variable {name}={value!r} is not an integer") from None


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
        check_launch()
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

    def train_step(self, task, compiled: bool = False) -> "TrainStep":
        """How `fit` computes a step's loss and gradients: the task's own loss with one process,
        through DistributedDataParallel over the ranks otherwise (`DataParallelStep`). Build it once
        the model holds what it resumes from: DDP broadcasts rank 0's parameters when it is built."""
        return DataParallelStep(self, task, compiled) if self.parallel else TrainStep(task)

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


def check_launch() -> None:
    """A ValueError in one line when Slurm's srun started several copies of this command (several tasks,
    or one torchrun per node of several): without torchrun's variables each would train alone as rank 0,
    and all would write the same --out. The workflow's Slurm jobs run one task (`srun -n1`) in which
    torchrun starts the ranks."""
    tasks, nodes = _env_int("SLURM_STEP_NUM_TASKS", 1), _env_int("SLURM_STEP_NUM_NODES", 1)
    if tasks > 1 or nodes > 1:
        raise ValueError(f"srun started this command as {tasks} tasks on {nodes} node(s) (SLURM_STEP_NUM_TASKS="
                         f"{tasks}, SLURM_STEP_NUM_NODES={nodes}), which would train apart into the same --out: "
                         f"start one task on one node (srun -N1 -n1) running torchrun --standalone "
                         f"--nproc-per-node N --no-python linvit ..., as the workflow does for a rule with gpu: N")


def check_one_node(size: int) -> None:
    """A ValueError in one line when torchrun spreads this job over several nodes (module notes)."""
    nodes, local = _env_int("GROUP_WORLD_SIZE", 1), _env_int("LOCAL_WORLD_SIZE", size)
    if nodes > 1 or local != size:
        raise ValueError(f"torchrun started this job's {size} processes on several nodes (GROUP_WORLD_SIZE="
                         f"{os.environ.get('GROUP_WORLD_SIZE', 'unset')}, LOCAL_WORLD_SIZE="
                         f"{os.environ.get('LOCAL_WORLD_SIZE', 'unset')}): linvit trains data-parallel on one "
                         f"node only; use torchrun --standalone --nproc-per-node N")


def bucket_mb(compiled: bool = False) -> float | None:
    """DDP's bucket size in megabytes (`bucket_cap_mb`): LINVIT_BUCKET_MB, or None when it is unset,
    DDP's default (25 MiB buckets after a first one of 1 MiB, which an explicit size would replace).
    `compiled`: the step runs modules torch.compile compiled, whose DDPOptimizer keeps DDP's default
    first bucket of 1 MiB and asserts that no bucket is smaller, so a smaller size is one line here."""
    if not os.environ.get("LINVIT_BUCKET_MB"):
        return None
    mb = _env_positive("LINVIT_BUCKET_MB", 0.0, "number")
    first = dist._DEFAULT_FIRST_BUCKET_BYTES / 2**20
    if compiled and mb < first:
        raise ValueError(f"environment variable LINVIT_BUCKET_MB={os.environ['LINVIT_BUCKET_MB']!r} is below "
                         f"{first:g}: under runtime.compile, dynamo's DDPOptimizer needs buckets of at least DDP's "
                         f"first bucket ({first:g} MiB)")
    return mb


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

    def __init__(self, world: World, task, compiled: bool = False):
        super().__init__(task)
        from torch.nn.parallel import DistributedDataParallel

        self.world = world
        named = task.trainable()
        self.names, self.params = [n for n, _ in named], [p for _, p in named]
        self.ddp = DistributedDataParallel(StepModule(task), static_graph=True, gradient_as_bucket_view=True,
                                           forward_sync_buffers=False, bucket_cap_mb=bucket_mb(compiled))
        self.pattern: list[bool] | None = None  # which parameters had a gradient at the first step
        self.forwards = 0  # forwards not yet followed by their backward

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        self.forwards += 1
        return self.ddp(x, y)

    def backward(self, loss: torch.Tensor, scaler=None) -> torch.Tensor:
        """Backward through DDP (the gradients averaged over the ranks as it runs); returns the mean of
        the ranks' losses, on the device (all-reduced asynchronously, beside backward). One backward per
        forward: DDP reduces a bucket once per forward, so a second backward through the same forward
        (retain_graph, or gradient accumulation without DDP's no_sync) would leave its gradients
        unaveraged, each rank on its own; it is refused."""
        if self.forwards != 1:
            raise DataParallelError(
                f"data parallel step on rank {self.world.rank}: {self.forwards} forward(s) before this backward; "
                f"DDP averages one backward per forward, so a second backward through one forward "
                f"(retain_graph) or several forwards per backward are not supported (linvit.distributed)")
        self.forwards = 0
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
