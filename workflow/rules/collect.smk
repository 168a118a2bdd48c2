rule collect:
    """Combine every dataset's fit into the sweep's outputs (also when some datasets failed)."""
    input:
        batch_manifests,
    output:
        posteriors=RESULTS / "posteriors.nc",
        summary=RESULTS / "summary.csv",
        failures=RESULTS / "failures.csv",
    params:
        config_source=CONFIG_SOURCE,
    log:
        RESULTS / "logs" / "collect.log",
    conda:
        "../envs/batchfit.yaml"
    script:
        "../../scripts/collect.py"


localrules:
    status,


rule status:
    """Fail the run (keeping collect's outputs) when a dataset failed; a re-run retries those.

    A local `run:` rule: it only reads the failure records, so it needs no fresh interpreter.
    """
    input:
        rules.collect.output.failures,
    output:
        touch(RESULTS / "status.ok"),
    log:
        RESULTS / "logs" / "status.log",
    run:
        line = failure_line(BF)
        Path(log[0]).write_text((line or "every dataset was fitted") + "\n")
        if line:
            raise WorkflowError(line)
