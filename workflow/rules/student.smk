# Distillation (one per dataset x size x variant x seed, shared by every distilling strategy),
# the softmax reference, and the linear students.
rule distill:
    input:
        shards=lambda wc: shards(wc.dataset),
        teacher=lambda wc: teacher(wc.size),
    output:
        "results/distill/{dataset}/{size}/{variant}/seed{seed}/metrics.json",
        "results/distill/{dataset}/{size}/{variant}/seed{seed}/attention.safetensors",
    params:
        cfg=job_config("distill"),
        out=lambda wc, output: os.path.dirname(output[0]),
    log:
        "results/logs/distill/{dataset}/{size}/{variant}/seed{seed}.log",
    threads: res("distill", "threads", 1)
    resources:
        mem_mb=res("distill", "mem_mb", 4000),
        runtime=res("distill", "runtime", 60),
    shell:
        "linvit distill --config-json {params.cfg:q} --dataset {wildcards.dataset} --size {wildcards.size}"
        " --variant {wildcards.variant} --seed {wildcards.seed} --teacher results/teacher/{wildcards.size}"
        " --shards results/data/{wildcards.dataset} --out {params.out} --threads {threads} > {log} 2>&1"


rule reference:
    input:
        shards=lambda wc: shards(wc.dataset),
        teacher=lambda wc: teacher(wc.size),
    output:
        "results/students/{dataset}/{size}/softmax/reference/seed{seed}/metrics.json",
    params:
        cfg=job_config("student"),
        out=lambda wc, output: os.path.dirname(output[0]),
    log:
        "results/logs/students/{dataset}/{size}/softmax/reference/seed{seed}.log",
    threads: res("student", "threads", 1)
    resources:
        mem_mb=res("student", "mem_mb", 4000),
        runtime=res("student", "runtime", 60),
    shell:
        "linvit student --config-json {params.cfg:q} --dataset {wildcards.dataset} --size {wildcards.size}"
        " --variant softmax --init reference --seed {wildcards.seed} --teacher results/teacher/{wildcards.size}"
        " --shards results/data/{wildcards.dataset} --out {params.out} --threads {threads} > {log} 2>&1"


def student_inputs(wc):
    inputs = {"shards": shards(wc.dataset), "teacher": teacher(wc.size)}
    if strategy(wc.init)["distill"]:
        inputs["distilled"] = distilled(wc.dataset, wc.size, wc.variant, wc.seed)
    return inputs


rule student:
    input:
        unpack(student_inputs),
    output:
        "results/students/{dataset}/{size}/{variant}/{init}/seed{seed}/metrics.json",
    params:
        cfg=lambda wc: job_config("student", f"init_strategies.{wc.init}"),
        out=lambda wc, output: os.path.dirname(output[0]),
        distilled=lambda wc, input: (f"--distilled {os.path.dirname(input.distilled)}"
                                     if "distilled" in input.keys() else ""),
    log:
        "results/logs/students/{dataset}/{size}/{variant}/{init}/seed{seed}.log",
    threads: res("student", "threads", 1)
    resources:
        mem_mb=res("student", "mem_mb", 4000),
        runtime=res("student", "runtime", 60),
    shell:
        "linvit student --config-json {params.cfg:q} --dataset {wildcards.dataset} --size {wildcards.size}"
        " --variant {wildcards.variant} --init {wildcards.init} --seed {wildcards.seed}"
        " --teacher results/teacher/{wildcards.size} --shards results/data/{wildcards.dataset}"
        " --out {params.out} {params.distilled} --threads {threads} > {log} 2>&1"
