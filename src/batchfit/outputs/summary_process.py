"""A collect helper process: ``python -m batchfit.outputs.summary_process`` (`batchfit.outputs.summary_pool`).

It reads its share of the new fits (pickled) on stdin, writes each one's summary cache entry and
staged draws (`batchfit.outputs.summary_cache.SummaryCache`), and prints each dataset id it wrote.
"""

from __future__ import annotations

import pickle
import sys

from batchfit.common.quick_exit import quick_exit
from batchfit.outputs.summary_cache import SummaryCache


def main() -> None:
    """A helper: summarise the fits of the pickled spec on stdin, printing each id whose entry it wrote."""
    spec = sys.stdin.buffer.read()
    if not spec:  # collect died before giving it work
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
    main()
    quick_exit()  # the work is done, its files closed: no interpreter teardown
