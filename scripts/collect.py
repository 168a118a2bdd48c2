"""Snakemake rule `collect`: posteriors.nc, summary.csv and failures.csv for the whole sweep."""
import logging

from batchfit.pipeline import log_to, run_collect, snakemake_config
from batchfit.quick_exit import quick_exit

config = snakemake_config(snakemake.config, snakemake.params.config_source)
with log_to(snakemake.log[0]):
    logging.getLogger("batchfit").info(run_collect(config, workers=snakemake.threads).one_line())
quick_exit()  # the job is done and its outputs closed: skip the interpreter's teardown
