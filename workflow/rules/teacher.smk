# The softmax teacher, pretrained on config.teacher.dataset; every student starts from it.
rule teacher:
    input:
        shards=grid.shards_dir(TEACHER_DATASET),
    output:
        **files(TEACHER, grid.MODEL_FILES),
    params:
        cfg=job_config("teacher", "runtime"),
        seed=TEACHER_SEED,
        out=out_folder,
        launch=launcher,
        threads=rank_threads,
    log:
        grid.log_path("teacher", "{size}"),
    benchmark:
        grid.benchmark_path("teacher", "{size}")
    threads: res("teacher", "threads", 2)
    resources:
        mem_mb=res("teacher", "mem_mb", 4000),
        runtime=res("teacher", "runtime", 60),
        gpu=res("teacher", "gpu", 0),
    shell:
        "{params.launch} linvit teacher --config-json {params.cfg:q} --size {wildcards.size} --seed {params.seed}"
        " --shards {input.shards:q} --out {params.out:q} --threads {params.threads} > {log:q} 2>&1"
