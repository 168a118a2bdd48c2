"""Snakemake rule `plots`: health and forest plots under results_dir/plots/."""
from batchfit.common.quick_exit import quick_exit
from batchfit.outputs.plots import write_plots
from batchfit.sweep.snakemake_job import log_to, snakemake_config

config = snakemake_config(snakemake.config, snakemake.params.config_source, snakemake.wildcards.get("variant"))
with log_to(snakemake.log[0]):
    write_plots(config)
quick_exit()  # the job is done and its outputs closed: skip the interpreter's teardown
