"""Summarising many fits in several processes at once, for collect.

A fit's summary (reading it and ArviZ's diagnostics) depends on that fit alone, so collect
shares new fits out between itself and helper processes, each writing the fits' summary cache
entries and staged draws (`batchfit.outputs.summary_cache.SummaryCache`); collect then finds them
cached. A helper is ``python -m batchfit.outputs.summary_process`` reading its part on stdin and printing
each dataset id whose entry it wrote (a `batchfit.common.standby` process).

A helper's start (Python and collect's imports) costs as much as summarising dozens of tiny
fits, so `batchfit.sweep.collect_job.run_collect` starts the helpers before it imports collect and
computes the sweep's digests: the helpers start up meanwhile, and are ready when collect knows
which fits are new.
"""

from __future__ import annotations

import itertools
import logging
import pickle
import subprocess
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from batchfit.common.standby import Standby, finish, standing_by

log = logging.getLogger("batchfit")


WORKER_MODULE = "batchfit.outputs.summary_process"  # what a helper runs: python -m WORKER_MODULE

# New fits per process below which a helper is not worth starting (or, started, not worth waiting for).
FITS_PER_PROCESS = 25


def helpers_for(workers: int, n_fits: int) -> int:
    """Helper processes to use beside collect's own for `n_fits` fits when `workers` processes may run at once."""
    return max(0, min(workers, n_fits // FITS_PER_PROCESS) - 1)


class SummaryHelpers:
    """Helper processes, started (and importing) before they are given their parts. Use `started`."""

    def __init__(self, standby: Standby):
        self._standby = standby

    def summarise(
        self, cache: tuple[Any, ...], fits: Sequence[tuple[str, str | Path]],
        here: Callable[[Sequence[tuple[str, str | Path]]], None],
    ) -> list[str]:
        """Share `fits` (dataset id, fit path) out between the helpers and this process, whose share `here`
        summarises; return the ids the helpers wrote an entry for. ``cache``: what a helper builds
        its summary cache from (`batchfit.outputs.summary_cache.SummaryCache.settings`).

        A fit a helper could not summarise is not returned; the caller summarises it itself and
        reports its error. A helper whose collect dies stops at its next fit (its pipe is gone);
        the entries it wrote serve the next collect.
        """
        helpers = self._standby.take(helpers_for(self._standby.waiting + 1, len(fits)))
        self._standby.dismiss()  # the others are not needed
        parts = [fits[i::len(helpers) + 1] for i in range(len(helpers) + 1)]

        def run(proc: subprocess.Popen, part: Sequence[tuple[str, str | Path]]) -> list[str]:
            spec = pickle.dumps((*cache, list(part)))
            return finish(proc, spec, "collect helper").stdout.splitlines()  # one id a line: ids may hold spaces

        # a thread per helper feeds it and reads its ids while this process summarises its own share
        with ThreadPoolExecutor(max(1, len(helpers))) as pool:
            futures = [pool.submit(run, proc, part) for proc, part in zip(helpers, parts[1:], strict=True)]
            here(parts[0])
            written = set(itertools.chain.from_iterable(future.result() for future in futures))
        if helpers:
            log.info("collect: summarised %d fits in %d processes", len(fits), len(helpers) + 1)
        return [d for d, _ in fits if d in written]


@contextmanager
def started(n: int) -> Iterator[SummaryHelpers]:
    """`n` helper processes, starting up now; those not given work are killed when the block ends."""
    with standing_by(WORKER_MODULE, n, start=n) as standby:
        yield SummaryHelpers(standby)
