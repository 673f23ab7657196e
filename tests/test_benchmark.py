"""The operator benchmark measures every operator beside softmax and summarizes growth and speedup."""

import pytest

from linvit.benchmark import run_benchmark, summarize
from conftest import run


@pytest.mark.parametrize("scope", ["module", "core"])
def test_benchmark_rows_and_summary(scope):
    df = run_benchmark(["elu", "focused"], tokens=(16, 64), scope=scope, repeats=1, min_seconds=0.0)
    assert set(df.variant) == {"softmax", "elu", "focused"} and set(df.tokens) == {16, 64}
    assert (df.seconds > 0).all() and (df.scope == scope).all()
    ref = df[df.variant == "softmax"].set_index("tokens").seconds
    elu = df[df.variant == "elu"].set_index("tokens").seconds
    assert df[df.variant == "elu"].set_index("tokens").speedup_vs_softmax[64] == pytest.approx(ref[64] / elu[64])
    summary = summarize(df, 16, 64).set_index("variant")
    assert summary.loc["elu", "growth_16_to_64"] == pytest.approx(elu[64] / elu[16])


def test_benchmark_rejects_a_non_square_token_count():
    with pytest.raises(ValueError, match=r"square patch grids; 10 is not$"):
        run_benchmark(["elu"], tokens=(10,))


def test_benchmark_command_writes_csv(tmp_path):
    out = run(["linvit", "benchmark", "--tokens", "16,64", "--variants", "relu", "--rounds", "2",
               "--out", str(tmp_path / "b.csv")], cwd=tmp_path)
    assert (tmp_path / "b.csv").exists() and "relu" in out.stdout and "softmax" in out.stdout
    import pandas as pd

    df = pd.read_csv(tmp_path / "b.csv")
    assert (df.rounds == 2).all() and (df.seconds_low <= df.seconds).all() and (df.seconds <= df.seconds_high).all()
    assert (df.speedup_low <= df.speedup_high).all() and "rounds_range_at_64" in out.stdout


def test_benchmark_compiles_every_module_when_told():
    """`compile`: softmax and the operator both run through torch.compile (the dynamo-only 'eager'
    backend here: the same plumbing as inductor, without its C++ build), and the rows say so."""
    import torch._dynamo

    torch._dynamo.reset()
    torch._dynamo.utils.counters.clear()
    df = run_benchmark(["elu"], tokens=(16,), scope="module", repeats=1, min_seconds=0.0, compile="eager")
    assert set(df["compile"]) == {"eager"} and set(df.variant) == {"softmax", "elu"}
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 2  # one graph per module
    plain = run_benchmark(["elu"], tokens=(16,), repeats=1, min_seconds=0.0)
    assert set(plain["compile"]) == {"none"}


def test_flops_are_counted_for_softmax_kernels_and_grow_linearly_for_a_linear_operator():
    """gflop: softmax's module is its four projections (forward, and the backward's two products
    each) plus torch's formula for the attention kernel (4 b h n^2 d
    forward, 10 backward, the scores recomputed); a linear operator's count doubles with the
    tokens; the ceiling is the ratio."""
    b, h, d = 2, 4, 8
    c = h * d
    df = run_benchmark(["elu"], tokens=(64, 256), scope="module", repeats=1, min_seconds=0.0,
                       batch=b, heads=h, head_dim=d)
    got = df.set_index(["variant", "tokens"])
    for n in (64, 256):
        assert got.gflop["softmax", n] * 1e9 == 3 * 2 * b * n * c * 4 * c + 14 * b * h * n * n * d
        assert got.speedup_ceiling["elu", n] == pytest.approx(got.gflop["softmax", n] / got.gflop["elu", n])
        assert got.gflop_per_s["elu", n] == pytest.approx(got.gflop["elu", n] / got.seconds["elu", n])
    assert got.gflop["elu", 256] == pytest.approx(4 * got.gflop["elu", 64])
    assert got.speedup_ceiling["softmax", 64] == 1.0
    assert "speedup_ceiling_at_256" in summarize(df, 64, 256).columns


@pytest.mark.parametrize("groups", [1, 8])
def test_a_convolutions_backward_counts_the_forwards_products_once_per_gradient(groups):
    """torch's counter ignores `groups` in a convolution's backward (a depthwise weight gradient
    counted C times over); count_flops counts each gradient as the forward's products."""
    import torch

    from linvit.benchmark import count_flops

    conv = torch.nn.Conv2d(8, 8, 5, padding=2, groups=groups, bias=False)
    x = torch.randn(2, 8, 12, 12, requires_grad=True)
    forward = 2 * 2 * 12 * 12 * 8 * (8 // groups) * 25  # 2 flops per multiply-add
    assert count_flops(lambda: conv(x)) == forward
    assert count_flops(lambda: conv(x).sum().backward()) == 3 * forward  # + input and weight gradients


def test_the_reports_scaling_table_shows_each_operators_round_range(tmp_path):
    from linvit.report.render import _scaling_section

    df = run_benchmark(["relu"], tokens=(16, 64), repeats=3, min_seconds=0.0)
    df.to_csv(tmp_path / "attention.csv", index=False)
    text, figures = _scaling_section(tmp_path / "attention.csv", tmp_path / "report")
    assert "rounds_range_at_64" in text and "range of its per-round speedups" in text
    row = df[(df.variant == "relu") & (df.tokens == 64)].iloc[0]
    low, high = row.speedup_low, row.speedup_high
    assert f"{low:.2f}-{high:.2f}" in text and figures
