"""Aggregate results/ into tables, figures and claim verdicts under report/.

    runs, curves = collect(config, "results")   # aggregate: one row per expected cell / per evaluation
    verdicts = evaluate_claims(runs, config)     # claims: C1-C4 with the numbers behind them
    write_report(config, "results", "report")    # render: everything, written atomically
"""

from linvit.report.aggregate import ResultsError, collect, write_tables
from linvit.report.claims import ClaimVerdict, CellVerdict, claims_markdown, cost_table, evaluate_claims, summarize
from linvit.report.figures import accuracy_by_init, training_curves, write_figures
from linvit.report.render import write_report

__all__ = [
    "CellVerdict", "ClaimVerdict", "ResultsError", "accuracy_by_init", "claims_markdown", "collect", "cost_table",
    "evaluate_claims", "summarize", "training_curves", "write_figures", "write_report", "write_tables",
]
