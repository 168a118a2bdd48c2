"""Snakemake rule `refit`: one batch of a variant's refits (the exact comparisons) with one compiled model."""
from pathlib import Path

from batchfit.common.quick_exit import quick_exit
from batchfit.sweep.snakemake_job import log_to, snakemake_config

# The config first: it sets the CPU target numba compiles for, before batchfit.fitting loads numba.
config = snakemake_config(snakemake.config, snakemake.params.config_source, snakemake.wildcards.variant)
from batchfit.fitting.refits import run_refit_job  # noqa: E402

with log_to(snakemake.log[0]):
    run_refit_job(config, Path(snakemake.input.plan), snakemake.wildcards.refit_batch, threads=snakemake.threads)
quick_exit()  # the job is done and its outputs closed: skip the interpreter's teardown
