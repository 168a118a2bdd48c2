"""Tables split by key columns into datasets: reading them, and their scan (ids, digests, column kinds).

A table source (``datasets: [{table: data/pk.csv, by: ID}]``) is a CSV file, a Parquet file or a
directory of Parquet files (hive partitions too); each value of its key columns is one dataset.
A table is read whole only by its scan (`scan_table`), which every plan reuses while the table is
unchanged (`TableScan`, cached by the table's sizes and modification times); a job reads only its
batch's groups (`read_groups`: for Parquet a filter on the keys, which skips row groups and
partitions whose statistics exclude them).

A group's digest is computed from its own rows' values in their order, column names sorted: it
changes when that group's rows change, and not when other groups change, rows move between
groups' positions, the columns are reordered or a Parquet file is laid out anew (row groups,
compression, partitions, integer widths). Numbers are hashed as float64, so a column that turns
from integers to floats because another group gained a fraction keeps every other group's digest.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from batchfit.data.ids import MISSING_KEY, SAFE_ID_RULE, is_safe_id, key_text, missing_key_id, unique_ids
from batchfit.data.rows import apply_where_and_missing
from batchfit.errors import ConfigError, DatasetError, one_line
from batchfit.settings import RowRules, TableSource

if TYPE_CHECKING:  # pandas is imported where it is used: planning a sweep of files (the Snakefile's parse) needs none
    import pandas as pd

PARQUET_SUFFIXES = (".parquet", ".pq")
_SCAN_FORMAT = 1
_POSITION = "\x00position"  # a row's position in the table, carried through the row rules
# Two keys of pandas' row hash (SipHash, 64 bits each): a group's rows are hashed to 128 bits per row.
_HASH_KEYS = ("batchfit-rows-0a", "batchfit-rows-1b")
_MISSING = "\x00missing"  # how a missing text value is hashed (no text value can be it: NUL is refused)


def table_format(path: Path) -> str:
    """"CSV" or "Parquet": by the suffix of a file, "Parquet" for a directory (of Parquet files)."""
    if path.is_dir():
        return "Parquet"
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return "CSV"
    if suffix in PARQUET_SUFFIXES:
        return "Parquet"
    raise ValueError(f"{path} is no table batchfit splits (a .csv or .parquet file, or a directory of Parquet files)")


def table_stamp(path: Path) -> list[Any]:
    """What changes when the table's content may have: size and modification time of its file, or of each
    Parquet file under its directory (with their names)."""
    if not path.is_dir():
        stat = path.stat()
        return [stat.st_size, stat.st_mtime_ns]
    return [[str(f.relative_to(path)), f.stat().st_size, f.stat().st_mtime_ns] for f in _parquet_files(path)]


def _parquet_files(directory: Path) -> list[Path]:
    return sorted(f for f in directory.rglob("*") if f.is_file() and not f.name.startswith((".", "_")))


def read_table(path: Path, *, keys: Mapping[str, Collection[Any]] | None = None,
               as_text: Collection[str] = ()) -> pd.DataFrame:
    """The table's rows as pandas reads them (CSV: types inferred over the whole file), those whose key
    values are among ``keys`` (column -> values) if given; the index is each row's position in the
    file (CSV, one Parquet file) or in the directory's files in name order. ``as_text`` columns are text.

    For Parquet the filter goes to pyarrow, which reads only the row groups and partitions that may
    hold those keys; a CSV file is read whole and filtered.
    """
    import pandas as pd

    kind = table_format(path)
    if kind == "CSV":
        frame = pd.read_csv(path, dtype={name: str for name in as_text})
    else:
        frame = _read_parquet(path, keys)
        for name in set(as_text) & set(frame.columns):
            if pd.api.types.is_numeric_dtype(frame[name].dtype):
                frame[name] = frame[name].astype(object).map(str, na_action="ignore")
    if keys:
        mask = np.ones(len(frame), dtype=bool)
        for column, values in keys.items():
            mask &= frame[column].isin(list(values)).to_numpy()
        frame = frame[mask]
    return frame


def _read_parquet(path: Path, keys: Mapping[str, Collection[Any]] | None) -> pd.DataFrame:
    """A Parquet file or directory, filtered on ``keys`` by pyarrow; dictionary columns (a hive partition's
    keys) decoded to their values, so a partitioned table reads like one file."""
    import pyarrow.compute as pc
    import pyarrow.dataset as ds

    dataset = ds.dataset(path, format="parquet", partitioning="hive" if path.is_dir() else None)
    expression = None
    for column, values in (keys or {}).items():
        wanted = list(values)
        field_type = dataset.schema.field(column).type
        condition = pc.field(column).isin(_as_arrow(wanted, field_type))
        expression = condition if expression is None else expression & condition
    table = dataset.to_table(filter=expression)
    columns = [pc.dictionary_decode(col) if hasattr(col.type, "value_type") else col for col in table.columns]
    import pyarrow as pa

    frame = pa.table(columns, names=table.column_names).to_pandas()
    return frame


def _as_arrow(values: list[Any], field_type: Any) -> Any:
    """Key values as an arrow array of the column's type (a dictionary column: of its values' type)."""
    import pyarrow as pa

    value_type = getattr(field_type, "value_type", field_type)
    return pa.array(values, type=value_type)


@dataclass(frozen=True)
class TableScan:
    """One table source's groups: their ids and keys, each group's digest and the counts of column kinds.

    ``columns``: the table's data columns (its key columns only where the config lists them).
    ``kinds``: per column, how many groups hold numbers, text, or nothing in it (after the row rules), as
    the sweep's coding counts datasets (`batchfit.data.coding`). ``labels``: per text column, each label
    with the first group (by id) and row it appears in, for the coding's levels. ``renamed``: id ->
    why it is not the key values as they are. ``missing_key``: the rows without a value in a key
    column (their dataset fails, naming them).
    """

    source: TableSource
    stamp: list[Any]
    settings: str
    columns: tuple[str, ...]
    ids: dict[str, tuple[Any, ...]]
    digests: dict[str, str]
    kinds: dict[str, dict[str, int]] = field(default_factory=dict)
    labels: dict[str, list[list[Any]]] = field(default_factory=dict)
    renamed: dict[str, str] = field(default_factory=dict)
    missing_key: list[int] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"format": _SCAN_FORMAT, "table": str(self.source.table), "by": list(self.source.by),
                "stamp": self.stamp, "settings": self.settings, "columns": list(self.columns),
                "ids": {d: list(k) for d, k in self.ids.items()}, "digests": self.digests, "kinds": self.kinds,
                "labels": self.labels, "renamed": self.renamed, "missing_key": self.missing_key}

    @classmethod
    def from_json(cls, data: Mapping[str, Any], source: TableSource) -> TableScan:
        if data.get("format") != _SCAN_FORMAT:
            raise ValueError(f"a table scan of format {data.get('format')!r}, not {_SCAN_FORMAT}")
        return cls(source, data["stamp"], data["settings"], tuple(data["columns"]),
                   {d: tuple(k) for d, k in data["ids"].items()}, dict(data["digests"]), dict(data["kinds"]),
                   dict(data["labels"]), dict(data["renamed"]), list(data["missing_key"]))

    @classmethod
    def read(cls, path: Path, source: TableSource) -> TableScan | None:
        """The scan cached at ``path``; None when there is none or it cannot be read (it is made again)."""
        try:
            return cls.from_json(json.loads(path.read_text()), source)
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def write(self, path: Path) -> None:
        from batchfit.common.atomic import atomic_path

        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            tmp.write_text(json.dumps(self.to_json()))


def scan_settings(source: TableSource, rules: RowRules, as_text: Collection[str], listed: Collection[str]) -> str:
    """Digest of what a scan depends on besides the table: its keys, the row rules, the text and listed columns."""
    text = json.dumps([str(source.table), list(source.by), rules.where, list(rules.drop_missing), sorted(as_text),
                       sorted(listed)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def scan_table(source: TableSource, *, rules: RowRules, as_text: Collection[str] = (), listed: Collection[str] = (),
               config_source: str = "", key: str = "datasets") -> TableScan:
    """Read a table whole and scan it: ids, digests, column kinds and labels (see `TableScan`).

    ``listed``: the columns the config lists (a listed key column is a data column too). A missing
    key column, an unreadable or empty table is a `ConfigError` naming ``key`` (the source's place in
    the config): it concerns every dataset of the table, and the sweep's other sources wait for it.
    """
    path = Path(source.table)
    stamp = table_stamp(path)
    try:
        frame = read_table(path, as_text=as_text)
    except (OSError, ValueError, ImportError) as exc:
        raise ConfigError(f"cannot read the table {path}: {one_line(exc)}", key=key, source=config_source) from None
    except Exception as exc:  # noqa: BLE001 - the readers' many error types all mean "not a readable table"
        raise ConfigError(f"cannot read the table {path} as {table_format(path)}: {type(exc).__name__}: "
                          f"{one_line(exc)}", key=key, source=config_source) from None
    missing = [name for name in source.by if name not in frame.columns]
    if missing:
        raise ConfigError(f"the table {path} has no key column {', '.join(map(repr, missing))}; its columns: "
                          f"{', '.join(map(str, frame.columns))}", key=f"{key}.by", source=config_source)
    if frame.empty:
        raise ConfigError(f"the table {path} has no rows", key=key, source=config_source)
    groups = split_keys(frame, source.by)
    digests = group_digests(frame, groups.codes, len(groups.keys))
    texts = [key_text(values) for values in groups.keys]
    ids = unique_ids(texts, [repr(tuple(_plain(v) for v in values)) for values in groups.keys])
    renamed = {i: _why_renamed(texts[i], source.by) for i in range(len(ids)) if ids[i] != texts[i]}
    columns = tuple(str(c) for c in frame.columns if c not in source.by or c in listed)
    kinds, labels = _column_kinds(frame, columns, rules, groups, ids, as_text)
    keys = {ids[i]: tuple(_plain(v) for v in groups.keys[i]) for i in range(len(ids))}
    found = {ids[i]: digests[i] for i in range(len(ids))}
    if len(groups.missing):  # rows of no dataset: a dataset of their own, which fails naming them
        without = missing_key_id(path, source.by)
        keys[without], found[without] = MISSING_KEY, rows_digest(frame.iloc[groups.missing])
    return TableScan(source, stamp, scan_settings(source, rules, as_text, listed), columns, keys, found, kinds,
                     labels, {ids[i]: why for i, why in renamed.items()}, groups.missing.tolist())


@dataclass(frozen=True)
class Groups:
    """The groups of a table's rows: each row's group (-1: a row with a missing key), each group's key values."""

    codes: np.ndarray
    keys: list[tuple[Any, ...]]
    missing: np.ndarray  # positions of the rows without a key

    def rows(self) -> list[np.ndarray]:
        """Each group's row positions, in their order."""
        order = np.argsort(self.codes, kind="stable")
        bounds = np.searchsorted(self.codes[order], np.arange(len(self.keys) + 1), side="left")
        return [order[start:end] for start, end in zip(bounds[:-1], bounds[1:], strict=True)]


def split_keys(frame: pd.DataFrame, by: Iterable[str]) -> Groups:
    """Each row's group by the values of the ``by`` columns (missing in any: no group), groups in order of
    first appearance."""
    import pandas as pd

    by = list(by)
    missing = np.zeros(len(frame), dtype=bool)
    for name in by:
        column = frame[name]
        missing |= column.isna().to_numpy()
        if not pd.api.types.is_numeric_dtype(column.dtype):
            missing |= (column.astype(str).str.strip() == "").to_numpy() & column.notna().to_numpy()
    codes = np.full(len(frame), -1, dtype=np.int64)
    present = frame.loc[~missing, by]
    if len(by) == 1:
        found, uniques = pd.factorize(present[by[0]], sort=False)
        keys = [(value,) for value in uniques]
    else:
        index = pd.MultiIndex.from_frame(present)
        found, uniques = pd.factorize(index, sort=False)
        keys = [tuple(value) for value in uniques]
    codes[~missing] = found
    return Groups(codes, keys, np.flatnonzero(missing))


def group_digests(frame: pd.DataFrame, codes: np.ndarray, n_groups: int) -> list[str]:
    """Each group's digest: sha256 of its rows' 128-bit hashes in row order (see the module docstring)."""
    import pandas as pd

    names = sorted(str(c) for c in frame.columns)
    normal = pd.DataFrame({name: _normalised(frame[name]) for name in names})
    hashes = np.stack([pd.util.hash_pandas_object(normal, index=False, hash_key=k).to_numpy() for k in _HASH_KEYS],
                      axis=1)
    header = json.dumps(names).encode()
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(n_groups + 1), side="left")
    rows = hashes[order]
    return [hashlib.sha256(header + rows[start:end].tobytes()).hexdigest()
            for start, end in zip(bounds[:-1], bounds[1:], strict=True)]


def rows_digest(frame: pd.DataFrame) -> str:
    """The digest `group_digests` gives a group made of these rows (all of them, in order)."""
    return group_digests(frame, np.zeros(len(frame), dtype=np.int64), 1)[0]


def _normalised(column: pd.Series) -> pd.Series:
    """A column as hashed: numbers (bool, integers, floats) as float64, anything else as text."""
    import pandas as pd

    if pd.api.types.is_numeric_dtype(column.dtype) and not pd.api.types.is_complex_dtype(column.dtype):
        return pd.Series(column.to_numpy(dtype=np.float64, na_value=np.nan), index=column.index)
    text = column.astype(object)
    return text.where(text.notna(), _MISSING).map(str).astype(object)


def _column_kinds(frame: pd.DataFrame, columns: Iterable[str], rules: RowRules, groups: Groups, ids: list[str],
                  as_text: Collection[str]) -> tuple[dict[str, dict[str, int]], dict[str, list[list[Any]]]]:
    """Per data column the number of groups that vote it numbers, text or nothing once the row rules dropped
    their rows (as `batchfit.data.readers.column_vote` counts a file), and per text column its labels with the
    first (group id, row) they appear at."""
    import pandas as pd

    positions = pd.Series(np.arange(len(frame)), index=frame.index)
    try:
        kept, _ = apply_where_and_missing(frame.assign(**{_POSITION: positions}), rules)
    except DatasetError:  # a rule naming a column the table lacks: every group fails to load, saying so
        kept = frame.assign(**{_POSITION: positions})
    codes = groups.codes[kept[_POSITION].to_numpy()]
    valid = codes >= 0
    kept, codes = kept[valid], codes[valid]
    n = len(groups.keys)
    kinds: dict[str, dict[str, int]] = {}
    labels: dict[str, list[list[Any]]] = {}
    id_rank = np.argsort(np.argsort(np.asarray(ids, dtype=object)))  # each group's rank by id
    for name in columns:
        column = kept[name]
        present = column.notna().to_numpy()
        has_value = np.bincount(codes[present], minlength=n) > 0
        if pd.api.types.is_numeric_dtype(column.dtype) and name not in as_text:
            number = has_value
        else:
            parses = present & pd.to_numeric(column.astype(object), errors="coerce").notna().to_numpy()
            counts = np.bincount(codes[present], minlength=n)
            number = has_value & (2 * np.bincount(codes[parses], minlength=n) > counts)
            if name in as_text:
                number = np.zeros(n, dtype=bool)
            rows = present & has_value[codes]
            if rows.any():
                labels[str(name)] = _first_appearances(column[rows].astype(str).to_numpy(dtype=object),
                                                       codes[rows], id_rank, ids)
        kinds[str(name)] = {"number": int(number.sum()), "text": int((has_value & ~number).sum()),
                            "empty": int((~has_value).sum())}
    return kinds, labels


def _first_appearances(values: np.ndarray, codes: np.ndarray, id_rank: np.ndarray,
                       ids: list[str]) -> list[list[Any]]:
    """Each distinct value with the group (by id) and the row within it where it first appears, walking the
    groups in id order."""
    within = _position_in_group(codes)
    order = np.lexsort((within, id_rank[codes]))
    seen: dict[str, None] = {}
    found = []
    for i in order:
        value = values[i]
        if value not in seen:
            seen[value] = None
            found.append([value, ids[codes[i]], int(within[i])])
    return found


def _position_in_group(codes: np.ndarray) -> np.ndarray:
    """Each row's position among its group's rows."""
    order = np.argsort(codes, kind="stable")
    sorted_codes = codes[order]
    starts = np.searchsorted(sorted_codes, sorted_codes, side="left")
    position = np.empty(len(codes), dtype=np.int64)
    position[order] = np.arange(len(codes)) - starts
    return position


def _why_renamed(text: str, by: Iterable[str]) -> str:
    why = (f"cannot name output files as it is ({SAFE_ID_RULE})" if not is_safe_id(text)
           else "is also what other key values give")
    return f"key value(s) {'/'.join(by)} {text!r} {why}"


def _plain(value: Any) -> Any:
    """A key value as JSON keeps it: NumPy scalars as Python's."""
    return value.item() if isinstance(value, np.generic) else value


def read_groups(source: TableSource, wanted: Mapping[str, tuple[Any, ...]], *,
                as_text: Collection[str] = ()) -> tuple[pd.DataFrame, dict[str, np.ndarray]]:
    """The rows of the ``wanted`` groups (id -> key values; `MISSING_KEY`: the rows without a key) of a table,
    and each group's row positions in them, in their order.

    Reads only what the keys select (`read_table`); a group the table no longer has gets no entry.
    """
    real = {d: k for d, k in wanted.items() if k != MISSING_KEY}
    keys = None if len(real) < len(wanted) else {name: {k[i] for k in real.values()} for i, name in
                                                 enumerate(source.by)}
    frame = read_table(Path(source.table), keys=keys, as_text=as_text)
    by_key = {tuple(_plain(v) for v in k): d for d, k in real.items()}
    groups = split_keys(frame, source.by)
    positions = {}
    for key, rows in zip(groups.keys, groups.rows(), strict=True):
        dataset_id = by_key.get(tuple(_plain(v) for v in key))
        if dataset_id is not None:
            positions[dataset_id] = rows
    positions.update({d: groups.missing for d, k in wanted.items() if k == MISSING_KEY and len(groups.missing)})
    return frame, positions


def stage_rows(source: TableSource, wanted: Mapping[str, tuple[Any, ...]], target: Path, location: Path, *,
               as_text: Collection[str] = ()) -> Path:
    """Write the rows of the ``wanted`` groups of a table (read from ``location``) as ``target``.parquet: a table
    whose groups read back as the table's do, typed as the whole table was (Parquet keeps the types a CSV
    table's columns got from all its rows). For a job that sees only its own inputs."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    frame, positions = read_groups(TableSource(location, source.by), wanted, as_text=as_text)
    rows = np.sort(np.concatenate([*positions.values(), np.zeros(0, dtype=np.int64)]))
    path = target.with_suffix(".parquet")
    pq.write_table(pa.Table.from_pandas(frame.iloc[rows], preserve_index=False), path)
    return path


def scan_path(directory: Path, source: TableSource) -> Path:
    """Where the scan of ``source`` is cached, under ``directory``: named by the table's path and keys."""
    name = hashlib.sha256(json.dumps([os.path.abspath(source.table), list(source.by)]).encode()).hexdigest()[:16]
    return directory / f"{Path(source.table).name}-{name}.json"
