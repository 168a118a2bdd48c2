"""Snakemake rule `stage_predict` (no shared filesystem): what one predict job reads, in one directory storage moves."""
from pathlib import Path

from batchfit.common.quick_exit import quick_exit
from batchfit.sweep.predict_job import stage_predict_job
from batchfit.sweep.snakemake_job import log_to, snakemake_config

config = snakemake_config(snakemake.config, snakemake.params.config_source, snakemake.wildcards.get("variant"))
with log_to(snakemake.log[0]):
    stage_predict_job(config, snakemake.wildcards.batch, Path(snakemake.input.compiled), Path(snakemake.output[0]))
quick_exit()
