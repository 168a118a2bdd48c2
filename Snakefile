# batchfit's bundled examples: the installed batchfit's workflow (with ./setup.sh's editable install,
# src/batchfit/workflow/) used as a Snakemake module, as in a `batchfit init` project, with the example's config.
#   snakemake --cores 2                                   # the bundled example (config/config.yaml)
#   snakemake --cores 2 --configfile config/nes.yaml      # another sweep
#   snakemake --cores 2 --directory .test                 # the small sweep CI runs (.test/config/)
# Imported by name: below, `batchfit` names the Snakemake module, no longer the Python package.
from batchfit.project import workflow_snakefile

# The bundled example's config is only the default: a --configfile replaces it instead of being
# merged over it (what Snakemake does when a `configfile:` exists), so keys a sweep's config leaves
# out get the documented defaults, not the example's values (e.g. its results_dir).
if not workflow.overwrite_configfiles:

    configfile: "config/config.yaml"


module batchfit:
    snakefile:
        workflow_snakefile()
    config:
        config


use rule * from batchfit


# Snakemake runs no module's onstart, onsuccess or onerror: the plan is recorded for the jobs, and
# batchfit's verdict printed last, here (as in a `batchfit init` project's Snakefile).
onstart:
    batchfit.record_plan()


onsuccess:
    batchfit.end_run()


onerror:
    batchfit.end_run(error=True)
