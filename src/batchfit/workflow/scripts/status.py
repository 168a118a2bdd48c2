"""Snakemake rule `status`: write the run's verdict, which the workflow's onsuccess prints last.

The rule never fails: with failed datasets the run still exits non-zero, from its onsuccess
(`batchfit.sweep.verdict.end_of_run`), with batchfit's lines last instead of a failed rule's traceback.
"""
import logging

from batchfit.common.quick_exit import quick_exit
from batchfit.sweep.snakemake_job import log_to, snakemake_config
from batchfit.sweep.verdict import write_verdict

config = snakemake_config(snakemake.config, snakemake.params.config_source, snakemake.wildcards.get("variant"))
with log_to(snakemake.log[0]):
    report = write_verdict(config)
    if report:
        logging.getLogger("batchfit").warning("%s", report)
quick_exit()  # the job is done and its outputs closed: skip the interpreter's teardown
