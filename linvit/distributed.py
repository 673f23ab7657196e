"""Data parallelism over the processes `torchrun` starts: `World.from_env` joins them in one group
(NCCL on CUDA, gloo on the CPU) once `linvit.launch` has checked the launch; `DataParallelStep` runs
the task's loss as one module in DistributedDataParallel. Only rank 0 writes; `rank_seed` gives each
other rank its own stream. Why each choice, and the measured parity: docs/data_parallel.md."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

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
    def main(self) -> bool:  # rank 0: the one process that writes logs, checkpoints and outputs
        return self.rank == 0

    @property
    def parallel(self) -> bool:
        return self.size > 1

    @property
    def backend(self) -> str | None:  # nccl or gloo; None for one process
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

    def train_step(self, task, compiled: bool = False) -> "TrainStep":
        """How `fit` computes a step's loss and gradients. Build it once the model holds what it resumes
        from: DDP broadcasts rank 0's parameters when it is built."""
        return DataParallelStep(self, task, compiled) if self.parallel else TrainStep(task)

    def rng_states(self, cuda_device: torch.device | None) -> list[dict]:
        """Every rank's generator states (CPU, `cuda_device`'s) in rank order; a collective."""
        own = {"rng": torch.get_rng_state()}
        if cuda_device is not None:
            own["cuda_rng"] = torch.cuda.get_rng_state(cuda_device)
        states: list = [own] * self.size
        if self.parallel:
            dist.all_gather_object(states, own)
        return states

    def local_batch(self, batch_size: int, what: str) -> int:
        """The per-rank share of a global `batch_size`, which must divide evenly (equal sample weights)."""
        if batch_size % self.size:
            raise ValueError(f"{what}: batch_size {batch_size} is not divisible by the {self.size} "
                             f"processes of this job (torchrun --nproc-per-node)")
        return batch_size // self.size

    def sum(self, *values: float) -> tuple[float, ...]:  # over the ranks (evaluation counts)
        if not self.parallel:
            return values
        t = torch.tensor(values, dtype=torch.float64, device="cuda" if self.backend == "nccl" else "cpu")
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return tuple(t.tolist())

    def barrier(self) -> None:
        if self.parallel:
            dist.barrier()


def rank_seed(seed: int, rank: int, step: int = 0) -> int:
    """`seed` for rank 0 at step 0 (one process draws what it always drew), else 63 bits of
    sha256("seed:rank:step"): no collision with another run's seed, as seed + rank would have."""
    if rank == 0 and step == 0:
        return seed
    return int.from_bytes(hashlib.sha256(f"{seed}:{rank}:{step}".encode()).digest()[:8], "little") >> 1


class TrainStep:
    """One process's step: the task's loss and its backward, no communication."""

    def __init__(self, task):
        self.task = task

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:  # under the runtime's autocast
        return self.task.loss(x, y)

    def backward(self, loss: torch.Tensor, scaler=None) -> torch.Tensor:
        """Backward of `loss` (through an fp16 GradScaler when given); returns the loss to log."""
        (loss if scaler is None else scaler.scale(loss)).backward()
        return loss.detach().float()


class StepModule(nn.Module):
    """forward(x, y) = `task.loss(x, y)` as one module for DDP; beside the task's model, the frozen
    teachers its objective reads (broadcast once, never reduced)."""

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
    """The step over the ranks: `StepModule(task)` in DDP, the loss averaged beside the gradients."""

    def __init__(self, world: World, task, compiled: bool = False):
        super().__init__(task)
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
        """Backward through DDP; returns the ranks' mean loss (all-reduced beside backward). One backward
        per forward: DDP reduces each bucket once, so a second (retain_graph) would stay unaveraged."""
        if self.forwards != 1:
            raise DataParallelError(
                f"data parallel step on rank {self.world.rank}: {self.forwards} forward(s) before this backward; DDP "
                f"averages one backward per forward, so a second backward through one forward (retain_graph) "
                f"or several forwards per backward are not supported (linvit.distributed)")
        self.forwards = 0
        mean = loss.detach().float().reshape(1).clone()
        work = dist.all_reduce(mean, op=dist.ReduceOp.SUM, async_op=True)
        (loss if scaler is None else scaler.scale(loss)).backward()
        self._check_graph()
        work.wait()
        return (mean / self.world.size)[0]

    def _check_graph(self) -> None:
        """One line, before the optimizer step, when a parameter with a gradient at the first step has none."""
        pattern = [p.grad is not None for p in self.params]
        self.pattern = pattern if self.pattern is None else self.pattern
        if pattern != self.pattern:
            lost = [n for n, now, first in zip(self.names, pattern, self.pattern) if first and not now]
            raise DataParallelError(
                f"data parallel step on rank {self.world.rank}: parameter(s) {', '.join(lost[:3])}"
                f"{' and more' if len(lost) > 3 else ''} got no gradient this step but did at the first: the "
                f"loss's graph changed between steps, which DDP's static_graph does not average (linvit.distributed)")


def shutdown() -> None:  # at a command's end, so that torchrun's processes exit cleanly
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
