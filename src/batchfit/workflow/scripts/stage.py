"""Snakemake rule `stage` (no shared filesystem): what one fit job reads, in one directory that storage moves."""
from pathlib import Path

from batchfit.common.quick_exit import quick_exit
from batchfit.sweep.fit_job import stage_fit_job
from batchfit.sweep.snakemake_job import log_to, snakemake_config

config = snakemake_config(snakemake.config, snakemake.params.config_source, snakemake.wildcards.get("variant"))
with log_to(snakemake.log[0]):
    stage_fit_job(config, snakemake.wildcards.batch, Path(snakemake.input.compiled), Path(snakemake.output[0]))
quick_exit()
