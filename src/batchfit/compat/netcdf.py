"""xarray and netCDF4: a Dataset encoded as xarray's netCDF4 writer stores it, and a whole-variable write."""

from __future__ import annotations

from typing import Any


def netcdf4_encoded(dataset: Any, nc: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """``dataset``'s variables and attributes as xarray's netCDF4 writer stores them in ``nc`` (an
    open ``netCDF4.Dataset``): bools as int8 with a ``dtype`` attribute, floats with
    ``_FillValue`` NaN, object arrays as text or floats, non-index coordinates named in a
    ``coordinates`` attribute.

    `batchfit.fitting.netcdf_writer` makes the netCDF4 calls itself, so that its files are the ones
    ``DataTree.to_netcdf(engine="netcdf4")`` writes. ``encode_dataset_coordinates`` (xarray
    2026.9, ``xarray/conventions.py``) and the store's ``encode`` (``WritableCFDataStore.encode``
    in ``xarray/backends/common.py``: ``cf_encoder``, then object arrays to text or floats, then
    the netCDF4 store's own step) are what ``xarray.backends.writers.dump_to_store`` runs; they
    are not in xarray's API reference.
    """
    from xarray.backends import NetCDF4DataStore
    from xarray.conventions import encode_dataset_coordinates

    return NetCDF4DataStore(nc).encode(*encode_dataset_coordinates(dataset))


def netcdf4_put_whole(variable: Any, data: Any) -> None:
    """Write all of ``variable`` (a ``netCDF4.Variable``) from ``data``, an array of its shape.

    ``variable[...] = data`` first works out the slice in Python (``_StartCountStride`` in
    netCDF4 1.7, ``netCDF4/utils.py``): most of a small variable's write, repeated for each of a
    fit's variables, on a core the chains sample on. ``Variable._put(data, start, count, stride)``
    (``netCDF4/_netCDF4.pyx``, what ``__setitem__`` ends with) takes the whole-variable slice as
    it is; it makes the data contiguous, casts them to the variable's type (text included) and
    checks their size itself.
    """
    shape = variable.shape
    variable._put(data, [0] * len(shape), list(shape), [1] * len(shape))
