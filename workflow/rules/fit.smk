rule fit:
    """Fit one batch of datasets in one process: one compile (a cache hit), then only sampling.

    Only pending batches exist (batchfit.sweep.plan.plan: fits whose recorded provenance differs
    from the config's), and a batch's name holds its members' provenance digests, so a changed
    setting, model or data file gives a new batch (and job) while touching a file gives none.
    Memory and time follow the batch's size and what the compile stage measured, and grow with
    each retry; a retry fits only the datasets a killed attempt left.
    """
    input:
        compiled=rules.compile.output.stamp,
        bundle=rules.compile.output.bundle,
        model=str(BF.model),
        imports=MODEL_IMPORTS,
        data=batch_datasets,
    output:
        LAYOUT.batch_manifest("{batch}"),
    log:
        LAYOUT.fit_log("{batch}"),
    benchmark:
        LAYOUT.benchmark("fit/{batch}")
    retries: FIT_RETRIES
    conda:
        "../envs/batchfit.yaml"
    threads: fit_job_threads
    resources:
        mem_mb=fit_resource("mem_mb"),
        runtime=fit_resource("runtime"),
    params:
        config_source=CONFIG_SOURCE,
        datasets=batch_members,
        n_datasets=lambda wildcards: len(batch_members(wildcards)),
    # What Snakemake prints of the job instead of its inputs, a data file per dataset.
    message:
        "fit {wildcards.batch}: {params.n_datasets} dataset(s); log {log}"
    script:
        "../../scripts/fit.py"
