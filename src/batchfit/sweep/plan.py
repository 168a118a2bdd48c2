"""The sweep's plan: which datasets exist, which are pending, and the batches that fit them."""

from __future__ import annotations

import hashlib
import json
import logging
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from batchfit import __version__
from batchfit.compile.fingerprint import LIBRARIES
from batchfit.config import Config
from batchfit.data.discovery import DatasetIndex, discover_datasets
from batchfit.fitting.fit_register import FIT, FitRegister, files_entry, settle
from batchfit.fitting.provenance import expected_digests, write_planned
from batchfit.model.imports import user_imports
from batchfit.outputs.orphans import move_orphans
from batchfit.predictions.provenance import predict_parts
from batchfit.records.plan import PlanRecord
from batchfit.settings import AUTO

log = logging.getLogger("batchfit")


@dataclass(frozen=True)
class Plan:
    """Every dataset of the sweep, and the batches of those still to fit."""

    datasets: Mapping[str, Path]
    batches: dict[str, list[str]]


def batch_id(dataset_ids: Sequence[str], digests: Sequence[str] = (), retry: int = 0) -> str:
    """A batch's name from its members, their expected provenance digests and the retry number.

    The same pending datasets give the same job; a changed setting gives new names, so
    Snakemake runs the batch again instead of finding the manifest of an earlier run.
    """
    lines = [f"{d} {p}" for d, p in zip(dataset_ids, digests, strict=True)] if digests else list(dataset_ids)
    lines += [f"retry {retry}"] if retry else []
    digest = hashlib.sha256("\n".join(lines).encode()).hexdigest()[:12]
    return f"batch-{digest}"




def plan(config: Config, cores: int | None = 1) -> Plan:
    """Cut all datasets, in id order, into chunks of `batch_size`; batch each chunk's pending ones.

    Only pending datasets are fitted, so adding a dataset to a finished sweep fits just that one,
    and a re-run retries just the datasets that failed or whose provenance changed. Chunks are
    cut from *all* datasets, not from the pending ones, so that finishing one batch never
    changes another. (A batch that ran and failed does change it: jobs therefore read the plan
    their sweep recorded, see `sweep_plan`.) Cheap enough for every parse: no model is built
    (see `batchfit.fitting.provenance` for the costs). ``cores``: as for `batch_size`.
    """
    datasets = discover_datasets(config.data_sources)
    expected = expected_digests(config, datasets)
    register = FitRegister.current(config.layout)
    ids = list(datasets)
    size = batch_size(config, len(ids), cores)
    batches = {}
    for chunk in (ids[i:i + size] for i in range(0, len(ids), size)):
        # A dataset needs fitting if it has no fit, or its fit recorded another provenance digest: by
        # content, not modification time, so touching a file refits nothing and a changed setting, model or
        # data refits exactly what it affects.
        pending = [d for d in chunk if register.digest(d) != expected[d]]
        if pending:
            batches[untried_batch_id(config, pending, [expected[d] for d in pending])] = pending
    return Plan(datasets, batches)


# `batch_size: auto`. Every fit job first pays a fixed start (imports and cache load, longer on a
# cluster's shared filesystem, plus the queue's wait there).
_LOCAL_MIN_BATCH = 4  # below this, a job's start costs more than running the datasets in fewer jobs


_CLUSTER_JOBS = 100  # enough jobs to spread over a cluster's nodes ...


_CLUSTER_MIN_BATCH = 20  # ... each long enough to pay for its start and queueing ...


_CLUSTER_MAX_BATCH = 500  # ... and short enough that a job killed and retried refits little


def batch_size(config: Config, n_datasets: int, cores: int | None) -> int:
    """Datasets per fit job: the config's ``batch_size``, or for ``auto`` one chosen from the sweep.

    On one machine (``cores`` its cores for the sweep) about one batch per core: the jobs' starts
    run side by side and then every core samples (`fit_threads`; a job with more threads than
    chains samples several datasets at once). On a cluster (``cores`` None) about 100 jobs of 20
    to 500 datasets. Depends only on the config, the number of datasets and ``cores``, so every
    process planning the same sweep cuts the same batches.
    """
    if config.batch_size != AUTO:
        return int(config.batch_size)
    if cores is None:
        return min(_CLUSTER_MAX_BATCH, max(_CLUSTER_MIN_BATCH, math.ceil(n_datasets / _CLUSTER_JOBS)))
    jobs = max(1, min(cores, n_datasets // _LOCAL_MIN_BATCH))
    return max(1, math.ceil(n_datasets / jobs))


def untried_batch_id(config: Config, dataset_ids: Sequence[str], digests: Sequence[str]) -> str:
    """The first name of these pending datasets whose batch has no manifest yet.

    A manifest under the first name means the batch ran and its datasets are still pending (they
    failed, or their fits were deleted): they are tried again under a new name, which Snakemake
    has not seen done.
    """
    retry = 0
    while config.layout.batch_manifest(name := batch_id(dataset_ids, digests, retry)).exists():
        retry += 1
    return name


def write_plan(config: Config, sweep: Plan) -> None:
    """Record the plan a sweep runs with (its main process does, once its jobs are decided), with
    what planning it computed before the results directory existed (`provenance.write_planned`);
    move the outputs of datasets no longer in the sweep out of the way (`move_orphans`)."""
    move_orphans(config.layout, list(sweep.datasets))
    settle(config.layout, sweep.datasets)  # what the last run's fit jobs changed, if its collect did not run
    plan_record(sweep).write(config.layout.plan)
    write_planned(config)


def plan_record(sweep: Plan) -> PlanRecord:
    """The plan as ``plan.json`` keeps it (`read_plan` reads it)."""
    datasets = sweep.datasets
    index = datasets if isinstance(datasets, DatasetIndex) else DatasetIndex(datasets.items())
    groups = {d: g for d in index if (g := index.group(d)) is not None}
    return PlanRecord({d: str(p) for d, p in datasets.items()}, groups, sweep.batches)


def read_plan(record: PlanRecord) -> Plan:
    """The plan a `plan_record` describes."""
    return Plan(DatasetIndex(record.datasets.items(), groups=record.groups), record.batches)


def sweep_plan(config: Config, *, job: bool, cores: int | None = 1) -> Plan:
    """The plan of a sweep: computed by its main process, read back by its jobs.

    A job (a cluster job, or any Snakemake run of given ``--target-jobs``) re-parses the
    Snakefile after other jobs have changed what is pending: a failed dataset is pending again,
    a killed batch is half done. Computing the plan there would cut other batches than the ones
    the main process scheduled, and ``collect`` would wait for manifests never written. So a
    job uses the recorded plan (`write_plan`) when there is one. ``cores``: as for `batch_size`.
    """
    path = config.layout.plan
    if not job or not path.exists():
        return plan(config, cores)
    return read_plan(PlanRecord.read(path))


def still_pending(config: Config, dataset_ids: Sequence[str]) -> list[str]:
    """Those of ``dataset_ids`` without a fit of the current provenance.

    A retried job (after its first attempt was killed) fits only what the first one left.
    """
    expected = expected_digests(config, discover_datasets(config.data_sources))  # all: the coding is the sweep's
    recorded = {d: files_entry(config.layout, d) for d in dataset_ids}  # its own files: a killed attempt's fits
    return [d for d in dataset_ids if d not in expected or (recorded[d] or [None, None])[:2] != [FIT, expected[d]]]


def compile_stamp_path(config: Config) -> Path:
    """Where the compile stage records that the cache holds this model: inside the cache.

    Named by the content of the model file and of the user modules it imports, build_model's parameters,
    the CPU target, the library versions and the ``predict`` settings (the bundle holds the predictions'
    forward function: `batchfit.predictions.ahead`), so a sweep whose results were deleted (or a second sweep
    of the same model) finds the cache already filled and Snakemake skips the compile job; a changed model
    or helper module, or an upgrade, compiles again.
    """
    from importlib.metadata import version


    parts = [Path(config.model).read_bytes(), json.dumps(user_imports(config.model)).encode(), __version__.encode(),
             json.dumps(config.params, sort_keys=True).encode(),  # a constant parameter is another structure
             config.cache.cpu_target.encode(),
             *(f"{name}={version(name)}".encode() for name in LIBRARIES),
             *([json.dumps(predict_parts(config).parts["predict"]).encode()] if config.predict.enabled else [])]
    digest = hashlib.sha256(b"\n".join(parts)).hexdigest()[:20]
    return Path(config.cache_dir) / "batchfit" / "compiled" / f"{Path(config.model).stem}-{digest}.json"


def compiled_bundle_path(config: Config) -> Path:
    """Where the compile stage writes the bundle of its entries for the fit jobs (`batchfit.cache.bundle`).

    Beside the stamp and named alike, not under ``results_dir``: a sweep whose results were
    deleted, or another sweep of the same model, finds both and skips the compile job, as before.
    Without a shared filesystem Snakemake moves it through storage like any other file.
    """
    return compile_stamp_path(config).with_suffix(".zip")
