"""Every use of another library's private API, in one place.

batchfit reaches below the public APIs of PyMC where no public one gives what it needs. Each
use names the upstream code and the version it was written against; ``tests/test_compat.py``
fails with the API's name when an upgrade removes or changes one.
"""

from __future__ import annotations

import functools
import os
import sysconfig
import time
from typing import Any

__all__ = ["NUTPIE_THREAD_PREFIX", "dispatched_densities", "library_roots", "wait_for_sampler_threads"]

# nutpie 0.16 names the threads that run chains "nutpie-worker-N" (its Rust sampler's thread pool).
NUTPIE_THREAD_PREFIX = "nutpie-worker-"


@functools.cache
def _density_dispatchers() -> dict[str, Any]:
    """PyMC's dispatchers that attach functions to a random-variable op class.

    ``pymc.logprob.abstract._logprob``/``_logcdf`` and ``pymc.distributions.distribution._support_point``
    (pymc 6.4) are ``functools.singledispatch`` functions: ``pm.CustomDist`` registers the user's
    ``logp``/``logcdf``/``support_point`` on a class created per call
    (``pymc/distributions/custom.py``, ``_CustomDist.rv_op``). No public API returns them, and
    the cache key must cover them because they are compiled into the log density.
    """
    from pymc.distributions.distribution import _support_point
    from pymc.logprob.abstract import _logcdf, _logprob

    return {"logp": _logprob, "logcdf": _logcdf, "support_point": _support_point}


def dispatched_densities(op_class: type) -> dict[str, Any]:
    """Functions PyMC registered for exactly ``op_class`` (not inherited), plus its ``_random_fn``.

    Only classes created at run time (``pm.CustomDist``) carry user code here; library classes
    return their library functions, which the library versions in the key already pin.
    """
    found = {name: dispatcher.registry[op_class] for name, dispatcher in _density_dispatchers().items()
             if op_class in dispatcher.registry}
    # pymc 6.4 stores CustomDist's ``random=`` as the class attribute ``_random_fn``
    # (pymc/distributions/custom.py, CustomDistRV); it draws the posterior predictive.
    random_fn = op_class.__dict__.get("_random_fn")
    if random_fn is not None:
        found["random"] = random_fn
    return found


@functools.cache
def library_roots() -> tuple[str, ...]:
    """Directories of installed packages and the standard library (code pinned by versions)."""
    paths = sysconfig.get_paths()
    return tuple(sorted({paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}))


def sampler_threads() -> list[str]:
    """Names of this process's nutpie chain threads that are still alive (Linux; elsewhere none)."""
    names = []
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        return names
    for task in tasks:
        try:
            with open(f"/proc/self/task/{task}/comm") as fh:
                name = fh.read().strip()
        except OSError:  # the thread ended while we looked
            continue
        if name.startswith(NUTPIE_THREAD_PREFIX):
            names.append(name)
    return names


def wait_for_sampler_threads(timeout: float = 60.0) -> bool:
    """Wait, without holding the GIL, until nutpie's chain threads have ended; False on timeout.

    When sampling fails (e.g. "All initialization points failed"), ``nutpie.sample`` raises while
    its chain threads are still winding down; they need the GIL to drop their Python objects. A
    process that exits meanwhile finalizes the interpreter under them, and a thread calling
    ``PyGILState_Ensure`` during finalization is unwound through Rust code: SIGSEGV at exit,
    after every output was written (seen with nutpie 0.16.11). Sleeping releases the GIL.
    """
    deadline = time.monotonic() + timeout
    while sampler_threads():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
