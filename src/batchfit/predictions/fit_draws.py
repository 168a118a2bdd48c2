"""What a prediction reads of a fit: its draws, its constant data and coordinates, and what it recorded."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from batchfit.errors import DatasetError


@dataclass(frozen=True, eq=False)
class FitDraws:
    """One fit's ``posterior`` and ``constant_data`` (xarray Datasets, in memory) and its root attributes."""

    dataset: str
    path: Path
    posterior: Any
    constant_data: Any
    attrs: dict[str, Any]

    @property
    def structure(self) -> str:
        """The structure the fit's model had ('' for a fit that did not record it)."""
        return str(self.attrs.get("structure", ""))

    @property
    def provenance(self) -> str:
        """The fit's provenance digest ('' for a fit that did not record it)."""
        return str(self.attrs.get("provenance", ""))

    @property
    def n_chains(self) -> int:
        return int(self.posterior.sizes["chain"])

    @property
    def n_draws(self) -> int:
        return int(self.posterior.sizes["draw"])

    @property
    def n_samples(self) -> int:
        return self.n_chains * self.n_draws

    def constant_values(self) -> dict[str, np.ndarray]:
        """The constant data by name, as PyMC reads a trace's (``sample_posterior_predictive``)."""
        return {str(name): var.values for name, var in self.constant_data.data_vars.items()}

    def coords(self) -> dict[str, np.ndarray]:
        """The coordinates of the constant data, then of the posterior, as PyMC reads a trace's."""
        return {str(k): v.values for ds in (self.constant_data, self.posterior) for k, v in ds.coords.items()}

    @functools.cached_property
    def _stacked(self) -> dict[str, np.ndarray]:
        return {str(name): np.ascontiguousarray(var.values.reshape(self.n_samples, *var.shape[2:]))
                for name, var in self.posterior.data_vars.items()}

    def stacked(self) -> dict[str, np.ndarray]:
        """Each posterior variable's draws shaped (chain x draw, ...), chain after chain, as PyMC walks them."""
        return self._stacked

    def tree(self) -> Any:
        """The fit as a DataTree of its posterior and constant data (what ``pm.sample_posterior_predictive`` reads)."""
        import xarray as xr

        return xr.DataTree.from_dict({"posterior": self.posterior, "constant_data": self.constant_data})


def read_fit_draws(dataset_id: str, path: str | Path) -> FitDraws:
    """The fit of ``dataset_id`` at ``path``; a missing or unreadable fit is a `DatasetError` naming both."""
    import netCDF4
    import xarray as xr

    from batchfit.outputs.combined import decoded_group

    path = Path(path)
    try:
        with netCDF4.Dataset(path) as nc:
            if "posterior" not in nc.groups:
                raise DatasetError("the fit has no posterior group", dataset=dataset_id, path=path)
            posterior = decoded_group(nc["posterior"])
            constant = decoded_group(nc["constant_data"]) if "constant_data" in nc.groups else xr.Dataset()
            attrs = {key: nc.getncattr(key) for key in nc.ncattrs()}
    except (OSError, ValueError, RuntimeError) as exc:
        raise DatasetError(f"cannot read the fit: {exc}", dataset=dataset_id, path=path) from exc
    recorded = attrs.get("dataset", dataset_id)
    if recorded != dataset_id:
        raise DatasetError(f"the fit is for dataset '{recorded}'", dataset=dataset_id, path=path)
    return FitDraws(dataset_id, path, posterior, constant, attrs)
