# Aggregate results/ into results/{runs,curves}.csv and report/ (the files of linvit.grid.report_files).
# `report_from_results` does the same from whatever results/ holds, without (re)training anything:
# use it after --keep-going left gaps.
import glob

from linvit import figure_registry

REPORT_CFG = job_config("targets", "sizes", "variants", "cells", "inits", "control_inits", "seeds", "budgets", "distills",
                        "distill_designs", "distill.loss", "student.train.steps", "student.train.batch_size",
                        "teacher", "teachers", "datasets", "init_strategies", "claims", "sequential", "added_seeds",
                        "decide_look", "dropped_runs")


# `linvit bench` (the harness's own benchmarks) writes results/bench/<machine>.csv; as with the operator
# benchmark, the report reads them, and declares its table of them, only when they exist at planning time.
HARNESS_BENCHMARKS = sorted(glob.glob(f"{grid.RESULTS}/bench/*.csv"))
HARNESS_TABLE = f"{grid.REPORT}/harness_benchmarks.csv"  # linvit.report.render.HARNESS_CSV

# `snakemake --report report.html`: every file of the report rule is a result there, with its caption
# (workflow/report/<name>.rst) and category; the same paths as grid.report_files, only flagged.
REPORT_CATEGORIES = {
    "README.md": "Report", "index.html": "Report", "claims.json": "Claims", "summary.csv": "Accuracy",
    "summary.md": "Accuracy", "runs.csv": "Accuracy", "curves.csv": "Accuracy",
    "harness_benchmarks.csv": "Harness benchmarks",
}
REPORT_CAPTIONS = {"summary.md": "summary.csv"}  # the same table in Markdown


# report/README.md first and results/curves.csv last (the params below read the two folders from them).
REPORT_OUTPUTS = grid.report_files(WITH_BENCHMARK)
if HARNESS_BENCHMARKS:
    REPORT_OUTPUTS.insert(1, HARNESS_TABLE)
# A figure (report/figures/<name>.<format>) takes its caption and category from its entry in
# linvit.figure_registry (report_flags), once for both formats; a table or page from its file name and the
# dicts above (no helper function here: the linter wants rules and functions in separate files).
REPORT_FLAGS = {
    path: figure_registry.report_flags(path) or
    dict(caption=f"../report/{REPORT_CAPTIONS.get(os.path.basename(path), os.path.basename(path)).replace('.', '_')}.rst",
         category=REPORT_CATEGORIES[os.path.basename(path)], labels={"file": path})
    for path in REPORT_OUTPUTS
}
# One line: Snakemake's parser would read a line starting with `report(` as the `report:` directive.
REPORTED_OUTPUTS = [report(path, **REPORT_FLAGS[path]) for path in REPORT_OUTPUTS]


report: "../report/workflow.rst"


rule report:
    input:
        report_inputs,
        HARNESS_BENCHMARKS,
    output:
        REPORTED_OUTPUTS,
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
    # A failed cell (under --keep-going) still leaves a report that lists it as missing, and why: made
    # when some cell's job (grid.jobs) wrote all its files.
    if any(job.evaluates and all(os.path.exists(path) for path in job.outputs) for job in JOBS):
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
