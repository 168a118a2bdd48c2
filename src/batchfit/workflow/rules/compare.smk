# A sweep of variants (batchfit.variants, docs/variants.md): every variant's fits compared per dataset,
# exactly where PSIS-LOO is unreliable (compare: in the config): refits planned by a checkpoint, run in
# batches of one variant's refits, each batch one job with one compile (a cache hit), as fits are.
checkpoint refit_plan:
    """Each compared dataset's method (PSIS-LOO, reloo or K-fold) and the pending refits, in batches.

    Its inputs are the variants' datasets.csv: a variant refitted or added plans again, as does a
    changed `compare:` (its params).
    """
    input:
        variant_paths(LAYOUT.datasets_csv) if VARIANTS else [],
    output:
        here(BF.layout.refit_plan),
    log:
        here(BF.layout.log("refit_plan")),
    conda:
        "../envs/batchfit.yaml"
    params:
        config_source=CONFIG_SOURCE,
        settings=config.get("compare"),
        cores=lambda wildcards: sweep_cores(),
    script:
        "../scripts/refit_plan.py"


rule refit:
    """One batch of a variant's refits: the datasets without their held-out rows, sampled with one compile
    (the fits' structure, a cache hit), and the held-out rows' log-likelihood under each refit's draws.

    Without a shared filesystem it runs on the submitting machine, which has the data and the cache.
    """
    input:
        plan=here(BF.layout.refit_plan),
        compiled=compiled_stamp,
    output:
        here(LAYOUT.refit_manifest("{refit_batch}")),
    log:
        here(LAYOUT.refit_log("{refit_batch}")),
    benchmark:
        here(LAYOUT.benchmark("refit/{refit_batch}"))
    retries: FIT_RETRIES
    localrule: not SHARED_FS
    conda:
        "../envs/batchfit.yaml"
    threads: lambda wildcards: fit_threads(bf(wildcards).sampler.chains, sweep_cores(), len(planned_refits().batches))
    resources:
        mem_mb=refit_resource("mem_mb"),
        runtime=refit_resource("runtime"),
    params:
        config_source=CONFIG_SOURCE,
        n_refits=lambda wildcards: len(planned_refits().batches[wildcards.refit_batch]),
    message:
        "refit {wildcards.refit_batch}: {params.n_refits} refit(s) of variant {wildcards.variant}; log {log}"
    script:
        "../scripts/refit.py"


rule compare:
    """Every variant's elpd of each dataset (PSIS-LOO, or its exact method from the refits), compared across
    variants: comparison.csv and its page.

    Its inputs are the variants' datasets.csv, the refit plan and the pending refit batches' manifests:
    a variant refitted or added (collected anew) compares again.
    """
    input:
        variant_paths(LAYOUT.datasets_csv) if VARIANTS else [],
        plan=here(BF.layout.refit_plan) if VARIANTS else [],
        refits=refit_manifests if VARIANTS else [],
    output:
        comparison=here(BF.layout.comparison),
        page=report(
            here(BF.layout.report_pages / "comparison.html"),
            caption="../report/comparison.rst",
            category="0. Variants",
            labels={"page": "variants compared per dataset (comparison.csv)"},
        ),
    log:
        here(BF.layout.log("compare")),
    benchmark:
        here(BF.layout.benchmark("compare"))
    conda:
        "../envs/batchfit.yaml"
    params:
        config_source=CONFIG_SOURCE,
    script:
        "../scripts/compare.py"


# outputs.sensitivity: power-scaling sensitivity of every fit (of a variant, in a sweep of variants).
SENSITIVE = [variant for variant, c in CONFIGS.items() if c.outputs.sensitivity]


rule sensitivity:
    """arviz_stats.psense_summary of every fit: sensitivity.csv and its report page (outputs.sensitivity)."""
    input:
        here(LAYOUT.datasets_csv),
    output:
        table=here(LAYOUT.sensitivity),
        page=report(
            here(LAYOUT.report_pages / "sensitivity.html"),
            caption="../report/sensitivity.rst",
            category="6. Sensitivity",
            labels=labelled({"page": "prior and likelihood sensitivity (sensitivity.csv)"}),
        ),
    log:
        here(LAYOUT.log("sensitivity")),
    benchmark:
        here(LAYOUT.benchmark("sensitivity"))
    conda:
        "../envs/batchfit.yaml"
    params:
        config_source=CONFIG_SOURCE,
    script:
        "../scripts/sensitivity.py"


SENSITIVITY_TARGETS = [
    here(path)
    for output in rules.sensitivity.output
    for path in (expand(str(output), variant=SENSITIVE) if VARIANTS else [str(output)] if SENSITIVE else [])
]
