# Simulation-based calibration: `snakemake sbc --cores N` (batchfit.sweep.sbc; batchfit's docs/sbc.md).
# The simulated datasets are made by a checkpoint, then planned, fitted and collected as a sweep
# of their own under {results}/sbc with the same compile cache (the `compile` rule's stamp).
checkpoint sbc_simulate:
    """Write the simulated datasets and their true values that are missing or outdated (never others)."""
    input:
        model=here(BF.model),
        simulator=here(BF.sbc.simulator or BF.model),
        # A function: only an SBC run reads the datasets to find the template.
        template=lambda wildcards: here(template(BF)[1]),
    output:
        here(SBC.simulations),
    log:
        here(SBC.log("simulate")),
    conda:
        "../envs/batchfit.yaml"
    params:
        config_source=CONFIG_SOURCE,
        settings=SBC_SETTINGS,
        # A rerun trigger: a label another dataset brings to a sweep-wide column of the template
        # changes the model the simulations are drawn from (simulate redraws only what it changes).
        coding=lambda wildcards: template_sweep_coding(BF),
    script:
        "../scripts/sbc_simulate.py"


rule sbc_fit:
    """One batch of simulated datasets, fitted exactly as the `fit` rule fits real ones."""
    input:
        compiled=str(compile_stamp_path(BF)),
        bundle=str(compiled_bundle_path(BF)),
        model=here(BF.model),
        imports=[here(f) for f in user_import_files(BF.model)],
        data=lambda wildcards: [here(sbc_plan().datasets[d]) for d in sbc_plan().batches[wildcards.batch]],
    output:
        here(SBC.batch_manifest("{batch}")),
    log:
        here(SBC.fit_log("{batch}")),
    conda:
        "../envs/batchfit.yaml"
    threads: lambda wildcards: fit_threads(BF.sampler.chains, workflow.cores, len(sbc_plan().batches))
    resources:
        mem_mb=4000,
    params:
        config_source=CONFIG_SOURCE,
        datasets=lambda wildcards: sbc_plan().batches[wildcards.batch],
        n_datasets=lambda wildcards: len(sbc_plan().batches[wildcards.batch]),
    message:
        "sbc_fit {wildcards.batch}: {params.n_datasets} simulated dataset(s); log {log}"
    script:
        "../scripts/sbc_fit.py"


rule sbc:
    """Ranks, the uniformity test, the verdict line and one plot per parameter."""
    input:
        simulations=here(SBC.simulations),
        # Not read here: listed so that Snakemake sees the compile from the start and runs it beside
        # the simulation checkpoint; otherwise it appears only after the checkpoint and waits for it.
        compiled=str(compile_stamp_path(BF)),
        batches=lambda wildcards: [here(SBC.batch_manifest(b)) for b in sbc_plan().batches],
    output:
        ranks=here(SBC.ranks_csv),
        ranks_nc=here(SBC.ranks_nc),
        uniformity=here(SBC.uniformity),
        verdict=here(SBC.verdict),
    log:
        here(SBC.log("ranks")),
    conda:
        "../envs/batchfit.yaml"
    params:
        config_source=CONFIG_SOURCE,
        settings={"thin": BF.sbc.thin, "envelope_prob": BF.sbc.envelope_prob},
    script:
        "../scripts/sbc_ranks.py"
