"""The migration summary: summary.json and summary.md in --out (what was copied from the teacher,
distilled, trained and measured, with the exact timm call that loads the checkpoint), and the lines
the command closes with."""

from __future__ import annotations

from .request import done
from .teacher import shape_of, shape_text


def write_summary(job, call: dict, evaluation: dict) -> dict:
    """summary.json and summary.md of the conversion `job` (pipeline._Conversion), from the steps'
    metrics, the timm call and the evaluation's metrics; returns the summary."""
    from ..io import read_json, write_json, write_text

    out, teacher, request = job.out, job.teacher, job.request
    student = read_json(out / "student" / "metrics.json", what="student metrics")
    distill = done(out / "distill") if request["design"] != "none" else None
    copied = {g: int(n) for g, n in (student.get("copied") or {}).items()}
    conv, base = evaluation["converted"], evaluation["baseline"]
    summary = {
        "out": str(out),
        "timm": {**call, "local_dir": f"timm.create_model('local-dir:{out}', pretrained=True)  "
                                      f"# after import linvit.models"},
        "teacher": {"source": teacher["kind"], "model": teacher["arch"]["timm_model"],
                    "model_args": teacher["arch"].get("model_args", {}), "given": str(request["teacher"]),
                    "folder": str(job.teacher_dir), "shape": shape_of(teacher["meta"])},
        "student": {"model": call["model_name"], "size": request["size"], "variant": request["variant"],
                    "init": request["init"], "design": request["design"], "seed": request["seed"],
                    "params": conv["params"], "params_by_group": conv["params_by_group"]},
        "copied": {"strategy_groups": list(job.strategy.get("copy", [])), "groups": copied,
                   "params": sum(copied.values()), "of_params": conv["params"],
                   "head_copied": bool(student.get("head_copied"))},
        "distilled": None if distill is None else {
            "design": request["design"], "loss": distill.get("loss"), "losses": distill.get("losses"),
            "steps": distill.get("steps"), "phase_steps": distill.get("phase_steps"),
            "final_loss": distill.get("final_loss"), "probe_loss": distill.get("distill_loss"),
            "probe_loss_per_term": distill.get("distill_terms"),
            "probe_samples": distill.get("probe_samples"), "train_time_s": distill.get("train_time_s")},
        "trained": {"dataset": request["dataset"], "steps": student.get("steps"),
                    "train_time_s": student.get("train_time_s"), "final_loss": student.get("final_loss"),
                    "test_acc_at_end_of_training": student.get("test_acc"),
                    "train_losses": student.get("train_losses") or [], "task_weight": student.get("task_weight", 1.0),
                    "logit_teacher": "reference" if student.get("kd_teacher") else (
                        "teacher" if student.get("train_losses") else None)},
        "accuracy": {"dataset": request["dataset"], "split": "test", "samples": evaluation["test_samples"],
                     "precision": evaluation["accuracy_precision"], "images": evaluation["pipeline"],
                     "converted": conv["test_acc"], "baseline": base["role"], "baseline_acc": base["test_acc"],
                     "baseline_note": base["note"], "teacher": base["test_acc"] if base["role"] == "teacher" else None,
                     "same_labels": job.same_labels},
        "device": evaluation["device"], "precision": evaluation["precision"],
        "memory_method": evaluation["memory_method"], "speed": evaluation["speed"],
    }
    write_json(out / "summary.json", summary)
    write_text(out / "summary.md", _markdown(summary))
    return summary


def _fmt(value, digits=4) -> str:
    if value is None:
        return "-"
    return f"{value:.{digits}f}" if isinstance(value, float) else str(value)


def _terms_text(terms: list | None) -> str:
    """A design's loss terms in words: 'proj_mse' or, with several phases, 'phase 1: ...; phase 2: ...'."""
    if not terms:
        return ""
    phases: dict[int, list[str]] = {}
    for t in terms:
        options = ", ".join(f"{k} {v}" for k, v in t.items() if k not in ("loss", "weight", "phase"))
        text = t["loss"] + ("" if t.get("weight", 1) == 1 else f" x {t['weight']}") + (f" ({options})" if options else "")
        phases.setdefault(int(t.get("phase", 0)), []).append(text)
    if len(phases) == 1:
        return " + ".join(next(iter(phases.values())))
    return "; ".join(f"phase {p + 1}: {' + '.join(ts)}" for p, ts in sorted(phases.items()))


def _markdown(s: dict) -> str:
    t, st, c, d, a = s["teacher"], s["student"], s["copied"], s["distilled"], s["accuracy"]
    lines = [f"# Conversion: {t['model']} -> {st['model']}", "",
             f"Teacher: {t['model']} ({t['source']}: {t['given']}), {shape_text(t['shape'])}.",
             f"Student: {st['model']} ({st['params']:,} parameters), init `{st['init']}`, "
             f"design `{st['design']}`, seed {st['seed']}.", "", "## Load it", "", "```python", s["timm"]["code"],
             "```", "", f"or `{s['timm']['local_dir']}`.", "", "## Copied from the teacher", "",
             "| group | parameters copied | student parameters |", "| --- | ---: | ---: |"]
    for g, n in st["params_by_group"].items():
        lines.append(f"| {g} | {c['groups'].get(g, 0):,} | {n:,} |")
    lines += [f"| **all** | **{c['params']:,}** | **{c['of_params']:,}** |", "",
              f"Strategy groups: {', '.join(c['strategy_groups']) or 'none'}; the head "
              f"{'was copied' if c['head_copied'] else 'was not copied (a new head for the target, or not in the strategy)'}.",
              "", "## Distilled", ""]
    if d is None:
        lines.append("Nothing: the init strategy does not distill.")
    else:
        losses = _terms_text(d.get("losses")) or d.get("loss")
        lines.append(f"Design `{d['design']}` (losses: {losses}), {d['steps']} steps"
                     + (f" in phases {d['phase_steps']}" if d.get("phase_steps") and len(d["phase_steps"]) > 1 else "")
                     + f", {_fmt(d['train_time_s'], 1)} s; last training loss {_fmt(d['final_loss'], 5)}, loss on "
                       f"{d['probe_samples']} probe test images {_fmt(d['probe_loss'], 5)}.")
    tr = s["trained"]
    extra = ""
    if tr["train_losses"]:
        extra = (f" Loss: {tr['task_weight']:g} x cross-entropy + {_terms_text(tr['train_losses'])}"
                 + (" (logits from the softmax reference)" if tr["logit_teacher"] == "reference" else "") + ".")
    lines += ["", "## Trained", "", f"{tr['steps']} steps on `{tr['dataset']}` in {_fmt(tr['train_time_s'], 1)} s "
              f"(last loss {_fmt(tr['final_loss'])}).{extra}", "",
              f"## Accuracy on `{a['dataset']}`'s test split ({a['samples']} images, {a['precision']})", "",
              "| model | top-1 |", "| --- | ---: |",
              f"| converted ({st['model']}, loaded through timm as above) | {_fmt(a['converted'])} |",
              f"| {a['baseline']} | {_fmt(a['baseline_acc'])} |", "",
              f"The {a['baseline']} is {a['baseline_note']}. Images: {a['images']}.", "",
              f"## Latency and peak memory on {s['device']} ({s['precision']})", "",
              "| model | resolution | tokens | batch | ms / image | peak forward MiB | note |",
              "| --- | --- | ---: | ---: | ---: | ---: | --- |"]
    for r in s["speed"]:
        size = "x".join(map(str, r["image_size"]))
        if "skipped" in r:
            lines.append(f"| {r['model']} | {size} | {r['tokens']} | {r['batch']} | - | - | skipped: {r['skipped']} |")
        else:
            lines.append(f"| {r['model']} | {size} | {r['tokens']} | {r['batch']} | {_fmt(r['ms_per_image'], 3)} "
                         f"| {_fmt(r.get('peak_mib'), 2)} | {r.get('note', '')} |")
    lines += ["", f"Peak memory: {s['memory_method']}.", "",
              "At twice the side (4x the patch tokens) the position embeddings are resampled with timm's "
              "resample_abs_pos_embed (linvit.teachers.adapt).", ""]
    return "\n".join(lines)


def closing_lines(s: dict) -> list[str]:
    a = s["accuracy"]
    lines = [f"converted {s['teacher']['model']} -> {s['student']['model']}: test accuracy {a['converted']:.4f} "
             f"on {a['dataset']!r}, {a['baseline']} {a['baseline_acc']:.4f}"
             + ("" if a["baseline"] == "teacher" else " (the teacher's head does not apply to these labels)")]
    native = {(r["model"], r["batch"]): r for r in s["speed"] if r["resolution"] == "native" and "ms_per_image" in r}
    big = max((b for _, b in native), default=None)
    if big is not None and ("converted", big) in native and ("baseline", big) in native:
        lines.append(f"latency at batch {big} on {s['device']}: {native[('converted', big)]['ms_per_image']:.3f} "
                     f"ms/image, {a['baseline']} {native[('baseline', big)]['ms_per_image']:.3f}")
    lines += ["load it with:", *("    " + x for x in s["timm"]["code"].splitlines()),
              f"wrote {s['out']}/model.safetensors, config.json, summary.json, summary.md"]
    return lines
