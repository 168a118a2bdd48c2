"""Snakemake rule `fit`: fit one batch of datasets with one compiled model."""
from batchfit.common import collector

collector.pause()  # before the imports: they live until the job ends (batchfit.common.collector)

from pathlib import Path  # noqa: E402

from batchfit.common.quick_exit import quick_exit  # noqa: E402
from batchfit.sweep.snakemake_job import log_to, snakemake_config  # noqa: E402

# The config first: it sets the CPU target numba compiles for, before batchfit.fitting loads numba.
config = snakemake_config(snakemake.config, snakemake.params.config_source, snakemake.wildcards.get("variant"))
from batchfit.sweep.fit_job import run_fit_job  # noqa: E402

# Without a shared filesystem the rule has the staged inputs and a directory of its own as output.
staged = snakemake.input.get("staged")
with log_to(snakemake.log[0]):
    run_fit_job(config, snakemake.wildcards.batch, threads=snakemake.threads, bundle=Path(snakemake.input.bundle),
                datasets=snakemake.params.get("datasets", ()), staged=Path(staged) if staged else None,
                outputs=Path(snakemake.output[0]) if staged else None)
quick_exit()  # the job is done and its outputs closed: skip the interpreter's teardown
