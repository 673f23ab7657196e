"""The statistics engine: numbers in, numbers out (numpy and scipy; no claims, config or report).

    pairing.py     runs paired by seed and test image into a Sample, and its moments
    paired.py      paired t and Fieller intervals, one-sided tests against a threshold, seeds needed
    multitest.py   a claim's deciding tests combined (intersection-union, Bonferroni), Holm across a family
    spending.py    the alpha-spending functions, one registered entry each
    boundaries.py  group-sequential boundaries by numerical integration, their t conversion, conditional power
    sequential.py  the sequential plan and a test read at its looks (repeated intervals, futility)

The claims (linvit.claims) judge their tests with it; its calibration by simulation is
linvit.claims.calibration and linvit.claims.calibration_sequential (docs/statistics.md).
"""
