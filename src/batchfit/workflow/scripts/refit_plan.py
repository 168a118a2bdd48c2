"""Snakemake checkpoint `refit_plan`: which datasets the comparison refits, and the pending refits in batches."""
from batchfit.common.quick_exit import quick_exit
from batchfit.sweep.refit_plan import write_refit_plan
from batchfit.sweep.snakemake_job import log_to, snakemake_config

config = snakemake_config(snakemake.config, snakemake.params.config_source)
with log_to(snakemake.log[0]):
    write_refit_plan(config, cores=snakemake.params.cores)
quick_exit()  # the job is done and its outputs closed: skip the interpreter's teardown
