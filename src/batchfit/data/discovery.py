"""Finding a sweep's datasets: the files its `datasets` patterns match, each with its id (file name without suffix)."""

from __future__ import annotations

import glob
import hashlib
import os
import re
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

from batchfit.config import Config
from batchfit.errors import ConfigError, DatasetError

_TABULAR = {".csv": "CSV", ".parquet": "Parquet", ".pq": "Parquet"}


_NETCDF = {".nc", ".nc4", ".netcdf"}


SUPPORTED_SUFFIXES = (*_TABULAR, *sorted(_NETCDF))


_SAFE_ID = re.compile(r"[A-Za-z0-9._+-]+")


_SAFE_ID_RULE = (
    "a dataset id (the file name without suffix) uses only letters A-Z a-z, digits 0-9 and "
    "'.', '_', '+', '-', does not start with '.' and does not contain '..'"
)


class DatasetFiles(Mapping[str, Path]):
    """Dataset id -> file, in id order: the paths kept as text, a new Path made on each access.

    Every job lists the sweep's datasets, and a parsed Path caches its parts and text: held for
    every dataset, they were most of collect's memory growth with N (#13, `benchmarks/collect.py`).
    A Path made from text parses only when used, and is then dropped.
    """

    __slots__ = ("_files", "_sources")

    def __init__(self, files: Iterable[tuple[str, str | Path]] = (), sources: Mapping[str, str] | None = None):
        self._files = {dataset_id: str(path) for dataset_id, path in files}
        self._sources = dict(sources or {})

    def source(self, dataset_id: str) -> Path:
        """The dataset's file as the sweep knows it: for a copy staged for a job without a shared
        filesystem (`batchfit.fitting.job_inputs`), the file it was copied from."""
        return Path(self._sources.get(dataset_id, self._files[dataset_id]))

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


def source_of(paths: Mapping[str, Path], dataset_id: str) -> Path | None:
    """A dataset's file as the sweep knows it: not the copy staged for a job without a shared filesystem."""
    if dataset_id not in paths:
        return None
    return paths.source(dataset_id) if isinstance(paths, DatasetFiles) else paths[dataset_id]


def discover_datasets(config: Config, *, renamed: dict[str, str] | None = None) -> DatasetFiles:
    """Expand the `datasets` patterns (relative to the current directory) into id -> file, sorted by id.

    No file stops a sweep: a file's id is its name without the suffix, and a name that cannot be
    an id as it is (characters an output file name or a Snakemake wildcard cannot take, or an id
    other files have too) gets a safe id (`dataset_ids`), which the sweep's outputs record with
    the file's path; given a `renamed` dict, each such id is recorded there with the file and why.
    A file batchfit cannot read (an unsupported suffix) is a dataset too, which fails when loaded,
    so its failure is recorded like any other dataset's.
    """
    files: list[str] = []
    seen: set[Path] = set()
    for pattern in config.datasets:
        for name in _expand(pattern, config):
            resolved = Path(name).resolve()
            if resolved not in seen:
                seen.add(resolved)
                files.append(name)
    ids = dataset_ids(files)
    if renamed is not None:
        for name, dataset_id in ids.items():
            stem = Path(name).stem
            if dataset_id != stem:
                renamed[dataset_id] = f"the id of file {name}, whose name {_why_renamed(stem, files)}"
    return DatasetFiles(sorted((dataset_id, name) for name, dataset_id in ids.items()))


def dataset_ids(files: Iterable[str]) -> dict[str, str]:
    """Each file's dataset id (file -> id): its name without the suffix where that is a safe id no other
    file has, else a safe id made from it (`safe_id`), with a digest of the file's path when two
    files would get the same one (``a b.csv`` beside ``a_b.csv`` gives ``a_b-1f2e3d4c``).

    Depends only on the set of files: the same files always get the same ids, and no two the same.
    """
    files = list(dict.fromkeys(str(f) for f in files))
    stems = {name: Path(name).stem for name in files}
    counts = Counter(stems.values())
    ids = {name: stem for name, stem in stems.items() if is_safe_id(stem) and counts[stem] == 1}
    rest = sorted(name for name in files if name not in ids)
    wanted = Counter(safe_id(stems[name]) for name in rest)
    used = set(ids.values())
    for name in rest:
        candidate = safe_id(stems[name])
        if candidate in used or wanted[candidate] > 1:
            digest = hashlib.sha256(name.encode()).hexdigest()
            size = 8
            while (choice := f"{candidate}-{digest[:size]}") in used:
                size += 1
            candidate = choice
        ids[name] = candidate
        used.add(candidate)
    return {name: ids[name] for name in files}


def is_safe_id(dataset_id: str) -> bool:
    """Whether an id can name output files and Snakemake wildcards as it is (`_SAFE_ID_RULE`)."""
    return (_SAFE_ID.fullmatch(dataset_id) is not None and not dataset_id.startswith(".")
            and ".." not in dataset_id)


def safe_id(name: str) -> str:
    """``name`` made a safe id: each run of other characters becomes ``_``, without a leading ``.`` or ``..``."""
    text = re.sub(r"\.{2,}", ".", re.sub(r"[^A-Za-z0-9._+-]+", "_", name)).lstrip(".")
    return text or "dataset"


def _why_renamed(stem: str, files: Sequence[str]) -> str:
    if not is_safe_id(stem):
        return (f"{stem!r} cannot name output files as it is ({_SAFE_ID_RULE}); rename the file to keep an id "
                "of your own")
    others = [f for f in files if Path(f).stem == stem]
    return f"{stem!r} is also the name of {', '.join(others)}; rename them to keep ids of your own"


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


def file_kind(path: Path) -> str:
    """"CSV", "Parquet" or "NetCDF", by the suffix of a file `check_suffix` accepts."""
    suffix = Path(path).suffix.lower()
    return "NetCDF" if suffix in _NETCDF else _TABULAR[suffix]


def table_kind(path: Path) -> str | None:
    """"CSV" or "Parquet" for a table file, None for NetCDF (which carries its own coordinates)."""
    return _TABULAR.get(Path(path).suffix.lower())
