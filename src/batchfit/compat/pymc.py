"""PyMC: the functions it dispatches on an op class (what ``pm.CustomDist`` registers)."""

from __future__ import annotations

import functools
from typing import Any


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
