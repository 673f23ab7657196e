"""The one training loop, used by the teacher, the distillation stage and the students.

AdamW, linear warmup then cosine decay, optional label smoothing (in the task's loss), gradient
clipping; seeded; a JSONL log and TensorBoard events (<out_dir>/tb, linvit.events); a checkpoint at
every epoch end and every `checkpoint_every` steps, from which a killed job resumes to the same result.

A job resumes only from a checkpoint (linvit.checkpoints) whose fingerprint equals its own (see `fit`);
an unreadable or mismatched checkpoint is reported in one line and training starts afresh.

Device and precision come from a `linvit.device.Runtime`, decided once before the loop: the model
and every batch go to its device, forward passes run under its autocast context, fp16 steps go
through a GradScaler, and `compile` compiles the model's forward in place (state_dict keys unchanged).
Checkpoints load onto the CPU (`map_location`) whatever device wrote them; the optimizer then moves
its state onto its parameters' device, so a run resumes on another device than the one it started on.

Under torchrun the runtime's `World` makes the same loop data-parallel (linvit.distributed;
docs/data_parallel.md): each rank trains on its share of every global batch, and only rank 0 writes.

`fit` reads top to bottom; each concern is a named piece below it: the run's state (`_Run`),
resuming it with every rank's random state (`_resume`), what it writes (`_Outputs`), the divergence
check (`_Watch`), the optimizer's step in each precision (`_update`) and the checkpoint (`_save`).

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
import sys
import time
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Protocol

import torch
from torch import nn

from .device import Runtime, cpu_runtime
from .distributed import rank_seed
from .events import NoEvents, RunEvents, events_dir as run_events_dir
from .checkpoints import Checkpoints, NoLog, TrainLog, Unusable, live_log_path, one_line

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
    world, out_dir = runtime.world, Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    fingerprint = _fingerprint(fingerprint, spec, seed)
    run = _Run.new(task, spec, runtime)
    ckpts = Checkpoints(out_dir / "checkpoint")
    steps_per_epoch = _steps_per_epoch(data, spec, world, desc)
    _resume(run, ckpts, fingerprint, spec, runtime, seed, desc)
    # The step: the task's loss, or under torchrun DDP around it, which broadcasts rank 0's parameters
    # (the ranks start equal whatever each built or loaded; they should agree anyway).
    train_step = world.train_step(task, compiled=bool(runtime.compile))
    out = _Outputs(task, spec, runtime, out_dir, run, desc, events_dir, events_offset, hparams)
    _compile(task, run.model, runtime)
    if not run.resumed and spec.eval_every:
        out.evaluate(run, 0, final=False)  # what the initialization alone gives
    out.start(run)
    watch = _Watch(spec, steps_per_epoch, desc, run.step)
    started = time.perf_counter() - run.elapsed
    run.model.train()
    try:
        while run.step < spec.steps:
            epoch, skip = divmod(run.step, steps_per_epoch)
            for x, y in data.batches("train", spec.batch_size, seed=seed, epoch=epoch, shuffle=True,
                                     drop_last=True, skip_batches=skip, rank=world.rank, ranks=world.size):
                x, y = runtime.batch(x, y)
                run.optimizer.zero_grad(set_to_none=True)
                with runtime.autocast():
                    loss = train_step.loss(x, y)
                value = train_step.backward(loss, run.scaler)  # averaged over the ranks, left on the device
                checked = watch.check(value, run)  # TrainingDiverged here: before this batch's update
                _update(run, spec)
                run.step += 1
                run.elapsed = time.perf_counter() - started
                out.trained(run, epoch, watch.last_loss if checked else value, watch.last_loss)
                if spec.eval_every and run.step % spec.eval_every == 0 and run.step < spec.steps:
                    out.evaluate(run, epoch, final=False)
                epoch_end = run.step % steps_per_epoch == 0
                if run.step < spec.steps and (epoch_end or (spec.checkpoint_every
                                                            and run.step % spec.checkpoint_every == 0)):
                    _save(run, ckpts, runtime, out.events, fingerprint)
                if run.step >= spec.steps or epoch_end:
                    break
        out.bar.close()
        final = out.evaluate(run, (run.step - 1) // steps_per_epoch, final=True)
    finally:
        out.close()
    return {"steps": run.step, "epochs": run.step / steps_per_epoch, "train_time_s": round(run.elapsed, 3),
            "eval_time_s": round(out.eval_time, 3), "images_seen": run.step * spec.batch_size,
            "final_loss": watch.last_loss, **final}


# -- the pieces of `fit`, in the order it uses them -------------------------------------------------

def _fingerprint(fingerprint: dict | None, spec: TrainSpec, seed: int) -> dict:
    """The run's fingerprint with its seed, as it reads back from meta.json (a JSON round trip). A caller
    that says nothing gets at least the seed and the spec."""
    return json.loads(json.dumps({"seed": seed, **(fingerprint if fingerprint is not None else {"train": vars(spec)})}))


@dataclass
class _Run:
    """What the loop carries from step to step, and a checkpoint keeps: the model on its device, the
    trained parameters, the optimizer, schedule and fp16 scaler, the step, the loop's seconds and the
    run's first checked loss (the divergence check's reference)."""

    model: nn.Module
    named: list
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    scaler: object | None
    step: int = 0
    elapsed: float = 0.0
    start_loss: float | None = None
    resumed: bool = False

    @classmethod
    def new(cls, task: Task, spec: TrainSpec, runtime: Runtime) -> "_Run":
        model, named = runtime.place(task.model), task.trainable()
        optimizer = make_optimizer(model, named, spec)
        return cls(model, named, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, spec.lr_factor),
                   runtime.scaler())  # the scaler: None unless fp16

    def renew_optimizer(self, spec: TrainSpec) -> None:
        self.optimizer = make_optimizer(self.model, self.named, spec)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, spec.lr_factor)


def _steps_per_epoch(data, spec: TrainSpec, world, desc: str) -> int:
    """Full batches per epoch; the global batch must fit the data and split evenly over the ranks."""
    steps_per_epoch = data.steps_per_epoch("train", spec.batch_size)
    if steps_per_epoch < 1:
        raise ValueError(f"{desc}: batch_size {spec.batch_size} exceeds the "
                         f"{data.num_samples('train')} training samples")
    local_batch = world.local_batch(spec.batch_size, desc)
    if world.parallel and world.main:
        print(f"{desc}: data parallel over {world.size} processes ({world.backend}), {local_batch} "
              f"samples each of every batch of {spec.batch_size}", file=sys.stderr)
    return steps_per_epoch


def _resume(run: _Run, ckpts: "Checkpoints", fingerprint: dict, spec: TrainSpec, runtime: Runtime, seed: int,
            desc: str) -> None:
    """Seed this rank's stream, then load the checkpoint made under `fingerprint`, if there is one: the
    weights, optimizer, schedule, fp16 scaler and this rank's random state (one line on stderr, from
    rank 0, when a checkpoint cannot be used)."""
    world = runtime.world
    say = (lambda text: print(text, file=sys.stderr)) if world.main else (lambda text: None)
    # Each rank its own stream for dropout, drop-path and mixup; rank 0's is the seed's (linvit.distributed).
    torch.manual_seed(rank_seed(seed, world.rank))
    try:
        resumed = ckpts.load(run.model, fingerprint)
    except Unusable as why:
        say(f"{desc}: {why}; starting afresh")  # every rank reads the same checkpoint: one line for the job
        return
    if resumed is None:
        return
    weights, state, meta = resumed
    try:
        load_optimizer_state(run.optimizer, state["optimizer"])  # checks before it changes anything
    except (ValueError, KeyError, TypeError) as err:
        say(f"{desc}: checkpoint file {ckpts.latest() / 'state.pt'} does not fit the optimizer "
            f"({one_line(err)}); starting afresh")
        run.renew_optimizer(spec)
        return
    run.model.load_state_dict(weights)  # keys and shapes were checked
    run.scheduler.load_state_dict(state["scheduler"])
    run.step, run.elapsed, run.start_loss, run.resumed = meta["step"], meta["elapsed_s"], meta["start_loss"], True
    # This rank's generators: rank 0's are "rng"/"cuda_rng", the others' in "ranks_rng".
    others = state.get("ranks_rng") or []
    rng = state if world.rank == 0 else (others[world.rank - 1] if world.rank <= len(others) else None)
    if rng is None:  # more processes than wrote the checkpoint: a fresh stream of (seed, rank, step)
        torch.manual_seed(rank_seed(seed, world.rank, run.step))
    else:
        torch.set_rng_state(rng["rng"])
        if runtime.cuda and "cuda_rng" in rng:  # dropout on CUDA draws from the device's generator
            torch.cuda.set_rng_state(rng["cuda_rng"], runtime.device)
    if run.scaler is not None and state.get("scaler"):
        run.scaler.load_state_dict(state["scaler"])
    say(f"{desc}: resuming from step {run.step}")


def _compile(task: Task, model: nn.Module, runtime: Runtime) -> None:
    """`runtime.compile`: the task's modules compiled in place (nn.Module.compile), so parameters,
    state_dict keys and checkpoints stay as in eager."""
    if runtime.compile:
        for module in getattr(task, "compiled_modules", lambda: [model])():
            module.compile(backend=runtime.compile)


class _Outputs:
    """What the loop writes as it goes: rank 0's train.jsonl, TensorBoard events and progress, and the
    evaluations (their seconds counted apart: eval_time_s, and left out of the events' images/s)."""

    def __init__(self, task: Task, spec: TrainSpec, runtime: Runtime, out_dir: Path, run: _Run, desc: str,
                 events_dir, events_offset: int, hparams: dict | None):
        main = runtime.world.main
        self.task, self.spec, self.runtime, self.desc = task, spec, runtime, desc
        self.log = TrainLog(live_log_path(out_dir), run.step if run.resumed else None) if main else NoLog()
        self.events = (RunEvents(events_dir or run_events_dir(out_dir), batch_size=spec.batch_size,
                                 resumed=run.resumed, step=run.step, seconds=run.elapsed, offset=events_offset,
                                 hparams=hparams) if main else NoEvents())
        self.eval_time = 0.0  # seconds this call spent evaluating
        self.bar, self.eval_before = None, 0.0

    def evaluate(self, run: _Run, epoch: int, final: bool) -> dict:
        start = time.perf_counter()
        result = _evaluate(self.task, self.log, run.step, epoch, run.elapsed, final=final, runtime=self.runtime)
        self.eval_time += time.perf_counter() - start
        self.events.evaluation(run.step, result)
        return result

    def start(self, run: _Run) -> None:
        """The loop starts: its progress bar, and the evaluation seconds so far (outside the loop's clock)."""
        self.bar = _progress(self.spec.steps, run.step, self.desc, quiet=not self.runtime.world.main)
        self.eval_before = self.eval_time

    def trained(self, run: _Run, epoch: int, shown, last_loss: float) -> None:
        """After a step: progress (`shown`: the checked loss, or the step's own on the device), and at every
        `log_every`-th step and the last the log line and events of the last checked loss."""
        self.bar.update(run.step, shown)
        if run.step % self.spec.log_every == 0 or run.step == self.spec.steps:
            lr = run.scheduler.get_last_lr()[0]
            self.log.write({"kind": "train", "step": run.step, "epoch": epoch, "loss": last_loss, "lr": lr,
                            "elapsed_s": round(run.elapsed, 3)})
            self.events.train(run.step, last_loss, lr, run.elapsed - (self.eval_time - self.eval_before))

    def close(self) -> None:
        self.log.close()
        self.events.close()


class _Watch:
    """The divergence check, delayed: the loss is read on the host (a sync on CUDA) only at the steps
    `_check_due` names; between them the highest loss since the last check stays on the device (NaN
    wins: torch.maximum), and the check at the next due step covers those steps too."""

    def __init__(self, spec: TrainSpec, steps_per_epoch: int, desc: str, step: int):
        self.spec, self.steps_per_epoch, self.desc = spec, steps_per_epoch, desc
        self.worst, self.since, self.last_loss = None, step + 1, float("nan")

    def check(self, value: torch.Tensor, run: _Run) -> bool:
        """Whether the loss of step run.step + 1 (`value`) was read; raises TrainingDiverged when the highest
        loss since the last check diverged from the run's first (`diverged`)."""
        step = run.step + 1
        self.worst = value if self.worst is None else torch.maximum(self.worst, value)
        if not _check_due(self.spec, step, self.steps_per_epoch):
            return False
        self.last_loss, highest = value.item(), self.worst.item()
        if run.start_loss is None:
            run.start_loss = self.last_loss
        if diverged(self.spec, highest, run.start_loss):
            if diverged(self.spec, self.last_loss, run.start_loss):  # this step's own loss: say so
                highest, self.since = self.last_loss, step
            raise TrainingDiverged(_diverged_message(self.desc, self.spec, highest, run.start_loss, self.since, step))
        self.worst, self.since = None, step + 1
        return True


def _update(run: _Run, spec: TrainSpec) -> None:
    """The optimizer's and the schedule's step, after clipping the true gradients (unscaled under fp16; a
    GradScaler skips a step whose scaled gradients overflowed)."""
    if spec.clip_grad:
        if run.scaler is not None:
            run.scaler.unscale_(run.optimizer)
        nn.utils.clip_grad_norm_([p for _, p in run.named], spec.clip_grad)
    if run.scaler is None:
        run.optimizer.step()
    else:
        run.scaler.step(run.optimizer)
        run.scaler.update()
    run.scheduler.step()


def _save(run: _Run, ckpts: "Checkpoints", runtime: Runtime, events, fingerprint: dict) -> None:
    """A checkpoint of the run at its step: every rank's random state gathered (a collective), rank 0 writes."""
    world = runtime.world
    rngs = world.rng_states(runtime.device if runtime.cuda else None)  # every rank takes part
    if not world.main:
        return
    events.flush()  # the steps up to this checkpoint, which a resumed run keeps
    state = {"optimizer": run.optimizer.state_dict(), "scheduler": run.scheduler.state_dict(), **rngs[0]}
    if world.parallel:
        state["ranks_rng"] = rngs[1:]
    if run.scaler is not None:
        state["scaler"] = run.scaler.state_dict()
    ckpts.save(run.step, run.model, state,
               {"step": run.step, "elapsed_s": run.elapsed, "start_loss": run.start_loss, "fingerprint": fingerprint})


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
