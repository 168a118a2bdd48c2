"""Snakemake rule `compare`: the variants compared per dataset, comparison.csv and its report page."""
from batchfit.common.quick_exit import quick_exit
from batchfit.outputs.compare import write_comparison
from batchfit.sweep.snakemake_job import log_to, snakemake_config

config = snakemake_config(snakemake.config, snakemake.params.config_source)
with log_to(snakemake.log[0]):
    write_comparison(config)
quick_exit()  # the job is done and its outputs closed: skip the interpreter's teardown
