"""TensorBoard event files of a training run, so that `tensorboard --logdir results/` shows a grid as it trains.

`linvit.train.fit` writes, on rank 0 only, into the run folder's `tb/` (`linvit.grid.EVENTS`):

    train/loss, train/lr        at every logged step (the values train.jsonl gets)
    train/images_per_s          training images per second since the last logged step, evaluation time left out
    eval/<key>                  every number an evaluation returns (test_acc; a distillation's distill_loss,
                                distill_terms/<term>, distill_loss_per_block/block<l>)

and a student's (or softmax reference's) evaluation adds, at the run's last step, what it measures (the
training job evaluates its model itself, `linvit evaluate` again by hand; both through
`linvit.steps._write_evaluation`): the attention fidelity per block (fidelity/<kl|js|corr>/block<l>, and
their means), the forward throughput (eval/throughput_img_s) and the parameter count, in an event file of
its own (suffix `.evaluate`, replaced when the evaluation reruns).

Each run's events also carry its cell as hparams, for TensorBoard's HParams view (one row per run,
filtered by any field; its metrics are the run's own scalars, eval/test_acc among them): `rule`
(teacher, distill, student or reference) and the fields that apply, of dataset, size, variant, init,
design, budget and seed (`cell_hparams`). They are written once, into the run's own event file when it
starts afresh (a hparams-plugin session start, `session_start`); a resumed run, or a later phase of a
distillation, keeps the ones already on disk.

Nothing here touches a random generator or a model: the numbers a run trains to are the same with
or without events. The writer is closed before the step writes metrics.json (the mark of a complete
run); a killed job leaves at most a truncated last event, which TensorBoard skips. Every checkpoint
flushes the events first, so a run that resumes from its checkpoint at step S finds its steps up to S
on disk; it opens a new event file with purge_step S + 1, so TensorBoard hides what the killed attempt
logged after S (redone now). A run that starts afresh removes the folder first. A write that fails
(a full disk) ends the run's events with one line on stderr; the run itself goes on.
"""

from __future__ import annotations

import math
import shutil
import sys
from pathlib import Path

from .grid import EVENTS

FLUSH_SECONDS = 10  # how stale a live run's curves may be in TensorBoard
EVALUATE_SUFFIX = ".evaluate"  # the event file of a run's evaluation (linvit.steps._write_evaluation)


def events_dir(run_dir: str | Path) -> Path:
    """Where a run folder's event files go."""
    return Path(run_dir) / EVENTS


def _writer(folder: Path, **kwargs):
    """A SummaryWriter on `folder`, or None (one line on stderr) when TensorBoard is not installed:
    a run is not refused for want of its curves."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as err:
        print(f"linvit: no TensorBoard events in {folder} ({err}; pip install tensorboard)", file=sys.stderr)
        return None
    return SummaryWriter(str(folder), flush_secs=FLUSH_SECONDS, **kwargs)


def scalars(values: dict, prefix: str) -> dict[str, float]:
    """The numbers of a (nested) result dict as flat TensorBoard tags: `prefix/key`, `prefix/key/sub` for a
    dict, `prefix/key/block<i>` for a list (one entry per block); None, strings, bools and non-finite
    values left out."""
    out = {}
    for key, value in values.items():
        tag = f"{prefix}/{key}"
        if isinstance(value, dict):
            out.update(scalars(value, tag))
        elif isinstance(value, (list, tuple)):
            out.update(scalars({f"block{i}": v for i, v in enumerate(value)}, tag))
        elif isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            out[tag] = float(value)
    return out


def cell_hparams(rule: str, **cell) -> dict:
    """A run's cell as TensorBoard hparams: `rule` (the Snakemake rule that trains it) and the cell's
    fields that apply to it (None: left out, as a teacher's design)."""
    return {"rule": rule, **{key: value for key, value in cell.items() if value is not None}}


class RunEvents:
    """The event files `fit` writes for one run (rank 0), from `step` on, the run having trained
    `seconds` so far (both 0 unless it resumes from a checkpoint).

    `offset` is added to every step: the steps of the earlier phases of a multi-phase distillation,
    whose phases write one curve into the same folder. A fresh start (not `resumed`, no offset) removes
    the folder's events and writes the run's `hparams` (cell_hparams); otherwise TensorBoard is told to
    forget the events past the steps kept (purge_step), and the hparams written at the start stand.
    """

    def __init__(self, folder: str | Path, *, batch_size: int, resumed: bool, step: int = 0, seconds: float = 0.0,
                 offset: int = 0, hparams: dict | None = None):
        folder = Path(folder)
        fresh = not resumed and not offset
        if fresh:
            shutil.rmtree(folder, ignore_errors=True)  # a killed attempt's events: this run redoes them
        folder.mkdir(parents=True, exist_ok=True)
        self.folder, self.offset, self.batch_size = folder, offset, batch_size
        self.writer = _writer(folder, purge_step=None if fresh else offset + step + 1)
        self.last = (step, seconds)  # (step, training seconds) at the last logged step
        if fresh and hparams:
            self._write(lambda writer: writer.file_writer.add_summary(session_start(hparams), 0))

    def train(self, step: int, loss: float, lr: float, seconds: float) -> None:
        """A logged training step: loss, learning rate and images per second since the previous logged
        step (or the start), `seconds` being the run's training time so far (evaluations left out)."""
        if self.writer is None:
            return
        values = {"train/loss": loss, "train/lr": lr}
        if seconds > self.last[1] and step > self.last[0]:
            values["train/images_per_s"] = (step - self.last[0]) * self.batch_size / (seconds - self.last[1])
        self.last = (step, seconds)
        self._add(values, step)

    def evaluation(self, step: int, result: dict) -> None:
        if self.writer is not None:
            self._add(scalars({k: v for k, v in result.items() if k != "samples"}, "eval"), step)

    def _add(self, values: dict, step: int) -> None:
        def add(writer):
            for tag, value in values.items():
                if math.isfinite(value):
                    writer.add_scalar(tag, value, self.offset + step)

        self._write(add)

    def flush(self) -> None:
        """Onto the disk: at a checkpoint, so that a resumed run finds every step up to it."""
        self._write(lambda writer: writer.flush())

    def close(self) -> None:
        self._write(lambda writer: writer.close())
        self.writer = None

    def _write(self, action) -> None:
        """`action(writer)`; a failure (a full disk) ends the events with one line on stderr, never the run."""
        if self.writer is None:
            return
        try:
            action(self.writer)
        except Exception as err:  # the writer's thread re-raises what failed there: OSError and others
            _stopped(self.folder, err)
            writer, self.writer = self.writer, None
            try:
                writer.close()
            except Exception:
                pass


class NoEvents:
    """The events of a rank other than 0: rank 0 writes the one set of a job."""

    def train(self, *args) -> None:
        pass

    def evaluation(self, *args) -> None:
        pass

    def flush(self) -> None:
        pass

    def close(self) -> None:
        pass


def write_evaluation(run_dir: str | Path, step: int, values: dict[str, float]) -> None:
    """An evaluation's scalars, at the run's last step, in the run's events: an event file of its
    own, replacing the one an earlier evaluation of the run wrote."""
    folder = events_dir(run_dir)
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob(f"*tfevents*{EVALUATE_SUFFIX}"):
        old.unlink()
    writer = _writer(folder, filename_suffix=EVALUATE_SUFFIX)
    if writer is None:
        return
    try:
        for tag, value in values.items():
            if math.isfinite(value):
                writer.add_scalar(tag, value, step)
        writer.close()
    except Exception as err:  # as RunEvents._write: the evaluation's own result (eval.json) comes first
        _stopped(folder, err)


def session_start(hparams: dict):
    """The hparams plugin's session-start summary of `hparams`, alone: written into the run's own event
    file, it makes the run's folder one row of the HParams view, its metrics the run's own scalars.
    SummaryWriter.add_hparams would write a sub-run of its own (a second row without the curves) beside
    an experiment summary, which the plugin takes from one run arbitrarily: without one, the plugin lists
    the union of every run's hparams (each string's values a set to filter by) and every scalar tag as a
    metric."""
    from torch.utils.tensorboard.summary import hparams as summaries

    return summaries(hparams, {})[1]


def _stopped(folder: Path, err: BaseException) -> None:
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    print(f"linvit: TensorBoard events in {folder} stopped ({text}); the run goes on", file=sys.stderr)
