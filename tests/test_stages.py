"""The two stages of a student: a design's phases (stage 1), and training with losses against the
teacher beside the task's (stage 2), as the steps run them; the TensorBoard events every run writes."""

import json

import pytest
from safetensors.torch import load_file

from linvit.steps import load_model, run_distill, run_evaluate, run_shards, run_student, run_teacher
from linvit.transfer import parameter_group

CONFIG = {
    "seeds": [0], "sizes": ["micro"], "variants": ["elu"], "targets": ["synthetic"], "inits": ["lolcats"],
    "datasets": {"synthetic": {"source": "synthetic", "num_classes": 4, "train_samples": 64, "test_samples": 16},
                 "other": {"source": "synthetic", "num_classes": 3, "train_samples": 48, "test_samples": 12,
                           "seed": 1}},
    "shards": {"samples_per_shard": 64},
    "teacher": {"dataset": "synthetic", "train": {"steps": 4, "batch_size": 16, "lr": 2e-3}},
    "student": {"train": {"steps": 3, "batch_size": 16, "lr": 1e-3}},
    "distill": {"train": {"steps": 5, "batch_size": 16, "lr": 1e-3, "log_every": 1}},
    "distill_designs": {"mohawk": {"phases": [{"losses": ["map_fro"], "fraction": 0.4}, {"losses": ["block_l2"]}]},
                        "e2e": {"losses": ["hidden_mse", {"loss": "logit_kd", "weight": 0.1}], "freeze": False},
                        "e2e_copied": {"losses": ["hidden_mse"], "freeze": "copied"},
                        "e2e_attention": {"losses": ["hidden_mse"]}},
    "init_strategies": {
        "mohawk": {"copy": ["embed", "attn", "mlp", "norm", "head"], "distill": "mohawk", "task_weight": 0.0,
                   "train_losses": [{"loss": "logit_kd"}]},
        "recipe": {"copy": ["embed", "mlp", "norm", "head"], "distill": True},
        "mlp_random": {"copy": ["embed", "norm", "head"], "distill": True},
        "deit_kd": {"copy": [], "distill": False, "task_weight": 0.5,
                    "train_losses": [{"loss": "logit_kd", "weight": 0.5}]},
    },
    "evaluation": {"fidelity_samples": 4},
}


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("stages")
    for name in ("synthetic", "other"):
        run_shards(CONFIG, name, root / name)
    run_teacher(CONFIG, "micro", 0, root / "synthetic", root / "teacher")
    return root


def test_phases_split_the_budget_run_in_order_and_leave_one_student(world, tmp_path):
    out = tmp_path / "d"
    m = run_distill(CONFIG, "synthetic", "micro", "elu", "mohawk", "mohawk", 0, world / "teacher",
                    world / "synthetic", out)
    assert m["phase_steps"] == [2, 3] and m["steps"] == 5 and m["loss"] == "map_fro+block_l2"
    assert [t["phase"] for t in m["losses"]] == [0, 1]
    records = [json.loads(line) for line in (out / "train.jsonl").read_text().splitlines()]
    assert [r["phase"] for r in records if r["kind"] == "train"] == [0, 0, 1, 1, 1]
    # One student, like any model folder (its TensorBoard events in tb/); the phases' folders are gone
    # like checkpoint/.
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "metrics.json", "model.json",
                                                     "model.safetensors", "tb", "train.jsonl"]
    # In TensorBoard one curve: the second phase's steps after the first's, the losses train.jsonl has.
    curve = events(out).Scalars("train/loss")
    assert [e.step for e in curve] == [1, 2, 3, 4, 5]
    assert [e.value for e in curve] == pytest.approx([r["loss"] for r in records if r["kind"] == "train"], rel=1e-6)
    assert [e.step for e in events(out).Scalars("eval/distill_loss")] == [2, 5]  # each phase's final evaluation
    model, arch = load_model(out)
    assert arch["variant"] == "elu"
    # Frozen (the default): only attention moved away from the copied teacher.
    teacher = load_file(str(world / "teacher" / "model.safetensors"))
    for name, value in model.state_dict().items():
        if parameter_group(name) in ("mlp", "norm", "embed") and name in teacher:
            assert (value == teacher[name]).all(), name


def test_an_unfrozen_design_trains_every_parameter(world, tmp_path):
    m = run_distill(CONFIG, "synthetic", "micro", "elu", "recipe", "e2e", 0, world / "teacher",
                    world / "synthetic", tmp_path / "d")
    model, _ = load_model(tmp_path / "d")
    teacher = load_file(str(world / "teacher" / "model.safetensors"))
    assert m["copied"]["mlp"] > 0
    assert any(not (v == teacher[n]).all() for n, v in model.state_dict().items()
               if parameter_group(n) == "mlp")


def test_freezing_the_copied_groups_trains_the_others(world, tmp_path):
    # mlp_random copies embed, norm and head: with freeze "copied" those stay the teacher's and the
    # random MLPs train beside the attention; with freeze true (attention only) the MLPs stay at init.
    runs = {}
    for design in ("e2e_copied", "e2e_attention"):
        m = run_distill(CONFIG, "synthetic", "micro", "elu", "mlp_random", design, 0, world / "teacher",
                        world / "synthetic", tmp_path / design)
        assert m["copied"]["norm"] > 0 and m["copied"]["mlp"] == 0
        runs[design] = load_model(tmp_path / design)[0].state_dict()
    teacher = load_file(str(world / "teacher" / "model.safetensors"))
    copied, attention = runs["e2e_copied"], runs["e2e_attention"]
    for name, value in copied.items():
        group = parameter_group(name)
        if group in ("norm", "embed", "head"):
            assert (value == teacher[name]).all(), name
        if group == "mlp":
            assert not (value == attention[name]).all(), name


def test_stage_two_starts_from_the_distilled_student_and_adds_its_losses(world, tmp_path):
    run_distill(CONFIG, "synthetic", "micro", "elu", "mohawk", "mohawk", 0, world / "teacher",
                world / "synthetic", tmp_path / "d")
    m = run_student(CONFIG, "synthetic", "micro", "elu", "mohawk", 0, world / "teacher", world / "synthetic",
                    tmp_path / "s", distilled_dir=tmp_path / "d", design="mohawk", budget=2)
    assert m["budget"] == 2 and m["steps"] == 2 and m["task_weight"] == 0.0
    assert m["train_losses"] == [{"loss": "logit_kd"}] and m["distill"]["design"] == "mohawk"
    assert m["copied"]["attn"] > 0  # the distillation's copy, carried over


def test_logit_losses_on_other_labels_read_the_given_teacher(world, tmp_path):
    # On a target of 3 classes the teacher's head is untrained: the softmax reference gives the logits.
    ref = run_student(CONFIG, "other", "micro", "softmax", "reference", 0, world / "teacher", world / "other",
                      tmp_path / "ref", budget=2)
    assert ref["variant"] == "softmax"
    m = run_student(CONFIG, "other", "micro", "elu", "deit_kd", 0, world / "teacher", world / "other",
                    tmp_path / "s", budget=2, kd_dir=tmp_path / "ref")
    assert m["kd_teacher"] == str(tmp_path / "ref") and m["distill"] is None and m["task_weight"] == 0.5


def events(folder):
    """A run folder's TensorBoard events, read by TensorBoard's own reader."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(folder / "tb"))
    accumulator.Reload()
    return accumulator


def hparams_view(logdir):
    """TensorBoard's HParams view of `logdir` (what `tensorboard --logdir` serves there), read by the
    hparams plugin itself: {session (a run's tb folder, relative): (its hparams, {metric: last value})}."""
    from tensorboard.backend.event_processing import data_provider, plugin_event_multiplexer
    from tensorboard.context import RequestContext
    from tensorboard.plugins import base_plugin
    from tensorboard.plugins.hparams import api_pb2, backend_context, list_session_groups

    multiplexer = plugin_event_multiplexer.EventMultiplexer()
    multiplexer.AddRunsFromDirectory(str(logdir))
    multiplexer.Reload()
    context = backend_context.Context(base_plugin.TBContext(
        data_provider=data_provider.MultiplexerDataProvider(multiplexer, str(logdir)), logdir=str(logdir)))
    request = api_pb2.ListSessionGroupsRequest(allowed_statuses=list(api_pb2.Status.values()), slice_size=10**6)
    response = list_session_groups.Handler(RequestContext(), context, "", request).run()
    value = lambda v: v.string_value if v.WhichOneof("kind") == "string_value" else v.number_value
    view = {}
    for group in response.session_groups:
        (session,) = group.sessions  # one run per row
        view[session.name] = ({k: value(v) for k, v in group.hparams.items()},
                              {m.name.tag: m.value for m in session.metric_values})
    return view


def hparams_written(folder):
    """How many times the run folder's event files hold the run's hparams (a session start)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
    from tensorboard.plugins.hparams.metadata import SESSION_START_INFO_TAG

    return sum(value.tag == SESSION_START_INFO_TAG for path in sorted((folder / "tb").glob("*tfevents*"))
               for event in EventFileLoader(str(path)).Load() for value in event.summary.value)


def test_tensorboard_hparams_view_lists_each_run_by_its_cell(world, tmp_path):
    # A teacher, a two-phase distillation, its stage-2 student and a softmax reference under one logdir:
    # one row each in the HParams view, its hparams the run's cell (the fields that apply), its metrics
    # the run's own scalars.
    import shutil

    results = tmp_path / "results"
    shutil.copytree(world / "teacher" / "tb", results / "teacher" / "tb")
    distilled, student, reference = results / "distill", results / "student", results / "reference"
    run_distill(CONFIG, "synthetic", "micro", "elu", "mohawk", "mohawk", 0, world / "teacher", world / "synthetic",
                distilled)
    run_student(CONFIG, "synthetic", "micro", "elu", "mohawk", 0, world / "teacher", world / "synthetic", student,
                distilled_dir=distilled, design="mohawk", budget=2)
    run_student(CONFIG, "synthetic", "micro", "softmax", "reference", 0, world / "teacher", world / "synthetic",
                reference, budget=2)
    view = hparams_view(results)
    cell = {"dataset": "synthetic", "size": "micro", "seed": 0}
    assert {name: hparams for name, (hparams, _) in view.items()} == {
        "teacher/tb": {"rule": "teacher", "variant": "softmax", **cell},
        "distill/tb": {"rule": "distill", "variant": "elu", "init": "mohawk", "design": "mohawk", **cell},
        "student/tb": {"rule": "student", "variant": "elu", "init": "mohawk", "design": "mohawk", "budget": 2, **cell},
        "reference/tb": {"rule": "reference", "variant": "softmax", "init": "reference", "design": "none", "budget": 2,
                         **cell}}
    for name, run in (("teacher", world / "teacher"), ("student", student), ("reference", reference)):
        metrics = json.loads((run / "metrics.json").read_text())
        assert view[f"{name}/tb"][1]["eval/test_acc"] == pytest.approx(metrics["test_acc"]), name
    assert view["distill/tb"][1]["eval/distill_loss"] == pytest.approx(
        json.loads((distilled / "metrics.json").read_text())["distill_loss"])
    # The second phase continues the first's events: the hparams once, as in every other run.
    assert [hparams_written(run) for run in (distilled, student, reference)] == [1, 1, 1]


def test_every_run_writes_its_curves_and_its_evaluation_for_tensorboard(world, tmp_path):
    # The teacher of the module's world: loss, learning rate and images/s at its logged step (the 4th
    # and last), its final test accuracy.
    teacher = events(world / "teacher")
    log = [json.loads(line) for line in (world / "teacher" / "train.jsonl").read_text().splitlines()]
    train = [r for r in log if r["kind"] == "train"]
    assert {"train/loss", "train/lr", "train/images_per_s", "eval/test_acc"} <= set(teacher.Tags()["scalars"])
    assert [(e.step, e.value) for e in teacher.Scalars("train/loss")] == [
        (r["step"], pytest.approx(r["loss"], rel=1e-6)) for r in train]
    assert [e.value for e in teacher.Scalars("train/lr")] == pytest.approx([r["lr"] for r in train], abs=1e-9)
    assert all(e.value > 0 for e in teacher.Scalars("train/images_per_s"))
    metrics = json.loads((world / "teacher" / "metrics.json").read_text())
    assert teacher.Scalars("eval/test_acc")[-1].value == pytest.approx(metrics["test_acc"])
    # A student, then its evaluation: the fidelity per block joins the student's events at its last step.
    student = tmp_path / "s"
    run_student(CONFIG, "synthetic", "micro", "elu", "deit_kd", 0, world / "teacher", world / "synthetic",
                student, budget=2)
    run_evaluate(CONFIG, student, world / "teacher", world / "synthetic", student / "eval.json")
    evaluation = json.loads((student / "eval.json").read_text())
    got = events(student)
    for metric in ("kl", "js", "corr"):
        per_block = evaluation[f"fidelity_{metric}"]
        assert len(per_block) == 4
        for block, value in enumerate(per_block):
            (event,) = got.Scalars(f"fidelity/{metric}/block{block}")
            assert (event.step, event.value) == (2, pytest.approx(value, rel=1e-5, abs=1e-9))
        assert got.Scalars(f"fidelity/{metric}_mean")[0].value == pytest.approx(evaluation[f"fidelity_{metric}_mean"],
                                                                                rel=1e-5, abs=1e-9)
    assert got.Scalars("eval/throughput_img_s")[0].value == pytest.approx(evaluation["throughput_img_s"], rel=1e-5)
    assert [e.step for e in got.Scalars("train/loss")] == [2]
    # An evaluation run again replaces its own events, leaving the training's.
    run_evaluate(CONFIG, student, world / "teacher", world / "synthetic", student / "eval.json")
    assert len(events(student).Scalars("fidelity/kl/block0")) == 1
    assert len(list((student / "tb").glob("*.evaluate"))) == 1


def test_a_failing_event_writer_ends_the_events_not_the_run(tmp_path, monkeypatch, capsys):
    from torch.utils.tensorboard import SummaryWriter

    from linvit.events import RunEvents

    events = RunEvents(tmp_path / "tb", batch_size=4, resumed=False)
    events.train(1, 1.0, 1e-3, 0.1)

    def full_disk(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(SummaryWriter, "add_scalar", full_disk)
    events.train(2, 0.9, 1e-3, 0.2)
    events.evaluation(2, {"test_acc": 0.5})  # nothing more is tried
    events.flush()
    events.close()
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"TensorBoard events in {tmp_path / 'tb'} stopped" in err
    assert "No space left on device" in err
