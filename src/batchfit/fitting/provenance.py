"""Provenance of a fit: one digest of everything that determines it, recorded on the fit and checked.

A dataset's fit is determined by the sampler and outputs settings, the content of the model file
and of the user's own modules it imports (`batchfit.model.imports`), the dataset's data file
content, the library versions and batchfit's own code. Their digest is stored on every fit (root
attribute ``provenance`` of ``fits/{id}.nc``, with the parts it was computed from) and in a small
sidecar ``fits/{id}.json``. A dataset is pending when the digest its fit recorded differs from
the one the current config gives: content, never modification times, so touching a file refits
nothing and a changed setting refits exactly what it affects.

The compile key (recorded as ``compile_key``) is not part of the digest: it is only known after
building the model, which the plan (run by Snakemake at every parse) must not do. The digest's
inputs determine it, except the PyTensor flags and the CPU, which are left out on purpose: they
are properties of the machine, and a plan made on a cluster's login node must agree with the
digest a fit job records on a compute node.

The one sweep-wide input of a dataset that is not in its own file, the coding of its text
columns (`batchfit.data.labels.Coding.for_dataset`: a new level seen in another dataset changes the
coordinates of every dataset with that column), is part of the digest too.

Plan-time cost: data files are hashed through a cache (``{results}/data_sha256.json``) keyed by
path, size and modification time; a file whose modification time changed is hashed again and, if
its content is the same, gives the same digest; a table's groups come with its scan
(`batchfit.data.tables`). What each fit recorded is read from the sweep's fit register
(`batchfit.fitting.fit_register`), not from a file per dataset.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import platform
import time
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path
from typing import Any

from batchfit import __version__
from batchfit.common.atomic import atomic_path
from batchfit.common.hashing import file_sha256, package_sources, sources_digest
from batchfit.compile.fingerprint import LIBRARIES
from batchfit.config import Config, config_to_dict
from batchfit.data.coding import sweep_coding
from batchfit.data.coding import write_planned as write_planned_coding
from batchfit.data.discovery import discover_datasets, table_scans, write_planned_scans
from batchfit.data.labels import Coding
from batchfit.data.reader import DatasetReader, data_digest
from batchfit.data.values import read_side_values
from batchfit.layout import ResultsLayout
from batchfit.model.imports import user_imports
from batchfit.records.provenance_sidecar import ProvenanceSidecar

# The code that runs while a fit is produced: every module of these subpackages and top-level
# modules, so a module added to one is covered. Editing any refits every dataset; the command
# line, collect and its outputs, the plan, status, checks and SBC (outputs/, sweep/, cli.py, ...)
# do not shape a fit, and editing them refits nothing.
FIT_CODE = ("__init__.py", "compat", "config.py", "errors.py", "layout.py", "schema.py",
            "common", "records", "data", "model", "cache", "numba_ops", "compile", "fitting")
# A digest cached for a file modified less than this long before it was hashed is not trusted:
# a file system's timestamps are coarse (a few ms on Linux, up to 2 s elsewhere), so a rewrite
# of the same size right after hashing could keep the cached size and modification time.
_RACY_SECONDS = 2.0


@dataclass(frozen=True)
class SweepParts:
    """The parts of a provenance shared by every dataset of a sweep, and their digest (computed once: a sweep
    of many datasets digests each dataset's own parts only)."""

    parts: Mapping[str, Any]

    @functools.cached_property
    def digest(self) -> str:
        return hashlib.sha256(json.dumps(self.parts, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class Provenance:
    """The inputs that determine one dataset's fit (the sweep's parts and its own), and their digest."""

    sweep: SweepParts
    own: Mapping[str, Any]

    @property
    def parts(self) -> dict[str, Any]:
        return {**self.sweep.parts, **self.own}

    @functools.cached_property
    def digest(self) -> str:
        own = json.dumps(self.own, sort_keys=True)
        return hashlib.sha256(f"{self.sweep.digest}\n{own}".encode()).hexdigest()

    def attributes(self) -> dict[str, str]:
        """Root attributes of the fit: the digest and its parts, nested ones as JSON."""
        readable = {key: value if isinstance(value, str) else json.dumps(value, sort_keys=True)
                    for key, value in self.parts.items() if key != "dataset"}
        return {"provenance": self.digest, **readable}


@functools.cache
def code_sha256() -> str:
    """sha256 of the source of batchfit's modules that run while a fit is produced (`FIT_CODE`)."""
    return sources_digest(package_sources(*FIT_CODE))


@functools.cache
def versions() -> dict[str, str]:
    """batchfit, Python and the versions of the libraries that compile and sample."""
    return {"batchfit": __version__, "python": platform.python_version(),
            **{name: version(name) for name in LIBRARIES}}


def sweep_parts(config: Config, *, model_sha256: str | None = None) -> SweepParts:
    """The parts shared by every dataset of a sweep (``model_sha256``: of the model file as loaded): the
    settings that shape a fit, including the row rules and columns' bounds that shape its data."""
    plain = config_to_dict(config)
    return SweepParts({
        "sampler": config.sampler_dict(),
        "outputs": dataclasses.asdict(config.outputs),
        "model_hash": model_sha256 or file_sha256(config.model),
        "model_imports": user_imports(config.model),
        "params": dict(config.params),
        "rows": plain["rows"],
        "bounds": {name: column for name, column in plain["columns"].items() if "min" in column or "max" in column},
        "versions": versions(),
        "code_hash": code_sha256(),
    })


def dataset_provenance(sweep: SweepParts, dataset_id: str, data_sha256: str, coding: Mapping[str, Any]) -> Provenance:
    """One dataset's provenance from the sweep's parts, its data's digest (`batchfit.data.reader.data_digest`) and
    its coding."""
    return Provenance(sweep, {"dataset": dataset_id, "data_sha256": data_sha256, "coding": dict(coding)})


def expected_provenance(config: Config, dataset_id: str) -> Provenance:
    """What a fit of ``dataset_id`` made now with ``config`` records (data hashed afresh)."""
    sources = config.data_sources
    datasets = discover_datasets(sources)
    coding = sweep_coding(sources, datasets)
    reader = DatasetReader(datasets, sources.settings, coding)
    return dataset_provenance(sweep_parts(config), dataset_id, reader.digest(dataset_id),
                              coding.for_dataset(dataset_id))


def expected_digests(config: Config, datasets: Mapping[str, Path], *, record: bool = True) -> dict[str, str]:
    """Every dataset's expected digest, hashing only data files that changed since the last call (a table's
    groups come with its scan: `batchfit.data.discovery.table_scans`).

    ``record`` false reads the coding and digest caches without updating them (`batchfit status`).
    """
    sweep = sweep_parts(config)
    sources = config.data_sources
    coding = sweep_coding(sources, datasets, record=record)
    cache = DigestCache(config.layout.data_digests)
    groups = {d: digest for scan in table_scans(sources) for d, digest in scan.digests.items()}
    side = read_side_values(config.values, config.source) if config.values else None
    own = _OwnCoding(coding)
    digests = {}
    for d, path in datasets.items():
        rows = groups[d] if d in groups else cache.sha256(path)
        digests[d] = dataset_provenance(sweep, d, data_digest(rows, side.digest(d) if side else ""), own(d)).digest
    if record:
        cache.save()
    return digests


class _OwnCoding:
    """`Coding.for_dataset` of many datasets, computed once per set of columns (a table's groups share theirs)."""

    def __init__(self, coding: Coding):
        self.coding = coding
        self.known: dict[tuple[str, ...], dict[str, Any]] = {}

    def __call__(self, dataset_id: str) -> dict[str, Any]:
        columns = tuple(self.coding.columns_of.get(dataset_id, ()))
        if columns not in self.known:
            self.known[columns] = self.coding.for_dataset(dataset_id)
        return self.known[columns]


class DigestCache:
    """sha256 of data files keyed by (absolute path, size, mtime_ns), kept in a JSON file.

    Written atomically, and only when it changed; concurrent plans (a cluster re-parses the
    Snakefile in every job) at worst drop each other's new entries, which are then hashed again.
    A damaged file is ignored.
    """

    def __init__(self, path: Path):
        self.path = path
        try:
            self.entries: dict[str, list] = json.loads(path.read_text())
        except (OSError, ValueError):
            self.entries = {}
        if not isinstance(self.entries, dict):
            self.entries = {}
        self.used: dict[str, list] = {}

    def sha256(self, path: Path) -> str:
        key = os.path.abspath(path)  # not resolve(): following symlinks costs a stat per component
        stat = os.stat(key)
        entry = self.entries.get(key)
        if isinstance(entry, list) and entry[:2] == [stat.st_size, stat.st_mtime_ns]:
            self.used[key] = entry
            return entry[2]
        hashed_at = time.time_ns()
        digest = file_sha256(key)
        if os.stat(key).st_mtime_ns == stat.st_mtime_ns and hashed_at - stat.st_mtime_ns > _RACY_SECONDS * 1e9:
            self.used[key] = [stat.st_size, stat.st_mtime_ns, digest]
        return digest

    def save(self) -> None:
        """Keep the entries used since the cache was read, if they changed.

        Not before the results directory exists (a new sweep being planned, or a dry run of it):
        they are then kept in this process for `write_planned`.
        """
        if self.used == self.entries:
            return
        if not self.path.parent.is_dir():
            _planned_digests[self.path] = self.used
            return
        _write_digests(self.path, self.used)


def _write_digests(path: Path, digests: dict[str, list]) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(json.dumps(digests))


# Digest caches computed for sweeps whose results directory did not exist yet, by path.
_planned_digests: dict[Path, dict[str, list]] = {}


def write_planned(config: Config) -> None:
    """Write what planning `config`'s sweep computed before its results directory existed: the data
    files' digests and the coding registry (`batchfit.data.coding.write_planned`).

    Called where a run starts (`batchfit.sweep.plan.write_plan`): otherwise the first jobs hash
    and scan every data file again, one behind the other at the registry's lock, which slows a
    warm sweep of many small datasets. Not over files a process wrote since.
    """
    write_planned_scans()
    write_planned_coding(config.data_sources)
    path = config.layout.data_digests
    digests = _planned_digests.pop(path, None)
    if digests is not None and path.parent.is_dir() and not path.exists():
        _write_digests(path, digests)


def record(config: Config, dataset_id: str, provenance: Provenance) -> None:
    """Write the sidecar of a fit just written, with the fit's size and modification time
    (`batchfit.records.provenance_sidecar`)."""
    record_digest(config.layout, dataset_id, provenance.digest)


def record_digest(layout: ResultsLayout, dataset_id: str, digest: str) -> None:
    """Write the sidecar of the fit of ``dataset_id`` in ``layout``: ``digest``, and the file's size and
    modification time (`record`; also after collect moved in a fit from a job's own outputs)."""
    ProvenanceSidecar.describing(layout.fit(dataset_id), dataset_id, digest).write(layout.sidecar(dataset_id))
