"""What a prediction reads of a fit: its draws, its constant data and coordinates, and what it recorded.

Read through h5py, not as xarray Datasets: a prediction needs each posterior variable's draws, each
``constant_data`` value and the coordinates, by name, as PyMC reads them from a trace (its dimensions
come from the model built on the new inputs), and opening a fit with netCDF4 and decoding its groups
took about as long as the rest of a prediction together. Values are decoded as xarray decodes the
NetCDF-4 files batchfit writes (`batchfit.fitting.netcdf_writer`): text as ``str``, booleans stored as
``int8`` (attribute ``dtype: bool``) as ``bool``. ``tree`` opens the fit with xarray, for PyMC's own route.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from batchfit.errors import DatasetError
from batchfit.records import fit_attributes

# netCDF4's attribute of a dimension that has no coordinate variable of its own
_PHONY_DIMENSION = b"This is a netCDF dimension but not a netCDF variable"
# What a prediction reads of the fit's root attributes.
_RECORDED = (fit_attributes.FORMAT, fit_attributes.DATASET, fit_attributes.STRUCTURE, fit_attributes.PROVENANCE)


@dataclass(frozen=True, eq=False)
class FitDraws:
    """One fit's posterior draws, constant data and coordinates (arrays by name), and its root attributes."""

    dataset: str
    path: Path
    posterior: dict[str, np.ndarray]  # each shaped (chain, draw, ...)
    constant_data: dict[str, np.ndarray]
    coordinates: dict[str, np.ndarray]  # of the constant data, then of the posterior, as PyMC reads a trace's
    attrs: dict[str, Any] = field(default_factory=dict)

    @property
    def structure(self) -> str:
        """The structure the fit's model had ('' for a fit that did not record it)."""
        return str(self.attrs.get(fit_attributes.STRUCTURE, ""))

    @property
    def provenance(self) -> str:
        """The fit's provenance digest ('' for a fit that did not record it)."""
        return str(self.attrs.get(fit_attributes.PROVENANCE, ""))

    @property
    def n_chains(self) -> int:
        return int(self.coordinates["chain"].size)

    @property
    def n_draws(self) -> int:
        return int(self.coordinates["draw"].size)

    @property
    def n_samples(self) -> int:
        return self.n_chains * self.n_draws

    @functools.cached_property
    def _stacked(self) -> dict[str, np.ndarray]:
        return {name: np.ascontiguousarray(value.reshape(self.n_samples, *value.shape[2:]))
                for name, value in self.posterior.items()}

    def stacked(self) -> dict[str, np.ndarray]:
        """Each posterior variable's draws shaped (chain x draw, ...), chain after chain, as PyMC walks them."""
        return self._stacked

    def tree(self) -> Any:
        """The fit as ``xr.open_datatree`` reads it, in memory (what ``pm.sample_posterior_predictive`` takes)."""
        import xarray as xr

        with xr.open_datatree(self.path) as tree:
            return tree.load().copy()

    @classmethod
    def of_tree(cls, dataset: str, path: Path, tree: Any) -> FitDraws:
        """A fit still in memory (the compile stage's measured fit), read as `read_fit_draws` reads a file."""
        posterior, constant = tree["posterior"].to_dataset(), tree["constant_data"].to_dataset()
        coordinates = {str(k): v.values for ds in (constant, posterior) for k, v in ds.coords.items()}
        return cls(dataset, path, {str(k): v.values for k, v in posterior.data_vars.items()},
                   {str(k): v.values for k, v in constant.data_vars.items()}, coordinates, dict(tree.attrs))


def read_fit_draws(dataset_id: str, path: str | Path) -> FitDraws:
    """The fit of ``dataset_id`` at ``path``; an unreadable fit, or one of another dataset, is a `DatasetError`."""
    import h5py

    path = Path(path)
    try:
        with h5py.File(path, "r") as nc:
            if "posterior" not in nc:
                raise DatasetError("the fit has no posterior group", dataset=dataset_id, path=path)
            posterior, posterior_coords = _group(nc["posterior"])
            constant, constant_coords = _group(nc["constant_data"]) if "constant_data" in nc else ({}, {})
            attrs = {key: _text(nc.attrs[key]) for key in _RECORDED if key in nc.attrs}
    except (OSError, ValueError, KeyError) as exc:
        raise DatasetError(f"cannot read the fit: {exc}", dataset=dataset_id, path=path) from exc
    fit_attributes.check_format(attrs, dataset_id, path)
    if "chain" not in posterior_coords or "draw" not in posterior_coords:
        raise DatasetError("the fit's posterior has no chain and draw coordinates", dataset=dataset_id, path=path)
    return FitDraws(dataset_id, path, posterior, constant, {**constant_coords, **posterior_coords}, attrs)


def _group(group: Any) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """A group's variables and its coordinate variables, by name, decoded (module docstring)."""
    import h5py

    variables, coordinates = {}, {}
    for name, item in group.items():
        if not isinstance(item, h5py.Dataset):
            continue
        attrs = item.attrs  # looked up by `in` first: a missing attribute's lookup costs an HDF5 error
        scale = "CLASS" in attrs and attrs["CLASS"] == b"DIMENSION_SCALE"
        if scale and "NAME" in attrs and bytes(attrs["NAME"]).startswith(_PHONY_DIMENSION):
            continue
        value = item.asstr()[()] if h5py.check_string_dtype(item.dtype) is not None else item[()]
        value = np.asarray(value, dtype=object) if value.dtype.kind == "O" else np.asarray(value)
        if "dtype" in attrs and _text(attrs["dtype"]) == "bool":
            value = value.astype(bool)
        (coordinates if scale else variables)[name] = value
    return variables, coordinates


def _text(value: Any) -> Any:
    """An attribute as netCDF4 reads it: text as ``str``."""
    return value.decode() if isinstance(value, bytes) else value

