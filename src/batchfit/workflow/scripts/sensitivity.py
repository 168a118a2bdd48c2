"""Snakemake rule `sensitivity`: power-scaling sensitivity of every fit, sensitivity.csv and its report page."""
from batchfit.common.quick_exit import quick_exit
from batchfit.outputs.sensitivity import write_sensitivity
from batchfit.sweep.snakemake_job import log_to, snakemake_config

config = snakemake_config(snakemake.config, snakemake.params.config_source, snakemake.wildcards.get("variant"))
with log_to(snakemake.log[0]):
    write_sensitivity(config)
quick_exit()  # the job is done and its outputs closed: skip the interpreter's teardown
