"""Aggregate results/ into tables, figures and claim verdicts under report/.

    runs, curves = collect(config, "results")   # aggregate: one row per expected cell / per evaluation
    costs = collect_benchmarks(config, "results")  # aggregate: wall-clock and peak memory per rule
    summary = summarize(runs, config)            # tables: mean and std over seeds, gap closed
    write_report(config, "results", "report")    # render: exactly linvit.grid.report_files, written atomically

The verdicts are linvit.claims' (judge.evaluate_claims: C1-C4 from the one claims table, roles by content),
their statistics linvit.stats'; the report reads the runs and their predictions for them and says them in
words (claims_text, decisions).
"""

# The names below are imported when first used (PEP 562): `linvit status` reads the aggregation's
# log and benchmark readers without paying for matplotlib and seaborn, which the figures import.
_EXPORTS = {
    "ResultsError": "aggregate", "collect": "aggregate", "collect_benchmarks": "aggregate",
    "load_predictions": "aggregate", "claims_markdown": "claims_text", "accuracy_by_init": "figures",
    "training_curves": "figures", "write_figures": "figures", "write_report": "render", "cost_table": "tables",
    "summarize": "tables",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'linvit.report' has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f"linvit.report.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value
