"""A run's checkpoint folder, `<out_dir>/checkpoint/`: the checkpoints `linvit.train.fit` resumes from and
the training log it writes beside them.

    checkpoint/step<N>/   model.safetensors, state.pt (optimizer, scheduler, every rank's random state,
                          the fp16 scaler: tensors and plain values only, read with weights_only=True)
                          and meta.json (step, the loop's seconds, the run's first loss, its fingerprint)
    checkpoint/LATEST     the name of the last complete step<N>/, replaced atomically after it is written
    checkpoint/train.jsonl  the live log (`live_log_path`), moved to <out_dir>/train.jsonl when the run
                          ends (`publish_log`)

A checkpoint is resumed only under an equal fingerprint; one that cannot be (unreadable, another
config, other tensors) raises `Unusable` with the one line to print, and nothing is applied.
"""

from __future__ import annotations

import json
import os
import shutil
import types
from pathlib import Path

import torch
from torch import nn

from .io import atomic_path, write_json, write_safetensors, write_text


def one_line(err: BaseException, limit: int = 160) -> str:
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


class Unusable(Exception):
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
                    raise OSError(f"cannot write {folder / 'state.pt'}: {one_line(err)}") from None
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

        Raises Unusable (a one-line reason) when it cannot be read or was made under another
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
            raise Unusable(f"checkpoint file {meta_path} is unreadable ({one_line(err)})") from None
        changed = fingerprint_changes(saved, fingerprint)
        if changed:
            shown = ", ".join(changed[:6]) + (f" and {len(changed) - 6} more" if len(changed) > 6 else "")
            raise Unusable(f"checkpoint in {self.root} was made under another config (changed: {shown})")
        from safetensors.torch import load_file

        weights_path, state_path = folder / "model.safetensors", folder / "state.pt"
        try:
            weights = load_file(str(weights_path))
        except Exception as err:  # safetensors raises SafetensorError, OSError... for a bad file
            raise Unusable(f"checkpoint file {weights_path} is unreadable ({one_line(err)})") from None
        expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        if {k: tuple(v.shape) for k, v in weights.items()} != expected:
            raise Unusable(f"checkpoint file {weights_path} does not fit the model (other tensors or shapes)")
        try:
            # weights_only: a state.pt that is not plain tensors and containers is refused, never run.
            # map_location cpu: tensors a CUDA run saved load on any machine; the RNG state must be a
            # CPU tensor, and optimizer.load_state_dict moves its state onto the parameters' device.
            state = torch.load(state_path, map_location="cpu", weights_only=True)
            missing = [k for k in ("optimizer", "scheduler", "rng") if k not in state]
            if missing:
                raise ValueError(f"lacks {', '.join(missing)}")
        except Exception as err:  # truncated zip, unpickling refused, wrong content
            raise Unusable(f"checkpoint file {state_path} is unreadable ({one_line(err)})") from None
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


class NoLog:
    """The log of a rank other than 0: rank 0 writes the one log of the job."""

    def write(self, record: dict) -> None:
        pass

    def close(self) -> None:
        pass


class TrainLog:
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
            raise OSError(f"{path}: cannot read the training log ({one_line(err)})") from None
        numbered = [(i, ln) for i, ln in enumerate(raw, 1) if ln.strip()]
        kept = []
        for n, (i, ln) in enumerate(numbered):
            try:
                record = json.loads(ln)
                step = record.get("step", 0)
            except (ValueError, AttributeError) as err:
                if n == len(numbered) - 1:
                    break  # the interrupted last write
                raise ValueError(f"{path}:{i}: malformed log line ({one_line(err, 80)}); fix or delete "
                                 f"that line and rerun (the checkpoint is kept)") from None
            if step <= resume_step:
                kept.append(ln)
        return kept

    def write(self, record: dict) -> None:
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()
