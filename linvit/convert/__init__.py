"""`linvit convert`: one pretrained softmax timm ViT in, one linear-attention timm checkpoint out.

The pipeline's own steps (linvit.steps), run in order in subfolders of --out, each skipped when its
metrics.json exists (a rerun resumes; a killed training step resumes from its own checkpoint):

    teacher/    the teacher loaded from a timm name or a weights file (run_teacher's `teachers:` path);
                a harness teacher folder (with model.json) is used where it is
    reference/  only when the target's labels are not the teacher's: the softmax reference (the
                teacher trained on the target with the student's budget), what the student is compared with
    distill/    stage 1, when the init strategy distills: the student as the strategy initializes it,
                trained by the distillation design (run_distill)
    student/    stage 2: the student trained on the target for --steps (run_student)
    evaluate/   accuracy on the target's test split of the exported checkpoint (loaded back through
                timm) and of the teacher or reference; latency and peak memory of both

Then --out/model.safetensors and --out/config.json (linvit.teachers.save_timm_checkpoint), which
`timm.create_model("linvit_<size>_<variant>", pretrained=True, pretrained_cfg_overlay=...)` loads
after `import linvit.models`, and summary.json / summary.md saying what was copied, distilled and
measured, with the exact call. Everything that can be refused (a teacher that does not exist, does not
match the requested student, or cannot fit the dataset; unknown names) is refused in one line before
any training. See docs/convert.md.

The rooms, in the order a conversion passes through them:

    command.py   the command line: arguments, `add_parser` for linvit.cli, `main`
    request.py   the request and its checks: the config, budgets, variant and design; request.json
                 (what --out was made with) and the steps' metrics.json already in --out
    teacher.py   the teacher: where it comes from, its architecture on the meta device, the student
                 size its shape is, the student timm builds from it
    pipeline.py  `convert`: every check first, then the stages in order
    export.py    the timm checkpoint: written, loaded back, the timm.create_model call that loads it
    measure.py   accuracy, latency and peak memory of the converted model and its baseline
    summary.py   the migration summary: summary.json, summary.md, the closing lines

torch is imported lazily (only when the command runs).
"""

from .command import add_parser, main
from .export import load_converted
from .pipeline import convert
from .request import ConvertError

__all__ = ["add_parser", "main", "convert", "load_converted", "ConvertError"]
