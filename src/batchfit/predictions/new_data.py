"""The new inputs of a dataset, from the config's ``predict``: a file per dataset, a grid, or a horizon.

Each form gives a `batchfit.data.dataset.Dataset` that ``build_model`` takes as it takes the dataset
itself, with the dataset's own labels (a text column's codes mean what they meant in its fit, and
``data.coords`` holds the same labels, so every dimension the posterior has keeps its length) and its
values that are one number (the config's ``params`` and the side tables' values, 0-d arrays of the
dataset) carried over:

* ``data``: the file whose name is the dataset's id, or the group of a table whose key values give it,
  read as the sweep reads a dataset (`batchfit.data.reader.DatasetReader`, with the sweep's coding and
  the columns' bounds; not the row rules, which choose rows to fit);
* ``grid``: the same rows for every dataset, every combination of the grid's columns; besides the
  0-d values, a column holding one value in the whole dataset (a subject's dose repeated on every
  row) is repeated over the new rows;
* ``horizon``: what the model file's ``extend(data, horizon)`` returns for the dataset's data.

The observed columns the model reads may be left out: `batchfit.predictions.predictor` fills them in.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from batchfit.config import Config
from batchfit.data.dataset import Dataset, load_dataset, with_params
from batchfit.data.discovery import PREDICT_DATA, DatasetIndex, discover_datasets
from batchfit.data.labels import Coding
from batchfit.data.reader import DatasetReader
from batchfit.errors import ConfigError, DatasetError, ModelContractError
from batchfit.model.model_file import use_model_folder
from batchfit.model.user_traceback import model_code_error
from batchfit.settings import DataSettings

EXTEND = "extend"  # the model file's hook for predict.horizon


def new_data_files(config: Config) -> DatasetIndex:
    """With ``predict.data``: each new-data file and table group by the id of the dataset it is for (a file's
    name without the suffix, a group's key values, made safe ids as the sweep's are); otherwise none."""
    if config.predict.data is None:
        return DatasetIndex()
    return discover_datasets(config.data_sources, key=PREDICT_DATA)


def new_data_reader(config: Config, files: DatasetIndex, coding: Coding, wanted: Iterable[str]) -> DatasetReader:
    """The reader of the new-data files and table groups ``files`` (`new_data_files`, or a job's staged ones) of
    the datasets ``wanted``: a table is read once for all of them, each group as a dataset of the sweep is."""
    return DatasetReader(files, new_data_settings(config), coding, wanted=wanted)


def new_inputs(config: Config, data: Dataset, *, coding: Coding, module: ModuleType,
               new_data: DatasetReader | None = None) -> Dataset:
    """The new inputs of the dataset ``data`` (as its fit read it) by the config's ``predict`` form.

    ``new_data``: the reader of ``predict.data`` (`new_data_reader`); ``module``: the loaded model file
    (``predict.horizon``). A problem is a `DatasetError` naming the dataset, the file and the column.
    """
    predict = config.predict
    if not predict.enabled:
        raise ConfigError("predict gives no new inputs (none of data, grid, horizon)", key="predict",
                          source=config.source)
    if predict.source == "data":
        if new_data is None or data.id not in new_data.index:
            raise DatasetError("has no new data among predict.data", dataset=data.id, path=data.path)
        new = new_data.load(data.id)
    elif predict.source == "grid":
        new = grid_inputs(data, predict.grid or {})
    else:
        new = extended(data, int(predict.horizon or 0), module)
    return with_labels_of(data, new)


def new_data_settings(config: Config) -> DataSettings:
    """How a new-data file is read: with the columns' settings (their bounds) and the numeric ``params``; not the
    row rules, which choose a dataset's rows to fit (new rows are all predicted), nor the side tables, whose
    values come with the dataset's own (`with_labels_of`)."""
    return DataSettings(columns=dict(config.columns), params=dict(config.params))


def given_inputs(data: Dataset, given: Any, coding: Coding, config: Config) -> Dataset:
    """New inputs given in a notebook (``batchfit.predict``): a file (read as a new-data file), a Dataset, or a
    mapping of column to values (a pandas DataFrame too), text columns as labels or codes."""
    if isinstance(given, str | Path):
        return with_labels_of(data, load_dataset(data.id, Path(given), coding, new_data_settings(config)))
    if isinstance(given, Dataset):
        return with_labels_of(data, dataclasses.replace(given, id=data.id))
    if hasattr(given, "to_dict") and hasattr(given, "columns"):  # a DataFrame
        given = {str(c): given[c].to_numpy() for c in given.columns}
    if not isinstance(given, Mapping):
        raise TypeError(f"new data must be a file, a Dataset, a mapping of column to values or a DataFrame, "
                        f"not {type(given).__name__}")
    arrays = {}
    for name, values in given.items():
        array = np.asarray(values)
        labels = data.coords.get(str(name))
        if labels is not None and array.dtype.kind in "OUS":
            unknown = sorted({str(v) for v in array.ravel()} - set(labels))
            if unknown:
                raise DatasetError(f"label(s) {', '.join(map(repr, unknown))} are not among the dataset's labels of "
                                   f"this column ({', '.join(map(repr, labels))})", dataset=data.id, column=str(name))
            array = np.asarray([labels.index(str(v)) for v in array.ravel()], dtype=np.int64).reshape(array.shape)
        arrays[str(name)] = array
    return with_labels_of(data, with_params(Dataset(data.id, Path("<new data>"), arrays, {}), config.params))


def grid_inputs(data: Dataset, grid: Mapping[str, Any]) -> Dataset:
    """Every combination of the grid's columns (the first varying slowest), with ``data``'s values that are
    one number carried over: its 0-d arrays, and its columns holding a single value, repeated."""
    values = [_grid_values(data, name, spec) for name, spec in grid.items()]
    rows = list(itertools.product(*values))
    arrays = {name: np.asarray([row[i] for row in rows]) for i, name in enumerate(grid)}
    n_rows = len(rows)
    for name, array in data.arrays.items():
        if name in arrays:
            continue
        if array.ndim == 0:
            arrays[name] = array
        elif array.ndim == 1 and array.size and array.dtype.kind in "biuf" and np.all(array == array[0]):
            arrays[name] = np.full(n_rows, array[0], dtype=array.dtype)
    return Dataset(data.id, data.path, arrays, dict(data.coords))


def _grid_values(data: Dataset, name: str, spec: Any) -> list[Any]:
    """One grid column's values: evenly spaced numbers, listed numbers, or listed labels as the dataset's codes."""
    if name not in data.arrays:
        raise DatasetError(f"predict.grid names column {name!r}, which the dataset does not have; its columns: "
                           f"{', '.join(map(repr, data.arrays))}", dataset=data.id, path=data.path, column=name)
    if isinstance(spec, Mapping):
        return list(np.linspace(spec["start"], spec["stop"], int(spec["num"])))
    labels = data.coords.get(name)
    if labels is None:
        text = [v for v in spec if isinstance(v, str)]
        if text:
            raise DatasetError(f"predict.grid lists labels such as {text[0]!r} for column {name!r}, which holds "
                               "numbers", dataset=data.id, path=data.path, column=name)
        return list(spec)
    unknown = [str(v) for v in spec if str(v) not in labels]
    if unknown:
        raise DatasetError(f"predict.grid lists label(s) {', '.join(map(repr, unknown))} of column {name!r}, which "
                           f"the dataset does not have (its labels: {', '.join(map(repr, labels))})",
                           dataset=data.id, path=data.path, column=name)
    return [labels.index(str(v)) for v in spec]


def extended(data: Dataset, horizon: int, module: ModuleType) -> Dataset:
    """What the model file's ``extend(data, horizon)`` returns for ``data``: a Dataset, or a mapping of
    column to array (a pandas DataFrame too), text columns as codes; ``data``'s labels are kept."""
    hook = getattr(module, EXTEND, None)
    if not callable(hook):
        raise ModelContractError(f"predict.horizon needs the model file {module.__file__} to define "
                                 f"{EXTEND}(data, horizon), which returns the new inputs of a dataset from its data "
                                 "(batchfit's docs/predictions.md)")
    use_model_folder(module)
    try:
        result = hook(data, horizon)
    except Exception as exc:
        raise model_code_error(exc, Path(str(module.__file__)),
                               f"{EXTEND} failed for dataset '{data.id}' ({data.path})") from exc
    if isinstance(result, Dataset):
        return dataclasses.replace(result, id=data.id, path=data.path)
    if hasattr(result, "to_dict") and hasattr(result, "columns"):  # a DataFrame
        result = {str(c): result[c].to_numpy() for c in result.columns}
    if not isinstance(result, Mapping):
        raise ModelContractError(f"{EXTEND}(data, horizon) returned {type(result).__name__} for dataset "
                                 f"'{data.id}'; it must return a Dataset, a mapping of column to array or a DataFrame")
    return Dataset(data.id, data.path, {str(k): np.asarray(v) for k, v in result.items()}, dict(data.coords))


def with_labels_of(data: Dataset, new: Dataset) -> Dataset:
    """``new`` with ``data``'s labels: each text column recoded into ``data``'s labels (a label the dataset
    lacks is an error: its fit has no parameter for it), and ``data``'s other coordinates added."""
    arrays, coords = dict(new.arrays), {**data.coords, **new.coords}
    for name, labels in new.coords.items():
        known = data.coords.get(name)
        if name not in arrays or known is None or tuple(labels) == tuple(known):
            coords[name] = known if known is not None else labels
            continue
        index = {label: code for code, label in enumerate(known)}
        lookup = np.array([index.get(str(label), -2) for label in labels], dtype=np.int64)
        codes = arrays[name]
        recoded = np.where(codes >= 0, lookup[np.clip(codes, 0, None)], -1)
        if np.any(recoded == -2):
            row = int(np.argmax(recoded == -2))
            raise DatasetError(f"label {labels[codes[row]]!r} (row index {row}, counting from 0) is not among the "
                               f"dataset's labels of this column ({', '.join(map(repr, known))}), so its fit has "
                               "nothing to predict it with", dataset=new.id, path=new.path, column=name)
        arrays[name], coords[name] = recoded, known
    for name, value in data.arrays.items():  # values that are one number: the config's params, ...
        if value.ndim == 0 and name not in arrays:
            arrays[name] = value
    return dataclasses.replace(new, arrays=arrays, coords=coords)
