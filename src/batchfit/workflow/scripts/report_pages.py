"""Snakemake rule `report_pages`: health, tables and provenance as HTML under results_dir/report/."""
from batchfit.common.quick_exit import quick_exit
from batchfit.outputs.report import write_report_pages
from batchfit.sweep.snakemake_job import log_to, snakemake_config

config = snakemake_config(snakemake.config, snakemake.params.config_source, snakemake.wildcards.get("variant"))
with log_to(snakemake.log[0]):
    write_report_pages(config)
quick_exit()  # the job is done and its outputs closed: skip the interpreter's teardown
