# The softmax teachers the students start from: trained here on config.teacher.dataset (rule
# teacher, the sizes of linvit.sizes; one per student seed by default, or the one `teacher.seed`
# names: linvit.config.teacher_design), or loaded from timm's hub, its cache or a file (rule
# teacher_pretrained, the names under config.teachers).
rule teacher:
    input:
        shards=grid.shards_dir(TEACHER.get("dataset", "")),
    output:
        **files(TEACHER_DIR, grid.MODEL_FILES),
    wildcard_constraints:
        size=_alternatives(TRAINED_SIZES),
    params:
        cfg=job_config("teacher", "runtime", *input_keys(TEACHER.get("dataset", ""))),
        out=TEACHER_DIR,
        launch=launcher,
        threads=rank_threads,
    log:
        grid.log_path("teacher", TEACHER_KEY),
    benchmark:
        grid.benchmark_path("teacher", TEACHER_KEY)
    threads: res("teacher", "threads", 2)
    resources:
        mem_mb=res("teacher", "mem_mb", 4000),
        runtime=res("teacher", "runtime", 60),
        gpu=res("teacher", "gpu", 0),
    shell:
        "{params.launch} linvit teacher --config-json {params.cfg:q} --size {wildcards.size} --seed {wildcards.seed}"
        " --shards {input.shards:q} --out {params.out:q} --threads {params.threads} > {log:q} 2>&1"


# A pretrained teacher: weights from a file (an input, so a new file reruns it) or timm's hub/cache.
rule teacher_pretrained:
    input:
        unpack(teacher_file),
    output:
        **files(PRETRAINED_DIR, grid.PRETRAINED_FILES),
    wildcard_constraints:
        size=_alternatives(CHECKPOINT_SIZES),
    params:
        cfg=checkpoint_config,
        out=PRETRAINED_DIR,
        seed="",  # one checkpoint: no seed picks it (teacher_replicate passes --seed)
    log:
        grid.log_path("teacher", "{size}"),
    benchmark:
        grid.benchmark_path("teacher", "{size}")
    threads: 1
    resources:
        mem_mb=res("teacher", "mem_mb", 4000),
        runtime=res("teacher", "runtime", 60),
    shell:
        "linvit teacher --config-json {params.cfg:q} --size {wildcards.size} {params.seed}"
        " --out {params.out:q} > {log:q} 2>&1"


# One of several pretrained checkpoints of a size (teachers.<size>.replicates), the one student seed
# `seed` copies from: a teacher per seed, as the trained ones, in their folder layout.
use rule teacher_pretrained as teacher_replicate with:
    output:
        **files(TEACHER_DIR, grid.PRETRAINED_FILES),
    wildcard_constraints:
        size=_alternatives(REPLICATED_SIZES),
    params:
        out=TEACHER_DIR,
        seed="--seed {seed}",
    log:
        grid.log_path("teacher", TEACHER_KEY),
    benchmark:
        grid.benchmark_path("teacher", TEACHER_KEY)
