"""Snakemake rule `sbc_fit`: fit one batch of simulated datasets with one compiled model."""
from pathlib import Path

from batchfit.common.quick_exit import quick_exit
from batchfit.fitting.batch import fit_batch
from batchfit.fitting.job_inputs import JobInputs
from batchfit.sweep.sbc.sweep import sbc_config
from batchfit.sweep.snakemake_job import log_to, snakemake_config

config = sbc_config(snakemake_config(snakemake.config, snakemake.params.config_source))
with log_to(snakemake.log[0]):
    fit_batch(config, snakemake.params.datasets, batch_id=snakemake.wildcards.batch, threads=snakemake.threads,
              inputs=JobInputs(Path(snakemake.input.bundle)))
quick_exit()  # the job is done and its outputs closed: skip the interpreter's teardown
