"""`linvit convert`'s command line: its arguments, `add_parser` for linvit.cli's subcommands, and
`main` to run it standalone."""

from __future__ import annotations

import argparse
import json
import sys

from .pipeline import convert
from .request import DEFAULT_CONFIG, DEFAULT_INIT, ConvertError

# The package docstring's first line (already set while the package imports this module).
DESCRIPTION = sys.modules[__package__].__doc__.split("\n\n")[0]


def _arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--teacher", required=True,
                   help="a teacher folder written by `linvit teacher` (with model.json), a timm model name "
                        "(weights from timm's hub or its cache), or a weights file (.safetensors/.pth/.pt/.bin)")
    p.add_argument("--model", default=None,
                   help="the timm model name a weights file fits (default: the 'architecture' of the "
                        "timm config.json beside it)")
    p.add_argument("--model-args", default=None, type=json.loads,
                   help="JSON: timm.create_model options the teacher weights were made with (e.g. "
                        "'{\"reg_tokens\": 4}'), for a name or a file")
    p.add_argument("--variant", required=True, help="the linear attention operator (see `linvit variants`)")
    p.add_argument("--size", default=None,
                   help="the requested student's linvit size (micro, mini, deit_tiny, ...); checked against "
                        "the teacher's shape before anything runs (default: the size of the teacher's shape)")
    p.add_argument("--init", default=DEFAULT_INIT, help=f"init strategy of the config (default {DEFAULT_INIT})")
    p.add_argument("--design", default=None,
                   help="distillation design (default: the config's first of `distills`, i.e. the paper's recipe)")
    p.add_argument("--shards", required=True, help="the target's shards (`linvit shards`); its test split is evaluated")
    p.add_argument("--dataset", default=None,
                   help="the config's dataset entry for the shards (transform, labels); default: the "
                        "dataset name in the shards' manifest")
    p.add_argument("--distill-steps", type=int, default=None, help="stage 1 budget (default: distill.train.steps)")
    p.add_argument("--steps", type=int, default=None, help="stage 2 budget (default: student.train.steps)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--config", default=None,
                   help=f"config file whose training settings to use (default: {DEFAULT_CONFIG.relative_to(DEFAULT_CONFIG.parents[2])})")
    p.add_argument("--device", default=None, help="auto (CUDA when available), cpu, cuda or cuda:N")
    p.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    p.add_argument("--bench-batch", type=int, default=None,
                   help="the larger batch of the latency and memory figures (default: evaluation.throughput_batch)")
    p.add_argument("--bench-seconds", type=float, default=0.5,
                   help="least time each latency figure is measured for (default 0.5)")
    p.add_argument("--out", required=True, help="output folder")
    return p


def add_parser(subparsers) -> argparse.ArgumentParser:
    """`linvit convert` in linvit.cli's subcommands; errors raise, for cli.main to print in one line."""
    p = subparsers.add_parser("convert", help="convert a pretrained softmax timm ViT into a linear-attention "
                                              "timm checkpoint (distill, train, evaluate, export)",
                              description=DESCRIPTION)
    _arguments(p)
    p.set_defaults(fn=_cli, config_json=None)
    return p


def _cli(args: argparse.Namespace) -> None:
    if args.threads < 0:
        raise ConvertError(f"--threads {args.threads}: give a positive number of threads (0: torch's choice)")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    convert(args)


def main(argv=None) -> int:
    """Run `linvit convert` with `argv` (a list of arguments, or an argparse.Namespace); the exit
    status: 0, 1 with one line on stderr for a mistake or a diverged run, 130 when interrupted."""
    if isinstance(argv, argparse.Namespace):
        args = argv
    else:
        args = _arguments(argparse.ArgumentParser(prog="linvit convert", description=DESCRIPTION)).parse_args(argv)
    from ..train import TrainingDiverged

    try:
        _cli(args)
    except KeyboardInterrupt:
        print("linvit convert: interrupted", file=sys.stderr)
        return 130
    except (ValueError, OSError, TrainingDiverged) as err:
        msg = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        print(f"linvit convert: error: {msg}", file=sys.stderr)
        return 1
    return 0
