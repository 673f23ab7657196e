"""What a finished or failed job leaves beside its outputs, read without pandas or torch: its Snakemake
benchmark TSV and its log's error line. The report (linvit.report.aggregate) and `linvit status` (which
reads thousands of them on a paper-scale grid) both read them here."""

from __future__ import annotations

import csv
import math
from pathlib import Path


def _number(text: str | None) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):  # 'NA', '-', empty, missing
        return math.nan


def read_benchmark(path: str | Path) -> dict:
    """Snakemake's benchmark TSV (s, h:m:s, max_rss, ..., cpu_time; one row per repeat): mean seconds and
    cpu seconds over repeats, the highest max_rss. 'NA' or '-' values read as NaN; `problem` names a file
    that cannot be read."""
    path = Path(path)
    empty = {"wall_s": math.nan, "max_rss_mb": math.nan, "cpu_time_s": math.nan, "problem": ""}
    try:
        with path.open(newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f, delimiter="\t"))
    except FileNotFoundError:
        return empty
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        return {**empty, "problem": f"{path}: cannot be read ({str(err).strip().splitlines()[0]})"}
    if not rows:
        return {**empty, "problem": f"{path}: cannot be read (No columns to parse from file)"}
    header, body = rows[0], [r for r in rows[1:] if r]
    if "s" not in header:
        return {**empty, "problem": f"{path}: no 's' column (expected Snakemake's benchmark header)"}
    if not body:
        return {**empty, "problem": f"{path}: no rows"}

    def column(name: str) -> list[float]:
        if name not in header:
            return [math.nan]
        i = header.index(name)
        return [_number(r[i] if i < len(r) else None) for r in body]

    def mean(values: list[float]) -> float:
        known = [v for v in values if not math.isnan(v)]
        return sum(known) / len(known) if known else math.nan

    rss = [v for v in column("max_rss") if not math.isnan(v)]
    return {"wall_s": mean(column("s")), "max_rss_mb": max(rss) if rss else math.nan,
            "cpu_time_s": mean(column("cpu_time")), "problem": ""}


def log_line(log: str | Path) -> tuple[str, str]:
    """("diverged", its last line mentioning that), else ("missing", the last line mentioning an error or "")."""
    log = Path(log)
    if not log.exists():
        return "missing", ""
    try:
        lines = log.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as err:
        return "missing", f"{log} cannot be read ({err.strerror})"
    diverged = [line.strip() for line in lines if "diverged" in line.lower()]
    if diverged:
        return "diverged", diverged[-1]
    errors = [line.strip() for line in lines if "error" in line.lower()]
    return "missing", errors[-1] if errors else ""
