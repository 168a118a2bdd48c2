# A sweep of variants (batchfit.variants, docs/variants.md): every variant's fits compared per dataset.
rule compare:
    """PSIS-LOO of every variant's fit of each dataset, compared across variants: comparison.csv and its page.

    Its inputs are the variants' datasets.csv: a variant refitted or added (collected anew) compares again.
    """
    input:
        variant_paths(LAYOUT.datasets_csv) if VARIANTS else [],
    output:
        comparison=BF.layout.comparison,
        page=report(
            BF.layout.report_pages / "comparison.html",
            caption="../report/comparison.rst",
            category="0. Variants",
            labels={"page": "variants compared per dataset (comparison.csv)"},
        ),
    log:
        BF.layout.log("compare"),
    benchmark:
        BF.layout.benchmark("compare")
    conda:
        "../envs/batchfit.yaml"
    params:
        config_source=CONFIG_SOURCE,
    script:
        "../../scripts/compare.py"
