def shards_config(dataset):
    """The dataset's entry without what the models see of it (transform, labels): editing an
    augmentation reruns the training jobs, never the (possibly hours-long) sharding."""
    spec = {k: v for k, v in config["datasets"][dataset].items() if k not in ("transform", "labels")}
    return json.dumps({"datasets": {dataset: spec}, **({"shards": config["shards"]} if "shards" in config else {})},
                      sort_keys=True)


# Webdataset shards of one dataset. The number of shards depends on the dataset's size, so the
# folder is the output (directory()): every rule that reads shards takes the folder as input.
rule shards:
    output:
        directory(SHARDS),
    params:
        cfg=lambda wc: shards_config(wc.dataset),
    log:
        grid.log_path("shards", "{dataset}"),
    threads: res("shards", "threads", 1)
    resources:
        mem_mb=res("shards", "mem_mb", 4000),
        runtime=res("shards", "runtime", 30),
    shell:
        "linvit shards --config-json {params.cfg:q} --dataset {wildcards.dataset} --out {output:q}"
        " --workers {threads} > {log:q} 2>&1"
