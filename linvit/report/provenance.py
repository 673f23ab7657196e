"""Provenance of a report: the grid's config, package versions, git revision, machine and total compute.

Everything here is read, never required: outside a git checkout, without a GPU or a package, the
field says "unknown" or "none" and the report is still written. Nothing time-dependent is recorded,
so regenerating a report from the same results/ gives the same text.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
from pathlib import Path

import pandas as pd
import yaml

from ..io import cpu_info

PACKAGES = ("torch", "timm", "snakemake", "pandas", "numpy", "webdataset", "linvit")
# A distillation serves every budget of its cell: its seconds are counted once per these keys.
DISTILL_KEYS = ["dataset", "size", "variant", "init", "design", "seed"]
UNKNOWN = "unknown"


def collect(config: dict, runs: pd.DataFrame) -> dict:
    """The provenance record: {"config", "versions", "git", "machine", "compute"}."""
    return {"config": config, "versions": versions(), "git": git_state(), "machine": machine(runs),
            "compute": compute(runs)}


def versions() -> dict[str, str]:
    """python and each of PACKAGES' installed version ("not installed" when absent)."""
    out = {"python": platform.python_version()}
    for name in PACKAGES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def git_state(where: str | Path | None = None) -> dict[str, str]:
    """{"revision": commit or "unknown", "dirty": "yes" | "no" | "unknown"} of the checkout holding
    `where` (default: this package's source); "unknown" outside a checkout or without git."""
    cwd = Path(where) if where is not None else Path(__file__).resolve().parent
    revision = _git(["rev-parse", "HEAD"], cwd)
    if revision is None:
        return {"revision": UNKNOWN, "dirty": UNKNOWN}
    status = _git(["status", "--porcelain", "--untracked-files=no"], cwd)
    return {"revision": revision, "dirty": UNKNOWN if status is None else ("yes" if status else "no")}


def _git(args: list[str], cwd: Path) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10, cwd=cwd)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def machine(runs: pd.DataFrame | None = None) -> dict[str, str]:
    """The machine writing the report (CPU model, cores, GPU name or "none") and the devices the runs
    measured their throughput on (eval.json's `throughput_device`, as runs.csv holds it)."""
    gpu = "none"
    try:
        import torch

        if torch.cuda.is_available():
            gpu = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
    except Exception as err:  # a broken CUDA install must not stop the report
        gpu = f"{UNKNOWN} ({type(err).__name__})"
    devices = UNKNOWN
    if runs is not None and "throughput_device" in runs:
        found = sorted(str(d) for d in runs["throughput_device"].dropna().unique())
        devices = ", ".join(found) if found else UNKNOWN
    return {"cpu": cpu_model(), "cpu generation": cpu_generation() or UNKNOWN, "cpu kernels": cpu_kernels(),
            "cores": str(os.cpu_count() or UNKNOWN), "gpu": gpu, "platform": platform.platform(terse=True),
            "run devices": devices}


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo on Linux, else platform.processor())."""
    return cpu_info("model name") or platform.processor() or UNKNOWN


def cpu_generation() -> str:
    """The x86 CPU's family and model numbers ("family 25 model 17"; "" where /proc/cpuinfo has none).
    Why: virtual machines report a bare model name ("AMD EPYC") and the same instruction set for CPU
    generations of different speed; two AVX-512 machines of this project so named ran oneDNN's
    float32 products at 135-200 and at 95 GFLOP/s on one thread (AVX-512 on 256-bit units)."""
    family, model = cpu_info("cpu family"), cpu_info("model")
    return f"family {family} model {model}" if family and model else ""


def cpu_kernels() -> str:
    """The vector instruction set torch's CPU kernels use here ("AVX512", "AVX2", ...). Why: virtual
    machines report a bare model name ("AMD EPYC") for CPUs of different generations; on two such
    machines of this project, one with AVX-512 and one without, softmax's attention module took
    413 and 1,012 ms at 4,096 tokens on two threads."""
    try:
        import torch

        return torch.backends.cpu.get_cpu_capability()
    except Exception:  # noqa: BLE001 - no torch: the report still writes
        return UNKNOWN


def compute(runs: pd.DataFrame) -> dict[str, float | int]:
    """Total compute of the finished runs, from runs.csv: training seconds summed over runs, distillation
    seconds summed over distillations (one per cell and seed, shared by its budgets, so counted once),
    and the number of each."""
    ok = runs[runs["status"] == "ok"] if "status" in runs else runs
    train = pd.to_numeric(ok.get("train_time_s", pd.Series(dtype=float)), errors="coerce")
    distill_rows = ok
    if "distill_time_s" in ok:
        # runs.csv has 0 for a run without distillation: only positive times are distillations.
        distill_rows = ok[pd.to_numeric(ok["distill_time_s"], errors="coerce") > 0]
        keys = [k for k in DISTILL_KEYS if k in distill_rows]
        distill_rows = distill_rows.drop_duplicates(subset=keys) if keys else distill_rows
        distill = pd.to_numeric(distill_rows["distill_time_s"], errors="coerce")
    else:
        distill_rows, distill = ok.iloc[:0], pd.Series(dtype=float)
    return {"training runs": int(train.notna().sum()), "train seconds": float(train.sum()),
            "distillations": int(len(distill_rows)), "distill seconds": float(distill.sum()),
            "total seconds": float(train.sum() + distill.sum())}


def config_yaml(config: dict) -> str:
    return yaml.safe_dump(config, sort_keys=False, default_flow_style=False)


def markdown(record: dict) -> str:
    """The report's Provenance section (Markdown; the HTML report converts the same text)."""
    v, g, m, c = record["versions"], record["git"], record["machine"], record["compute"]
    hours = c["total seconds"] / 3600
    lines = [
        "- Git revision: `" + g["revision"] + "`" + {"yes": " (working tree had uncommitted changes)",
                                                      "no": " (clean working tree)"}.get(g["dirty"], " (dirty: unknown)"),
        "- Versions: " + ", ".join(f"{name} {version}" for name, version in v.items()),
        f"- Machine writing this report: {m['cpu']} ({m['cpu generation']}, {m['cpu kernels']} kernels), {m['cores']} cores, GPU: {m['gpu']} ({m['platform']}); "
        f"devices the runs were measured on: {m['run devices']}",
        f"- Total compute: {c['total seconds']:.1f} s ({hours:.2f} h) = training {c['train seconds']:.1f} s over "
        f"{c['training runs']} runs + distillation {c['distill seconds']:.1f} s over {c['distillations']} "
        "distillations (`train_time_s`, `distill_time_s` of runs.csv; each distillation counted once, the "
        "teacher's pretraining not included); jobs: " + str(c["training runs"] + c["distillations"]),
    ]
    # markdown="1": python-markdown (md_in_html) converts the fenced block inside; GitHub drops the attribute.
    return ("\n".join(lines) + "\n\n<details markdown=\"1\"><summary>The grid's config (YAML)</summary>\n\n```yaml\n"
            + config_yaml(record["config"]) + "```\n\n</details>")
