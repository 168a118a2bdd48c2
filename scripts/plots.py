"""Snakemake rule `plots`: health and forest plots under results_dir/plots/."""
from batchfit.pipeline import log_to, snakemake_config
from batchfit.plots import write_plots

config = snakemake_config(snakemake.config, snakemake.params.config_source)
with log_to(snakemake.log[0]):
    write_plots(config)
