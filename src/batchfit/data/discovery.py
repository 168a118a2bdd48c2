"""Finding a sweep's datasets: the files its patterns match and the groups of its tables, each with its id.

A file is one dataset, its id the file name without the suffix; a table split by key columns is a
dataset per value of the keys, its id the key values (`batchfit.data.ids`). Tables are scanned
once and the scan is kept beside the sweep's results while the table is unchanged
(`batchfit.data.tables.TableScan`), so planning a sweep of many groups reads no table twice.
"""

from __future__ import annotations

import glob
import os
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from batchfit.data.ids import SAFE_ID_RULE, is_safe_id, unique_ids
from batchfit.errors import ConfigError, DatasetError
from batchfit.settings import NO_RULES, DataSources, RowRules, TableSource

# The config keys listing dataset sources (`discover_datasets`): the sweep's datasets, and the new inputs
# of its predictions.
DATASETS, PREDICT_DATA = "datasets", "predict.data"

_TABULAR = {".csv": "CSV", ".parquet": "Parquet", ".pq": "Parquet"}


_NETCDF = {".nc", ".nc4", ".netcdf"}


SUPPORTED_SUFFIXES = (*_TABULAR, *sorted(_NETCDF))


# A table modified less than this long before its scan is not cached: timestamps are coarse, so a
# rewrite of the same size right after the scan could keep the size and modification time it recorded.
_RACY_SECONDS = 2.0


class DatasetIndex(Mapping[str, Path]):
    """Dataset id -> the file its rows are in (its own file, or the table it is a group of), in id order.

    `group` says which group of which table (as the config names it) a dataset is, `location` where that
    table is read from (a copy staged for a job without a shared filesystem: ``located``). Paths are
    kept as text, a Path made on each access: a parsed Path caches its parts, which held for every
    dataset were most of collect's memory growth with the number of datasets.
    """

    __slots__ = ("_files", "_sources", "_groups", "_tables", "_located", "_members")

    def __init__(self, files: Iterable[tuple[str, str | Path]] = (), sources: Mapping[str, str] | None = None,
                 groups: Mapping[str, tuple[TableSource, tuple[Any, ...]]] | None = None,
                 located: Mapping[TableSource, Path] | None = None):
        self._files = {dataset_id: str(path) for dataset_id, path in files}
        self._sources = dict(sources or {})
        self._located = dict(located or {})
        self._tables: dict[TableSource, int] = {}
        self._groups: dict[str, tuple[int, tuple[Any, ...]]] = {}
        self._members: dict[TableSource, dict[str, tuple[Any, ...]]] = {}
        for dataset_id, (table, key) in (groups or {}).items():
            self._groups[dataset_id] = (self._tables.setdefault(table, len(self._tables)), key)
            self._members.setdefault(table, {})[dataset_id] = key

    def source(self, dataset_id: str) -> Path:
        """The dataset's file as the sweep knows it: for a copy staged for a job without a shared
        filesystem (`batchfit.fitting.job_inputs`), the file or table it was copied from."""
        return Path(self._sources.get(dataset_id, self._files[dataset_id]))

    def group(self, dataset_id: str) -> tuple[TableSource, tuple[Any, ...]] | None:
        """The table and key values of a table's group; None for a dataset that is a file of its own."""
        found = self._groups.get(dataset_id)
        if found is None:
            return None
        return self.tables[found[0]], found[1]

    def location(self, table: TableSource) -> Path:
        """Where ``table`` is read from: the table itself, or the copy of its rows staged for a job."""
        return Path(self._located.get(table, table.table))

    @property
    def tables(self) -> list[TableSource]:
        """The tables some dataset is a group of."""
        return list(self._tables)

    def members(self, table: TableSource) -> dict[str, tuple[Any, ...]]:
        """The datasets that are groups of ``table``: id -> key values."""
        return self._members.get(table, {})

    def __getitem__(self, dataset_id: str) -> Path:
        return Path(self._files[dataset_id])

    def __contains__(self, dataset_id: object) -> bool:
        return dataset_id in self._files

    def __iter__(self) -> Iterator[str]:
        return iter(self._files)

    def __len__(self) -> int:
        return len(self._files)

    def __repr__(self) -> str:
        return f"DatasetIndex({self._files!r})"


def source_of(paths: Mapping[str, Path], dataset_id: str) -> Path | None:
    """A dataset's file as the sweep knows it: not the copy staged for a job without a shared filesystem."""
    if dataset_id not in paths:
        return None
    return paths.source(dataset_id) if isinstance(paths, DatasetIndex) else paths[dataset_id]


def discover_datasets(sources: DataSources, *, renamed: dict[str, str] | None = None,
                      key: str = DATASETS) -> DatasetIndex:
    """The sweep's datasets (of a config's ``data_sources``), sorted by id: the files the patterns match (relative to
    the current directory) and the groups of its tables. ``key``: the config key listing the sources (`DATASETS` or
    `PREDICT_DATA`).

    No file stops a sweep: a file's id is its name without the suffix, and a name that cannot be
    an id as it is (characters an output file name or a Snakemake wildcard cannot take, or an id
    other files have too) gets a safe id (`batchfit.data.ids`), which the sweep's outputs record with
    the file's path; given a `renamed` dict, each such id is recorded there with the file and why,
    and so are the ids of groups whose key values are no safe id. A file batchfit cannot read (an
    unsupported suffix) is a dataset too, which fails when loaded. The same id from two sources (a
    table's group and a file, two tables) is a `ConfigError` naming both.
    """
    files: list[str] = []
    seen: set[Path] = set()
    for number, entry in enumerate(_sources(sources, key)[0]):
        if isinstance(entry, TableSource):
            continue
        for name in _expand(entry, sources, f"{key}[{number}]"):
            resolved = Path(name).resolve()
            if resolved not in seen:
                seen.add(resolved)
                files.append(name)
    ids = dataset_ids(files)
    found: dict[str, str] = {}
    origin: dict[str, str] = {}
    for name, dataset_id in ids.items():
        found[dataset_id] = name
        origin[dataset_id] = f"file {name}"
        stem = Path(name).stem
        if renamed is not None and dataset_id != stem:
            renamed[dataset_id] = f"the id of file {name}, whose name {_why_renamed(stem, files)}"
    groups: dict[str, tuple[TableSource, tuple[Any, ...]]] = {}
    for scan in table_scans(sources, key=key):
        where = f"table {scan.source.table} (by {', '.join(scan.source.by)})"
        for dataset_id, key in scan.ids.items():
            if dataset_id in origin:
                raise ConfigError(f"dataset id '{dataset_id}' comes from two sources: {origin[dataset_id]} and "
                                  f"{where}; ids must be unique across the sweep's sources (rename the file, or "
                                  "list the sources in two sweeps)", key=key, source=sources.source)
            origin[dataset_id] = where
            found[dataset_id] = str(scan.source.table)
            groups[dataset_id] = (scan.source, key)
        if renamed is not None:
            renamed.update({d: f"the id of the rows of {where} whose {why}" for d, why in scan.renamed.items()})
    return DatasetIndex(sorted(found.items()), groups=groups)


def dataset_ids(files: Iterable[str]) -> dict[str, str]:
    """Each file's dataset id (file -> id): its name without the suffix where that is a safe id no other
    file has, else a safe id made from it with a digest of the file's path where needed (`unique_ids`).

    Depends only on the set of files: the same files always get the same ids, and no two the same.
    """
    files = list(dict.fromkeys(str(f) for f in files))
    return dict(zip(files, unique_ids([Path(name).stem for name in files], files), strict=True))


def _why_renamed(stem: str, files: Sequence[str]) -> str:
    if not is_safe_id(stem):
        return (f"{stem!r} cannot name output files as it is ({SAFE_ID_RULE}); rename the file to keep an id "
                "of your own")
    others = [f for f in files if Path(f).stem == stem]
    return f"{stem!r} is also the name of {', '.join(others)}; rename them to keep ids of your own"


def _expand(pattern: str, sources: DataSources, key: str) -> list[str]:
    """Files matched by one pattern (a glob or a plain path); an error if there are none."""
    if glob.has_magic(pattern):
        files = [name for name in sorted(glob.glob(pattern, recursive=True)) if os.path.isfile(name)]
    else:
        files = [pattern] if os.path.isfile(pattern) else []
    if files:
        return files
    if Path(pattern).is_dir():
        problem = ("is a directory; use a glob such as 'dir/*.csv', or {table: dir, by: KEY} for a directory of "
                   "Parquet files split by key columns")
    else:
        problem = (
            f"matches no file (relative patterns are resolved against the current directory {Path.cwd()})"
        )
    raise ConfigError(f"dataset pattern {pattern!r} {problem}", key=key, source=sources.source)


def _sources(sources: DataSources, key: str) -> tuple[Sequence[str | TableSource], RowRules, Path]:
    """The sources listed under ``key``, the row rules their tables are scanned with, and where the scans are
    cached: predict.data's new inputs are read without the row rules (which choose rows to fit), and their
    scans are kept apart, so that a table serving both keeps both scans."""
    if key == PREDICT_DATA:
        return sources.predict_data, NO_RULES, sources.results.table_scans / "predict"
    return sources.datasets, sources.settings.rows, sources.results.table_scans


# Scans this process made or read, by where they are cached: a plan asks for them several times.
_scans: dict[Path, Any] = {}
# Scans made for sweeps whose results directory did not exist yet: `write_planned_scans` writes them.
_planned: dict[Path, Any] = {}


def table_scans(sources: DataSources, *, key: str = DATASETS) -> list[Any]:
    """The scan of each of the sweep's tables (`batchfit.data.tables.TableScan`; of those of ``key``, as
    `discover_datasets`), from the cache beside its results while the table, its keys and the row and
    column settings are unchanged, else made anew."""
    from batchfit.data import tables  # pandas: only for a sweep with tables

    columns = sources.settings.columns
    listed = set(columns)
    as_text = {name for name, column in columns.items() if column.label}
    entries, rules, directory = _sources(sources, key)
    found = []
    for number, entry in enumerate(entries):
        if not isinstance(entry, TableSource):
            continue
        where = f"{key}[{number}]"
        path = Path(entry.table)
        if not path.exists():
            raise ConfigError(f"table {str(path)!r} does not exist (relative paths are resolved against the current "
                              f"directory {Path.cwd()})", key=f"{where}.table", source=sources.source)
        try:
            tables.table_format(path)
        except ValueError as exc:
            raise ConfigError(str(exc), key=f"{where}.table", source=sources.source) from None
        stamp = tables.table_stamp(path)
        settings = tables.scan_settings(entry, rules, as_text, listed)
        cached_at = tables.scan_path(directory, entry)
        scan = _scans.get(cached_at) or _planned.get(cached_at) or tables.TableScan.read(cached_at, entry)
        if scan is None or scan.stamp != stamp or scan.settings != settings:
            scan = tables.scan_table(entry, rules=rules, as_text=as_text, listed=listed,
                                     config_source=sources.source, key=where)
            if time.time_ns() - _newest_ns(stamp) > _RACY_SECONDS * 1e9:
                if sources.results.root.is_dir():
                    scan.write(cached_at)
                else:
                    _planned[cached_at] = scan
        _scans[cached_at] = scan
        found.append(scan)
    return found


def write_planned_scans() -> None:
    """Write the scans this process made for sweeps whose results directory did not exist yet (a new
    sweep's plan), once the run has made it: the jobs then read them instead of scanning again."""
    for path, scan in list(_planned.items()):
        if path.parents[1].is_dir():
            scan.write(path)
            del _planned[path]


def _newest_ns(stamp: Any) -> int:
    """The newest modification time a table's stamp records."""
    if stamp and isinstance(stamp[0], list):
        return max((entry[2] for entry in stamp), default=0)
    return int(stamp[1])


def check_suffix(dataset_id: str, path: Path) -> None:
    """Reject files batchfit cannot read, naming the supported suffixes."""
    if path.suffix.lower() not in SUPPORTED_SUFFIXES:
        raise DatasetError(
            f"unsupported file type {path.suffix or '(no suffix)'!r}; "
            f"use one of {', '.join(SUPPORTED_SUFFIXES)}",
            dataset=dataset_id,
            path=path,
        )


def file_kind(path: Path) -> str:
    """"CSV", "Parquet" or "NetCDF", by the suffix of a file `check_suffix` accepts."""
    suffix = Path(path).suffix.lower()
    return "NetCDF" if suffix in _NETCDF else _TABULAR[suffix]


def table_kind(path: Path) -> str | None:
    """"CSV" or "Parquet" for a table file, None for NetCDF (which carries its own coordinates)."""
    return _TABULAR.get(Path(path).suffix.lower())
