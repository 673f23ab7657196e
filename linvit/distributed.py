"""Data parallelism across the processes `torchrun` starts: one training loop, N ranks.

`World.from_env` joins torchrun's processes into one process group (NCCL on CUDA, gloo on the CPU)
once `linvit.launch` has checked how they were started; without torchrun the world is one process.
`DataParallelStep` runs the task's loss as one module in DistributedDataParallel, the loss averaged
beside the gradients; only rank 0 writes, and `rank_seed` gives each other rank its own stream.
Why each choice, what stays exact and what does not, and the measured parity: docs/data_parallel.md.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from .launch import bucket_mb, check_launch, check_local_gpu, check_one_node, timeout, torchrun_env


class DataParallelError(RuntimeError):
    """A step that data parallelism cannot average correctly (its graph changed); one line."""


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
        """The seed of this rank's random stream ; rank 0's is `seed`."""
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
    """The step over the ranks: `StepModule(task)` in DistributedDataParallel, the loss averaged beside
    the gradients, and a check that a parameter with a gradient at the first step has one at every step."""

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
        """Backward through DDP; returns the mean of the ranks' losses, on the device (all-reduced beside
        backward). One per forward: DDP reduces each bucket once per forward, so a second backward
        (retain_graph) would leave its gradients unaveraged on each rank."""
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
        """One line, before the optimizer step, when a parameter with a gradient at the first step has none
        now: the graph changed under static_graph, and DDP left this rank's gradients unaveraged."""
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
