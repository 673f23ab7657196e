"""The one training loop, used by the teacher, the distillation stage and the students.

AdamW, linear warmup then cosine decay, optional label smoothing (in the task's loss), gradient
clipping; seeded; a JSONL log; a checkpoint (safetensors weights plus optimizer state) at every
epoch end and every `checkpoint_every` steps, from which a killed job resumes to the same result.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Protocol

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from .io import write_text


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite."""


@dataclass
class TrainSpec:
    steps: int
    batch_size: int
    lr: float
    min_lr: float = 0.0
    warmup_steps: int = 0
    weight_decay: float = 0.05
    label_smoothing: float = 0.0
    clip_grad: float | None = 1.0
    eval_every: int = 0            # 0: evaluate only at the end
    eval_samples: int | None = None  # test samples for intermediate evaluations (the final one uses all)
    checkpoint_every: int = 0      # 0: checkpoint at epoch ends only
    log_every: int = 10

    @classmethod
    def from_dict(cls, data: dict, key: str = "train") -> "TrainSpec":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"config key {key}: unknown setting(s) {unknown}; known: {sorted(known)}")
        missing = [n for n in ("steps", "batch_size", "lr") if n not in data]
        if missing:
            raise ValueError(f"config key {key}: missing setting(s) {missing}")
        return cls(**data)

    def lr_factor(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        progress = (step - self.warmup_steps) / max(1, self.steps - self.warmup_steps)
        floor = self.min_lr / self.lr
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


class Task(Protocol):
    """What the loop trains: a model, which of its parameters, a loss, and an evaluation."""

    model: nn.Module

    def trainable(self) -> list[tuple[str, nn.Parameter]]: ...

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor: ...

    def evaluate(self, final: bool) -> dict: ...


def _param_groups(named, weight_decay):
    # As timm does: no decay on biases, norms and the token/position embeddings.
    decay = [p for n, p in named if p.ndim > 1 and n not in ("pos_embed", "cls_token")]
    no_decay = [p for n, p in named if not (p.ndim > 1 and n not in ("pos_embed", "cls_token"))]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


class Checkpoints:
    """step<N>/ folders (model.safetensors + state.pt) and a LATEST pointer replaced atomically."""

    def __init__(self, root: Path):
        self.root = root

    def latest(self) -> Path | None:
        pointer = self.root / "LATEST"
        if not pointer.exists():
            return None
        path = self.root / pointer.read_text().strip()
        return path if (path / "state.pt").exists() else None

    def save(self, step: int, model: nn.Module, state: dict) -> None:
        folder = self.root / f"step{step:08d}"
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, folder / "model.safetensors")
        torch.save(state, folder / "state.pt")
        write_text(self.root / "LATEST", folder.name)
        for old in self.root.glob("step*"):
            if old != folder:
                shutil.rmtree(old, ignore_errors=True)

    def load(self, model: nn.Module) -> dict | None:
        folder = self.latest()
        if folder is None:
            return None
        model.load_state_dict(load_file(folder / "model.safetensors"))
        return torch.load(folder / "state.pt", weights_only=False)

    def clear(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)


class _Log:
    """The JSONL log; on resume, the lines after the checkpoint's step are dropped (they get redone)."""

    def __init__(self, path: Path, resume_step: int | None):
        self.path = path
        lines = []
        if resume_step is not None and path.exists():
            lines = [ln for ln in path.read_text().splitlines()
                     if ln.strip() and json.loads(ln).get("step", 0) <= resume_step]
        write_text(path, "".join(ln + "\n" for ln in lines))
        self.file = path.open("a")

    def write(self, record: dict) -> None:
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def fit(task: Task, spec: TrainSpec, data, out_dir: str | Path, *, seed: int, desc: str = "train") -> dict:
    """Train `task` on the train split of `data` (a ShardSet) for `spec.steps` steps.

    Returns a summary (steps, epochs, time, images seen, last loss, final evaluation). Raises
    TrainingDiverged on a non-finite loss, leaving the last checkpoint in place.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model, named = task.model, task.trainable()
    optimizer = torch.optim.AdamW(_param_groups(named, spec.weight_decay), lr=spec.lr)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, spec.lr_factor)
    ckpts = Checkpoints(out_dir / "checkpoint")
    steps_per_epoch = data.steps_per_epoch("train", spec.batch_size)
    if steps_per_epoch < 1:
        raise ValueError(f"{desc}: batch_size {spec.batch_size} exceeds the "
                         f"{data.num_samples('train')} training samples")

    torch.manual_seed(seed)
    step, elapsed = 0, 0.0
    state = ckpts.load(model)
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        torch.set_rng_state(state["rng"])
        step, elapsed = state["step"], state["elapsed_s"]
        print(f"{desc}: resuming from step {step}", file=sys.stderr)
    log = _Log(out_dir / "train.jsonl", step if state is not None else None)

    def checkpoint():
        ckpts.save(step, model, {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
                                 "rng": torch.get_rng_state(), "step": step, "elapsed_s": elapsed})

    if state is None and spec.eval_every:
        _evaluate(task, log, 0, 0, 0.0, final=False)  # what the initialization alone gives
    bar = _progress(spec.steps, step, desc)
    last_loss, started = float("nan"), time.perf_counter() - elapsed
    model.train()
    while step < spec.steps:
        epoch, skip = divmod(step, steps_per_epoch)
        for x, y in data.batches("train", spec.batch_size, seed=seed, epoch=epoch, shuffle=True,
                                 drop_last=True, skip_batches=skip):
            loss = task.loss(x, y)
            if not torch.isfinite(loss):
                log.close()
                raise TrainingDiverged(f"{desc}: loss became {loss.item()} at step {step + 1}; "
                                       f"stopped, no metrics written")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if spec.clip_grad:
                nn.utils.clip_grad_norm_([p for _, p in named], spec.clip_grad)
            optimizer.step()
            scheduler.step()
            step += 1
            last_loss = loss.item()
            elapsed = time.perf_counter() - started
            bar.update(step, last_loss)
            if step % spec.log_every == 0 or step == spec.steps:
                log.write({"kind": "train", "step": step, "epoch": epoch, "loss": last_loss,
                           "lr": scheduler.get_last_lr()[0], "elapsed_s": round(elapsed, 3)})
            if spec.eval_every and step % spec.eval_every == 0 and step < spec.steps:
                _evaluate(task, log, step, epoch, elapsed, final=False)
            epoch_end = step % steps_per_epoch == 0
            if step < spec.steps and (epoch_end or (spec.checkpoint_every and step % spec.checkpoint_every == 0)):
                checkpoint()
            if step >= spec.steps or epoch_end:
                break
    bar.close()
    final = _evaluate(task, log, step, (step - 1) // steps_per_epoch, elapsed, final=True)
    log.close()
    return {"steps": step, "epochs": step / steps_per_epoch, "train_time_s": round(elapsed, 3),
            "images_seen": step * spec.batch_size, "final_loss": last_loss, **final}


def _evaluate(task, log, step, epoch, elapsed, final) -> dict:
    was_training = task.model.training
    task.model.eval()
    with torch.no_grad():
        result = task.evaluate(final)
    task.model.train(was_training)
    if result:
        log.write({"kind": "eval", "step": step, "epoch": epoch, "elapsed_s": round(elapsed, 3),
                   "final": final, **result})
    return result


class _progress:
    """A tqdm bar on a terminal; otherwise a line every ~10% of the run (for log files)."""

    def __init__(self, total: int, start: int, desc: str):
        self.total, self.desc, self.next_line = total, desc, start
        self.bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=start, desc=desc, dynamic_ncols=True)

    def update(self, step: int, loss: float) -> None:
        if self.bar is not None:
            self.bar.n = step
            self.bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
            self.bar.refresh()
        elif step >= self.next_line or step == self.total:
            print(f"{self.desc}: step {step}/{self.total} loss {loss:.4f}", file=sys.stderr, flush=True)
            self.next_line = step + max(1, self.total // 10)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
