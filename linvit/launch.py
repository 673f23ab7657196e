"""How this process was started, read and checked before any rank joins: torchrun's variables (WORLD_SIZE,
RANK, LOCAL_RANK), Slurm's (several `srun` tasks are refused: one launcher, torchrun), this rank's GPU,
and the environment's knobs for the process group (LINVIT_DIST_TIMEOUT_MIN, LINVIT_BUCKET_MB).

Each check is one line naming the variable and how to launch instead, raised before
`init_process_group`, so no rank waits on one that failed. Why: docs/data_parallel.md.
"""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

TIMEOUT_MIN = 30   # minutes a rank waits at a collective before the job is aborted (LINVIT_DIST_TIMEOUT_MIN)


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
    """A ValueError in one line when torchrun spreads this job over several nodes."""
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
