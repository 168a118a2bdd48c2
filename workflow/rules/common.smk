# Config validation and the sweep's plan: which datasets exist and which batches still need fitting.
from pathlib import Path

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from batchfit.pipeline import compile_stamp_path, failure_line, fit_threads, plan, snakemake_config


CONFIG_SOURCE = ", ".join(map(str, workflow.configfiles)) or "<snakemake config>"
# batchfit's checks first: their messages name the key (with a did-you-mean) and the config file,
# and check the model file; Snakemake's validate then fills the defaults in for the jobs.
BF = snakemake_config(config, CONFIG_SOURCE)
validate(config, "../schemas/config.schema.yaml")
PLAN = plan(BF)
RESULTS = BF.results_dir
COMPILED = compile_stamp_path(BF)
FIT_THREADS = fit_threads(BF, workflow.cores, len(PLAN.batches))


def batch_datasets(wildcards):
    """Data files of one batch (inputs: they must exist; a changed one changes the batch's name)."""
    return [str(PLAN.datasets[d]) for d in PLAN.batches[wildcards.batch]]


def batch_manifests(wildcards):
    return [str(BF.batch_manifest_path(b)) for b in PLAN.batches]
