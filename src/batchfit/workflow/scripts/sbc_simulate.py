"""Snakemake checkpoint `sbc_simulate`: write the missing or outdated simulated datasets."""
import logging

from batchfit.common.atomic import write_json
from batchfit.common.quick_exit import quick_exit
from batchfit.sweep.sbc.simulate import simulate
from batchfit.sweep.snakemake_job import log_to, snakemake_config

config = snakemake_config(snakemake.config, snakemake.params.config_source)
with log_to(snakemake.log[0]):
    report = simulate(config)
    logging.getLogger("batchfit").info(report.one_line())
    write_json(snakemake.output[0], {"n_simulations": config.sbc.n_simulations, "written": report.written})
quick_exit()  # the job is done and its outputs closed: skip the interpreter's teardown
