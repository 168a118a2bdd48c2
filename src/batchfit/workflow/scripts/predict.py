"""Snakemake rule `predict_batch`: predict one batch of datasets with one cached forward function per structure."""
from batchfit.common import collector

collector.pause()  # before the imports: they live until the job ends (batchfit.common.collector)

from pathlib import Path  # noqa: E402

from batchfit.common.quick_exit import quick_exit  # noqa: E402
from batchfit.sweep.snakemake_job import log_to, snakemake_config  # noqa: E402

# The config first: it sets the CPU target numba compiles for, before batchfit.predictions loads numba.
config = snakemake_config(snakemake.config, snakemake.params.config_source, snakemake.wildcards.get("variant"))
from batchfit.sweep.predict_job import run_predict_job  # noqa: E402

# Without a shared filesystem the rule has the staged inputs and a directory of its own as output.
staged = snakemake.input.get("staged")
with log_to(snakemake.log[0]):
    run_predict_job(config, snakemake.wildcards.batch, bundle=Path(snakemake.input.bundle),
                    staged=Path(staged) if staged else None, outputs=Path(snakemake.output[0]) if staged else None)
quick_exit()  # the job is done and its outputs closed: skip the interpreter's teardown
