rule shards:
    output:
        "results/data/{dataset}/_info.json",
    params:
        cfg=lambda wc: job_config(f"datasets.{wc.dataset}", "shards"),
    log:
        "results/logs/shards/{dataset}.log",
    threads: res("shards", "threads", 1)
    resources:
        mem_mb=res("shards", "mem_mb", 4000),
        runtime=res("shards", "runtime", 30),
    shell:
        "linvit shards --config-json {params.cfg:q} --dataset {wildcards.dataset}"
        " --out results/data/{wildcards.dataset} > {log} 2>&1"
