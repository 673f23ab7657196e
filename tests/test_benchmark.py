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
    out = run(["linvit", "benchmark", "--tokens", "16,64", "--variants", "relu", "--out", str(tmp_path / "b.csv")],
              cwd=tmp_path)
    assert (tmp_path / "b.csv").exists() and "relu" in out.stdout and "softmax" in out.stdout


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
