# Distillation (stage 1: one per dataset x size x variant x init x design x seed, shared by every
# budget), the softmax reference, and the students (stage 2, one per budget): linear ones, and softmax
# ones when `variants` lists softmax (the control). A stage-2 job also evaluates the model it trained
# (eval.json: attention fidelity, parameters, throughput; `linvit evaluate` does it again by hand),
# so no second process reloads torch, the model, the teacher and the test split. Each writes a
# folder: its declared outputs are the files of grid.DISTILL_FILES / grid.STUDENT_FILES (the
# checkpoint/ it resumes from is internal).
rule distill:
    input:
        unpack(teacher_model),
        shards=SHARDS,
    output:
        **files(DISTILL, grid.DISTILL_FILES),
    params:
        # evaluation: the probe batch is evaluation.fidelity_samples test images.
        cfg=planned(lambda wc: job_config("distill", f"distill_designs.{wc.design}", f"init_strategies.{wc.init}",
                                          "evaluation", "runtime", *input_keys(wc.dataset))),
        # Strings with wildcards, not functions: Snakemake formats them without inspecting a
        # callable per job (planning time grows with the number of callables per job).
        teacher=in_folder("teacher_json"),  # the teacher this seed copies from (grid.teacher_of)
        out=DISTILL,
        launch=launcher,
        threads=rank_threads,
    log:
        grid.log_path("distill", DISTILL_KEY),
    benchmark:
        grid.benchmark_path("distill", DISTILL_KEY)
    threads: res("distill", "threads", 1)
    resources:
        mem_mb=res("distill", "mem_mb", 4000),
        runtime=res("distill", "runtime", 60),
        gpu=res("distill", "gpu", 0),
    shell:
        "{params.launch} linvit distill --config-json {params.cfg:q} --dataset {wildcards.dataset} --size {wildcards.size}"
        " --variant {wildcards.variant} --init {wildcards.init} --design {wildcards.design} --seed {wildcards.seed}"
        " --teacher {params.teacher:q} --shards {input.shards:q} --out {params.out:q} --threads {params.threads}"
        " > {log:q} 2>&1"


# The softmax reference: the teacher trained on the target with the students' budget. Its path is
# spelled with init `reference` (grid.REFERENCE_INIT), which is what tells it apart from a softmax
# control student's (`softmax` in `variants`; rule student, init one of init_strategies, which never
# names `reference`: linvit.config refuses that name), so no path matches both rules.
rule reference:
    input:
        unpack(teacher_model),
        shards=SHARDS,
    output:
        **files(REFERENCE, grid.STUDENT_FILES),
    params:
        cfg=planned(lambda wc: job_config("student", "evaluation", "runtime", *input_keys(wc.dataset))),
        variant=grid.REFERENCE_VARIANT,
        init=grid.REFERENCE_INIT,
        teacher=in_folder("teacher_json"),  # the teacher this seed copies from (grid.teacher_of)
        out=REFERENCE,
        launch=launcher,
        threads=rank_threads,
    log:
        grid.log_path("students", REFERENCE_KEY),
    benchmark:
        grid.benchmark_path("students", REFERENCE_KEY)
    threads: res("student", "threads", 1)
    resources:
        mem_mb=res("student", "mem_mb", 4000),
        runtime=res("student", "runtime", 60),
        gpu=res("student", "gpu", 0),
    shell:
        "{params.launch} linvit student --config-json {params.cfg:q} --dataset {wildcards.dataset} --size {wildcards.size}"
        " --variant {params.variant} --init {params.init} --seed {wildcards.seed} --budget {wildcards.budget}"
        " --teacher {params.teacher:q}"
        " --shards {input.shards:q} --out {params.out:q} --threads {params.threads} > {log:q} 2>&1"


rule student:
    input:
        unpack(student_inputs),
    output:
        **files(RUN, grid.STUDENT_FILES),
    params:
        cfg=planned(lambda wc: job_config("student", f"init_strategies.{wc.init}", "evaluation", "runtime",
                                          *input_keys(wc.dataset))),
        teacher=in_folder("teacher_json"),  # the teacher this seed copies from (grid.teacher_of)
        distilled=distilled_option,
        out=RUN,
        launch=launcher,
        threads=rank_threads,
    log:
        grid.log_path("students", RUN_KEY),
    benchmark:
        grid.benchmark_path("students", RUN_KEY)
    threads: res("student", "threads", 1)
    resources:
        mem_mb=res("student", "mem_mb", 4000),
        runtime=res("student", "runtime", 60),
        gpu=res("student", "gpu", 0),
    shell:
        "{params.launch} linvit student --config-json {params.cfg:q} --dataset {wildcards.dataset} --size {wildcards.size}"
        " --variant {wildcards.variant} --init {wildcards.init} --design {wildcards.design} --seed {wildcards.seed}"
        " --budget {wildcards.budget} --teacher {params.teacher:q} --shards {input.shards:q}"
        " --out {params.out:q} {params.distilled} --threads {params.threads} > {log:q} 2>&1"
