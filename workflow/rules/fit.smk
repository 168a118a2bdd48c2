rule fit:
    """Fit one batch of datasets in one process: one compile (a cache hit), then only sampling."""
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
