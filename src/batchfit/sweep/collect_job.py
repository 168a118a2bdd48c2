"""The collect rule's job: every dataset's fit combined into the sweep's outputs.

A module of its own, not one of `batchfit.sweep.stages`: the collect job sits on every sweep's
critical path between the fit jobs and the report, and imports only what collecting needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from batchfit.common import collector
from batchfit.config import Config
from batchfit.data.discovery import discover_datasets
from batchfit.fitting.fit_register import settle
from batchfit.fitting.provenance import expected_digests
from batchfit.outputs import summary_pool
from batchfit.outputs.adopt import adopt_batch_outputs
from batchfit.outputs.collect import collect, stale_fits_error
from batchfit.outputs.orphans import move_orphans


def run_collect(config: Config, *, workers: int = 1, batch_outputs: Sequence[str | Path] = ()) -> Any:
    """Combine every dataset's fit into posteriors.nc, summary.csv, datasets.csv and failures.csv.

    Every fit must have the provenance the current config gives (see `collect`): a sweep never
    mixes fits made with other settings, models or data. ``workers``: processes that summarise
    new fits at once. ``batch_outputs``: the fit jobs' own output directories (no shared filesystem),
    adopted first (`adopt_batch_outputs`).
    """
    collector.resume()  # collect's imports are done: they live to the end
    adopt_batch_outputs(config.layout, batch_outputs)

    datasets = discover_datasets(config.data_sources)
    # The helpers start now, so that their start-up (collect's imports) overlaps this process's
    # own, and the digests' computing: ready when collect knows which fits are new.
    with summary_pool.started(summary_pool.helpers_for(workers, len(datasets))) as helpers:

        # Only the ids and digests outlive these lines: otherwise collect's peak memory holds each
        # dataset's Path and recorded digest to the end, a growth with N.
        expected = expected_digests(config, datasets)
        dataset_ids = list(datasets)
        del datasets
        move_orphans(config.layout, dataset_ids)
        register = settle(config.layout, dataset_ids)
        # A changed setting makes every fit stale at once: the register (read by every plan) says so
        # before collect spends as long as a whole collect reading and summarising each fit only to
        # refuse it. collect still checks the digest each fit itself recorded.
        stale, n_fits = [], 0
        for d in dataset_ids:
            recorded = register.digest(d)
            n_fits += recorded is not None
            if recorded is not None and recorded != expected[d]:
                stale.append(d)
        if stale:
            raise stale_fits_error(stale, n_fits, config.layout.fit)
        return collect(config, dataset_ids, expected_provenance=expected, workers=helpers, register=register)
