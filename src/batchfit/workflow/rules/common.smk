# Config validation and the sweep's plan: which datasets exist and which batches still need fitting.
import functools
import re
import sys

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate
from snakemake_interface_executor_plugins.settings import SharedFSUsage

from batchfit.compat.snakemake import end_snakemake_rate_timers, exit_run
from batchfit.sweep.snakemake_job import snakemake_config
from batchfit.variants import configs_of
from batchfit.sweep.resources import fit_resources, fit_threads
from batchfit.model.imports import user_import_files
from batchfit.fitting.refit_records import RefitPlan
from batchfit.sweep.plan import compile_stamp_path, compiled_bundle_path, plan, sweep_plan, write_plan
from batchfit.sweep.sbc.sweep import sbc_config, template, template_sweep_coding
from batchfit.sweep.predict_plan import sweep_predict_plan, write_predict_plan
from batchfit.predictions.new_data import new_data_files
from batchfit.predictions.drawn import batches_drawn

CONFIG_SOURCE = ", ".join(map(str, workflow.configfiles)) or "<snakemake config>"
# batchfit's checks first: their messages name the key (with a did-you-mean) and the config file,
# and check the model file; Snakemake's validate then fills the defaults in for the jobs.
BF = snakemake_config(config, CONFIG_SOURCE)
validate(config, "../schemas/config.schema.yaml")
# A sweep of variants (batchfit.variants, docs/variants.md) is one sweep per variant under
# results_dir/{variant}/: every rule below runs per variant, its config the variant's own (`bf`).
CONFIGS = configs_of(BF)
VARIANTS = [variant for variant in CONFIGS if variant is not None]
LAYOUT = BF.layout.variant("{variant}") if VARIANTS else BF.layout
# Compile stamps, by name: variants that share a model and its parameters share one compile. The
# sweep's own config's too: an SBC run (rules/sbc.smk) fits it, without its variants.
STAMPS = {compile_stamp_path(c).stem: c for c in [BF, *CONFIGS.values()]}
COMPILED = compile_stamp_path(BF).parent / "{stamp}.json"
BUNDLE = compiled_bundle_path(BF).parent / "{stamp}.zip"


wildcard_constraints:
    variant="|".join(map(re.escape, VARIANTS)) or "(?!)",
    stamp="|".join(map(re.escape, STAMPS)),
    refit_batch="refit-[0-9a-f]+",


# Without a shared filesystem (`--shared-fs-usage none` and a storage plugin: docs/cluster.md) only the
# fit jobs run elsewhere, each reading its staged inputs and writing a directory of its own
# (batchfit.sweep.fit_job); every other rule runs on the submitting machine, which keeps the
# results directory and the data: their files are `here` (local), and Snakemake runs a job with a
# local file where it was started.
SHARED_FS = SharedFSUsage.INPUT_OUTPUT in workflow.storage_settings.shared_fs_usage


def here(path):
    """``path`` on the submitting machine, never moved through a storage plugin (Snakemake's `local`)."""
    return local(str(path))


def knows_plan():
    """Whether this process knows the sweep's plan: the main process, and a job on a shared
    filesystem (it reads the recorded plan); a fit job without one has only its staged inputs."""
    return SHARED_FS or workflow.is_main_process


def bf(wildcards):
    """The config of a job's variant: the sweep's own config without variants."""
    return CONFIGS[wildcards.get("variant")]


def labelled(labels):
    """A report item's labels, with its variant's in a sweep of variants."""
    return {"variant": "{variant}", **labels} if VARIANTS else labels


def variant_paths(path):
    """Every variant's ``path`` (a `LAYOUT` path), or ``path`` itself without variants."""
    return [here(p) for p in expand(str(path), variant=VARIANTS)] if VARIANTS else [here(path)]


def total_cores():
    """--cores, or None on a cluster: its executors leave it unset (each job gets its own cores)."""
    try:
        return workflow.cores
    except WorkflowError:
        return None


# A cluster job killed for memory or time is retried with more of both (see fit_resources);
# on one machine a retry would only repeat the same error.
CLUSTER = not workflow.is_main_process or total_cores() is None
FIT_RETRIES = 2 if CLUSTER else 0


def in_job():
    """Whether this process runs given jobs of a sweep: a cluster job, or a run of --target-jobs.

    Known only once Snakemake builds the DAG (after parsing), hence a function.
    """
    return not workflow.is_main_process or bool(workflow.dag_settings.target_jobs)


def sweep_cores():
    """The cores a sweep's batches and threads are cut for: None on a cluster (and in its jobs)."""
    return None if CLUSTER or in_job() else total_cores()


@functools.cache
def sweep(variant=None):
    """The sweep's plan (a variant's). A job uses the one its sweep's main process recorded (onstart,
    below): re-planned inside a job, a failed or half-done batch would be cut anew."""
    return sweep_plan(CONFIGS[variant], job=in_job(), cores=sweep_cores())


def fit_job_threads(wildcards):
    """On a cluster (and in its jobs) one thread per chain; on one machine the cores are shared
    out between the batches (of every variant)."""
    cores = sweep_cores()
    n_batches = sum(len(sweep(variant).batches) for variant in CONFIGS) if cores is not None else 0
    return fit_threads(bf(wildcards).sampler.chains, cores, n_batches)


def record_plan():
    """Record the plan for the sweep's jobs (the main process only, once Snakemake has started).

    A function, so that a project using this workflow as a module can call it from its own
    `onstart:` (Snakemake runs only the main Snakefile's).
    """
    if not in_job():
        for variant, variant_config in CONFIGS.items():
            write_plan(variant_config, sweep(variant))
        record_predict_plan()  # rules/predict.smk


onstart:
    record_plan()


def end_run(error=False):
    """End the run with the status rule's verdict as its last lines, success or not: how many datasets were
    fitted and how healthy, and which failed (`batchfit.sweep.verdict.end_of_run`), exiting non-zero when
    datasets failed or (`error=True`) a job did; and let Snakemake exit as soon as the run ends, not a
    second later (the scheduler's last timer: `batchfit.compat.snakemake.end_snakemake_rate_timers`; the
    interpreter's last garbage collections: `batchfit.common.collector`).

    A function, so that a project using this workflow as a module can call it from its own
    `onsuccess:` and `onerror:` (Snakemake runs only the main Snakefile's): last in both, since it
    ends the process. A run that wrote no verdict (a job failed before the status rule, or a target
    without it, such as `snakemake sbc`) is left to end as Snakemake ends it.
    """
    from batchfit.common import collector
    from batchfit.sweep.verdict import end_of_run  # here: parsing the Snakefile waits for no more imports

    end_snakemake_rate_timers()
    collector.freeze()  # the run is over: the interpreter's collections at exit skip Snakemake's whole heap
    ends = [end_of_run(c, since=workflow.start_time.timestamp()) for c in CONFIGS.values()]
    code, verdict = max(c for c, _ in ends), "\n".join(v for _, v in ends if v)
    if not verdict:
        return
    if error:
        logs = ", ".join(map(str, workflow.logger_manager.get_logfile())) or "none"
        code, verdict = 1, f"{verdict}\nbatchfit: a job failed, its error is above (Snakemake's log: {logs})"
    exit_run(code, verdict)


onsuccess:
    end_run()


onerror:
    end_run(error=True)


def batch_datasets(wildcards):
    """Data files of one batch, or the tables its datasets are groups of (inputs: they must exist; a changed
    one changes the batch's name)."""
    datasets = sweep(wildcards.get("variant")).datasets
    return list(dict.fromkeys(str(datasets[d]) for d in batch_members(wildcards)))


def batch_members(wildcards):
    """The datasets of one batch, as planned; an unknown batch is an error naming the plan."""
    try:
        return sweep(wildcards.get("variant")).batches[wildcards.batch]
    except KeyError:
        raise WorkflowError(f"batch {wildcards.batch} is not in the sweep's plan ({bf(wildcards).layout.plan})")


def fit_job_outputs(wildcards):
    """Every fit job's declared output (fit.smk): its batch manifest, or without a shared filesystem
    its own results directory, which collect adopts."""
    layout = bf(wildcards).layout
    output = layout.batch_manifest if SHARED_FS else layout.batch_outputs
    return [str(output(b)) for b in sweep(wildcards.get("variant")).batches]


def batch_size(wildcards):
    """The number of datasets in a batch; a fit job without a shared filesystem knows only "the staged"."""
    return len(batch_members(wildcards)) if knows_plan() else "the staged"


def compiled_stamp(wildcards):
    """The compile stamp of a job's variant (`compile` rule)."""
    return str(compile_stamp_path(bf(wildcards)))


def compiled_bundle(wildcards):
    """The compiled bundle of a job's variant (`compile` rule), which its fit jobs install from."""
    return str(compiled_bundle_path(bf(wildcards)))


def fit_resource(name):
    """A fit job's `name` resource from the batch and the compile stage's measurement. (In a fit job
    without a shared filesystem, which has no plan, its resources are granted already: one dataset's.)"""
    return lambda wildcards, input, threads, attempt: fit_resources(
        bf(wildcards).sampler, len(batch_members(wildcards)) if knows_plan() else 1, input.compiled, attempt, threads
    )[name]


# Simulation-based calibration (rules/sbc.smk): the simulated sweep's plan.

SBC = BF.layout.sbc
SBC_SETTINGS = {
    "n_simulations": BF.sbc.n_simulations,
    "template": BF.sbc.template,
    "seed": BF.sbc.seed,
    "simulator": str(BF.sbc.simulator or BF.model),
}


@functools.cache
def _sbc_plan(simulations_mtime_ns):
    """The simulated sweep's plan, made again whenever the checkpoint has rewritten its output.

    Not recorded like the sweep's, so cut alike in every process: as for a cluster (cores None)."""
    return plan(sbc_config(BF), cores=None)


def sbc_plan():
    stamp = Path(checkpoints.sbc_simulate.get().output[0])
    return _sbc_plan(stamp.stat().st_mtime_ns)


# Predictions on new inputs (rules/predict.smk): the prediction plan, and the variants that predict
# (the sweep's own config without variants).
PREDICTING = [variant for variant, c in CONFIGS.items() if c.predict.enabled]


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
        raise WorkflowError(
            f"batch {wildcards.batch} is not in the sweep's prediction plan ({bf(wildcards).layout.predict_plan})"
        )


def predict_new_files(wildcards):
    """The new-data files of one predict batch (predict.data), or the tables its new data are groups of: a
    changed one changes the batch's name."""
    files = new_data_files(bf(wildcards))
    return list(dict.fromkeys(here(files[d]) for d in predict_members(wildcards) if d in files))


def predict_job_outputs(wildcards):
    """Every pending predict job's declared output: its manifest, or without a shared filesystem its own directory."""
    layout = bf(wildcards).layout
    output = layout.predict_manifest if SHARED_FS else layout.predict_outputs
    return [str(output(b)) for b in predict_sweep(wildcards.get("variant")).batches]


def prediction_plot_inputs(wildcards):
    """The predict jobs the report's curves wait for: those predicting a dataset drawn (the others go on beside)."""
    plan = predict_sweep(wildcards.get("variant"))
    layout = bf(wildcards).layout
    return [str(layout.predict_manifest(b)) for b in batches_drawn(bf(wildcards).report, plan.predicted, plan.batches)]


def predict_paths(path):
    """``path`` (a `LAYOUT` path) of every variant that predicts."""
    if VARIANTS:
        return [here(p) for p in expand(str(path), variant=PREDICTING)]
    return [here(path)] if PREDICTING else []


# The exact comparisons of a sweep of variants (rules/compare.smk): the refit plan's batches.


def planned_refits():
    """The refit plan the checkpoint wrote (a function: known once it ran)."""
    return RefitPlan.read(checkpoints.refit_plan.get().output[0])


def refit_manifests(wildcards):
    """Every pending refit batch's manifest: the compare rule waits for them."""
    plan = planned_refits()
    return [here(CONFIGS[plan.batch_variant(b)].layout.refit_manifest(b)) for b in plan.batches]


def refit_resource(name):
    """A refit job's `name` resource, as a fit job's of as many datasets."""
    return lambda wildcards, input, threads, attempt: fit_resources(
        bf(wildcards).sampler, len(planned_refits().batches[wildcards.refit_batch]), input.compiled, attempt, threads
    )[name]
