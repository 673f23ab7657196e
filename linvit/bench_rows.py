"""What every `linvit bench` benchmark shares, below both linvit.bench and linvit.bench_ranks: the
columns of a row, a row, and the progress line on stderr.

Its own module so that linvit.bench (which runs linvit.bench_ranks for `bench loader --ranks` and
`bench shards`) and linvit.bench_ranks import it from below instead of each other.
"""

from __future__ import annotations

import sys

COLUMNS = ["benchmark", "metric", "value", "unit", "target", "meets", "machine"]


def say(text: str) -> None:
    print(f"bench: {text}", file=sys.stderr, flush=True)


def row(benchmark: str, metric: str, value: float, unit: str, target: str = "", meets: bool | None = None) -> dict:
    return {"benchmark": benchmark, "metric": metric, "value": value, "unit": unit, "target": target,
            "meets": "" if meets is None else bool(meets)}
