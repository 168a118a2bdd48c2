"""Summarising many fits in several processes at once, for collect.

A fit's summary (reading it and ArviZ's diagnostics: ~15 ms for a tiny fit) depends on that fit
alone, so collect shares new fits out between itself and helper processes, each writing the fits'
summary cache entries and staged draws (`batchfit.collect.SummaryCache`); collect then finds them
cached. A helper is ``python -m batchfit.summary_workers`` reading its part on stdin and printing
each dataset id whose entry it wrote. Plain processes rather than ``multiprocessing``: its spawn
and forkserver starts run the caller's ``__main__`` file again, which under Snakemake is the rule
script itself, and a fork of a process running threads may deadlock.

A helper's start (Python and collect's imports: ~0.85 s, by hand) costs as much as summarising
~55 tiny fits, so `batchfit.pipeline.run_collect` starts the helpers before it imports collect
and computes the sweep's digests: the helpers start up meanwhile, and are ready when collect
knows which fits are new (at 100 tiny fits on 2 cores, collect's summarising took 1.5 s alone).
"""

from __future__ import annotations

import itertools
import logging
import pickle
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from batchfit.collect import SummaryCache

log = logging.getLogger("batchfit")

# New fits per process below which a helper is not worth starting (or, started, not worth waiting for).
FITS_PER_PROCESS = 25


def helpers_for(workers: int, n_fits: int) -> int:
    """Helper processes to use beside collect's own for `n_fits` fits when `workers` processes may run at once."""
    return max(0, min(workers, n_fits // FITS_PER_PROCESS) - 1)


class SummaryHelpers:
    """Helper processes, started (and importing) before they are given their parts.

    Use `started`: a helper not needed gets an empty part and exits; the block's end waits for it.
    """

    def __init__(self, n: int):
        self._idle = [subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE) for _ in range(n)]
        self._dismissed: list[subprocess.Popen] = []

    def summarise(
        self, cache: SummaryCache, fits: Sequence[tuple[str, str | Path]],
        here: Callable[[Sequence[tuple[str, str | Path]]], None],
    ) -> list[str]:
        """Share `fits` (dataset id, fit path) out between the helpers and this process, whose share `here`
        summarises; return the ids the helpers wrote an entry for.

        A fit a helper could not summarise is not returned; the caller summarises it itself and
        reports its error. A helper whose collect dies stops at its next fit (its pipe is gone);
        the entries it wrote serve the next collect.
        """
        n = helpers_for(len(self._idle) + 1, len(fits))
        helpers, self._idle = self._idle[:n], self._idle[n:]
        self._dismiss()  # the others are not needed
        parts = [fits[i::len(helpers) + 1] for i in range(len(helpers) + 1)]

        def run(proc: subprocess.Popen, part: Sequence[tuple[str, str | Path]]) -> list[str]:
            out, _ = proc.communicate(pickle.dumps((cache.directory, cache.summary, cache.thresholds, list(part))))
            return out.decode().splitlines()  # one id a line: ids may hold spaces

        # a thread per helper feeds it and reads its ids while this process summarises its own share
        with ThreadPoolExecutor(max(1, len(helpers))) as pool:
            futures = [pool.submit(run, proc, part) for proc, part in zip(helpers, parts[1:], strict=True)]
            here(parts[0])
            written = set(itertools.chain.from_iterable(future.result() for future in futures))
        if helpers:
            log.info("collect: summarised %d fits in %d processes", len(fits), len(helpers) + 1)
        return [d for d, _ in fits if d in written]

    def _dismiss(self) -> None:
        """Give every helper not used an empty part, without waiting for it: a helper still importing
        would hold this process up for the rest of its start (up to ~0.85 s)."""
        for proc in self._idle:
            proc.stdin.close()  # an empty part: it exits
        self._dismissed += self._idle
        self._idle = []

    def close(self) -> None:
        """Dismiss every helper not used, and wait for those dismissed to exit."""
        self._dismiss()
        for proc in self._dismissed:
            proc.wait()


@contextmanager
def started(n: int) -> Iterator[SummaryHelpers]:
    """`n` helper processes, starting up now; those not given work exit when the block ends."""
    helpers = SummaryHelpers(n)
    try:
        yield helpers
    finally:
        helpers.close()


def main() -> None:
    """A helper: summarise the fits of the pickled spec on stdin, printing each id whose entry it wrote."""
    from batchfit.collect import SummaryCache

    spec = sys.stdin.buffer.read()
    if not spec:  # not needed after all
        return
    directory, summary, thresholds, fits = pickle.loads(spec)
    cache = SummaryCache(directory, summary, thresholds)
    for dataset_id, fit in fits:
        try:
            cache.entry(dataset_id, fit)
        except Exception:  # noqa: BLE001 - collect summarises it again and reports the error in the sweep's order
            continue
        print(dataset_id, flush=True)


if __name__ == "__main__":
    from batchfit.quick_exit import quick_exit

    main()
    quick_exit()  # the work is done, its files closed: no interpreter teardown
