# linvit: softmax ViT -> linear ViT transfer, as a grid of jobs.
#   snakemake --cores all                         the embedded default grid (workflow/config/default.yaml)
#   snakemake --cores all --configfile workflow/config/smoke.yaml
#   snakemake --cores all report_from_results     regenerate report/ from results/ without training
#   snakemake --cores all benchmark               the operator benchmark (then `snakemake` adds it to the report)
from snakemake.exceptions import WorkflowError
from snakemake.utils import min_version

from linvit.config import ConfigError, validate as validate_config

min_version("9.0")


# The embedded default, unless --configfile names another grid (which then replaces it, rather than
# being merged over it key by key, so a small grid never inherits the default's settings).
if not workflow.overwrite_configfiles:

    configfile: workflow.source_path("workflow/config/default.yaml")


# Not snakemake.utils.validate: it warns that it has no draft-07 validator on every run and dumps the
# whole schema after an error. linvit.config.validate checks the same schema (Draft7Validator) and
# then the names against the registries, and says what is wrong in one line naming the key.
try:
    validate_config(config)
except ConfigError as err:
    raise WorkflowError(str(err)) from None


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/teacher.smk"
include: "workflow/rules/student.smk"
include: "workflow/rules/report.smk"


# Cheap jobs that run where Snakemake runs, never on a cluster: the aggregation. The shards are a
# cluster job under the Slurm profile (converting ImageNet on a login node is what administrators
# kill; resources.shards sizes it), and run here otherwise like every job.
localrules:
    all,
    report,
    report_from_results,


# The report's outputs, and every file the report reads (report_inputs): Snakemake plans a job whose
# output is missing only when a target needs that file, so without them a student's eval.json deleted
# after the grid finished would leave "Nothing to be done" (tests/test_workflow.py).
rule all:
    input:
        rules.report.output,
        report_inputs,


# The run's record for `linvit status` (linvit/runrecord.py): the config as merged here, the host, this
# process, the executor. Snakemake calls this once it has jobs to run: not in a dry run, not inside
# cluster jobs (they run with --no-hooks).
onstart:
    from linvit.runrecord import write_record

    write_record(config, workflow)
