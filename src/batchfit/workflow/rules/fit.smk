rule fit:
    """Fit one batch of datasets in one process: one compile (a cache hit), then only sampling.

    Only pending batches exist (batchfit.sweep.plan.plan: fits whose recorded provenance differs
    from the config's), and a batch's name holds its members' provenance digests, so a changed
    setting, model or data file gives a new batch (and job) while touching a file gives none.
    Memory and time follow the batch's size and what the compile stage measured, and grow with
    each retry; a retry fits only the datasets a killed attempt left.
    """
    input:
        compiled=compiled_stamp,
        bundle=compiled_bundle,
        # Without a shared filesystem the model and its imports come with the workflow's sources (the
        # project's git-tracked files, which Snakemake deploys), the datasets staged by the `stage` rule:
        # a local file would make Snakemake run the job on the submitting machine.
        model=lambda wildcards: here(bf(wildcards).model) if SHARED_FS else [],
        imports=lambda wildcards: [here(f) for f in user_import_files(bf(wildcards).model)] if SHARED_FS else [],
        data=batch_datasets if SHARED_FS else [],
        staged=[] if SHARED_FS else str(LAYOUT.staged_inputs("{batch}")),
    output:
        LAYOUT.batch_manifest("{batch}") if SHARED_FS else directory(LAYOUT.batch_outputs("{batch}")),
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
        datasets=batch_members if SHARED_FS else [],
        n_datasets=batch_size,
    # What Snakemake prints of the job instead of its inputs, a data file per dataset.
    message:
        "fit {wildcards.batch}: {params.n_datasets} dataset(s); log {log}"
    script:
        "../scripts/fit.py"


rule stage:
    """Without a shared filesystem: what one fit job reads, in one directory that storage moves to it
    (batchfit.fitting.job_inputs): the batch's data files, the reference dataset's (which the compile
    stage recorded) and the sweep's label registry. Runs on the submitting machine, which has the data.
    """
    input:
        compiled=compiled_stamp,
        # (A fit job re-parses this rule too, without the plan or the data: it runs no stage job.)
        data=lambda wildcards: [here(f) for f in batch_datasets(wildcards)] if knows_plan() else [],
    output:
        directory(LAYOUT.staged_inputs("{batch}")),
    log:
        here(LAYOUT.log("stage/{batch}")),
    localrule: True
    conda:
        "../envs/batchfit.yaml"
    params:
        config_source=CONFIG_SOURCE,
    script:
        "../scripts/stage.py"
