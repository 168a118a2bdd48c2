"""The groups of a fit's DataTree beside what the sampler returns: the kept posterior variables, each
with its role, and the observed and constant data with the model's coordinate labels."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from batchfit.config import Config
from batchfit.data.dataset import Dataset
from batchfit.errors import ConfigError
from batchfit.model.variables import ROLE_ATTR, select_vars


def kept_variables(config: Config, roles: Mapping[str, str]) -> list[str]:
    """The posterior variables each fit keeps (`outputs.var_names`); a name the model lacks is a ConfigError."""
    o = config.outputs
    try:
        return select_vars(list(roles), o.var_names, o.filter_vars)
    except ValueError as exc:
        raise ConfigError(f"{exc} in the model of {config.model}", key="outputs.var_names",
                          source=config.source) from None


def kept_posterior(posterior: Any, kept: Sequence[str], roles: Mapping[str, str]) -> Any:
    """The kept variables of a sampled posterior, each with its role (`batchfit.model.variables`) as attribute."""
    wanted = set(kept)
    posterior = posterior[[name for name in posterior.data_vars if name in wanted]]
    for name, var in posterior.data_vars.items():
        var.attrs[ROLE_ATTR] = roles[name]
    return posterior


def data_group(arrays: dict[str, tuple[tuple[str, ...] | None, np.ndarray]], model: Any, dataset: Dataset) -> Any:
    """An xarray Dataset from name -> (dims, array), with the model's coordinate labels.

    A label column's codes come with their labels: variable ``{name}_labels`` along dimension
    ``{name}_code`` holds the label of each code, so a fit can be read without the sweep's coding.
    """
    import xarray as xr

    variables = {}
    coords = {}
    for name, (dims, value) in arrays.items():
        dims = dims or tuple(f"{name}_dim_{i}" for i in range(value.ndim))
        variables[name] = (dims, value)
        for dim in dims:
            labels = model.coords.get(dim)
            if labels is not None:
                coords[dim] = list(labels)
    for name in list(variables):
        labels = dataset.coords.get(name) if name in dataset.arrays else None
        if labels is not None and f"{name}_labels" not in variables:
            variables[f"{name}_labels"] = (f"{name}_code", np.array(labels, dtype=object))
    return xr.Dataset(variables, coords=coords)
