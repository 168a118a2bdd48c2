"""Snakemake rule `collect_predictions`: predictions.csv and prediction_failures.csv for the whole sweep."""
from batchfit.common import collector

collector.pause()  # before the imports: they live until the job ends (batchfit.common.collector)

import logging  # noqa: E402

from batchfit.common.quick_exit import quick_exit  # noqa: E402
from batchfit.sweep.predict_job import run_collect_predictions  # noqa: E402
from batchfit.sweep.snakemake_job import log_to, snakemake_config  # noqa: E402

config = snakemake_config(snakemake.config, snakemake.params.config_source, snakemake.wildcards.get("variant"))
with log_to(snakemake.log[0]):
    logging.getLogger("batchfit").info(run_collect_predictions(config, snakemake.input.get("outputs", [])))
quick_exit()  # the job is done and its outputs closed: skip the interpreter's teardown
