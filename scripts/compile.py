"""Snakemake rule `compile`: fill the compiled-function cache before the fit jobs."""
from batchfit.pipeline import log_to, run_compile, snakemake_config, write_json
from batchfit.quick_exit import quick_exit

config = snakemake_config(snakemake.config, "the Snakemake config")
with log_to(snakemake.log[0]):
    write_json(snakemake.output[0], run_compile(config, workers=snakemake.threads))
quick_exit()  # the job is done and its outputs closed: skip the interpreter's teardown
