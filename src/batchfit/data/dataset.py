"""Find dataset files, load them into plain arrays, and check them against a model's needs.

A dataset is one file (CSV, Parquet or NetCDF); its id is the file name without suffix.
Tabular text (label) columns become integer codes 0..K-1 with the labels in `coords`, so a
model can index a per-group parameter with them directly; the sweep's `Coding`
(`batchfit.data.coding.sweep_coding`) gives a label the same code in every dataset.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, KeysView, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from batchfit.data.discovery import check_suffix, file_kind
from batchfit.data.labels import Coding
from batchfit.data.rows import DroppedRows, check_bounds
from batchfit.errors import DatasetError
from batchfit.settings import DataSettings


class MissingColumnError(DatasetError, KeyError):
    """A model asked a dataset for a column it does not have (also a KeyError)."""

    __str__ = BaseException.__str__  # the plain message, not KeyError's quoted repr


@dataclass(frozen=True, eq=False)
class Dataset:
    """One loaded dataset: named arrays plus coordinate labels, as `build_model(data)` sees it.

    ``row_index``: each row's number in its file or table (the rows the row rules kept), for messages;
    ``dropped``: how many rows each rule dropped; ``key_columns``: the key columns of the table it is a
    group of, which are no data of it unless the config lists them.
    """

    id: str
    path: Path
    arrays: dict[str, np.ndarray]
    coords: dict[str, tuple]
    row_index: np.ndarray | None = None
    dropped: DroppedRows = DroppedRows()
    key_columns: tuple[str, ...] = ()

    def __getitem__(self, name: str) -> np.ndarray:
        try:
            return self.arrays[name]
        except KeyError:
            hint = (f" ({name!r} is a key column of the table {self.path}, which names the dataset and is no data "
                    "of it; list it under the config's columns to give it to the model, e.g. "
                    f"columns: {{{name}: {{}}}} for labels)") if name in self.key_columns else ""
            raise MissingColumnError(
                f"no column {name!r}; available columns: {_names(self.arrays)}{hint}",
                dataset=self.id,
                path=self.path,
                column=name,
            ) from None

    def scalar(self, name: str) -> np.ndarray:
        """The dataset's one value of ``name`` as a 0-d array: a per-dataset value (a side table's, a numeric
        ``params`` entry), or a column holding the same value on every row (a subject's dose or weight).

        Entered as ``pm.Data(name, data.scalar(name))``, every dataset's value shares one compile; a
        Python number (``float(data[name][0])``) would be a constant of the graph, a compile per value.
        A column with more than one value is a `DatasetError` naming two rows that differ.
        """
        array = self[name]
        if array.ndim == 0:
            return array
        if array.shape[0] == 0:
            raise DatasetError(f"data.scalar({name!r}): column {name!r} has no rows", dataset=self.id, path=self.path,
                               column=name)
        rows = array.reshape(array.shape[0], -1)
        first = rows[0]
        differ = (rows != first).any(axis=1)
        if array.dtype.kind == "f":
            differ &= ~(np.isnan(rows) & np.isnan(first)).all(axis=1)
        if differ.any():
            other = int(np.argmax(differ))
            where = self.row_index if self.row_index is not None else np.arange(array.shape[0])
            raise DatasetError(
                f"data.scalar({name!r}): column {name!r} holds more than one value: {array[0].tolist()!r} at row index "
                f"{int(where[0])} and {array[other].tolist()!r} at row index {int(where[other])} (counting from 0); a "
                "per-dataset value is the same on every row (or comes from a side table, config key values)",
                dataset=self.id, path=self.path, column=name)
        return np.asarray(array[0])

    def __contains__(self, name: object) -> bool:
        return name in self.arrays

    def keys(self) -> KeysView[str]:
        """Names of the arrays (columns or NetCDF variables)."""
        return self.arrays.keys()

    @property
    def n_rows(self) -> int:
        """Length of the first axis of the first non-scalar array (the row count of a table)."""
        return next((a.shape[0] for a in self.arrays.values() if a.ndim), 0)

    @property
    def groups(self) -> dict[str, int]:
        """The number of distinct labels each text column holds in this dataset (of the sweep's levels,
        which `coords` lists whole), by column."""
        return {name: int(np.unique(self.arrays[name][self.arrays[name] >= 0]).size)
                for name in self.coords if name in self.arrays and self.arrays[name].dtype.kind in "iu"}


@dataclass(frozen=True)
class DataRequirement:
    """What a model needs from one array: its rank and dtype (a str such as "float64" is accepted)."""

    ndim: int
    dtype: np.dtype

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", np.dtype(self.dtype))


_AS_IS = DataSettings()  # no row rules, bounds, side tables or parameters


def load_dataset(dataset_id: str, path: Path, coding: Coding | None = None,
                 settings: DataSettings = _AS_IS, values: Mapping[str, np.ndarray] | None = None,
                 values_source: Any = None) -> Dataset:
    """Read one CSV, Parquet or NetCDF file into a `Dataset`; any read problem is a DatasetError.

    With the sweep's `coding`, label columns get the sweep's codes and text in a column that
    holds numbers elsewhere stays text (for `check_dataset` to report); without one, every
    text column is coded within this file, by sorted labels. The ``settings``' row rules and bounds
    apply (`batchfit.data.rows`), its per-dataset ``values`` (a side table's: `finished`) are added, and
    each number among the ``params`` is a 0-d float array of the dataset too (`with_params`). (A sweep's
    datasets, table groups included, are loaded by `batchfit.data.reader.DatasetReader`.)
    """
    path = Path(path)
    check_suffix(dataset_id, path)
    try:
        with path.open("rb") as handle:
            empty = not handle.read(1)
    except OSError as exc:
        raise DatasetError(
            f"cannot read the file: {exc.strerror or exc}", dataset=dataset_id, path=path
        ) from None
    if empty:
        raise DatasetError("the file is empty", dataset=dataset_id, path=path)
    from batchfit.data.readers import read_arrays  # pandas and xarray: only where files are read

    rows = read_arrays(dataset_id, path, file_kind(path), coding, settings.rows)
    dataset = Dataset(id=dataset_id, path=path, arrays=rows.arrays, coords=rows.coords, row_index=rows.row_index,
                      dropped=rows.dropped)
    return finished(dataset, settings, values, values_source)


def finished(dataset: Dataset, settings: DataSettings, values: Mapping[str, np.ndarray] | None = None,
             values_source: Any = None) -> Dataset:
    """A dataset read from its rows, checked against the columns' bounds, with its per-dataset ``values`` (a
    side table's, from ``values_source``) and the numbers among the ``params``."""
    check_bounds(dataset.arrays, settings.columns, row_index=dataset.row_index, dataset=dataset.id, path=dataset.path)
    if values:
        from batchfit.data.values import with_values

        dataset = dataclasses.replace(dataset, arrays=with_values(dataset.arrays, values, dataset=dataset.id,
                                                                  path=dataset.path, side=values_source))
    return with_params(dataset, settings.params)


def with_params(dataset: Dataset, params: Mapping[str, Any]) -> Dataset:
    """``dataset`` with each number among ``params`` as a 0-d float array named after it.

    So a model can put a parameter in a ``pm.Data`` (which must hold the dataset's array of its
    name): ``pm.Data("prior_scale", data["prior_scale"])``. Swapped like any container, its value
    is no constant of the graph, and every value shares one compile (docs/variants.md).
    """
    numbers = {name: np.asarray(value, dtype=np.float64) for name, value in params.items()
               if isinstance(value, int | float) and not isinstance(value, bool)}
    clash = sorted(set(numbers) & set(dataset.arrays))
    if clash:
        raise DatasetError(f"the config's params {', '.join(clash)} share a name with the dataset's columns; "
                           "rename the parameter(s) (config key params, and build_model's keyword)",
                           dataset=dataset.id, path=dataset.path, column=clash[0])
    return dataclasses.replace(dataset, arrays={**dataset.arrays, **numbers}) if numbers else dataset


def check_dataset(
    dataset: Dataset,
    requirements: Mapping[str, DataRequirement],
    *,
    allow_missing_values: bool = False,
) -> None:
    """Raise one DatasetError listing every way the dataset fails the model's requirements.

    NaN is accepted when `allow_missing_values` is true (for models that handle missing
    data) unless the model needs integers; infinity never is, nor a missing label in a text column.
    """
    problems = [
        (name, problem)
        for name, req in requirements.items()
        for problem in _problems(dataset, name, req, allow_missing_values)
    ]
    if len(problems) == 1:
        [(name, problem)] = problems
        raise DatasetError(problem, dataset=dataset.id, path=dataset.path, column=name)
    if problems:
        listing = "".join(f"\n  - {problem}" for _, problem in problems)
        raise DatasetError(
            f"{len(problems)} problems with the data the model needs:{listing}",
            dataset=dataset.id,
            path=dataset.path,
        )


def coerce_for_model(
    dataset: Dataset,
    requirements: Mapping[str, DataRequirement],
    *,
    allow_missing_values: bool = False,
) -> dict[str, np.ndarray]:
    """The required arrays, checked and cast to the required dtype (C-contiguous, rank kept).

    ``np.asarray(order="C")``, not ``np.ascontiguousarray``, which turns a 0-d array into shape (1,).
    """
    check_dataset(dataset, requirements, allow_missing_values=allow_missing_values)
    return {
        name: np.asarray(_model_array(dataset, name, req), dtype=req.dtype, order="C")
        for name, req in requirements.items()
    }


def _model_array(dataset: Dataset, name: str, req: DataRequirement) -> np.ndarray:
    """The dataset's array that fills the model's ``pm.Data`` ``name``: a column's one value where the model holds
    a 0-d value of that name (``pm.Data("WT", data.scalar("WT"))``), else the array itself."""
    array = dataset.arrays[name]
    return dataset.scalar(name) if req.ndim == 0 and array.ndim == 1 else array


def _problems(dataset: Dataset, name: str, req: DataRequirement, allow_nan: bool) -> Iterator[str]:
    """Every reason array `name` cannot be given to the model as `req`; each names the column."""
    col = f"column {name!r}"
    where = dataset.row_index
    if name not in dataset.arrays:
        yield f"{col} is missing; available columns: {_names(dataset.arrays)}"
        return
    try:
        array = _model_array(dataset, name, req)
    except DatasetError as exc:
        yield exc.message
        return
    if array.ndim != req.ndim:
        yield f"{col} has {array.ndim} dimension(s) but the model needs {req.ndim}"
        return
    wants_int = req.dtype.kind in "biu"
    labels = dataset.coords.get(name) if array.dtype.kind == "i" else None
    if labels is not None and not wants_int:
        yield _text_problem(col, array, labels, where)
        return
    if labels is not None and np.any(array < 0):
        yield _bad_rows(col, array < 0, "missing labels", where)
        return
    if labels is not None and any("\x00" in label for label in labels):
        example = next(label for label in labels if "\x00" in label)
        yield f"{col} has labels with a NUL character, such as {example!r}, which the NetCDF outputs cannot store"
        return
    if array.dtype.kind not in "biuf":
        yield _non_numeric_problem(col, array, wants_int, where)
        return
    values = array
    if array.dtype.kind == "f":
        nan, inf = np.isnan(array), np.isinf(array)
        if np.any(inf):
            yield _bad_rows(col, inf, "infinite values", where)
        if np.any(nan) and (wants_int or not allow_nan):
            yield _bad_rows(col, nan, "missing (NaN) values", where)
        fractional = np.isfinite(array) & (array != np.round(array))
        if wants_int and np.any(fractional):
            example = array[fractional].flat[0].item()
            yield (f"{col} has fractional values such as {example!r} {_rows(fractional, where)}, "
                   "but the model needs integers")
            return
        values = array[np.isfinite(array)]
    yield from _range_problems(col, values, req.dtype)


def _range_problems(col: str, values: np.ndarray, dtype: np.dtype) -> Iterator[str]:
    """Values that would not survive the cast to `dtype` (overflow, sign, non-0/1 booleans)."""
    if values.size == 0:
        return
    if dtype.kind == "b":
        if np.any((values != 0) & (values != 1)):
            yield f"{col} has values other than 0 and 1, but the model needs true/false"
        return
    info = np.iinfo(dtype) if dtype.kind in "iu" else np.finfo(dtype)
    low, high = values.min().item(), values.max().item()  # Python numbers compare exactly
    if low < info.min or high > info.max:
        yield (
            f"{col} has values from {low!r} to {high!r}, outside the range of the model's "
            f"type {dtype} ({info.min} to {info.max})"
        )


def _text_problem(col: str, codes: np.ndarray, labels: tuple[str, ...], where: np.ndarray | None) -> str:
    """Message for a label column where the model needs numbers, quoting a label and its rows."""
    bad = [code for code in range(len(labels)) if not _parses_as_number(labels[code])]
    present = np.isin(codes, bad)
    if np.any(present):
        example = labels[codes[present].flat[0]]
        return f"non-numeric values such as {example!r} in {col} {_rows(present, where)}, but the model needs numbers"
    example = f" (e.g. {labels[0]!r})" if labels else ""
    return (f"{col} was read as labels{example}, but the model needs numbers (a column listed under "
            "'columns:' in the config is always read as labels)")


def _non_numeric_problem(col: str, array: np.ndarray, wants_int: bool, where: np.ndarray | None) -> str:
    """Message for a non-numeric array (text in a numeric column, a NetCDF string variable)."""
    text = np.vectorize(str, otypes=[object])(array) if array.size else array
    bad = ~np.vectorize(_parses_as_number, otypes=[bool])(text) if array.size else np.zeros(array.shape, bool)
    if not np.any(bad):
        return f"{col} holds values of type {array.dtype}, but the model needs numbers"
    hint = (" (if the column holds labels, list it under 'columns:' in the config so that every file's "
            "values are read as labels)") if wants_int else ""
    example = text[bad].flat[0]
    return f"non-numeric values such as {example!r} in {col} {_rows(bad, where)}, but the model needs numbers{hint}"


def _parses_as_number(text: str) -> bool:
    """True if the text reads as a number (as Python's float() reads it)."""
    try:
        float(text)
    except ValueError:
        return False
    return True


def _bad_rows(col: str, mask: np.ndarray, what: str, where: np.ndarray | None) -> str:
    """'<what> in <col> in N row(s) (first at row index i, counting from 0)'."""
    return f"{what} in {col} {_rows(mask, where)}".rstrip()


def _rows(mask: np.ndarray, where: np.ndarray | None = None) -> str:
    """'in N row(s) (first at row index i, counting from 0)', counting rows along the first axis; ``where``: each
    row's number in its file or table (the rows the row rules kept)."""
    if mask.ndim == 0:
        return ""
    rows = mask.reshape(mask.shape[0], -1).any(axis=1)
    count, first = int(rows.sum()), int(np.argmax(rows))
    if where is not None and len(where) == len(rows):
        first = int(where[first])
    return f"in {count} row(s) (first at row index {first}, counting from 0)"


def _names(arrays: Mapping[str, object]) -> str:
    """The quoted names of all arrays, for "available columns" lists."""
    return ", ".join(repr(n) for n in arrays) or "(none)"
