"""Snakemake rule `status`: exit non-zero with one line when any dataset failed.

A local rule: its stderr is the user's terminal, also on a cluster; the rule's log keeps the line too.
"""
import logging
import sys

from batchfit.common.quick_exit import quick_exit
from batchfit.sweep.snakemake_job import log_to, snakemake_config
from batchfit.sweep.stages import failure_line

config = snakemake_config(snakemake.config, snakemake.params.config_source)
with log_to(snakemake.log[0]):
    line = failure_line(config)
    if line:
        logging.getLogger("batchfit").error("%s", line)
        print(line, file=sys.stderr)
        sys.exit(1)
quick_exit()  # the job is done and its outputs closed: skip the interpreter's teardown
