"""The one training loop, used by the teacher, the distillation stage and the students.

AdamW, linear warmup then cosine decay, optional label smoothing (in the task's loss), gradient
clipping; seeded; a JSONL log and TensorBoard events (<out_dir>/tb, linvit.events); a checkpoint at
every epoch end and every `checkpoint_every` steps, from which a killed job resumes to the same result.

A checkpoint is a folder `checkpoint/step<N>/` holding `model.safetensors`, `state.pt` (optimizer,
scheduler and RNG state: tensors and plain values only, read with `weights_only=True`) and
`meta.json` (step, time, the run's first loss and its fingerprint), plus a `LATEST` pointer. A job
resumes only from a checkpoint whose fingerprint equals its own (see `fit`); an unreadable or
mismatched checkpoint is reported in one line and training starts afresh.

Device and precision come from a `linvit.device.Runtime`, decided once before the loop: the model
and every batch go to its device, forward passes run under its autocast context, fp16 steps go
through a GradScaler, and `compile` compiles the model's forward in place (state_dict keys unchanged).
Checkpoints load onto the CPU (`map_location`) whatever device wrote them; the optimizer then moves
its state onto its parameters' device, so a run resumes on another device than the one it started on.

Under torchrun the runtime's `World` makes the same loop data-parallel (see linvit.distributed):
each rank trains on its share of every global batch, the step runs through DistributedDataParallel
(the gradients averaged over the ranks while backward runs, the loss beside them), evaluation counts
are summed, and only rank 0 writes the log, checkpoints and messages. Every rank resumes from the
same checkpoint, each with its own random stream. With one process nothing is wrapped: the step is
the task's loss and its backward, as before data parallelism existed.

The divergence check (`diverged`) does not read the loss on the host every step, which on a GPU
would wait for the step to finish: it runs at the steps `_check_due` names (the first, every
`log_every`-th, every step that evaluates or checkpoints, the last), before that step's update,
on the highest loss since the previous check. A run whose loss blows up is stopped at the next
check, with the steps the loss was in; at most `log_every` - 1 updates from unchecked losses happen
first, and none of them reaches a checkpoint.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time
import types
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from .device import Runtime, cpu_runtime
from .events import NoEvents, RunEvents, events_dir as run_events_dir
from .io import atomic_path, write_json, write_safetensors, write_text

MAX_STEPS = 10**8       # a larger `steps` is a typo (10**12 would never finish), not a budget
DIVERGE_FLOOR = 1.0     # the start loss below which the divergence threshold stops shrinking
PROGRESS_SECONDS = 30.0  # in log files, a progress line at least this often


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite, or rose far above where it started (see `diverged`).

    The message contains the word "diverged": the report marks a cell with that status from it.
    """


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
    diverge_factor: float | None = 100.0  # see `diverged`; None: only NaN/inf stops a run

    @classmethod
    def from_dict(cls, data: dict, key: str = "train") -> "TrainSpec":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"config key {key}: unknown setting(s) {unknown}; known: {sorted(known)}")
        missing = [n for n in ("steps", "batch_size", "lr") if n not in data]
        if missing:
            raise ValueError(f"config key {key}: missing setting(s) {missing}")
        # The schema checks these too, but a config given by hand (--config FILE) skips the schema.
        steps = data["steps"]
        if not isinstance(steps, int) or isinstance(steps, bool) or not 1 <= steps <= MAX_STEPS:
            raise ValueError(f"config key {key}.steps: {steps!r} is not a whole number of steps from 1 to "
                             f"{MAX_STEPS} (10**8)")
        if not isinstance(data["batch_size"], int) or data["batch_size"] < 1:
            raise ValueError(f"config key {key}.batch_size: {data['batch_size']!r} is not a positive integer")
        factor = data.get("diverge_factor")
        if factor is not None and not (isinstance(factor, (int, float)) and factor > 1):
            raise ValueError(f"config key {key}.diverge_factor: {factor!r} must be a number above 1, or null")
        return cls(**data)

    def lr_factor(self, step: int) -> float:
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        progress = (step - self.warmup_steps) / max(1, self.steps - self.warmup_steps)
        floor = self.min_lr / self.lr
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * min(1.0, progress)))


def diverged(spec: TrainSpec, loss: float, start_loss: float) -> bool:
    """The divergence rule: a non-finite loss, or a step's loss above
    `diverge_factor` x max(1, the run's first step loss).

    The first step's loss is the loss at initialization, before any update, so an explosion in
    the first steps cannot inflate the reference; the floor of 1 keeps a run that starts near zero
    loss (a student from a well-trained teacher) from stopping at a harmless bump. Deterministic:
    the same run gives the same verdict, resumed or not.
    """
    if not math.isfinite(loss):
        return True
    if not spec.diverge_factor:
        return False
    return loss > spec.diverge_factor * max(DIVERGE_FLOOR, start_loss)


class Task(Protocol):
    """What the loop trains: a model, which of its parameters, a loss, and an evaluation.

    Under torchrun `loss` runs inside DistributedDataParallel's forward (linvit.distributed.StepModule):
    the frozen models it reads besides `model` are found at `task.objective` (its teacher and logit
    teacher) when the task has one."""

    model: nn.Module

    def trainable(self) -> list[tuple[str, nn.Parameter]]: ...

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor: ...

    def evaluate(self, final: bool) -> dict: ...


def param_groups(model: nn.Module, named, weight_decay: float) -> list[dict]:
    """[decay, no-decay] AdamW groups, as timm does: no decay on biases, norms, and the parameters
    the model's own `no_weight_decay()` names (timm: pos_embed, cls_token, reg_token, dist_token)."""
    skip = {"pos_embed", "cls_token"}
    if hasattr(model, "no_weight_decay"):
        skip |= set(model.no_weight_decay())
    decay = [p for n, p in named if p.ndim > 1 and n not in skip]
    no_decay = [p for n, p in named if not (p.ndim > 1 and n not in skip)]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def make_optimizer(model: nn.Module, named, spec: "TrainSpec") -> torch.optim.AdamW:
    """AdamW over `param_groups` at spec.lr: fused (one kernel over every parameter) where every
    trainable parameter is a floating-point tensor on the CPU or CUDA, torch's foreach form
    elsewhere. The two compute the same update up to float rounding. Measured on a micro ViT's
    student step (elu, batch 64, one thread, AVX2 CPU): the optimizer's step 1.0-1.1 against
    3.9-4.0 ms, the whole step 0.964 of the foreach one's time (median of 9 paired rounds), and
    the losses of 20 steps from the same start equal to 1.3e-7 (relative)."""
    groups = param_groups(model, named, spec.weight_decay)
    fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for _, p in named)
    return torch.optim.AdamW(groups, lr=spec.lr, fused=fused or None)


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict) -> None:
    """optimizer.load_state_dict(state), keeping this optimizer's own kernel (`fused`, `foreach`):
    load_state_dict takes every group setting from the checkpoint, so a checkpoint written by the
    foreach form (before make_optimizer fused AdamW) would leave a fused optimizer running the
    foreach kernel, which refuses the grad_scale that GradScaler hands a fused one (fp16 runs)."""
    optimizer.load_state_dict(state)
    for group in optimizer.param_groups:
        for key in ("fused", "foreach"):
            if key in optimizer.defaults:
                group[key] = optimizer.defaults[key]


def _one_line(err: BaseException, limit: int = 160) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return text if len(text) <= limit else text[:limit] + "..."


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict) and v:
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def fingerprint_changes(old: dict, new: dict) -> list[str]:
    """The dotted keys whose values differ between two fingerprints (e.g. 'teacher.train.lr', 'data')."""
    a, b = _flatten(old), _flatten(new)
    return sorted(k for k in set(a) | set(b) if a.get(k, "<absent>") != b.get(k, "<absent>"))


class _Unusable(Exception):
    """A checkpoint that cannot be resumed from; the message is the one line to print."""


class Checkpoints:
    """step<N>/ folders (model.safetensors, state.pt, meta.json) and a LATEST pointer replaced atomically."""

    def __init__(self, root: Path):
        self.root = root

    def latest(self) -> Path | None:
        pointer = self.root / "LATEST"
        if not pointer.exists():
            return None
        return self.root / pointer.read_text().strip()

    def save(self, step: int, model: nn.Module, state: dict, meta: dict) -> None:
        """Write step<N>/ completely, then point LATEST at it; a failed write (full disk) removes the
        partial folder, keeps the previous checkpoint, and raises an OSError naming the file."""
        folder = self.root / f"step{step:08d}"
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        try:
            write_safetensors(folder / "model.safetensors", {k: v.cpu() for k, v in model.state_dict().items()})
            with atomic_path(folder / "state.pt") as tmp, open(tmp, "wb") as f:
                # torch's zip writer reports a failed write (ENOSPC on a full disk) as "enforce fail
                # ... unexpected pos", by name or through a file object, whose OSError it swallows:
                # the writes go through `write`, which keeps that OSError to raise instead, and
                # atomic_path says it as "cannot write <state.pt>: No space left on device".
                failed = []

                def write(data):
                    try:
                        return f.write(data)
                    except OSError as err:
                        failed.append(err)
                        raise

                try:
                    torch.save(state, types.SimpleNamespace(write=write, flush=f.flush))
                except RuntimeError as err:
                    if failed:
                        raise failed[0] from None
                    raise OSError(f"cannot write {folder / 'state.pt'}: {_one_line(err)}") from None
            write_json(folder / "meta.json", meta)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        write_text(self.root / "LATEST", folder.name)
        for old in self.root.glob("step*"):
            if old != folder:
                shutil.rmtree(old, ignore_errors=True)

    def load(self, model: nn.Module, fingerprint: dict) -> tuple[dict, dict, dict] | None:
        """(weights, state, meta) of the latest checkpoint, None when there is none.

        Raises _Unusable (a one-line reason) when it cannot be read or was made under another
        fingerprint. Nothing is applied to the model here, so a fresh start stays fresh.
        """
        folder = self.latest()
        if folder is None:
            return None
        meta_path = folder / "meta.json"
        try:
            meta = json.loads(meta_path.read_text())
            missing = [k for k in ("fingerprint", "step", "elapsed_s", "start_loss") if k not in meta]
            if missing:
                raise ValueError(f"lacks {', '.join(missing)}")
            saved = meta["fingerprint"]
        except (OSError, ValueError, TypeError) as err:
            raise _Unusable(f"checkpoint file {meta_path} is unreadable ({_one_line(err)})") from None
        changed = fingerprint_changes(saved, fingerprint)
        if changed:
            shown = ", ".join(changed[:6]) + (f" and {len(changed) - 6} more" if len(changed) > 6 else "")
            raise _Unusable(f"checkpoint in {self.root} was made under another config (changed: {shown})")
        from safetensors.torch import load_file

        weights_path, state_path = folder / "model.safetensors", folder / "state.pt"
        try:
            weights = load_file(str(weights_path))
        except Exception as err:  # safetensors raises SafetensorError, OSError... for a bad file
            raise _Unusable(f"checkpoint file {weights_path} is unreadable ({_one_line(err)})") from None
        expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        if {k: tuple(v.shape) for k, v in weights.items()} != expected:
            raise _Unusable(f"checkpoint file {weights_path} does not fit the model (other tensors or shapes)")
        try:
            # weights_only: a state.pt that is not plain tensors and containers is refused, never run.
            # map_location cpu: tensors a CUDA run saved load on any machine; the RNG state must be a
            # CPU tensor, and optimizer.load_state_dict moves its state onto the parameters' device.
            state = torch.load(state_path, map_location="cpu", weights_only=True)
            missing = [k for k in ("optimizer", "scheduler", "rng") if k not in state]
            if missing:
                raise ValueError(f"lacks {', '.join(missing)}")
        except Exception as err:  # truncated zip, unpickling refused, wrong content
            raise _Unusable(f"checkpoint file {state_path} is unreadable ({_one_line(err)})") from None
        return weights, state, meta


def live_log_path(out_dir: str | Path) -> Path:
    """Where `fit` writes train.jsonl while it runs: inside the checkpoint folder, beside the state it
    matches. Snakemake deletes a job's declared outputs (train.jsonl among them) before it reruns
    the job, but not the checkpoint, so a resumed run keeps its log from step 0."""
    return Path(out_dir) / "checkpoint" / "train.jsonl"


def publish_log(out_dir: str | Path) -> Path:
    """Move the finished run's log to <out_dir>/train.jsonl (atomic rename)."""
    final = Path(out_dir) / "train.jsonl"
    os.replace(live_log_path(out_dir), final)
    return final


class _NoLog:
    """The log of a rank other than 0: rank 0 writes the one log of the job."""

    def write(self, record: dict) -> None:
        pass

    def close(self) -> None:
        pass


class _Log:
    """The JSONL log; on resume, the lines after the checkpoint's step are dropped (they get redone).

    A last line that does not parse is the write a kill interrupted: dropped. A malformed line
    elsewhere is an error naming file:line, raised before the file is touched.
    """

    def __init__(self, path: Path, resume_step: int | None):
        self.path = path
        lines = []
        if resume_step is not None and path.exists():
            lines = self._kept(path, resume_step)
        write_text(path, "".join(ln + "\n" for ln in lines))
        self.file = path.open("a")

    @staticmethod
    def _kept(path: Path, resume_step: int) -> list[str]:
        try:
            raw = path.read_text(encoding="utf-8", errors="replace").split("\n")
        except OSError as err:
            raise OSError(f"{path}: cannot read the training log ({_one_line(err)})") from None
        numbered = [(i, ln) for i, ln in enumerate(raw, 1) if ln.strip()]
        kept = []
        for n, (i, ln) in enumerate(numbered):
            try:
                record = json.loads(ln)
                step = record.get("step", 0)
            except (ValueError, AttributeError) as err:
                if n == len(numbered) - 1:
                    break  # the interrupted last write
                raise ValueError(f"{path}:{i}: malformed log line ({_one_line(err, 80)}); fix or delete "
                                 f"that line and rerun (the checkpoint is kept)") from None
            if step <= resume_step:
                kept.append(ln)
        return kept

    def write(self, record: dict) -> None:
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


def fit(task: Task, spec: TrainSpec, data, out_dir: str | Path, *, seed: int, desc: str = "train",
        fingerprint: dict | None = None, runtime: Runtime | None = None, events_dir: str | Path | None = None,
        events_offset: int = 0, hparams: dict | None = None) -> dict:
    """Train `task` on the train split of `data` (a ShardSet) for `spec.steps` steps.

    `fingerprint`: what determines the run (config slice, data, teacher, seed, code version; the
    step builds it). A checkpoint in `out_dir` is resumed only when made under an equal fingerprint;
    otherwise, or when a checkpoint file is unreadable, one line on stderr says why and training
    starts afresh. Returns a summary (steps, epochs, time, images seen, last loss, final
    evaluation): train_time_s is the training loop's time (with any intermediate evaluations and
    checkpoints; over a resumed run, all of it), eval_time_s the seconds this call spent evaluating.
    Raises TrainingDiverged (see `diverged`), leaving the last checkpoint in place.

    `runtime`: device, precision and compile backend (default: CPU, fp32, eager). The task's
    model must already be on its device (the step moves it there before building the task).

    Rank 0 also writes TensorBoard events (linvit.events) into `events_dir` (default <out_dir>/tb),
    their steps shifted by `events_offset` (a later phase of a distillation), with the run's cell
    `hparams` (linvit.events.cell_hparams) for TensorBoard's HParams view.
    """
    runtime = runtime or cpu_runtime()
    world = runtime.world
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if fingerprint is None:  # a caller that says nothing: at least the seed and the spec
        fingerprint = {"train": vars(spec)}
    fingerprint = {"seed": seed, **fingerprint}
    # JSON round trip: the fingerprint is compared with one read back from meta.json.
    fingerprint = json.loads(json.dumps(fingerprint))
    model, named = runtime.place(task.model), task.trainable()
    scaler = runtime.scaler()  # None unless fp16
    optimizer = make_optimizer(model, named, spec)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, spec.lr_factor)
    ckpts = Checkpoints(out_dir / "checkpoint")
    steps_per_epoch = data.steps_per_epoch("train", spec.batch_size)
    if steps_per_epoch < 1:
        raise ValueError(f"{desc}: batch_size {spec.batch_size} exceeds the "
                         f"{data.num_samples('train')} training samples")
    local_batch = world.local_batch(spec.batch_size, desc)  # the global batch must split evenly
    if world.parallel and world.main:
        print(f"{desc}: data parallel over {world.size} processes ({world.backend}), {local_batch} "
              f"samples each of every batch of {spec.batch_size}", file=sys.stderr)

    # Each rank its own stream for dropout, drop-path and mixup; rank 0's is the seed's (linvit.distributed).
    torch.manual_seed(world.rank_seed(seed))
    step, elapsed, start_loss = 0, 0.0, None
    try:
        resumed = ckpts.load(model, fingerprint)
    except _Unusable as why:
        if world.main:  # every rank reads the same checkpoint: one line for the job
            print(f"{desc}: {why}; starting afresh", file=sys.stderr)
        resumed = None
    if resumed is not None:
        weights, state, meta = resumed
        try:
            load_optimizer_state(optimizer, state["optimizer"])  # checks before it changes anything
        except (ValueError, KeyError, TypeError) as err:
            if world.main:
                print(f"{desc}: checkpoint file {ckpts.latest() / 'state.pt'} does not fit the optimizer "
                      f"({_one_line(err)}); starting afresh", file=sys.stderr)
            optimizer = make_optimizer(model, named, spec)
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, spec.lr_factor)
            resumed = None
    if resumed is not None:
        model.load_state_dict(weights)  # keys and shapes were checked
        scheduler.load_state_dict(state["scheduler"])
        step, elapsed, start_loss = meta["step"], meta["elapsed_s"], meta["start_loss"]
        # This rank's generators: rank 0's are "rng"/"cuda_rng", the others' in "ranks_rng".
        others = state.get("ranks_rng") or []
        rng = state if world.rank == 0 else (others[world.rank - 1] if world.rank <= len(others) else None)
        if rng is None:  # more processes than wrote the checkpoint: a fresh stream of (seed, rank, step)
            torch.manual_seed(world.rank_seed(seed, step))
        else:
            torch.set_rng_state(rng["rng"])
            if runtime.cuda and "cuda_rng" in rng:  # dropout on CUDA draws from the device's generator
                torch.cuda.set_rng_state(rng["cuda_rng"], runtime.device)
        if scaler is not None and state.get("scaler"):
            scaler.load_state_dict(state["scaler"])
        if world.main:
            print(f"{desc}: resuming from step {step}", file=sys.stderr)
    # The step: the task's loss, or under torchrun DDP around it, which broadcasts rank 0's parameters
    # (the ranks start equal whatever each built or loaded; they should agree anyway).
    train_step = world.train_step(task, compiled=bool(runtime.compile))
    log = _Log(live_log_path(out_dir), step if resumed is not None else None) if world.main else _NoLog()
    events = (RunEvents(events_dir or run_events_dir(out_dir), batch_size=spec.batch_size, resumed=resumed is not None,
                        step=step, seconds=elapsed, offset=events_offset, hparams=hparams)
              if world.main else NoEvents())

    def checkpoint():
        rngs = world.rng_states(runtime.device if runtime.cuda else None)  # every rank takes part
        if not world.main:
            return
        events.flush()  # the steps up to this checkpoint, which a resumed run keeps
        state = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), **rngs[0]}
        if world.parallel:
            state["ranks_rng"] = rngs[1:]
        if scaler is not None:
            state["scaler"] = scaler.state_dict()
        ckpts.save(step, model, state,
                   {"step": step, "elapsed_s": elapsed, "start_loss": start_loss, "fingerprint": fingerprint})

    if runtime.compile:
        # In place (nn.Module.compile): parameters, state_dict keys and checkpoints stay as in eager.
        for module in getattr(task, "compiled_modules", lambda: [model])():
            module.compile(backend=runtime.compile)
    eval_time = [0.0]  # seconds this call spent evaluating (its own cost, beside train_time_s)

    def evaluate(at_step, epoch, final):
        start = time.perf_counter()
        result = _evaluate(task, log, at_step, epoch, elapsed, final=final, runtime=runtime)
        eval_time[0] += time.perf_counter() - start
        events.evaluation(at_step, result)
        return result

    if resumed is None and spec.eval_every:
        evaluate(0, 0, final=False)  # what the initialization alone gives
    bar = _progress(spec.steps, step, desc, quiet=not world.main)
    last_loss, started = float("nan"), time.perf_counter() - elapsed
    evaluated = eval_time[0]  # evaluation seconds before the loop, which `elapsed` leaves out
    # The loss is read on the host (a sync on CUDA) only at the steps `_check_due` names; between
    # them the highest loss since the last check stays on the device (NaN wins: torch.maximum).
    worst, since = None, step + 1
    model.train()
    try:
        while step < spec.steps:
            epoch, skip = divmod(step, steps_per_epoch)
            for x, y in data.batches("train", spec.batch_size, seed=seed, epoch=epoch, shuffle=True,
                                     drop_last=True, skip_batches=skip, rank=world.rank, ranks=world.size):
                x, y = runtime.batch(x, y)
                optimizer.zero_grad(set_to_none=True)
                with runtime.autocast():
                    loss = train_step.loss(x, y)
                # Backward; the gradients and the loss averaged over the ranks (with one process the
                # loss itself), the loss left on the device.
                value = train_step.backward(loss, scaler)
                worst = value if worst is None else torch.maximum(worst, value)
                checked = _check_due(spec, step + 1, steps_per_epoch)
                if checked:
                    last_loss, highest = value.item(), worst.item()
                    if start_loss is None:
                        start_loss = last_loss
                    if diverged(spec, highest, start_loss):  # before the step: no update from this batch
                        if diverged(spec, last_loss, start_loss):  # this step's own loss: say so
                            highest, since = last_loss, step + 1
                        raise TrainingDiverged(_diverged_message(desc, spec, highest, start_loss, since, step + 1))
                    worst, since = None, step + 2
                if scaler is None:
                    if spec.clip_grad:
                        nn.utils.clip_grad_norm_([p for _, p in named], spec.clip_grad)
                    optimizer.step()
                else:
                    if spec.clip_grad:
                        scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
                        nn.utils.clip_grad_norm_([p for _, p in named], spec.clip_grad)
                    scaler.step(optimizer)  # skipped when the scaled gradients overflowed
                    scaler.update()
                scheduler.step()
                step += 1
                elapsed = time.perf_counter() - started
                bar.update(step, last_loss if checked else value)
                if step % spec.log_every == 0 or step == spec.steps:
                    log.write({"kind": "train", "step": step, "epoch": epoch, "loss": last_loss,
                               "lr": scheduler.get_last_lr()[0], "elapsed_s": round(elapsed, 3)})
                    events.train(step, last_loss, scheduler.get_last_lr()[0], elapsed - (eval_time[0] - evaluated))
                if spec.eval_every and step % spec.eval_every == 0 and step < spec.steps:
                    evaluate(step, epoch, final=False)
                epoch_end = step % steps_per_epoch == 0
                if step < spec.steps and (epoch_end or (spec.checkpoint_every and step % spec.checkpoint_every == 0)):
                    checkpoint()
                if step >= spec.steps or epoch_end:
                    break
        bar.close()
        final = evaluate(step, (step - 1) // steps_per_epoch, final=True)
    finally:
        log.close()
        events.close()
    return {"steps": step, "epochs": step / steps_per_epoch, "train_time_s": round(elapsed, 3),
            "eval_time_s": round(eval_time[0], 3), "images_seen": step * spec.batch_size,
            "final_loss": last_loss, **final}


def _check_due(spec: TrainSpec, step: int, steps_per_epoch: int) -> bool:
    """Whether `fit` reads the loss on the host at `step` (counted from 1) to check it for divergence:
    the first step (the run's start loss), every step that logs (`log_every`), evaluates,
    checkpoints or ends an epoch, and the last. So at least every `log_every` steps, and never a
    checkpoint or an evaluation of parameters updated by an unchecked loss. Between checks the
    step does not wait for the GPU."""
    return (step == 1 or step % spec.log_every == 0 or step == spec.steps or step % steps_per_epoch == 0
            or bool(spec.eval_every and step % spec.eval_every == 0)
            or bool(spec.checkpoint_every and step % spec.checkpoint_every == 0))


def _diverged_message(desc: str, spec: TrainSpec, value: float, start_loss: float, since: int, step: int) -> str:
    """`value`: the highest loss of steps `since`..`step`, the steps since the last check."""
    where = f"at step {step}" if since >= step else f"in steps {since}-{step} (checked every few steps)"
    if not math.isfinite(value):
        why = f"loss became {value} {where}"
    else:
        why = (f"loss {value:.4g} {where} is over {spec.diverge_factor:g}x the start "
               f"({max(DIVERGE_FLOOR, start_loss):.4g}; train.diverge_factor)")
    return f"{desc}: diverged: {why}; stopped, no metrics written"


def _evaluate(task, log, step, epoch, elapsed, final, runtime: Runtime) -> dict:
    was_training = task.model.training
    task.model.eval()
    with torch.no_grad(), runtime.autocast():
        result = task.evaluate(final)
    task.model.train(was_training)
    if result:
        log.write({"kind": "eval", "step": step, "epoch": epoch, "elapsed_s": round(elapsed, 3),
                   "final": final, **result})
    return result


class _progress:
    """A tqdm bar on a terminal; otherwise a line every ~10% of the run and at least every
    PROGRESS_SECONDS (for log files: a long run shows life)."""

    def __init__(self, total: int, start: int, desc: str, quiet: bool = False):
        self.total, self.desc, self.next_line, self.next_time = total, desc, start, 0.0
        self.bar, self.quiet = None, quiet
        if sys.stderr.isatty() and not quiet:
            from tqdm import tqdm

            self.bar = tqdm(total=total, initial=start, desc=desc, dynamic_ncols=True)

    def update(self, step: int, loss) -> None:
        """`loss`: a float, or a tensor on the device, read (a host sync) only when a line is printed."""
        if self.quiet:
            return
        if self.bar is not None:
            self.bar.n = step
            if isinstance(loss, float):  # the bar shows the loss of the last checked step
                self.bar.set_postfix(loss=f"{loss:.4f}", refresh=False)
            self.bar.refresh()
            return
        now = time.monotonic()
        if step >= self.next_line or step == self.total or now >= self.next_time:
            print(f"{self.desc}: step {step}/{self.total} loss {float(loss):.4f}", file=sys.stderr, flush=True)
            self.next_line = step + max(1, self.total // 10)
            self.next_time = now + PROGRESS_SECONDS

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
