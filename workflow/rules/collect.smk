rule collect:
    """Combine every dataset's fit into the sweep's outputs (also when some datasets failed)."""
    input:
        batch_manifests,
    output:
        posteriors=LAYOUT.posteriors,
        summary=LAYOUT.summary,
        failures=LAYOUT.failures_csv,
    log:
        LAYOUT.log("collect"),
    benchmark:
        LAYOUT.benchmark("collect")
    conda:
        "../envs/batchfit.yaml"
    # Summarising many new fits goes faster in several processes: the sweep's cores on one
    # machine; on a cluster collect runs on the submitting host, one core unless
    # --set-threads collect=N says otherwise.
    threads: lambda wildcards: total_cores() or 1
    params:
        config_source=CONFIG_SOURCE,
    script:
        "../../scripts/collect.py"


rule status:
    """Fail the run (keeping collect's outputs) when a dataset failed; a re-run retries those.

    A `script:` rule, not `run:`: Snakemake runs `run:` jobs in a new Snakemake process that
    re-parses the Snakefile, whose plan (the pending datasets) has changed since the fits were
    written, so the job failed on missing batch manifests instead of reporting the failures.
    """
    input:
        rules.collect.output.failures,
    output:
        touch(LAYOUT.status_ok),
    log:
        LAYOUT.log("status"),
    benchmark:
        LAYOUT.benchmark("status")
    # A run with failures still gets its report: the report's jobs (workflow/rules/report.smk)
    # are ready when this one is, and the lower priority makes Snakemake start them first; once
    # a job fails it starts no other but lets the running ones finish. So status runs beside
    # the report, not after it (without the priority, `--cores 1` ran it first and lost the report).
    priority: -1
    conda:
        "../envs/batchfit.yaml"
    params:
        config_source=CONFIG_SOURCE,
    script:
        "../../scripts/status.py"
