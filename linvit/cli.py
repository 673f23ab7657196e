"""The `linvit` command: one subcommand per pipeline step, so each Snakemake rule also runs by hand."""

from __future__ import annotations

import argparse
import os
import sys
import time

from . import __version__


def stamp(name: str) -> None:
    """With LINVIT_STAMPS=FILE in the environment, append "<name> <unix time>" to FILE: the points
    `linvit bench jobcost` splits a job's time at (imports done, command done). Otherwise nothing."""
    path = os.environ.get("LINVIT_STAMPS")
    if path:
        with open(path, "a") as f:
            f.write(f"{name} {time.time():.6f}\n")


def _config(args) -> dict:
    """The command's config: --config-json is a job's slice of a config the workflow validated;
    a --config FILE is checked against the schema here (all but the sections it leaves out), so
    a mistyped value is one line naming its key before any work starts."""
    from .config import load_config, validate_schema

    if args.config_json is not None:
        return load_config(text=args.config_json)
    if args.config is None:
        raise ValueError("give --config FILE (or --config-json TEXT)")
    config = load_config(args.config)
    try:
        validate_schema(config, partial=True)
    except ValueError as err:
        raise ValueError(f"{args.config}: {err}") from None
    return config


def _runtime(args, config: dict | None = None):
    """Device, precision and compile backend, decided once before any compute: `--device` wins over
    the config's runtime.device; a bad value is one line (a ValueError naming the key or flag)."""
    from .device import runtime

    return runtime(config, getattr(args, "device", None))


def _say(runtime, text: str) -> None:
    """A command's closing line, printed once per job (by torchrun's rank 0)."""
    if runtime.world.main:
        print(text)


def _threads(args) -> None:
    if args.threads < 0:
        raise ValueError(f"--threads {args.threads}: give a positive number of threads (0: torch's choice)")
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)


def _writable(path: str, flag: str) -> None:
    """A file the command will write at its end: refused now if it cannot be (a folder, or a folder
    that cannot be made or written), so no measurement is lost to a bad path."""
    from pathlib import Path

    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{flag} {path}: is a folder; give a file name")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise ValueError(f"{flag} {path}: cannot make its folder ({err.strerror})") from None
    if not os.access(path.parent, os.W_OK):
        raise ValueError(f"{flag} {path}: its folder {path.parent} is not writable")


def cmd_check_config(args):
    from .config import validate
    from .grid import all_cells

    config = validate(_config(args))
    print(f"{args.config}: valid; {len(all_cells(config))} trained models in the grid")


def cmd_shards(args):
    from .steps import run_shards

    info = run_shards(_config(args), args.dataset, args.out, workers=args.workers)
    print(f"{args.dataset}: " + ", ".join(f"{s} {v['samples']} samples in {len(v['shards'])} shards"
                                          for s, v in info["splits"].items()))


def cmd_teacher(args):
    from .steps import run_teacher

    config = _config(args)
    rt = _runtime(args, config)
    m = run_teacher(config, args.size, args.seed, args.shards, args.out, runtime=rt)
    if "source" in m:  # loaded, not trained
        which = f" seed {m['seed']}" if "seed" in m else ""
        _say(rt, f"teacher {args.size}{which}: {m['model']} loaded from {m['file'] or 'timm hub/cache'} "
                 f"({m['params']} parameters)")
    else:
        _say(rt, f"teacher {args.size} seed {args.seed}: test accuracy {m['test_acc']:.4f} after {m['steps']} steps")


def cmd_distill(args):
    from .steps import run_distill

    config = _config(args)
    rt = _runtime(args, config)
    m = run_distill(config, args.dataset, args.size, args.variant, args.init, args.design, args.seed, args.teacher,
                    args.shards, args.out, runtime=rt)
    _say(rt, f"distilled {args.variant}: {m['loss']} loss {m['distill_loss']:.5f} on the probe batch")


def cmd_student(args):
    from .steps import run_student

    stamp("imported")
    if args.budget is not None and not 1 <= args.budget <= 10**8:  # the flag's name, not student.train.steps
        raise ValueError(f"--budget {args.budget}: must be at least 1 (the student's training steps)"
                         if args.budget < 1 else f"--budget {args.budget}: must be at most 10**8 steps")
    config = _config(args)
    rt = _runtime(args, config)
    m = run_student(config, args.dataset, args.size, args.variant, args.init, args.seed, args.teacher,
                    args.shards, args.out, distilled_dir=args.distilled, runtime=rt, design=args.design,
                    budget=args.budget, kd_dir=args.kd_teacher)
    _say(rt, f"{args.dataset}/{args.size}/{args.variant}/{args.init}/{args.design}/seed{args.seed}: "
          f"test accuracy {m['test_acc']:.4f} after {m['steps']} steps")


def cmd_evaluate(args):
    from .steps import run_evaluate

    config = _config(args)
    r = run_evaluate(config, args.run, args.teacher, args.shards, args.out, runtime=_runtime(args, config))
    print(f"{args.run}: fidelity KL {r['fidelity_kl_mean']:.4f}, {r['params']} parameters, "
          f"{r['throughput_img_s']:.0f} images/s ({r['device']}, {r['precision']}, batch {r['throughput_batch']})")


def cmd_report(args):
    from pathlib import Path

    from .report.render import write_report

    if not Path(args.results).is_dir():  # a mistyped path would render an empty report over a good one
        raise ValueError(f"--results {args.results}: no such folder (the grid's results/)")
    paths = write_report(_config(args), args.results, args.out)
    print(f"report: wrote {len(paths)} files under {args.out}")


def cmd_status(args):
    from pathlib import Path

    from .config import validate
    from .decide_state import current_config
    from .status_decide import status_lines
    from .runrecord import read_record, status_config
    from .status import collect, render

    if not Path(args.directory).is_dir():
        raise ValueError(f"--directory {args.directory}: no such folder (the project folder Snakemake runs in)")
    # What the run is, as its record says (the config Snakemake merged); a config given here is for a grid
    # not yet started (or to read a run as another config would see it).
    record = read_record(args.directory)
    config, name = status_config(args.configfile, args.config, record)
    config = validate(config)
    # A sequential run (linvit decide): its current look's jobs, and where the looks stand.
    grid = collect(current_config(config, args.directory), args.directory, record=record)
    text = render(grid, name, every=args.every)
    lines = status_lines(config, args.directory)
    print(text + "".join(f"\n{line}" for line in lines) + ("\n" if lines else ""), end="")


def cmd_decide(args):
    from .decide import main

    main(args.snakemake)


def cmd_mini_paper_inputs(args):
    from .config import validate
    from .mini_paper import make_inputs

    make_inputs(validate(_config(args)))
    print(f"mini paper: inputs of {args.config} ready")


def cmd_variants(args):
    import pandas as pd

    from .attention import available_variants
    from .models import build_vit
    from .sizes import INPUTS, size_spec
    from .transfer import group_sizes

    size_spec(args.size)
    shape = {k: INPUTS[args.size][k] for k in ("img_size", "in_chans", "num_classes")}
    rows = []
    for v in available_variants():
        sizes = group_sizes(build_vit(args.size, variant=v, **shape))
        rows.append({"variant": v, "params": sum(sizes.values()), "attn": sizes["attn"],
                     "attn_extra (operator-specific)": sizes["attn_extra"]})
    print(f"operators at size {args.size}:")
    print(pd.DataFrame(rows).to_string(index=False))


def cmd_benchmark(args):
    from .benchmark import run_benchmark, summarize
    from .io import atomic_path

    try:
        tokens = [int(t) for t in args.tokens.split(",")]
    except ValueError:
        raise ValueError(f"--tokens {args.tokens!r}: give comma-separated whole numbers (256,1024,4096)") from None
    _writable(args.out, "--out")  # before the timing, not after it
    rt = _runtime(args)  # the benchmark times fp32: eager unless --compile
    if args.compile:
        from .device import resolve_compile

        resolve_compile(args.compile, "--compile")
    device = rt.device
    df = run_benchmark(args.variants.split(",") if args.variants else None, tokens,
                       max_softmax_tokens=args.max_softmax_tokens, batch=args.batch, heads=args.heads,
                       head_dim=args.head_dim, scope=args.scope, device=device, compile=args.compile,
                       repeats=args.rounds)
    with atomic_path(args.out) as tmp:
        df.to_csv(tmp, index=False)
    table = df.pivot(index="variant", columns="tokens", values="seconds") * 1e3
    print(f"forward+backward ms of the {args.scope} on {device}, {args.compile or 'eager'} (batch {args.batch}, "
          f"{args.heads} heads, head dim {args.head_dim}):")
    print(table.round(2).to_string())
    low, high = tokens[0], (4096 if 4096 in tokens else tokens[-1])
    print(summarize(df, low, high).round(2).to_string(index=False))
    print(f"wrote {args.out}")


def _int_list(text: str) -> list[int]:
    """`bench --ranks 2,4,8`: whole numbers from 1, comma-separated."""
    try:
        values = [int(v) for v in text.split(",")]
    except ValueError:
        values = []
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of whole numbers from 1")
    return values


def cmd_bench(args):
    from .bench import ALL, run

    names = list(ALL) if args.which == "all" else [args.which]
    try:
        run(names, config_path=args.config, shards=args.shards, out_dir=args.out_dir, steps=args.steps,
            repeats=args.repeats, images=args.images, jobs=args.jobs, baseline=args.baseline,
            job_repeats=args.job_repeats, results=args.results, ranks=args.ranks)
    except RuntimeError as err:  # a subprocess (snakemake, the job) failed: its message, one line
        raise ValueError(str(err)) from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="linvit", description=__doc__)
    parser.add_argument("--version", action="version", version=f"linvit {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    device_help = ("auto (CUDA when available, else CPU), cpu, cuda or cuda:N; overrides the config's "
                   "runtime.device")

    def command(name, fn, help, *args, computes=True, optional=("distilled", "kd-teacher", "budget", "design")):
        p = sub.add_parser(name, help=help)
        p.add_argument("--config", help="config file (YAML or JSON)")
        p.add_argument("--config-json", help="the config as JSON text (what the workflow passes)")
        p.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
        if computes:
            p.add_argument("--device", default=None, help=device_help)
        for a in args:
            p.add_argument(f"--{a}", required=a not in optional,
                           type=int if a in ("seed", "budget") else str,
                           **({"default": "none"} if a == "design" and a in optional else {}))
        p.set_defaults(fn=fn)
        return p

    check = sub.add_parser("check-config", help="validate a config against the schema and the registries")
    check.add_argument("config")
    check.set_defaults(fn=cmd_check_config, config_json=None)
    shards = command("shards", cmd_shards, "write a dataset's webdataset shards and manifest", "dataset", "out",
                     computes=False)
    shards.add_argument("--workers", type=int, default=None,
                        help="processes writing shards in parallel (default: min(4, CPUs))")
    command("teacher", cmd_teacher, "pretrain the softmax teacher, or load a pretrained one (config.teachers)",
            "size", "seed", "shards", "out", optional=("seed", "shards"))
    command("distill", cmd_distill, "stage 1: initialize a student by an init strategy and distill it by a design",
            "dataset", "size", "variant", "init", "design", "seed", "teacher", "shards", "out",
            optional=())
    command("student", cmd_student, "stage 2: initialize a student (or take its stage 1) and train it",
            "dataset", "size", "variant", "init", "design", "seed", "budget", "teacher", "shards", "out",
            "distilled", "kd-teacher")
    command("evaluate", cmd_evaluate, "attention fidelity, parameters and throughput of a run",
            "run", "teacher", "shards", "out")
    from .convert import add_parser as add_convert_parser

    add_convert_parser(sub)  # linvit convert: a teacher in, a linear ViT checkpoint and its summary out
    command("report", cmd_report, "aggregate results/ into tables, figures and claim verdicts",
            "results", "out", computes=False)
    status = sub.add_parser("status", help="where a grid stands, during or after a run (local or Slurm): per rule "
                                           "its jobs finished, running, queued, interrupted, failed (the log's error "
                                           "line, Slurm's state), blocked and to run; the time so far, queue wait, "
                                           "GPU-hours and an estimate of what remains")
    status.add_argument("--configfile", nargs="+", metavar="FILE",
                        help="for a grid not yet started: its config files, merged as Snakemake merges them "
                             "(default: the config the last run recorded, else workflow/config/default.yaml)")
    status.add_argument("--config", nargs="+", metavar="KEY=VALUE",
                        help="overrides over the config files, as Snakemake's --config takes them")
    status.add_argument("--directory", "-d", default=".", help="the project folder Snakemake runs in (default: here)")
    status.add_argument("--all", dest="every", action="store_true",
                        help="list every job of each rule (default: those running, queued, interrupted, failed or "
                             "blocked)")
    status.set_defaults(fn=cmd_status, config_json=None)
    decide = sub.add_parser(
        "decide", help="run a grid with a sequential plan look by look, adding seeds only where a claim's test is "
                       "undecided (every other argument goes to snakemake)",
        usage="%(prog)s [CONFIG] [--configfile FILE [FILE ...]] [--directory DIR] [-n] [SNAKEMAKE ARGS ...]",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Run a grid with a sequential plan (its `sequential:` section) look by look: Snakemake runs "
                    "each look,\nthe report judges it, and the next look adds seeds only to the roles of the tests "
                    "still undecided.\nIt records the looks in results/decide/state.json and resumes there when "
                    "rerun.",
        epilog="options the driver reads (it passes them on to Snakemake too):\n"
               "  CONFIG                        a grid's config (.yaml), run under its own `sequential:` plan, "
               "or\n"
               "                                workflow/config/decide.yaml's where it has none\n"
               "  --configfile FILE [FILE ...]  the grid's config files, merged as Snakemake merges them; one of "
               "them\n"
               "                                holds the plan (default: workflow/config/default.yaml\n"
               "                                workflow/config/decide.yaml)\n"
               "  --directory DIR, -d DIR       the project folder Snakemake runs in (results/ and report/ "
               "there)\n"
               "  -n, --dry-run, --dryrun       Snakemake's dry run of the current look: what it would run; "
               "nothing\n"
               "                                is recorded in results/decide/state.json\n"
               "\n"
               "every other argument goes to Snakemake unchanged, e.g. --cores 2, --profile slurm, "
               "--keep-going\n"
               "(--rerun-incomplete is added, so a stopped look resumes; --config is refused: put overrides "
               "in a\nconfig file and add it with --configfile).\n"
               "Ctrl-C (or SIGINT/SIGTERM to the driver) stops Snakemake and its jobs and waits for it to "
               "release\nits locks: rerun the same command to resume.")
    decide.set_defaults(fn=cmd_decide, snakemake=[])
    mini = sub.add_parser("mini-paper-inputs", help="make mini_paper.yaml's JPEG ImageFolders and teacher file "
                                                    "from data available offline")
    mini.add_argument("--config", default="workflow/config/mini_paper.yaml")
    mini.set_defaults(fn=cmd_mini_paper_inputs, config_json=None)
    variants = sub.add_parser("variants", help="list the attention operators and their parameter counts")
    variants.add_argument("--size", default="micro", help="model size (default micro)")
    variants.set_defaults(fn=cmd_variants)
    bench = sub.add_parser("benchmark", help="forward+backward time of every operator against tokens, beside softmax")
    bench.add_argument("--tokens", default="256,1024,4096,16384", help="comma-separated square token counts")
    bench.add_argument("--variants", default="", help="comma-separated operators (default: all)")
    bench.add_argument("--batch", type=int, default=2)
    bench.add_argument("--heads", type=int, default=4)
    bench.add_argument("--head-dim", type=int, default=32)
    bench.add_argument("--max-softmax-tokens", type=int, default=16384,
                       help="skip softmax above this many tokens (its cost is quadratic)")
    bench.add_argument("--scope", choices=["core", "module"], default="core",
                       help="core (default): the token mixing from q, k, v, what SDPA does for softmax; "
                            "module: the whole attention module, with its projections and gates")
    bench.add_argument("--compile", default=None, metavar="BACKEND",
                       help="compile every module, softmax's included, with this torch.compile backend "
                            "(inductor), as runtime.compile does in a job; default: eager")
    bench.add_argument("--threads", type=int, default=0)
    bench.add_argument("--rounds", type=int, default=5,
                       help="alternating rounds at each token count (each operator keeps its median; the "
                            "CSV keeps the fastest and slowest round and the per-round speedups' range)")
    bench.add_argument("--device", default=None, help=device_help)
    bench.add_argument("--out", default="results/benchmark/attention.csv")
    bench.set_defaults(fn=cmd_benchmark)
    harness = sub.add_parser("bench", help="the harness's own speed against issue 10's targets "
                                           "(results/bench/<machine>.csv)")
    harness.add_argument("which", choices=["train", "loader", "plan", "jobcost", "shards", "grid", "status", "all"],
                         help="all: every benchmark but grid, which reads a finished grid's --results")
    harness.add_argument("--config", default=None, help="the grid whose student settings are timed "
                                                        "(default: workflow/config/default.yaml)")
    harness.add_argument("--shards", default=None, help="a shard folder to read (default: scikit-learn digits, "
                                                        "written to a temporary folder)")
    harness.add_argument("--out-dir", default="results/bench", help="where <machine>.csv goes")
    harness.add_argument("--steps", type=int, default=None,
                         help="train: steps per repeat (default: the config's student steps; at most an epoch)")
    harness.add_argument("--repeats", type=int, default=5, help="train: repeats (the median fit/bare pair reported)")
    harness.add_argument("--images", type=int, default=4096, help="loader: images read")
    harness.add_argument("--ranks", type=_int_list, default=None, metavar="N[,N...]",
                         help="loader: read as N ranks would (each its share of the same global batches), "
                              "against one process: bytes and images/s per rank, on ImageNet-size JPEGs")
    harness.add_argument("--jobs", type=int, default=2000, help="plan: about this many jobs")
    harness.add_argument("--baseline", default=None,
                         help="jobcost: a checkout of another revision to run the same job with, side by side "
                              "(e.g. git worktree add /tmp/old 5dadba5); default: the 28.9 s recorded")
    harness.add_argument("--job-repeats", type=int, default=1, help="jobcost: runs of each job (medians)")
    harness.add_argument("--results", default="results", help="grid: the results folder of a finished grid")
    harness.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's choice)")
    harness.set_defaults(fn=cmd_bench, config_json=None)
    return parser


def main(argv=None) -> int:
    """Run one command; 0 on success. Called without `argv` (the `linvit` console command), the
    process ends here through os._exit once its output is flushed: a job's result is written by
    then, and tearing down torch's modules and objects at interpreter exit took ~2 s per job."""
    code = _run(argv)
    stamp("finished")
    if argv is None:
        import logging

        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def _one_line_error(err: BaseException) -> bool:
    """A user's mistake, a diverged run (linvit.train.TrainingDiverged) or a step data parallelism refuses
    (linvit.distributed.DataParallelError), which only a command that imported those modules raises: the
    torch-free commands do not import them to ask."""
    train, dist = sys.modules.get("linvit.train"), sys.modules.get("linvit.distributed")
    return (isinstance(err, (ValueError, OSError))
            or (train is not None and isinstance(err, train.TrainingDiverged))
            or (dist is not None and isinstance(err, dist.DataParallelError)))


def _run(argv) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if getattr(args, "fn", None) is cmd_decide:
        args.snakemake = extra  # Snakemake's own arguments, passed through
    elif extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        if hasattr(args, "threads"):
            _threads(args)
        args.fn(args)
    except KeyboardInterrupt as err:  # linvit decide's Interrupted says how it stopped its Snakemake
        print("linvit: interrupted" + (f": {err}" if str(err) else ""), file=sys.stderr)
        return 130
    except Exception as err:
        if not _one_line_error(err):
            raise
        # A user's mistake, a diverged run or a step data parallelism refuses: one line, no traceback.
        msg = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        print(f"linvit: error: {msg}", file=sys.stderr)
        return 1
    finally:
        if "torch" in sys.modules:  # only a computing command can have joined a torchrun group
            from .distributed import shutdown

            shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
