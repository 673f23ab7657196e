"""Device, precision and compile settings: decided once, one-line errors, and the training loop under them.

All on the CPU: the code paths are device-agnostic; what is CUDA-only (pinned copies, TF32, CUDA RNG
state) is exercised as far as a machine without CUDA allows, and said so where it matters.
"""

import json
import math

import pytest
import torch
from safetensors.torch import load_file

from linvit import cli, device, steps
from linvit import train as train_mod
from linvit.config import ConfigError, validate
from linvit.device import Runtime, loader_workers, runtime
from linvit.report.aggregate import _eval_fields

from conftest import TINY_SYNTHETIC
from test_config import DEFAULT, changed

SYNTH = TINY_SYNTHETIC
CPU = torch.device("cpu")


def config(rt=None, **teacher_train):
    train = {"steps": 6, "batch_size": 16, "lr": 2e-3, "warmup_steps": 1, "checkpoint_every": 3, "log_every": 1}
    train.update(teacher_train)
    cfg = {"datasets": {"synthetic": SYNTH}, "shards": {"samples_per_shard": 64},
           "teacher": {"dataset": "synthetic", "train": train},
           "student": {"train": {"steps": 4, "batch_size": 16, "lr": 1e-3}},
           "distill": {"loss": "mse", "train": {"steps": 2, "batch_size": 16, "lr": 1e-3}},
           "init_strategies": {"random": {"copy": [], "distill": False}},
           "evaluation": {"fidelity_samples": 8, "throughput_batch": 4}}
    if rt is not None:
        cfg["runtime"] = rt
    return cfg


@pytest.fixture(autouse=True)
def _quiet(quiet_machine):
    yield


def cli_run(args, capsys):
    capsys.readouterr()
    rc = cli.main(args)
    return rc, capsys.readouterr().err


def errors(err):
    return [line for line in err.splitlines() if line.startswith("linvit: error:")]


# ----------------------------------------------------------------------------- resolving the runtime


def test_auto_is_the_cpu_in_fp32_eager_here():
    assert not torch.cuda.is_available()  # this suite runs on a machine without CUDA
    rt = runtime({})
    assert rt == Runtime(CPU, "fp32", None, 0) == runtime(
        {"runtime": {"device": "auto", "precision": "auto", "workers": "auto"}})
    assert rt.dtype == torch.float32 and rt.scaler() is None
    x, y = torch.randn(2, 3), torch.arange(2)
    assert all(a is b for a, b in zip(rt.batch(x, y), (x, y)))  # no copy, no pinning on the CPU


def test_auto_on_a_cuda_machine_is_cuda_in_bf16_with_tf32(monkeypatch):
    # Only the decision is testable here (no tensor goes to the device).
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    matmul, conv = torch.backends.cuda.matmul, torch.backends.cudnn.conv
    before = matmul.fp32_precision, conv.fp32_precision
    try:
        rt = runtime({"runtime": {"device": "cpu"}}, device="auto")
        assert rt.device == torch.device("cuda") and rt.precision == "bf16" and rt.dtype == torch.bfloat16
        assert (matmul.fp32_precision, conv.fp32_precision) == ("tf32", "tf32")
        assert rt.workers == loader_workers()  # decoding workers from the job's CPUs
    finally:
        matmul.fp32_precision, conv.fp32_precision = before
    assert runtime({"runtime": {"device": "cuda:1", "precision": "fp32"}}).device == torch.device("cuda:1")
    with pytest.raises(ValueError, match=r"^--device: device 'cuda:3' requested but this machine has 2 CUDA "
                                         r"device\(s\) \(cuda:0\.\.cuda:1\)$"):
        runtime({}, device="cuda:3")


def test_attention_maps_are_ieee_fp32_while_the_process_runs_tf32(monkeypatch):
    # On CUDA linvit.device turns TF32 on for the whole process; the maps that the losses, the
    # fidelity and gpucheck call float32 are computed with IEEE fp32 products, the setting restored
    # afterwards, error or not. No CUDA here: the setting each map's computation runs under is checked.
    import linvit.attention.base as base
    from linvit.attention import LinearAttention, attention_maps
    from linvit.models import build_vit

    seen = []
    matmul, conv = torch.backends.cuda.matmul, torch.backends.cudnn.conv

    def spy(real):
        def compute(*args, **kwargs):
            seen.append((matmul.fp32_precision, conv.fp32_precision))
            return real(*args, **kwargs)
        return compute

    monkeypatch.setattr(base, "softmax_attention_maps", spy(base.softmax_attention_maps))
    monkeypatch.setattr(LinearAttention, "attention_maps", spy(LinearAttention.attention_maps))
    before = matmul.fp32_precision, conv.fp32_precision
    try:
        matmul.fp32_precision = conv.fp32_precision = "tf32"  # as linvit.device sets them on CUDA
        x = torch.randn(2, 17, 64)
        for variant in ("softmax", "elu"):
            attn = build_vit("micro", num_classes=4, img_size=16, in_chans=1, variant=variant).blocks[0].attn
            assert attention_maps(attn, x, grad=True).dtype == torch.float32
        assert seen == [("ieee", "ieee")] * 2
        assert (matmul.fp32_precision, conv.fp32_precision) == ("tf32", "tf32")
        with pytest.raises(RuntimeError):
            attention_maps(attn, torch.randn(2, 17, 5))  # a wrong width fails inside
        assert (matmul.fp32_precision, conv.fp32_precision) == ("tf32", "tf32")
    finally:
        matmul.fp32_precision, conv.fp32_precision = before


@pytest.mark.parametrize("rt, flag, message", [
    ({}, "tpu", r"^--device: unknown device 'tpu'; known: auto, cpu, cuda, cuda:N$"),
    ({"device": "cpu"}, "cuda", r"^--device: device 'cuda' requested but torch.cuda.is_available\(\) is False "
                                r"on this machine$"),
    ({}, "cuda:3", r"^--device: device 'cuda:3' requested but torch.cuda.is_available\(\) is False"),
    ({"device": "gpu0"}, None, r"^config key runtime.device: unknown device 'gpu0'"),
    ({"precision": "fp8"}, None, r"^config key runtime.precision: unknown precision 'fp8'; known: auto, fp32, "
                                 r"bf16, fp16$"),
    ({"compile": "nope"}, None, r"^config key runtime.compile: unknown torch.compile backend 'nope'; known: true, "
                                r"false, .*aot_eager"),
    ({"dtype": "bf16"}, None, r"^config key runtime: unknown setting\(s\) \['dtype'\]"),
    ({"workers": -1}, None, r"^config key runtime.workers: -1 is not auto or a whole number of threads from 0$"),
])
def test_a_bad_runtime_is_one_line(rt, flag, message):
    with pytest.raises(ValueError, match=message) as err:
        runtime({"runtime": rt}, device=flag)
    assert "\n" not in str(err.value)


def test_the_schema_checks_the_runtime_section():
    validate(changed(runtime={"device": "cuda:1", "precision": "bf16", "compile": "aot_eager", "workers": 4}))
    validate(changed(runtime={"device": "auto", "precision": "auto", "compile": False, "workers": "auto"}))
    with pytest.raises(ConfigError, match=r"^config key runtime.workers: 'many' is not valid"):
        validate(changed(runtime={"workers": "many"}))
    with pytest.raises(ConfigError, match=r"^config key runtime.device: 'tpu' does not match"):
        validate(changed(runtime={"device": "tpu"}))
    with pytest.raises(ConfigError, match=r"^config key runtime.precision: 'fp64' is not one of"):
        validate(changed(runtime={"precision": "fp64"}))
    assert "runtime" not in DEFAULT  # the default grid's job configs are unchanged: nothing reruns


@pytest.mark.parametrize("command", ["teacher", "distill", "student", "evaluate", "benchmark"])
def test_every_computing_command_refuses_a_bad_device_before_any_compute(command, shards, tmp_path, capsys):
    out = tmp_path / "out"
    job = {"teacher": ["--size", "micro", "--seed", "0"],
           "distill": ["--dataset", "synthetic", "--size", "micro", "--variant", "elu", "--init", "random",
                       "--design", "mse", "--seed", "0", "--teacher", str(tmp_path / "t")],
           "student": ["--dataset", "synthetic", "--size", "micro", "--variant", "elu", "--init", "random",
                       "--seed", "0", "--teacher", str(tmp_path / "t")],
           "evaluate": ["--run", str(tmp_path / "r"), "--teacher", str(tmp_path / "t")]}
    args = [command, "--out", str(out)]
    if command != "benchmark":
        args += ["--config-json", json.dumps(config()), "--shards", str(shards), *job[command]]
    for flag, message in [("tpu", "--device: unknown device 'tpu'"),
                          ("cuda", "--device: device 'cuda' requested but torch.cuda.is_available() is False")]:
        rc, err = cli_run(args + ["--device", flag], capsys)
        assert rc == 1 and "Traceback" not in err
        assert len(errors(err)) == 1 and message in errors(err)[0], err
        assert not out.exists()  # nothing written, nothing trained


def test_the_device_flag_overrides_the_config(shards, tmp_path, capsys):
    cfg = config({"device": "cuda"})
    args = ["teacher", "--config-json", json.dumps(cfg), "--size", "micro", "--seed", "0",
            "--shards", str(shards), "--out", str(tmp_path / "t")]
    rc, err = cli_run(args, capsys)
    assert rc == 1 and "config key runtime.device: device 'cuda' requested" in errors(err)[0]
    rc, err = cli_run(args + ["--device", "cpu"], capsys)
    assert rc == 0, err
    fp = json.loads((tmp_path / "t" / "config.json").read_text())["fingerprint"]
    assert fp["runtime"] == {"precision": "fp32", "compile": False}


# ----------------------------------------------------------------------------- precision


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_mixed_precision_trains_on_the_cpu(precision, shards, tmp_path):
    rt = Runtime(CPU, precision)
    plain = steps.run_teacher(config(), "micro", 0, shards, tmp_path / "fp32")
    mixed = steps.run_teacher(config(), "micro", 0, shards, tmp_path / precision, runtime=rt)
    assert mixed["steps"] == 6 and math.isfinite(mixed["final_loss"]) and 0 <= mixed["test_acc"] <= 1
    # Autocast was really on: the losses differ from fp32, by a rounding error, not a different run.
    assert mixed["final_loss"] != plain["final_loss"]
    assert mixed["final_loss"] == pytest.approx(plain["final_loss"], rel=0.05)
    w = load_file(tmp_path / precision / "model.safetensors")
    assert all(t.dtype == torch.float32 and torch.isfinite(t).all() for t in w.values())  # fp32 master weights
    fp = json.loads((tmp_path / precision / "config.json").read_text())["fingerprint"]
    assert fp["runtime"]["precision"] == precision


def test_fp16_steps_through_a_grad_scaler_and_resumes_with_it(shards, tmp_path, monkeypatch, capsys):
    rt = Runtime(CPU, "fp16")
    scaler = rt.scaler()
    assert isinstance(scaler, torch.amp.GradScaler) and scaler.is_enabled()
    whole = steps.run_teacher(config(), "micro", 0, shards, tmp_path / "whole", runtime=rt)
    save = train_mod.Checkpoints.save
    saved = {}

    def stop(self, step, model, state, meta):
        save(self, step, model, state, meta)
        saved.update(state)
        raise KeyboardInterrupt

    monkeypatch.setattr(train_mod.Checkpoints, "save", stop)
    with pytest.raises(KeyboardInterrupt):
        steps.run_teacher(config(), "micro", 0, shards, tmp_path / "cut", runtime=rt)
    monkeypatch.setattr(train_mod.Checkpoints, "save", save)
    assert saved["scaler"]["scale"] > 0  # the scaler's state is in the checkpoint
    capsys.readouterr()
    again = steps.run_teacher(config(), "micro", 0, shards, tmp_path / "cut", runtime=rt)
    assert "resuming from step 3" in capsys.readouterr().err
    assert again["final_loss"] == whole["final_loss"] and again["test_acc"] == whole["test_acc"]


def _stop_at_first_checkpoint(shards, out, monkeypatch) -> None:
    """Run the teacher into `out` on the CPU (fp32) and interrupt it right after its first checkpoint."""
    save = train_mod.Checkpoints.save

    def stop(self, *args):
        save(self, *args)
        raise KeyboardInterrupt

    monkeypatch.setattr(train_mod.Checkpoints, "save", stop)
    with pytest.raises(KeyboardInterrupt):
        steps.run_teacher(config(), "micro", 0, shards, out)
    monkeypatch.setattr(train_mod.Checkpoints, "save", save)


def test_another_precision_does_not_resume_a_checkpoint(shards, tmp_path, monkeypatch, capsys):
    _stop_at_first_checkpoint(shards, tmp_path / "t", monkeypatch)
    capsys.readouterr()
    steps.run_teacher(config(), "micro", 0, shards, tmp_path / "t", runtime=Runtime(CPU, "bf16"))
    err = capsys.readouterr().err
    assert "resuming" not in err and "(changed: runtime.precision); starting afresh" in err


# ----------------------------------------------------------------------------- checkpoints across devices


def test_a_checkpoint_saved_with_cuda_tensors_resumes_on_the_cpu(shards, tmp_path, monkeypatch, capsys):
    """state.pt is rewritten so that every tensor in it carries torch's storage location 'cuda:0', as
    a CUDA run's optimizer state and CUDA RNG state do. Without map_location this file cannot be
    loaded on this machine (checked); the run resumes from it and ends as an uninterrupted run."""
    _stop_at_first_checkpoint(shards, tmp_path / "t", monkeypatch)
    folder = tmp_path / "t" / "checkpoint" / (tmp_path / "t" / "checkpoint" / "LATEST").read_text().strip()
    state = torch.load(folder / "state.pt", weights_only=True)
    state["cuda_rng"] = torch.zeros(16, dtype=torch.uint8)  # what a CUDA run adds
    with monkeypatch.context() as m:
        # torch.save asks location_tag where each storage lives; answer as for a CUDA tensor.
        m.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
        torch.save(state, folder / "state.pt")
    with pytest.raises(RuntimeError, match="CUDA"):
        torch.load(folder / "state.pt", weights_only=True)
    capsys.readouterr()
    resumed = steps.run_teacher(config(), "micro", 0, shards, tmp_path / "t")
    assert "resuming from step 3" in capsys.readouterr().err
    whole = steps.run_teacher(config(), "micro", 0, shards, tmp_path / "whole")
    assert resumed["final_loss"] == whole["final_loss"]
    a, b = load_file(tmp_path / "t" / "model.safetensors"), load_file(tmp_path / "whole" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)


# ----------------------------------------------------------------------------- evaluation and report


def test_eval_json_records_device_dtype_and_batch_of_the_throughput(shards, tmp_path):
    steps.run_teacher(config(steps=2), "micro", 0, shards, tmp_path / "t")
    steps.run_student(config(), "synthetic", "micro", "elu", "random", 0, tmp_path / "t", shards, tmp_path / "s")
    out = tmp_path / "s" / "eval.json"
    r = steps.run_evaluate(config(), tmp_path / "s", tmp_path / "t", shards, out, runtime=Runtime(CPU, "bf16"))
    saved = json.loads(out.read_text())
    assert saved == r
    assert (r["device"], r["precision"], r["dtype"], r["throughput_batch"]) == ("cpu", "bf16", "bfloat16", 4)
    assert r["throughput_img_s"] > 0 and all(math.isfinite(k) for k in r["fidelity_kl"])
    fields = _eval_fields(r, out)
    assert (fields["throughput_device"], fields["throughput_dtype"], fields["throughput_batch"]) == \
        ("cpu", "bfloat16", 4)


def test_the_benchmark_records_its_device(tmp_path):
    from linvit.benchmark import run_benchmark

    df = run_benchmark(["elu"], tokens=(16,), repeats=1, min_seconds=0.0, device=CPU)
    assert set(df.device) == {"cpu"} and set(df.dtype) == {"float32"}


# ----------------------------------------------------------------------------- compile


def student_losses(shards, tmp_path, variant, compile_backend):
    cfg = config(steps=2)
    teacher = tmp_path / "teacher"
    if not (teacher / "metrics.json").exists():
        steps.run_teacher(cfg, "micro", 0, shards, teacher)
    cfg["student"]["train"].update(steps=3, log_every=1, label_smoothing=0.1)
    out = tmp_path / f"{variant}-{compile_backend}"
    m = steps.run_student(cfg, "synthetic", "micro", variant, "random", 0, teacher, shards, out,
                          runtime=Runtime(CPU, "fp32", compile_backend))
    log = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    return [r["loss"] for r in log if r["kind"] == "train"], m


# aot_eager traces and runs the same graphs as inductor without its C++ code generation (about 10 s
# a case here); the real inductor case takes 40 s with a warm cache and 80 s cold on 2 CPU cores,
# hence marked slow (it runs in the full suite, not under -m "not slow").
@pytest.mark.parametrize("variant, backend", [("elu", "aot_eager"), ("hydra", "aot_eager"),
                                              pytest.param("elu", "inductor", marks=pytest.mark.slow)])
def test_a_compiled_student_trains_to_the_eager_loss(variant, backend, shards, tmp_path):
    eager, m_eager = student_losses(shards, tmp_path, variant, None)
    compiled, m_compiled = student_losses(shards, tmp_path, variant, backend)
    assert len(eager) == len(compiled) == 3
    assert compiled == pytest.approx(eager, rel=1e-4)
    assert m_compiled["test_acc"] == pytest.approx(m_eager["test_acc"], abs=1 / 32)
    # Compiled in place: the saved weights have the eager model's names.
    names = set(load_file(tmp_path / f"{variant}-{backend}" / "model.safetensors"))
    assert names == set(load_file(tmp_path / f"{variant}-None" / "model.safetensors"))
    fp = json.loads((tmp_path / f"{variant}-{backend}" / "config.json").read_text())["fingerprint"]
    assert fp["runtime"]["compile"] == backend


def test_compile_true_means_inductor():
    assert device.resolve_compile(True) == "inductor" and device.resolve_compile(False) is None
    assert device.resolve_compile("aot_eager") == "aot_eager"


# ----------------------------------------------------------------------------- loader threads


def test_decoding_threads_give_exactly_the_same_batches(shards):
    from linvit.data.loader import ShardSet

    plain, threaded = ShardSet(shards), ShardSet(shards, workers=2)
    for kw in [dict(seed=3, epoch=1, shuffle=True, drop_last=True, skip_batches=1),
               dict(limit=40), dict(shuffle=False)]:  # 64 samples in batches of 24: a partial last batch too
        a = list(plain.batches("train", 24, **kw))
        b = list(threaded.batches("train", 24, **kw))
        assert len(a) == len(b) > 0
        assert all(torch.equal(x1, x2) and torch.equal(y1, y2) for (x1, y1), (x2, y2) in zip(a, b))


def test_a_run_with_decoding_threads_ends_as_one_without(shards, tmp_path):
    plain = steps.run_teacher(config(), "micro", 0, shards, tmp_path / "plain")
    threaded = steps.run_teacher(config(), "micro", 0, shards, tmp_path / "threaded",
                                 runtime=Runtime(CPU, "fp32", None, 2))
    assert plain["final_loss"] == threaded["final_loss"] and plain["test_acc"] == threaded["test_acc"]
    a, b = load_file(tmp_path / "plain" / "model.safetensors"), load_file(tmp_path / "threaded" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
