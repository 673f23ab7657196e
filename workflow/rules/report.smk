# Aggregate results/ into results/{runs,curves}.csv and report/ (the files of linvit.grid.report_files).
# `report_from_results` does the same from whatever results/ holds, without (re)training anything:
# use it after --keep-going left gaps.
REPORT_CFG = job_config("targets", "sizes", "variants", "inits", "seeds", "budgets", "distills", "distill_designs",
                        "distill.loss", "student.train.steps", "teacher", "teachers", "datasets", "init_strategies",
                        "claims")


rule report:
    input:
        report_inputs,
    output:
        grid.report_files(WITH_BENCHMARK),
    params:
        cfg=REPORT_CFG,
        report=lambda wc, output: os.path.dirname(output[0]),  # report/README.md
        results=lambda wc, output: os.path.dirname(output[-1]),  # results/curves.csv
    log:
        grid.log_path("report", "all"),
    threads: 1
    resources:
        mem_mb=res("report", "mem_mb", 2000),
        runtime=res("report", "runtime", 10),
    shell:
        "linvit report --config-json {params.cfg:q} --results {params.results:q} --out {params.report:q}"
        " > {log:q} 2>&1"


# No inputs and no outputs on purpose: a rule without outputs runs every time it is named, whatever
# results/ holds, and its files are the `report` rule's outputs (two rules declaring them would be
# ambiguous).
rule report_from_results:
    params:
        cfg=REPORT_CFG,
        results=grid.RESULTS,
        report=grid.REPORT,
    log:
        grid.log_path("report", "from_results"),
    shell:
        "linvit report --config-json {params.cfg:q} --results {params.results:q} --out {params.report:q}"
        " 2>&1 | tee {log:q}"


onerror:
    # A failed cell (under --keep-going) still leaves a report that lists it as missing, and why.
    if any(cell.run_dir().joinpath("eval.json").exists() for cell in CELLS):
        import subprocess

        partial = grid.log_path("report", "partial")
        os.makedirs(os.path.dirname(partial), exist_ok=True)
        with open(partial, "w") as partial_log:
            subprocess.run(["linvit", "report", "--config-json", REPORT_CFG, "--results", grid.RESULTS,
                            "--out", grid.REPORT], stdout=partial_log, stderr=subprocess.STDOUT)


# The operator benchmark (not part of `all`: it should run on an otherwise idle machine, so it takes
# every core). `snakemake benchmark`, then `snakemake` adds the report's scaling section.
rule benchmark:
    output:
        grid.operator_benchmark_path(),
    log:
        grid.log_path("benchmark", "attention"),
    # Read when the job is planned, not when the Snakefile is parsed: a cluster run (--profile slurm)
    # has no --cores unless given, and must still parse; `snakemake --profile slurm --cores 16
    # benchmark` submits it with 16 CPUs.
    threads: lambda wildcards: workflow.cores
    shell:
        "linvit benchmark --out {output:q} --threads {threads} 2> {log:q}"
