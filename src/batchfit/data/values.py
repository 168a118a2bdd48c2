"""Per-dataset values from side tables (config key ``values``): a subject's dose or weight, a store's size.

A side table has one row per dataset, matched by the id its key columns give, as a table source's
groups are named (``ID=12`` gives ``12``): ``values: {table: data/subjects.csv, by: ID}`` serves
files and tables alike. Each other column becomes a 0-d value of the dataset, which a model reads
with ``data.scalar("WT")`` and enters as ``pm.Data`` so that every value shares one compile. A
dataset's row is part of its fit's provenance (`digests`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from batchfit.data.ids import key_text, unique_ids
from batchfit.data.tables import group_digests, read_table, split_keys
from batchfit.errors import ConfigError, DatasetError, one_line
from batchfit.settings import TableSource

if TYPE_CHECKING:  # pandas is imported where it is used: planning a sweep of files (the Snakefile's parse) needs none
    import pandas as pd


@dataclass(frozen=True)
class SideTable:
    """One side table: its rows, and the row of each dataset id."""

    source: TableSource
    frame: pd.DataFrame
    rows: dict[str, int]
    digests: dict[str, str]

    @property
    def columns(self) -> list[str]:
        return [str(c) for c in self.frame.columns if c not in self.source.by]


@dataclass(frozen=True)
class SideValues:
    """The sweep's side tables: each dataset's values and their digest."""

    tables: tuple[SideTable, ...] = ()

    def values(self, dataset_id: str) -> dict[str, np.ndarray]:
        """The dataset's values (column -> 0-d array) from every side table with a row for it."""
        found: dict[str, np.ndarray] = {}
        for table in self.tables:
            row = table.rows.get(dataset_id)
            if row is None:
                continue
            for name in table.columns:
                found[name] = _scalar(table.frame[name].iloc[row])
        return found

    def digest(self, dataset_id: str) -> str:
        """Digest of the dataset's rows of the side tables ("" without any): part of its fit's provenance."""
        return "+".join(table.digests.get(dataset_id, "-") for table in self.tables) if self.tables else ""

    def source_of(self, name: str) -> Path | None:
        """The side table a value named ``name`` comes from."""
        return next((Path(t.source.table) for t in self.tables if name in t.columns), None)


def read_side_values(tables: Sequence[TableSource], config_source: str = "") -> SideValues:
    """Read the side tables whole (one row per dataset: they are small beside the data) and match their
    rows to ids. A table that cannot be read, lacks a key column, has a row without a key or two rows of
    one id, or a value column another side table has too, is a `ConfigError` naming ``values``."""
    read: list[SideTable] = []
    for number, source in enumerate(tables):
        key = f"values[{number}]" if len(tables) > 1 else "values"
        read.append(_side_table(source, key, config_source))
    seen: dict[str, Path] = {}
    for table in read:
        for name in table.columns:
            if name in seen:
                raise ConfigError(f"column {name!r} is in two side tables, {seen[name]} and {table.source.table}: "
                                  "which value a dataset has would be ambiguous", key="values", source=config_source)
            seen[name] = Path(table.source.table)
    return SideValues(tuple(read))


def _side_table(source: TableSource, key: str, config_source: str) -> SideTable:
    path = Path(source.table)
    try:
        frame = read_table(path)
    except FileNotFoundError:
        raise ConfigError(f"side table {str(path)!r} does not exist (relative paths are resolved against the current "
                          f"directory {Path.cwd()})", key=f"{key}.table", source=config_source) from None
    except Exception as exc:  # noqa: BLE001 - the readers' many error types all mean "not a readable table"
        raise ConfigError(f"cannot read the side table {path}: {type(exc).__name__}: {one_line(exc)}",
                          key=f"{key}.table", source=config_source) from None
    missing = [name for name in source.by if name not in frame.columns]
    if missing:
        raise ConfigError(f"the side table {path} has no key column {', '.join(map(repr, missing))}; its columns: "
                          f"{', '.join(map(str, frame.columns))}", key=f"{key}.by", source=config_source)
    frame = frame.reset_index(drop=True)
    groups = split_keys(frame, source.by)
    if len(groups.missing):
        row = int(groups.missing[0])
        raise ConfigError(f"row index {row} (counting from 0) of the side table {path} has no value in key column(s) "
                          f"{', '.join(source.by)}: each row must name its dataset", key=f"{key}.by",
                          source=config_source)
    counts = np.bincount(groups.codes, minlength=len(groups.keys))
    if (counts > 1).any():
        twice = int(np.argmax(counts > 1))
        rows = np.flatnonzero(groups.codes == twice)[:2].tolist()
        raise ConfigError(f"the side table {path} has {int(counts[twice])} rows for dataset "
                          f"{key_text(groups.keys[twice])!r} (row indexes {rows[0]} and {rows[1]}, counting from 0); "
                          "it takes one row per dataset", key=key, source=config_source)
    texts = [key_text(k) for k in groups.keys]
    ids = unique_ids(texts, [repr(k) for k in groups.keys])
    digests = group_digests(frame.drop(columns=list(source.by)), groups.codes, len(groups.keys))
    first_rows = np.full(len(groups.keys), -1, dtype=np.int64)
    first_rows[groups.codes[::-1]] = np.arange(len(frame))[::-1]
    rows = {dataset_id: int(first_rows[i]) for i, dataset_id in enumerate(ids)}
    return SideTable(source, frame, rows, dict(zip(ids, digests, strict=True)))


def with_values(arrays: Mapping[str, np.ndarray], values: Mapping[str, np.ndarray], *, dataset: str,
                path: Path, side: SideValues) -> dict[str, np.ndarray]:
    """``arrays`` with the dataset's side-table ``values``; a value named like one of its columns is an error."""
    clash = sorted(set(values) & set(arrays))
    if clash:
        raise DatasetError(f"the side table {side.source_of(clash[0])} has a column {clash[0]!r}, which the dataset's "
                           "rows have too; rename one of them (which is the dataset's value would be ambiguous)",
                           dataset=dataset, path=path, column=clash[0])
    return {**arrays, **values}


def _scalar(value: Any) -> np.ndarray:
    """A side table's cell as a 0-d array: a number as float64 (integers as int64), else text."""
    import pandas as pd

    if isinstance(value, bool | np.bool_):
        return np.asarray(value, dtype=np.int64)
    if isinstance(value, int | np.integer):
        return np.asarray(value, dtype=np.int64)
    if isinstance(value, float | np.floating):
        return np.asarray(value, dtype=np.float64)
    if value is None or value is pd.NA:
        return np.asarray(np.nan)
    return np.asarray(str(value))
