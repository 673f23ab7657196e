"""Aggregate results/ into tables, figures and claim verdicts under report/.

    runs, curves = collect(config, "results")   # aggregate: one row per expected cell / per evaluation
    costs = collect_benchmarks(config, "results")  # aggregate: wall-clock and peak memory per rule
    verdicts = evaluate_claims(runs, config)     # claims: C1-C4 with the numbers behind them, roles by content
    write_report(config, "results", "report")    # render: exactly linvit.grid.report_files, written atomically
"""

from linvit.report.aggregate import ResultsError, collect, collect_benchmarks
from linvit.report.claims import (ClaimVerdict, CellVerdict, claims_markdown, cost_table, evaluate_claims, resolve_roles,
                                  summarize)
from linvit.report.figures import accuracy_by_init, training_curves, write_figures
from linvit.report.render import write_report

__all__ = [
    "CellVerdict", "ClaimVerdict", "ResultsError", "accuracy_by_init", "claims_markdown", "collect", "collect_benchmarks",
    "cost_table", "evaluate_claims", "resolve_roles", "summarize", "training_curves", "write_figures", "write_report",
]
