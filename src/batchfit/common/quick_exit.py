"""End a batchfit process as soon as its work is done, without the interpreter's teardown.

A job's process (a rule script, the ``batchfit`` command, a compile worker, a lane or a
summary worker) has closed every file it wrote when its work returns. Python's normal exit
then frees every object of every module it imported (pymc, pytensor, numba, xarray, nutpie's
runtime): a noticeable gap between a job's last log line and Snakemake seeing it end, on
the sweep's critical path at every rule.
The same trade as Instagram's ``atexit.register(os._exit, 0)``
(https://instagram-engineering.com/dismissing-python-garbage-collection-at-instagram-4dca40b29172),
taken only when the work succeeded: a failure leaves through Python's normal exit.
"""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn


def quick_exit(code: int = 0) -> NoReturn:
    """Flush logging and the standard streams, then end the process with ``code`` at once.

    Skipped, with the teardown: ``atexit`` handlers and C-level exit handlers (HDF5's among
    them), which only matter for files left open; batchfit writes every output in a ``with``
    block (`batchfit.common.atomic.atomic_path`), closed before this is called.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe or stream: nothing left to flush into
            pass
    os._exit(code)
