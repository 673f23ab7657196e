"""Aggregate results/ into tables, figures and claim verdicts under report/.

    runs, curves = collect(config, "results")   # aggregate: one row per expected cell / per evaluation
    costs = collect_benchmarks(config, "results")  # aggregate: wall-clock and peak memory per rule
    summary = summarize(runs, config)            # tables: mean and std over seeds, gap closed
    verdicts = evaluate_claims(runs, config)     # claims: C1-C4 from the one claims table, roles by content
    write_report(config, "results", "report")    # render: exactly linvit.grid.report_files, written atomically
"""

from linvit.report.aggregate import ResultsError, collect, collect_benchmarks
from linvit.report.claims import CLAIMS, CellVerdict, ClaimVerdict, evaluate_claims
from linvit.report.claims_text import claims_markdown
from linvit.report.figures import accuracy_by_init, training_curves, write_figures
from linvit.report.render import write_report
from linvit.report.roles import resolve_roles
from linvit.report.tables import cost_table, summarize

__all__ = [
    "CLAIMS", "CellVerdict", "ClaimVerdict", "ResultsError", "accuracy_by_init", "claims_markdown", "collect",
    "collect_benchmarks", "cost_table", "evaluate_claims", "resolve_roles", "summarize", "training_curves",
    "write_figures", "write_report",
]
