"""The claims: the table of claims under test, the roles they compare, the judge that turns runs into
verdicts, and the verdicts' calibration by simulation. Above linvit.stats, linvit.config and linvit.grid;
below the report (linvit.report) and the sequential driver (linvit.decide), which read its verdicts.

    table.py                   CLAIMS: each claim's sentence and tests; thresholds; a sequential plan's design
    roles.py                   which strategy of a grid fills each role, by content
    judge.py                   evaluate_claims: runs and their predictions in, verdicts out (reads no file)
    verdicts.py                the verdicts, and claims.json's one writer and one reader
    calibration.py             the fixed design on simulated grids (coverage.csv)
    calibration_sequential.py  the sequential design on simulated grids (coverage_sequential.csv): its tables
    sequential_simulation.py   ... and the simulation behind them
    compare_adastop.py         the sequential test beside AdaStop on the same draws
"""
