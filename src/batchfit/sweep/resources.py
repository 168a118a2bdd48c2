"""A fit job's threads, memory and time, from the sweep and what the compile stage measured."""

from __future__ import annotations

import logging
import math
from pathlib import Path

from batchfit.fitting.lane_pool import lane_count
from batchfit.records.compile_stamp import CompileStamp, ReferenceFit
from batchfit.settings import SamplerSettings

log = logging.getLogger("batchfit")


# A fit job's resources: what the compile stage measured (`measure_fit`), scaled to the sweep's
# sampler and the batch, with margins: sampling time varies between datasets far more than memory.
# Without a measurement (no compile stamp yet, or the reference fit failed) the defaults apply.
_JOB_START_SECONDS = 120  # imports and cache load: seconds locally, far more on a busy shared filesystem


_TIME_MARGIN = 3.0


_MEMORY_MARGIN = 1.5


_UNMEASURED = ReferenceFit(seconds=60.0, peak_rss_mb=2000, draws=2000, chains=4)


def fit_resources(sampler: SamplerSettings, n_datasets: int, stamp_path: str | Path, attempt: int = 1,
                  threads: int = 1) -> dict[str, int]:
    """``mem_mb`` and ``runtime`` (minutes) for a fit job of ``n_datasets`` on ``threads``; both grow with ``attempt``.

    A job killed for memory or time is retried by Snakemake with ``attempt`` + 1: it then asks
    for twice (three times, ...) as much, and fits only the datasets the killed attempt left. A
    job with several lanes (`batchfit.fitting.lane_pool`) needs a process's memory per lane and fits that
    many datasets at once.
    """
    try:
        measured = CompileStamp.read(stamp_path).reference_fit or _UNMEASURED
    except FileNotFoundError:
        measured = _UNMEASURED
    s = sampler
    work = ((s.draws + s.tune) * s.chains) / max(1, measured.draws * measured.chains)
    lanes = lane_count(threads, s.chains, n_datasets)
    seconds = _JOB_START_SECONDS + math.ceil(n_datasets / lanes) * measured.seconds * work * _TIME_MARGIN
    return {"mem_mb": math.ceil(measured.peak_rss_mb * _MEMORY_MARGIN) * lanes * attempt,
            "runtime": math.ceil(seconds / 60) * attempt}


def fit_threads(chains: int, cores: int | None, n_batches: int) -> int:
    """Threads per fit job: all cores for one batch; otherwise split cores across parallel jobs.

    A job's fixed start-up (imports, cache load) is single-threaded, so with several batches
    it is better hidden by running jobs side by side than by giving one job every core. A job
    with more threads than chains samples several datasets at once (`batchfit.fitting.lane_pool`).
    ``cores`` None (a cluster, where each job gets its own cores): one thread per chain.
    """
    if cores is None:
        return chains
    parallel_jobs = max(1, min(n_batches, cores))
    return max(1, cores // parallel_jobs)
