"""What a fit job reads besides the config: the compiled bundle, and the sweep's datasets and coding.

On a shared filesystem a job finds the datasets where the config's sources say and the label
coding in ``{results_dir}/coding.json``. Without one (a storage plugin moves a job's declared
inputs, nothing else: docs/cluster.md), the submitting side stages for each job a directory
with exactly what it reads (`stage_inputs`): its batch's data files, or the rows of its groups of
a table, and the reference dataset's (the first dataset that builds, which fixes every fit's
dtypes), the sweep's registry of codes, and the ids of the sweep's files, on which the coding
depends (the tables' part of it is in the registry). One module writes and reads the format.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from batchfit.config import Config
from batchfit.data.coding import recorded_coding, sweep_coding
from batchfit.data.discovery import DatasetIndex, discover_datasets
from batchfit.data.labels import Coding
from batchfit.errors import BatchfitError
from batchfit.settings import DataSettings, TableSource

_MANIFEST = "inputs.json"
_REGISTRY = "coding.json"
_DATA = "data"


@dataclass(frozen=True)
class JobInputs:
    """A fit job's inputs beyond the config.

    ``bundle``: the sweep's compiled bundle, installed into a cache that lacks its entry
    (`batchfit.cache.bundle`). ``staged``: the directory `stage_inputs` wrote for this job; None
    when the job sees the sweep's data and results directory itself.
    """

    bundle: Path | None = None
    staged: Path | None = None

    def datasets(self, config: Config) -> Mapping[str, Path]:
        """The datasets this job can read, id -> file: the config's, or the staged ones (a table's groups read
        from the staged copy of their rows)."""
        if self.staged is None:
            return discover_datasets(config.data_sources)
        return staged_index(self.staged, self._manifest)

    def coding(self, config: Config, paths: Mapping[str, Path]) -> Coding:
        """The sweep's coding: recorded (and updated) in the results directory, or the staged registry's."""
        if self.staged is None:
            return sweep_coding(config.data_sources, paths)
        sweep = DatasetIndex([(d, Path()) for d in self._manifest["sweep"]])  # the sweep's files: the coding's
        sources = config.data_sources
        coding = recorded_coding(sources, self.staged / _REGISTRY, sweep)
        staged = recorded_coding(sources, self.staged / _REGISTRY, paths)  # this job's datasets' columns
        return Coding(coding.labels, {**coding.columns_of, **staged.columns_of})

    def data_settings(self, config: Config) -> DataSettings:
        """What reading the datasets takes from the config; the side tables' staged copies for a staged job."""
        settings = config.data_sources.settings
        if self.staged is None:
            return settings
        staged = [TableSource(self.staged / name, side.by)
                  for name, side in zip(self._manifest["values"], config.values, strict=True)]
        return dataclasses.replace(settings, values=tuple(staged))

    def members(self) -> list[str]:
        """The datasets staged for fitting (the batch; the reference may be staged only to build it)."""
        if self.staged is None:
            raise BatchfitError("a job without staged inputs takes its datasets from the sweep's plan")
        return list(self._manifest["members"])

    @cached_property
    def _manifest(self) -> dict:
        """The staged manifest, read once per job (a frozen dataclass still takes a cached property)."""
        assert self.staged is not None
        return read_staged(self.staged / _MANIFEST)


def read_staged(path: Path) -> dict:
    """A staged manifest; an unreadable one says to stage the job's inputs again."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise BatchfitError(f"the job's staged inputs {path} are unreadable ({exc}); stage them again") from exc


# A job that sees the sweep's data and results directory, and has no compiled bundle.
SHARED = JobInputs()


def stage_inputs(config: Config, datasets: Mapping[str, Path], members: Sequence[str], reference: str | None,
                 directory: Path) -> None:
    """Write ``directory``: what a job fitting ``members`` of the sweep ``datasets`` reads (see module docstring).

    ``reference``: the compile stage's reference dataset. The datasets are staged by `stage_sources`
    (the directory only travels through storage).
    """
    unknown = [d for d in [*members, *([reference] if reference else [])] if d not in datasets]
    if unknown:
        raise BatchfitError(f"dataset '{unknown[0]}' is not among the sweep's datasets ({config.source})")
    registry = config.layout.coding_registry
    if not registry.exists():
        raise BatchfitError(f"the sweep's label registry {registry} is missing: the sweep's run writes it first")
    index = datasets if isinstance(datasets, DatasetIndex) else DatasetIndex(datasets.items())
    staged = stage_sources(config, index, {*([reference] if reference else []), *members}, directory, _DATA)
    data = directory / _DATA
    values = []
    for number, side in enumerate(config.values):  # small beside the data: whole
        target = data / f"values-{number}{''.join(Path(side.table).suffixes)}"
        if Path(side.table).is_dir():
            shutil.copytree(side.table, target, dirs_exist_ok=True)
        else:
            link_or_copy(Path(side.table), target)
        values.append(str(target.relative_to(directory)))
    shutil.copyfile(registry, directory / _REGISTRY)
    sweep_files = [d for d in datasets if index.group(d) is None]
    manifest = {"members": list(members), **staged, "sweep": sweep_files, "values": values}
    (directory / _MANIFEST).write_text(json.dumps(manifest, indent=1))


def stage_sources(config: Config, index: DatasetIndex, ids: Iterable[str], directory: Path, folder: str
                  ) -> dict[str, Any]:
    """Stage the datasets ``ids`` of ``index`` under ``directory / folder``: files hard-linked or copied, a table's
    groups written as a table of just their rows (`batchfit.data.tables.stage_rows`), whose groups read back as
    the table's do. Returns the manifest's part that `staged_index` reads back."""
    data = directory / folder
    data.mkdir(parents=True, exist_ok=True)
    files, sources, groups = {}, {}, {}
    wanted: dict[TableSource, dict[str, tuple]] = {}
    for dataset_id in sorted(ids):
        sources[dataset_id] = str(index.source(dataset_id))  # what the fit and its failure record name
        group = index.group(dataset_id)
        if group is not None:
            wanted.setdefault(group[0], {})[dataset_id] = group[1]
            continue
        source = Path(index[dataset_id])
        files[dataset_id] = f"{folder}/{dataset_id}{''.join(source.suffixes)}"
        link_or_copy(source, directory / files[dataset_id])
    tables = []
    as_text = {name for name, column in config.columns.items() if column.label}
    for number, (table, members_of) in enumerate(wanted.items()):
        from batchfit.data.tables import stage_rows

        staged = stage_rows(table, members_of, data / f"table-{number}", index.location(table), as_text=as_text)
        tables.append({"table": str(table.table), "by": list(table.by), "staged": str(staged.relative_to(directory))})
        groups.update({d: [number, list(key)] for d, key in members_of.items()})
    return {"files": files, "sources": sources, "tables": tables, "groups": groups}


def staged_index(staged: Path, part: Mapping[str, Any]) -> DatasetIndex:
    """The datasets `stage_sources` staged under ``staged``, read from its manifest ``part``."""
    tables = [TableSource(Path(t["table"]), tuple(t["by"])) for t in part["tables"]]
    groups = {d: (tables[number], tuple(key)) for d, (number, key) in part["groups"].items()}
    located = {table: staged / t["staged"] for table, t in zip(tables, part["tables"], strict=True)}
    files = {d: staged / name for d, name in part["files"].items()}
    files.update({d: located[table] for d, (table, _) in groups.items()})
    return DatasetIndex(sorted(files.items()), part["sources"], groups, located)


def link_or_copy(source: Path, target: Path) -> None:
    """Hard-link ``source`` to ``target`` (replacing it), or copy it where the filesystem cannot link."""
    target.parent.mkdir(parents=True, exist_ok=True)
    target.unlink(missing_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
