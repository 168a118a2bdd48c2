"""What a prediction draws anew and what it takes from a fit's draws: ``pm.sample_posterior_predictive``'s decision.

For a model built on new inputs and a fit's posterior, PyMC (``pymc/sampling/forward.py``, pymc 6.4)
decides per call, with ``predictions=True`` and the ``var_names`` asked for:

* the variables in the trace are the free variables and deterministics the posterior holds;
* every free variable in the trace is frozen (taken from the draws); one missing from it is drawn
  anew from its prior given its parents, as are the observed variables;
* a ``pm.Data`` container or a dimension whose value differs from the one the fit recorded
  (its ``constant_data`` group and coordinates) is *volatile*, and so is everything computed from a
  volatile variable, up to the frozen ones: a deterministic computed from changed data is computed
  again, one that is not is copied from the draws;
* a frozen variable with a volatile ancestor is named in an ``ImplicitFreezeWarning``.

`plan_forward` runs PyMC's own helpers for these steps (`batchfit.compat.pymc.forward_volatility`),
so the plan is PyMC's for the same model and data. What it fixes of the compiled forward function
(which outputs are computed, which trace variables are its inputs) is a deterministic function of the
model's structure and of which roots changed: the plan's `key_parts` name them, and the compiled
function is cached under them (`batchfit.predictions.forward`).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from batchfit.compat.pymc import forward_volatility
from batchfit.compile.fingerprint import environment_fingerprint, structure_of

# The layout of the compiled forward function: part of its cache key, raised when it changes.
FORWARD_FORMAT = 1


@dataclass(eq=False)
class ForwardPlan:
    """One prediction's decision (see module docstring), for ``model`` built on the new inputs."""

    model: Any
    outputs: list[Any]  # the predicted variables, in the order asked for
    evaluated: list[Any]  # those the forward function computes
    copied: list[str]  # those copied from the draws (in the trace and not volatile)
    vars_in_trace: list[Any]
    constant_data: dict[Any, Any]
    frozen: set[Any]
    sampled: list[str]  # the random variables drawn anew (PyMC logs them as "Sampling: [...]")
    changed: list[str]  # the data containers and dimensions whose values differ from the fit's
    structure: str  # the model's (`structure_of`): computed once, for the key and the check against the fit's
    warnings: list[warnings.WarningMessage] = field(default_factory=list)  # PyMC's, for this prediction
    unsupported: str = ""  # why batchfit's cached forward function cannot take the plan ('' if it can)

    def key_parts(self) -> dict[str, Any]:
        """What the compiled forward function depends on (with the model's structure and the environment)."""
        return {"format": FORWARD_FORMAT, "structure": self.structure,
                "evaluated": [v.name for v in self.evaluated], "in_trace": sorted(v.name for v in self.vars_in_trace),
                "frozen": sorted(v.name for v in self.frozen), "changed": self.changed,
                "environment": environment_fingerprint()}


def default_var_names(model: Any) -> list[str]:
    """What a prediction holds by default: every observed variable and every deterministic, in model order."""
    return [v.name for v in [*model.observed_RVs, *model.deterministics]]


def predictable_names(model: Any) -> list[str]:
    """Every variable a prediction may hold: observed variables, deterministics and free variables."""
    return [v.name for v in [*model.observed_RVs, *model.deterministics, *model.free_RVs]]


def plan_forward(model: Any, trace_names: Sequence[str], trace_constant_data: Mapping[str, Any],
                 trace_coords: Mapping[str, Any], var_names: Sequence[str]) -> ForwardPlan:
    """PyMC's decision for ``pm.sample_posterior_predictive(fit, model, var_names=var_names, predictions=True)``.

    ``trace_names``: the variables of the fit's posterior; ``trace_constant_data`` and ``trace_coords``:
    its ``constant_data`` values and its coordinates (of ``constant_data`` and the posterior), by name,
    as PyMC reads them from a DataTree. PyMC's warnings (``ImplicitFreezeWarning``) are kept in the plan.
    """
    from pymc.util import get_default_varnames
    from pytensor.graph.fg import FunctionGraph
    from pytensor.graph.traversal import ancestors
    from pytensor.tensor.random.type import RandomType

    pymc = forward_volatility()
    constant_data = pymc.build_constant_data(dict(trace_constant_data), dict(trace_coords), model)
    traceable = {v.name for v in [*model.free_RVs, *model.deterministics]}
    vars_in_trace = [model[name] for name in trace_names if name in traceable]
    outputs = list(dict.fromkeys(model[name] for name in var_names))
    rvs, in_trace = set(model.basic_RVs), set(vars_in_trace)
    frozen_rvs = [rv for rv in vars_in_trace if rv in rvs]  # no sample_vars: every trace RV is frozen
    volatile = pymc.compute_volatile_vars(FunctionGraph(outputs=outputs + frozen_rvs, clone=False),
                                          vars_in_trace=in_trace, rvs=rvs, constant_data=constant_data,
                                          volatile_vars=set(), freeze_vars=set(frozen_rvs))
    evaluated = list(get_default_varnames([v for v in outputs if not (v in in_trace and v not in volatile)],
                                          include_transformed=False))
    evaluated_names = {v.name for v in evaluated}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        pymc.warn_implicit_freeze(auto_frozen=frozen_rvs, volatile_closure=volatile, volatile_vars=set(),
                                  rv_set=rvs, vars_in_trace_set=in_trace, constant_data=constant_data,
                                  model=model, trace_coords=dict(trace_coords))
    upstream = set(ancestors(evaluated)) if evaluated else set()
    roots = [v for v in volatile if v.owner is None and not isinstance(v.type, RandomType) and v in upstream]
    names = [_root_name(v, model) for v in roots]
    unsupported = [v.name or "(unnamed)" for v, name in zip(roots, names, strict=True) if name is None]
    return ForwardPlan(model=model, outputs=outputs, evaluated=evaluated,
                       copied=[v.name for v in outputs if v.name not in evaluated_names],
                       vars_in_trace=vars_in_trace, constant_data=constant_data, frozen=set(frozen_rvs),
                       sampled=sorted(rv.name for rv in model.basic_RVs if rv in volatile and rv in upstream),
                       changed=sorted(name for name in names if name is not None), structure=structure_of(model),
                       warnings=list(caught),
                       unsupported=(f"the prediction reads shared variable(s) {', '.join(unsupported)} that are "
                                    "neither pm.Data containers nor dimension lengths") if unsupported else "")


def _root_name(var: Any, model: Any) -> str | None:
    """A changed root's name: a ``pm.Data`` container's or a dimension's (``dim:`` prefixed); None for any
    other shared variable, which batchfit cannot swap (the prediction then goes through PyMC's own route)."""
    for name, length in model.dim_lengths.items():
        if length is var:
            return f"dim:{name}"
    if var.name is not None and model.named_vars.get(var.name) is var:
        return var.name
    return None
