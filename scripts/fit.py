"""Snakemake rule `fit`: fit one batch of datasets with one compiled model."""
from batchfit.common.quick_exit import quick_exit
from batchfit.sweep.plan import still_pending
from batchfit.sweep.snakemake_job import log_to, snakemake_config

# The config first: it sets the CPU target numba compiles for, before batchfit.fitting loads numba.
config = snakemake_config(snakemake.config, snakemake.params.config_source)
from batchfit.fitting.batch import fit_batch  # noqa: E402

with log_to(snakemake.log[0]):
    datasets = still_pending(config, snakemake.params.datasets)
    fit_batch(config, datasets, batch_id=snakemake.wildcards.batch, threads=snakemake.threads,
              bundle=snakemake.input.bundle)
quick_exit()  # the job is done and its outputs closed: skip the interpreter's teardown
