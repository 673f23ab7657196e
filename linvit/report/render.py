"""Write the report directory: tables, figures, claim verdicts and README.md, all regenerated from results/.

Only the files named here are written (each atomically); anything else a user keeps in report/ is
left alone.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd

from linvit.grid import Cell
from linvit.report.aggregate import collect, write_csv, write_tables, write_text
from linvit.report.claims import (ClaimVerdict, Thresholds, claims_markdown, cost_table, evaluate_claims, pct,
                                  summarize)
from linvit.report.figures import write_figures


def write_report(config: dict, results: str | Path, report_dir: str | Path) -> list[Path]:
    """Aggregate results/ and write report/{summary.csv,summary.md,claims.json,README.md,figures/*}.

    Returns every path written, including results/runs.csv and results/curves.csv.
    """
    results, report_dir = Path(results), Path(report_dir)
    runs, curves = collect(config, results)
    written = write_tables(runs, curves, results)
    summary = summarize(runs, config)
    verdicts = evaluate_claims(runs, config)
    costs = cost_table(runs, curves, config)

    write_csv(summary, report_dir / "summary.csv")
    written.append(report_dir / "summary.csv")
    written.append(write_text(report_dir / "summary.md", "# Summary over seeds\n\n" + _markdown(display_summary(summary)) + "\n"))
    claims_json = json.dumps([v.as_dict() for v in verdicts], indent=2, default=_json_default)
    written.append(write_text(report_dir / "claims.json", claims_json + "\n"))
    figures = write_figures(runs, curves, config, report_dir / "figures")
    written.extend(figures)
    scaling = _scaling_section(results, report_dir)
    written.extend(scaling[1])
    readme = render_readme(config, runs, summary, verdicts, costs, [f.relative_to(report_dir) for f in figures],
                           scaling[0])
    written.append(write_text(report_dir / "README.md", readme))
    return written


def render_readme(config: dict, runs: pd.DataFrame, summary: pd.DataFrame, verdicts: list[ClaimVerdict],
                  costs: pd.DataFrame, figures: list[Path], scaling: str = "") -> str:
    sections = [
        "# linvit report\n\nRegenerated from `results/` by `linvit.report`; every number below comes from the "
        "runs' own result files. Accuracies are top-1 on each target's test split; std is over seeds.",
        "## Grid covered\n\n" + _grid_section(config, runs),
        "## Summary\n\nGap closed = (acc_init - acc_random) / (acc_softmax_reference - acc_random). "
        "Full table: [summary.csv](summary.csv), [summary.md](summary.md).\n\n"
        + _markdown(display_summary(summary)[["dataset", "size", "variant", "init", "seeds", "test acc", "gap closed"]]),
        "## Figures\n\n" + _figures_section(figures),
        "## Claims\n\n" + _thresholds_line(config) + "\n\n" + claims_markdown(verdicts),
        "## Cost\n\n" + _cost_section(costs),
        "## Missing cells\n\n" + _missing_section(runs),
    ]
    if scaling:
        sections.insert(-1, scaling)
    return "\n\n".join(s.rstrip() for s in sections) + "\n"


def display_summary(summary: pd.DataFrame) -> pd.DataFrame:
    """The summary with readable strings: accuracy in %, std in percentage points, 'n/a' for undefined."""
    out = summary[["dataset", "size", "variant", "init"]].copy()
    out["seeds"] = [f"{r.n_seeds}/{r.n_expected}" for r in summary.itertuples()]
    out["test acc"] = [_acc_text(r.test_acc_mean, r.test_acc_std, r.n_seeds) for r in summary.itertuples()]
    out["gap closed"] = [_num(g, ".3f") for g in summary["gap_closed"]]
    out["steps"] = [_num(s, ".0f") for s in summary["steps_mean"]]
    out["train + distill time (s)"] = [_num(t, ".1f") for t in summary["total_time_s_mean"]]
    out["params"] = [_num(p, ".0f") for p in summary["params_mean"]]
    out["throughput (img/s)"] = [_num(t, ".1f") for t in summary["throughput_img_s_mean"]]
    out["fidelity KL"] = [_num(k, ".4f") for k in summary["fidelity_kl_mean_mean"]]
    return out


def _grid_section(config: dict, runs: pd.DataFrame) -> str:
    strategies = config.get("init_strategies") or {}
    lines = [
        f"- Targets: {', '.join(map(str, config['targets']))}",
        f"- Sizes: {', '.join(map(str, config['sizes']))}",
        f"- Linear variants: {', '.join(map(str, config['variants']))}",
        f"- Seeds: {', '.join(map(str, config['seeds']))}",
        f"- Teacher pretrained on: {(config.get('teacher') or {}).get('dataset', 'not given in the config')}",
        "- Init strategies:",
    ]
    for init in config["inits"]:
        spec = strategies.get(init)
        if spec is None:
            lines.append(f"  - `{init}`: not defined under init_strategies")
        else:
            groups = ", ".join(spec.get("copy") or []) or "nothing"
            description = f" ({spec['description']})" if spec.get("description") else ""
            lines.append(f"  - `{init}`{description}: copies {groups}; "
                         f"{'distills attention' if spec.get('distill') else 'no distillation'}")
    n_ok = int((runs["status"] == "ok").sum())
    lines.append(f"- Cells: {len(runs)} expected (students and softmax references), {n_ok} finished, {len(runs) - n_ok} missing")
    return "\n".join(lines)


def _scaling_section(results: Path, report_dir: Path) -> tuple[str, list[Path]]:
    """The operator benchmark (results/benchmark/attention.csv, from `linvit benchmark`), if it was run."""
    from linvit.benchmark import summarize
    from linvit.report.figures import attention_scaling

    path = results / "benchmark" / "attention.csv"
    if not path.exists():
        return "", []
    bench = pd.read_csv(path)
    figures = attention_scaling(bench, report_dir / "figures")
    tokens = sorted(bench["tokens"].unique())
    high = 4096 if 4096 in tokens else tokens[-1]
    table = (bench.pivot(index="variant", columns="tokens", values="seconds") * 1e3).round(2)
    scope = ", ".join(sorted(bench["scope"].unique())) if "scope" in bench else "module"
    text = ("## Operator scaling\n\nForward + backward milliseconds per operator (scope: " + scope + ") from `"
            + path.as_posix() + "` (one process, operators measured side by side), and per operator the growth from "
            f"{tokens[0]} to {high} tokens, the speedup over softmax (SDPA) at {high}, and the smallest measured "
            "token count from which it beats softmax.\n\n" + _markdown(table.reset_index()) + "\n\n"
            + _markdown(summarize(bench, tokens[0], high).round(2)) + "\n\n"
            + _figures_section([f.relative_to(report_dir) for f in figures]))
    return text, figures


def _figures_section(figures: list[Path]) -> str:
    blocks = []
    for png in (f for f in figures if f.suffix == ".png"):
        name = png.stem.replace("_", " ")
        blocks.append(f"![{name}]({png.as_posix()})\n\n({name}; vector: [{png.with_suffix('.svg').name}]"
                      f"({png.with_suffix('.svg').as_posix()}))")
    return "\n\n".join(blocks)


def _thresholds_line(config: dict) -> str:
    t = Thresholds.from_config(config)
    return (f"Thresholds (config `claims`): negligible = {pct(t.negligible)} of the pretrained benefit, "
            f"most = {pct(t.most)}, match tolerance = {100 * t.match_tolerance:.2f} pp. "
            "A claim is *supported* if it holds in every cell where it can be evaluated.")


def _cost_section(costs: pd.DataFrame) -> str:
    if costs.empty:
        return "No cells to compare."
    table = costs[["dataset", "size", "variant", "init"]].copy()
    table["seeds"] = costs["n_seeds"]
    table["test acc"] = [pct(a) for a in costs["test_acc_mean"]]
    table["train steps"] = [_num(s, ".0f") for s in costs["steps_mean"]]
    table["distill steps"] = [_num(s, ".0f") for s in costs["distill_steps_mean"]]
    table["train time (s)"] = [_num(t, ".1f") for t in costs["train_time_s_mean"]]
    table["distill time (s)"] = [_num(t, ".1f") for t in costs["distill_time_s_mean"]]
    table["total time (s)"] = [_num(t, ".1f") for t in costs["total_time_s_mean"]]
    table["steps to random's final acc"] = [
        _reach_text(s, n, k) for s, n, k in zip(costs["steps_to_random_acc"], costs["seeds_reaching"], costs["n_seeds"])]
    return ("Student compute per cell (means over finished seeds); the teacher's pretraining is shared by every "
            "student and not counted. The last column is the first evaluated training step at which a run "
            "reaches the final accuracy of the random-init run with the same seed.\n\n" + _markdown(table))


def _reach_text(step: float, reaching: float, seeds: int) -> str:
    if math.isnan(reaching) or seeds == 0:
        return "n/a"  # the random row itself, or nothing finished
    if reaching == 0:
        return f"not reached ({seeds} seeds)"
    return f"{step:.0f} ({reaching:.0f} of {seeds} seeds)"


def _missing_section(runs: pd.DataFrame) -> str:
    missing = runs[runs["status"] != "ok"]
    if missing.empty:
        return "none"
    return "\n".join(f"- `{Cell(r.dataset, r.size, r.variant, r.init, int(r.seed)).key}`: {r.reason}"
                     for r in missing.itertuples())


def _markdown(frame: pd.DataFrame) -> str:
    # disable_numparse: the cells are already formatted strings; tabulate would otherwise re-format them.
    return frame.to_markdown(index=False, disable_numparse=True) if not frame.empty else "(no rows)"


def _acc_text(mean: float, std: float, n: int) -> str:
    if n == 0:
        return "missing"
    return f"{pct(mean)} ± n/a (1 seed)" if n == 1 else f"{pct(mean)} ± {100 * std:.2f} pp"


def _num(x: float, fmt: str) -> str:
    return "n/a" if x is None or pd.isna(x) else format(x, fmt)


def _json_default(value):
    # numpy scalars from pandas reach the verdicts' numbers; NaN stays a float (json writes NaN).
    return float(value)
