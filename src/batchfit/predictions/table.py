"""predictions.csv: a row per dataset, predicted variable and new row, with the inputs, mean, sd and interval.

A predicted variable whose first dimension runs along the new inputs' rows gets a row per new row, with
that row's inputs (text columns as their labels); its other dimensions, and every element of a variable
that is not per row, are named in ``element`` (``g01``, or ``0, 2`` without labels). The statistics are
ArviZ's over all chains and draws: the mean, the sd (``ddof=1``) and the interval ``summary.ci_kind`` at
``summary.ci_prob`` gives, named as summary.csv names it (`batchfit.outputs.intervals`: arviz_stats'
``hdi``/``eti``).

Each prediction's rows are written beside it (``predictions/{id}.csv``); collect_predictions joins them
in the sweep's order (`collect_table`), recomputing a dataset's rows from its predictions when the
interval settings changed since.
"""

from __future__ import annotations

import csv
import io
import itertools
import math
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from batchfit.common.atomic import atomic_path
from batchfit.data.dataset import Dataset
from batchfit.outputs import intervals
from batchfit.settings import SummarySettings

KEY_COLUMNS = ["dataset", "variable", "row", "element"]


def stat_columns(summary: SummarySettings) -> list[str]:
    """The statistics' columns, the interval's named as ArviZ names it (``eti89_lb``, ``eti89_ub``)."""
    return intervals.column_names(summary.interval_kind, summary.interval_prob)


def input_columns(inputs: Dataset, read: Collection[str], filled: Sequence[str]) -> dict[str, np.ndarray]:
    """The new inputs shown beside each row: the columns the model ``read`` that are one value per row (labels
    for text columns) or one number, but the observed columns filled in for the model."""
    n_rows = inputs.n_rows
    shown = {}
    for name, array in inputs.arrays.items():
        per_row = array.ndim == 1 and array.shape[0] == n_rows
        if name not in read or name in filled or not (array.ndim == 0 or per_row):
            continue
        labels = inputs.coords.get(name)
        if labels is not None and array.dtype.kind in "iu":
            text = [labels[c] if c >= 0 else "" for c in np.ravel(array)]
            array = np.asarray(text, dtype=object).reshape(array.shape)
        shown[name] = np.broadcast_to(array, (n_rows,))
    return shown


Rows = dict[str, list[str]]
"""predictions.csv's rows of one dataset: each column's cells, as text."""


def prediction_rows(dataset_id: str, predictions: Any, inputs: dict[str, np.ndarray], n_rows: int,
                    summary: SummarySettings) -> Rows:
    """The rows of predictions.csv for one dataset's ``predictions`` group (an xarray Dataset), as text.

    Each cell is what ``DataFrame.to_csv`` writes for it (`as_text`): building and writing a DataFrame per
    dataset was a noticeable part of a prediction."""
    columns = [*KEY_COLUMNS, *inputs, *stat_columns(summary)]
    rows: Rows = {column: [] for column in columns}
    for name, var in predictions.data_vars.items():
        shape = var.shape[2:]
        # an element's draws contiguous: its statistics read them in one pass
        flat = np.ascontiguousarray(np.asarray(var.values, dtype=np.float64).reshape(-1, int(np.prod(shape))).T)
        with np.errstate(divide="ignore", invalid="ignore"):
            stats = intervals.mean_sd_interval(flat, summary.interval_kind, summary.interval_prob) if flat.shape[1] \
                else [np.full(flat.shape[0], np.nan)] * 4
        per_row = bool(shape) and shape[0] == n_rows
        labels = [_labels(predictions, dim, size) for dim, size in zip(var.dims[2:], shape, strict=True)]
        rest = labels[1:] if per_row else labels
        elements = [", ".join(map(str, combo)) for combo in itertools.product(*rest)] if rest else [""]
        row = np.repeat(np.arange(n_rows), len(elements)) if per_row else None
        count = len(row) if per_row else len(elements)
        rows["dataset"] += [dataset_id] * count
        rows["variable"] += [name] * count
        rows["row"] += as_text(row) if per_row else [""] * count
        rows["element"] += elements * (n_rows if per_row else 1)
        for column, values in inputs.items():  # a row's inputs; none for an element that is no row
            rows[column] += as_text(values[row]) if per_row else [""] * count
        for column, values in zip(stat_columns(summary), stats, strict=True):
            rows[column] += as_text(values)
    return rows


def as_text(values: np.ndarray) -> list[str]:
    """Each value as ``DataFrame.to_csv`` writes it: numbers as NumPy's ``astype(str)`` (a float's shortest repr),
    a missing value (NaN, None) as an empty cell, anything else as ``str``."""
    array = np.asarray(values)
    if array.dtype.kind in "biuf":
        text = array.astype(str)
        if array.dtype.kind == "f":
            text[np.isnan(array)] = ""
        return text.tolist()
    return ["" if value is None or (isinstance(value, float) and math.isnan(value)) else str(value)
            for value in array.tolist()]


def _labels(dataset: Any, dim: str, size: int) -> list[Any]:
    return list(dataset[dim].values) if dim in dataset.coords else list(range(size))


def write_rows(rows: Rows, path: Path) -> None:
    """Write ``rows`` as a CSV file, as ``DataFrame.to_csv(index=False)`` writes them."""
    with open(path, "w", newline="") as file:
        writer = csv.writer(file, lineterminator="\n")
        writer.writerow(rows)
        writer.writerows(zip(*rows.values(), strict=True))


def read_rows(path: Path) -> Rows:
    """A rows file as `write_rows` wrote it: each column's cells, as text."""
    with open(path, newline="") as file:
        reader = csv.reader(file)
        header = next(reader, [])
        cells = list(zip(*reader, strict=True)) or [()] * len(header)
    return {column: list(values) for column, values in zip(header, cells, strict=True)}


def rows_header(path: Path) -> list[str]:
    """The columns of a rows file (its first line)."""
    with open(path, newline="") as fh:
        return next(csv.reader(fh), [])


def collect_table(parts: Sequence[Path], target: Path, summary: SummarySettings) -> int:
    """Join the rows files ``parts`` (in order) into ``target``: the key columns, every input column any has
    (in order of first appearance), the statistics; return the rows written. Read one file at a time."""
    inputs: dict[str, None] = {}
    stats = stat_columns(summary)
    for part in parts:
        inputs.update(dict.fromkeys(c for c in rows_header(part) if c not in KEY_COLUMNS and c not in stats))
    columns = [*KEY_COLUMNS, *inputs, *stats]
    written = 0
    with atomic_path(target) as tmp:
        write_rows(dict.fromkeys(columns, []), tmp)
        with open(tmp, "ab") as out:
            for part in parts:
                written += _append(part, columns, out)
    return written


def _append(part: Path, columns: list[str], out: Any) -> int:
    """Append a rows file to ``out`` without its header; its rows (as they are when it has ``columns``, the
    usual case; otherwise laid out in ``columns``, empty where it lacks one)."""
    if rows_header(part) == columns:
        with open(part, "rb") as file:
            file.readline()
            body = file.read()
        out.write(body)
        return body.count(b"\n")
    rows = read_rows(part)
    n_rows = len(next(iter(rows.values()), []))
    laid_out = {column: rows.get(column, [""] * n_rows) for column in columns}
    text = io.StringIO()
    csv.writer(text, lineterminator="\n").writerows(zip(*laid_out.values(), strict=True))
    out.write(text.getvalue().encode())
    return n_rows
