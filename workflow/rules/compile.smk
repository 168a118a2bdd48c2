rule compile:
    """Compile the model once into the shared cache (fit jobs then only load it).

    No params: they are a rerun trigger, and the stamp is shared by every sweep of this model,
    whatever its config file is called (the Snakefile has already validated the config).
    The model is `ancient`: the stamp's name holds the model's content digest, so touching the
    file without changing it must not compile again. One job per stamp: per variant in a sweep of
    variants, but once for the variants that share a model and its parameters.
    """
    input:
        model=lambda wildcards: ancient(str(STAMPS[wildcards.stamp].model)),
    output:
        COMPILED,
    log:
        BF.layout.log("compile/{stamp}"),
    benchmark:
        BF.layout.benchmark("compile/{stamp}")
    conda:
        "../envs/batchfit.yaml"
    # Two processes: the log density's callback compiles beside the rest (batchfit.compile.build).
    threads: 2
    resources:
        mem_mb=4000,
    script:
        "../../scripts/compile.py"
