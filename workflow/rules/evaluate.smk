# Attention fidelity, parameters and throughput of one trained model (a student or the reference).
rule evaluate:
    input:
        unpack(teacher_model),
        shards=SHARDS,
        run_metrics=f"{RUN}/metrics.json",
        run_json=f"{RUN}/model.json",
        run_weights=f"{RUN}/model.safetensors",
    output:
        f"{RUN}/eval.json",
    wildcard_constraints:
        # Students (softmax control students included, when `variants` lists softmax) and the
        # reference (variant softmax, init reference: its init is what tells it apart).
        variant=_alternatives(dict.fromkeys([*config["variants"], grid.REFERENCE_VARIANT])),
        init=_alternatives([*config["init_strategies"], grid.REFERENCE_INIT]),
    params:
        cfg=planned(lambda wc: job_config("evaluation", "runtime", *input_keys(wc.dataset))),
        run=in_folder("run_metrics"),  # from the input (Snakemake's lint: a param that spells an input's path)
        teacher=in_folder("teacher_json"),  # the teacher this seed copies from (grid.teacher_of)
    log:
        grid.log_path("evaluate", RUN_KEY),
    benchmark:
        grid.benchmark_path("evaluate", RUN_KEY)
    threads: res("evaluate", "threads", 1)
    resources:
        mem_mb=res("evaluate", "mem_mb", 4000),
        runtime=res("evaluate", "runtime", 30),
        gpu=res("evaluate", "gpu", 0),
    shell:
        "linvit evaluate --config-json {params.cfg:q} --run {params.run:q} --teacher {params.teacher:q}"
        " --shards {input.shards:q} --out {output:q} --threads {threads} > {log:q} 2>&1"
