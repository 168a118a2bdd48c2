"""One coding of text (label) columns for the whole sweep: a label has the same code in every dataset.

A model indexes per-level parameters with a text column's integer codes, so a code must mean
the same label in every dataset: coded per dataset, a school whose `sex` column holds only "M"
would give "M" the code that "F" has everywhere else. `sweep_coding` therefore derives one
label -> code mapping per column from all datasets (or takes it from the config's `columns`)
and every job (compile, fit, ``batchfit check``) loads datasets with it.

The levels taken from the data live in an append-only registry, ``{results_dir}/coding.json``:
a level keeps its code for as long as the registry exists, and a new dataset's new labels are
appended after the existing ones, so adding a dataset can never shift another's codes. Only
files that are new or changed since they were last scanned (size, modification time) are read,
so a sweep of thousands of datasets pays a `stat` per file per job. The registry is updated
under a file lock and its result depends only on the files and the config, never on which job
got there first.

A column is a label column when the config lists it under `columns`, or when it holds text in
every dataset that has values in it: a column with numbers in any dataset is numeric for the
whole sweep, so a stray word in one file (`many` in a `count` column) is reported as a
non-numeric value instead of turning the column into codes.
"""

from __future__ import annotations

import contextlib
import difflib
import hashlib
import json
import logging
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from batchfit.common.atomic import atomic_path
from batchfit.data.discovery import DatasetIndex, discover_datasets, table_kind, table_scans
from batchfit.data.labels import Coding, ColumnCoding
from batchfit.errors import BatchfitError, ConfigError, DatasetError
from batchfit.settings import ColumnSettings, DataSettings, DataSources, RowRules, TableSource, plain

log = logging.getLogger("batchfit")




_FORMAT = 2  # 1: before tables (no "tables" section), read as one without tables


_DEFAULT = ColumnSettings()


def sweep_coding(sources: DataSources, paths: Mapping[str, Path] | None = None, *, record: bool = True) -> Coding:
    """The coding of every text column for the sweep of a config's `sources` (datasets `paths`, id -> file).

    Scans new or changed files, appends their new labels to the registry (written atomically
    under a lock) and returns the coding every job of the sweep agrees on. Before the sweep's
    results directory exists (a sweep being planned, or a dry run of it), or with ``record`` false
    (`batchfit status`, which only reads), nothing is written: the coding is then computed from
    the registry and the data, as the next job will compute and record it (or `write_planned`,
    when the run starts).
    """


    paths = discover_datasets(sources) if paths is None else paths
    path = sources.results.coding_registry
    if not record or not path.parent.is_dir():
        registry = _read_registry(path)
        _update(registry, sources, paths)
        if record:
            _planned[path] = registry
        return _coding(registry, sources, paths)
    with _locked(sources, path):
        registry = _read_registry(path)
        if _update(registry, sources, paths):
            _write_registry(path, registry)
    return _coding(registry, sources, paths)


def recorded_coding(sources: DataSources, registry: Path, paths: Mapping[str, Path]) -> Coding:
    """The coding of the sweep of datasets ``paths`` from a copy of its registry, reading no data file.

    For a job that was given only its own batch's files (no shared filesystem,
    `batchfit.fitting.job_inputs`): the registry its sweep recorded already holds every dataset, and
    the coding depends on all of them (a column with numbers anywhere is numeric everywhere).
    """
    recorded = _read_registry(registry)
    missing = [d for d in _files(paths) if d not in recorded["datasets"]]
    if missing:
        raise BatchfitError(f"the staged label registry {registry} lacks {len(missing)} of the sweep's datasets "
                            f"(e.g. '{missing[0]}'): stage the job's inputs again")
    return _coding(recorded, sources, paths)


# Registries computed for sweeps whose results directory did not exist yet, by path: what
# `write_planned` writes once a run has made the directory.
_planned: dict[Path, dict[str, Any]] = {}


def write_planned(sources: DataSources) -> None:
    """Write the registry this process computed for `sources` while its results directory did not exist.

    A new sweep's plan (Snakemake's main process, before the run makes the directory) scans
    every data file; written at the run's start (`batchfit.sweep.plan.write_plan`), it spares the
    first fit job the same scan, which the other jobs waited for behind the registry's lock.
    Not over a registry some process wrote meanwhile (the jobs update that one as always).
    """
    path = sources.results.coding_registry
    registry = _planned.pop(path, None)
    if registry is None or not path.parent.is_dir():
        return
    with _locked(sources, path):
        if not path.exists():
            _write_registry(path, registry)


@contextlib.contextmanager
def _locked(sources: DataSources, path: Path) -> Iterator[None]:
    """Hold the registry's file lock, or say which lock a stuck job holds."""
    from filelock import FileLock, Timeout

    lock = FileLock(path.with_name(f".{path.name}.lock"), timeout=sources.lock_timeout)
    try:
        lock.acquire()
    except Timeout:
        raise BatchfitError(f"another process held the lock {lock.lock_file} for more than "
                            f"{sources.lock_timeout} s (cache.lock_timeout); is a job stuck?") from None
    try:
        yield
    finally:
        lock.release()


def _write_registry(path: Path, registry: dict[str, Any]) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(registry, indent=1, sort_keys=True))


def _read_registry(path: Path) -> dict[str, Any]:
    """The registry, or an empty one when there is none or it is damaged (with a warning)."""
    empty: dict[str, Any] = {"format": _FORMAT, "levels": {}, "datasets": {}, "tables": {}}
    try:
        registry = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return empty
    except (OSError, ValueError) as exc:
        log.warning("ignoring the damaged label registry %s (%s): label levels are recomputed from the "
                    "data, so codes may differ from those of existing fits", path, exc)
        return empty
    if isinstance(registry, dict) and registry.get("format") == 1:
        registry = {**registry, "format": _FORMAT, "tables": {}}
    if (not isinstance(registry, dict) or registry.get("format") != _FORMAT
            or not isinstance(registry.get("levels"), dict) or not isinstance(registry.get("datasets"), dict)
            or not isinstance(registry.get("tables"), dict)):
        log.warning("ignoring the label registry %s of an unknown format: label levels are recomputed from the "
                    "data, so codes may differ from those of existing fits", path)
        return empty
    return registry


def _settings(settings: DataSettings) -> str:
    """Digest of the `columns` and `rows` config: a change makes every file be scanned again."""
    text = json.dumps([plain(dict(settings.columns)), plain(settings.rows)], sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _files(paths: Mapping[str, Path]) -> dict[str, Path]:
    """The datasets of ``paths`` that are files of their own (not groups of a table)."""
    if isinstance(paths, DatasetIndex):
        return {d: paths[d] for d in paths if paths.group(d) is None}
    return dict(paths)


def _table_key(table: TableSource) -> str:
    return f"{table.table}|{','.join(table.by)}"


def _update(registry: dict[str, Any], sources: DataSources, paths: Mapping[str, Path]) -> bool:
    """Scan new and changed files, take in the tables' scans, append new levels of label columns; True if the
    registry changed."""
    settings = _settings(sources.settings)
    scanned: dict[str, Any] = registry["datasets"]
    files = _files(paths)
    changed = False
    for gone in set(scanned) - set(files):
        del scanned[gone]
        changed = True
    as_text = frozenset(name for name, column in sources.settings.columns.items() if column.label)
    for dataset_id, file in files.items():
        try:
            stat = Path(file).stat()
        except OSError:  # gone since it was found: loading it reports the problem
            stat = None
        stamp = [stat.st_size, stat.st_mtime_ns, settings] if stat else None
        entry = scanned.get(dataset_id)
        if entry is not None and entry["file"] == str(file) and entry["stamp"] == stamp and stamp:
            continue
        kind = table_kind(file) if stat else None
        columns = _scan(dataset_id, Path(file), kind, as_text, sources.settings.rows) if kind else {}
        scanned[dataset_id] = {"file": str(file), "stamp": stamp,
                               "columns": {name: k for name, (k, _) in columns.items()},
                               "labels": {name: values for name, (_, values) in columns.items()
                                          if values and _levels_from_data(sources, name)}}
        changed = True
    tables = {_table_key(scan.source): {"columns": list(scan.columns), "kinds": scan.kinds,
                                        "labels": {name: values for name, values in scan.labels.items()
                                                   if _levels_from_data(sources, name)}}
              for scan in table_scans(sources)}
    if registry["tables"] != tables:
        registry["tables"] = tables
        changed = True
    for name, column in _label_columns(registry, sources, files).items():
        if _levels_from_data(sources, name):
            changed = _append_levels(registry, name, column, files, sources) or changed
    return changed


def _levels_from_data(sources: DataSources, name: str) -> bool:
    """Whether column `name` takes its sweep-wide levels from the data (not listed, not per dataset, no bounds)."""
    column = sources.settings.columns.get(name, _DEFAULT)
    return column.label and column.levels is None and column.scope == "sweep"


def _scan(dataset_id: str, path: Path, kind: str, as_text: frozenset[str],
          rules: RowRules) -> dict[str, tuple[str, list[str]]]:
    """Column kinds and text labels of one file; an unreadable file has none (loading it reports why)."""
    from batchfit.data.readers import scan_table  # pandas, only when a file is scanned: not to plan a known sweep

    try:
        return scan_table(dataset_id, path, kind, as_text, rules)
    except DatasetError:
        return {}


def _label_columns(registry: Mapping[str, Any], sources: DataSources,
                   files: Mapping[str, Path]) -> dict[str, ColumnSettings]:
    """The sweep's label columns with their settings: listed in the config as labels, or text in at least as many
    of the datasets that have values in it as numbers (numbers can be labels; text cannot be numbers).

    By majority, so that one odd dataset cannot change what a column is for the whole sweep: a
    dataset holding numbers in a label column fails alone, naming the setting that reads them as
    labels (`batchfit.data.readers`), and text in a numeric column is reported as a bad value.
    """
    counts: dict[str, Counter[str]] = {}
    for dataset_id in files:
        for name, kind in registry["datasets"][dataset_id]["columns"].items():
            counts.setdefault(name, Counter())[kind] += 1
    for table in registry["tables"].values():
        for name, kinds in table["kinds"].items():
            counts.setdefault(name, Counter()).update(kinds)
    _check_listed_columns_exist(sources, counts)
    columns = sources.settings.columns
    return {name: columns.get(name, _DEFAULT) for name, seen in sorted(counts.items())
            if (name in columns and columns[name].label)
            or (name not in columns and seen["text"] and seen["text"] >= seen["number"])}


def _append_levels(registry: dict[str, Any], name: str, settings: ColumnSettings, files: Mapping[str, Path],
                   sources: DataSources) -> bool:
    """Append the labels of column `name` not yet known (in order of appearance: datasets by id, rows in order,
    a table's labels at the group and row they first appear at); never reorder."""
    levels = registry["levels"]
    known = levels.get(name)
    if known is not None and known["order"] != settings.order:
        log.warning("column '%s': order changed from %s to %s; its levels are recomputed, so its codes "
                    "change (fits are redone)", name, known["order"], settings.order)
        known = None
    existing = known["levels"] if known else []
    present = set(existing)
    # A label with a NUL character cannot be stored in any fit's NetCDF: it is never a level, and only
    # the dataset holding it fails (loading it says why), not every dataset of the sweep.
    found = [(label, dataset_id, row) for dataset_id in files
             for row, label in enumerate(registry["datasets"][dataset_id]["labels"].get(name, ()))]
    found += [tuple(entry) for table in registry["tables"].values() for entry in table["labels"].get(name, ())]
    fresh = dict.fromkeys(label for label, _, _ in sorted(found, key=lambda entry: (entry[1], entry[2]))
                          if label not in present and "\x00" not in label)
    if not fresh and known is not None:
        return False
    new = sorted(fresh) if settings.order == "sorted" else list(fresh)
    if settings.order == "sorted" and existing and new and new[0] < existing[-1]:
        log.warning("column '%s': new level(s) %s are appended after the existing %d so that no existing "
                    "code changes; the levels are no longer sorted (list them under 'columns: {%s: {levels: "
                    "[...]}}' in %s to fix the order)", name, ", ".join(map(repr, new[:5])), len(existing), name,
                    sources.source)
    levels[name] = {"order": settings.order, "levels": existing + new}
    return True


def _coding(registry: Mapping[str, Any], sources: DataSources, paths: Mapping[str, Path]) -> Coding:
    """The label columns and their codings from a current registry; each dataset's columns (a table's group: the
    table's)."""
    files = _files(paths)
    labels = {}
    for name, settings in _label_columns(registry, sources, files).items():
        if settings.levels is not None:
            levels: tuple[str, ...] | None = settings.levels
        elif settings.scope == "dataset":
            levels = None
        else:
            levels = tuple(registry["levels"][name]["levels"])
        listed = name in sources.settings.columns
        labels[name] = ColumnCoding(levels, settings.order, as_text=listed and settings.label)
    columns_of = {d: tuple(registry["datasets"][d]["columns"]) for d in files}
    if isinstance(paths, DatasetIndex):
        table_columns = {table: tuple(registry["tables"].get(_table_key(table), {}).get("columns", ()))
                         for table in paths.tables}
        for dataset_id in paths:
            group = paths.group(dataset_id)
            if group is not None:
                columns_of[dataset_id] = table_columns[group[0]]
    return Coding(labels, columns_of)


def _check_listed_columns_exist(sources: DataSources, kinds: Mapping[str, Iterable[str]]) -> None:
    """A `columns` entry naming no column of any table is a typo: say so, with a did-you-mean."""
    for name in sources.settings.columns:
        if name in kinds:
            continue
        close = difflib.get_close_matches(name, list(kinds), n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ConfigError(f"no dataset (CSV or Parquet) has a column {name!r}{hint}",
                          key=f"columns.{name}", source=sources.source)
