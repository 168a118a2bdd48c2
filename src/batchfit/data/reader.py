"""Loading a sweep's datasets by id, as every stage reads them (check, compile, fit, SBC, notebooks).

A dataset is a file of its own or a group of a table (`batchfit.data.discovery`). The reader
applies the row rules and the columns' bounds, adds the dataset's side-table values and
build_model's numeric parameters, and codes text columns as the sweep codes them. A table is read
once for all the groups the reader is told it will load (``wanted``: a job's batch), never once
per dataset.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from batchfit.common.hashing import file_sha256
from batchfit.data.dataset import Dataset, finished, load_dataset
from batchfit.data.discovery import DatasetIndex
from batchfit.data.ids import MISSING_KEY
from batchfit.data.labels import Coding
from batchfit.data.rows import DroppedRows
from batchfit.errors import BatchfitError, DatasetError
from batchfit.settings import DataSettings, RowRules, TableSource


class DatasetReader:
    """The datasets of ``index`` (a sweep's, or a job's staged ones), loaded with the sweep's ``coding`` and
    the config's data ``settings``.

    ``wanted``: the datasets this reader will be asked for (a batch and its reference), so that a table
    is read once for all of them; None: every dataset of the index.
    """

    def __init__(self, index: Mapping[str, Path], settings: DataSettings, coding: Coding | None, *,
                 wanted: Iterable[str] | None = None):
        self.index = index
        self.settings = settings
        self.coding = coding
        self.wanted = set(wanted) if wanted is not None else None
        self._side: Any = None
        self._chunks: dict[TableSource, list[_Chunk]] = {}

    @property
    def side(self) -> Any:
        """The side tables of per-dataset values (`batchfit.data.values.SideValues`), read on first use."""
        if self._side is None:
            from batchfit.data.values import SideValues, read_side_values

            self._side = read_side_values(self.settings.values) if self.settings.values else SideValues()
        return self._side

    def group(self, dataset_id: str) -> tuple[TableSource, tuple[Any, ...]] | None:
        return self.index.group(dataset_id) if isinstance(self.index, DatasetIndex) else None

    def load(self, dataset_id: str) -> Dataset:
        """The dataset as `build_model` gets it; any problem with its data is a `DatasetError`."""
        if dataset_id not in self.index:
            raise BatchfitError(f"dataset '{dataset_id}' is not among the sweep's datasets")
        path = self.index[dataset_id]
        values = self.side.values(dataset_id) if self.settings.values else None
        group = self.group(dataset_id)
        if group is None:
            return load_dataset(dataset_id, path, self.coding, self.settings, values, self.side if values else None)
        from batchfit.data.readers import frame_rows

        table, key = group
        chunk = self._chunk(dataset_id, table)
        if key == MISSING_KEY:
            rows = chunk.raw(dataset_id).index
            shown = ", ".join(map(str, rows[:5])) + (", ..." if len(rows) > 5 else "")
            raise DatasetError(f"{len(rows)} row(s) of the table have no value in key column(s) "
                               f"{', '.join(table.by)} (row index {shown}, counting from 0): every row must belong "
                               "to a dataset; give them a key, or remove them", dataset=dataset_id, path=path)
        if chunk.error is not None:
            raise DatasetError(chunk.error.message, dataset=dataset_id, path=path, column=chunk.error.column)
        keys = tuple(name for name in table.by if name not in self.settings.columns)
        rows = frame_rows(chunk.kept(dataset_id), dataset_id=dataset_id, path=path, coding=self.coding,
                          rules=chunk.dropped[dataset_id], typed_by_text=chunk.csv)
        dataset = Dataset(dataset_id, path, rows.arrays, rows.coords, rows.row_index, rows.dropped, keys)
        return finished(dataset, self.settings, values, self.side)

    def digest(self, dataset_id: str) -> str:
        """What a fit of the dataset records of its data: its file's sha256 or its group's rows' digest (as the
        table's scan computes it), and its side-table values' digest."""
        group = self.group(dataset_id)
        if group is None:
            data = file_sha256(self.index[dataset_id])
        else:
            from batchfit.data.tables import rows_digest

            data = rows_digest(self._chunk(dataset_id, group[0]).raw(dataset_id))
        return data_digest(data, self.side.digest(dataset_id) if self.settings.values else "")

    def _chunk(self, dataset_id: str, table: TableSource) -> _Chunk:
        """The read of ``table`` that holds the group: one read of every wanted group of it not read yet."""
        chunks = self._chunks.setdefault(table, [])
        for chunk in chunks:
            if dataset_id in chunk.positions:
                return chunk
        from batchfit.data.tables import read_groups, table_format

        members = self.index.members(table) if isinstance(self.index, DatasetIndex) else {}
        done = {d for chunk in chunks for d in chunk.positions}
        wanted = {d: k for d, k in members.items()
                  if d == dataset_id or (self.wanted is None or d in self.wanted) and d not in done}
        as_text = {name for name, column in self.settings.columns.items() if column.label}
        located = self.index.location(table) if isinstance(self.index, DatasetIndex) else Path(table.table)
        keys = [name for name in table.by if name not in self.settings.columns]
        chunk = _Chunk.of(*read_groups(dataclasses.replace(table, table=located), wanted, as_text=as_text),
                          self.settings.rows, keys, csv=table_format(Path(table.table)) == "CSV")
        chunks.append(chunk)
        if dataset_id not in chunk.positions:
            raise DatasetError("the table has no rows of this dataset any more: it changed since the sweep was "
                               "planned; run the sweep again", dataset=dataset_id, path=Path(table.table))
        return chunk


@dataclass
class _Chunk:
    """One read of a table's groups: its rows, each group's row positions in them, the row rules applied to the
    whole read at once (they judge one row at a time): each group's kept positions and dropped counts, or the
    rules' error, which each of its groups fails with. The rows the groups are loaded from (`kept`) are without
    the key columns, which are no data, and with text as plain Python strings, quicker to take rows of."""

    frame: Any
    data: Any
    positions: dict[str, np.ndarray]
    bounds: dict[str, tuple[int, int]]
    dropped: dict[str, DroppedRows]
    csv: bool  # the table is a CSV file: its groups' text columns are typed again as files of their rows would be
    error: DatasetError | None = None

    @classmethod
    def of(cls, frame: Any, positions: dict[str, np.ndarray], rules: RowRules, keys: list[str], *,
           csv: bool) -> _Chunk:
        """The read ``frame`` and its groups' ``positions``; ``keys``: the key columns that are no data. The kept
        data rows are laid out group after group, so a group's are a slice (taking rows one group at a time is
        most of loading a small group)."""
        import pandas as pd

        from batchfit.data.rows import rule_masks

        try:
            where, present = rule_masks(frame, rules)
            error = None
        except DatasetError as exc:
            where, present, error = np.ones(len(frame), dtype=bool), np.ones(len(frame), dtype=bool), exc
        keep = where & present
        kept = {d: rows[keep[rows]] for d, rows in positions.items()}
        ends = np.cumsum([len(rows) for rows in kept.values()])
        bounds = {d: (int(end - len(rows)), int(end)) for (d, rows), end in zip(kept.items(), ends, strict=True)}
        order = np.concatenate([*kept.values(), np.zeros(0, dtype=np.int64)])
        data = frame.drop(columns=keys).iloc[order]
        data = data.astype({name: object for name, column in data.items()
                            if isinstance(column.dtype, pd.StringDtype) or column.dtype == object})
        dropped = {d: DroppedRows(int((~where[rows]).sum()), int((where[rows] & ~present[rows]).sum()))
                   for d, rows in positions.items()}
        return cls(frame, data, positions, bounds, dropped, csv, error)

    def raw(self, dataset_id: str) -> Any:
        """The group's rows as the table has them."""
        return self.frame.iloc[self.positions[dataset_id]]

    def kept(self, dataset_id: str) -> Any:
        """The group's data rows the row rules keep."""
        start, end = self.bounds[dataset_id]
        return self.data.iloc[start:end]


def data_digest(rows: str, values: str) -> str:
    """What a fit records of a dataset's data: the digest of its rows (its file's sha256, or its group's), and of
    its side-table values where the sweep has side tables."""
    return f"{rows}+{values}" if values else rows
