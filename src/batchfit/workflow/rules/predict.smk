# Predictions on new inputs from every fit (config key predict; batchfit.predictions, batchfit's docs/predictions.md).
# `snakemake predict` runs them alone; with predict in the config the default target includes them.
rule predict_batch:
    """Predict one batch of datasets in one process: one forward function per structure (a cache hit), then only
    swapping data. After collect, so that every fit it reads is in results_dir (adopted, without a shared filesystem).
    """
    input:
        compiled=compiled_stamp,
        bundle=compiled_bundle,
        datasets=here(LAYOUT.datasets_csv) if SHARED_FS else [],
        model=lambda wildcards: here(bf(wildcards).model) if SHARED_FS else [],
        imports=lambda wildcards: [here(f) for f in user_import_files(bf(wildcards).model)] if SHARED_FS else [],
        new=predict_new_files if SHARED_FS else [],
        staged=[] if SHARED_FS else str(LAYOUT.staged_predict_inputs("{batch}")),
    output:
        LAYOUT.predict_manifest("{batch}") if SHARED_FS else directory(LAYOUT.predict_outputs("{batch}")),
    log:
        LAYOUT.predict_log("{batch}"),
    conda:
        "../envs/batchfit.yaml"
    resources:
        mem_mb=4000,
    params:
        config_source=CONFIG_SOURCE,
        n_datasets=lambda wildcards: len(predict_members(wildcards)) if knows_plan() else "the staged",
    message:
        "predict {wildcards.batch}: {params.n_datasets} dataset(s); log {log}"
    script:
        "../scripts/predict.py"


rule stage_predict:
    """Without a shared filesystem: what one predict job reads (its datasets, their fits and new-data files, the
    reference dataset's file, the label registry), in one directory that storage moves to it."""
    input:
        compiled=compiled_stamp,
        datasets=here(LAYOUT.datasets_csv),
        new=lambda wildcards: predict_new_files(wildcards) if knows_plan() else [],
    output:
        directory(LAYOUT.staged_predict_inputs("{batch}")),
    log:
        here(LAYOUT.log("stage_predict/{batch}")),
    localrule: True
    conda:
        "../envs/batchfit.yaml"
    params:
        config_source=CONFIG_SOURCE,
    script:
        "../scripts/stage_predict.py"


rule collect_predictions:
    """predictions.csv and prediction_failures.csv, from every dataset's prediction (and failure)."""
    input:
        predict_job_outputs if SHARED_FS else [],
        outputs=[] if SHARED_FS else predict_job_outputs,
    output:
        table=here(LAYOUT.predictions_csv),
        failures=here(LAYOUT.prediction_failures_csv),
    log:
        here(LAYOUT.log("collect_predictions")),
    conda:
        "../envs/batchfit.yaml"
    params:
        config_source=CONFIG_SOURCE,
        settings=lambda wildcards: repr(bf(wildcards).summary),  # a changed interval: the rows again
    script:
        "../scripts/collect_predictions.py"


rule prediction_plots:
    """The predicted curves with their bands over the observed data, for the report (report.datasets). Drawn from
    each dataset's rows as its predict job wrote them, as soon as the jobs predicting the datasets drawn are done
    (beside the other predict jobs and collect_predictions), or after collect_predictions where it adopts them
    (without a shared filesystem)."""
    input:
        prediction_plot_inputs if SHARED_FS else here(rules.collect_predictions.output.table),
    output:
        report(
            directory(here(LAYOUT.prediction_plots)),
            patterns=["{name}.png"],
            caption="../report/predictions.rst",
            category="7. Predictions",
            labels=labelled({"dataset": "{name}"}),
        ),
    log:
        here(LAYOUT.log("prediction_plots")),
    conda:
        "../envs/batchfit.yaml"
    params:
        config_source=CONFIG_SOURCE,
        settings=lambda wildcards: repr((bf(wildcards).report, bf(wildcards).predict)),  # redraw when they change
    script:
        "../scripts/prediction_plots.py"


PREDICT_TARGETS = [
    *(p for output in rules.collect_predictions.output for p in predict_paths(output)),
    *(p for output in rules.prediction_plots.output for p in predict_paths(output)),
]


rule predict:
    """Every pending prediction, predictions.csv and the predicted curves (`snakemake predict`)."""
    input:
        PREDICT_TARGETS,
