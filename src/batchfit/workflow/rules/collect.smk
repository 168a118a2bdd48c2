rule collect:
    """Combine every dataset's fit into the sweep's outputs (also when some datasets failed)."""
    input:
        fit_job_outputs if SHARED_FS else [],
        # Without a shared filesystem: the fit jobs' own output directories, adopted first.
        outputs=[] if SHARED_FS else fit_job_outputs,
    output:
        posteriors=here(LAYOUT.posteriors),
        summary=here(LAYOUT.summary),
        datasets=here(LAYOUT.datasets_csv),
        failures=here(LAYOUT.failures_csv),
    log:
        here(LAYOUT.log("collect")),
    benchmark:
        here(LAYOUT.benchmark("collect"))
    conda:
        "../envs/batchfit.yaml"
    # Summarising many new fits goes faster in several processes: the sweep's cores on one
    # machine; on a cluster collect runs on the submitting host, one core unless
    # --set-threads collect=N says otherwise.
    threads: lambda wildcards: total_cores() or 1
    params:
        config_source=CONFIG_SOURCE,
    script:
        "../scripts/collect.py"


rule status:
    """Write the run's verdict: the failed datasets, grouped by reason, which `end_run` prints last.

    It never fails: a run with failed datasets still exits non-zero, from onsuccess, but ends with
    batchfit's lines rather than a failed rule's traceback (batchfit.sweep.verdict.end_of_run).
    A `script:` rule, not `run:`: Snakemake runs `run:` jobs in a new Snakemake process that
    re-parses the Snakefile, whose plan (the pending datasets) has changed since the fits were
    written, so the job failed on missing batch manifests instead of reporting the failures.
    """
    input:
        here(rules.collect.output.failures),
    output:
        here(LAYOUT.status_verdict),
    log:
        here(LAYOUT.log("status")),
    benchmark:
        here(LAYOUT.benchmark("status"))
    conda:
        "../envs/batchfit.yaml"
    params:
        config_source=CONFIG_SOURCE,
    script:
        "../scripts/status.py"
