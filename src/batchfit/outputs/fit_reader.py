"""Reading what collect needs of one fit file: its posterior, root attributes and what its sampler recorded."""

from __future__ import annotations

import logging
from pathlib import Path

import netCDF4
import xarray as xr

from batchfit.errors import DatasetError
from batchfit.fitting.sampler_health import sampler_diagnostics
from batchfit.outputs.combined import (
    decoded_group,
)
from batchfit.records.fit_attributes import check_format

log = logging.getLogger("batchfit")


def group_dataset(group: netCDF4.Group) -> xr.Dataset:
    """One group of a netCDF4 file opened with ``set_auto_mask(False)``, in memory: variables with
    their attributes, dimension variables as coordinates.

    Far cheaper than ``xr.open_dataset(path, group=...)``, which reads the metadata of the whole
    file on every open (slow under load, when SBC ranks or plots read hundreds of fits).
    """
    variables = {name: (var.dimensions, var[...], {k: var.getncattr(k) for k in var.ncattrs() if not k.startswith("_")})
                 for name, var in group.variables.items()}
    coords = {name: variables.pop(name)[1] for name in list(variables) if name in group.dimensions}
    return xr.Dataset(variables, coords=coords)


def read_fit(dataset_id: str, path: str | Path) -> tuple[xr.Dataset, dict[str, float]]:
    """Load one fit's posterior into memory, and its `sampler_diagnostics`.

    Only what collect needs is read (the posterior, a few sampler stats and the root attributes),
    not the whole tree. The posterior keeps its own attrs plus the fit's root attrs (dataset,
    source, model_hash, seed, sampler, ...) so posteriors.nc records each dataset's provenance.
    """
    try:
        with netCDF4.Dataset(path) as nc:
            missing = [group for group in ("posterior", "sample_stats") if group not in nc.groups]
            if missing:
                raise DatasetError(f"fit has no {' or '.join(missing)} group", dataset=dataset_id, path=path)
            if "diverging" not in nc["sample_stats"].variables:
                raise DatasetError("fit has no sample_stats/diverging variable", dataset=dataset_id, path=path)
            root_attrs = {key: nc.getncattr(key) for key in nc.ncattrs()}
            diagnostics = sampler_diagnostics(nc["sample_stats"])
            check_format(root_attrs, dataset_id, path)
            posterior = decoded_group(nc["posterior"])  # through the open file, not opening it again
        posterior.attrs = {**posterior.attrs, **root_attrs}
        return posterior, diagnostics
    except (OSError, ValueError, RuntimeError) as exc:
        raise DatasetError(f"cannot read fit: {exc}", dataset=dataset_id, path=path) from exc
