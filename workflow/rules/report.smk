# Aggregate results/ into results/runs.csv and report/. `report_from_results` does the same from
# whatever results/ holds, without (re)training anything: use it after --keep-going left gaps.
REPORT_CFG = job_config("targets", "sizes", "variants", "inits", "seeds", "teacher", "init_strategies",
                        *(["claims"] if "claims" in config else []))


rule report:
    input:
        [cell.run_dir() / "eval.json" for cell in CELLS],
    output:
        "report/README.md",
        "results/runs.csv",
    params:
        cfg=REPORT_CFG,
    log:
        "results/logs/report.log",
    threads: 1
    resources:
        mem_mb=res("report", "mem_mb", 2000),
        runtime=res("report", "runtime", 10),
    shell:
        "linvit report --config-json {params.cfg:q} --results results --out report > {log} 2>&1"


rule report_from_results:
    params:
        cfg=REPORT_CFG,
    log:
        "results/logs/report_from_results.log",
    shell:
        "linvit report --config-json {params.cfg:q} --results results --out report 2>&1 | tee {log}"


onerror:
    # A failed cell (under --keep-going) still leaves a report that lists it as missing, and why.
    if any(cell.run_dir().joinpath("eval.json").exists() for cell in CELLS):
        import subprocess

        with open("results/logs/report_partial.log", "w") as partial_log:
            subprocess.run(["linvit", "report", "--config-json", REPORT_CFG, "--results", "results",
                            "--out", "report"], stdout=partial_log, stderr=subprocess.STDOUT)


# The operator benchmark (not part of `all`: it should run on an otherwise idle machine).
rule benchmark:
    output:
        "results/benchmark/attention.csv",
    log:
        "results/logs/benchmark.log",
    threads: workflow.cores
    shell:
        "linvit benchmark --out {output} --threads {threads} 2> {log}"
