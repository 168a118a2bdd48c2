"""Write a DataTree as the NetCDF-4 file ``DataTree.to_netcdf(engine="netcdf4")`` writes, faster.

A fit job writes one file per dataset on the thread that also builds the next dataset's model
while the chains sample; with the machine's cores busy sampling, that thread's CPU time is the
job's rate. xarray's store puts its file manager, locks and per-variable checks around each
netCDF4 call, a noticeable part of writing a small fit; here the same calls are made without
them.

The encoding is xarray's own (`compat.netcdf4_encoded`); only the netCDF4 calls are made here: the
file has the same groups, dimensions, variables, types, attributes and storage layout, which
``tests/unit/test_netcdf_writer.py`` checks against xarray's writer. A tree with anything this module
does not handle (an encoding asked for, bytes, an empty dimension, an attribute of another
type) is written by xarray itself.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from batchfit.common.atomic import atomic_path
from batchfit.compat.netcdf import netcdf4_encoded, netcdf4_put_whole

# Kinds of encoded data written as they are: bool never reaches here (CF stores it as int8).
_NUMERIC_KINDS = frozenset("iuf")


@dataclass(frozen=True)
class _Group:
    """One node of the tree, CF-encoded: its path, attributes and variables (name -> xr.Variable)."""

    path: str
    attrs: dict[str, Any]
    variables: dict[str, Any]


def write_datatree(tree: Any, path: str | Path) -> None:
    """Write ``tree`` to ``path`` as ``tree.to_netcdf(path, engine="netcdf4")`` would."""
    import netCDF4

    with netCDF4.Dataset(path, "w", format="NETCDF4") as nc:
        groups = _encoded(tree, nc)
        for group in groups or ():
            _write_group(nc if group.path == "/" else nc.createGroup(group.path), group)
    if groups is None:  # the empty file is overwritten
        tree.to_netcdf(path, engine="netcdf4")


def _encoded(tree: Any, nc: Any) -> list[_Group] | None:
    """Every node of ``tree`` encoded for ``nc``, or None if any holds what only xarray's writer handles."""
    groups = []
    for node in tree.subtree:
        dataset = node.to_dataset(inherit=node is tree)  # as xarray's DataTree writer does
        if any(var.encoding for var in dataset.variables.values()) or 0 in dataset.sizes.values():
            return None  # storage options to honour; a length-0 dimension becomes unlimited
        variables, attrs = netcdf4_encoded(dataset, nc)
        if not all(map(_plain_attribute, attrs.values())):
            return None
        for var in variables.values():
            if _netcdf_type(var) is None or not all(map(_plain_attribute, var.attrs.values())):
                return None
        groups.append(_Group(node.path, attrs, variables))
    return groups


def _netcdf_type(var: Any) -> Any:
    """The netCDF4 datatype of an encoded variable: its NumPy dtype, ``str`` for text, else None."""
    dtype = var.dtype
    if dtype.kind in _NUMERIC_KINDS:
        return dtype
    text = dtype.kind == "U" or (dtype.kind == "O" and dtype.metadata is not None
                                 and dtype.metadata.get("element_type") is str)
    # xarray passes a text variable's _FillValue to netCDF4 as a string fill value: left to xarray
    return str if text and "_FillValue" not in var.attrs else None


def _plain_attribute(value: Any) -> bool:
    """Whether netCDF4's setncattr stores ``value`` as xarray's writer does."""
    if isinstance(value, (str, np.integer, np.floating)):
        return True
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        return True
    return isinstance(value, list) and bool(value) and all(isinstance(item, str) for item in value)


def _write_group(target: Any, group: _Group) -> None:
    target.setncatts(group.attrs)
    for var in group.variables.values():  # dimensions in the order their variables come, as xarray's
        for dim, size in zip(var.dims, var.shape, strict=True):
            if dim not in target.dimensions:
                target.createDimension(dim, size)
    for name, var in group.variables.items():
        attrs = dict(var.attrs)
        datatype = _netcdf_type(var)
        # xarray's netCDF4 store: no compression, netCDF4's default (contiguous) layout, the fill
        # value given at creation (HDF5 stores it with the dataset), not as an attribute
        created = target.createVariable(name, datatype, var.dims, fill_value=attrs.pop("_FillValue", None))
        created.set_auto_maskandscale(False)  # the data are already encoded
        created.setncatts(attrs)
        data = var.values
        netcdf4_put_whole(created, data.astype(object) if datatype is str else data)


def write_fit(tree: Any, path: Path) -> None:
    """Write one dataset's DataTree atomically (never a half-written file under the final name).

    The netCDF C library writes a fit's many small variables much faster than h5netcdf, and
    `batchfit.fitting.netcdf_writer` calls it without xarray's store around each call; the file is
    the one ``tree.to_netcdf(engine="netcdf4")`` writes.
    """
    with atomic_path(path) as tmp:
        write_datatree(tree, tmp)

