# batchfit: fit one PyMC model to many datasets.
#   snakemake --cores 2                              # the bundled example (config/config.yaml)
#   snakemake --cores 2 --configfile config/nes.yaml # another sweep
# The rules only wire files together; every stage is a batchfit library function (see scripts/).
from snakemake.utils import min_version

min_version("9.0")


# The bundled example's config is only the default: a --configfile replaces it instead of being
# merged over it (what Snakemake does when a `configfile:` exists), so keys a sweep's config leaves
# out get the documented defaults, not the example's values (e.g. its results_dir).
if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"


include: "workflow/rules/common.smk"
include: "workflow/rules/compile.smk"
include: "workflow/rules/fit.smk"
include: "workflow/rules/collect.smk"
include: "workflow/rules/sbc.smk"
include: "workflow/rules/report.smk"
include: "workflow/rules/compare.smk"
include: "workflow/rules/predict.smk"


# Light rules run in the main process, not as cluster jobs: `collect` combines files already on
# the shared filesystem, `status` writes the verdict the main process prints at the end, and the
# report's plots and pages only read collect's outputs.
localrules:
    all,
    collect,
    status,
    plots,
    report_pages,
    sbc_plots,
    collect_predictions,
    prediction_plots,
    predict,
    refit_plan,


rule all:
    default_target: True
    input:
        [path for output in rules.collect.output for path in variant_paths(output)],
        variant_paths(rules.status.output[0]),
        REPORT_TARGETS,
        [here(p) for p in rules.compare.output] if VARIANTS else [],
        SENSITIVITY_TARGETS,
        PREDICT_TARGETS,
