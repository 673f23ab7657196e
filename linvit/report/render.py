"""Write the report directory: tables, figures, claim verdicts, README.md and index.html (the same
content as one self-contained page, figures embedded: linvit.report.html_page), all regenerated from results/.

Exactly the files `linvit.grid.report_files` names are written (each atomically), plus
harness_benchmarks.csv when results/bench/ holds `linvit bench` CSVs, so the `report` rule's outputs
and what this writes cannot disagree; anything else a user keeps in report/ is left alone. README.md's
sections are linvit.report.readme's, but for the two that come with files of their own: the operator
benchmark's (its figures) and the harness benchmarks' (harness_benchmarks.csv).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from linvit.claims.judge import evaluate_claims
from linvit.claims.verdicts import write_verdicts
from linvit.grid import REPORT_FILES, RESULTS_TABLES, operator_benchmark_path, report_files
from linvit.io import write_text
from linvit.report.aggregate import ResultsError, benchmark_jobs, collect, load_predictions, write_csv
from linvit.report.figures import FigureInputs, draw_figures
from linvit.report.html_page import render_html
from linvit.report.provenance import collect as collect_provenance, markdown as provenance_markdown
from linvit.report.readme import _figures_section, _markdown, display_summary, render_readme
from linvit.report.tables import cost_table, designs_table, summarize

# The names come from linvit.grid (the workflow's list of the report's outputs), each spelled once there.
README_MD, SUMMARY_CSV, SUMMARY_MD, CLAIMS_JSON, INDEX_HTML = REPORT_FILES
RUNS_CSV, CURVES_CSV = RESULTS_TABLES
# `linvit bench` writes results/bench/<machine>.csv; the report tables them all in harness_benchmarks.csv.
HARNESS_DIR, HARNESS_CSV = "bench", "harness_benchmarks.csv"
HARNESS_COLUMNS = ("benchmark", "metric", "value", "unit", "target", "meets", "machine")


def write_report(config: dict, results: str | Path, report_dir: str | Path) -> list[Path]:
    """Aggregate results/ and write report/{README.md,summary.csv,summary.md,claims.json,figures/*} and
    results/{runs,curves}.csv. Returns every path written: exactly `report_files(...)`."""
    results, report_dir = Path(results), Path(report_dir)
    runs, curves = collect(config, results)
    bench_path = Path(operator_benchmark_path(results))
    harness = harness_benchmarks(results)
    expected = [Path(p) for p in report_files(bench_path.exists(), report_dir, results)]
    expected += [report_dir / HARNESS_CSV] if harness is not None else []
    summary = summarize(runs, config)
    verdicts = evaluate_claims(runs, config, load_predictions(runs))
    costs = cost_table(runs, curves, config)
    jobs = benchmark_jobs(config, results)

    written = [write_csv(runs, results / RUNS_CSV), write_csv(curves, results / CURVES_CSV),
               write_csv(summary, report_dir / SUMMARY_CSV)]
    _write(report_dir / SUMMARY_MD, "# Summary over seeds\n\n" + _markdown(display_summary(summary)) + "\n", written)
    written.append(write_verdicts(report_dir / CLAIMS_JSON, verdicts))
    # Every registered figure (linvit.figure_registry) but the operator benchmark's, in its order.
    figures = draw_figures(FigureInputs.of_report(config, runs, curves, summary, verdicts, results),
                           report_dir / "figures")
    written.extend(figures)
    scaling, scaling_figures = _scaling_section(bench_path, report_dir) if bench_path.exists() else ("", [])
    written.extend(scaling_figures)
    harness_text = ""
    if harness is not None:
        written.append(write_csv(harness, report_dir / HARNESS_CSV))
        harness_text = harness_section(harness)
    readme = render_readme(config, runs, summary, verdicts, costs, [f.relative_to(report_dir) for f in figures],
                           scaling, jobs, designs_table(summary, config), harness_text,
                           provenance_markdown(collect_provenance(config, runs)), results)
    _write(report_dir / README_MD, readme, written)
    _write(report_dir / INDEX_HTML, render_html(readme, report_dir), written)
    # The list in linvit.grid is the contract the workflow declares; writing anything else is a bug here.
    if sorted(written) != sorted(expected):
        raise RuntimeError(f"report wrote {sorted(map(str, written))}, linvit.grid.report_files names "
                           f"{sorted(map(str, expected))}")
    return written


def _write(path: Path, text: str, written: list[Path]) -> None:
    write_text(path, text)
    written.append(path)


def _scaling_section(path: Path, report_dir: Path) -> tuple[str, list[Path]]:
    """The operator benchmark (its CSV from `linvit benchmark`): table and its figures (the registered figures
    with `benchmark`: the log-log scaling)."""
    from linvit.benchmark import summarize

    try:
        bench = pd.read_csv(path)
    except (OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as err:
        raise ResultsError(f"{path}: cannot be read ({str(err).strip().splitlines()[0]})") from None
    missing = [c for c in ("variant", "tokens", "seconds", "speedup_vs_softmax") if c not in bench]
    if missing:
        raise ResultsError(f"{path}: missing column(s) {', '.join(missing)}")
    figures = draw_figures(FigureInputs({}, bench=bench), report_dir / "figures", benchmark=True)
    tokens = sorted(bench["tokens"].unique())
    high = 4096 if 4096 in tokens else tokens[-1]
    table = (bench.pivot(index="variant", columns="tokens", values="seconds") * 1e3).round(2)
    scope = ", ".join(sorted(bench["scope"].unique())) if "scope" in bench else "module"
    text = ("## Operator scaling\n\nForward + backward milliseconds per operator (scope: " + scope + ") from `"
            + path.as_posix() + "` (one process, operators measured side by side), and per operator the growth from "
            f"{tokens[0]} to {high} tokens, the speedup over softmax (SDPA) at {high}"
            + (" and its ceiling there (softmax's counted FLOPs over the operator's: the speedup at softmax's own "
               "rate of arithmetic)" if "speedup_ceiling" in bench else "")
            + (" with the range of its per-round speedups (each round times softmax and every operator once, "
               "in turn)" if "speedup_low" in bench else "")
            + ", and the smallest measured token count from which it beats softmax.\n\n" + _markdown(table.reset_index()) + "\n\n"
            + _markdown(summarize(bench, tokens[0], high).round(2)) + "\n\n"
            + _figures_section([f.relative_to(report_dir) for f in figures]))
    return text, figures


def harness_benchmarks(results: str | Path) -> pd.DataFrame | None:
    """Every `linvit bench` CSV under results/bench/ (one per machine), concatenated; None when there is
    none. A CSV that cannot be read or lacks a column is a ResultsError naming the file."""
    paths = sorted((Path(results) / HARNESS_DIR).glob("*.csv"))
    if not paths:
        return None
    frames = []
    for path in paths:
        try:
            frame = pd.read_csv(path)
        except (OSError, UnicodeDecodeError, pd.errors.ParserError, pd.errors.EmptyDataError) as err:
            raise ResultsError(f"{path}: cannot be read ({str(err).strip().splitlines()[0]})") from None
        missing = [c for c in HARNESS_COLUMNS if c not in frame]
        if missing:
            raise ResultsError(f"{path}: missing column(s) {', '.join(missing)}")
        frames.append(frame[list(HARNESS_COLUMNS)])
    return pd.concat(frames, ignore_index=True)


def harness_section(bench: pd.DataFrame) -> str:
    """The "Harness benchmarks" section: every row of results/bench/*.csv, per machine."""
    table = bench.astype(object)
    if "value" in table:  # four significant digits: 700.1 images/s, not 700.0971175268296 (the CSV keeps all)
        table["value"] = [f"{v:.4g}" if isinstance(v, float) else v for v in bench["value"]]
    table = table.where(bench.notna(), "n/a").astype(str)
    met = bench["meets"].astype(str).str.lower().isin(["true", "1", "yes"])
    targeted = bench["target"].notna() & (bench["target"].astype(str).str.strip() != "") if "target" in bench \
        else pd.Series(False, index=bench.index)
    return ("## Harness benchmarks\n\nThe harness's own benchmarks (`linvit bench`, from `results/bench/<machine>.csv`; "
            f"all rows in [{HARNESS_CSV}]({HARNESS_CSV})): {int((met & targeted).sum())} of {int(targeted.sum())} "
            "measurements with a target meet it.\n\n" + _markdown(table))
