# linvit: softmax ViT -> linear ViT transfer, as a grid of jobs.
#   snakemake --cores all                         the embedded default grid (workflow/config/default.yaml)
#   snakemake --cores all --configfile workflow/config/smoke.yaml
#   snakemake --cores all report_from_results     regenerate report/ from results/ without training
from snakemake.utils import min_version, validate

min_version("9.0")


# The embedded default, unless --configfile names another grid (which then replaces it, rather than
# being merged over it key by key, so a small grid never inherits the default's settings).
if not workflow.overwrite_configfiles:

    configfile: workflow.source_path("workflow/config/default.yaml")


validate(config, workflow.source_path("workflow/schemas/config.schema.yaml"))


include: "workflow/rules/common.smk"
include: "workflow/rules/data.smk"
include: "workflow/rules/teacher.smk"
include: "workflow/rules/student.smk"
include: "workflow/rules/evaluate.smk"
include: "workflow/rules/report.smk"


rule all:
    input:
        "report/README.md",
