"""Which datasets have a fit, of which provenance, or a failure record: one file for the whole sweep.

A fit job writes each dataset's fit with a sidecar (its provenance digest, the fit's size and
modification time) or its failure record (`batchfit.fitting.batch`): reading those for every
dataset costs a file or two per dataset, which a sweep of 100,000 groups cannot pay at every
plan, status or collect. The register, ``register/fits.json``, holds what they say for every
dataset. A process that is about to change a dataset's files first lists the dataset in a file
of its own under ``register/touched/`` (`touching`); a reader takes the listed datasets' own files
as the truth for them (`FitRegister.current`), and collect and each run's start take them into
the register and remove the lists (`settle`), when no fit job of the sweep runs.

A fit or failure record deleted by hand (to have it redone) is noticed by one listing of its
directory; a fit file replaced by hand with another is not, until its dataset is fitted again
(delete the register to have every fit read afresh).
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from batchfit.common.atomic import atomic_path
from batchfit.layout import ResultsLayout
from batchfit.records.fit_attributes import recorded_digest
from batchfit.records.provenance_sidecar import ProvenanceSidecar

log = logging.getLogger("batchfit")

_FORMAT = 1
FIT, FAILED = "fit", "failed"


@dataclass
class FitRegister:
    """Dataset id -> ``["fit", digest, size, mtime_ns]`` (its fit: the provenance digest it recorded, and the file's
    size and modification time then) or ``["failed"]`` (its failure record)."""

    path: Path
    entries: dict[str, list] = field(default_factory=dict)

    @classmethod
    def read(cls, layout: ResultsLayout) -> FitRegister:
        """The register of ``layout``; an empty one (every fit then read afresh) when there is none, or it is
        damaged or of another format."""
        path = layout.fit_register
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            return cls(path)
        except (OSError, ValueError) as exc:
            log.warning("ignoring the damaged fit register %s (%s): every fit is read afresh", path, exc)
            return cls(path)
        if not isinstance(data, dict) or data.get("format") != _FORMAT or not isinstance(data.get("entries"), dict):
            log.warning("ignoring the fit register %s of another format: every fit is read afresh", path)
            return cls(path)
        return cls(path, data["entries"])

    @classmethod
    def current(cls, layout: ResultsLayout) -> FitRegister:
        """The register with the datasets some process listed as touched taken in from their own files (not
        written: a reader's view)."""
        register = cls.read(layout)
        register.fold(layout, touched_ids(layout)[1])
        register.forget_deleted(layout)
        return register

    def write(self) -> None:
        if not self.path.parent.parent.is_dir():
            return  # no results directory yet: nothing was fitted
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(self.path) as tmp:
            tmp.write_text(json.dumps({"format": _FORMAT, "entries": self.entries}))

    def digest(self, dataset_id: str) -> str | None:
        """The provenance digest of the dataset's fit; None without one."""
        entry = self.entries.get(dataset_id)
        return entry[1] if entry is not None and entry[0] == FIT else None

    def fit_stamp(self, dataset_id: str) -> tuple[int, int] | None:
        """The size and modification time (ns) of the dataset's fit when it was taken in; None without one."""
        entry = self.entries.get(dataset_id)
        return (int(entry[2]), int(entry[3])) if entry is not None and entry[0] == FIT else None

    def failed(self, dataset_id: str) -> bool:
        entry = self.entries.get(dataset_id)
        return entry is not None and entry[0] == FAILED

    def fold(self, layout: ResultsLayout, dataset_ids: Iterable[str]) -> None:
        """Take in what the files of ``dataset_ids`` say now: a fit's digest (its sidecar's, when that describes it,
        else its own), or a failure record, or neither."""
        for dataset_id in dataset_ids:
            entry = files_entry(layout, dataset_id)
            if entry is None:
                self.entries.pop(dataset_id, None)
            else:
                self.entries[dataset_id] = entry

    def forget_deleted(self, layout: ResultsLayout) -> None:
        """Forget the fits and failure records no longer there (deleted by hand, to have them redone): one
        listing of each directory, no file opened."""
        present = {FIT: _names(layout.fits, ".nc"), FAILED: _names(layout.failures, ".json")}
        for gone in [d for d, entry in self.entries.items() if d not in present[entry[0]]]:
            del self.entries[gone]

    def keep(self, dataset_ids: Iterable[str]) -> None:
        """Forget the datasets not among ``dataset_ids`` (their files moved out: `batchfit.outputs.orphans`)."""
        kept = set(dataset_ids)
        for gone in [d for d in self.entries if d not in kept]:
            del self.entries[gone]


def files_entry(layout: ResultsLayout, dataset_id: str) -> list | None:
    """What a dataset's own files say: ``["fit", digest, size, mtime_ns]``, ``["failed"]`` or None."""
    fit = layout.fit(dataset_id)
    try:
        stat = fit.stat()
    except FileNotFoundError:
        return [FAILED] if layout.failure(dataset_id).is_file() else None
    digest = ProvenanceSidecar.digest_for(layout.sidecar(dataset_id), stat)
    if digest is None:  # no sidecar, a damaged one or another fit's: the fit itself says
        try:
            digest = recorded_digest(fit)
        except OSError:  # an unreadable fit is as good as none
            return None
    return [FIT, digest, stat.st_size, stat.st_mtime_ns] if digest is not None else None


def settle(layout: ResultsLayout, dataset_ids: Iterable[str] | None = None) -> FitRegister:
    """Take the touched datasets into the register, keep only ``dataset_ids`` (the sweep's: others' files moved
    out), write it and remove the lists taken in. Only where no fit job of the sweep runs: collect, a run's
    start."""
    register = FitRegister.read(layout)
    lists, touched = touched_ids(layout)
    register.fold(layout, touched)
    register.forget_deleted(layout)
    if dataset_ids is not None:
        register.keep(dataset_ids)
    register.write()
    for path in lists:
        path.unlink(missing_ok=True)
    return register


def _names(directory: Path, suffix: str) -> set[str]:
    """The stems of the files in ``directory`` with ``suffix`` (none if it does not exist)."""
    try:
        with os.scandir(directory) as entries:
            return {e.name[:-len(suffix)] for e in entries if e.name.endswith(suffix) and not e.name.startswith(".")}
    except FileNotFoundError:
        return set()


def touching(layout: ResultsLayout, name: str, dataset_ids: Iterable[str]) -> None:
    """List ``dataset_ids`` as touched, before any of their files changes (a fit job's batch: ``name``)."""
    directory = layout.touched
    directory.mkdir(parents=True, exist_ok=True)
    with atomic_path(directory / f"{name}.{os.getpid()}.txt") as tmp:
        tmp.write_text("".join(f"{d}\n" for d in dataset_ids))


def touched_ids(layout: ResultsLayout) -> tuple[list[Path], list[str]]:
    """The lists of touched datasets, and the datasets they list."""
    try:
        lists = sorted(p for p in layout.touched.iterdir() if p.suffix == ".txt" and not p.name.startswith("."))
    except FileNotFoundError:
        return [], []
    ids: dict[str, None] = {}
    for path in lists:
        try:
            ids.update(dict.fromkeys(path.read_text().split()))
        except FileNotFoundError:
            continue
    return lists, list(ids)
