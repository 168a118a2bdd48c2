"""Snakemake rule `sbc`: ranks, uniformity test, verdict line and plots (the verdict is also printed)."""
import logging
import sys

from batchfit.common.quick_exit import quick_exit
from batchfit.sweep.sbc.ranks import rank_simulations
from batchfit.sweep.snakemake_job import log_to, snakemake_config

config = snakemake_config(snakemake.config, snakemake.params.config_source)
with log_to(snakemake.log[0]):
    verdict = rank_simulations(config).verdict()
    logging.getLogger("batchfit").info(verdict)
print(verdict, file=sys.stderr)
quick_exit()  # the job is done and its outputs closed: skip the interpreter's teardown
