"""The sweep's stages as plain functions: plan, compile, fit, compare, SBC (collect: `collect_job`; the run's
verdict: `verdict`).

The Snakemake rules (``scripts/*.py``) and the ``batchfit`` command line both call these, so a
sweep behaves the same with or without Snakemake.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import resource
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from batchfit.cache.bundle import write_bundle
from batchfit.cache.store import open_cache, read_entry
from batchfit.common import collector
from batchfit.common.standby import Standby
from batchfit.compile.worker_pool import compile_workers, worker_environment
from batchfit.config import Config
from batchfit.errors import is_expected, one_line
from batchfit.fitting.batch import after_sampling, fit_batch
from batchfit.fitting.fitter import Fitter, prepare
from batchfit.fitting.refits import refit_batch
from batchfit.predictions.ahead import compile_forward_ahead
from batchfit.records.compile_stamp import CompileStamp, ReferenceFit
from batchfit.sweep.plan import batch_id, plan
from batchfit.sweep.sbc.ranks import SBCResult, rank_simulations
from batchfit.sweep.sbc.simulate import simulate
from batchfit.sweep.sbc.sweep import sbc_config
from batchfit.variants import variant_configs

log = logging.getLogger("batchfit")


def run_compile(config: Config, *, workers: int | Standby = 1, bundle: Path | None = None) -> CompileStamp:
    """Fill the cache ahead of the fit jobs with the reference dataset's structure; return its compile stamp.

    ``bundle``: where to also write that structure's entry as a compiled bundle, which the fit jobs
    install from when their cache lacks it (`batchfit.cache.bundle`: no shared filesystem).

    A structure batchfit's cached path cannot take is reported (a warning) and left to nutpie's
    own compile in the fit jobs; other structures met in the fit jobs are compiled there, once.
    ``workers``: the processes compiling at once (two halves of the entry; more add nothing),
    or the `compile_workers` the caller started before its own imports (the rule script does).
    """

    # Opening the cache sets the environment the compile workers import numba and PyTensor
    # under (PyTensor's and numba's cache directories; the CPU target was set with the config).
    open_cache(config.cache_dir, trust_shared=config.cache.trust_shared)
    with contextlib.ExitStack() as stack:
        standby = workers if isinstance(workers, Standby) else stack.enter_context(compile_workers(workers))
        standby.announce(worker_environment())  # the early worker waits for it to import numba

        cache, _, ref = prepare(config)
        fitter = Fitter(config, ref, cache, compile_workers=standby)
    collector.resume()  # the imports, the reference model and the compiled function live to the end
    structure = fitter.reference
    # a sampler setting the reference's path cannot honour stops the sweep here, before any fit job
    fitter.check_settings(structure, ref.model, ref.dataset, reference=True)
    measured, tree = measure_fit(config, fitter)
    forward = compile_forward_ahead(config, ref, cache, tree) if tree is not None else None
    stamp = CompileStamp(key=structure.key, structure=structure.id, path=structure.path,
                         reference_dataset=ref.dataset.id, line=fitter.compile_line, reference_fit=measured,
                         forward_key=forward)
    if bundle is not None:  # after the measured fit, which may fill PyTensor's cache further
        keys = [structure.key] if structure.compiled is not None else []
        entries = {key: read_entry(cache, key) for key in [*keys, *([forward] if forward else [])]}
        outputs = config.outputs.log_likelihood or config.outputs.posterior_predictive
        write_bundle(cache, entries, bundle, shared_caches=outputs)
    return stamp


# Iterations of each chain's warm-up and of its draws, at most, in the compile job's measured fit: enough to time
# the sampler's steps (its first, costlier steps included), short beside a sweep's fits, which the compile job delays.
REFERENCE_ITERATIONS = 100


def measure_fit(config: Config, fitter: Any) -> tuple[ReferenceFit | None, Any]:
    """Fit the reference dataset once (not kept) and measure it: what a fit job's resources scale from.

    ``fitter`` holds the reference structure, just compiled. A short fit (`REFERENCE_ITERATIONS`
    warm-up and draws per chain at most; `batchfit.sweep.resources.fit_resources` scales its
    time to the sweep's), on one thread, and the compiling process's memory plus what the
    sweep's longer posterior adds: both err on the large side for a fit job. Returns the measurement
    and the fit (the forward function of the predictions compiles from it), or (None, None) when the
    fit fails: that dataset's own fit job records the failure, and the jobs get default resources.
    """
    s = config.sampler
    short = dataclasses.replace(s, tune=min(s.tune, REFERENCE_ITERATIONS), draws=min(s.draws, REFERENCE_ITERATIONS))
    measured = copy.copy(fitter)  # the same compiled structure, sampling the short fit's iterations
    measured.config = dataclasses.replace(config, sampler=short)
    ref = fitter.ref.dataset
    start = time.perf_counter()
    try:
        tree = measured.sample(measured.build(ref), ref, measured.reference, threads=1,
                               provenance=measured.provenance(ref.id))
    except Exception as exc:  # the sweep goes on; fit_resources falls back to its defaults
        after_sampling()  # a failed sample's chain threads may outlive it; this process ends soon
        log.log(logging.WARNING if is_expected(exc) else logging.ERROR,
                "measuring a fit of %s failed (%s); fit jobs get default resources", ref.id, one_line(exc),
                exc_info=None if is_expected(exc) else exc)
        return None, None
    seconds = time.perf_counter() - start
    log.info("reference fit of %s in %.1f s (%d + %d iterations per chain)", ref.id, seconds, short.tune, short.draws)
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    posterior = tree["posterior"]  # a DataTree's group (nutpie's path) or a Dataset
    per_draw_mb = getattr(posterior, "dataset", posterior).nbytes / 2**20 / short.draws if short.draws else 0.0
    longer_posterior_mb = per_draw_mb * (s.draws - short.draws)
    return ReferenceFit(seconds=round(seconds, 3), peak_rss_mb=round(peak_mb + longer_posterior_mb),
                        draws=short.draws + short.tune, chains=s.chains), tree


def run_fit(config: Config, dataset_ids: Sequence[str] | None = None, *, threads: int = 1) -> int:
    """Fit the given datasets (default: every pending one) batch by batch; return the failure count."""

    batches = ({batch_id(list(dataset_ids)): list(dataset_ids)} if dataset_ids is not None
               else plan(config).batches)
    failed = 0
    for name, ids in batches.items():
        failed += fit_batch(config, ids, batch_id=name, threads=threads).n_failed
    return failed


def run_compare(config: Config, *, threads: int = 1) -> list[Path]:
    """A sweep of variants compared without Snakemake: the refit plan (`batchfit.sweep.refit_plan`), its
    pending refits in this process, one batch after another, then comparison.csv and its report page."""
    from batchfit.outputs.compare import write_comparison  # arviz_stats: only where variants are compared
    from batchfit.sweep.refit_plan import write_refit_plan

    plan = write_refit_plan(config)
    configs = variant_configs(config)
    for batch, refits in plan.batches.items():
        refit_batch(configs[plan.batch_variant(batch)], refits, batch_id=batch, threads=threads)
    return write_comparison(config)


def run_sbc(config: Config, *, threads: int = 1) -> SBCResult:
    """Simulate what is missing, fit what is pending (one compile, cached), rank and test."""

    log.info(simulate(config).one_line())
    sweep = sbc_config(config)
    run_compile(sweep, workers=threads)
    failed = run_fit(sweep, threads=threads)
    if failed:
        log.warning("sbc: %d simulated fit(s) failed in this run", failed)
    return rank_simulations(config)
