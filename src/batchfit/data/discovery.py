"""Finding a sweep's datasets: the files its `datasets` patterns match, each with its id (file name without suffix)."""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from batchfit.config import Config
from batchfit.errors import ConfigError, DatasetError

_TABULAR = {".csv": "CSV", ".parquet": "Parquet", ".pq": "Parquet"}


_NETCDF = {".nc", ".nc4", ".netcdf"}


SUPPORTED_SUFFIXES = (*_TABULAR, *sorted(_NETCDF))


_SAFE_ID = re.compile(r"[A-Za-z0-9._+-]+")


_SAFE_ID_RULE = (
    "dataset ids (file names without suffix) may only use letters A-Z a-z, digits 0-9 and "
    "'.', '_', '+', '-', must not start with '.' and must not contain '..'"
)


class DatasetFiles(Mapping[str, Path]):
    """Dataset id -> file, in id order: the paths kept as text, a new Path made on each access.

    Every job lists the sweep's datasets, and a parsed Path caches its parts and text: held for
    every dataset, they were most of collect's memory growth with N (#13, `benchmarks/collect.py`).
    A Path made from text parses only when used, and is then dropped.
    """

    __slots__ = ("_files",)

    def __init__(self, files: Iterable[tuple[str, str | Path]] = ()):
        self._files = {dataset_id: str(path) for dataset_id, path in files}

    def __getitem__(self, dataset_id: str) -> Path:
        return Path(self._files[dataset_id])

    def __contains__(self, dataset_id: object) -> bool:
        return dataset_id in self._files

    def __iter__(self) -> Iterator[str]:
        return iter(self._files)

    def __len__(self) -> int:
        return len(self._files)

    def __repr__(self) -> str:
        return f"DatasetFiles({self._files!r})"


def discover_datasets(
    config: Config, *, problems: dict[str, DatasetError] | None = None
) -> DatasetFiles:
    """Expand the `datasets` patterns (relative to the current directory) into id -> file, sorted by id.

    A file that cannot be a dataset (unsupported suffix, unusable id, an id another file has)
    raises a DatasetError; given a `problems` dict, each such file (or id shared by several
    files) is recorded there instead and left out, so `batchfit check` can list them all.
    """
    found: dict[str, str] = {}
    clashes: dict[str, list[Path]] = {}
    for pattern in config.datasets:
        for name in _expand(pattern, config):
            path = Path(name)
            dataset_id = path.stem
            try:
                check_suffix(dataset_id, path)
                _check_id(dataset_id, path)
            except DatasetError as exc:
                if problems is None:
                    raise
                problems[str(path)] = exc
                continue
            other = found.get(dataset_id)
            if other is not None and Path(other).resolve() != path.resolve():
                if problems is None:
                    raise DatasetError(
                        f"two files have the same dataset id: {other} and {path}; rename one "
                        "(the id is the file name without its suffix)",
                        dataset=dataset_id,
                    )
                files = clashes.setdefault(dataset_id, [Path(other)])
                if path.resolve() not in {f.resolve() for f in files}:
                    files.append(path)
                continue
            found[dataset_id] = str(path)
    for dataset_id, files in clashes.items():
        del found[dataset_id]
        assert problems is not None
        problems[dataset_id] = DatasetError(
            f"{len(files)} files have the same dataset id: {', '.join(map(str, files))}; rename all "
            "but one (the id is the file name without its suffix)",
            dataset=dataset_id,
        )
    return DatasetFiles(sorted(found.items()))


def _expand(pattern: str, config: Config) -> list[str]:
    """Files matched by one pattern (a glob or a plain path); an error if there are none."""
    if glob.has_magic(pattern):
        files = [name for name in sorted(glob.glob(pattern, recursive=True)) if os.path.isfile(name)]
    else:
        files = [pattern] if os.path.isfile(pattern) else []
    if files:
        return files
    if Path(pattern).is_dir():
        problem = "is a directory; use a glob such as 'dir/*.csv'"
    else:
        problem = (
            f"matches no file (relative patterns are resolved against the current directory {Path.cwd()})"
        )
    raise ConfigError(f"dataset pattern {pattern!r} {problem}", key="datasets", source=config.source)


def check_suffix(dataset_id: str, path: Path) -> None:
    """Reject files batchfit cannot read, naming the supported suffixes."""
    if path.suffix.lower() not in SUPPORTED_SUFFIXES:
        raise DatasetError(
            f"unsupported file type {path.suffix or '(no suffix)'!r}; "
            f"use one of {', '.join(SUPPORTED_SUFFIXES)}",
            dataset=dataset_id,
            path=path,
        )


def _check_id(dataset_id: str, path: Path) -> None:
    """Reject ids that are unsafe as output file names (they name results/fits/<id>.nc)."""
    safe = (
        _SAFE_ID.fullmatch(dataset_id) is not None
        and not dataset_id.startswith(".")
        and ".." not in dataset_id
    )
    if not safe:
        raise DatasetError(
            f"the file name gives the unusable dataset id {dataset_id!r}; {_SAFE_ID_RULE}",
            path=path,
        )


def file_kind(path: Path) -> str:
    """"CSV", "Parquet" or "NetCDF", by the suffix of a file `check_suffix` accepts."""
    suffix = Path(path).suffix.lower()
    return "NetCDF" if suffix in _NETCDF else _TABULAR[suffix]


def table_kind(path: Path) -> str | None:
    """"CSV" or "Parquet" for a table file, None for NetCDF (which carries its own coordinates)."""
    return _TABULAR.get(Path(path).suffix.lower())
