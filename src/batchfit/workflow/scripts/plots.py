"""Snakemake rule `plots`: health and forest plots under results_dir/plots/."""
from batchfit.common import collector

collector.pause()  # before the imports: they live until the job ends (batchfit.common.collector)

from batchfit.common.quick_exit import quick_exit  # noqa: E402
from batchfit.outputs.plots import write_plots  # noqa: E402
from batchfit.sweep.snakemake_job import log_to, snakemake_config  # noqa: E402

config = snakemake_config(snakemake.config, snakemake.params.config_source, snakemake.wildcards.get("variant"))
with log_to(snakemake.log[0]):
    write_plots(config)
quick_exit()  # the job is done and its outputs closed: skip the interpreter's teardown
