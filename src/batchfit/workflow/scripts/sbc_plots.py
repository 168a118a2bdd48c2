"""Snakemake rule `sbc_plots`: the SBC run's PNG plots copied to results_dir/plots/sbc/ for the report."""
from batchfit.common.quick_exit import quick_exit
from batchfit.outputs.plots import copy_sbc_plots
from batchfit.sweep.snakemake_job import log_to

with log_to(snakemake.log[0]):
    copy_sbc_plots(snakemake.input, snakemake.params.sbc_dir, snakemake.output[0])
quick_exit()  # the job is done and its outputs closed: skip the interpreter's teardown
