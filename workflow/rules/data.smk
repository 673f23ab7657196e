# Webdataset shards of one dataset. The number of shards depends on the dataset's size, so the
# folder is the output (directory()): every rule that reads shards takes the folder as input.
rule shards:
    output:
        directory(SHARDS),
    params:
        cfg=planned(lambda wc: shards_config(wc.dataset)),
    log:
        grid.log_path("shards", "{dataset}"),
    threads: res("shards", "threads", 1)
    resources:
        mem_mb=res("shards", "mem_mb", 4000),
        runtime=res("shards", "runtime", 30),
    shell:
        "linvit shards --config-json {params.cfg:q} --dataset {wildcards.dataset} --out {output:q}"
        " --workers {threads} > {log:q} 2>&1"
