rule compile:
    """Compile the model once into the shared cache (fit jobs then only load it)."""
    input:
        model=str(BF.model),
    output:
        COMPILED,
    params:
        config_source=CONFIG_SOURCE,
    log:
        RESULTS / "logs" / "compile.log",
    resources:
        mem_mb=4000,
    conda:
        "../envs/batchfit.yaml"
    script:
        "../../scripts/compile.py"
