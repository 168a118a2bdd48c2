"""Snakemake rule `status`: exit non-zero with one line when any dataset failed."""
import sys

from batchfit.pipeline import failure_line, log_to, snakemake_config

config = snakemake_config(snakemake.config, snakemake.params.config_source)
with log_to(snakemake.log[0]):
    line = failure_line(config)
    if line:
        print(line, file=sys.stderr)
        sys.exit(1)
