rule fit:
    """Fit one batch of datasets in one process: one compile (a cache hit), then only sampling.

    Only pending batches exist (batchfit.pipeline.plan: fits whose recorded provenance differs
    from the config's), and a batch's name holds its members' provenance digests, so a changed
    setting, model or data file gives a new batch (and job) while touching a file gives none.
    """
    input:
        compiled=rules.compile.output[0],
        model=str(BF.model),
        data=batch_datasets,
    output:
        RESULTS / "batches" / "{batch}.json",
    log:
        RESULTS / "logs" / "fit" / "{batch}.log",
    params:
        config_source=CONFIG_SOURCE,
        datasets=lambda wildcards: PLAN.batches[wildcards.batch],
    threads: FIT_THREADS
    resources:
        mem_mb=4000,
    conda:
        "../envs/batchfit.yaml"
    script:
        "../../scripts/fit.py"
