# The sweep's report: `snakemake --report report.html` (or report.zip) after a run shows what
# these rules write, with the captions in report/. The plots and pages are also plain
# files under results_dir/plots/ and results_dir/report/ for anyone without the report.
# A run with failed datasets has its report too: the status rule only writes the run's verdict.
report: "../report/workflow.rst"


# An SBC run's PNG plots (results_dir/sbc/**/*.png), found when the Snakefile is parsed: the
# report shows them when a run has made them, and this workflow needs none of the SBC code.
SBC_PLOTS = sorted(map(str, BF.layout.sbc.root.glob("**/*.png")))


rule plots:
    """Health bar charts and a forest plot per variable across datasets (report.var_names)."""
    input:
        posteriors=here(rules.collect.output.posteriors),
        datasets=here(rules.collect.output.datasets),
    output:
        health=report(
            here(LAYOUT.health_plot),
            caption="../report/health.rst",
            category="1. Health",
            labels=labelled({"view": "bar charts"}),
        ),
        forest=report(
            directory(here(LAYOUT.forest_plots)),
            patterns=["{name}.png"],
            caption="../report/forest.rst",
            category="2. Forest plots",
            labels=labelled({"variable": "{name}"}),
        ),
    log:
        here(LAYOUT.log("plots")),
    benchmark:
        here(LAYOUT.benchmark("plots"))
    conda:
        "../envs/batchfit.yaml"
    params:
        config_source=CONFIG_SOURCE,
        settings=lambda wildcards: repr(bf(wildcards).report),  # a changed report: key redraws the plots (params are a rerun trigger)
    script:
        "../scripts/plots.py"


rule report_pages:
    """The health overview, datasets.csv, summary.csv and failures.csv as tables, and the sweep's provenance, as HTML."""
    input:
        posteriors=here(rules.collect.output.posteriors),
        summary=here(rules.collect.output.summary),
        datasets=here(rules.collect.output.datasets),
        failures=here(rules.collect.output.failures),
        model=lambda wildcards: here(bf(wildcards).model),
    output:
        health=report(
            here(LAYOUT.report_pages / "health.html"),
            caption="../report/health_table.rst",
            category="1. Health",
            labels=labelled({"view": "warnings and failures"}),
        ),
        summary=report(
            here(LAYOUT.report_pages / "summary.html"),
            caption="../report/summary.rst",
            category="3. Tables",
            labels=labelled({"table": "datasets and diagnostics (datasets.csv, summary.csv)"}),
        ),
        failures=report(
            here(LAYOUT.report_pages / "failures.html"),
            caption="../report/failures.rst",
            category="3. Tables",
            labels=labelled({"table": "failures (failures.csv)"}),
        ),
        provenance=report(
            here(LAYOUT.report_pages / "provenance.html"),
            caption="../report/provenance.rst",
            category="5. Provenance",
            labels=labelled({"page": "versions, model, config, cache keys, dates"}),
        ),
    log:
        here(LAYOUT.log("report_pages")),
    benchmark:
        here(LAYOUT.benchmark("report_pages"))
    conda:
        "../envs/batchfit.yaml"
    params:
        config_source=CONFIG_SOURCE,
    script:
        "../scripts/report_pages.py"


rule sbc_plots:
    """Copy the SBC run's plots beside the others, so the report can show them."""
    input:
        [here(p) for p in SBC_PLOTS],
    output:
        report(
            directory(here(BF.layout.sbc_plots_in_report)),
            patterns=["{name}.png"],
            caption="../report/sbc.rst",
            category="4. Simulation-based calibration",
            labels={"plot": "{name}"},
        ),
    log:
        here(BF.layout.log("sbc_plots")),
    conda:
        "../envs/batchfit.yaml"
    params:
        sbc_dir=BF.layout.sbc.root,
    script:
        "../scripts/sbc_plots.py"


REPORT_TARGETS = [
    *(path for output in rules.plots.output for path in variant_paths(output)),
    *(path for output in rules.report_pages.output for path in variant_paths(output)),
    *([here(p) for p in rules.sbc_plots.output] if SBC_PLOTS else []),
]
