# Config validation and the sweep's plan: which datasets exist and which batches still need fitting.
import functools
import sys

from snakemake.exceptions import WorkflowError
from snakemake.utils import validate

from batchfit.compat.snakemake import end_snakemake_rate_timers, exit_run
from batchfit.sweep.snakemake_job import snakemake_config
from batchfit.sweep.resources import fit_resources, fit_threads
from batchfit.model.imports import user_import_files
from batchfit.sweep.plan import compile_stamp_path, compiled_bundle_path, plan, sweep_plan, write_plan
from batchfit.sweep.sbc.sweep import sbc_config, template, template_sweep_coding

CONFIG_SOURCE = ", ".join(map(str, workflow.configfiles)) or "<snakemake config>"
# batchfit's checks first: their messages name the key (with a did-you-mean) and the config file,
# and check the model file; Snakemake's validate then fills the defaults in for the jobs.
BF = snakemake_config(config, CONFIG_SOURCE)
validate(config, "../schemas/config.schema.yaml")
LAYOUT = BF.layout
COMPILED = compile_stamp_path(BF)
BUNDLE = compiled_bundle_path(BF)
# The user modules the model file imports, directly or not: read by every job that builds the model.
MODEL_IMPORTS = user_import_files(BF.model)


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
def sweep():
    """The sweep's plan. A job uses the one its sweep's main process recorded (onstart, below):
    re-planned inside a job, a failed or half-done batch would be cut anew."""
    return sweep_plan(BF, job=in_job(), cores=sweep_cores())


def fit_job_threads(wildcards):
    """On a cluster (and in its jobs) one thread per chain; on one machine the cores are shared
    out between the batches."""
    return fit_threads(BF.sampler.chains, sweep_cores(), len(sweep().batches))


def record_plan():
    """Record the plan for the sweep's jobs (the main process only, once Snakemake has started).

    A function, so that a project using this workflow as a module can call it from its own
    `onstart:` (Snakemake runs only the main Snakefile's).
    """
    if not in_job():
        write_plan(BF, sweep())


onstart:
    record_plan()


def end_run(error=False):
    """End the run: print the status rule's verdict last, and exit non-zero when datasets failed
    (`batchfit.sweep.verdict.end_of_run`); and let Snakemake exit as soon as the run ends, not a
    second later (the scheduler's last timer: `batchfit.compat.snakemake.end_snakemake_rate_timers`).

    A function, so that a project using this workflow as a module can call it from its own
    `onsuccess:` and `onerror:` (Snakemake runs only the main Snakefile's): last in `onsuccess:`,
    since with failed datasets it ends the process. After a failed job (`error=True`) it prints the
    verdict, if there is one, and leaves the exit to Snakemake.
    """
    from batchfit.sweep.verdict import end_of_run  # here: parsing the Snakefile waits for no more imports

    end_snakemake_rate_timers()
    code, verdict = end_of_run(BF)
    if verdict and error:
        print(verdict, file=sys.stderr)
    elif verdict:
        exit_run(code, verdict)


onsuccess:
    end_run()


onerror:
    end_run(error=True)


def batch_datasets(wildcards):
    """Data files of one batch (inputs: they must exist; a changed one changes the batch's name)."""
    return [str(sweep().datasets[d]) for d in batch_members(wildcards)]


def batch_members(wildcards):
    """The datasets of one batch, as planned; an unknown batch is an error naming the plan."""
    try:
        return sweep().batches[wildcards.batch]
    except KeyError:
        raise WorkflowError(f"batch {wildcards.batch} is not in the sweep's plan ({LAYOUT.plan})")


def batch_manifests(wildcards):
    return [str(BF.layout.batch_manifest(b)) for b in sweep().batches]


def fit_resource(name):
    """A fit job's `name` resource from the batch and the compile stage's measurement."""
    return lambda wildcards, input, threads, attempt: fit_resources(
        BF.sampler, len(batch_members(wildcards)), input.compiled, attempt, threads
    )[name]


# Simulation-based calibration (workflow/rules/sbc.smk): the simulated sweep's plan.

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
