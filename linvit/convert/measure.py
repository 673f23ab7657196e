"""What a conversion measures, in evaluate/metrics.json: accuracy on the target's test split of the
exported checkpoint (loaded back through timm) and of its baseline (the teacher, or the softmax
reference where the labels differ); latency and peak forward memory of both at the model's resolution
and at twice its side. On the CPU the memory is measured in a child process (`memory_child`)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .export import CALL_KEYS, load_converted


def device_name(rt) -> str:
    import platform

    import torch

    from ..io import cpu_info

    if rt.cuda:
        return f"{rt.device} ({torch.cuda.get_device_name(rt.device)})"
    cpu = cpu_info("model name") or platform.processor() or platform.machine()
    return f"cpu ({cpu}, {torch.get_num_threads()} torch threads)"


def evaluate(spec, info, shards: Path, teacher_dir: Path, teacher_arch: dict, same_labels: bool,
             reference_dir: Path, call: dict, rt, eval_dir: Path, *, batch: int, seconds: float) -> dict:
    """Accuracy (fp32, on the runtime's device) of the exported checkpoint loaded through timm and of
    the teacher (adapted to the dataset's geometry) or the softmax reference, on the test split read
    exactly as the steps read it; then latency and peak memory of both."""
    from .. import inputs
    from ..data.loader import ShardSet
    from ..evaluate import accuracy, parameter_counts
    from ..io import write_json
    from ..steps import load_model
    from ..teachers import adapt, describe

    data = ShardSet(shards, pipeline=inputs.pipeline(spec, teacher_arch, info))
    converted = load_converted(call).to(rt.device)
    fp32 = _fp32(rt)
    result = {"converted": {**accuracy(converted, data, runtime=fp32), **parameter_counts(converted)}}
    if same_labels:
        base, base_arch = load_model(teacher_dir, what="teacher")
        base, base_arch = adapt(base, base_arch, img_size=tuple(data.input_size), num_classes=data.num_classes)
        role = "teacher"
        note = "the teacher itself (the dataset shares its labels)"
    else:
        base, base_arch = load_model(reference_dir, what="softmax reference")
        role = "reference"
        note = ("the softmax reference: the teacher trained on the target with the student's budget (the "
                "dataset has its own labels, so the teacher's head does not apply to it)")
    base = base.eval().to(rt.device)
    result["baseline"] = {"role": role, "note": note, **accuracy(base, data, runtime=fp32),
                          **parameter_counts(base)}
    size = tuple(data.input_size)
    example = {"channels": data.channels, "size": list(size)}
    converted_arch = describe(converted, timm_model=call["model_name"], model_args={
        k: v for k, v in call["kwargs"].items() if k not in CALL_KEYS})
    bench = _benchmark({"baseline": (base, base_arch), "converted": (converted, converted_arch)}, example, rt,
                       batch=batch, seconds=seconds)
    metrics = {"test_samples": data.num_samples("test"), "accuracy_precision": "fp32", "bench_seconds": float(seconds),
               "pipeline": "the whole image, normalized by the shards' statistics" if data.pipeline is None
               else "timm's evaluation transform (resize, center crop, normalize)",
               **result, **bench}
    write_json(eval_dir / "metrics.json", metrics)
    return metrics


def _fp32(rt):
    from dataclasses import replace

    return replace(rt, precision="fp32")


def _larger(model, arch: dict, side: tuple[int, int]):
    """(the model at twice the side, a note): position embeddings resampled by timm's
    resample_abs_pos_embed (linvit.teachers.adapt). An operator whose own parameters are shaped by
    the patch grid is rebuilt at the new grid with fresh weights (timing and memory do not depend on
    the values), and the note says so; (None, why) when it cannot be built at all."""
    from ..models import model_variant
    from ..teachers import adapt, build_model

    try:
        bigger, _ = adapt(model.cpu(), arch, img_size=side)
        return bigger.eval(), "position embeddings resampled"
    except (ValueError, RuntimeError) as err:
        import re

        found = re.search(r"size mismatch for ([\w.]+)", str(err))
        detail = (f"{found.group(1)} is shaped by the patch grid" if found
                  else (str(err).strip().splitlines() or [type(err).__name__])[0][:120])
    try:
        fresh = build_model(arch, variant=model_variant(model), num_classes=model.num_classes, img_size=side,
                            in_chans=model.patch_embed.proj.in_channels)
    except (ValueError, RuntimeError) as err:
        return None, f"cannot be built at {side[0]}x{side[1]}: {str(err).strip().splitlines()[0]}"
    return fresh.eval(), f"weights do not carry over ({detail}): timed with fresh weights"


def _benchmark(models: dict, example: dict, rt, *, batch: int, seconds: float) -> dict:
    """Latency (ms per image at batch 1 and `batch`) and peak forward memory of each model
    ({name: (model, arch)}) at its resolution and at twice the side (4x the patch tokens), under the
    runtime's precision on its device."""
    h, w = example["size"]
    c = example["channels"]
    sides = {"native": (h, w), "4x_tokens": (2 * h, 2 * w)}
    batches = sorted({1, int(batch)})
    rows, probes = [], []
    for name, (model, arch) in models.items():
        for res, side in sides.items():
            m, why = (model, None) if res == "native" else _larger(model, arch, side)
            if m is not None:
                m = m.to(rt.device).eval()
                probes.append({"arch": arch, "img_size": list(side), "shapes": [[b, c, *side] for b in batches],
                               "rows": list(range(len(rows), len(rows) + len(batches)))})
            for b in batches:
                p = _patch(model)
                row = {"model": name, "resolution": res, "image_size": list(side),
                       "tokens": (side[0] // p) * (side[1] // p), "batch": b}
                if m is None:
                    row["skipped"] = why
                else:
                    if why:
                        row["note"] = why
                    row["ms_per_image"] = _latency(m, (b, c, *side), rt, seconds)
                    if rt.cuda:
                        row["peak_mib"] = _cuda_peak(m, (b, c, *side), rt)
                rows.append(row)
            if m is not None and m is not model:
                del m
    if rt.cuda:
        method = ("torch.cuda.max_memory_allocated during one forward (after reset_peak_memory_stats), minus the "
                  "memory allocated before it (the weights and the input batch): the forward's own peak")
    else:
        method, peaks = _cpu_peaks(probes, rt)
        for probe, values in zip(probes, peaks):
            for i, value in zip(probe["rows"], values):
                rows[i]["peak_mib"] = value
    return {"device": device_name(rt), "precision": rt.precision, "bench_batch": int(batch),
            "memory_method": method, "speed": rows}


def _patch(model) -> int:
    return int(model.patch_embed.patch_size[0])


def _latency(model, shape, rt, seconds: float) -> float:
    """Milliseconds per image of a forward at `shape` (batch first), from the harness's own
    throughput measurement (linvit.evaluate.throughput: warm-up, then at least `seconds` of runs)."""
    import torch

    from ..evaluate import throughput

    example = torch.randn(1, *shape[1:])
    return round(1e3 / throughput(model, example, batch_size=shape[0], seconds=seconds, runtime=rt), 4)


def _cuda_peak(model, shape, rt) -> float:
    import torch

    x = torch.randn(*shape, device=rt.device)
    torch.cuda.synchronize(rt.device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(rt.device)
    before = torch.cuda.memory_allocated(rt.device)
    with torch.no_grad(), rt.autocast():
        model(x)
    torch.cuda.synchronize(rt.device)
    return round((torch.cuda.max_memory_allocated(rt.device) - before) / 2**20, 3)


_CPU_METHOD = ("measured in a separate process: each model rebuilt there at the resolution (same architecture, "
               "random weights: activations do not depend on their values) and run once as a warm-up; then "
               "for each batch the input built, freed heap returned to the OS (glibc malloc_trim), the peak "
               "resident size reset (/proc/self/clear_refs), one forward, and VmHWM after it minus VmRSS "
               "before it: the forward's own peak, weights and input excluded")


def _cpu_peaks(probes: list, rt) -> tuple[str, list]:
    """Peak forward memory on the CPU of each probe ({arch, img_size, shapes}), in MiB, measured in
    a child process (see _CPU_METHOD)."""
    import subprocess

    import torch

    if not probes:
        return _CPU_METHOD, []
    jobs = [{k: p[k] for k in ("arch", "img_size", "shapes")} for p in probes]
    proc = subprocess.run([sys.executable, "-c", "from linvit.convert.measure import memory_child; memory_child()"],
                          input=json.dumps({"threads": torch.get_num_threads(), "precision": rt.precision,
                                            "jobs": jobs}),
                          capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return f"not measured: the measuring process failed ({last})", [[None] * len(p["shapes"]) for p in probes]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    return result["method"], result["peaks"]


def _status_kib(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise OSError(f"/proc/self/status has no {key}")


def memory_child() -> None:
    """The child of _cpu_peaks: reads the jobs as JSON on stdin, prints the peaks as JSON."""
    import ctypes
    import gc

    request = json.loads(sys.stdin.read())
    import torch

    import linvit.models  # noqa: F401
    from linvit.device import cpu_runtime
    from linvit.teachers import build_model

    torch.set_num_threads(request["threads"])
    autocast = cpu_runtime().autocast if request.get("precision", "fp32") == "fp32" else \
        (lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    try:
        trim = ctypes.CDLL("libc.so.6").malloc_trim
    except (OSError, AttributeError):
        trim = None
    try:
        Path("/proc/self/clear_refs").write_text("5")
        _status_kib("VmHWM")
    except OSError as err:
        print(json.dumps({"method": f"not measured: the peak resident size cannot be reset here ({err})",
                          "peaks": [[None] * len(j["shapes"]) for j in request["jobs"]]}))
        return
    method = _CPU_METHOD + ("" if trim else " (malloc_trim unavailable: freed heap may be reused, "
                                            "an underestimate)")
    peaks = []
    for job in request["jobs"]:
        model = build_model(job["arch"], img_size=job["img_size"]).eval()
        values = []
        with torch.no_grad(), autocast():
            model(torch.randn(1, *job["shapes"][0][1:]))
            for shape in job["shapes"]:
                x = torch.randn(*shape)
                gc.collect()
                if trim:
                    trim(0)
                before = _status_kib("VmRSS")
                Path("/proc/self/clear_refs").write_text("5")
                model(x)
                values.append(round((_status_kib("VmHWM") - before) / 1024, 3))
                del x
        peaks.append(values)
        del model
    print(json.dumps({"method": method, "peaks": peaks}))


