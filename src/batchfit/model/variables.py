"""Which posterior variables a fit keeps, summary.csv summarises and the health status is scored on.

Selections are ArviZ-style (``az.summary(var_names=..., filter_vars=...)``): a list of names, or
with ``filter_vars="like"`` substrings and ``"regex"`` regular expressions (``re.search``); a
name starting with ``~`` excludes what it matches from all variables. Two deliberate
differences from ArviZ, so a typo never silently selects something else: a name or pattern
that matches nothing is an error (ArviZ ignores an unmatched ``~name``), and a list mixing
names and ``~`` exclusions is an error (ArviZ silently ignores the names then).

Each fit records the role of every posterior variable (attribute ``batchfit_role``): a free
parameter, a deterministic, or an observation-sized deterministic, whose shape depends on the
size of the observed data (``pm.OrderedLogistic``'s n x K probabilities, a per-observation
``mu``). Collect reads the roles: by default the health status is scored on the free
parameters, and observation-sized deterministics are kept in the fit but not summarised.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

ROLE_ATTR = "batchfit_role"
FREE = "free"
DETERMINISTIC = "deterministic"
OBSERVATION_SIZED = "observation-sized deterministic"
SAMPLE_DIMS = ("chain", "draw")


def select_vars(available: Sequence[str], var_names: Sequence[str] | None, filter_vars: str | None) -> list[str]:
    """The variables of `available` (in its order) that `var_names` selects; None selects all.

    Raises ValueError naming every name or pattern that matches no variable.
    """
    if var_names is None:
        return list(available)
    matches = _matcher(filter_vars)
    excluded = [name[1:] for name in var_names if name.startswith("~") and name not in available]
    if excluded and len(excluded) < len(var_names):
        raise ValueError(
            f"var_names {list(var_names)} mixes names with '~' exclusions; list either the variables "
            "to select or the ones to leave out"
        )
    patterns = excluded or list(var_names)
    unknown = [p for p in patterns if not any(matches(p, name) for name in available)]
    if unknown:
        kind = {None: "variable", "like": "substring", "regex": "regular expression"}[filter_vars]
        raise ValueError(
            f"no posterior variable matches {kind} {', '.join(map(repr, unknown))} "
            f"(variables: {', '.join(available) or 'none'})"
        )
    hit = [name for name in available if any(matches(p, name) for p in patterns)]
    return [name for name in available if name not in hit] if excluded else hit


def _matcher(filter_vars: str | None) -> Callable[[str, str], bool]:
    """match(pattern, name) for ArviZ's filter_vars None, "like" or "regex"."""
    if filter_vars is None:
        return lambda pattern, name: pattern == name
    if filter_vars == "like":
        return lambda pattern, name: pattern in name
    if filter_vars == "regex":
        return lambda pattern, name: re.search(pattern, name) is not None
    raise ValueError(f"filter_vars must be None, 'like' or 'regex', got {filter_vars!r}")


def variable_roles(model: Any) -> dict[str, str]:
    """Role of each variable a fit's posterior holds: free parameters and deterministics, by name."""
    large = observation_sized(model)
    roles = {rv.name: FREE for rv in model.free_RVs}
    for var in model.deterministics:
        roles[var.name] = OBSERVATION_SIZED if var.name in large else DETERMINISTIC
    return roles


def observation_sized(model: Any) -> set[str]:
    """Names of the deterministics whose size grows with the number of observations.

    A deterministic is observation-sized when it shares a named dimension with an observed
    variable, or when its shape, as PyTensor infers it, is computed from observation-sized
    data: an observed variable's data, a ``pm.Data`` container its shape is computed from, or
    one as long as an observed variable (``x`` and ``group`` beside ``observed=y``). Decided
    once on the model of the sweep's reference dataset, so every dataset of the sweep
    summarises the same variables; a per-group deterministic stays summarised.
    """
    dims = model.named_vars_to_dims
    observed_dims = {d for rv in model.observed_RVs for d in dims.get(rv.name) or () if d is not None}
    by_dims = {v.name for v in model.deterministics if observed_dims & set(dims.get(v.name) or ())}
    return by_dims | _sized_by_observations(model)


def _sized_by_observations(model: Any) -> set[str]:
    """Deterministics whose inferred shape depends on observation-sized data (see `observation_sized`)."""
    if not model.observed_RVs or not model.deterministics:
        return set()
    sources = _shape_sources(model, [*model.deterministics, *model.observed_RVs])
    lengths = {v.name: _length(v) for v in model.data_vars}
    observed_values = [model.rvs_to_values[rv] for rv in model.observed_RVs]
    n_observed = {_length(v) for v in observed_values} - {None}
    observed_data = {name for name, n in lengths.items() if n in n_observed}
    observed_data |= {v.name for v in observed_values if v.name in lengths}
    for rv in model.observed_RVs:
        observed_data |= sources[rv.name]
    return {v.name for v in model.deterministics if sources[v.name] & observed_data}


def _length(variable: Any) -> int | None:
    """Length of the first axis of a data container's or constant's value (None for a scalar or a graph)."""
    value = variable.get_value() if hasattr(variable, "get_value") else getattr(variable, "data", None)
    shape = getattr(value, "shape", ())
    return int(shape[0]) if shape else None


def _shape_sources(model: Any, variables: Sequence[Any]) -> Mapping[str, set[str]]:
    """For each variable, the names of the ``pm.Data`` containers its inferred shape is computed from.

    The graph is cloned, so the model's own variables are not touched (their tags enter the
    compile key).
    """
    from pytensor.compile.sharedvalue import SharedVariable
    from pytensor.graph.fg import FunctionGraph
    from pytensor.graph.traversal import ancestors
    from pytensor.tensor.rewriting.shape import ShapeFeature

    data_names = {v.name for v in model.data_vars}
    feature = ShapeFeature()
    graph = FunctionGraph(outputs=list(variables), features=[feature], clone=True)
    return {
        var.name: {a.name for a in ancestors(list(feature.shape_tuple(out)))
                   if isinstance(a, SharedVariable) and a.name in data_names}
        for var, out in zip(variables, graph.outputs, strict=True)
    }


def stack_elements(posterior: Any) -> tuple[list[str], list[str], np.ndarray]:
    """Every scalar element of every variable of a posterior ``xr.Dataset``: labels (``a[store_3]``), variable
    names and draws shaped (element, chain, draw)."""
    labels: list[str] = []
    owners: list[str] = []
    blocks = []
    for name, var in posterior.data_vars.items():
        dims = [d for d in var.dims if d not in SAMPLE_DIMS]
        values = var.transpose(*SAMPLE_DIMS, *dims).values
        blocks.append(np.moveaxis(values.reshape(*values.shape[:2], -1), -1, 0).astype(float))
        owners += [str(name)] * blocks[-1].shape[0]
        if not dims:
            labels.append(str(name))
            continue
        coords = [posterior[d].values if d in posterior.coords else range(posterior.sizes[d]) for d in dims]
        labels += [f"{name}[{', '.join(map(str, combo))}]" for combo in itertools.product(*coords)]
    return labels, owners, np.concatenate(blocks, axis=0)
