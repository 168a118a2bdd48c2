rule compile:
    """Compile the model once into the shared cache (fit jobs then only load it), and write the
    compiled bundle: its entry as a file, which every fit job takes, so that a job whose cache lacks
    the entry (no shared filesystem) installs it instead of compiling (batchfit.cache.bundle).

    No params: they are a rerun trigger, and the stamp is shared by every sweep of this model,
    whatever its config file is called (the Snakefile has already validated the config).
    The model and its local imports are `ancient`: the stamp's and the bundle's names hold their
    content digest, so touching a file without changing it must not compile again. One job per
    stamp: per variant in a sweep of variants, but once for the variants that share a model and
    its parameters.
    """
    input:
        model=lambda wildcards: ancient(here(STAMPS[wildcards.stamp].model)),
        imports=lambda wildcards: [ancient(here(f)) for f in user_import_files(STAMPS[wildcards.stamp].model)],
    output:
        stamp=COMPILED,
        bundle=BUNDLE,
    log:
        here(BF.layout.log("compile/{stamp}")),
    benchmark:
        here(BF.layout.benchmark("compile/{stamp}"))
    conda:
        "../envs/batchfit.yaml"
    # Two processes: the log density's callback compiles beside the rest (batchfit.compile.build).
    threads: 2
    resources:
        mem_mb=4000,
    script:
        "../scripts/compile.py"
