# Predictions on new inputs from every fit (config key predict; batchfit.predict, batchfit's docs/predictions.md).
# `snakemake predict` runs them alone; with predict in the config the default target includes them.
from batchfit.sweep.predict_plan import sweep_predict_plan, write_predict_plan
from batchfit.predict.new_data import new_data_files

# The variants that predict (the sweep's own config without variants).
PREDICTING = [variant for variant, c in CONFIGS.items() if c.predict is not None]


@functools.cache
def predict_sweep(variant=None):
    """The prediction plan (a variant's); a job uses the one its sweep's main process recorded (`record_predict_plan`)."""
    return sweep_predict_plan(CONFIGS[variant], job=in_job(), cores=sweep_cores())


def record_predict_plan():
    """Record the prediction plans for the predict jobs (the main process, when the run starts: `record_plan`)."""
    if not in_job():
        for variant in PREDICTING:
            write_predict_plan(CONFIGS[variant], predict_sweep(variant))


def predict_members(wildcards):
    """The datasets of one predict batch, as planned; an unknown batch is an error naming the plan."""
    try:
        return list(predict_sweep(wildcards.get("variant")).batches[wildcards.batch])
    except KeyError:
        raise WorkflowError(f"batch {wildcards.batch} is not in the sweep's prediction plan ({bf(wildcards).layout.predict_plan})")


def predict_new_files(wildcards):
    """The new-data files of one predict batch (predict.data): a changed one changes the batch's name."""
    files = new_data_files(bf(wildcards))
    return [here(files[d]) for d in predict_members(wildcards) if d in files]


def predict_job_outputs(wildcards):
    """Every pending predict job's declared output: its manifest, or without a shared filesystem its own directory."""
    layout = bf(wildcards).layout
    output = layout.predict_manifest if SHARED_FS else layout.predict_outputs
    return [str(output(b)) for b in predict_sweep(wildcards.get("variant")).batches]


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
        "../../scripts/predict.py"


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
        "../../scripts/stage_predict.py"


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
        "../../scripts/collect_predictions.py"


rule prediction_plots:
    """The predicted curves with their bands over the observed data, for the report (report.datasets)."""
    input:
        here(rules.collect_predictions.output.table),
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
        "../../scripts/prediction_plots.py"


def predict_paths(path):
    """``path`` (a `LAYOUT` path) of every variant that predicts."""
    if VARIANTS:
        return [here(p) for p in expand(str(path), variant=PREDICTING)]
    return [here(path)] if PREDICTING else []


PREDICT_TARGETS = [
    *(p for output in rules.collect_predictions.output for p in predict_paths(output)),
    *(p for output in rules.prediction_plots.output for p in predict_paths(output)),
]


rule predict:
    """Every pending prediction, predictions.csv and the predicted curves (`snakemake predict`)."""
    input:
        PREDICT_TARGETS,
