# The softmax teacher, pretrained on config.teacher.dataset; every student starts from it.
rule teacher:
    input:
        shards(TEACHER_DATASET),
    output:
        "results/teacher/{size}/metrics.json",
        "results/teacher/{size}/model.safetensors",
    params:
        cfg=lambda wc: job_config("teacher"),
        seed=TEACHER_SEED,
    log:
        "results/logs/teacher/{size}.log",
    threads: res("teacher", "threads", 2)
    resources:
        mem_mb=res("teacher", "mem_mb", 4000),
        runtime=res("teacher", "runtime", 60),
    shell:
        "linvit teacher --config-json {params.cfg:q} --size {wildcards.size} --seed {params.seed}"
        " --shards results/data/{TEACHER_DATASET} --out results/teacher/{wildcards.size}"
        " --threads {threads} > {log} 2>&1"
