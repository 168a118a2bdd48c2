"""Snakemake rule `prediction_plots`: the predicted curves over the observed data (results_dir/plots/predictions/)."""
from batchfit.common.quick_exit import quick_exit
from batchfit.sweep.predict_job import run_prediction_plots
from batchfit.sweep.snakemake_job import log_to, snakemake_config

config = snakemake_config(snakemake.config, snakemake.params.config_source, snakemake.wildcards.get("variant"))
with log_to(snakemake.log[0]):
    run_prediction_plots(config)
quick_exit()  # the job is done and its outputs closed: skip the interpreter's teardown
