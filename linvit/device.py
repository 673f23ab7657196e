"""Where and in what precision a step computes: decided once, before any compute (nanoGPT style).

The config's top-level `runtime:` section (device, precision, compile) and a step's `--device`
flag (which wins over the config) resolve here into one `Runtime`: the torch device, the autocast
dtype and context, whether a GradScaler is needed, and the torch.compile backend. Every step gets
the same object, so the models, the batches, evaluation and the benchmark agree on the device.

    device     auto (CUDA when torch.cuda.is_available(), else CPU) | cpu | cuda | cuda:N
    precision  auto (bf16 autocast on CUDA, fp32 on CPU) | bf16 | fp16 (with GradScaler) | fp32
    compile    false (default) | true (inductor) | a torch.compile backend name (aot_eager, ...)
    workers    auto (on CUDA `loader_workers()`: the job's CPUs over its ranks on this node, less one;
               0 on the CPU) | N: threads decoding each batch (in order, so the batches stay exactly
               the same; 0 decodes in the loop's own thread)

Under torchrun (WORLD_SIZE > 1) the runtime also holds the job's `linvit.distributed.World`, and
`cuda`/`auto` mean this process's GPU, cuda:LOCAL_RANK.

A bad value is a ValueError in one line naming the key or flag, raised before any compute.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass, field

import torch

from .distributed import World
from .launch import torchrun_env

DEVICES = ("auto", "cpu", "cuda", "cuda:N")
PRECISIONS = {"auto": None, "fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
RUNTIME_KEYS = ("device", "precision", "compile", "workers")


@dataclass(frozen=True)
class Runtime:
    device: torch.device
    precision: str               # resolved: fp32, bf16 or fp16
    compile: str | None = None   # a torch.compile backend, None for eager
    workers: int = 0             # decoding threads of the loader (linvit.data.loader.ShardSet)
    world: World = World()       # the ranks of a torchrun job (one process without torchrun)

    @property
    def dtype(self) -> torch.dtype:
        """The autocast dtype (float32: no autocast)."""
        return PRECISIONS[self.precision]

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def autocast(self):
        """The autocast context of the forward passes; a no-op context in fp32, so the default CPU run
        is the code it was before mixed precision existed."""
        if self.precision == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.dtype)

    def scaler(self) -> torch.amp.GradScaler | None:
        """A GradScaler for fp16 (its small exponent range underflows gradients); None otherwise."""
        return torch.amp.GradScaler(self.device.type) if self.precision == "fp16" else None

    def batch(self, *tensors: torch.Tensor):
        """Tensors on the device: on CUDA through pinned memory with a non-blocking copy, so the copy
        overlaps the work already queued; on the CPU they are returned as they are."""
        if not self.cuda:
            return tensors
        # The loader pins its batches when told to (ShardSet(pin_memory=True)); pin here otherwise.
        return tuple((t if t.is_pinned() else t.pin_memory()).to(self.device, non_blocking=True)
                     for t in tensors)

    def place(self, model: torch.nn.Module) -> torch.nn.Module:
        """`model` on the device (in place, as nn.Module.to)."""
        return model.to(self.device)

    def describe(self) -> dict:
        """What results record next to a figure measured under this runtime (eval.json)."""
        return {"device": str(self.device), "precision": self.precision, "dtype": str(self.dtype).split(".")[-1]}

    def fingerprint(self) -> dict:
        """What changes a run's numbers: the precision and the compile backend. Not the device: a
        checkpoint written on one device resumes on another (state is loaded with map_location)."""
        return {"precision": self.precision, "compile": self.compile or False}


def resolve_device(value, key: str = "runtime.device") -> torch.device:
    value = "auto" if value is None else value
    if not isinstance(value, str) or not re.fullmatch(r"auto|cpu|cuda(:\d+)?", value):
        raise ValueError(f"{key}: unknown device {value!r}; known: {', '.join(DEVICES)}")
    if value == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(value)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{key}: device {value!r} requested but torch.cuda.is_available() is False "
                             f"on this machine")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ValueError(f"{key}: device {value!r} requested but this machine has {count} CUDA "
                             f"device(s) (cuda:0..cuda:{count - 1})")
    return device


def resolve_precision(value, device: torch.device, key: str = "runtime.precision") -> str:
    value = "auto" if value is None else value
    if value not in PRECISIONS:
        raise ValueError(f"{key}: unknown precision {value!r}; known: {', '.join(PRECISIONS)}")
    if value == "auto":
        return "bf16" if device.type == "cuda" else "fp32"
    return value


def resolve_compile(value, key: str = "runtime.compile") -> str | None:
    if value is None or value is False:
        return None
    if value is True:
        return "inductor"
    if isinstance(value, str) and value:
        import torch._dynamo

        known = torch._dynamo.list_backends(exclude_tags=()) + ["inductor"]
        if value not in known:
            raise ValueError(f"{key}: unknown torch.compile backend {value!r}; known: true, false, "
                             f"{', '.join(sorted(set(known)))}")
        return value
    raise ValueError(f"{key}: {value!r} is not true, false or a torch.compile backend name")


def loader_workers() -> int:
    """The loader workers of one rank when `runtime.workers` is auto on CUDA: the job's CPUs
    (Slurm's SLURM_CPUS_PER_TASK where set, at most the CPUs this process may run on) shared by
    the ranks on this node (torchrun's LOCAL_WORLD_SIZE), less one for the rank's own loop; at
    least 1. Not torch's threads: torchrun sets OMP_NUM_THREADS=1 in every rank."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    slurm = os.environ.get("SLURM_CPUS_PER_TASK", "")
    if slurm.isdigit() and int(slurm) > 0:
        cpus = min(cpus, int(slurm))
    local = os.environ.get("LOCAL_WORLD_SIZE", "")
    ranks = int(local) if local.isdigit() and int(local) > 0 else 1
    return max(1, cpus // ranks - 1)


def resolve_workers(value, device: torch.device, key: str = "runtime.workers") -> int:
    if value is None or value == "auto":
        # On the CPU the cores train the model and a 28x28 PNG decodes in microseconds: no threads.
        return loader_workers() if device.type == "cuda" else 0
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise ValueError(f"{key}: {value!r} is not auto or a whole number of threads from 0")


def runtime(config: dict | None = None, device: str | None = None) -> Runtime:
    """The Runtime of a step from the config's `runtime:` section and the `--device` flag (which
    overrides runtime.device). Also turns on TF32 matmuls when the device is CUDA."""
    section = (config or {}).get("runtime") or {}
    if not isinstance(section, dict):
        raise ValueError(f"config key runtime: {section!r} is not a mapping")
    unknown = sorted(set(section) - set(RUNTIME_KEYS))
    if unknown:
        raise ValueError(f"config key runtime: unknown setting(s) {unknown}; known: {list(RUNTIME_KEYS)}")
    if device is not None:
        where = "--device"
    else:
        device, where = section.get("device"), "config key runtime.device"
    dev = resolve_device(device, where)
    precision = resolve_precision(section.get("precision"), dev, "config key runtime.precision")
    backend = resolve_compile(section.get("compile"), "config key runtime.compile")
    workers = resolve_workers(section.get("workers"), dev, "config key runtime.workers")
    # Joined only once every setting is known to be good: a bad value fails before any rank waits.
    size, _, local_rank = torchrun_env()
    if size > 1 and dev.type == "cuda" and dev.index is not None and dev.index != local_rank:
        raise ValueError(f"{where}: {device!r} names one GPU, but this is one of {size} torchrun "
                         f"processes, each on its own GPU (cuda:LOCAL_RANK): give cuda or auto")
    world = World.from_env(dev.type)
    if world.parallel and dev.type == "cuda":
        dev = resolve_device(f"cuda:{world.local_rank}", f"{where} (torchrun LOCAL_RANK)")
    if dev.type == "cuda":
        # TF32 tensor cores for the fp32 matmuls left outside autocast (10 mantissa bits, as bf16 has 7).
        # torch's new TF32 API only: mixing it with the legacy allow_tf32 flags is an error in torch 2.14.
        torch.backends.cuda.matmul.fp32_precision = "tf32"
        torch.backends.cudnn.conv.fp32_precision = "tf32"
    return Runtime(dev, precision, backend, workers, world)


def cpu_runtime() -> Runtime:
    """The runtime of a caller that names none: the CPU in fp32, eager."""
    return Runtime(torch.device("cpu"), "fp32", None)
