# A sweep of variants (batchfit.variants, docs/variants.md): every variant's fits compared per dataset.
rule compare:
    """PSIS-LOO of every variant's fit of each dataset, compared across variants: comparison.csv and its page.

    Its inputs are the variants' datasets.csv: a variant refitted or added (collected anew) compares again.
    """
    input:
        variant_paths(LAYOUT.datasets_csv) if VARIANTS else [],
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
        "../../scripts/compare.py"


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
        "../../scripts/sensitivity.py"


SENSITIVITY_TARGETS = [
    here(path)
    for output in rules.sensitivity.output
    for path in (expand(str(output), variant=SENSITIVE) if VARIANTS else [str(output)] if SENSITIVE else [])
]
