"""Snakemake rule `compile`: fill the compiled-function cache before the fit jobs, and write its bundle."""
from batchfit.common import collector

collector.pause()  # before the imports: they live until the job ends (batchfit.common.collector)

from batchfit.compile.worker_pool import compile_workers  # noqa: E402

# Started first: the worker a miss waits for imports beside this script's own imports.
with compile_workers(snakemake.threads) as workers:
    from batchfit.sweep.snakemake_job import log_to, snakemake_config, stamp_config
    from batchfit.sweep.stages import run_compile

    config = stamp_config(snakemake_config(snakemake.config, "the Snakemake config"), snakemake.wildcards.stamp)
    with log_to(snakemake.log[0]):
        run_compile(config, workers=workers, bundle=snakemake.output.bundle).write(snakemake.output.stamp)

from batchfit.common.quick_exit import quick_exit  # noqa: E402

quick_exit()  # the job is done and its outputs closed: skip the interpreter's teardown
