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
from pathlib import Path
from typing import Any

import numpy as np

from batchfit.common.hashing import file_sha256
from batchfit.config import TableSource
from batchfit.data.dataset import Dataset, DataSettings, finished, load_dataset
from batchfit.data.discovery import DatasetIndex
from batchfit.data.ids import MISSING_KEY
from batchfit.data.labels import Coding
from batchfit.errors import BatchfitError, DatasetError


class DatasetReader:
    """The datasets of ``index`` (a sweep's, or a job's staged ones), loaded with the sweep's ``coding`` and
    the config's data ``settings``.

    ``wanted``: the datasets this reader will be asked for (a batch and its reference), so that a table
    is read once for all of them; None: each table group is read when asked for.
    """

    def __init__(self, index: Mapping[str, Path], settings: DataSettings, coding: Coding | None, *,
                 wanted: Iterable[str] | None = None):
        self.index = index
        self.settings = settings
        self.coding = coding
        self.wanted = set(wanted) if wanted is not None else None
        self._side: Any = None
        self._tables: dict[TableSource, list[tuple[Any, dict[str, np.ndarray]]]] = {}

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
        from batchfit.data.tables import table_format

        table, key = group
        frame = self._rows_of(dataset_id, table)
        if key == MISSING_KEY:
            rows = ", ".join(map(str, frame.index[:5])) + (", ..." if len(frame) > 5 else "")
            raise DatasetError(f"{len(frame)} row(s) of the table have no value in key column(s) "
                               f"{', '.join(table.by)} (row index {rows}, counting from 0): every row must belong to "
                               "a dataset; give them a key, or remove them", dataset=dataset_id, path=path)
        keys = tuple(name for name in table.by if name not in self.settings.columns)
        rows = frame_rows(frame, dataset_id=dataset_id, path=path, coding=self.coding, rules=self.settings.rows,
                          typed_by_text=table_format(Path(table.table)) == "CSV", drop=keys)
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

            data = rows_digest(self._rows_of(dataset_id, group[0]))
        return data_digest(data, self.side.digest(dataset_id) if self.settings.values else "")

    def _rows_of(self, dataset_id: str, table: TableSource) -> Any:
        """The group's rows of ``table``, from one read of every wanted group of it not read yet."""
        chunks = self._tables.setdefault(table, [])
        for frame, positions in chunks:
            if dataset_id in positions:
                return frame.iloc[positions[dataset_id]]
        from batchfit.data.tables import read_groups

        members = self.index.members(table) if isinstance(self.index, DatasetIndex) else {}
        done = {d for _, positions in chunks for d in positions}
        wanted = {d: k for d, k in members.items()
                  if d == dataset_id or self.wanted is not None and d in self.wanted and d not in done}
        as_text = {name for name, column in self.settings.columns.items() if column.label}
        located = self.index.location(table) if isinstance(self.index, DatasetIndex) else Path(table.table)
        frame, positions = read_groups(dataclasses.replace(table, table=located), wanted, as_text=as_text)
        chunks.append((frame, positions))
        if dataset_id not in positions:
            raise DatasetError("the table has no rows of this dataset any more: it changed since the sweep was "
                               "planned; run the sweep again", dataset=dataset_id, path=Path(table.table))
        return frame.iloc[positions[dataset_id]]


def data_digest(rows: str, values: str) -> str:
    """What a fit records of a dataset's data: the digest of its rows (its file's sha256, or its group's), and of
    its side-table values where the sweep has side tables."""
    return f"{rows}+{values}" if values else rows
