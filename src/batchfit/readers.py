"""Read CSV, Parquet and NetCDF files into named arrays and coordinate labels.

Kept apart from `batchfit.data` so that planning a sweep (Snakemake parses the Snakefile on
every run) does not import pandas and xarray; they are imported only where a file is read.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import xarray as xr

from batchfit.errors import DatasetError


def read_arrays(dataset_id: str, path: Path, kind: str) -> tuple[dict[str, np.ndarray], dict[str, tuple]]:
    """Arrays and text-column labels of a "CSV", "Parquet" or "NetCDF" file; problems are DatasetErrors."""
    if kind == "NetCDF":
        return _read_netcdf(dataset_id, path)
    return _columns_to_arrays(_read_table(dataset_id, path, kind))


def _read_table(dataset_id: str, path: Path, kind: str) -> pd.DataFrame:
    """Parse a CSV or Parquet file that has at least one row; any problem is one DatasetError."""
    try:
        frame = pd.read_csv(path) if kind == "CSV" else pd.read_parquet(path)
    # The readers raise many unrelated exception types for malformed input (pandas, pyarrow,
    # codecs); all of them mean "this file cannot be read as <kind>".
    except Exception as exc:  # noqa: BLE001
        raise DatasetError(
            f"cannot read the file as {kind}: {_one_line(exc)}", dataset=dataset_id, path=path
        ) from None
    if not isinstance(frame.index, pd.RangeIndex) or frame.index.name is not None:
        frame = frame.reset_index()  # keep a meaningful Parquet index as a column
    if frame.shape[1] == 0:
        raise DatasetError("the file has no columns", dataset=dataset_id, path=path)
    if frame.shape[0] == 0:
        raise DatasetError("the file has a header but no data rows", dataset=dataset_id, path=path)
    return frame


def _read_netcdf(dataset_id: str, path: Path) -> tuple[dict[str, np.ndarray], dict[str, tuple]]:
    """Each data variable becomes an array; each 1-D coordinate becomes a coords entry."""
    try:
        with xr.open_dataset(path, engine="h5netcdf") as ds:
            ds.load()
    # As for tables: malformed files raise assorted h5py/xarray/OS errors.
    except Exception as exc:  # noqa: BLE001
        raise DatasetError(
            f"cannot read the file as NetCDF: {_one_line(exc)}", dataset=dataset_id, path=path
        ) from None
    if not ds.data_vars:
        raise DatasetError("the file has no data variables", dataset=dataset_id, path=path)
    arrays = {str(name): np.asarray(var.values) for name, var in ds.data_vars.items()}
    coords: dict[str, tuple] = {}
    for name, coord in ds.coords.items():
        if coord.ndim == 1:
            coords[str(name)] = tuple(coord.values.tolist())
        else:
            arrays[str(name)] = np.asarray(coord.values)
    return arrays, coords


def _columns_to_arrays(frame: pd.DataFrame) -> tuple[dict[str, np.ndarray], dict[str, tuple]]:
    """Numeric columns become int64/float64 arrays; other columns become codes plus labels."""
    arrays: dict[str, np.ndarray] = {}
    coords: dict[str, tuple] = {}
    for name, column in frame.items():
        key = str(name)
        if not _is_number(column):
            arrays[key], coords[key] = _encode_labels(column)
        elif not column.hasnans and _fits_int64(column):
            arrays[key] = column.to_numpy(dtype=np.int64)  # bool and integer columns
        else:
            arrays[key] = column.to_numpy(dtype=np.float64, na_value=np.nan)
    return arrays, coords


def _is_number(column: pd.Series) -> bool:
    """Bool, integer or real columns, including pandas' nullable Int64/Float64/boolean."""
    types = pd.api.types
    return (
        types.is_numeric_dtype(column.dtype)
        and not types.is_complex_dtype(column.dtype)
        and not isinstance(column.dtype, pd.CategoricalDtype)
    )


def _fits_int64(column: pd.Series) -> bool:
    """True for bool and integer columns whose values all fit in int64."""
    if pd.api.types.is_bool_dtype(column.dtype):
        return True
    if not pd.api.types.is_integer_dtype(column.dtype):
        return False
    return (
        pd.api.types.is_signed_integer_dtype(column.dtype)
        or int(column.max()) <= np.iinfo(np.int64).max
    )


def _encode_labels(column: pd.Series) -> tuple[np.ndarray, tuple[str, ...]]:
    """Codes 0..K-1 into the sorted text labels; missing values get code -1."""
    missing = column.isna().to_numpy()
    text = column[~missing].astype(str).to_numpy(dtype=object)
    present, labels = pd.factorize(text, sort=True)
    codes = np.full(len(column), -1, dtype=np.int64)
    codes[~missing] = present
    return codes, tuple(str(label) for label in labels)


def _one_line(exc: BaseException) -> str:
    """An exception as a single line: its type and the first line of its message."""
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__
