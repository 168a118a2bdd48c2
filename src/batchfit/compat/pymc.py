"""PyMC: the functions it dispatches on an op class (what ``pm.CustomDist`` registers), and how
competent its step methods are for a variable (what ``pm.sample`` assigns them by)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
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


def step_competences(model: Any, methods: Sequence[type]) -> dict[str, dict[type, int]]:
    """For each free variable of ``model`` (by name), how competent each of PyMC's step ``methods`` is
    to sample it, as ``pm.sample`` rates them when it assigns step methods itself.

    ``pymc.sampling.mcmc.assign_step_methods`` (pymc 6.4) gives a variable the method of highest
    ``method._competence(rv, has_gradient)`` (the private classmethod that calls each method's
    ``competence`` with the arguments it takes), the first of ``methods`` among equals; the variable
    has a gradient if it is continuous and the model's log density differentiates in it.
    """
    import pytensor.gradient as tg
    from pymc.vartypes import discrete_types

    logp = model.logp()
    found = {}
    for rv in model.free_RVs:
        value = model.rvs_to_values[rv]
        has_gradient = value.dtype not in discrete_types
        if has_gradient:
            try:
                tg.grad(logp, value)
            except (NotImplementedError, tg.NullTypeGradError):
                has_gradient = False
        # one competence per variable given (a list): one here
        found[rv.name] = {method: int(method._competence(rv, has_gradient)[0]) for method in methods}
    return found


def forward_volatility() -> Any:
    """PyMC's steps of ``pm.sample_posterior_predictive`` that decide what is drawn anew and what is
    taken from the draws, as a namespace: ``build_constant_data(trace_constant_data, trace_coords,
    model)``, ``compute_volatile_vars(fgraph, *, vars_in_trace, rvs, constant_data, volatile_vars,
    freeze_vars)`` and ``warn_implicit_freeze(**...)``.

    ``pymc/sampling/forward.py`` (pymc 6.4): ``_build_constant_data``, ``_compute_volatile_vars``
    and ``_maybe_warn_implicit_freeze``, private helpers that ``sample_posterior_predictive`` calls
    inline; batchfit's predictions (`batchfit.predictions.forward_plan`) call the same ones, so that
    what they resample and what they copy is PyMC's decision for the same model and data, not a
    re-statement of it.
    """
    from types import SimpleNamespace

    from pymc.sampling import forward

    return SimpleNamespace(build_constant_data=forward._build_constant_data,
                           compute_volatile_vars=forward._compute_volatile_vars,
                           warn_implicit_freeze=forward._maybe_warn_implicit_freeze)
