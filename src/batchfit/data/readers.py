"""Read CSV, Parquet and NetCDF files into named arrays and coordinate labels.

Kept apart from `batchfit.data.dataset` so that planning a sweep (Snakemake parses the Snakefile on
every run) does not import pandas and xarray; they are imported only where a file is read.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from batchfit.data.labels import Coding, ColumnCoding
from batchfit.data.rows import DroppedRows, apply_where_and_missing, infer_numbers
from batchfit.errors import DatasetError, one_line
from batchfit.settings import NO_RULES, RowRules


@dataclass(frozen=True)
class Rows:
    """A dataset's rows as arrays: named arrays, text-column labels, the rows each rule dropped, and each
    row's number in its file or table (None for NetCDF, which has no rows)."""

    arrays: dict[str, np.ndarray]
    coords: dict[str, tuple]
    dropped: DroppedRows = DroppedRows()
    row_index: np.ndarray | None = None


def read_arrays(dataset_id: str, path: Path, kind: str, coding: Coding | None = None,
                rules: RowRules = NO_RULES) -> Rows:
    """Arrays and text-column labels of a "CSV", "Parquet" or "NetCDF" file; problems are DatasetErrors.

    Table columns are coded by the sweep's `coding` (see `batchfit.data.coding`), or without one
    each text column within this file by sorted labels; the row ``rules`` apply to tables.
    """
    if kind == "NetCDF":
        arrays, coords = _read_netcdf(dataset_id, path)
        return Rows(arrays, coords)
    as_text = coding.as_text if coding is not None else frozenset()
    frame = _read_table(dataset_id, path, kind, as_text)
    return frame_rows(frame, dataset_id=dataset_id, path=path, coding=coding, rules=rules, typed_by_text=kind == "CSV")


def frame_rows(frame: pd.DataFrame, *, dataset_id: str, path: Path, coding: Coding | None,
               rules: RowRules | DroppedRows, typed_by_text: bool, drop: Collection[str] = ()) -> Rows:
    """One dataset's rows (``frame``: its file's, or its group of a table's, the index their numbers there) as
    `Rows`: the row ``rules`` applied (or, given what they dropped, applied already), then the ``drop`` columns
    removed (a table's keys), text columns whose
    kept values are all numbers typed again where pandas typed them from text (``typed_by_text``: CSV, as a
    file of just these rows would be), label columns coded by ``coding``.

    A column the sweep codes as labels that holds only numbers here fails the dataset alone, naming the
    setting that reads it as labels everywhere (`_label_column_of_numbers`).
    """
    if isinstance(rules, DroppedRows):
        dropped = rules
    else:
        frame, dropped = apply_where_and_missing(frame, rules, dataset=dataset_id, path=path)
    if frame.empty:
        raise DatasetError(f"no rows are left once the row rules dropped {dropped.where} (rows.where) and "
                           f"{dropped.missing} (rows.drop_missing)", dataset=dataset_id, path=path)
    if drop:
        frame = frame.drop(columns=list(drop))
    labels = set(coding.labels) if coding is not None else set()
    if typed_by_text:
        frame = infer_numbers(frame, labels)
    if coding is not None:
        _label_column_of_numbers(frame, coding, dataset_id, path)
    arrays, coords = _columns_to_arrays(frame, coding, dataset_id, path)
    return Rows(arrays, coords, dropped, np.asarray(frame.index, dtype=np.int64))


def scan_table(dataset_id: str, path: Path, kind: str, as_text: frozenset[str],
               rules: RowRules = NO_RULES) -> dict[str, tuple[str, list[str]]]:
    """Each column's vote on its kind (`column_vote`) once the row ``rules`` dropped their rows, and a text
    column's distinct labels in order of first appearance; `as_text` columns are read as text."""
    frame = _read_table(dataset_id, path, kind, as_text)
    frame, _ = apply_where_and_missing(frame, rules, dataset=dataset_id, path=path)
    if kind == "CSV":
        frame = infer_numbers(frame, as_text)
    found: dict[str, tuple[str, list[str]]] = {}
    for name, column in frame.items():
        text = str(name) in as_text or not _is_number(column)
        found[str(name)] = (column_vote(column, str(name) in as_text),
                            list(dict.fromkeys(column.dropna().astype(str))) if text else [])
    return found


def column_vote(column: pd.Series, as_text: bool = False) -> str:
    """What one dataset says a column is, as the sweep's coding counts datasets (`batchfit.data.tables` counts
    a table's groups alike): "empty" without values, "number" where more than half its values read as
    numbers (a few words among numbers are typos, reported where the model reads it), else "text"."""
    present = column.dropna()
    if present.empty:
        return "empty"
    if as_text:
        return "text"
    if _is_number(column):
        return "number"
    parsed = pd.to_numeric(present.astype(object), errors="coerce").notna()
    return "number" if parsed.mean() > 0.5 else "text"


def column_kind(column: pd.Series, as_text: bool = False) -> str:
    """"empty" (no value), "number" (numbers, or text that all reads as numbers) or "text": what a column is in one
    dataset as it is loaded."""
    present = column.dropna()
    if present.empty:
        return "empty"
    if as_text:
        return "text"
    if _is_number(column) or not pd.to_numeric(present.astype(object), errors="coerce").isna().any():
        return "number"
    return "text"


def _label_column_of_numbers(frame: pd.DataFrame, coding: Coding, dataset_id: str, path: Path) -> None:
    """Fail a dataset whose column holds only numbers where most of the sweep's datasets hold text (labels):
    read as labels its numbers would become levels of their own, read as numbers the model's labels are
    missing; either way the dataset, not the sweep, is wrong, or the column must be read as text."""
    for name, spec in coding.labels.items():
        if spec.as_text or name not in frame.columns:
            continue
        column = frame[name]
        if column_kind(column) != "number":
            continue
        example = column.dropna().iloc[0]
        example = example.item() if isinstance(example, np.generic) else example
        raise DatasetError(f"column {name!r} holds only numbers here (e.g. {example!r}), while the "
                           "sweep's other datasets hold text (labels) in it; if its numbers are labels too, list the "
                           "column "
                           f"under the config's columns (columns: {{{name}: {{}}}}) so that every dataset's values "
                           "are read as labels", dataset=dataset_id, path=path, column=name)


def _read_table(dataset_id: str, path: Path, kind: str, as_text: frozenset[str] = frozenset()) -> pd.DataFrame:
    """Parse a CSV or Parquet file that has at least one row; any problem is one DatasetError.

    Columns in `as_text` are read as text, whatever their values look like.
    """
    try:
        if kind == "CSV":
            frame = pd.read_csv(path, dtype={name: str for name in as_text})
        else:
            frame = pd.read_parquet(path)
    # The readers raise many unrelated exception types for malformed input (pandas, pyarrow,
    # codecs); all of them mean "this file cannot be read as <kind>".
    except Exception as exc:  # noqa: BLE001
        raise DatasetError(
            f"cannot read the file as {kind}: {type(exc).__name__}: {one_line(exc)}", dataset=dataset_id, path=path
        ) from None
    if not isinstance(frame.index, pd.RangeIndex) or frame.index.name is not None:
        frame = frame.reset_index()  # keep a meaningful Parquet index as a column
    if frame.shape[1] == 0:
        raise DatasetError("the file has no columns", dataset=dataset_id, path=path)
    if frame.shape[0] == 0:
        raise DatasetError("the file has a header but no data rows", dataset=dataset_id, path=path)
    for name in as_text & {str(n) for n in frame.columns}:
        if _is_number(frame[name]):  # Parquet keeps its stored types: labels 1, 2 become "1", "2"
            frame[name] = frame[name].astype(object).map(str, na_action="ignore")
    return frame


def _read_netcdf(dataset_id: str, path: Path) -> tuple[dict[str, np.ndarray], dict[str, tuple]]:
    """Each data variable becomes an array; each 1-D coordinate becomes a coords entry."""
    import xarray as xr  # here: Snakemake's planning scans CSV files only, and need not wait for xarray's import

    try:
        with xr.open_dataset(path, engine="h5netcdf") as ds:
            ds.load()
    # As for tables: malformed files raise assorted h5py/xarray/OS errors.
    except Exception as exc:  # noqa: BLE001
        raise DatasetError(
            f"cannot read the file as NetCDF: {type(exc).__name__}: {one_line(exc)}", dataset=dataset_id, path=path
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


def _columns_to_arrays(
    frame: pd.DataFrame, coding: Coding | None, dataset_id: str, path: Path
) -> tuple[dict[str, np.ndarray], dict[str, tuple]]:
    """Numeric columns become int64/float64 arrays; label columns become codes plus labels.

    With a sweep `coding`, text in a column that is not a label column (it holds numbers in
    another dataset) stays text, for the checks to report with its row.
    """
    arrays: dict[str, np.ndarray] = {}
    coords: dict[str, tuple] = {}
    for name, column in frame.items():
        key = str(name)
        spec = coding.labels.get(key) if coding is not None else None
        if spec is not None or (coding is None and not _is_number(column)):
            arrays[key], coords[key] = _encode_labels(column, spec, dataset_id, path, key)
        elif isinstance(column.dtype, np.dtype) and column.dtype.kind in "bi":  # NumPy's: never missing
            arrays[key] = column.to_numpy(dtype=np.int64)
        elif isinstance(column.dtype, np.dtype) and column.dtype.kind == "f":
            arrays[key] = column.to_numpy(dtype=np.float64)
        elif not _is_number(column):
            arrays[key] = column.astype(object).where(column.notna(), np.nan).to_numpy(dtype=object)
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


def _encode_labels(
    column: pd.Series, spec: ColumnCoding | None, dataset_id: str, path: Path, name: str
) -> tuple[np.ndarray, tuple[str, ...]]:
    """Codes into the labels (the sweep's levels, else this file's, sorted unless "appearance").

    Missing values get code -1; a label missing from the sweep's levels is a DatasetError.
    """
    missing = column.isna().to_numpy()
    text = column[~missing].astype(str).to_numpy(dtype=object)
    codes = np.full(len(column), -1, dtype=np.int64)
    if spec is None or spec.levels is None:
        present, labels = pd.factorize(text, sort=spec is None or spec.order == "sorted")
        codes[~missing] = present
        return codes, tuple(str(label) for label in labels)
    present = pd.Index(spec.levels, dtype=object).get_indexer(text)
    if np.any(present < 0):
        raise _unknown_label(text, present, missing, spec, dataset_id, path, name)
    codes[~missing] = present
    return codes, spec.levels


def _unknown_label(
    text: np.ndarray, present: np.ndarray, missing: np.ndarray, spec: ColumnCoding, dataset_id: str, path: Path,
    name: str,
) -> DatasetError:
    """The error for labels outside the sweep's levels, naming the first value and its row."""
    unknown = list(dict.fromkeys(text[present < 0]))
    row = int(np.flatnonzero(~missing)[np.argmax(present < 0)])
    values = ", ".join(map(repr, unknown[:5])) + (", ..." if len(unknown) > 5 else "")
    if any("\x00" in label for label in unknown):
        why = "a label with a NUL character, which the NetCDF outputs cannot store (so it is no level of the sweep)"
    elif spec.order == "listed":
        why = (f"not among the levels listed in the config (columns.{name}.levels: "
               f"{', '.join(spec.levels or ())}); add {'it' if len(unknown) == 1 else 'them'} to that list")
    else:
        why = "not among the sweep's levels of this column: the file changed after they were computed; run again"
    return DatasetError(f"value {values} (first at row index {row}, counting from 0) is {why}",
                        dataset=dataset_id, path=path, column=name)

