rule evaluate:
    input:
        run="results/students/{dataset}/{size}/{variant}/{init}/seed{seed}/metrics.json",
        teacher=lambda wc: teacher(wc.size),
        shards=lambda wc: shards(wc.dataset),
    output:
        "results/students/{dataset}/{size}/{variant}/{init}/seed{seed}/eval.json",
    wildcard_constraints:
        variant=_alternatives(list(config["variants"]) + ["softmax"]),
        init=_alternatives(list(config["init_strategies"]) + ["reference"]),
    params:
        cfg=job_config("evaluation") if "evaluation" in config else "{}",
        run=lambda wc, input: os.path.dirname(input.run),
    log:
        "results/logs/evaluate/{dataset}/{size}/{variant}/{init}/seed{seed}.log",
    threads: res("evaluate", "threads", 1)
    resources:
        mem_mb=res("evaluate", "mem_mb", 4000),
        runtime=res("evaluate", "runtime", 30),
    shell:
        "linvit evaluate --config-json {params.cfg:q} --run {params.run} --teacher results/teacher/{wildcards.size}"
        " --shards results/data/{wildcards.dataset} --out {output} --threads {threads} > {log} 2>&1"
