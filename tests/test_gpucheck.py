"""The GPU check (python -m linvit.gpucheck) runs end to end on the CPU at a tiny size, writes its two
CSVs named after the device, keeps one operator's failure in its row, and reports bad options in one line."""

import math

import pandas as pd
import pytest
import torch

import linvit.gpucheck as gpucheck
import linvit.losses
import linvit.models
from linvit.attention import LinearAttention, softmax_attention_maps
from linvit.device import runtime

def read(path):
    """A CSV as written, with an empty error cell as "" (pandas reads it as NaN)."""
    df = pd.read_csv(path)
    return df.assign(error=df.error.astype(object).fillna(""))


SMALL = ["--device", "cpu", "--size", "micro", "--steps", "2", "--warmup", "1", "--batch", "4",
         "--tokens", "64", "144", "--variants", "softmax", "elu"]  # benchmark token counts are square


def test_cpu_run_writes_train_and_attention_csvs(tmp_path, quiet_machine, capsys):
    assert gpucheck.main(SMALL + ["--out", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    train = read(tmp_path / "train_cpu.csv")
    attention = read(tmp_path / "attention_cpu.csv")
    assert sorted(train.variant) == ["elu", "softmax"]
    assert (train.error == "").all() and train.losses_finite.all() and (train.images_per_s > 0).all()
    assert all(math.isfinite(v) for v in [*train.first_loss, *train.last_loss])
    assert (train.device == "cpu").all() and (train.precision == "fp32").all() and (train.batch == 4).all()
    assert (train["size"] == "micro").all() and (train.peak_mem_kind == "process_peak_rss").all()
    assert sorted(zip(attention.variant, attention.tokens)) == [
        ("elu", 64), ("elu", 144), ("softmax", 64), ("softmax", 144)]
    assert (attention.ms > 0).all() and (attention.error == "").all()
    assert (attention[attention.variant == "softmax"].speedup_vs_softmax == 1).all()
    assert "| elu" in out and "N=144" in out and "train_cpu.csv" in out
    assert "gpucheck: train        elu:" in err and "gpucheck: attention        elu N=   144:" in err
    maps = read(tmp_path / "maps_cpu.csv")
    n_maps = sum("maps" in spec.reads for spec in linvit.losses.LOSSES.values())
    assert sorted(maps.variant) == ["elu", "softmax"] and (maps.precision == "bf16").all()  # no fp16 on the CPU
    assert maps.ok.all() and (maps.maps_dtype == "float32").all() and maps.maps_finite.all()
    assert maps.loss_finite.all() and maps.grads_finite.all() and (maps.error == "").all()
    assert (maps.terms == 2 * n_maps).all() and (maps.max_rel_diff < 0.1).all()
    assert "map losses under autocast (bf16; fp16 skipped on the CPU)" in out and "maps_cpu.csv" in out
    assert "gpucheck: maps bf16        elu: maps float32, finite True" in err
    assert "data parallelism (2 ranks, linvit.dpcheck):" in out
    assert "skipped: needs 2 GPUs; not on CUDA; tests/test_distributed.py runs it on the CPU with gloo" in out


def test_the_data_parallel_check_is_rows_of_a_table_or_one_skipped_row(monkeypatch):
    import linvit.dpcheck

    rt = gpucheck.Runtime(torch.device("cuda"), "bf16")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    (row,) = gpucheck.data_parallel(rt).to_dict("records")
    assert row == {"check": "data parallel, 2 ranks", "ok": "",
                   "result": "skipped: needs 2 GPUs; this machine shows 1 CUDA device(s) (CUDA_VISIBLE_DEVICES 3)"}
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda: False)
    parity = {"steps_compared": 4, "grad_rel_diff": 1.0, "loss_rel_diff": 3e-7, "tolerance": 1e-2,
              "param_max_diff_across_ranks": 0.0, "ok": False}
    result = {"ranks": 2, "backend": "nccl", "steps": 4, "batch": 16, "param_max_diff": 0.0, "params_equal": True,
              "mask_fraction_differing": 0.5, "masks_differ": True, "rank0_masks_are_one_process": False}
    asked = []

    def check(device, precisions):
        asked.append(precisions)
        return {**result, "parity": [{**parity, "precision": p} for p in precisions]}

    monkeypatch.setattr(linvit.dpcheck, "check", check)
    rows = gpucheck.data_parallel(rt)
    assert asked == [["fp32", "fp16"]]  # no bf16 where the GPU has none
    assert list(rows.check) == ["processes", "2 ranks x B/2 against 1 x B, fp32", "2 ranks x B/2 against 1 x B, fp16",
                                "parameters equal across ranks (dropout)", "dropout masks differ between ranks",
                                "rank 0's masks are one process's"]
    assert list(rows.ok) == [True, False, False, True, True, False] and rows.result[4] == "50% of the entries differ"
    assert rows.result[1] == ("gradients 1, losses 3e-07 relative (tolerance 0.01, 4 steps); parameters across "
                              "ranks differ by 0")
    monkeypatch.setattr(linvit.dpcheck, "check",
                        lambda device, precisions: (_ for _ in ()).throw(RuntimeError("NCCL error\nmore")))
    assert gpucheck.data_parallel(rt).to_dict("records") == [
        {"check": "data parallel, 2 ranks", "result": "RuntimeError: NCCL error", "ok": False}]


def test_the_map_check_catches_maps_computed_under_autocast(quiet_machine, monkeypatch):
    """With the maps left to the autocast (the maps' code before attention_maps turned it off), the
    rows say so."""
    def under_autocast(attn, x, grad=False):
        return attn.attention_maps(x, grad=grad) if isinstance(attn, LinearAttention) else softmax_attention_maps(attn, x)

    monkeypatch.setattr(linvit.losses.objective, "attention_maps", under_autocast)
    rt = runtime({"runtime": {"precision": "fp32"}}, device="cpu")
    maps = gpucheck.map_losses_all(["elu"], rt, size="micro", img_size=16, in_chans=1, num_classes=4)
    assert list(maps.variant) == ["elu"] and not maps.ok.any() and (maps.error == "").all()
    assert "bfloat16" in maps.maps_dtype.iloc[0]


def test_a_failing_operator_is_kept_in_its_row(tmp_path, quiet_machine, monkeypatch, capsys):
    build, time_op = linvit.models.build_vit, gpucheck.time_operator

    def build_vit(size, variant="softmax", **kw):
        if variant == "elu":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB\nmore detail")
        return build(size, variant=variant, **kw)

    def time_operator(variant, tokens, **kw):
        if variant == "elu" and tokens == 144:
            raise RuntimeError("kernel failed")
        return time_op(variant, tokens, **kw)

    monkeypatch.setattr(linvit.models, "build_vit", build_vit)
    monkeypatch.setattr(gpucheck, "time_operator", time_operator)
    assert gpucheck.main(SMALL + ["--steps", "1", "--out", str(tmp_path)]) == 1
    train = read(tmp_path / "train_cpu.csv").set_index("variant")
    assert train.loc["elu", "error"] == "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert train.loc["softmax", "error"] == "" and train.loc["softmax", "images_per_s"] > 0
    attention = read(tmp_path / "attention_cpu.csv")
    errors = dict(zip(zip(attention.variant, attention.tokens), attention.error))
    assert errors == {("softmax", 64): "", ("elu", 64): "", ("softmax", 144): "",
                      ("elu", 144): "RuntimeError: kernel failed"}
    assert "attention elu N=144: RuntimeError: kernel failed" in capsys.readouterr().out
    maps = read(tmp_path / "maps_cpu.csv").set_index("variant")
    assert maps.loc["elu", "error"] == "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    assert maps.loc["softmax", "error"] == "" and maps.loc["softmax", "ok"]


@pytest.mark.parametrize("argv, says", [
    pytest.param(["--device", "cuda"], "--device: device 'cuda' requested but torch.cuda.is_available() is False",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")),
    (["--variants", "softmax", "nope"], "unknown attention variant 'nope'; known variants: "),
    (["--size", "huge"], "unknown model size 'huge'"),
    (["--tokens", "128"], "--tokens: benchmark token counts must be square patch grids; 128 is not"),
])
def test_a_bad_option_is_one_line_and_exit_2(tmp_path, capsys, argv, says):
    assert gpucheck.main(argv + ["--out", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"gpucheck: {says}") and err.count("\n") == 1
    assert not list(tmp_path.iterdir())  # nothing computed, nothing written
