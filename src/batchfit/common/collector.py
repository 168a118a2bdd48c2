"""Python's cyclic garbage collector, kept off what a job's process creates before its work and at its exit.

A job's process creates hundreds of thousands of objects while it imports PyMC, PyTensor, numba and
xarray and prepares its work (the cache, the reference model), all of which live until it ends. The
collector runs again and again while they are created, and each of its full collections walks all of
them, during the imports and again during the work: a noticeable part of a fit job on a small sweep.
A rule script therefore calls `pause` before its imports, and the job calls `resume` where its work
begins: every object alive then moves to the permanent generation (``gc.freeze``) and the collector
runs again, so the work's own garbage (a model per dataset, whose PyTensor graph holds reference
cycles) is collected as before, without walking the imports each time. The price: cyclic garbage of
the imports is kept until the process ends.

A compile worker (`batchfit.compile.worker_process`) does the same: paused for its imports and the model, resumed
where its compile begins, whose garbage (numba's IR and types) is collected as before.

`resume` does nothing in a process that did not `pause` (a notebook calling ``batchfit.predict``, a
test): batchfit never freezes a heap it does not own. `paused` runs one short step of any process
without the collector (building and loading a compiled model's graphs and callbacks). Snakemake's main
process ends with `freeze` (the workflow's ``end_run``): the interpreter's collections at exit then
skip Snakemake's heap. The trade Instagram describes:
https://instagram-engineering.com/dismissing-python-garbage-collection-at-instagram-4dca40b29172
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator

_paused = False


def pause() -> None:
    """Stop the collector until `resume`: first thing in a job's process, before its imports."""
    global _paused
    gc.disable()
    _paused = True


def resume() -> None:
    """Where a job's work begins: keep what is alive out of later collections, and collect again.

    Nothing happens unless this process called `pause`.
    """
    global _paused
    if _paused:
        freeze()
        gc.enable()
        _paused = False


def freeze() -> None:
    """Move every object alive to the permanent generation, which no collection walks (``gc.freeze``)."""
    gc.freeze()


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Run the block without the collector, then let it run as before.

    For short, bounded steps whose objects all survive: loading a compiled model imports numba's
    and PyTensor's dispatch modules (unpickling numba's environments does) and builds graphs, and
    each allocation burst would set off collections that walk the whole heap, pymc's and
    pytensor's included. Garbage made meanwhile is collected once the collector runs again. Long
    steps (a compile) are never run paused.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
