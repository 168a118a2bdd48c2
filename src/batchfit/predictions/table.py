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
import itertools
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

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


def prediction_rows(dataset_id: str, predictions: Any, inputs: dict[str, np.ndarray], n_rows: int,
                    summary: SummarySettings) -> pd.DataFrame:
    """The rows of predictions.csv for one dataset's ``predictions`` group (an xarray Dataset)."""
    parts = []
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
        rows = np.repeat(np.arange(n_rows), len(elements)) if per_row else None
        count = len(rows) if per_row else len(elements)
        frame = {"dataset": dataset_id, "variable": name,
                 "row": pd.array(rows if per_row else [pd.NA] * count, dtype="Int64"),
                 "element": np.tile(elements, n_rows if per_row else 1)}
        for column, values in inputs.items():  # a row's inputs; none for an element that is no row
            frame[column] = values[rows] if per_row else pd.array([pd.NA] * count)
        frame.update(zip(stat_columns(summary), stats, strict=True))
        parts.append(pd.DataFrame(frame))
    if not parts:
        return pd.DataFrame(columns=[*KEY_COLUMNS, *inputs, *stat_columns(summary)])
    return pd.concat(parts, ignore_index=True)


def _labels(dataset: Any, dim: str, size: int) -> list[Any]:
    return list(dataset[dim].values) if dim in dataset.coords else list(range(size))


def write_rows(rows: pd.DataFrame, path: Path) -> None:
    with atomic_path(path) as tmp:
        rows.to_csv(tmp, index=False)


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
        pd.DataFrame(columns=columns).to_csv(tmp, index=False)
        with open(tmp, "ab") as out:
            for part in parts:
                written += _append(part, columns, out)
    return written


def _append(part: Path, columns: list[str], out: Any) -> int:
    """Append a rows file to ``out`` without its header; its rows (as they are when it has ``columns``, the
    usual case: no parsing; otherwise read and laid out in ``columns``)."""
    if rows_header(part) == columns:
        with open(part, "rb") as file:
            file.readline()
            body = file.read()
        out.write(body)
        return body.count(b"\n")
    frame = pd.read_csv(part, keep_default_na=False, na_values=[""], dtype={"row": "Int64"})
    out.write(frame.reindex(columns=columns).to_csv(header=False, index=False).encode())
    return len(frame)
