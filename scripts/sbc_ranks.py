"""Snakemake rule `sbc`: ranks, uniformity test, verdict line and plots (the verdict is also printed)."""
import logging
import sys

from batchfit.pipeline import log_to, snakemake_config
from batchfit.quick_exit import quick_exit
from batchfit.sbc import rank_simulations

config = snakemake_config(snakemake.config, snakemake.params.config_source)
with log_to(snakemake.log[0]):
    verdict = rank_simulations(config).verdict()
    logging.getLogger("batchfit").info(verdict)
print(verdict, file=sys.stderr)
quick_exit()  # the job is done and its outputs closed: skip the interpreter's teardown
