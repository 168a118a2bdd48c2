"""Snakemake rule `prediction_plots`: the predicted curves over the observed data (results_dir/plots/predictions/)."""
from batchfit.common import collector

collector.pause()  # before the imports: they live until the job ends (batchfit.common.collector)

from batchfit.common.quick_exit import quick_exit  # noqa: E402
from batchfit.sweep.predict_job import run_prediction_plots  # noqa: E402
from batchfit.sweep.snakemake_job import log_to, snakemake_config  # noqa: E402

config = snakemake_config(snakemake.config, snakemake.params.config_source, snakemake.wildcards.get("variant"))
with log_to(snakemake.log[0]):
    run_prediction_plots(config)
quick_exit()  # the job is done and its outputs closed: skip the interpreter's teardown
