"""The sweep's stages as plain functions: plan, compile, fit, collect, status.

The Snakemake rules (``scripts/*.py``) and the ``batchfit`` command line both call these, so a
sweep behaves the same with or without Snakemake.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import math
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from batchfit.atomic import atomic_path
from batchfit.config import AUTO, Config, check_model_file, config_from_dict
from batchfit.cputarget import apply_cpu_target
from batchfit.data import DatasetFiles, discover_datasets
from batchfit.errors import BatchfitError, is_expected
from batchfit.lanes import lane_count
from batchfit.provenance import expected_digests, recorded_digest, write_planned
from batchfit.standby import Standby, compile_workers

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


def is_pending(config: Config, dataset_id: str, expected_digest: str) -> bool:
    """A dataset needs fitting if it has no fit, or its fit recorded another provenance digest.

    By content, not modification time: touching the model or a data file refits nothing, and
    a changed sampler or outputs setting, model or data file refits exactly what it affects.
    """
    return recorded_digest(config, dataset_id) != expected_digest


def plan(config: Config, cores: int | None = 1) -> Plan:
    """Cut all datasets, in id order, into chunks of `batch_size`; batch each chunk's pending ones.

    Only pending datasets are fitted, so adding a dataset to a finished sweep fits just that one,
    and a re-run retries just the datasets that failed or whose provenance changed. Chunks are
    cut from *all* datasets, not from the pending ones, so that finishing one batch never
    changes another. (A batch that ran and failed does change it: jobs therefore read the plan
    their sweep recorded, see `sweep_plan`.) Cheap enough for every parse: no model is built
    (see `batchfit.provenance` for the costs). ``cores``: as for `batch_size`.
    """
    datasets = discover_datasets(config)
    expected = expected_digests(config, datasets)
    ids = list(datasets)
    size = batch_size(config, len(ids), cores)
    batches = {}
    for chunk in (ids[i:i + size] for i in range(0, len(ids), size)):
        pending = [d for d in chunk if is_pending(config, d, expected[d])]
        if pending:
            batches[untried_batch_id(config, pending, [expected[d] for d in pending])] = pending
    return Plan(datasets, batches)


# `batch_size: auto`. Every fit job first pays a fixed start (~2.3 s of imports and cache load on a
# laptop, more on a cluster's shared filesystem, plus the queue's wait there).
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
    while config.batch_manifest_path(name := batch_id(dataset_ids, digests, retry)).exists():
        retry += 1
    return name


def plan_path(config: Config) -> Path:
    """Where a sweep's main Snakemake process records its plan for the sweep's jobs."""
    return config.results_dir / "plan.json"


def write_plan(config: Config, sweep: Plan) -> None:
    """Record the plan a sweep runs with (its main process does, once its jobs are decided), with
    what planning it computed before the results directory existed (`provenance.write_planned`)."""
    write_json(plan_path(config), {"datasets": {d: str(p) for d, p in sweep.datasets.items()},
                                   "batches": sweep.batches})
    write_planned(config)


def sweep_plan(config: Config, *, job: bool, cores: int | None = 1) -> Plan:
    """The plan of a sweep: computed by its main process, read back by its jobs.

    A job (a cluster job, or any Snakemake run of given ``--target-jobs``) re-parses the
    Snakefile after other jobs have changed what is pending: a failed dataset is pending again,
    a killed batch is half done. Computing the plan there would cut other batches than the ones
    the main process scheduled, and ``collect`` would wait for manifests never written. So a
    job uses the recorded plan (`write_plan`) when there is one. ``cores``: as for `batch_size`.
    """
    path = plan_path(config)
    if not job or not path.exists():
        return plan(config, cores)
    try:
        recorded = json.loads(path.read_text())
        return Plan(DatasetFiles(recorded["datasets"].items()),
                    {b: list(ids) for b, ids in recorded["batches"].items()})
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise BatchfitError(f"the sweep's plan {path} is unreadable ({exc}); delete it and run the sweep "
                            "again") from exc


def still_pending(config: Config, dataset_ids: Sequence[str]) -> list[str]:
    """Those of ``dataset_ids`` without a fit of the current provenance.

    A retried job (after its first attempt was killed) fits only what the first one left.
    """
    expected = expected_digests(config, discover_datasets(config))  # all: the coding is the sweep's
    return [d for d in dataset_ids if d not in expected or is_pending(config, d, expected[d])]


def run_compile(config: Config, *, workers: int | Standby = 1) -> dict[str, Any]:
    """Fill the cache ahead of the fit jobs with the reference dataset's structure.

    A structure batchfit's cached path cannot take is reported (a warning) and left to nutpie's
    own compile in the fit jobs; other structures met in the fit jobs are compiled there, once.
    ``workers``: the processes compiling at once (two halves of the entry; more add nothing),
    or the `compile_workers` the caller started before its own imports (the rule script does).
    """
    from batchfit.cache import open_cache

    # Opening the cache sets the environment the compile workers import numba and PyTensor
    # under (PyTensor's and numba's cache directories; the CPU target was set with the config).
    open_cache(config.cache_dir, trust_shared=config.cache.trust_shared)
    with contextlib.ExitStack() as stack:
        standby = workers if isinstance(workers, Standby) else stack.enter_context(compile_workers(workers))
        from batchfit.compile import worker_environment

        standby.announce(worker_environment())  # the early worker waits for it to import numba
        from batchfit.fit import Fitter, prepare

        cache, _, ref = prepare(config)
        fitter = Fitter(config, ref, cache, compile_workers=standby)
    structure = fitter.reference
    return {"key": structure.key, "structure": structure.id, "path": structure.path,
            "reference_dataset": ref.dataset.id, "line": fitter.compile_line,
            "reference_fit": measure_fit(config, fitter)}


def measure_fit(config: Config, fitter: Any) -> dict[str, Any] | None:
    """Fit the reference dataset once (not kept) and measure it: what a fit job's resources scale from.

    ``fitter`` holds the reference structure, just compiled. One thread and the compiling
    process's memory: both err on the large side for a fit job. None when the fit fails: that
    dataset's own fit job records the failure, and the jobs get default resources.
    """
    import resource

    from batchfit.fit import after_sampling, one_line

    ref = fitter.ref.dataset
    start = time.perf_counter()
    try:
        fitter.sample(fitter.build(ref), ref, fitter.reference, threads=1,
                      provenance=fitter.provenance(ref.id, ref.path))
    except Exception as exc:  # the sweep goes on; fit_resources falls back to its defaults
        after_sampling()  # a failed sample's chain threads may outlive it; this process ends soon
        log.log(logging.WARNING if is_expected(exc) else logging.ERROR,
                "measuring a fit of %s failed (%s); fit jobs get default resources", ref.id, one_line(exc),
                exc_info=None if is_expected(exc) else exc)
        return None
    seconds = time.perf_counter() - start
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    s = config.sampler
    return {"seconds": round(seconds, 3), "peak_rss_mb": round(peak_mb), "draws": s.draws + s.tune, "chains": s.chains}


# A fit job's resources: what the compile stage measured (`measure_fit`), scaled to the sweep's
# sampler and the batch, with margins: sampling time varies between datasets far more than memory.
# Before any measurement (a compile stamp written by an older batchfit) the defaults apply.
_JOB_START_SECONDS = 120  # imports and cache load (~3 s locally, far more on a busy shared filesystem)
_TIME_MARGIN = 3.0
_MEMORY_MARGIN = 1.5
_UNMEASURED = {"seconds": 60.0, "peak_rss_mb": 2000, "draws": 2000, "chains": 4}


def fit_resources(config: Config, n_datasets: int, stamp_path: str | Path, attempt: int = 1,
                  threads: int = 1) -> dict[str, int]:
    """``mem_mb`` and ``runtime`` (minutes) for a fit job of ``n_datasets`` on ``threads``; both grow with ``attempt``.

    A job killed for memory or time is retried by Snakemake with ``attempt`` + 1: it then asks
    for twice (three times, ...) as much, and fits only the datasets the killed attempt left. A
    job with several lanes (`batchfit.lanes`) needs a process's memory per lane and fits that
    many datasets at once.
    """
    try:
        measured = json.loads(Path(stamp_path).read_text()).get("reference_fit") or _UNMEASURED
    except (OSError, ValueError):
        measured = _UNMEASURED
    s = config.sampler
    work = ((s.draws + s.tune) * s.chains) / max(1, measured["draws"] * measured["chains"])
    lanes = lane_count(threads, s.chains, n_datasets)
    seconds = _JOB_START_SECONDS + math.ceil(n_datasets / lanes) * measured["seconds"] * work * _TIME_MARGIN
    return {"mem_mb": math.ceil(measured["peak_rss_mb"] * _MEMORY_MARGIN) * lanes * attempt,
            "runtime": math.ceil(seconds / 60) * attempt}


def compile_stamp_path(config: Config) -> Path:
    """Where the compile stage records that the cache holds this model: inside the cache.

    Named by the content of the model file and of the user modules it imports, the CPU target and
    the library versions, so a sweep whose results were deleted (or a second sweep of the same
    model) finds the cache already filled and Snakemake skips the compile job; a changed model
    or helper module, or an upgrade, compiles again.
    """
    from importlib.metadata import version

    from batchfit import __version__
    from batchfit.fingerprint import LIBRARIES
    from batchfit.model_imports import user_imports

    parts = [Path(config.model).read_bytes(), json.dumps(user_imports(config.model)).encode(), __version__.encode(),
             config.cache.cpu_target.encode(),
             *(f"{name}={version(name)}".encode() for name in LIBRARIES)]
    digest = hashlib.sha256(b"\n".join(parts)).hexdigest()[:20]
    return Path(config.cache_dir) / "batchfit" / "compiled" / f"{Path(config.model).stem}-{digest}.json"


def fit_threads(config: Config, cores: int | None, n_batches: int) -> int:
    """Threads per fit job: all cores for one batch; otherwise split cores across parallel jobs.

    A job's fixed start-up (imports, cache load) is single-threaded, so with several batches
    it is better hidden by running jobs side by side than by giving one job every core. A job
    with more threads than chains samples several datasets at once (`batchfit.lanes`).
    ``cores`` None (a cluster, where each job gets its own cores): one thread per chain.
    """
    if cores is None:
        return config.sampler.chains
    parallel_jobs = max(1, min(n_batches, cores))
    return max(1, cores // parallel_jobs)


def write_json(path: Path, data: Mapping[str, Any]) -> None:
    """Write a small JSON output atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))


def run_fit(config: Config, dataset_ids: Sequence[str] | None = None, *, threads: int = 1) -> int:
    """Fit the given datasets (default: every pending one) batch by batch; return the failure count."""
    from batchfit.fit import fit_batch

    batches = ({batch_id(list(dataset_ids)): list(dataset_ids)} if dataset_ids is not None
               else plan(config).batches)
    failed = 0
    for name, ids in batches.items():
        failed += fit_batch(config, ids, batch_id=name, threads=threads).n_failed
    return failed


def run_collect(config: Config, *, workers: int = 1) -> Any:
    """Combine every dataset's fit into posteriors.nc, summary.csv and failures.csv.

    Every fit must have the provenance the current config gives (see `collect`): a sweep never
    mixes fits made with other settings, models or data. ``workers``: processes that summarise
    new fits at once.
    """
    from batchfit import summary_workers

    datasets = discover_datasets(config)
    # The helpers start now, so that their start-up (collect's imports) overlaps this process's
    # own, and the digests' computing: ready when collect knows which fits are new.
    with summary_workers.started(summary_workers.helpers_for(workers, len(datasets))) as helpers:
        from batchfit.collect import collect, stale_fits_error

        # Only the ids and digests outlive these lines: collect's peak memory at 10,000 datasets
        # held each dataset's Path (~7 MB) and recorded digest (~2 MB) to the end.
        expected = expected_digests(config, datasets)
        dataset_ids = list(datasets)
        del datasets
        # A changed setting makes every fit stale at once: the fits' sidecars (read by every plan)
        # say so before collect reads and summarises each fit only to refuse it (190 s at 10,000
        # datasets). collect still checks the digest each fit itself recorded.
        stale, n_fits = [], 0
        for d in dataset_ids:
            recorded = recorded_digest(config, d)
            n_fits += recorded is not None
            if recorded is not None and recorded != expected[d]:
                stale.append(d)
        if stale:
            raise stale_fits_error(stale, n_fits, config.fit_path)
        return collect(config, dataset_ids, expected_provenance=expected, workers=helpers)


def failure_line(config: Config) -> str | None:
    """One line counting failed datasets, or None when every dataset was fitted."""
    failures = sorted(p.stem for p in (config.results_dir / "failures").glob("*.json"))
    failures = [f for f in failures if f in discover_datasets(config)]
    if not failures:
        return None
    return (f"batchfit: {len(failures)} dataset(s) failed ({', '.join(failures[:5])}"
            f"{', ...' if len(failures) > 5 else ''}); see {config.failures_csv_path}")


def snakemake_config(config: Mapping[str, Any], source: str) -> Config:
    """A Config from Snakemake's config dict, checked as `load_config` checks a config file.

    ``source`` names its files, so every error names the key and the file to fix. Also sets the
    CPU target numba compiles for (`batchfit.cputarget`), which must precede loading numba.
    """
    checked = config_from_dict(dict(config), source=source)
    check_model_file(checked)
    apply_cpu_target(checked.cache.cpu_target, source)
    return checked


@contextlib.contextmanager
def log_to(path: str | Path | None) -> Iterator[None]:
    """Send batchfit's log (and warnings) to a rule's log file for the duration of a job."""
    handler: logging.Handler = logging.FileHandler(path) if path else logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    previous = log.level
    log.setLevel(logging.INFO)
    logging.captureWarnings(True)
    try:
        yield
    except BatchfitError as exc:
        log.error("%s", exc)
        raise
    finally:
        logging.captureWarnings(False)
        root.removeHandler(handler)
        log.setLevel(previous)
        handler.close()
