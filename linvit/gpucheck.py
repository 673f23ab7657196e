"""Check the GPU paths on a machine with a GPU: train every operator briefly, time the operators, and
run the map losses under bf16 and fp16 autocast.

Run on the GPU machine, from the repository root with the package's environment active:

    python -m linvit.gpucheck

It takes about 1-3 minutes on one recent GPU (12 operators; well under 5), minutes to tens of
minutes on a CPU at the defaults (use `--size micro` there). It does three things on one device:

1. Training. For every registered operator (softmax included, or those of `--variants`): a ViT of
   `--size` (default deit_tiny, 224 px, 3 channels, 1000 classes) trained with AdamW on seeded
   random images and random labels, the forward under the runtime's autocast (bf16 on CUDA by
   default; fp16 with a GradScaler). `--warmup` untimed steps, then `--steps` timed ones.
2. The operator benchmark (`linvit.benchmark.time_operator`: forward+backward of the token mixing,
   fp32 eager, median of repeats) at `--tokens` (default 256 to 16,384), beside softmax (SDPA), with
   the heads and head width of `--size`.
3. The map losses (every registered loss that reads attention maps: map_ce, map_js, ...), each
   teacher-forced and end to end, for every operator as the student of a softmax teacher of
   `--size` (batch 2, seeded random images, the training step's forward and backward) under bf16
   and fp16 autocast (bf16 only on the CPU): whether the maps the losses read are float32 and finite
   (`linvit.attention.attention_maps` computes them with autocast off), and the losses and gradients finite.
4. Data parallelism, where two GPUs exist (`data_parallel`, `linvit.dpcheck`): two NCCL ranks of the
   training loop (DistributedDataParallel) on cuda:0 and cuda:1 and one process alone, on small MLPs
   for a few steps with several DDP buckets: in fp32 (TF32 matmuls), bf16 and fp16 with a
   GradScaler, every step's gradients and loss of 2 ranks x B/2 against one process x B within the
   precision's tolerance (a sum over the ranks instead of a mean is off by 1) and the parameters
   equal across the ranks; with dropout, the ranks' masks different and rank 0's those of one
   process. Printed as rows of a table; with fewer than two GPUs one row says it was skipped and why.

It writes three CSVs into `--out` (default results/gpucheck), named after the device, with `<slug>`
the CUDA device name lowercased with every other character as `_` (nvidia_h200), or `cpu`:

train_<slug>.csv, one row per operator:
    variant, size, img_size, batch, steps, warmup, device (name), precision (fp32, bf16, fp16),
    params_m (millions), images_per_s (timed steps only, CUDA synchronized before reading the clock),
    step_ms, peak_mem_mib, peak_mem_kind, first_loss, last_loss, losses_finite (every step's loss,
    warm-up included), error (empty, or the one-line error that stopped this operator), torch.
    peak_mem_kind says what peak_mem_mib is: `cuda_max_allocated` (torch.cuda.max_memory_allocated
    since just before this operator's model was built) or, on the CPU, `process_peak_rss` (the
    process's peak resident memory so far; it never goes down, so it bounds this operator's from
    above and does not isolate it).

attention_<slug>.csv, one row per (tokens, operator); softmax is always included as the reference:
    variant, tokens, size, batch, heads, head_dim, scope, device, precision (`fp32`, or
    `fp32+tf32` on CUDA, where linvit.device turns on TF32 matmuls), ms (forward+backward),
    speedup_vs_softmax (softmax's ms / this ms at the same tokens), peak_mem_mib (CUDA only; empty on
    the CPU), error, torch.

maps_<slug>.csv, one row per (precision, operator):
    precision (bf16, fp16), variant, terms (map losses x teacher-forced / end to end), maps_dtype
    (the dtypes of the maps the losses read, `/`-joined; want float32), maps_finite, loss_finite,
    max_rel_diff (the largest relative difference of a term from its value without autocast, whose
    upstream activations differ by the autocast's rounding) and worst_term (that term), grads_finite
    (the student's gradients of the autocast losses' sum), ok (float32, finite maps, losses and
    gradients), error, torch.

It prints them as tables on stdout and one progress line per operator on stderr. Exit status: 0,
1 when an operator failed, a loss was not finite, a map check or the data-parallel check was not
ok (the CSVs are still written, the failure in its row's `error`, the other operators run), 2 for
a bad option (one line: `gpucheck: <why>`).
"""

from __future__ import annotations

import argparse
import gc
import math
import re
import resource
import sys
import time

import torch

from .attention import attention_class, available_variants
from .benchmark import time_operator
from .device import Runtime, runtime
from .io import atomic_path
from .registry import SOFTMAX
from .sizes import INPUTS, SIZES, size_spec

DEFAULT_TOKENS = (256, 1024, 4096, 16384)
MIB = 2 ** 20


def device_name(rt: Runtime) -> str:
    return torch.cuda.get_device_name(rt.device) if rt.cuda else "cpu"


def device_slug(rt: Runtime) -> str:
    return re.sub(r"[^a-z0-9]", "_", device_name(rt).lower()) if rt.cuda else "cpu"


def _one_line(err: BaseException) -> str:
    text = str(err).strip()
    return f"{type(err).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


def _reset_peak(rt: Runtime) -> None:
    if rt.cuda:
        torch.cuda.synchronize(rt.device)
        torch.cuda.reset_peak_memory_stats(rt.device)


def _peak_mib(rt: Runtime) -> float:
    if rt.cuda:
        return torch.cuda.max_memory_allocated(rt.device) / MIB
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux reports KiB


def _free(rt: Runtime) -> None:
    # After an OOM the cached blocks of the failed operator must go before the next one starts.
    gc.collect()
    if rt.cuda:
        torch.cuda.empty_cache()


def _run_row(rt: Runtime, row: dict, work, label: str, done) -> dict:
    """One row of a check: `work()`'s dict merged into `row`, or its exception kept as the row's
    one-line error (an OOM or a kernel failing in one operator leaves the others to run); memory
    freed, torch's version added, and the row said on stderr (`done(row)` when it worked)."""
    try:
        row.update(work())
    except Exception as err:  # noqa: BLE001 - recorded in the row
        row["error"] = _one_line(err)
    _free(rt)
    row["torch"] = torch.__version__
    print(f"gpucheck: {label}: {row['error'] or done(row)}", file=sys.stderr, flush=True)
    return row


def train_operator(variant: str, rt: Runtime, *, size: str, img_size: int, in_chans: int,
                   num_classes: int, batch: int, steps: int, warmup: int, seed: int = 0) -> dict:
    """Images/s, peak memory and losses of a short AdamW run of one operator on random data."""
    from .models import build_vit

    _reset_peak(rt)
    torch.manual_seed(seed)
    model = build_vit(size, num_classes=num_classes, img_size=img_size, in_chans=in_chans,
                      variant=variant).to(rt.device).train()
    opt = torch.optim.AdamW(model.parameters(), lr=5e-4, weight_decay=0.05)
    scaler = rt.scaler()
    # Two fixed batches, made on the CPU from a seeded generator and moved once through the
    # runtime's pinned copy: making a 224 px batch per step on the CPU would be timed as training.
    gen = torch.Generator().manual_seed(seed)
    data = [rt.batch(torch.randn(batch, in_chans, img_size, img_size, generator=gen),
                     torch.randint(0, num_classes, (batch,), generator=gen)) for _ in range(2)]
    losses = []

    def step(i):
        x, y = data[i % len(data)]
        opt.zero_grad(set_to_none=True)
        with rt.autocast():
            loss = torch.nn.functional.cross_entropy(model(x), y)
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        losses.append(loss.detach())  # read after the clock: .item() per step would sync each step

    for i in range(warmup):
        step(i)
    sync = (lambda: torch.cuda.synchronize(rt.device)) if rt.cuda else (lambda: None)
    sync()
    start = time.perf_counter()
    for i in range(warmup, warmup + steps):
        step(i)
    sync()
    seconds = time.perf_counter() - start
    values = torch.stack(losses).float().cpu().tolist()
    return {"params_m": sum(p.numel() for p in model.parameters()) / 1e6,
            "images_per_s": batch * steps / seconds, "step_ms": seconds / steps * 1e3,
            "peak_mem_mib": _peak_mib(rt), "first_loss": values[0], "last_loss": values[-1],
            "losses_finite": all(math.isfinite(v) for v in values)}


def train_all(variants, rt: Runtime, *, size, img_size, in_chans, num_classes, batch, steps, warmup):
    import pandas as pd

    rows = []
    common = {"size": size, "img_size": img_size, "batch": batch, "steps": steps, "warmup": warmup,
              "device": device_name(rt), "precision": rt.precision}
    kind = "cuda_max_allocated" if rt.cuda else "process_peak_rss"
    for v in variants:
        row = {"variant": v, **common, "params_m": math.nan, "images_per_s": math.nan,
               "step_ms": math.nan, "peak_mem_mib": math.nan, "peak_mem_kind": kind,
               "first_loss": math.nan, "last_loss": math.nan, "losses_finite": False, "error": ""}
        rows.append(_run_row(
            rt, row, lambda: train_operator(v, rt, size=size, img_size=img_size, in_chans=in_chans,
                                            num_classes=num_classes, batch=batch, steps=steps, warmup=warmup),
            f"train {v:>10}", lambda r: (f"{r['images_per_s']:9.1f} img/s, peak {r['peak_mem_mib']:8.0f} MiB, "
                                         f"loss {r['first_loss']:.3f} -> {r['last_loss']:.3f}")))
    return pd.DataFrame(rows)


def benchmark_all(variants, rt: Runtime, tokens, *, size: str):
    """linvit.benchmark's timing per (tokens, operator), each failure kept in its row (run_benchmark
    stops at the first), with the heads and head width of `size`."""
    import pandas as pd

    spec = size_spec(size)
    heads, head_dim = spec["num_heads"], spec["embed_dim"] // spec["num_heads"]
    shape = {"batch": 2, "heads": heads, "head_dim": head_dim, "scope": "core"}
    variants = [SOFTMAX] + [v for v in variants if v != SOFTMAX]  # the reference, first
    tf32 = rt.cuda and torch.backends.cuda.matmul.fp32_precision == "tf32"
    rows = []
    for n in tokens:
        for v in variants:
            row = {"variant": v, "tokens": n, "size": size, **shape, "device": device_name(rt),
                   "precision": "fp32+tf32" if tf32 else "fp32", "ms": math.nan, "peak_mem_mib": math.nan,
                   "error": ""}
            _reset_peak(rt)

            def timed(v=v, n=n):
                ms = time_operator(v, n, device=rt.device, **shape) * 1e3
                return {"ms": ms, **({"peak_mem_mib": _peak_mib(rt)} if rt.cuda else {})}

            rows.append(_run_row(rt, row, timed, f"attention {v:>10} N={n:>6}", lambda r: f"{r['ms']:9.2f} ms"))
    df = pd.DataFrame(rows)
    ref = df[df.variant == SOFTMAX].set_index("tokens")["ms"]
    df.insert(df.columns.get_loc("ms") + 1, "speedup_vs_softmax", [ref.get(n, math.nan) / ms
                                                                  for n, ms in zip(df.tokens, df.ms)])
    return df


def _map_losses_one(teacher, student, x: torch.Tensor, dtype: torch.dtype) -> dict:
    """Every map loss on (teacher, student), teacher-forced and end to end, once under `dtype` autocast
    and once without: what the losses read (linvit.losses' per-batch views, as the objective builds
    them) and their values; then the autocast objective's backward."""
    from .losses import LOSSES, Objective
    from .losses.objective import _Batch

    terms = [{"loss": n} if spec.forcing != "optional" else {"loss": n, "forced": forced}
             for n, spec in sorted(LOSSES.items()) if "maps" in spec.reads
             for forced in ((True, False) if spec.forcing == "optional" else (None,))]
    objective = Objective(teacher, student, terms)

    def run(enabled: bool):
        with torch.autocast(device_type=x.device.type, dtype=dtype, enabled=enabled):
            batch, values, maps = _Batch(objective, x, False), {}, []
            for term, label, blocks in zip(objective.terms, objective.labels, objective.blocks):
                per_block = []
                for l in blocks:
                    views = batch.views(term, l)
                    maps += [views.teacher_maps, views.student_maps]
                    per_block.append(term.spec(views, **term.options))
                values[label] = torch.stack(per_block).mean()
        return values, maps

    with torch.no_grad():
        reference, _ = run(False)
    student.zero_grad(set_to_none=True)
    values, maps = run(True)
    sum(values.values()).backward()
    grads = [p.grad for p in student.parameters() if p.grad is not None]
    rel = {k: (abs(values[k].item() - reference[k].item()) / max(abs(reference[k].item()), 1e-12))
           for k in values}
    worst = max(rel, key=lambda k: (math.isnan(rel[k]), rel[k]))
    dtypes = sorted({str(m.dtype).removeprefix("torch.") for m in maps})
    row = {"terms": len(values), "maps_dtype": "/".join(dtypes),
           "maps_finite": all(bool(torch.isfinite(m).all()) for m in maps),
           "loss_finite": all(math.isfinite(v.item()) for v in values.values()),
           "max_rel_diff": rel[worst], "worst_term": worst,
           "grads_finite": bool(grads) and all(bool(torch.isfinite(g).all()) for g in grads)}
    row["ok"] = row["maps_dtype"] == "float32" and row["maps_finite"] and row["loss_finite"] and row["grads_finite"]
    return row


def map_losses_all(variants, rt: Runtime, *, size: str, img_size: int, in_chans: int, num_classes: int,
                   batch: int = 2, seed: int = 0, precisions=None):
    """Every map loss (a registered loss that reads "maps") under bf16 and fp16 autocast on rt's device:
    one row per (precision, operator), the softmax teacher and a student of the operator built at
    `size`, seeded random images. Whether every map the losses read is float32 and finite (they are
    computed with autocast off by linvit.attention.attention_maps), whether the losses and the student's
    gradients are finite, and the largest relative difference of a loss from its value without
    autocast (upstream activations differ by the autocast's rounding). `precisions` defaults to bf16
    and fp16 on CUDA, bf16 only on the CPU (fp16 autocast is a GPU path)."""
    import pandas as pd

    from .models import build_vit

    if precisions is None:
        precisions = ("bf16", "fp16") if rt.cuda else ("bf16",)
    dtypes = {"bf16": torch.bfloat16, "fp16": torch.float16}
    x = torch.randn(batch, in_chans, img_size, img_size, generator=torch.Generator().manual_seed(seed)).to(rt.device)
    rows = []
    for precision in precisions:
        for v in variants:
            row = {"precision": precision, "variant": v, "terms": 0, "maps_dtype": "", "maps_finite": False,
                   "loss_finite": False, "max_rel_diff": math.nan, "worst_term": "", "grads_finite": False,
                   "ok": False, "error": ""}

            def check(precision=precision, v=v):
                if precision == "bf16" and rt.cuda and not torch.cuda.is_bf16_supported():
                    raise RuntimeError("bf16 is not supported on this GPU")
                models = []
                for i, variant in enumerate((SOFTMAX, v)):  # the student seeded apart from the teacher
                    torch.manual_seed(seed + i)
                    models.append(build_vit(size, num_classes=num_classes, img_size=img_size, in_chans=in_chans,
                                            variant=variant).to(rt.device).train())
                return _map_losses_one(*models, x, dtypes[precision])

            rows.append(_run_row(rt, row, check, f"maps {precision} {v:>10}",
                                 lambda r: (f"maps {r['maps_dtype']}, finite {r['maps_finite']}, "
                                            f"loss rel diff {r['max_rel_diff']:.2g}")))
    return pd.DataFrame(rows)


def data_parallel(rt: Runtime):
    """The 2-rank data-parallel check (linvit.dpcheck) as rows (check, result, ok), on NCCL where two
    GPUs exist; otherwise one row saying why it was skipped (ok empty)."""
    import os

    import pandas as pd

    from . import dpcheck

    count = torch.cuda.device_count() if rt.cuda else 0
    if count < 2:
        why = (f"this machine shows {count} CUDA device(s) (CUDA_VISIBLE_DEVICES "
               f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})" if rt.cuda else "not on CUDA; "
               "tests/test_distributed.py runs it on the CPU with gloo")
        return pd.DataFrame([{"check": "data parallel, 2 ranks", "result": f"skipped: needs 2 GPUs; {why}",
                              "ok": ""}])
    precisions = [p for p in dpcheck.PRECISIONS if p != "bf16" or torch.cuda.is_bf16_supported()]
    try:
        r = dpcheck.check("cuda", precisions=precisions)
    except Exception as err:  # noqa: BLE001 - a rank's failure is this check's row, not the end of the run
        return pd.DataFrame([{"check": "data parallel, 2 ranks", "result": _one_line(err), "ok": False}])
    rows = [("processes", f"{r['ranks']} x {r['backend']} (cuda:0, cuda:1), {r['steps']} steps of batch "
                          f"{r['batch']}", True)]
    for p in r["parity"]:
        rows.append((f"{r['ranks']} ranks x B/{r['ranks']} against 1 x B, {p['precision']}",
                     f"gradients {p['grad_rel_diff']:.2g}, losses {p['loss_rel_diff']:.2g} relative (tolerance "
                     f"{p['tolerance']:g}, {p['steps_compared']} steps); parameters across ranks differ by "
                     f"{p['param_max_diff_across_ranks']:.3g}", p["ok"]))
    rows += [("parameters equal across ranks (dropout)", f"max difference {r['param_max_diff']:.3g}", r["params_equal"]),
            ("dropout masks differ between ranks", f"{r['mask_fraction_differing']:.0%} of the entries differ",
             r["masks_differ"]),
            ("rank 0's masks are one process's", str(r["rank0_masks_are_one_process"]),
             r["rank0_masks_are_one_process"])]
    return pd.DataFrame([{"check": c, "result": v, "ok": ok} for c, v, ok in rows])


def _table(df) -> str:
    try:
        import tabulate  # noqa: F401 - pandas' to_markdown needs it

        return df.to_markdown(index=False)
    except ImportError:
        return df.to_string(index=False)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a whole number from 1")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is not a whole number from 0")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m linvit.gpucheck",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto",
                   help="auto (default: CUDA when available, else CPU), cpu, cuda or cuda:N")
    p.add_argument("--precision", default="auto", help="training autocast: auto (default: bf16 on CUDA, fp32 "
                                                       "on CPU), bf16, fp16 (with a GradScaler) or fp32")
    p.add_argument("--size", default="deit_tiny", help=f"model size (default: deit_tiny): {', '.join(SIZES)}")
    p.add_argument("--steps", type=_positive, default=10, help="timed training steps per operator (default: 10)")
    p.add_argument("--warmup", type=_non_negative, default=3, help="untimed training steps first (default: 3)")
    p.add_argument("--batch", type=_positive, default=64, help="training batch (default: 64)")
    p.add_argument("--img-size", type=_positive, default=None,
                   help="training image side (default: the size's own, 224 for deit_*)")
    p.add_argument("--variants", nargs="+", default=None, help="operators (default: every registered one)")
    p.add_argument("--tokens", nargs="+", type=_positive, default=list(DEFAULT_TOKENS),
                   help="square token counts of the operator benchmark (default: 256 1024 4096 16384)")
    p.add_argument("--out", default="results/gpucheck", help="folder of the two CSVs (default: results/gpucheck)")
    return p


def main(argv=None) -> int:
    from pathlib import Path

    args = build_parser().parse_args(argv)
    try:
        # Every option is checked before any compute, so a mistake costs no GPU time.
        rt = runtime({"runtime": {"precision": args.precision}}, device=args.device)
        size_spec(args.size)
        variants = list(dict.fromkeys(args.variants or available_variants()))
        for v in variants:
            attention_class(v)
        for n in args.tokens:
            if math.isqrt(n) ** 2 != n:
                raise ValueError(f"--tokens: benchmark token counts must be square patch grids; {n} is not")
    except ValueError as err:
        print(f"gpucheck: {str(err).strip().splitlines()[0]}", file=sys.stderr)
        return 2
    inputs = INPUTS[args.size]
    img_size = args.img_size or inputs["img_size"]
    print(f"gpucheck: {device_name(rt)} ({rt.device}), training in {rt.precision}, torch {torch.__version__}",
          file=sys.stderr, flush=True)

    train = train_all(variants, rt, size=args.size, img_size=img_size, in_chans=inputs["in_chans"],
                      num_classes=inputs["num_classes"], batch=args.batch, steps=args.steps, warmup=args.warmup)
    attention = benchmark_all(variants, rt, args.tokens, size=args.size)
    maps = map_losses_all(variants, rt, size=args.size, img_size=img_size, in_chans=inputs["in_chans"],
                          num_classes=inputs["num_classes"])
    parallel = data_parallel(rt)

    out, slug = Path(args.out), device_slug(rt)
    paths = out / f"train_{slug}.csv", out / f"attention_{slug}.csv", out / f"maps_{slug}.csv"
    for df, path in zip((train, attention, maps), paths):
        with atomic_path(path) as tmp:
            df.to_csv(tmp, index=False)

    shown = ["variant", "images_per_s", "step_ms", "peak_mem_mib", "first_loss", "last_loss", "losses_finite",
             "error"]
    print(f"training: {args.size}, {img_size} px, batch {args.batch}, {rt.precision}, {args.steps} timed steps "
          f"after {args.warmup}, on {device_name(rt)}; peak_mem_mib is {train.peak_mem_kind.iloc[0]}")
    print(_table(train[shown].round({"images_per_s": 1, "step_ms": 2, "peak_mem_mib": 0, "first_loss": 4,
                                     "last_loss": 4})))
    print(f"\nattention core forward+backward ms (fp32 eager, batch {attention.batch.iloc[0]}, "
          f"{attention.heads.iloc[0]} heads of {attention.head_dim.iloc[0]}), speedup over softmax at the same tokens:")
    ms = attention.pivot(index="variant", columns="tokens", values="ms").loc[attention.variant.unique()]
    speed = attention.pivot(index="variant", columns="tokens", values="speedup_vs_softmax").loc[ms.index]
    table = ms.map(lambda x: f"{x:.4g}" if x < 1e4 else f"{x:.0f}") + speed.map(lambda x: f" ({x:.2g}x)")
    table.columns = [f"N={n}" for n in table.columns]
    print(_table(table.reset_index()))
    failed = attention[attention.error != ""]
    for row in failed.itertuples():
        print(f"attention {row.variant} N={row.tokens}: {row.error}")
    print(f"\nmap losses under autocast ({', '.join(maps.precision.unique())}"
          f"{'' if rt.cuda else '; fp16 skipped on the CPU'}): maps the losses read, want float32 and finite")
    print(_table(maps[["precision", "variant", "terms", "maps_dtype", "maps_finite", "loss_finite", "max_rel_diff",
                       "worst_term", "grads_finite", "ok", "error"]]))
    print("\ndata parallelism (2 ranks, linvit.dpcheck):")
    print(_table(parallel))
    print("\n" + "\n".join(f"wrote {p}" for p in paths))
    bad = (train.error != "").any() or not train.losses_finite.all() or len(failed) or not maps.ok.all()
    bad = bad or any(ok is False for ok in parallel.ok)  # "" (skipped) is not a failure
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
