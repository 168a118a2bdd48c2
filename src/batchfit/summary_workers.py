"""Summarising many fits in several processes at once, for collect.

A fit's summary (reading it and ArviZ's diagnostics: ~29 ms for a tiny fit) depends on that fit
alone, so collect can hand new fits to worker processes, each writing the fits' summary cache
entries and staged draws (`batchfit.collect.SummaryCache`), and then find them cached. A worker is ``python -m
batchfit.summary_workers`` reading its part on stdin and printing each dataset id whose entry it
wrote. Plain processes rather than ``multiprocessing``: its spawn and forkserver starts run the
caller's ``__main__`` file again, which under Snakemake is the rule script itself, and a fork of
a process running threads may deadlock.
"""

from __future__ import annotations

import itertools
import pickle
import subprocess
import sys
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from batchfit.collect import SummaryCache


def summarise_in_workers(cache: SummaryCache, fits: Sequence[tuple[str, str | Path]], workers: int) -> list[str]:
    """Write the summary entries of `fits` (dataset id, fit path) in `workers` processes; return the ids written.

    A fit a worker could not summarise is not returned; the caller summarises it itself and
    reports its error. A worker whose collect dies stops at its next fit (its pipe is gone); the
    entries it wrote serve the next collect.
    """
    def run(part: Sequence[tuple[str, Path]]) -> list[str]:
        proc = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        out, _ = proc.communicate(pickle.dumps((cache.directory, cache.summary, cache.thresholds, list(part))))
        return out.decode().splitlines()  # one id a line: ids may hold spaces

    # a thread per worker feeds it and reads its ids, so no worker waits for another's pipes
    with ThreadPoolExecutor(workers) as pool:
        written = set(itertools.chain.from_iterable(pool.map(run, [fits[i::workers] for i in range(workers)])))
    return [d for d, _ in fits if d in written]


def main() -> None:
    """A worker: summarise the fits of the pickled spec on stdin, printing each id whose entry it wrote."""
    from batchfit.collect import SummaryCache

    directory, summary, thresholds, fits = pickle.loads(sys.stdin.buffer.read())
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
