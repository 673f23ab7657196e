"""Read every expected cell's result files into two tidy tables: one row per run, one row per evaluation.

The list of expected cells comes from `linvit.grid`, so a cell that failed or never ran still gets a
row (status "missing", with the reason taken from its log) instead of silently vanishing from the
report. Files that exist but do not match the contract raise `ResultsError` naming the file, the
line where there is one, and the key.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from linvit.grid import Cell, all_cells
from linvit.groups import GROUPS  # a group a run reports beyond these still gets a column
from linvit.io import atomic_path

ID_COLUMNS = ["dataset", "size", "variant", "init", "seed"]
RUN_COLUMNS = ID_COLUMNS + [
    "status", "reason", "test_acc", "test_samples", "steps", "train_time_s", "images_seen",
    "distill_steps", "distill_time_s", "distill_loss", "distill_final_loss", "total_time_s",
    "params", "params_attn_extra", "throughput_img_s", "fidelity_kl_mean",
]
CURVE_COLUMNS = ID_COLUMNS + ["step", "epoch", "test_acc", "elapsed_s"]
CONFIG_KEYS = ("targets", "sizes", "variants", "inits", "seeds")


class ResultsError(ValueError):
    """A result file (or the config) does not match the contract; the message names the file and key."""


def collect(config: dict, results: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """One row per expected cell (runs) and one row per evaluation line of every train.jsonl (curves)."""
    for key in CONFIG_KEYS:
        if key not in config:
            raise ResultsError(f"config: missing key '{key}'")
    results = Path(results)
    rows, curve_rows = [], []
    for cell in all_cells(config):
        rows.append(_run_row(cell, results))
        curve_rows.extend(_curve_rows(cell, results))
    return _runs_frame(rows), pd.DataFrame(curve_rows, columns=CURVE_COLUMNS)


def write_tables(runs: pd.DataFrame, curves: pd.DataFrame, results: str | Path) -> list[Path]:
    """Write results/runs.csv and results/curves.csv, each atomically."""
    paths = [Path(results) / "runs.csv", Path(results) / "curves.csv"]
    for frame, path in zip((runs, curves), paths):
        write_csv(frame, path)
    return paths


# Outputs go through linvit.io.atomic_path (temp file beside the target, then rename), so an interrupted
# report never leaves a table that looks complete.
def write_csv(frame: pd.DataFrame, path: Path) -> None:
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=False)


def write_text(path: str | Path, text: str) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")
    return Path(path)


# ---------------------------------------------------------------------------------------------
# One cell


def _run_row(cell: Cell, results: Path) -> dict:
    row: dict = {**cell.as_dict(), "status": "ok", "reason": ""}
    run_dir = cell.run_dir(results)
    metrics_path, eval_path = run_dir / "metrics.json", run_dir / "eval.json"
    metrics = _read_json(metrics_path, cell) if metrics_path.exists() else None
    evaluation = _read_json(eval_path, cell) if eval_path.exists() else None
    if metrics is not None:
        row.update(_metrics_fields(metrics, metrics_path))
    if evaluation is not None:
        row.update(_eval_fields(evaluation, eval_path))
    # Values that were read are kept even for a missing cell (they can explain the failure);
    # only status "ok" rows enter the statistics and verdicts.
    if metrics is None:
        row.update(status="missing", reason=missing_reason(cell, results))
    elif evaluation is None:
        row.update(status="missing", reason=f"not evaluated (no {eval_path})")
    return row


def missing_reason(cell: Cell, results: Path) -> str:
    """The last line of the cell's log that mentions an error; else say whether a log exists."""
    log = cell.log_path(results)
    if not log.exists():
        return "not run (no log)"
    lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    errors = [line.strip() for line in lines if "error" in line.lower()]
    return errors[-1] if errors else f"failed (see {log})"


def _read_json(path: Path, cell: Cell) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ResultsError(f"{path}: not valid JSON (line {err.lineno}: {err.msg})") from None
    if not isinstance(data, dict):
        raise ResultsError(f"{path}: expected a JSON object, got {type(data).__name__}")
    # A file copied into the wrong directory would silently corrupt every comparison.
    for key, expected in cell.as_dict().items():
        if key in data and str(data[key]) != str(expected):
            raise ResultsError(f"{path}: '{key}' is {data[key]!r} but the file lies in cell {cell.key}")
    return data


def _metrics_fields(m: dict, path: Path) -> dict:
    acc = _number(m, "test_acc", path)
    if not 0.0 <= acc <= 1.0:
        raise ResultsError(f"{path}: 'test_acc' is {acc}, expected a fraction in 0..1")
    train_time = _number(m, "train_time_s", path)
    fields = {
        "test_acc": acc,
        "test_samples": _count(m, "test_samples", path),
        "steps": _count(m, "steps", path),
        "train_time_s": train_time,
        "images_seen": _count(m, "images_seen", path),
    }
    # distill is null (or absent) when the strategy has no distillation stage: it then costs nothing.
    distill = m.get("distill")
    if distill is None:
        fields.update(distill_steps=0, distill_time_s=0.0, distill_loss=None, distill_final_loss=math.nan)
    elif isinstance(distill, dict):
        where = f"{path} 'distill'"
        fields.update(distill_steps=_count(distill, "steps", where),
                      distill_time_s=_number(distill, "time_s", where),
                      distill_loss=str(distill.get("loss", "")) or None,
                      distill_final_loss=_number(distill, "final_loss", where, required=False))
    else:
        raise ResultsError(f"{path}: 'distill' must be null or an object, got {type(distill).__name__}")
    fields["total_time_s"] = train_time + fields["distill_time_s"]
    copied = m.get("copied", {})
    if not isinstance(copied, dict):
        raise ResultsError(f"{path}: 'copied' must be an object of group -> parameter count")
    for group in dict.fromkeys([*GROUPS, *copied]):
        fields[f"copied_{group}"] = _count(copied, group, f"{path} 'copied'", required=False)
    return fields


def _eval_fields(e: dict, path: Path) -> dict:
    fields = {key: _count(e, key, path) for key in ("params", "params_attn_extra")}
    fields.update({key: _number(e, key, path) for key in ("throughput_img_s", "fidelity_kl_mean")})
    per_layer = e.get("fidelity_kl")
    if not isinstance(per_layer, list):
        raise ResultsError(f"{path}: missing key 'fidelity_kl' (a list with one float per layer)")
    for layer, value in enumerate(per_layer):
        fields[f"fidelity_kl_l{layer}"] = _as_float(value, f"{path}: 'fidelity_kl[{layer}]'")
    return fields


def _number(d: dict, key: str, where, required: bool = True) -> float:
    if key not in d or d[key] is None:
        if required:
            raise ResultsError(f"{where}: missing key '{key}'")
        return math.nan
    return _as_float(d[key], f"{where}: '{key}'")


def _count(d: dict, key: str, where, required: bool = True) -> float:
    """A whole number (steps, samples, parameters): kept as float here, stored as a nullable integer column."""
    value = _number(d, key, where, required)
    if not (math.isnan(value) or value.is_integer()):
        raise ResultsError(f"{where}: '{key}' is {value}, expected a whole number")
    return value


def _as_float(value, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ResultsError(f"{what} is {value!r}, expected a number")
    return float(value)


def _curve_rows(cell: Cell, results: Path) -> list[dict]:
    path = cell.run_dir(results) / "train.jsonl"
    if not path.exists():
        return []
    rows = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ResultsError(f"{where}: not valid JSON ({err.msg})") from None
            if not isinstance(record, dict) or "kind" not in record:
                raise ResultsError(f"{where}: expected a JSON object with a 'kind' key")
            if record["kind"] != "eval":
                continue
            rows.append({**cell.as_dict(),
                         **{key: _number(record, key, where) for key in ("step", "epoch", "test_acc", "elapsed_s")}})
    return rows


def _runs_frame(rows: list[dict]) -> pd.DataFrame:
    """Fix the column order: the contract's columns, then per-layer fidelity and copied counts in numeric/group order."""
    seen = dict.fromkeys(key for row in rows for key in row)
    layers = sorted((k for k in seen if k.startswith("fidelity_kl_l")), key=lambda k: int(k.removeprefix("fidelity_kl_l")))
    copied = [f"copied_{g}" for g in GROUPS] + [k for k in seen if k.startswith("copied_") and k.removeprefix("copied_") not in GROUPS]
    frame = pd.DataFrame(rows).reindex(columns=RUN_COLUMNS + layers + copied)
    counts = ["test_samples", "steps", "images_seen", "distill_steps", "params", "params_attn_extra", *copied]
    return frame.astype({"seed": int, **{col: "Int64" for col in counts}})
